//! [`LockClient`]: a [`Backend`] plus the machinery every backend shares.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::raw::backend::{Backend, Grant};
use crate::raw::gate::{Gate, GatePermit, OwnerTurn};
use crate::raw::pending::PendingWatchdogs;
use crate::raw::{key, watchdog};
use crate::telemetry::Labels;
use futures::stream::BoxStream;

use crate::{
    Capabilities, Deadline, DistributedLock, ErrorKind, Expiry, KeyStatus, Leader, Lease,
    LockError, LockOptions, LockStats, LostReason, Mode, Observe, Result,
};

/// A [`DistributedLock`] made from a [`Backend`].
///
/// Every backend crate exports its lock as a `LockClient` of its backend (for example
/// `dlock_redis::RedisLock`). Before any network I/O it checks the key and the options; it
/// queues the tasks of this client per key (the local gate), so only one of them talks to
/// the server at a time and they are served in arrival order; it gives every acquire one
/// deadline; and it runs each lease's watchdog.
///
/// A ttl grant that arrives after its first renewal was due (a slow answer, or a wait in
/// which the backend's renewals failed) may already have expired on the server, whose key
/// can linger a moment before the server deletes it. Such a grant is confirmed with one
/// extend (bounded by the acquire's deadline) before it is handed out; if the server says
/// the key is no longer ours, the grant is given back and the acquire tries again while its
/// deadline allows, and otherwise answers as for a busy key.
///
/// Cloning is cheap and shares the connection(s) and the local gate.
pub struct LockClient<B: Backend> {
    backend: Arc<B>,
    gate: Arc<Gate>,
    pending: Arc<PendingWatchdogs>,
}

impl<B: Backend> LockClient<B> {
    /// Wrap a connected backend.
    pub fn new(backend: B) -> Self {
        Self {
            backend: Arc::new(backend),
            gate: Arc::default(),
            pending: Arc::default(),
        }
    }

    /// The backend, for backend-specific calls.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The checks every acquire makes before any network I/O.
    fn check(&self, caps: &Capabilities, key: &str, opts: &LockOptions) -> Result<()> {
        key::validate(key, caps.max_key_len)?;
        self.backend.check_key(key)?;
        opts.validate(B::NAME)?;
        let unsupported = match (opts.mode, opts.owner) {
            (Mode::Shared, _) if !caps.shared => Some("a shared hold"),
            (Mode::Permits(_), _) if !caps.permits => Some("a permit (semaphore) hold"),
            (_, Some(_)) if !caps.reentrant.is_supported() => Some("a reentrant hold (an owner)"),
            (Mode::Shared | Mode::Permits(_), Some(_)) => {
                Some("a reentrant shared or permit hold: an owner takes exclusive holds only")
            }
            _ => None,
        };
        match unsupported {
            Some(what) => Err(LockError::Unsupported {
                backend: B::NAME,
                what,
            }),
            None => Ok(()),
        }
    }

    /// Take `key` (as a candidate publishing `value`, for a campaign).
    /// The checks reading an election makes before any I/O: the key, and a backend that
    /// runs elections.
    fn check_election_key(&self, key: &str) -> Result<()> {
        let caps = self.backend.capabilities();
        key::validate(key, caps.max_key_len)?;
        self.backend.check_key(key)?;
        if caps.election == Observe::Unsupported {
            return Err(LockError::Unsupported {
                backend: B::NAME,
                what: "leader elections",
            });
        }
        Ok(())
    }

    /// The checks a campaign makes beyond an acquire's, before any I/O.
    fn check_campaign(caps: &Capabilities, opts: &LockOptions, value: &str) -> Result<()> {
        if caps.election == Observe::Unsupported {
            return Err(LockError::Unsupported {
                backend: B::NAME,
                what: "leader elections",
            });
        }
        if opts.mode != Mode::Exclusive {
            return Err(LockError::invalid_config(
                B::NAME,
                "a candidate campaigns for an exclusive hold: a leader leads alone",
            ));
        }
        if opts.owner.is_some() {
            return Err(LockError::invalid_config(
                B::NAME,
                "a candidate campaigns without an owner: a leadership is not reentrant",
            ));
        }
        crate::election::check_value(B::NAME, value)
    }

