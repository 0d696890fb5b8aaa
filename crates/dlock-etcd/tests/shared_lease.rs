//! Auto-renewed holds share one lease per client and ttl: many holds renew for free, and
//! losing that lease loses exactly the holds on it.

mod common;

use std::time::Duration;

use common::EtcdHarness;
use dlock_conformance::Harness;
use dlock_core::{DistributedLock, ErrorKind, LockOptions, Wait};
use tokio::time::{Instant, sleep, timeout};

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

/// The lease a client's last hold leaves lingers one ttl, holding no key, and the next
/// acquire reuses it (no grant, no revoke per cycle); then it is revoked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_shared_lease_is_reused_within_its_linger_then_revoked() {
    let harness = EtcdHarness::from_env();
    let lock = harness.lock().await;
    let opts = LockOptions::new().ttl(Duration::from_secs(2));
    let key = fresh_key("k");
    let first = lock.try_acquire(&key, &opts).await.unwrap().expect("free");
    let lease_id = harness.lock_keys(&key).await[0].lease();
    first.release().await.expect("release");
    assert_eq!(lock.backend().idle_shared_leases(), [lease_id]);

    let again = lock.try_acquire(&key, &opts).await.unwrap().expect("free");
    assert_eq!(
        harness.lock_keys(&key).await[0].lease(),
        lease_id,
        "the lingering lease is reused"
    );
    again.release().await.expect("release");

    let mut raw = harness.raw().await;
    let started = Instant::now();
    while raw.lease_time_to_live(lease_id, None).await.unwrap().ttl() != -1 {
        assert!(
            started.elapsed() < Duration::from_secs(6),
            "the idle lease outlived its 2 s linger"
        );
        sleep(Duration::from_millis(50)).await;
    }
    assert!(lock.backend().open_leases().is_empty());
}

/// Dropping the client revokes its idle shared lease at once, without waiting for the linger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_client_revokes_its_idle_shared_lease() {
    let harness = EtcdHarness::from_env();
    // Not the harness's client: the harness keeps a clone of those.
    let lock = dlock_etcd::from_url(&harness.url()).await.expect("connect");
    let opts = LockOptions::new().ttl(Duration::from_secs(60));
    let key = fresh_key("k");
    let held = lock.try_acquire(&key, &opts).await.unwrap().expect("free");
    let lease_id = harness.lock_keys(&key).await[0].lease();
    held.release().await.expect("release");
    drop(lock);

    let mut raw = harness.raw().await;
    let started = Instant::now();
    while raw.lease_time_to_live(lease_id, None).await.unwrap().ttl() != -1 {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the idle lease of a dropped client is not revoked"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

/// A key of ours that no attempt owns (an abandoned attempt's put that landed after its
/// background delete) does not fail the next acquire under that name, nor stay behind:
/// the acquire deletes it and takes the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_key_of_an_abandoned_attempt_is_replaced_by_the_next_acquire() {
    let harness = EtcdHarness::from_env();
    let lock = harness.lock().await;
    let opts = LockOptions::new().ttl(Duration::from_secs(20));
    let key = fresh_key("k");
    let first = lock.try_acquire(&key, &opts).await.unwrap().expect("free");
    let stray = harness.lock_keys(&key).await[0].clone();
    first.release().await.expect("release");
    // The late put, on the lingering shared lease, under the name the next attempt takes.
    let put = etcd_client::PutOptions::new().with_lease(stray.lease());
    harness
        .raw()
        .await
        .put(stray.key(), "", Some(put))
        .await
        .expect("put the stray key");

    let again = lock
        .try_acquire(&key, &opts)
        .await
        .expect("no protocol error")
        .expect("the stray key does not hold the lock");
    again.release().await.expect("release");
    assert!(harness.lock_keys(&key).await.is_empty(), "no key is left");
}

/// An abandoned attempt that took a suffixed name (`{lock}/{lease}-{n}`, given while the
/// plain name was still ours) can have its put land after its background delete. No later
/// attempt takes that name again, so the client itself removes the key while it lives:
/// the election is not blocked behind a candidate nobody stands for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_put_under_a_suffixed_name_does_not_block_the_election_while_its_client_lives() {
    let harness = EtcdHarness::from_env();
    let (a, b) = (harness.lock().await, harness.lock().await);
    let opts = LockOptions::new().ttl(Duration::from_secs(2));
    let key = fresh_key("k");
    // A's other work keeps its shared lease alive, as a worker's other tasks do.
    let busy_key = fresh_key("busy");
    let busy = a
        .try_acquire(&busy_key, &opts)
        .await
        .unwrap()
        .expect("free");
    let lease = harness.lock_keys(&busy_key).await[0].lease();
    let leader = b
        .campaign(&key, "b", &opts.wait(Wait::For(Duration::from_secs(5))))
        .await
        .expect("b leads");
    // A's campaign times out behind B: abandoned, its key deleted in the background...
    let timed_out = a
        .campaign(&key, "a", &opts.wait(Wait::For(Duration::from_millis(300))))
        .await
        .expect_err("b leads");
    assert_eq!(timed_out.kind(), ErrorKind::Timeout, "{timed_out}");
    dlock_core::settle(Duration::from_secs(10)).await;
    // ... and its put lands after that delete, under a suffixed name.
    let stray = format!("{}/{lease:x}-7", harness.config().lock_name(&key));
    let put = etcd_client::PutOptions::new().with_lease(lease);
    harness
        .raw()
        .await
        .put(stray.as_str(), "a", Some(put))
        .await
        .expect("the late put");
    leader.release().await.expect("resign");

    let again = b
        .campaign(&key, "b2", &opts.wait(Wait::For(Duration::from_secs(10))))
        .await
        .expect("a key no attempt of its live client stands behind does not block the election");
    again.release().await.expect("resign");
    busy.release().await.expect("release");
    harness.assert_clean(&key).await;
}

/// Settling after dropping a client waits for the revoke of its idle shared lease, so a
/// process that returns from `main` right after leaves no lease (and no key on it) behind.
#[test]
fn settle_after_dropping_a_client_waits_for_the_revoke_of_its_idle_shared_lease() {
    let harness = EtcdHarness::from_env();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let lease_id = runtime.block_on(async {
        // Not the harness's client: the harness keeps a clone of those.
        let lock = dlock_etcd::from_url(&harness.url()).await.expect("connect");
        let key = fresh_key("k");
        let opts = LockOptions::new().ttl(Duration::from_secs(60));
        let held = lock.try_acquire(&key, &opts).await.unwrap().expect("free");
        let id = harness.lock_keys(&key).await[0].lease();
        held.release().await.expect("release");
        drop(lock);
        dlock_core::settle(Duration::from_secs(10)).await;
        id
    });
    // As a process returning from `main`: the runtime and its tasks are gone.
    drop(runtime);

    let check = tokio::runtime::Runtime::new().expect("a runtime");
    let ttl = check.block_on(async {
        let mut raw = harness.raw().await;
        raw.lease_time_to_live(lease_id, None)
            .await
            .expect("lease_time_to_live")
            .ttl()
    });
    assert_eq!(
        ttl, -1,
        "settle returned before the dropped client's idle lease was revoked"
    );
}
