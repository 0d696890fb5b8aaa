//! The lease a caller holds, and the signal that says it was lost.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::raw::backend::{Grant, Held};
use crate::raw::gate::{GatePermit, HoldLost};
use crate::raw::pending::{Entry, PendingWatchdogs};
use crate::raw::watchdog;
use crate::telemetry::Labels;
use crate::{ErrorKind, Expiry, LockError, LockOptions, Mode, Result};

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

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Status {
    Held,
    Lost(LostReason),
    Released,
}

/// State shared by a [`Lease`], its watchdog and its [`LostSignal`]s.
pub(crate) struct LeaseState {
    pub(crate) backend: &'static str,
    pub(crate) key: Arc<str>,
    pub(crate) expiry: Expiry,
    /// The backend keeps the hold alive and signals its loss (see `Grant::kept_alive`):
    /// no renewals, no expiry timer.
    kept_alive: bool,
    /// `None` once released. Locked for each server call, so calls never overlap.
    pub(crate) held: tokio::sync::Mutex<Option<Box<dyn Held>>>,
    status: watch::Sender<Status>,
    /// Changes wake the watchdog, so a manual extend re-plans renewal and expiry at once.
    pub(crate) timing: watch::Sender<Timing>,
    /// What the lease's figures are labelled with, and when it was granted.
    labels: Labels,
    granted_at: Instant,
    /// A reentrant hold's leases in this client, told when this one is lost, and the
    /// hold's token.
    hold_lost: Option<(HoldLost, u64)>,
    /// A release was sent for this lease (an owner's, whose release is not repeated).
    release_sent: std::sync::atomic::AtomicBool,
    watchdog: std::sync::Mutex<Watchdog>,
}

/// A lease's watchdog task: waiting to start (see [`PendingWatchdogs`]), running, or
/// stopped for good (released, or never to run).
enum Watchdog {
    Pending {
        renews: bool,
        queue: Arc<PendingWatchdogs>,
        entry: Entry,
    },
    Running(AbortHandle),
    Stopped,
}

/// The current ttl and the last instant the server may still consider the lease alive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) ttl: Duration,
    pub(crate) valid_until: Instant,
}

impl LeaseState {
    fn watchdog(&self) -> std::sync::MutexGuard<'_, Watchdog> {
        // Nothing panics while holding it; a poisoned lock still holds a valid state.
        self.watchdog.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start the watchdog now if it waits to start.
    pub(crate) fn start_watchdog(self: &Arc<Self>) {
        let mut slot = self.watchdog();
        if let Watchdog::Pending {
            renews,
            queue,
            entry,
        } = &*slot
        {
            queue.cancel(*entry);
            let task = tokio::spawn(watchdog::run(self.clone(), *renews, None));
            *slot = Watchdog::Running(task.abort_handle());
        }
    }

    /// Stop the watchdog for good, or keep it from starting.
    fn stop_watchdog(&self) {
        match std::mem::replace(&mut *self.watchdog(), Watchdog::Stopped) {
            Watchdog::Pending { queue, entry, .. } => queue.cancel(entry),
            Watchdog::Running(task) => task.abort(),
            Watchdog::Stopped => {}
        }
    }

    pub(crate) fn timing(&self) -> Timing {
        *self.timing.borrow()
    }

    /// The server answered an extend sent at `sent_at`: the lease runs `ttl` from then.
    pub(crate) fn renewed(&self, ttl: Duration, sent_at: Instant) {
        self.timing.send_replace(Timing {
            ttl,
            valid_until: sent_at + ttl,
        });
    }

    /// An extend to `ttl` goes out at `sent_at`. Until the server answers, the lease may end
    /// at the earlier of the old deadline and the new one (a shorter ttl may already apply).
    /// A session lease has no server-side ttl to shorten, so only ttl leases adjust.
    fn extending(&self, ttl: Duration, sent_at: Instant) {
        if self.expiry == Expiry::Ttl {
            self.timing
                .send_modify(|t| t.valid_until = t.valid_until.min(sent_at + ttl));
        }
    }

