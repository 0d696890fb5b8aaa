//! One client holding thousands of keys on one session, at the tests' short session
//! timeout, through many renewals: renewing them is the session's business, so none is
//! reported lost and every release succeeds.

mod common;

use std::time::Duration;

use common::{SESSION_TIMEOUT, ZookeeperHarness};
use dlock_conformance::Harness;
use dlock_core::{DistributedLock, LockOptions};
use futures::{StreamExt, stream};
use tokio::time::sleep;

const KEYS: usize = 2_500;
/// Acquires one client has in flight at once.
const IN_FLIGHT: usize = 128;

/// Take `KEYS` keys with `ttl`, hold them for `hold`, release them; the keys lost while held
/// and the releases that failed.
async fn hold_many(lock: &dyn DistributedLock, ttl: Duration, hold: Duration) -> Vec<String> {
    let prefix = format!("many-{}", uuid::Uuid::new_v4().simple());
    let opts = LockOptions::new().ttl(ttl);
    let leases: Vec<_> = stream::iter(0..KEYS)
        .map(|i| {
            let (key, opts) = (format!("{prefix}/{i}"), &opts);
            async move {
                lock.try_acquire(&key, opts)
                    .await
                    .unwrap_or_else(|e| panic!("try_acquire {key}: {e}"))
                    .unwrap_or_else(|| panic!("{key} is fresh, so free"))
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    sleep(hold).await;
    let mut failures: Vec<String> = leases
        .iter()
        .filter(|l| l.is_lost())
        .map(|l| format!("{} reported lost while held", l.key()))
        .collect();
    let released: Vec<_> = stream::iter(leases)
        .map(|lease| async move {
            let key = lease.key().to_owned();
            lease
                .release()
                .await
                .map_err(|e| format!("{key}: release failed: {e}"))
        })
        .buffer_unordered(IN_FLIGHT)
        .collect()
        .await;
    failures.extend(released.into_iter().filter_map(Result::err));
    failures
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_held_keys_are_never_falsely_lost() {
    let harness = ZookeeperHarness::from_env();
    let lock = harness.client().await.unwrap_or_else(|e| {
        panic!(
            "cannot use the zookeeper server at {}: {e}\n  start it with: scripts/backends up zookeeper",
            harness.url()
        )
    });
    // A ttl well under the session timeout: a renewal every third of it, ten or more each.
    // Then three times the session timeout: renewals come about one session timeout
    // apart, so a renewal that had to wait for an answer would be judged late.
    for ttl in [SESSION_TIMEOUT / 2, SESSION_TIMEOUT * 3] {
        let failures = hold_many(&*lock, ttl, SESSION_TIMEOUT * 3).await;
        assert!(
            failures.is_empty(),
            "ttl {ttl:?}: {} of {KEYS} keys failed, e.g. {:?}",
            failures.len(),
            &failures[..failures.len().min(3)]
        );
    }
}
