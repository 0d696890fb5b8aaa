//! Many keys held by one client over all the nodes: the client renews them in batches, one
//! script call per node per batch.

mod common;

use std::time::Duration;

use common::{RedlockHarness, unique_key};
use dlock_core::{DistributedLock, LockOptions, LostReason};
use dlock_redis::server::Names;
use redis::AsyncCommands;
use tokio::time::timeout;

/// A key deleted by hand on a majority of the nodes: its lease is lost (`NotHeld`) at the
/// next renewal; the leases renewed in the same batches are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_whose_key_was_deleted_on_a_majority_is_lost() {
    let harness = RedlockHarness::from_env();
    let lock = harness.lock().await;
    let run = unique_key("batch-lost");
    let ttl = Duration::from_secs(1);
    let mut leases = Vec::new();
    for i in 0..20 {
        let lease = lock
            .try_acquire(&format!("{run}/{i}"), &LockOptions::new().ttl(ttl))
            .await
            .expect("try_acquire")
            .expect("free");
        leases.push(lease);
    }
    let victim = leases.remove(7);
    let victim_key = Names::new(harness.prefix(), victim.key()).key;
    let majority = harness.config().nodes.len() / 2 + 1;
    for i in 0..majority {
        let mut admin = harness.admin(i).await.expect("admin connection");
        let _: () = admin.del(&victim_key).await.expect("DEL");
    }

    let reason = timeout(ttl * 3, victim.lost())
        .await
        .expect("lost() fires at the next renewal");
    assert_eq!(reason, LostReason::NotHeld);
    // Another two renewal intervals for the others.
    tokio::time::sleep(ttl).await;
    assert!(leases.iter().all(|l| !l.is_lost()), "a kept lease was lost");
    let victim_name = victim.key().to_owned();
    let _ = victim.release().await;
    for lease in leases {
        let key = lease.key().to_owned();
        lease.release().await.expect("release a kept lease");
        harness.forget_fence(&key).await;
    }
    harness.forget_fence(&victim_name).await;
}
