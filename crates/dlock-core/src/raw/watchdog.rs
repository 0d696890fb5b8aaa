//! The renewal loop: one task per lease, started at a fifth of its ttl (see
//! [`pending`](super::pending)), or with the lease for an owner's hold and a loss signal
//! that must be listened to from the grant on.
//!
//! It renews every `ttl / 3` (less a random twelfth of the ttl at most, drawn anew each
//! time, rounded down to a grid that leases renewing together share), measuring from when
//! each renewal was *sent*, so it knows the latest instant the server may still consider the lease alive.
//! When renewals keep failing it fires the lost signal a safety margin before that instant,
//! so the holder hears of the loss before another client can take the key. Release aborts
//! this task and takes the handle before the release request goes out.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use rand::Rng;
use tokio::time::Instant;

use crate::Deadline;
use crate::lease::LeaseState;
use crate::{ErrorKind, LostReason};

/// How long before the server-side expiry the lost signal fires: covers clock-rate drift
/// between client and server (1 %, as Redlock) and a late timer wake-up.
pub(crate) fn safety_margin(ttl: Duration) -> Duration {
    ttl / 10 + Duration::from_millis(2)
}

pub(crate) async fn run(
    state: Arc<LeaseState>,
    auto_renew: bool,
    backend_lost: Option<BoxFuture<'static, LostReason>>,
) {
    let mut backend_lost = backend_lost.unwrap_or_else(|| std::future::pending().boxed());
    let mut timing = state.timing.subscribe();
    // Drawn again after each renewal, so leases taken in one burst drift apart instead of
    // renewing in step forever; fixed in between, so re-planning after a wake-up does not
    // move the renewal.
    let mut jitter = draw_jitter();
    let mut last_error: Option<String> = None;
    let mut retry_at: Option<Instant> = None;
    let lose = |state: &LeaseState, last_error: &mut Option<String>| {
        state.lose(match last_error.take() {
            Some(e) => LostReason::Unreachable(e),
            None => LostReason::Expired,
        })
    };
    loop {
        let now_timing = *timing.borrow_and_update();
        let fire_at = state.fire_at(now_timing, last_error.is_some());
        let renew_at = auto_renew.then(|| {
            retry_at.unwrap_or_else(|| {
                on_grid(
                    next_renewal(now_timing.valid_until, now_timing.ttl, jitter),
                    now_timing.ttl,
                )
            })
        });
        let wake = match (fire_at, renew_at) {
            (Some(f), Some(r)) => Some(f.min(r)),
            (f, r) => f.or(r),
        };
        tokio::select! {
            reason = &mut backend_lost => {
                state.lose(reason);
                return;
            }
            changed = timing.changed() => {
                if changed.is_err() {
                    return;
                }
                continue; // a manual extend moved the deadline: plan again
            }
            _ = until(wake).reached() => {}
        }
        let now = Instant::now();
        if fire_at.is_some_and(|f| now >= f) {
            lose(&state, &mut last_error);
            return;
        }
        if renew_at.is_none_or(|r| now < r) {
            continue;
        }
        // Waiting for the handle (a manual extend may hold it) must not hold back the lost
        // signal.
        let mut slot = tokio::select! {
            slot = state.held.lock() => slot,
            reason = &mut backend_lost => {
                state.lose(reason);
                return;
            }
            _ = timing.changed() => continue,
            _ = until(fire_at).reached() => {
                lose(&state, &mut last_error);
                return;
            }
        };
        let Some(held) = slot.as_mut() else { return };
        // Read under the lock: a manual extend may have changed the ttl.
        let ttl = state.timing().ttl;
        // A renewal stuck on a dead connection must not hold back the backend's own loss
        // signal (a session-based lease has no budget to bound the renewal).
        let outcome = tokio::select! {
            reason = &mut backend_lost => {
                drop(slot);
                state.lose(reason);
                return;
            }
            outcome = state.extend_held(held, ttl) => outcome,
        };
        drop(slot);
        match outcome {
            Ok(()) => {
                last_error = None;
                retry_at = None;
                jitter = draw_jitter();
            }
            Err(e) if e.kind() == ErrorKind::NotHeld => return, // extend_held marked it lost
            Err(e) => {
                tracing::warn!(backend = state.backend, key = %state.key, error = %e, "renewal failed; retrying");
                last_error = Some(e.to_string());
                retry_at = Some(Instant::now() + retry_interval(ttl));
            }
        }
    }
}

/// Up to a twelfth of the ttl: renewals land between a quarter and a third of the ttl after
/// the last one, spread over that window.
fn draw_jitter() -> f64 {
    rand::rng().random_range(0.0..1.0 / 12.0)
}

/// A third of the ttl after the last renewal was sent, less the jitter (`jitter` is a
/// fraction of the ttl) so that many leases taken together do not renew together.
fn next_renewal(valid_until: Instant, ttl: Duration, jitter: f64) -> Instant {
    valid_until - ttl + ttl / 3 - ttl.mul_f64(jitter)
}

