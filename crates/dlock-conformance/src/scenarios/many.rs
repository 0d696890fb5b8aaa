//! Many keys held at once by one client: renewal must keep every one of them, not only the
//! first few.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use dlock_core::{DistributedLock, Expiry, Lease, LockOptions};
use futures::{FutureExt as _, StreamExt as _, stream};
use tokio::time::{Instant, sleep};

use super::{must_be_held, must_take, waiting};
use crate::Ctx;

/// How many keys the client holds, unless the backend declares a lower
/// [`max_held`](dlock_core::Capabilities::max_held).
pub const MANY_HOLDS: usize = 2_000;

/// Acquires and releases in flight at once: a bound a careful caller would keep too.
const IN_FLIGHT: usize = 64;

/// How many keys another client probes while they are held, and after they are released.
const SAMPLE: usize = 50;

/// The longest the keys are held: 4 × the ttl (or session timeout), within this.
const LONGEST_HOLD: Duration = Duration::from_secs(12);

/// The least ttl the keys are held with. The scenario is about renewing thousands of
/// leases, not about short ttls (other scenarios time those): with the harness's 2 s, a
/// loaded 2-core machine that stalls the client or a server for a second can let a lease
/// expire while every renewal is correct.
pub const LEAST_TTL: Duration = Duration::from_secs(6);

/// Every `count / SAMPLE`-th key, so the probes cover the whole range.
fn sample(count: usize) -> impl Iterator<Item = usize> {
    (0..count).step_by((count / SAMPLE).max(1))
}

/// Promise 6 (renewal) at scale: one client holding thousands of keys with auto-renew (2,000, or the backend's
/// declared `max_held`; a ttl of at least [`LEAST_TTL`]) keeps every one of them for
/// several renewal intervals: no `lost()`
/// fires, another client finds them held, every release succeeds and the keys are free
/// again afterwards.
pub async fn many_holds_at_once(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let caps = a.capabilities();
    let backend = cx.harness().name();
    let count = caps.max_held.map_or(MANY_HOLDS, |max| max.min(MANY_HOLDS));
    let ttl = cx.harness().ttl().max(LEAST_TTL);
    // On session backends the session timeout is what renewals (heartbeats) must beat.
    let period = match caps.expiry {
        Expiry::Ttl => ttl,
        Expiry::Session { timeout } => timeout.max(ttl),
    };
    let hold_for = (period * 4).min(LONGEST_HOLD);
    let opts = waiting(&cx, Duration::from_secs(10))
        .ttl(ttl)
        .auto_renew(true);
    let keys: Vec<String> = (0..count).map(|i| cx.key(&format!("many/{i}"))).collect();

    let started = Instant::now();
    let (leases, failed) = acquire_all(&a, &keys, &opts).await;
    if let Some((failures, first)) = failed {
        let taken = leases.len();
        drop(leases);
        panic!(
            "{backend}: {failures} acquires failed while one client took {count} distinct keys \
             ({IN_FLIGHT} in flight, ttl {ttl:?}; {taken} taken, the rest not tried after the \
             first failure); first: {first}"
        );
    }
    let acquired_in = started.elapsed();

    sleep(hold_for).await;
    let lost: Vec<&Lease> = leases.iter().filter(|l| l.is_lost()).collect();
    if let Some(first) = lost.first() {
        let reason = first
            .lost()
            .now_or_never()
            .map_or_else(|| "unknown".to_owned(), |r| r.to_string());
        panic!(
            "{backend}: {} of {count} leases held by one client with auto-renew at ttl {ttl:?} \
             fired lost() within {hold_for:?} (acquired in {acquired_in:?}); first: {}: {reason}",
            lost.len(),
            first.key()
        );
    }
    let held = LockOptions::new().ttl(ttl);
    for i in sample(count) {
        let why = format!("one of {count} keys one {backend} client renews at ttl {ttl:?}");
        must_be_held(&*b, &keys[i], &held, &why).await;
    }

    let failures = release_all(leases).await;
    if let Some((n, first)) = failures {
        panic!(
            "{backend}: {n} of {count} releases failed after one client held {count} keys \
             for {hold_for:?} at ttl {ttl:?}; first: {first}"
        );
    }
    for i in sample(count) {
        let lease = must_take(&*b, &keys[i], &held).await;
        lease.release().await.expect("release a probed key");
    }
    cx.finish().await;
}

/// Take every key with at most [`IN_FLIGHT`] acquires at once: the leases, and the number
/// of failures with the first error. After a failure no new acquire starts, so a backend
/// at its limit fails in one round of timeouts, not one per key.
async fn acquire_all(
    client: &Arc<dyn DistributedLock>,
    keys: &[String],
    opts: &LockOptions,
) -> (Vec<Lease>, Option<(usize, String)>) {
    // Owned keys and clients: a stream of futures borrowing them is not `Send` for every
    // lifetime, which a spawned scenario needs.
    let opts = *opts;
    let failed = Arc::new(AtomicBool::new(false));
    let results: Vec<_> = stream::iter(keys.to_vec())
        .map(|key| {
            let (client, failed) = (client.clone(), failed.clone());
            async move {
                if failed.load(Ordering::SeqCst) {
                    return None;
                }
                let result = client.acquire(&key, &opts).await;
                if result.is_err() {
                    failed.store(true, Ordering::SeqCst);
                }
                Some((key, result))
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let mut leases = Vec::with_capacity(keys.len());
    let mut failures = 0;
    let mut first = None;
    for (key, result) in results.into_iter().flatten() {
        match result {
            Ok(lease) => leases.push(lease),
            Err(e) => {
                failures += 1;
                first.get_or_insert_with(|| format!("{key}: {e}"));
            }
        }
    }
    (leases, first.map(|first| (failures, first)))
}

/// Release every lease with at most [`IN_FLIGHT`] releases at once: the number of failures
/// with the first error, if any failed.
async fn release_all(leases: Vec<Lease>) -> Option<(usize, String)> {
    let results: Vec<_> = stream::iter(leases)
        .map(|lease| async move {
            let key = lease.key().to_owned();
            lease.release().await.map_err(|e| format!("{key}: {e}"))
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    let errors: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    errors.first().cloned().map(|first| (errors.len(), first))
}
