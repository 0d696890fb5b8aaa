//! What a [`Lease`](super::Lease), its watchdog and its lost signals share: the status,
//! the timing the watchdog plans from, and the watchdog task itself.

use std::sync::Arc;
use std::time::Duration;

use std::task::{Context, Poll};

use futures::future::BoxFuture;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::LostReason;
use crate::raw::backend::Held;
use crate::raw::gate::HoldLost;
use crate::raw::pending::{Entry, PendingWatchdogs};
use crate::raw::watchdog;
use crate::telemetry::Labels;
use crate::{ErrorKind, Expiry, LockError, Result};

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
    pub(super) kept_alive: bool,
    /// `None` once released. Locked for each server call, so calls never overlap.
    pub(crate) held: tokio::sync::Mutex<Option<Box<dyn Held>>>,
    pub(super) status: watch::Sender<Status>,
    /// Changes wake the watchdog, so a manual extend re-plans renewal and expiry at once.
    pub(crate) timing: watch::Sender<Timing>,
    /// What the lease's figures are labelled with, and when it was granted.
    pub(super) labels: Labels,
    pub(super) granted_at: Instant,
    /// A reentrant hold's leases in this client, told when this one is lost, and the
    /// hold's token.
    pub(super) hold_lost: Option<(HoldLost, u64)>,
    /// A release was sent for this lease (an owner's, whose release is not repeated).
    pub(super) release_sent: std::sync::atomic::AtomicBool,
    pub(super) watchdog: std::sync::Mutex<Watchdog>,
}

/// A lease's watchdog task: waiting to start (see [`PendingWatchdogs`]), running, or
/// stopped for good (released, or never to run).
pub(super) enum Watchdog {
    Pending {
        renews: bool,
        queue: Arc<PendingWatchdogs>,
        entry: Entry,
        /// The backend's loss signal, polled by [`LeaseState::check_loss`] until the
        /// watchdog starts and listens to it.
        lost: Option<BoxFuture<'static, LostReason>>,
        /// The runtime the lease was taken on: the watchdog runs there, and the loss
        /// signal is polled within it (it may use its timers), whoever asks.
        runtime: Handle,
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
    pub(super) fn watchdog(&self) -> std::sync::MutexGuard<'_, Watchdog> {
        // Nothing panics while holding it; a poisoned lock still holds a valid state.
        self.watchdog.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Start the watchdog now if it waits to start.
    pub(crate) fn start_watchdog(self: &Arc<Self>) {
        let mut slot = self.watchdog();
        if !matches!(*slot, Watchdog::Pending { .. }) {
            return; // running, or stopped for good: left as it is
        }
        if let Watchdog::Pending {
            renews,
            queue,
            entry,
            lost,
            runtime,
        } = std::mem::replace(&mut *slot, Watchdog::Stopped)
        {
            queue.cancel(entry);
            let task = runtime.spawn(watchdog::run(self.clone(), renews, lost));
            *slot = Watchdog::Running(task.abort_handle());
        }
    }

    /// Someone listens for the loss: start the watchdog now if it waits to start and has
    /// the backend's loss signal to listen to. (Without one, nothing but the watchdog's
    /// own timing can end the lease, and that is planned from its start anyway.)
    pub(crate) fn start_listening(self: &Arc<Self>) {
        let has_signal = matches!(&*self.watchdog(), Watchdog::Pending { lost: Some(_), .. });
        if has_signal {
            self.start_watchdog();
        }
    }

    /// While the watchdog waits to start, look once at the backend's loss signal it will
    /// listen to, so that `is_lost` is current without a task per lease (polled within the
    /// lease's runtime, from any thread).
    pub(crate) fn check_loss(&self) {
        let reason = {
            let mut slot = self.watchdog();
            let Watchdog::Pending {
                lost: Some(lost),
                runtime,
                ..
            } = &mut *slot
            else {
                return;
            };
            let _entered = runtime.enter();
            let mut cx = Context::from_waker(futures::task::noop_waker_ref());
            let Poll::Ready(reason) = lost.as_mut().poll(&mut cx) else {
                return;
            };
            if let Watchdog::Pending { queue, entry, .. } =
                std::mem::replace(&mut *slot, Watchdog::Stopped)
            {
                queue.cancel(entry);
            }
            reason
        };
        self.lose(reason);
    }

    /// Stop the watchdog for good, or keep it from starting.
    pub(super) fn stop_watchdog(&self) {
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

    pub(super) fn mark_released(&self) {
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

    pub(super) fn not_held(&self, reason: LostReason) -> LockError {
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