    /// Take `key` (as a candidate publishing `value`, for a campaign).
    async fn take(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
        value: Option<&str>,
    ) -> Result<Option<Lease>> {
        let caps = self.backend.capabilities();
        self.check(&caps, key, opts)?;
        if let Some(value) = value {
            Self::check_campaign(&caps, opts, value)?;
        }
        let (mut permit, joined) = match opts.owner {
            Some(owner) => match self.gate.enter_as(key, owner, deadline).await {
                Some(OwnerTurn::First(permit)) => (permit, false),
                Some(OwnerTurn::Joined(permit)) => (permit, true),
                None => return Ok(None),
            },
            None => match self.gate.enter(key, opts.mode, deadline).await {
                Some(permit) => (permit, false),
                None => return Ok(None),
            },
        };
        loop {
            let granted = match value {
                _ if joined => match self.reenter(key, opts, deadline, &permit).await? {
                    Reentered::Granted(granted) => granted,
                    Reentered::Busy => return Ok(None),
                },
                Some(value) => self.backend.campaign(key, value, opts, deadline).await?,
                None => self.backend.acquire(key, opts, deadline).await?,
            };
            let Some(grant) = granted else {
                return Ok(None);
            };
            let mut grant = Unclaimed {
                backend: B::NAME,
                key,
                grant: Some(grant),
                permit: Some(permit),
            };
            if caps.expiry == Expiry::Ttl && grant.is_late(opts.ttl) {
                // Past the deadline, a grant that needs confirming is answered as late.
                if !deadline.may_wait() && deadline != Deadline::TryOnce {
                    return Ok(None);
                }
                match grant.confirm(opts.ttl, deadline).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::NotHeld && deadline.may_wait() => {
                        tracing::debug!(
                            backend = B::NAME,
                            key,
                            "a late grant had expired on the server; acquiring again"
                        );
                        permit = grant.give_back();
                        continue;
                    }
                    // The grant is given back when dropped.
                    Err(e) if e.kind() == ErrorKind::NotHeld => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
            let (grant, permit) = grant.claim();
            tracing::debug!(
                backend = B::NAME,
                key,
                token = grant.fencing_token,
                owner = opts.owner.as_ref().map(crate::Owner::as_str),
                "acquired"
            );
            if let Some(owner) = opts.owner {
                self.gate.hold_as(key, owner, &permit);
            }
            return Ok(Some(Lease::start(
                B::NAME,
                key,
                grant,
                opts,
                caps.expiry,
                permit,
                primitive(opts, value),
                Some(&self.pending),
            )));
        }
    }
}

impl<B: Backend> LockClient<B> {
    /// A joined task's acquire: after the owner's other tasks of this client, one at a
    /// time, within `deadline`. A re-entry of a live hold answers at once; if the hold is
    /// gone (the server answers busy), the task waits on the server as any acquire, and
    /// marks it, so that the owner's tasks that may not wait do not queue behind it.
    async fn reenter(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
        permit: &GatePermit,
    ) -> Result<Reentered> {
        let Some(_alone) = permit.call_alone(deadline).await else {
            return Ok(Reentered::Busy);
        };
        if let Some(grant) = self.backend.acquire(key, opts, Deadline::TryOnce).await? {
            return Ok(Reentered::Granted(Some(grant)));
        }
        if !deadline.may_wait() {
            return Ok(Reentered::Granted(None));
        }
        let _waiting = permit.server_wait();
        Ok(Reentered::Granted(
            self.backend.acquire(key, opts, deadline).await?,
        ))
    }
}

/// What a joined task's turn to ask the server came to.
enum Reentered {
    /// It asked: the backend's answer.
    Granted(Option<Grant>),
    /// Another task of the owner waits on the server, and this one may not wait.
    Busy,
}

/// The `primitive` label of a hold's figures: the mode, or `election` for a campaign.
fn primitive(opts: &LockOptions, value: Option<&str>) -> &'static str {
    match value {
        Some(_) => "election",
        None => opts.mode.as_str(),
    }
}

/// A grant not yet handed out as a [`Lease`], with this task's turn on the key. Dropped
/// unclaimed (not confirmed, or the acquire future dropped meanwhile), the grant is released
/// in the background, and the next local task's turn comes once that release is done. The
/// release is owner-checked, so it never frees a key someone else holds.
struct Unclaimed<'a> {
    backend: &'static str,
    key: &'a str,
    grant: Option<Grant>,
    permit: Option<GatePermit>,
}

