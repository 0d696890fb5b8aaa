//! A held key: extension on every node, which gives the key back (with its fence) to nodes
//! that lost it, and release. A majority answering "not ours" means the key is not held;
//! too few answers leave the outcome unknown.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::Held;
use dlock_core::{LockError, LostReason, Result};
use dlock_redis::server::{HeldKey, Names, NodeError};

use crate::NAME;
use crate::cluster::{Cluster, Late};
use crate::election::{self, proclaim_on, proclaimed_token};

/// The handle on a key this client holds on a majority of the nodes.
#[derive(Debug)]
pub(crate) struct RedlockHeld {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) key: String,
    pub(crate) names: Names,
    pub(crate) token: String,
    /// The key and token as the cluster's renewal batches take them; made on the first
    /// renewal (most holds end before one is due).
    pub(crate) renewal: Option<HeldKey>,
    pub(crate) fence: u64,
    pub(crate) ttl: Duration,
    /// The nodes that must keep the key: the majority, or a permit's quorum.
    pub(crate) quorum: usize,
    /// A candidate's hold: the channel its proclaims and its release are announced on.
    pub(crate) leader_channel: Option<String>,
    /// The grant's acquire requests still running on nodes its round was decided without:
    /// the release waits for each on its node.
    pub(crate) late: Late,
}

impl RedlockHeld {
    fn not_held(&self) -> LockError {
        LockError::not_held(NAME, &self.key, LostReason::NotHeld)
    }
}

#[async_trait]
impl Held for RedlockHeld {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let c = &*self.cluster;
        let limit = c.node_timeout(ttl);
        let (names, token) = (&self.names, self.token.as_str());
        let answers = if self.leader_channel.is_some() {
            // A leader's renewal also re-sets the fence counter's lifetime on every node:
            // `leader()` reads the term from the counters a majority agrees on, which must
            // not expire under a leader that leads for longer than their hour. One request
            // per node of its own (one leader per election per process: not worth a batch).
            c.on(&c.all(), limit, "extend", |n| {
                n.extend_leader(names, token, ttl)
            })
            .await
        } else {
            // One request to the cluster's renewer, which sends it to every node in a batch.
            let renewal = self
                .renewal
                .get_or_insert_with(|| HeldKey::new(names, token));
            self.cluster.renew(renewal, ttl).await
        };
        let crate::cluster::Renewed {
            extended,
            missing,
            failures,
        } = crate::cluster::Renewed::of(answers);
        if extended >= self.quorum {
            self.ttl = ttl;
            if !missing.is_empty() {
                // A node that lost the key (restarted empty) gets it back, with the fence;
                // a node where someone else holds it is left alone.
                let fence = self.fence;
                for (i, result) in c
                    .on(&missing, limit, "claim", |n| {
                        n.claim(names, token, ttl, fence)
                    })
                    .await
                {
                    tracing::info!(node = %c.nodes[i].addr(), key = %self.key, ?result, "gave the key back to a node that had lost it");
                }
            }
            return Ok(());
        }
        if extended + failures.len() >= self.quorum {
            // Cannot tell: the watchdog retries until the validity runs out.
            return Err(c.no_quorum_of("extend", self.quorum, failures));
        }
        Err(self.not_held())
    }

    async fn release(&mut self) -> Result<()> {
        let c = &*self.cluster;
        let (names, token) = (&self.names, self.token.as_str());
        // A leader's release waits for every node: its observers are told by the nodes it
        // left.
        let leader = self.leader_channel.is_some();
        // Decided once as many nodes released as hold it: the majority, or a permit's
        // quorum (fewer would leave the permit counted where a new one needs it).
        let settled = |answers: &[(usize, Result<bool, NodeError>)]| {
            !leader
                && answers
                    .iter()
                    .filter(|(_, a)| matches!(a, Ok(true)))
                    .count()
                    >= self.quorum
        };
        let (answers, _) = c
            .on_until(
                &c.all(),
                c.node_timeout(self.ttl),
                "release",
                // After this lease's acquires still running on some nodes.
                &self.late,
                |n| {
                    let (names, token) = (names.clone(), token.to_owned());
                    async move { n.release(&names, &token, true).await }
                },
                settled,
            )
            .await;
        let mut released = 0;
        let mut refused = 0;
        let mut failures = Vec::new();
        let mut gone = Vec::new();
        for (i, answer) in answers {
            match answer {
                Ok(true) => {
                    released += 1;
                    gone.push(i);
                }
                Ok(false) => refused += 1,
                Err(e) => failures.push(e),
            }
        }
        if let Some(channel) = &self.leader_channel {
            // A leader resigned: its observers learn it from the nodes it left (the
            // release script announces only to waiters, and only when there are some).
            election::announce(&self.cluster, gone, channel.clone());
        }
        if refused >= c.quorum {
            return Err(self.not_held());
        }
        if released + refused < c.quorum {
            return Err(c.no_quorum("release", failures));
        }
        Ok(())
    }

    async fn proclaim(&mut self, value: &str) -> Result<()> {
        let Some(channel) = self.leader_channel.clone() else {
            // Only a campaign's hold carries a value (the core proclaims only on those).
            return Err(LockError::Unsupported {
                backend: NAME,
                what: "proclaiming on a hold that is not a candidate's",
            });
        };
        let c = &*self.cluster;
        let names = &self.names;
        let (from, to) = (self.token.clone(), proclaimed_token(&self.token, value));
        let limit = c.node_timeout(self.ttl);
        let answers = c
            .on(&c.all(), limit, "proclaim", |n| {
                proclaim_on(n, names, &from, &to, &channel)
            })
            .await;
        let mut replaced = 0;
        // The nodes that may hold the new token: those that swapped, and those whose
        // answer did not come (the swap may have run there).
        let mut maybe = Vec::new();
        let mut failures = Vec::new();
        for (i, answer) in answers {
            match answer {
                Ok(true) => {
                    replaced += 1;
                    maybe.push(i);
                }
                Ok(false) => {}
                Err(e) => {
                    maybe.push(i);
                    failures.push(e);
                }
            }
        }
        if replaced >= self.quorum {
            // The hold is ours under the new token from now on: renewals and the release
            // carry it. A node the proclaim missed keeps the old token until its ttl.
            self.token = to;
            self.renewal = None;
            return Ok(());
        }
        // Too few nodes took the new value: put the old one back where it may have gone, so
        // observers keep reading the old value. Whether or not that reaches every node,
        // the hold is intact: owner checks compare the random part alone, which both
        // tokens share (so a node left with the new value is still renewed and released).
        c.on(&maybe, limit, "proclaim", |n| {
            proclaim_on(n, names, &to, &from, &channel)
        })
        .await;
        if replaced + failures.len() >= self.quorum {
            return Err(c.no_quorum_of("proclaim", self.quorum, failures));
        }
        Err(self.not_held())
    }
}