/// `at` rounded down to a grid of a hundredth of the ttl (1 ms to 1 s), shared by every
/// lease of the process: renewals that fall due close together wake together, in one timer
/// tick, and a backend that batches (Redis) sends them as one request, so holding thousands
/// of leases costs a few wake-ups per grid step instead of one per lease. Rounding down only
/// ever renews a little early.
fn on_grid(at: Instant, ttl: Duration) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let step = (ttl / 100).clamp(Duration::from_millis(1), Duration::from_secs(1));
    let Some(since) = at.checked_duration_since(epoch) else {
        return at;
    };
    let steps = since.as_nanos() / step.as_nanos();
    let offset = u64::try_from(steps * step.as_nanos()).unwrap_or(u64::MAX);
    epoch + Duration::from_nanos(offset)
}

fn retry_interval(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(20))
}

/// When the watchdog would next renew a lease of `ttl` whose last renewal that succeeded
/// was sent at `sent`: a third of the ttl later (without the watchdog's jitter).
///
/// For a backend that keeps a lease alive itself before [`LockClient`](super::LockClient)
/// has it, e.g. while it waits for its turn.
pub fn renewal_due(sent: Instant, ttl: Duration) -> Instant {
    next_renewal(sent + ttl, ttl, 0.0)
}

/// After a renewal of a lease of `ttl` failed at `now` (the last one that succeeded was
/// sent at `sent`): when the watchdog would try again, or `None` when that is no earlier
/// than the instant it would fire the lost signal (a tenth of the ttl and 2 ms before the
/// lease may expire), so the lease must be given up as lost. See [`renewal_due`].
pub fn renewal_retry(sent: Instant, ttl: Duration, now: Instant) -> Option<Instant> {
    let retry = now + retry_interval(ttl);
    (retry < sent + ttl.saturating_sub(safety_margin(ttl))).then_some(retry)
}

