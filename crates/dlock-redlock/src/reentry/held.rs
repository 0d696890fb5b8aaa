//! One lease of an owner's hold: renewal (the whole hold, never shortened) and release (the
//! lease's field; the key frees on a node with the last field there).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::Held;
use dlock_core::{LockError, LostReason, Result};

use crate::NAME;
use crate::cluster::Cluster;
use crate::reentry::Entry;

/// The handle on one lease of an owner's hold, which a majority of the nodes count.
#[derive(Debug)]
pub(crate) struct OwnedHeld {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) key: String,
    pub(crate) entry: Entry,
    /// The hold's token: the lock key's value on the nodes while the hold lives.
    pub(crate) hold: String,
    /// The token this lease's acquire queued with (if it waited): its release leaves the
    /// queues that still have it.
    pub(crate) queued: String,
    pub(crate) fence: u64,
    pub(crate) ttl: Duration,
}

impl OwnedHeld {
    fn not_held(&self) -> LockError {
        LockError::not_held(NAME, &self.key, LostReason::NotHeld)
    }
}

#[async_trait]
impl Held for OwnedHeld {
    /// One owner-checked renewal script per node, in parallel (not batched: owner holds
    /// renew the hold record with the key). `Q` renewed: kept, and the nodes where the
    /// lease did not count (restarted empty, or missed the lease's re-entry) get the hold
    /// back with this lease counted, unless someone else holds the key there.
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let c = &*self.cluster;
        let limit = c.node_timeout(ttl);
        let (entry, hold) = (&self.entry, self.hold.as_str());
        let answers = c
            .on(&c.all(), limit, "extend", |n| entry.renew(n, hold, ttl))
            .await;
        let crate::cluster::Renewed {
            extended,
            missing,
            failures,
        } = crate::cluster::Renewed::of(answers);
        if extended >= c.quorum {
            self.ttl = ttl;
            if !missing.is_empty() {
                let fence = self.fence;
                for (i, result) in c
                    .on(&missing, limit, "claim", |n| {
                        entry.claim(n, hold, ttl, fence)
                    })
                    .await
                {
                    tracing::info!(node = %c.nodes[i].addr(), key = %self.key, ?result, "gave an owner's hold back to a node that did not count the lease");
                }
            }
            return Ok(());
        }
        if extended + failures.len() >= c.quorum {
            return Err(c.no_quorum("extend", failures));
        }
        Err(self.not_held())
    }

    /// The lease's field out of the hold on every node, in parallel; a node frees the key
    /// (and calls its next waiter) when its last field goes. `NotHeld` when a majority do
    /// not count the lease.
    async fn release(&mut self) -> Result<()> {
        let c = &*self.cluster;
        let (entry, queued) = (&self.entry, self.queued.as_str());
        let answers = c
            .on(&c.all(), c.node_timeout(self.ttl), "release", |n| {
                entry.release(n, queued, true)
            })
            .await;
        let mut released = 0;
        let mut refused = 0;
        let mut failures = Vec::new();
        for (_, answer) in answers {
            match answer {
                Ok(Some(_)) => released += 1,
                Ok(None) => refused += 1,
                Err(e) => failures.push(e),
            }
        }
        if refused >= c.quorum {
            return Err(self.not_held());
        }
        if released + refused < c.quorum {
            return Err(c.no_quorum("release", failures));
        }
        Ok(())
    }
}
