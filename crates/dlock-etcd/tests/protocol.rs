//! Where this backend goes beyond Go's `concurrency.Mutex`, checked on the single member:
//! a waiter whose own key vanishes stops with `LeaseLost`, our key is watched while held,
//! extend with a new ttl moves the key to a new lease, nested names stay independent, and
//! an election's value is its key's value on the lease the key is on.

mod common;

use std::time::Duration;

use common::EtcdHarness;
use dlock_core::{DistributedLock, ErrorKind, LockOptions, LostReason, Wait};
use tokio::time::{Instant, sleep, timeout};

fn fresh_key(label: &str) -> String {
    format!("dlock-protocol-{}/{label}", uuid::Uuid::new_v4().simple())
}

async fn wait_for_keys(harness: &EtcdHarness, key: &str, n: usize) -> Vec<etcd_client::KeyValue> {
    let started = Instant::now();
    loop {
        let keys = harness.lock_keys(key).await;
        if keys.len() == n {
            return keys;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "expected {n} keys under {key}, found {}",
            keys.len()
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// Go's 3.4 Mutex keeps waiting (and later "acquires") after its own key vanished
/// (etcd #11429, #19597). Here the waiter watches its own key and stops with `LeaseLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_lease_is_revoked_stops_with_lease_lost() {
    let harness = EtcdHarness::from_env();
    let key = fresh_key("k");
    let (a, b) = (harness.lock().await, harness.lock().await);
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let holder = a
        .try_acquire(&key, &long)
        .await
        .expect("try_acquire")
        .expect("free");
    let waiter = {
        let key = key.clone();
        let opts = long.wait(Wait::For(Duration::from_secs(60)));
        tokio::spawn(async move { b.acquire(&key, &opts).await })
    };
    let keys = wait_for_keys(&harness, &key, 2).await;
    let waiting_lease = keys[1].lease();
    let mut raw = harness.raw().await;
    raw.lease_revoke(waiting_lease)
        .await
        .expect("revoke the waiter's lease");
    let revoked = Instant::now();
    let err = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter stops promptly")
        .expect("waiter task")
        .expect_err("a waiter without its key must not acquire");
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    assert!(
        revoked.elapsed() < Duration::from_secs(2),
        "took {:?}",
        revoked.elapsed()
    );
    assert!(!holder.is_lost());
    holder.release().await.expect("the holder is undisturbed");
    harness.assert_clean(&key).await;
}

/// A broken lease is noticed through the watch on our own key, long before the next renewal
/// (due ttl/3 = 10 s after the grant here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_at_once_when_our_key_is_deleted() {
    // Once the watch on our key is set up.
    lost_fires_when_deleted(Duration::from_millis(300)).await;
}

/// A deletion in the hold's first moments, before its watch starts (a tenth of a second
/// into the hold), is still seen: the watch starts from the revision the hold was won at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_our_key_is_deleted_before_its_watch_starts() {
    lost_fires_when_deleted(Duration::ZERO).await;
}

/// The client's queue of watches not yet due: a hold made right after many short ones
/// (released before their watch was due, so never watched) still gets its watch, and so
/// does one made after the queue ran empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_for_a_hold_queued_behind_short_ones() {
    use dlock_conformance::Harness as _;
    let harness = EtcdHarness::from_env();
    let a = harness.lock().await;
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    for round in 0..2 {
        for i in 0..50 {
            let short = fresh_key(&format!("short{round}-{i}"));
            let lease = a.try_acquire(&short, &opts).await.expect("try_acquire");
            lease.expect("free").release().await.expect("release");
        }
        let key = fresh_key(&format!("k{round}"));
        let lease = a
            .try_acquire(&key, &opts)
            .await
            .expect("try_acquire")
            .expect("free");
        // Past the watch's start, so the deletion is seen by the watch itself.
        sleep(Duration::from_millis(300)).await;
        harness.break_lease(&key).await.expect("break the lease");
        let reason = timeout(Duration::from_secs(2), lease.lost())
            .await
            .unwrap_or_else(|_| panic!("round {round}: lost() did not fire within 2 s"));
        assert_eq!(reason, LostReason::NotHeld);
        drop(lease);
        // The queue runs empty before the next round's holds.
        sleep(Duration::from_millis(300)).await;
    }
}

