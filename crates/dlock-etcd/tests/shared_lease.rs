//! Auto-renewed holds share one lease per client and ttl: many holds renew for free, and
//! losing that lease loses exactly the holds on it.

mod common;

use std::time::Duration;

use common::EtcdHarness;
use dlock_core::{DistributedLock, LockOptions};
use tokio::time::{sleep, timeout};

fn fresh_key(label: &str) -> String {
    format!("dlock-shared-{}/{label}", uuid::Uuid::new_v4().simple())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoking_the_shared_lease_loses_exactly_the_holds_on_it() {
    let harness = EtcdHarness::from_env();
    let lock = harness.lock().await;
    let renewed = LockOptions::new().ttl(Duration::from_secs(20));
    let own = renewed.auto_renew(false);
    let other_ttl = LockOptions::new().ttl(Duration::from_secs(30));
    let (k1, k2, k3, k4) = (
        fresh_key("a"),
        fresh_key("b"),
        fresh_key("c"),
        fresh_key("d"),
    );
    let mut on_shared = Vec::new();
    for key in [&k1, &k2] {
        on_shared.push(
            lock.try_acquire(key, &renewed)
                .await
                .unwrap()
                .expect("free"),
        );
    }
    let unrenewed = lock.try_acquire(&k3, &own).await.unwrap().expect("free");
    let other = lock
        .try_acquire(&k4, &other_ttl)
        .await
        .unwrap()
        .expect("free");
    let shared_lease = harness.lock_keys(&k1).await[0].lease();
    assert_eq!(
        harness.lock_keys(&k2).await[0].lease(),
        shared_lease,
        "one lease"
    );
    assert_ne!(
        harness.lock_keys(&k3).await[0].lease(),
        shared_lease,
        "its own lease"
    );
    assert_ne!(
        harness.lock_keys(&k4).await[0].lease(),
        shared_lease,
        "another ttl's"
    );

    harness
        .raw()
        .await
        .lease_revoke(shared_lease)
        .await
        .expect("revoke");
    for lease in &on_shared {
        timeout(Duration::from_secs(5), lease.lost())
            .await
            .expect("lost() fires on each hold of the revoked lease");
    }
    sleep(Duration::from_millis(500)).await;
    assert!(!unrenewed.is_lost(), "a hold on its own lease is not lost");
    assert!(
        !other.is_lost(),
        "a hold on another shared lease is not lost"
    );

    // A new acquire gets a fresh shared lease.
    let k5 = fresh_key("e");
    let again = lock
        .try_acquire(&k5, &renewed)
        .await
        .unwrap()
        .expect("free again");
    assert_ne!(harness.lock_keys(&k5).await[0].lease(), shared_lease);
    for lease in on_shared {
        assert!(
            lease.release().await.is_err(),
            "a revoked hold does not release"
        );
    }
    for lease in [again, unrenewed, other] {
        lease.release().await.expect("release");
    }
}
