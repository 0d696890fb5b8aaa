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
use std::sync::{Arc, Weak};
use std::time::Duration;

use dlock_redis::server::{HeldKey, NodeError, TaskQueue, gather};
use tokio::sync::{mpsc, oneshot};

use crate::cluster::Cluster;

/// The most keys in one batch (per node, one script call).
const MAX_BATCH: usize = 512;

/// One key's renewal, as each node answered it: the node's index, and `true` (extended),
/// `false` (not ours there) or the node's error.
pub(crate) type Answers = Vec<(usize, Result<bool, NodeError>)>;

/// One extend waiting for its batch.
pub(crate) struct Renewal {
    key: HeldKey,
    ttl: Duration,
    answer: oneshot::Sender<Answers>,
}

/// The queue into the cluster's renewal task.
pub(crate) type Renewals = TaskQueue<Renewal>;

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
        let cluster = Arc::downgrade(self);
        if self
            .renewals
            .send(renewal, |queue| run(cluster, queue))
            .is_ok()
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

/// The renewal task: take everything queued, start each batch in a task of its own,
/// repeat. Ends when the cluster is dropped (its queue closes).
async fn run(cluster: Weak<Cluster>, mut queue: mpsc::UnboundedReceiver<Renewal>) {
    let mut queued = Vec::new();
    while gather(&mut queue, &mut queued, usize::MAX).await {
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
