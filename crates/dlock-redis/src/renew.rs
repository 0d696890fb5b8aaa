//! Renewals coalesced per server: every extend of every key held through one [`Node`] goes
//! to one task, which sends whatever has queued as one script call (up to
//! [`MAX_BATCH`] keys) and answers each caller from that key's own status.
//!
//! No timer: a lone extend goes out at once; a batch is what queued while the previous one
//! was in flight. So N held keys cost about N / (keys per batch) requests per renewal
//! round, not N, and the server runs one command per batch.

use std::sync::{Arc, Weak};
use std::time::Duration;

use redis::{Cmd, ErrorKind, ServerErrorKind};
use tokio::sync::{mpsc, oneshot};

use crate::error::Error;
use crate::gather::{TaskQueue, gather};
use crate::node::{Inner, Node};
use crate::scripts::{self, Names};

/// The most keys in one renewal request: large enough that 10,000 held keys renewing in
/// the same moment take a few dozen requests, small enough that one batch stays well under
/// a millisecond of server time.
pub(crate) const MAX_BATCH: usize = 512;

/// A key held with a token: what a renewal needs, cheap to clone (one shared allocation
/// made when the key was taken, none per renewal).
#[derive(Debug, Clone)]
pub struct HeldKey(Arc<KeyAndToken>);

#[derive(Debug)]
struct KeyAndToken {
    key: String,
    token: String,
    /// For an entry of an owner's hold: the hold hash.
    hold: Option<String>,
}

impl HeldKey {
    /// The lock key of `names`, held with `token`.
    pub fn new(names: &Names, token: &str) -> Self {
        Self(Arc::new(KeyAndToken {
            key: names.key.clone(),
            token: token.to_owned(),
            hold: None,
        }))
    }

    /// The entry `token` (the token its acquire sent) of an owner's reentrant hold of the
    /// lock key of `names`: renewed while that entry is in the key's current hold, and
    /// never to a shorter ttl than the hold has left (see the crate docs, *Reentrant
    /// holds*).
    pub fn entry(names: &Names, token: &str) -> Self {
        Self(Arc::new(KeyAndToken {
            key: names.key.clone(),
            token: format!("+{token}"),
            hold: Some(names.hold.clone()),
        }))
    }

    /// The hold hash, for an entry of an owner's hold.
    pub(crate) fn hold(&self) -> Option<&str> {
        self.0.hold.as_deref()
    }

    /// The lock key on the server.
    pub fn key(&self) -> &str {
        &self.0.key
    }

    /// The holder's token (for an entry of an owner's hold, its token after a `+`).
    pub fn token(&self) -> &str {
        &self.0.token
    }
}

/// One extend waiting for its batch.
pub(crate) struct Renewal {
    key: HeldKey,
    ttl_ms: u64,
    answer: oneshot::Sender<Result<bool, Error>>,
}

/// The queue into a node's renewal task.
pub(crate) type Renewals = TaskQueue<Renewal>;

impl Node {
    /// Reset the ttl of `key` to `ttl` if it still holds our token, batched with the other
    /// renewals on this server. `false`: the key is not ours.
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script; every renewal
    /// of the batch gets the same error.
    pub async fn renew(&self, key: &HeldKey, ttl: Duration) -> Result<bool, Error> {
        let (answer, answered) = oneshot::channel();
        let renewal = Renewal {
            key: key.clone(),
            ttl_ms: scripts::millis(ttl),
            answer,
        };
        let node = self.inner_weak();
        if self
            .inner()
            .renewals
            .send(renewal, |queue| run(node, queue))
            .is_ok()
            && let Ok(result) = answered.await
        {
            return result;
        }
        // No renewal task could take it (no runtime, or the task's runtime shut down
        // mid-batch): renew this key alone.
        self.extend_one(key, ttl).await
    }

    /// Reset the ttl of each of `keys` that still holds our token, in one request of its
    /// own, not through this node's renewal queue: for a caller that batches renewals
    /// itself, as Redlock does over its nodes (one request per node per batch, each under
    /// its own timeout). One answer per key, in order: `false` where the key is not ours.
    ///
    /// # Errors
    /// The server could not be reached, timed out, refused the script or answered
    /// something else than a status per key: the outcome for every key is unknown.
    pub async fn renew_many(&self, keys: &[(HeldKey, Duration)]) -> Result<Vec<bool>, Error> {
        let groups = self.slot_groups(keys.iter().map(|(key, _)| key));
        let mut statuses = vec![0; keys.len()];
        let answers = futures::future::join_all(groups.iter().map(|group| {
            self.extend_many(
                group
                    .iter()
                    .map(|&i| (&keys[i].0, scripts::millis(keys[i].1))),
            )
        }))
        .await;
        for (group, answer) in groups.iter().zip(answers) {
            for (&i, status) in group.iter().zip(answer?) {
                statuses[i] = status;
            }
        }
        statuses
            .into_iter()
            .map(|status| match status {
                1 => Ok(true),
                0 => Ok(false),
                other => Err(self.reply("extend", other)),
            })
            .collect()
    }

