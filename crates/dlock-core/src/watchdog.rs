//! The renewal loop: one task per lease.
//!
//! It renews every `ttl / 3` (with a little jitter), measuring from when each renewal was
//! *sent*, so it knows the latest instant the server may still consider the lease alive.
//! When renewals keep failing it fires the lost signal a safety margin before that instant,
//! so the holder hears of the loss before another client can take the key. Release aborts
//! this task and takes the handle before the release request goes out.

use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use rand::Rng;
use tokio::time::Instant;

use crate::lease::{LeaseState, Timing};
use crate::{ErrorKind, Expiry, LostReason};

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
    let mut last_error: Option<String> = None;
    let mut retry_at: Option<Instant> = None;
    loop {
        let Timing { ttl, valid_until } = state.timing();
        let fire_at = match state.expiry {
            Expiry::Ttl => Some(valid_until - safety_margin(ttl)),
            Expiry::Session { .. } => None,
        };
        let renew_at =
            auto_renew.then(|| retry_at.unwrap_or_else(|| next_renewal(valid_until, ttl)));
        let wake = match (fire_at, renew_at) {
            (Some(f), Some(r)) => Some(f.min(r)),
            (f, r) => f.or(r),
        };
        tokio::select! {
            reason = &mut backend_lost => {
                state.lose(reason);
                return;
            }
            _ = sleep_until(wake) => {}
        }
        // A manual extend may have moved the deadline while we slept.
        let Timing { ttl, valid_until } = state.timing();
        let now = Instant::now();
        let fire_at = match state.expiry {
            Expiry::Ttl => Some(valid_until - safety_margin(ttl)),
            Expiry::Session { .. } => None,
        };
        if fire_at.is_some_and(|f| now >= f) {
            state.lose(match last_error.take() {
                Some(e) => LostReason::Unreachable(e),
                None => LostReason::Expired,
            });
            return;
        }
        if !auto_renew || now < retry_at.unwrap_or_else(|| next_renewal(valid_until, ttl)) {
            continue;
        }
        let mut slot = state.held.lock().await;
        let Some(held) = slot.as_mut() else { return };
        let sent_at = Instant::now();
        let budget = fire_at.map(|f| f.saturating_duration_since(sent_at));
        let renewal = async {
            match budget {
                Some(budget) => tokio::time::timeout(budget, held.extend(ttl))
                    .await
                    .unwrap_or_else(|_| {
                        Err(crate::LockError::unavailable(
                            state.backend,
                            "extend",
                            "renewal timed out",
                        ))
                    }),
                None => held.extend(ttl).await,
            }
        };
        // A renewal stuck on a dead connection must not hold back the backend's own loss
        // signal (a session-based lease has no budget to bound the renewal).
        let outcome = tokio::select! {
            reason = &mut backend_lost => Err(reason),
            outcome = renewal => Ok(outcome),
        };
        drop(slot);
        let outcome = match outcome {
            Ok(outcome) => outcome,
            Err(reason) => {
                state.lose(reason);
                return;
            }
        };
        match outcome {
            Ok(()) => {
                state.renewed(ttl, sent_at);
                last_error = None;
                retry_at = None;
            }
            Err(e) if e.kind() == ErrorKind::NotHeld => {
                state.lose(LostReason::NotHeld);
                return;
            }
            Err(e) => {
                tracing::warn!(backend = state.backend, key = %state.key, error = %e, "renewal failed; retrying");
                last_error = Some(e.to_string());
                retry_at = Some(Instant::now() + retry_interval(ttl));
            }
        }
    }
}

/// A third of the ttl after the last renewal was sent, less up to 5 % jitter so that many
/// leases taken together do not renew together.
fn next_renewal(valid_until: Instant, ttl: Duration) -> Instant {
    let jitter = ttl.mul_f64(rand::rng().random_range(0.0..0.05));
    valid_until - ttl + ttl / 3 - jitter
}

fn retry_interval(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(20))
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Grant, Held, LockOptions, Result};

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
        let gate = Arc::new(crate::gate::Gate::default());
        let permit = gate.enter("k", crate::Deadline::TryOnce).await.unwrap();
        let lost = async {
            // After the first renewal (at ttl / 3) went out and hung.
            tokio::time::sleep(Duration::from_millis(200)).await;
            LostReason::SessionEnded("expired".into())
        };
        let grant = Grant::new(1, Box::new(Stuck), Instant::now()).with_lost(Box::pin(lost));
        let opts = LockOptions::new().ttl(Duration::from_millis(300));
        let expiry = Expiry::Session {
            timeout: Duration::from_secs(1),
        };
        let lease = crate::Lease::start("test", "k", grant, &opts, expiry, permit);
        let reason = tokio::time::timeout(Duration::from_secs(1), lease.lost())
            .await
            .expect("the backend's loss signal is heard during a hung renewal");
        assert_eq!(reason, LostReason::SessionEnded("expired".into()));
    }

    #[test]
    fn lost_fires_well_before_expiry_and_renewal_comes_first() {
        let ttl = Duration::from_secs(3);
        assert!(safety_margin(ttl) >= Duration::from_millis(300));
        let now = Instant::now();
        let renew = next_renewal(now + ttl, ttl);
        assert!(renew <= now + Duration::from_secs(1));
        assert!(renew >= now + Duration::from_millis(850));
    }
}