impl Unclaimed<'_> {
    fn grant(&mut self) -> &mut Grant {
        self.grant.as_mut().expect("claimed only once, at the end")
    }

    /// Whether the grant arrived after its first renewal was due: the answer was slow, or
    /// the backend waited while its renewals failed. Such a lease may be close to, or past,
    /// its server-side expiry (and a server may still show the key for a moment after it
    /// expired, until it deletes it), so it is confirmed before anyone relies on it.
    fn is_late(&mut self, ttl: Duration) -> bool {
        Instant::now() >= self.grant().sent_at + ttl / 3
    }

    /// Confirm a late grant with one extend, bounded by the acquire's deadline and so that
    /// its answer arrives while the renewed lease is still safe. On success the lease runs
    /// `ttl` from the extend.
    async fn confirm(&mut self, ttl: Duration, deadline: Deadline) -> Result<()> {
        let (backend, key) = (self.backend, self.key);
        let grant = self.grant();
        let sent_at = Instant::now();
        tracing::debug!(
            backend,
            key,
            late_ms = sent_at.duration_since(grant.sent_at).as_millis(),
            "a late grant; confirming it with one extend"
        );
        let safe = sent_at + ttl.saturating_sub(watchdog::safety_margin(ttl));
        let until = match deadline {
            Deadline::At(at) => at.min(safe),
            _ => safe,
        };
        match tokio::time::timeout_at(until, grant.held.extend(ttl)).await {
            Ok(Ok(())) => {
                grant.sent_at = sent_at;
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            // The deadline came first: answered as late, like a busy key.
            Err(_) if until < safe => Err(LockError::not_held(backend, key, LostReason::Expired)),
            Err(_) => Err(LockError::unavailable(
                backend,
                "acquire",
                "confirming a late grant was not answered in time",
            )),
        }
    }

    /// Release the grant in the background and keep this task's turn, to try again.
    fn give_back(mut self) -> GatePermit {
        self.release_in_background(None);
        self.permit.take().expect("the permit is taken only once")
    }

    /// The grant and the turn, to start the lease.
    fn claim(mut self) -> (Grant, GatePermit) {
        let grant = self.grant.take().expect("claimed only once");
        let permit = self.permit.take().expect("the permit is taken only once");
        (grant, permit)
    }

    /// Release the grant in the background; `permit` goes when the release is done.
    fn release_in_background(&mut self, permit: Option<GatePermit>) {
        let Some(grant) = self.grant.take() else {
            return;
        };
        let (backend, key, mut held) = (self.backend, self.key.to_owned(), grant.held);
        crate::spawn_cleanup(async move {
            let result = held.release().await;
            tracing::debug!(
                backend,
                key,
                ?result,
                "released a grant that was not handed out"
            );
            drop(permit);
        });
    }
}

impl Drop for Unclaimed<'_> {
    fn drop(&mut self) {
        let permit = self.permit.take();
        self.release_in_background(permit);
    }
}

impl<B: Backend> Clone for LockClient<B> {
    fn clone(&self) -> Self {
        Self {
            backend: self.backend.clone(),
            gate: self.gate.clone(),
            pending: self.pending.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for LockClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<B: Backend> DistributedLock for LockClient<B> {
    fn backend_name(&self) -> &'static str {
        B::NAME
    }

    fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    fn stats(&self) -> LockStats {
        self.backend.stats()
    }

    fn validate(&self, key: &str, opts: &LockOptions) -> Result<()> {
        self.check(&self.backend.capabilities(), key, opts)
    }

    async fn try_acquire(&self, key: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        let started = Instant::now();
        let taken = self.take(key, opts, Deadline::TryOnce, None).await;
        let outcome = match &taken {
            Ok(Some(_)) => "acquired",
            Ok(None) => "busy",
            Err(_) => "error",
        };
        Labels::new(B::NAME, opts.mode.as_str(), key).acquired(outcome, started.elapsed());
        taken
    }

    async fn inspect(&self, key: &str) -> Result<KeyStatus> {
        key::validate(key, self.backend.capabilities().max_key_len)?;
        self.backend.check_key(key)?;
        self.backend.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let caps = self.backend.capabilities();
        if prefix.len() > caps.max_key_len || prefix.contains('\0') {
            return Err(LockError::invalid_key(
                prefix,
                "a prefix is at most a key's length and holds no NUL byte",
            ));
        }
        if !caps.inspect.list {
            return Err(LockError::Unsupported {
                backend: B::NAME,
                what: "listing held keys",
            });
        }
        self.backend.list(prefix).await
    }

    async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<Lease> {
        self.take_within(key, opts, None).await
    }

    async fn campaign(&self, key: &str, value: &str, opts: &LockOptions) -> Result<Lease> {
        self.take_within(key, opts, Some(value)).await
    }

    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        self.check_election_key(key)?;
        self.backend.leader(key).await
    }

    async fn leader_changes(&self, key: &str) -> Result<Option<BoxStream<'static, Result<()>>>> {
        self.check_election_key(key)?;
        self.backend.leader_changes(key).await
    }
}

impl<B: Backend> LockClient<B> {
    /// Acquire (or campaign for) `key` within `opts.wait`.
    async fn take_within(
        &self,
        key: &str,
        opts: &LockOptions,
        value: Option<&str>,
    ) -> Result<Lease> {
        let started = Instant::now();
        let deadline = Deadline::after(opts.wait);
        let taken = self.take(key, opts, deadline, value).await;
        let outcome = match &taken {
            Ok(Some(_)) => "acquired",
            Ok(None) => "timeout",
            Err(_) => "error",
        };
        Labels::new(B::NAME, primitive(opts, value), key).acquired(outcome, started.elapsed());
        match taken? {
            Some(lease) => Ok(lease),
            None => Err(LockError::Timeout {
                backend: B::NAME,
                key: key.to_owned(),
                waited: started.elapsed(),
            }),
        }
    }
}

#[cfg(test)]
#[path = "client_tests.rs"]
mod tests;