    /// When the lost signal must fire at the latest if nothing is heard from the server:
    /// a safety margin before the server may let the lease go. `None` when only the
    /// backend's own signal can tell (a session that is not failing, or a hold the backend keeps alive).
    pub(crate) fn fire_at(&self, timing: Timing, failing: bool) -> Option<Instant> {
        if self.kept_alive {
            return None;
        }
        match self.expiry {
            Expiry::Ttl => Some(timing.valid_until - watchdog::safety_margin(timing.ttl)),
            // The last successful renewal proves the session was alive when it was sent.
            Expiry::Session { timeout } => failing.then(|| {
                timing.valid_until - timing.ttl + timeout - watchdog::safety_margin(timeout)
            }),
        }
    }

    /// Send one extend on `held` (whose lock the caller holds), bounded by the lease's last
    /// safe instant, keeping the timing pessimistic until the server answers.
    pub(crate) async fn extend_held(&self, held: &mut Box<dyn Held>, ttl: Duration) -> Result<()> {
        let sent_at = Instant::now();
        self.extending(ttl, sent_at);
        let budget = self
            .fire_at(self.timing(), true)
            .map(|f| f.saturating_duration_since(sent_at));
        let outcome = match budget {
            Some(budget) => tokio::time::timeout(budget, held.extend(ttl))
                .await
                .unwrap_or_else(|_| {
                    Err(LockError::unavailable(
                        self.backend,
                        "extend",
                        "the extend was not answered in time",
                    ))
                }),
            None => held.extend(ttl).await,
        };
        match &outcome {
            Ok(()) => {
                self.labels.renewal("ok");
                self.renewed(ttl, sent_at);
            }
            Err(e) if e.kind() == ErrorKind::NotHeld => {
                self.labels.renewal("not_held");
                self.lose(LostReason::NotHeld);
            }
            Err(_) => self.labels.renewal("failed"),
        }
        outcome
    }

    fn mark_released(&self) {
        self.status.send_if_modified(|s| {
            let was_held = *s == Status::Held;
            if was_held {
                // The figure first, as for a loss.
                self.labels.lease_ended(self.granted_at.elapsed());
                *s = Status::Released;
            }
            was_held
        });
    }

    /// Mark the lease lost (once; later reasons are ignored).
    pub(crate) fn lose(&self, reason: LostReason) {
        let changed = self.status.send_if_modified(|s| {
            if *s == Status::Held {
                // The figures first: whoever sees the lease lost sees them recorded.
                self.labels.lost(&reason);
                self.labels.lease_ended(self.granted_at.elapsed());
                *s = Status::Lost(reason.clone());
                true
            } else {
                false
            }
        });
        if changed {
            // The server said the hold is gone, or it could not be kept: the hold's other
            // leases here are lost with it. A lease whose own ttl ran out (taken without
            // auto-renew) says nothing about the hold its siblings keep renewing.
            if let Some((hold, token)) = &self.hold_lost
                && reason != LostReason::Expired
            {
                hold.announce(*token, &reason);
            }
            tracing::warn!(backend = self.backend, key = %self.key, %reason, "lease lost");
        }
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        match &*self.status.borrow() {
            Status::Lost(r) => Some(r.clone()),
            _ => None,
        }
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<Status> {
        self.status.subscribe()
    }

    fn not_held(&self, reason: LostReason) -> LockError {
        LockError::not_held(self.backend, &self.key, reason)
    }
}

impl Drop for LeaseState {
    /// A lease whose state goes while still held (dropped outside a runtime, its release
    /// left to the server's ttl) ends here for the figures.
    fn drop(&mut self) {
        if *self.status.borrow() == Status::Held {
            self.labels.lease_ended(self.granted_at.elapsed());
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
    /// ttl if it has no loss signal to listen to; otherwise it starts now.
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
        let start_at = grant.sent_at + opts.ttl / 5;
        let run = |lost| {
            Watchdog::Running(
                tokio::spawn(watchdog::run(state.clone(), renews, lost)).abort_handle(),
            )
        };
        // Held across `defer`: the starter, which may find the lease due at once, waits
        // for `Pending` to be in place before it looks.
        let mut slot = state.watchdog();
        *slot = match (pending, lost) {
            (Some(queue), None) if start_at > Instant::now() => {
                match queue.defer(&state, start_at) {
                    Some(entry) => Watchdog::Pending {
                        renews,
                        queue: queue.clone(),
                        entry,
                    },
                    None => run(None),
                }
            }
            (_, lost) => run(lost),
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
        // The new ttl may be shorter than the one a pending watchdog's start was set for.
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
