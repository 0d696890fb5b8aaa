//! The nodes, and how one operation runs on them: in parallel, each node's answer bounded
//! by the per-node timeout, a node that fails or is late counted as a vote against.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use dlock_core::raw::spawn_cleanup;
use dlock_core::{LockError, Result};
use dlock_redis::server::{Node, NodeError};
use futures::future::{BoxFuture, Shared, join_all};
use futures::stream::FuturesUnordered;
use futures::{FutureExt as _, StreamExt as _};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::error::{Error, Failures};
use crate::renew::Renewals;

/// How long past its per-node timeout a request left running may still be waited for (its
/// task may be a moment late to notice the timeout).
const LATE_MARGIN: Duration = Duration::from_millis(50);

/// The shortest per-node timeout, however short the ttl.
const MIN_NODE_TIMEOUT: Duration = Duration::from_millis(50);

/// The nodes and what every operation on them shares.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) nodes: Vec<Node>,
    pub(crate) quorum: usize,
    pub(crate) response_timeout: Duration,
    /// The queue into this client's renewal task (see [`crate::renew`]).
    pub(crate) renewals: Renewals,
}

impl Cluster {
    /// Each node's answer must come within 5 % of the ttl (at least 50 ms, at most the
    /// response timeout): a slow node is a vote against, not a delay for everyone.
    pub(crate) fn node_timeout(&self, ttl: Duration) -> Duration {
        let max = self.response_timeout.max(MIN_NODE_TIMEOUT);
        (ttl / 20).clamp(MIN_NODE_TIMEOUT, max)
    }

    /// Each node's answer to a read that no ttl bounds (`inspect`): the response timeout
    /// (at least 50 ms).
    pub(crate) fn read_timeout(&self) -> Duration {
        self.response_timeout.max(MIN_NODE_TIMEOUT)
    }

    pub(crate) fn all(&self) -> Vec<usize> {
        (0..self.nodes.len()).collect()
    }

    /// Run `op` on the nodes `which`, in parallel, each bounded by `limit`. A node that
    /// fails or does not answer in time gives an error; nothing aborts the others.
    pub(crate) async fn on<'a, T, F, Fut>(
        &'a self,
        which: &[usize],
        limit: Duration,
        name: &'static str,
        op: F,
    ) -> Vec<(usize, Result<T, NodeError>)>
    where
        F: Fn(&'a Node) -> Fut,
        Fut: Future<Output = Result<T, NodeError>> + 'a,
    {
        let calls = which.iter().map(|&i| {
            let node = &self.nodes[i];
            let call = op(node);
            async move { (i, bounded(node, limit, name, call).await) }
        });
        join_all(calls).await
    }

    /// Run `op` on the nodes `which` as [`on`](Self::on) does, but answer as soon as
    /// `settled` says the answers so far decide the operation (a quorum granted, a quorum
    /// released): the operation then takes as long as its quorum-th fastest node, not its
    /// slowest. The other nodes' requests still run to the end, their answers unread, in a
    /// clean-up task ([`spawn_cleanup`]: `settle()` waits for it); the [`Late`] returned
    /// lets a later request to one of those nodes wait for them, so that the node runs the
    /// two in order (a release never overtakes the grant it gives back). Each node's
    /// request here first waits for what `after` left running on that node, outside its
    /// timeout: it is sent however long that took.
    pub(crate) async fn on_until<T, F, Fut>(
        &self,
        which: &[usize],
        limit: Duration,
        name: &'static str,
        after: &Late,
        op: F,
        settled: impl Fn(&[(usize, Result<T, NodeError>)]) -> bool,
    ) -> (Vec<(usize, Result<T, NodeError>)>, Late)
    where
        T: Send + 'static,
        F: Fn(Node) -> Fut,
        Fut: Future<Output = Result<T, NodeError>> + Send + 'static,
    {
        // Each request's timeout starts after `after`, at the latest when that runs out.
        let by = after
            .by
            .map_or_else(Instant::now, |by| by.max(Instant::now()) + LATE_MARGIN)
            + limit;
        let mut ended = Vec::with_capacity(which.len());
        let mut calls: FuturesUnordered<_> = which
            .iter()
            .map(|&i| {
                let node = self.nodes[i].clone();
                let call = op(node.clone());
                let after = after.clone();
                // Dropped when the request ends (answered, failed, timed out or dropped).
                let (end, ended_rx) = oneshot::channel::<()>();
                ended.push((i, ended_rx));
                async move {
                    let _end = end;
                    after.on(i).await;
                    (i, bounded(&node, limit, name, call).await)
                }
            })
            .collect();
        let mut answers = Vec::with_capacity(which.len());
        while let Some(answer) = calls.next().await {
            answers.push(answer);
            if settled(&answers) {
                break;
            }
        }
        if calls.is_empty() {
            return (answers, Late::default());
        }
        let late = ended
            .into_iter()
            .filter(|(i, _)| answers.iter().all(|(j, _)| j != i))
            .map(|(i, ended)| (i, ended.map(drop).boxed().shared()))
            .collect();
        spawn_cleanup(async move { while calls.next().await.is_some() {} });
        let late = Late {
            requests: Arc::new(late),
            by: Some(by),
        };
        (answers, late)
    }

    pub(crate) fn no_quorum(&self, op: &'static str, failures: Vec<NodeError>) -> LockError {
        self.no_quorum_of(op, self.quorum, failures)
    }

    /// Too few of the nodes answered for `quorum` of them (a permit's quorum may be more
    /// than the majority).
    pub(crate) fn no_quorum_of(
        &self,
        op: &'static str,
        quorum: usize,
        failures: Vec<NodeError>,
    ) -> LockError {
        Error::NoQuorum {
            op,
            nodes: self.nodes.len(),
            quorum,
            answered: self.nodes.len() - failures.len(),
            failures: Failures(failures),
        }
        .into()
    }
}

