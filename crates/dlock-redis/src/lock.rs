//! The [`Backend`] and [`Held`] implementations: connection, acquire (with waiting),
//! release, renewal. Loss is detected by the core's watchdog from failed renewals.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant, Held};
use dlock_core::{
    Capabilities, Expiry, Fencing, Inspection, KeyStatus, LockError, LockOptions, LockStats,
    LostReason, Result, WaiterView, Wakeup,
};
use tokio::time::Instant;

use crate::NAME;
use crate::config::RedisConfig;
use crate::node::{Attempt, Node, Queueing};
use crate::renew::HeldKey;
use crate::scripts::{self, Names};
use crate::wait::{View, Waiter};

/// The Redis protocol for [`LockClient`](dlock_core::raw::LockClient): see the crate docs.
#[derive(Debug)]
pub struct RedisBackend {
    node: Node,
    prefix: String,
    wakeups: Arc<AtomicU64>,
}

impl RedisBackend {
    /// Connect to the server `config` names: open the command connection (checking the
    /// credentials and that the server speaks Redis) and load the scripts, bounded by the
    /// connect timeout. The subscriber connection opens when a first acquire waits.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when the server cannot be reached in time,
    /// [`LockError::Backend`] when it refuses (wrong password, not a Redis server).
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        let node = Node::new(&config, NAME)?;
        node.connect().await?;
        Ok(Self {
            node,
            prefix: config.prefix,
            wakeups: Arc::default(),
        })
    }
}

#[async_trait]
impl Backend for RedisBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // One queue per key on the server, served in order of arrival.
            fair: true,
            fencing: Fencing::BestEffort {
                why: "the token is a per-key counter in the server's memory, floored by the \
                      server clock in microseconds: it keeps increasing across a restart \
                      without persistence or a failover only while the server clock never \
                      steps back",
            },
            expiry: Expiry::Ttl,
            releases_on_disconnect: false,
            // Readers are a sorted set at the lock key, ordered with writers in one queue.
            shared: true,
            // Permit holders are members of that sorted set, counted against each
            // acquirer's own limit; the queue calls the waiters whose turn a release makes.
            permits: true,
            // A release calls the first live waiter by name (and the readers right behind
            // a reader); the others sleep on.
            wakeup: Wakeup::Notification {
                one_per_release: true,
                max_per_waiter: 1,
            },
            // A restart without persistence or a failover loses held keys (another client may
            // take one before its holder's next renewal); the clock floor keeps tokens rising.
            faults: dlock_core::Faults {
                holder_paused: dlock_core::FaultSafety::Fenced,
                server_restart: dlock_core::FaultSafety::Fenced,
                member_down: dlock_core::FaultSafety::Fenced,
            },
            // Holders' tokens carry their description; the queue is one sorted set by
            // ticket; SCAN enumerates the lock keys under the key prefix.
            inspect: Inspection {
                who: true,
                waiters: WaiterView::Queue,
                list: true,
            },
            ..Default::default()
        }
    }

    async fn acquire(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        let ttl = opts.ttl;
        let names = Names::new(&self.prefix, key);
        let token = scripts::token_for(opts.mode);
        let nodes = std::slice::from_ref(&self.node);
        // A caller that may wait joins the key's queue from its first attempt on; its
        // waiter (a channel for calls, its place in line) is made only once it has to wait,
        // so an acquire that finds the key free pays for none of it.
        let may_wait = deadline.may_wait();
        let mut waiter: Option<Waiter> = None;
        let mut first_attempt = true;
        let mut retried = false;
        // The key was found busy: a grant after that is a hand-off.
        let mut found_busy = false;
        loop {
            let queueing = match &mut waiter {
                Some(w) => {
                    w.start_attempt();
                    w.queueing(None)
                }
                None => Queueing {
                    wait: may_wait,
                    ..Queueing::default()
                },
            };
            let sent_at = Instant::now();
            let request = InFlight::new(nodes, &names, &token)
                .run(self.node.acquire(&names, &token, ttl, &queueing));
            // The first attempt may run its timeouts out (a dead server is `Unavailable`);
            // later ones, made while waiting, end at the deadline.
            let answer = if std::mem::take(&mut first_attempt) {
                request.await
            } else {
                match deadline.run(request).await {
                    Some(answer) => answer,
                    None => return Ok(None),
                }
            };
            if may_wait && waiter.is_none() && !matches!(answer, Ok(Attempt::Taken { .. })) {
                // The attempt may have queued us: from here on, giving up leaves the queue.
                waiter = Some(Waiter::new(
                    nodes.to_vec(),
                    names.clone(),
                    token.clone(),
                    None,
                    1,
                    None,
                ));
            }
            let attempt = match answer {
                Ok(attempt) => attempt,
                // A waiter whose connection broke (a reset, a server restart) tries once more
                // on a new connection; a second failure in a row ends the wait.
                Err(e) if waiter.is_some() && !retried && e.is_unavailable() => {
                    tracing::debug!(key, error = %e, "acquire failed while waiting; retrying");
                    retried = true;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            retried = false;
            let view = match attempt {
                Attempt::Taken { fence } => {
                    if let Some(w) = &mut waiter {
                        w.granted();
                    }
                    let held = RedisHeld {
                        node: self.node.clone(),
                        key: key.to_owned(),
                        renewal: None,
                        names,
                        token,
                    };
                    let grant = Grant::new(fence, Box::new(held), sent_at);
                    return Ok(Some(match found_busy {
                        true => grant.after_wait(),
                        false => grant,
                    }));
                }
                busy => {
                    found_busy = true;
                    View::of(&busy)
                }
            };
            let Some(waiter) = waiter.as_mut().filter(|_| deadline.may_wait()) else {
                return Ok(None);
            };
            // Listen before the next attempt, so a call in between is not missed.
            if waiter.listening() < 1 {
                let Some(mut subscribed) = deadline.run(waiter.subscribe()).await else {
                    return Ok(None);
                };
                if let Some((_, e)) = subscribed.failed.pop() {
                    return Err(e.into());
                }
                continue;
            }
            if !waiter.sleep(&[view], deadline, &self.wakeups).await {
                return Ok(None);
            }
        }
    }

    fn check_key(&self, key: &str) -> Result<()> {
        Names::check(&self.prefix, key)
    }

    async fn inspect(&self, key: &str) -> Result<KeyStatus> {
        let status = self.node.inspect(&Names::new(&self.prefix, key)).await?;
        Ok(status.key_status(key))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self.node.held_keys(&self.prefix, prefix).await?)
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.wakeups.load(Ordering::Relaxed))
    }
}

