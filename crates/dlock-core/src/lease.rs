//! The lease a caller holds, and the signal that says it was lost.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::raw::backend::Grant;
use crate::raw::gate::GatePermit;
use crate::raw::pending::PendingWatchdogs;
use crate::raw::watchdog;
use crate::telemetry::Labels;
use crate::{ErrorKind, Expiry, LockError, LockOptions, Mode, Result};

mod state;
use state::Watchdog;
pub(crate) use state::{LeaseState, Status, Timing};

/// Why a lease was lost.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The ttl ran out without a renewal (auto-renew off, or the lease was not extended).
    Expired,
    /// The server says the key is not ours any more: it was deleted, overwritten, or another
    /// client holds it.
    NotHeld,
    /// Renewals kept failing until the last instant the server could still consider the
    /// lease alive; carries the last error.
    Unreachable(String),
    /// The backend's session or connection that carried the lease ended (ZooKeeper session
    /// expired, MySQL connection killed, etcd lease revoked).
    SessionEnded(String),
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LostReason::Expired => f.write_str("the ttl ran out without a renewal"),
            LostReason::NotHeld => f.write_str("the key is no longer ours on the server"),
            LostReason::Unreachable(e) => {
                write!(f, "renewal failed until the lease could have expired: {e}")
            }
            LostReason::SessionEnded(e) => write!(f, "the session holding the lease ended: {e}"),
        }
    }
}

/// A key held on a lock server.
///
/// Obtained from [`DistributedLock::acquire`](crate::DistributedLock::acquire) or
/// [`try_acquire`](crate::DistributedLock::try_acquire). While it lives (and auto-renew is on)
/// a watchdog renews it every `ttl / 3`. Give it back with [`release`](Lease::release).
///
/// Dropping a lease without `release` schedules a best-effort release on the current tokio
/// runtime and never blocks; without a runtime the key is freed by the server when the ttl
/// (or session) runs out. A process about to exit waits for such releases with
/// [`settle`](crate::settle).
///
/// Protect the work done under the lock with [`lost`](Lease::lost): it resolves before
/// another client can take the key, when the lease could not be kept. For storage that can
/// check it, pass [`fencing_token`](Lease::fencing_token) along with every write.
#[must_use = "a Lease dropped at once releases the key at once: bind it (`let lease = …`) for as long as the work needs the key"]
pub struct Lease {
    pub(crate) state: Arc<LeaseState>,
    token: u64,
    mode: Mode,
    // Dropped last: local waiters go when the release is done.
    permit: Option<GatePermit>,
}