/// `call` on `node`, its answer bounded by `limit`: a late answer is the node's timeout
/// error (a vote against).
async fn bounded<T>(
    node: &Node,
    limit: Duration,
    name: &'static str,
    call: impl Future<Output = Result<T, NodeError>>,
) -> Result<T, NodeError> {
    tokio::time::timeout(limit, call)
        .await
        .unwrap_or_else(|_| Err(node.timed_out(name, limit)))
}

/// The requests a decided operation left running on some nodes (see
/// [`Cluster::on_until`]): a later request to one of those nodes first waits for them with
/// [`on`](Self::on), so that the node runs the two in the order they were made. Each ends
/// within its per-node timeout.
#[derive(Clone, Default)]
pub(crate) struct Late {
    requests: Arc<Vec<(usize, Shared<BoxFuture<'static, ()>>)>>,
    /// When every one of them has run out its per-node timeout: waiting ends then at the
    /// latest, even if nothing drives their task (another runtime, idle).
    by: Option<Instant>,
}

impl fmt::Debug for Late {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<usize> = self.requests.iter().map(|(i, _)| *i).collect();
        f.debug_tuple("Late").field(&nodes).finish()
    }
}

impl Late {
    /// Wait until the request left running on node `node`, if any, has ended (at most
    /// until its per-node timeout has passed, and a little more).
    pub(crate) async fn on(&self, node: usize) {
        if let (Some((_, ended)), Some(by)) =
            (self.requests.iter().find(|(i, _)| *i == node), self.by)
        {
            let _ = tokio::time::timeout_at(by + LATE_MARGIN, ended.clone()).await;
        }
    }

    /// Whether no request was left running.
    pub(crate) fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }
}

/// The nodes' answers to a renewal: how many renewed, which no longer had the hold (by
/// index), and the failures.
pub(crate) struct Renewed {
    pub(crate) extended: usize,
    pub(crate) missing: Vec<usize>,
    pub(crate) failures: Vec<NodeError>,
}

impl Renewed {
    pub(crate) fn of(answers: Vec<(usize, Result<bool, NodeError>)>) -> Self {
        let mut out = Self {
            extended: 0,
            missing: Vec::new(),
            failures: Vec::new(),
        };
        for (i, answer) in answers {
            match answer {
                Ok(true) => out.extended += 1,
                Ok(false) => out.missing.push(i),
                Err(e) => out.failures.push(e),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_timeout_is_five_percent_of_the_ttl_within_bounds() {
        let cluster = Cluster {
            nodes: Vec::new(),
            quorum: 2,
            response_timeout: Duration::from_secs(2),
            renewals: Renewals::default(),
        };
        assert_eq!(
            cluster.node_timeout(Duration::from_secs(2)),
            Duration::from_millis(100)
        );
        assert_eq!(
            cluster.node_timeout(Duration::from_millis(100)),
            MIN_NODE_TIMEOUT
        );
        assert_eq!(
            cluster.node_timeout(Duration::from_secs(600)),
            Duration::from_secs(2)
        );
    }
}