/// Hold a key (ttl 30 s) for `into_hold`, delete it behind our back: `lost()` fires within
/// 2 s, and the release answers that the lease is gone.
async fn lost_fires_when_deleted(into_hold: Duration) {
    use dlock_conformance::Harness as _;
    let harness = EtcdHarness::from_env();
    let key = fresh_key("k");
    let a = harness.lock().await;
    let lease = a
        .try_acquire(&key, &LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .expect("try_acquire")
        .expect("free");
    sleep(into_hold).await;
    let broken = Instant::now();
    harness.break_lease(&key).await.expect("break the lease");
    let reason = timeout(Duration::from_secs(5), lease.lost())
        .await
        .expect("lost() fires well before the next renewal");
    assert_eq!(reason, LostReason::NotHeld);
    assert!(
        broken.elapsed() < Duration::from_secs(2),
        "took {:?}",
        broken.elapsed()
    );
    let err = lease.release().await.expect_err("a broken lease");
    assert!(
        matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost),
        "{err}"
    );
    harness.assert_clean(&key).await;
}

/// etcd cannot change a lease's ttl, so extending with another ttl attaches our key to a new
/// lease of that ttl: the key (its fencing token, and the value naming the holder) stays,
/// the old lease is revoked once its linger (one ttl) ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_with_a_new_ttl_moves_the_key_to_a_new_lease() {
    let harness = EtcdHarness::from_env();
    let key = fresh_key("k");
    let (a, b) = (harness.lock().await, harness.lock().await);
    let mut raw = harness.raw().await;
    let lease = a
        .try_acquire(&key, &LockOptions::new().ttl(Duration::from_secs(2)))
        .await
        .expect("try_acquire")
        .expect("free");
    let before = wait_for_keys(&harness, &key, 1).await.remove(0);
    // 3.5 s is asked as 4 whole seconds.
    lease
        .extend(Duration::from_millis(3500))
        .await
        .expect("extend");
    let after = wait_for_keys(&harness, &key, 1).await.remove(0);
    assert_eq!(after.key(), before.key(), "the same key");
    assert_eq!(after.create_revision(), before.create_revision());
    assert_eq!(lease.fencing_token(), after.create_revision() as u64);
    assert_ne!(after.lease(), before.lease(), "a new lease");
    assert_eq!(
        after.value(),
        dlock_core::holder_description().as_bytes(),
        "the value naming the holder stays"
    );
    let new = raw
        .lease_time_to_live(after.lease(), None)
        .await
        .expect("ttl");
    assert_eq!(new.granted_ttl(), 4);
    // The old shared lease, which holds nothing now, is revoked when its linger (2 s) ends.
    let started = Instant::now();
    while raw
        .lease_time_to_live(before.lease(), None)
        .await
        .expect("ttl")
        .ttl()
        != -1
    {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the old lease is not revoked"
        );
        sleep(Duration::from_millis(20)).await;
    }
    // Auto-renewal now works with the new ttl: held well past the first ttl.
    sleep(Duration::from_secs(5)).await;
    assert!(!lease.is_lost(), "{lease:?}");
    assert!(
        b.try_acquire(&key, &LockOptions::new())
            .await
            .expect("try")
            .is_none(),
        "still held"
    );
    lease.release().await.expect("release");
    harness.assert_clean(&key).await;
    // Every lease the client granted is revoked (the 4 s one after its linger).
    let started = Instant::now();
    while !a.backend().open_leases().is_empty() {
        assert!(
            started.elapsed() < Duration::from_secs(7),
            "open leases: {:?}",
            a.backend().open_leases()
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// Lock names never nest: `a` and `a/b` are different locks (etcd's prefix `a/` would
/// otherwise cover `a/b/…`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_names_do_not_block_each_other() {
    let harness = EtcdHarness::from_env();
    let parent = fresh_key("a");
    let child = format!("{parent}/b");
    let (a, b) = (harness.lock().await, harness.lock().await);
    let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(2)));
    let child_lease = a.acquire(&child, &opts).await.expect("child");
    let parent_lease = b
        .acquire(&parent, &opts)
        .await
        .expect("parent is not blocked by a/b");
    child_lease.release().await.expect("release");
    parent_lease.release().await.expect("release");
    harness.assert_clean(&parent).await;
}

