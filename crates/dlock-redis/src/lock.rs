//! The [`Backend`] and [`Held`] implementations: connection, acquire (with waiting),
//! release, renewal. Loss is detected by the core's watchdog from failed renewals.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{
    Backend, Capabilities, Deadline, Expiry, Fencing, Grant, Held, LockError, LockStats,
    LostReason, Result, Wakeup,
};
use tokio::time::Instant;

use crate::NAME;
use crate::config::RedisConfig;
use crate::node::{Attempt, Node};
use crate::scripts::{self, Names};
use crate::subscriber::Subscription;

/// How long a waiter sleeps before re-checking a key that has no expiry (held by another
/// library's lock taken without a timeout, whose release announces nothing).
pub const NO_EXPIRY_RECHECK: Duration = Duration::from_secs(1);

/// The Redis protocol for [`LockClient`](dlock_core::LockClient): see the crate docs.
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

/// When a waiter re-checks a busy key if no release is announced: just after the holder's
/// ttl runs out (a crashed holder announces nothing), or after [`NO_EXPIRY_RECHECK`].
pub fn recheck_after(pttl: Option<Duration>) -> Duration {
    // One millisecond past the holder's expiry: PTTL is rounded down.
    pttl.map_or(NO_EXPIRY_RECHECK, |p| p + Duration::from_millis(1))
}

#[async_trait]
impl Backend for RedisBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: false,
            fencing: Fencing::BestEffort {
                why: "the token is a per-key counter in the server's memory, floored by the \
                      server clock in microseconds: it keeps increasing across a restart \
                      without persistence or a failover only while the server clock never \
                      steps back",
            },
            expiry: Expiry::Ttl,
            releases_on_disconnect: false,
            wakeup: Wakeup::Notification {
                one_per_release: false,
            },
            ..Default::default()
        }
    }

    async fn acquire(&self, key: &str, ttl: Duration, deadline: Deadline) -> Result<Option<Grant>> {
        let names = Names::new(&self.prefix, key);
        let token = scripts::new_token();
        let mut subscription: Option<Subscription> = None;
        let mut retried = false;
        loop {
            if let Some(s) = &mut subscription {
                s.mark_seen();
            }
            let sent_at = Instant::now();
            let attempt = match InFlight::new(&self.node, &names, &token)
                .run(self.node.acquire(&names, &token, ttl))
                .await
            {
                Ok(attempt) => attempt,
                // A waiter whose connection broke (a reset, a server restart) tries once more
                // on a new connection; a second failure in a row ends the wait.
                Err(e) if subscription.is_some() && !retried && e.is_unavailable() => {
                    tracing::debug!(key, error = %e, "acquire failed while waiting; retrying");
                    retried = true;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            retried = false;
            let pttl = match attempt {
                Attempt::Taken { fence } => {
                    let held = RedisHeld {
                        node: self.node.clone(),
                        key: key.to_owned(),
                        names,
                        token,
                    };
                    return Ok(Some(Grant::new(fence, Box::new(held), sent_at)));
                }
                Attempt::Busy { pttl } => pttl,
            };
            if !deadline.may_wait() {
                return Ok(None);
            }
            // Subscribe before the next attempt, so a release in between is not missed.
            match &subscription {
                Some(s) if s.is_alive() => {}
                _ => {
                    subscription = Some(self.node.subscribe(&names.channel).await?);
                    continue;
                }
            }
            let sub = subscription.as_mut().expect("subscribed above");
            let recheck_at = deadline.min(Instant::now() + recheck_after(pttl));
            tokio::select! {
                _ = sub.changed() => {}
                _ = tokio::time::sleep_until(recheck_at) => {}
            }
            if !deadline.may_wait() {
                return Ok(None);
            }
            self.wakeups.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.wakeups.load(Ordering::Relaxed))
    }
}

/// An acquire request on its way: if the caller drops the acquire future before the
/// answer arrives, the key may be ours on the server, so release it in the background.
struct InFlight<'a> {
    node: &'a Node,
    names: &'a Names,
    token: &'a str,
    armed: bool,
}

impl<'a> InFlight<'a> {
    fn new(node: &'a Node, names: &'a Names, token: &'a str) -> Self {
        Self {
            node,
            names,
            token,
            armed: true,
        }
    }

    async fn run<T>(mut self, request: impl Future<Output = T>) -> T {
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
        let (node, names, token) = (self.node.clone(), self.names.clone(), self.token.to_owned());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let result = node.release(&names, &token).await;
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
}

impl RedisHeld {
    fn not_held(&self) -> LockError {
        LockError::NotHeld {
            backend: NAME,
            key: self.key.clone(),
            reason: LostReason::NotHeld,
        }
    }
}

#[async_trait]
impl Held for RedisHeld {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        match self.node.extend(&self.names, &self.token, ttl).await? {
            true => Ok(()),
            false => Err(self.not_held()),
        }
    }

    async fn release(&mut self) -> Result<()> {
        match self.node.release(&self.names, &self.token).await? {
            true => Ok(()),
            false => Err(self.not_held()),
        }
    }
}