/// An acquire request on its way: if the caller drops the acquire future before the
/// answers arrive, the key may be ours on the servers, so release it there in the
/// background (announcing it, in case others wait on it).
#[derive(Debug)]
pub struct InFlight<'a> {
    nodes: &'a [Node],
    names: &'a Names,
    token: &'a str,
    armed: bool,
}

impl<'a> InFlight<'a> {
    /// A guard for an acquire of `names` with `token` on `nodes`.
    pub fn new(nodes: &'a [Node], names: &'a Names, token: &'a str) -> Self {
        Self {
            nodes,
            names,
            token,
            armed: true,
        }
    }

    /// Run `request` under the guard.
    pub async fn run<T>(mut self, request: impl Future<Output = T>) -> T {
        let out = request.await;
        self.armed = false;
        out
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        for node in self.nodes {
            let (node, names, token) = (node.clone(), self.names.clone(), self.token.to_owned());
            dlock_core::raw::spawn_cleanup(async move {
                let result = node.release(&names, &token, true).await;
                tracing::debug!(key = %names.key, ?result, "released after a cancelled acquire");
            });
        }
    }
}

/// The handle on a key this client holds.
#[derive(Debug)]
pub(crate) struct RedisHeld {
    node: Node,
    key: String,
    names: Names,
    token: String,
    /// Made on the first renewal: most holds end before one is due.
    renewal: Option<HeldKey>,
}

impl RedisHeld {
    fn not_held(&self) -> LockError {
        LockError::not_held(NAME, &self.key, LostReason::NotHeld)
    }
}

#[async_trait]
impl Held for RedisHeld {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let renewal = self
            .renewal
            .get_or_insert_with(|| HeldKey::new(&self.names, &self.token));
        match self.node.renew(renewal, ttl).await? {
            true => Ok(()),
            false => Err(self.not_held()),
        }
    }

    async fn release(&mut self) -> Result<()> {
        match self.node.release(&self.names, &self.token, true).await? {
            true => Ok(()),
            false => Err(self.not_held()),
        }
    }
}
