//! The lease a caller holds, and the signal that says it was lost.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::backend::{Grant, Held};
use crate::gate::GatePermit;
use crate::{ErrorKind, Expiry, LockError, LockOptions, Result, watchdog};

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
    /// `None` once released. Locked for each server call, so calls never overlap.
    pub(crate) held: tokio::sync::Mutex<Option<Box<dyn Held>>>,
    status: watch::Sender<Status>,
    timing: Mutex<Timing>,
}

/// The current ttl and the last instant the server may still consider the lease alive.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) ttl: Duration,
    pub(crate) valid_until: Instant,
}

impl LeaseState {
    pub(crate) fn timing(&self) -> Timing {
        *self.timing.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn renewed(&self, ttl: Duration, sent_at: Instant) {
        *self.timing.lock().unwrap_or_else(|e| e.into_inner()) = Timing {
            ttl,
            valid_until: sent_at + ttl,
        };
    }

    /// Mark the lease lost (once; later reasons are ignored).
    pub(crate) fn lose(&self, reason: LostReason) {
        let changed = self.status.send_if_modified(|s| {
            if *s == Status::Held {
                *s = Status::Lost(reason.clone());
                true
            } else {
                false
            }
        });
        if changed {
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
        LockError::NotHeld {
            backend: self.backend,
            key: self.key.to_string(),
            reason,
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
/// (or session) runs out.
///
/// Protect the work done under the lock with [`lost`](Lease::lost): it resolves before
/// another client can take the key, when the lease could not be kept. For storage that can
/// check it, pass [`fencing_token`](Lease::fencing_token) along with every write.
pub struct Lease {
    state: Arc<LeaseState>,
    token: u64,
    watchdog: AbortHandle,
    // Dropped last: local waiters go when the release is done.
    permit: Option<GatePermit>,
}

impl Lease {
    pub(crate) fn start(
        backend: &'static str,
        key: &str,
        grant: Grant,
        opts: &LockOptions,
        expiry: Expiry,
        permit: GatePermit,
    ) -> Self {
        let state = Arc::new(LeaseState {
            backend,
            key: Arc::from(key),
            expiry,
            held: tokio::sync::Mutex::new(Some(grant.held)),
            status: watch::Sender::new(Status::Held),
            timing: Mutex::new(Timing {
                ttl: opts.ttl,
                valid_until: grant.sent_at + opts.ttl,
            }),
        });
        let watchdog = tokio::spawn(watchdog::run(state.clone(), opts.auto_renew, grant.lost));
        Self {
            state,
            token: grant.fencing_token,
            watchdog: watchdog.abort_handle(),
            permit: Some(permit),
        }
    }

    /// The key this lease holds.
    pub fn key(&self) -> &str {
        &self.state.key
    }

    /// The fencing token of this grant. How far it can be trusted is
    /// [`Capabilities::fencing`](crate::Capabilities::fencing).
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
    /// [`LockError::Unavailable`] if the server could not be reached (the lease may still
    /// be valid; the watchdog keeps trying); [`LockError::InvalidConfig`] for a ttl out of
    /// range.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        crate::options::check_ttl(self.state.backend, ttl)?;
        let mut held = self.state.held.lock().await;
        if let Some(reason) = self.state.lost_reason() {
            return Err(self.state.not_held(reason));
        }
        let held = held
            .as_mut()
            .expect("a lease that is not released has its handle");
        let sent_at = Instant::now();
        match held.extend(ttl).await {
            Ok(()) => {
                self.state.renewed(ttl, sent_at);
                Ok(())
            }
            Err(e) if e.kind() == ErrorKind::NotHeld => {
                self.state.lose(LostReason::NotHeld);
                Err(e)
            }
            Err(e) => Err(e),
        }
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
    /// Dropping the returned future before it completes leaves the key to expire with its
    /// ttl (or session).
    pub async fn release(mut self) -> Result<()> {
        self.watchdog.abort();
        let held = self.state.held.lock().await.take();
        let Some(mut held) = held else {
            return Err(self.state.not_held(LostReason::NotHeld));
        };
        let result = held.release().await;
        let lost_before = self.state.lost_reason();
        self.state.status.send_if_modified(|s| {
            let was_held = *s == Status::Held;
            if was_held {
                *s = Status::Released;
            }
            was_held
        });
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
        self.watchdog.abort();
        let Ok(mut slot) = self.state.held.try_lock() else {
            // A release or extend is in flight; it owns the handle.
            return;
        };
        let Some(mut held) = slot.take() else { return };
        drop(slot);
        let permit = self.permit.take();
        let state = self.state.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let result = held.release().await;
                    tracing::debug!(backend = state.backend, key = %state.key, ?result, "released on drop");
                    drop(permit);
                });
            }
            Err(_) => {
                tracing::warn!(backend = state.backend, key = %state.key, "lease dropped outside a tokio runtime: the key frees when its ttl runs out");
            }
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("backend", &self.state.backend)
            .field("key", &self.state.key)
            .field("fencing_token", &self.token)
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