    /// The indices of `keys` grouped by hash slot, each group in order, when this node is
    /// a cluster (a script may only touch keys of one slot); one group of all otherwise.
    fn slot_groups<'k>(&self, keys: impl Iterator<Item = &'k HeldKey>) -> Vec<Vec<usize>> {
        if !self.is_cluster() {
            return vec![keys.enumerate().map(|(i, _)| i).collect()];
        }
        let mut groups: Vec<(redis::cluster_routing::Slot, Vec<usize>)> = Vec::new();
        for (i, key) in keys.enumerate() {
            let slot = redis::cluster_routing::Slot::for_key(key.key());
            match groups.iter_mut().find(|(s, _)| *s == slot) {
                Some((_, group)) => group.push(i),
                None => groups.push((slot, vec![i])),
            }
        }
        groups.into_iter().map(|(_, group)| group).collect()
    }

    /// Renew `batch` and answer each renewal: one request, or on a cluster one per hash
    /// slot (in parallel), each answering its own renewals.
    async fn renew_batch(&self, batch: &mut Vec<Renewal>) {
        let groups = self.slot_groups(batch.iter().map(|r| &r.key));
        if groups.len() <= 1 {
            return self.renew_slot(batch).await;
        }
        let mut parts: Vec<Vec<Renewal>> =
            groups.iter().map(|g| Vec::with_capacity(g.len())).collect();
        let mut owner = vec![0; batch.len()];
        for (n, group) in groups.iter().enumerate() {
            for &i in group {
                owner[i] = n;
            }
        }
        for (renewal, n) in batch.drain(..).zip(owner) {
            parts[n].push(renewal);
        }
        futures::future::join_all(parts.iter_mut().map(|part| self.renew_slot(part))).await;
    }

    /// Renew `batch` (keys of one hash slot) in one request and answer each renewal.
    async fn renew_slot(&self, batch: &mut Vec<Renewal>) {
        let result = self
            .extend_many(batch.iter().map(|r| (&r.key, r.ttl_ms)))
            .await;
        match result {
            Ok(statuses) => {
                for (renewal, status) in batch.drain(..).zip(statuses) {
                    let _ = renewal.answer.send(match status {
                        1 => Ok(true),
                        0 => Ok(false),
                        other => Err(self.reply("extend", other)),
                    });
                }
            }
            Err(e) => {
                for renewal in batch.drain(..) {
                    let _ = renewal.answer.send(Err(e.clone()));
                }
            }
        }
    }

    /// One `EXTEND_MANY` call for `batch` (each key with its ttl in ms); one status per
    /// key, in order.
    async fn extend_many<'k>(
        &self,
        batch: impl ExactSizeIterator<Item = (&'k HeldKey, u64)> + Clone,
    ) -> Result<Vec<i64>, Error> {
        let len = batch.len();
        let bytes: usize = batch
            .clone()
            .map(|(key, _)| {
                key.key().len() + key.token().len() + key.hold().map_or(0, str::len) + 20
            })
            .sum();
        let holds = batch
            .clone()
            .filter(|(key, _)| key.hold().is_some())
            .count();
        let mut cmd = Cmd::with_capacity(3 + 3 * len + holds, bytes + 64);
        cmd.arg("EVALSHA")
            .arg(scripts::EXTEND_MANY.get_hash())
            .arg(len + holds);
        for (key, _) in batch.clone() {
            cmd.arg(key.key());
        }
        // The hold hashes of the owners' entries, in their order, after the lock keys.
        for hold in batch.clone().filter_map(|(key, _)| key.hold()) {
            cmd.arg(hold);
        }
        for (key, ttl_ms) in batch {
            cmd.arg(key.token()).arg(ttl_ms);
        }
        let (id, mut conn) = self.connection().await?;
        let statuses: Vec<i64> = match cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // The server lost its scripts (restart, SCRIPT FLUSH): load it, try again.
                scripts::EXTEND_MANY
                    .load_async(&mut conn)
                    .await
                    .map_err(|e| self.failure("extend", id, e))?;
                cmd.query_async(&mut conn).await
            }
            other => other,
        }
        .map_err(|e| self.failure("extend", id, e))?;
        if statuses.len() != len {
            return Err(self.reply("extend", statuses.len()));
        }
        Ok(statuses)
    }
}

/// The renewal task of one node: take everything queued, send it as one request, repeat.
/// Ends when the node is dropped (its queue closes).
async fn run(node: Weak<Inner>, mut queue: mpsc::UnboundedReceiver<Renewal>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    while gather(&mut queue, &mut batch, MAX_BATCH).await {
        // A caller that gave up (a Redlock per-node timeout) needs no renewal.
        batch.retain(|r| !r.answer.is_closed());
        if batch.is_empty() {
            continue;
        }
        let Some(inner) = node.upgrade() else { return };
        Node::from_inner(inner).renew_batch(&mut batch).await;
    }
}