/// A deadline at `at`, or none.
fn until(at: Option<Instant>) -> Deadline {
    at.map_or(Deadline::Never, Deadline::At)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::{Grant, Held};
    use crate::{LockOptions, Result};

    /// A handle whose renewals never answer (a dead connection without a timeout).
    #[derive(Debug)]
    struct Stuck;

    #[async_trait::async_trait]
    impl Held for Stuck {
        async fn extend(&mut self, _ttl: Duration) -> Result<()> {
            std::future::pending().await
        }
        async fn release(&mut self) -> Result<()> {
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn backend_loss_is_heard_while_a_renewal_hangs() {
        let lost = async {
            // After the first renewal (at ttl / 3) went out and hung.
            tokio::time::sleep(Duration::from_millis(200)).await;
            LostReason::SessionEnded("expired".into())
        };
        let grant = Grant::new(1, Box::new(Stuck), Instant::now()).with_lost(Box::pin(lost));
        let opts = LockOptions::new().ttl(Duration::from_millis(300));
        let expiry = crate::Expiry::Session {
            timeout: Duration::from_secs(1),
        };
        let lease = crate::Lease::for_test(grant, &opts, expiry, None).await;
        let reason = tokio::time::timeout(Duration::from_secs(1), lease.lost())
            .await
            .expect("the backend's loss signal is heard during a hung renewal");
        assert_eq!(reason, LostReason::SessionEnded("expired".into()));
    }

    #[test]
    fn renewals_land_on_a_shared_grid_never_later_than_due() {
        let ttl = Duration::from_secs(6);
        let step = ttl / 100;
        let base = on_grid(Instant::now() + ttl, ttl);
        for offset_ms in [0, 1, 7, 59] {
            let due = base + Duration::from_millis(offset_ms);
            let at = on_grid(due, ttl);
            assert!(
                at <= due && due - at < step,
                "{offset_ms} ms: {:?} early",
                due - at
            );
            assert_eq!(at, base, "due within one step, woken together");
        }
        assert_eq!(on_grid(base + step, ttl), base + step);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_alive_hold_is_not_renewed_and_outlives_its_ttl_until_the_backend_says() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let lost = async move {
            let _ = rx.await;
            LostReason::SessionEnded("gone".into())
        };
        let held = Scripted::new(Some(Duration::ZERO));
        let extends = held.extends.clone();
        let grant = Grant::new(1, Box::new(held), Instant::now())
            .with_lost(Box::pin(lost))
            .kept_alive();
        let opts = LockOptions::new().ttl(Duration::from_millis(300));
        let lease = crate::Lease::for_test(grant, &opts, crate::Expiry::Ttl, None).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            !lease.is_lost(),
            "ten ttls later the backend still keeps it"
        );
        assert!(extends.lock().unwrap().is_empty(), "no renewal was sent");
        tx.send(()).unwrap();
        let reason = tokio::time::timeout(Duration::from_secs(1), lease.lost())
            .await
            .expect("the backend's loss signal is heard");
        assert_eq!(reason, LostReason::SessionEnded("gone".into()));
    }

    /// A handle that records every extend's ttl and counts releases; each extend takes
    /// `delay` (forever when `None`).
    #[derive(Debug, Clone)]
    struct Scripted {
        delay: Option<Duration>,
        extends: Arc<std::sync::Mutex<Vec<Duration>>>,
        releases: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Scripted {
        fn new(delay: Option<Duration>) -> Self {
            Self {
                delay,
                extends: Arc::default(),
                releases: Arc::default(),
            }
        }
    }

    #[async_trait::async_trait]
    impl Held for Scripted {
        async fn extend(&mut self, ttl: Duration) -> Result<()> {
            self.extends.lock().unwrap().push(ttl);
            match self.delay {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
            Ok(())
        }
        async fn release(&mut self) -> Result<()> {
            self.releases
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        }
    }

    async fn lease_with(held: Scripted, ttl: Duration, auto_renew: bool) -> crate::Lease {
        let grant = Grant::new(1, Box::new(held), Instant::now());
        let opts = LockOptions::new().ttl(ttl).auto_renew(auto_renew);
        crate::Lease::for_test(grant, &opts, crate::Expiry::Ttl, None).await
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_manual_extend_moves_the_lost_deadline() {
        let lease = lease_with(
            Scripted::new(Some(Duration::ZERO)),
            Duration::from_secs(3),
            false,
        )
        .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        lease.extend(Duration::from_millis(300)).await.unwrap();
        let fired = tokio::time::timeout(Duration::from_millis(300), lease.lost()).await;
        assert_eq!(
            fired.ok(),
            Some(LostReason::Expired),
            "lost() must fire by the new, shorter deadline"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_manual_extend_does_not_hold_back_lost() {
        let lease =
            Arc::new(lease_with(Scripted::new(None), Duration::from_millis(600), true).await);
        let extending = {
            let lease = lease.clone();
            tokio::spawn(async move { lease.extend(Duration::from_millis(600)).await })
        };
        let fired = tokio::time::timeout(Duration::from_millis(600), lease.lost()).await;
        assert!(
            fired.is_ok(),
            "lost() must fire before the server-side expiry"
        );
        assert!(
            extending.await.unwrap().is_err(),
            "the hung extend gives up in time"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_a_lease_during_a_renewal_still_releases() {
        let held = Scripted::new(Some(Duration::from_millis(200)));
        let releases = held.releases.clone();
        let lease = lease_with(held, Duration::from_millis(300), true).await;
        tokio::time::sleep(Duration::from_millis(150)).await; // the renewal at ~100 ms is in flight
        drop(lease);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(releases.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_manual_extend_of_a_session_lease_is_not_cut_short() {
        let grant = Grant::new(
            1,
            Box::new(Scripted::new(Some(Duration::from_millis(500)))),
            Instant::now(),
        );
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let expiry = crate::Expiry::Session {
            timeout: Duration::from_secs(10),
        };
        let lease = crate::Lease::for_test(grant, &opts, expiry, None).await;
        lease
            .extend(Duration::from_secs(10))
            .await
            .expect("a slow but answered extend succeeds");
        assert!(!lease.is_lost());
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_use_the_ttl_of_the_last_manual_extend() {
        let held = Scripted::new(Some(Duration::ZERO));
        let extends = held.extends.clone();
        let lease = lease_with(held, Duration::from_millis(300), true).await;
        lease.extend(Duration::from_secs(3)).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
        let sent = extends.lock().unwrap().clone();
        assert!(sent.len() >= 3, "{sent:?}");
        assert!(
            sent.iter().all(|t| *t == Duration::from_secs(3)),
            "{sent:?}"
        );
        assert!(!lease.is_lost());
    }

    #[test]
    fn lost_fires_well_before_expiry_and_renewal_comes_first() {
        let ttl = Duration::from_secs(3);
        assert!(safety_margin(ttl) >= Duration::from_millis(300));
        let now = Instant::now();
        let renew = next_renewal(now + ttl, ttl, 0.049);
        assert!(renew <= now + Duration::from_secs(1));
        assert!(renew >= now + Duration::from_millis(850));
    }

    #[test]
    fn the_public_schedule_is_the_watchdogs() {
        let ttl = Duration::from_secs(3);
        let sent = Instant::now();
        assert_eq!(renewal_due(sent, ttl), sent + Duration::from_secs(1));
        let failed = sent + Duration::from_secs(1);
        assert_eq!(
            renewal_retry(sent, ttl, failed),
            Some(failed + retry_interval(ttl))
        );
        // A retry at or after the instant lost() fires comes too late.
        let fire_at = sent + ttl - safety_margin(ttl);
        assert_eq!(
            renewal_retry(sent, ttl, fire_at - retry_interval(ttl)),
            None
        );
        assert!(
            renewal_retry(
                sent,
                ttl,
                fire_at - retry_interval(ttl) - Duration::from_millis(1)
            )
            .is_some()
        );
    }
}