impl Lease {
    /// A lease of `grant`. Its watchdog waits in `pending` (when given) until a fifth of the
    /// ttl, unless the lease is an owner's hold or its loss signal needs a listener from
    /// the grant on; until it starts, the backend's loss signal is looked at whenever
    /// someone asks.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        backend: &'static str,
        key: &str,
        grant: Grant,
        opts: &LockOptions,
        expiry: Expiry,
        permit: GatePermit,
        primitive: &'static str,
        pending: Option<&Arc<PendingWatchdogs>>,
    ) -> Self {
        let labels = Labels::new(backend, primitive, key);
        // Granted after waiting for a holder to let go, on the server or in this client.
        if grant.waited || permit.waited {
            labels.handoff();
        }
        labels.lease_started();
        // An owner's leases of one hold in this client are lost together.
        let hold_lost = opts
            .owner
            .map(|_| (permit.hold_lost(), grant.fencing_token));
        let lost = match (&hold_lost, grant.lost) {
            (Some((hold, token)), own) => {
                let siblings = hold.wait(*token);
                Some(match own {
                    Some(own) => Box::pin(async move {
                        futures::future::select(own, siblings)
                            .await
                            .factor_first()
                            .0
                    })
                        as futures::future::BoxFuture<'static, LostReason>,
                    None => siblings,
                })
            }
            (None, own) => own,
        };
        let state = Arc::new(LeaseState {
            backend,
            key: Arc::from(key),
            expiry,
            kept_alive: grant.kept_alive,
            held: tokio::sync::Mutex::new(Some(grant.held)),
            status: watch::Sender::new(Status::Held),
            timing: watch::Sender::new(Timing {
                ttl: opts.ttl,
                valid_until: grant.sent_at + opts.ttl,
            }),
            labels,
            granted_at: Instant::now(),
            hold_lost,
            release_sent: std::sync::atomic::AtomicBool::new(false),
            watchdog: std::sync::Mutex::new(Watchdog::Stopped),
        });
        let renews = opts.auto_renew && !grant.kept_alive;
        // A hold the backend keeps alive expires by nothing of its own: its `sent_at` (e.g.
        // the shared lease's last keep-alive) may be long past, and counting from it would
        // start its watchdog, which only listens for the loss, with the grant.
        let start_at = if grant.kept_alive {
            Instant::now()
        } else {
            grant.sent_at
        } + opts.ttl / 5;
        let run = |lost| {
            Watchdog::Running(
                tokio::spawn(watchdog::run(state.clone(), renews, lost)).abort_handle(),
            )
        };
        // Held across `defer`: the starter, which may find the lease due at once, waits
        // for `Pending` to be in place before it looks. An owner's hold starts at once: its
        // loss must reach the hold's other leases here.
        let mut slot = state.watchdog();
        let queue = pending.filter(|_| {
            start_at > Instant::now() && state.hold_lost.is_none() && !grant.lost_needs_listener
        });
        *slot = match queue.and_then(|queue| Some((queue, queue.defer(&state, start_at)?))) {
            Some((queue, entry)) => Watchdog::Pending {
                renews,
                queue: queue.clone(),
                entry,
                lost,
                runtime: tokio::runtime::Handle::current(),
            },
            None => run(lost),
        };
        drop(slot);
        Self {
            state,
            token: grant.fencing_token,
            mode: opts.mode,
            permit: Some(permit),
        }
    }

    /// The key this lease holds.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// Exclusive, shared or one of N permits, as asked for in [`LockOptions::mode`].
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The fencing token of this grant. How far it can be trusted is
    /// [`Capabilities::fencing`](crate::Capabilities::fencing). An exclusive hold's token
    /// is greater than every token handed out on the key before it; a shared hold's token
    /// is greater than the token of every exclusive hold before it (shared holds that
    /// overlap may get equal or unordered tokens), so storage can refuse a reader that
    /// outlived a later writer, and a writer that lost its lease.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.state.check_loss();
        self.state.lost_reason().is_some()
    }

    /// Resolves with the reason once the lease is lost; never resolves while it is kept.
    ///
    /// It fires before the server can give the key to another client: when renewals keep
    /// failing, at the last instant the server may still consider the lease alive, less a
    /// safety margin.
    ///
    /// ```no_run
    /// # async fn demo(lease: dlock_core::Lease) -> dlock_core::Result<()> {
    /// tokio::select! {
    ///     reason = lease.lost() => eprintln!("stopped: {reason}"),
    ///     _ = do_work(lease.fencing_token()) => lease.release().await?,
    /// }
    /// # Ok(()) }
    /// # async fn do_work(_: u64) {}
    /// ```
    pub async fn lost(&self) -> LostReason {
        match self.lost_signal().lost().await {
            Some(reason) => reason,
            // Released while we wait cannot happen: release takes `self`.
            None => std::future::pending().await,
        }
    }

    /// A `'static` handle on the lost signal, for another task.
    pub fn lost_signal(&self) -> LostSignal {
        // Someone listens: a loss already signalled shows at once, a later one when it
        // happens.
        self.state.check_loss();
        self.state.start_listening();
        LostSignal {
            status: self.state.subscribe(),
        }
    }

    /// Keep the key for `ttl` from now, and use `ttl` for later renewals.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] if the lease is lost or the server says the key is not ours;
    /// [`LockError::Unavailable`] if the server could not be reached in time (the lease may
    /// still be valid; the watchdog keeps trying); [`LockError::InvalidConfig`] for a ttl out
    /// of range.
    ///
    /// # Cancel safety
    /// Dropping the future before it completes is safe: until the server answers, the lease
    /// is treated as ending at the earlier of its old deadline and `ttl` from the call.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::options::check_ttl(self.state.backend, ttl)?;
        // A loss the backend signalled already answers; and the new ttl may be shorter
        // than the one a pending watchdog's start was set for.
        self.state.check_loss();
        self.state.start_watchdog();
        let mut slot = self.state.held.lock().await;
        if let Some(reason) = self.state.lost_reason() {
            return Err(self.state.not_held(reason));
        }
        let Some(held) = slot.as_mut() else {
            return Err(self.state.not_held(LostReason::NotHeld));
        };
        self.state.extend_held(held, ttl).await
    }

    /// Publish `value` on the server as this hold's value ([`crate::Leadership::proclaim`]).
    pub(crate) async fn proclaim(&self, value: &str) -> Result<()> {
        crate::election::check_value(self.state.backend, value)?;
        self.state.check_loss();
        let mut slot = self.state.held.lock().await;
        if let Some(reason) = self.state.lost_reason() {
            return Err(self.state.not_held(reason));
        }
        let Some(held) = slot.as_mut() else {
            return Err(self.state.not_held(LostReason::NotHeld));
        };
        let proclaimed = held.proclaim(value).await;
        // The server says the hold is gone: the lease is lost, as after a failed renewal.
        if proclaimed
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::NotHeld)
        {
            self.state.lose(LostReason::NotHeld);
        }
        proclaimed
    }

    /// Give the key back.
    ///
    /// Renewal stops before the release request goes out, so a renewal can never outlive a
    /// release. The release is owner-checked on the server: it never frees a key that
    /// another client holds.
    ///
    /// # Errors
    /// [`LockError::NotHeld`] if the key was not ours any more on the server;
    /// [`LockError::LeaseLost`] if it was, but the lease had been reported lost before (the
    /// work done under it was not protected throughout); [`LockError::Unavailable`] if the
    /// server could not be reached (the key frees itself when the ttl runs out).
    ///
    /// # Cancel safety
    /// Dropping the returned future before the server answered sends the release again in
    /// the background, as dropping the lease does.
    pub async fn release(mut self) -> Result<()> {
        // A renewal in flight holds the handle: it finishes first (bounded by the lease's
        // safe instant), since cutting a request off midway can leave a backend unable to
        // trust its connection, and so unable to release.
        let mut slot = self.state.held.lock().await;
        // A loss the backend signalled before the watchdog started still makes this a
        // `LeaseLost`.
        self.state.check_loss();
        self.state.stop_watchdog();
        let Some(held) = slot.as_mut() else {
            return Err(self.state.not_held(LostReason::NotHeld));
        };
        // The handle stays in place until the server answers: if this future is dropped
        // meanwhile, Drop sends the release again (it is owner-checked, so repeating it is
        // harmless), except an owner's: a release that went through lowered its hold's
        // count, and a second one could free the key under another lease of the owner.
        // Not sent again, an entry whose release did not go through keeps the key until
        // the hold ends (its other leases, then its ttl or session).
        self.state
            .release_sent
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let result = held.release().await;
        *slot = None;
        drop(slot);
        let lost_before = self.state.lost_reason();
        self.state.mark_released();
        drop(self.permit.take());
        tracing::debug!(backend = self.state.backend, key = %self.state.key, ok = result.is_ok(), "released");
        match (result, lost_before) {
            (Ok(()), None) => Ok(()),
            (Ok(()), Some(reason)) => Err(LockError::LeaseLost {
                backend: self.state.backend,
                key: self.state.key.to_string(),
                reason,
            }),
            (Err(e), _) => Err(e),
        }
    }
}