/// A try on a busy key removes its queued key before answering, so the same client can try
/// again right away and is not stuck behind its own leftover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_try_leaves_no_key_behind() {
    let harness = EtcdHarness::from_env();
    let key = fresh_key("k");
    let (a, b) = (harness.lock().await, harness.lock().await);
    let holder = a
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("try")
        .expect("free");
    for _ in 0..3 {
        assert!(
            b.try_acquire(&key, &LockOptions::new())
                .await
                .expect("try")
                .is_none()
        );
        assert_eq!(
            harness.lock_keys(&key).await.len(),
            1,
            "only the holder's key"
        );
    }
    holder.release().await.expect("release");
    let lease = b
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("try")
        .expect("free after release");
    lease.release().await.expect("release");
    harness.assert_clean(&key).await;
}

/// With the default prefix, an unrelated key that merely starts with the lock's name and a
/// `/` (another application's `jobs/1` beside a lock named `jobs`) is not in the lock's
/// queue; with an empty prefix it would hold the lock forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unrelated_keys_under_the_lock_name_do_not_block_it() {
    let harness = EtcdHarness::from_env();
    let lock = harness.lock().await;
    let name = format!("dlock-protocol-{}", uuid::Uuid::new_v4().simple());
    let foreign = format!("{name}/1");
    let mut raw = harness.raw().await;
    raw.put(foreign.as_str(), "not a lock", None)
        .await
        .expect("put a foreign key");
    let lease = lock
        .try_acquire(&name, &LockOptions::new())
        .await
        .expect("try_acquire")
        .expect("a foreign key outside the prefix does not hold the lock");
    lease.release().await.expect("release");
    raw.delete(foreign.as_str(), None)
        .await
        .expect("delete the foreign key");
}

/// An election's value is its key's value, byte for byte (Go's `Election` layout), on the
/// lease the key is on: a proclaim after the key moved to a lease of another ttl puts it on
/// the new lease, and the move keeps a proclaimed value; only an exclusive key leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_value_is_the_key_value_on_its_current_lease() {
    use dlock_core::{Election, Leader};
    let harness = EtcdHarness::from_env();
    let key = fresh_key("k");
    let lock: std::sync::Arc<dyn DistributedLock> = std::sync::Arc::new(harness.lock().await);
    let election = Election::new(lock.clone(), key.clone())
        .options(LockOptions::new().ttl(Duration::from_secs(2)));
    let mut leading = election.campaign(" spaced value ").await.expect("campaign");
    let term = leading.term();
    let before = wait_for_keys(&harness, &key, 1).await.remove(0);
    assert_eq!(before.value(), b" spaced value ");
    assert_eq!(
        election.leader().await.expect("leader()"),
        Some(Leader::new(" spaced value ", term))
    );
    leading.proclaim("proclaimed").await.expect("proclaim");
    leading
        .lease()
        .extend(Duration::from_secs(3))
        .await
        .expect("extend with another ttl");
    let moved = wait_for_keys(&harness, &key, 1).await.remove(0);
    assert_ne!(moved.lease(), before.lease(), "a new lease");
    assert_eq!(moved.value(), b"proclaimed", "the move keeps the value");
    leading.proclaim("again").await.expect("proclaim");
    let after = wait_for_keys(&harness, &key, 1).await.remove(0);
    assert_eq!(after.value(), b"again");
    assert_eq!(
        after.lease(),
        moved.lease(),
        "put on the lease the key is on"
    );
    assert_eq!(after.create_revision() as u64, term, "the term stays");
    leading.resign().await.expect("resign");

    // A reader that holds the key is no leader.
    let reader = lock
        .try_acquire(&key, &LockOptions::new().shared())
        .await
        .expect("try_acquire")
        .expect("free");
    assert_eq!(election.leader().await.expect("leader()"), None);
    reader.release().await.expect("release");
    harness.assert_clean(&key).await;
}
