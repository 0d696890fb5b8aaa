//! Renewals coalesced over the cluster: every extend of every key this client holds goes to
//! one task, which takes whatever has queued (the leases the core's watchdog woke in the
//! same timer tick) and sends it to every node as one script call per node, each bounded
//! by the per-node timeout, then answers each caller once with its key's answer from each
//! node. So a renewal round of N held keys costs about N / batch size requests per node,
//! one timer per node per batch, and one wake-up per lease, instead of five of each.
//!
//! No timer: a lone extend goes out at once. Each batch runs in a task of its own, so a
//! node that answers only at its timeout never holds back the batches queued behind it.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dlock_redis::server::{HeldKey, NodeError};
use tokio::sync::{mpsc, oneshot};

use crate::cluster::Cluster;

/// The most keys in one batch (per node, one script call).
const MAX_BATCH: usize = 512;

/// The most yields spent gathering one round of renewals, so a steady stream of extends
/// cannot hold back the first of them for long.
const MAX_GATHER_YIELDS: usize = 16;

/// One key's renewal, as each node answered it: the node's index, and `true` (extended),
/// `false` (not ours there) or the node's error.
pub(crate) type Answers = Vec<(usize, Result<bool, NodeError>)>;

/// One extend waiting for its batch.
struct Renewal {
    key: HeldKey,
    ttl: Duration,
    answer: oneshot::Sender<Answers>,
}

/// The queue into the cluster's renewal task, started on first use (and again if the
/// runtime that ran the previous one shut down).
#[derive(Default)]
pub(crate) struct Renewals {
    queue: Mutex<Option<mpsc::UnboundedSender<Renewal>>>,
}

impl fmt::Debug for Renewals {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Renewals").finish_non_exhaustive()
    }
}

impl Cluster {
    /// Extend `key` for `ttl` on every node, batched with this client's other renewals;
    /// each node's answer for this key.
    pub(crate) async fn renew(self: &Arc<Self>, key: &HeldKey, ttl: Duration) -> Answers {
        let (answer, answered) = oneshot::channel();
        let renewal = Renewal {
            key: key.clone(),
            ttl,
            answer,
        };
        if self.renewals.send(self, renewal).is_ok()
            && let Ok(answers) = answered.await
        {
            return answers;
        }
        // No task could take it (no runtime, or its runtime shut down mid-batch): alone.
        let keys = [(key.clone(), ttl)];
        self.renew_on_nodes(&keys)
            .await
            .into_iter()
            .map(|(i, answer)| (i, answer.map(|extended| extended[0])))
            .collect()
    }

    /// Renew `keys` (all with the same per-node timeout) on every node, one request per
    /// node in parallel: each node's answer, one flag per key in order.
    async fn renew_on_nodes(
        &self,
        keys: &[(HeldKey, Duration)],
    ) -> Vec<(usize, Result<Vec<bool>, NodeError>)> {
        let limit = self.node_timeout(keys[0].1);
        self.on(&self.all(), limit, "extend", |n| n.renew_many(keys))
            .await
    }

    /// Renew one batch and answer each of its callers with its key's answers.
    async fn renew_batch(&self, batch: Vec<Renewal>) {
        let (keys, callers): (Vec<_>, Vec<_>) = batch
            .into_iter()
            .map(|r| ((r.key, r.ttl), r.answer))
            .unzip();
        let per_node = self.renew_on_nodes(&keys).await;
        for (k, caller) in callers.into_iter().enumerate() {
            let answers = per_node
                .iter()
                .map(|(i, answer)| {
                    let answer = match answer {
                        Ok(extended) => Ok(extended[k]),
                        Err(e) => Err(e.clone()),
                    };
                    (*i, answer)
                })
                .collect();
            let _ = caller.send(answers);
        }
    }
}

impl Renewals {
    /// Queue `renewal` for the cluster's renewal task, starting the task if there is none.
    /// `Err`: no task could take it (no runtime).
    fn send(&self, cluster: &Arc<Cluster>, renewal: Renewal) -> Result<(), ()> {
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let renewal = match queue.as_ref() {
            Some(q) => match q.send(renewal) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(renewal)) => renewal,
            },
            None => renewal,
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(());
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        runtime.spawn(run(Arc::downgrade(cluster), receiver));
        sender.send(renewal).map_err(|_| ())?;
        *queue = Some(sender);
        Ok(())
    }
}

/// The renewal task: take everything queued, start each batch in a task of its own,
/// repeat. Ends when the cluster is dropped (its queue closes).
async fn run(cluster: Weak<Cluster>, mut queue: mpsc::UnboundedReceiver<Renewal>) {
    let mut queued = Vec::new();
    while queue.recv_many(&mut queued, usize::MAX).await > 0 {
        // Let renewals that fell due in the same timer tick queue up behind the first:
        // yields, not a timer, so a lone renewal waits only for tasks already runnable.
        // The leases of one tick are woken a few at a time and spread over the workers, so
        // one yield catches only a handful: yield again while the queue still grows.
        for _ in 0..MAX_GATHER_YIELDS {
            tokio::task::yield_now().await;
            let before = queued.len();
            while let Ok(renewal) = queue.try_recv() {
                queued.push(renewal);
            }
            if queued.len() == before {
                break;
            }
        }
        let Some(cluster) = cluster.upgrade() else {
            return;
        };
        for batch in batches(&cluster, queued.drain(..)) {
            let cluster = cluster.clone();
            tokio::spawn(async move { cluster.renew_batch(batch).await });
        }
    }
}

/// Split `queued` into batches of at most [`MAX_BATCH`] renewals that share a per-node
/// timeout (leases of one ttl share one; each key keeps its own ttl on the nodes). A
/// caller that gave up needs no renewal.
fn batches(cluster: &Cluster, queued: impl Iterator<Item = Renewal>) -> Vec<Vec<Renewal>> {
    let mut by_limit: BTreeMap<Duration, Vec<Vec<Renewal>>> = BTreeMap::new();
    for renewal in queued.filter(|r| !r.answer.is_closed()) {
        let batches = by_limit
            .entry(cluster.node_timeout(renewal.ttl))
            .or_default();
        match batches.last_mut() {
            Some(batch) if batch.len() < MAX_BATCH => batch.push(renewal),
            _ => batches.push(vec![renewal]),
        }
    }
    by_limit.into_values().flatten().collect()
}