#[cfg(test)]
impl Lease {
    /// A lease of `grant` on key `k`, as [`LockClient`](crate::raw::LockClient) makes one
    /// (through a gate of its own), for the watchdog's tests.
    pub(crate) async fn for_test(
        grant: Grant,
        opts: &LockOptions,
        expiry: Expiry,
        pending: Option<&Arc<PendingWatchdogs>>,
    ) -> Self {
        let gate = Arc::new(crate::raw::gate::Gate::default());
        let permit = gate
            .enter("k", Mode::Exclusive, crate::Deadline::TryOnce)
            .await
            .expect("a fresh gate admits");
        Self::start(
            "test",
            "k",
            grant,
            opts,
            expiry,
            permit,
            "exclusive",
            pending,
        )
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let permit = self.permit.take();
        if self.state.held.try_lock().is_ok_and(|slot| slot.is_none()) {
            self.state.stop_watchdog();
            return; // released
        }
        let state = self.state.clone();
        // Waits for a renewal in flight to finish (see `release`), then stops the watchdog,
        // instead of skipping the release; local waiters go when the release is done.
        let spawned = crate::spawn_cleanup(async move {
            let mut slot = state.held.lock().await;
            state.stop_watchdog();
            let taken = slot.take();
            drop(slot);
            let sent = state.hold_lost.is_some()
                && state.release_sent.load(std::sync::atomic::Ordering::SeqCst);
            match taken {
                Some(_) if sent => {
                    tracing::warn!(backend = state.backend, key = %state.key, "an owner's release was cut off before the server answered: not sent again (a repeat could lower the hold's count twice)");
                }
                Some(mut held) => {
                    let result = held.release().await;
                    tracing::debug!(backend = state.backend, key = %state.key, ?result, "released on drop");
                }
                None => {}
            }
            state.mark_released();
            drop(permit);
        });
        if !spawned {
            self.state.stop_watchdog();
            tracing::warn!(backend = self.state.backend, key = %self.state.key, "lease dropped outside a tokio runtime: the key frees when its ttl (or session) runs out");
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("backend", &self.state.backend)
            .field("key", &self.state.key)
            .field("fencing_token", &self.token)
            .field("mode", &self.mode)
            .field("lost", &self.state.lost_reason())
            .finish()
    }
}

/// A `'static`, cloneable view of a lease's lost signal (see [`Lease::lost_signal`]).
#[derive(Debug, Clone)]
pub struct LostSignal {
    status: watch::Receiver<Status>,
}

impl LostSignal {
    /// Resolves with the reason when the lease is lost, or `None` once it was released
    /// (or dropped) without being lost.
    pub async fn lost(&mut self) -> Option<LostReason> {
        loop {
            match &*self.status.borrow_and_update() {
                Status::Lost(reason) => return Some(reason.clone()),
                Status::Released => return None,
                Status::Held => {}
            }
            if self.status.changed().await.is_err() {
                // The lease and its watchdog are gone.
                return match &*self.status.borrow() {
                    Status::Lost(reason) => Some(reason.clone()),
                    _ => None,
                };
            }
        }
    }

    /// Whether the lease is known to be lost.
    pub fn is_lost(&self) -> bool {
        matches!(&*self.status.borrow(), Status::Lost(_))
    }
}
