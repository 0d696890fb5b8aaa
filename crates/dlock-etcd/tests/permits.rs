//! Permits on the single member, where the conformance suite does not look: the permits'
//! key range (`{lock name}/permit/…`) and that every key in it counts as a holder,
//! whoever put it; the token is the key's create revision; waiters are let in in arrival
//! order, by a deletion ahead of them (no read), and fail at once when their own key goes;
//! and a lock on the same key waits for permit holders.

mod common;

use std::time::Duration;

use common::EtcdHarness;
use dlock_core::{DistributedLock, ErrorKind, Lease, LockOptions, Wait};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

fn fresh_key() -> String {
    format!("dlock-permits-{}", uuid::Uuid::new_v4().simple())
}

fn permits(n: u32) -> LockOptions {
    LockOptions::new().permits(n).ttl(Duration::from_secs(10))
}

fn waiting(opts: LockOptions) -> LockOptions {
    opts.wait(Wait::For(Duration::from_secs(30)))
}

/// Poll (bounded) until `key`'s lock has `n` etcd keys.
async fn wait_for_keys(harness: &EtcdHarness, key: &str, n: usize) {
    let started = Instant::now();
    while harness.lock_keys(key).await.len() != n {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "expected {n} keys under {key}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// Poll (bounded) until `done` holds.
async fn until(what: &str, done: impl Fn() -> bool) {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < Duration::from_secs(5), "{what}");
        sleep(Duration::from_millis(10)).await;
    }
}

/// Acquire `key` with `opts` in a task on a clone of `lock`.
fn acquire_in_task(
    lock: &dlock_etcd::EtcdLock,
    key: &str,
    opts: LockOptions,
) -> JoinHandle<dlock_core::Result<Lease>> {
    let (lock, key) = (lock.clone(), key.to_owned());
    tokio::spawn(async move { lock.acquire(&key, &opts).await })
}

/// Put a key in `key`'s permits' range with the raw client (no lease): a holder of
/// another tool.
async fn put_foreign_permit(harness: &EtcdHarness, key: &str, name: &str) -> String {
    let foreign = format!("{}/permit/{name}", harness.config().lock_name(key));
    harness
        .raw()
        .await
        .put(foreign.as_str(), "", None)
        .await
        .expect("put a foreign permit key");
    foreign
}

async fn delete(harness: &EtcdHarness, etcd_key: &str) {
    harness
        .raw()
        .await
        .delete(etcd_key, None)
        .await
        .expect("delete a key");
}

/// A permit's key is `{lock name}/permit/{lease id}` (a second permit of one client gets a
/// suffixed name), and its token is that key's create revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_key_sits_in_the_permits_range_and_its_token_is_its_create_revision() {
    let harness = EtcdHarness::from_env();
    let key = fresh_key();
    let lock = harness.lock().await;
    let first = lock.try_acquire(&key, &permits(2)).await.expect("try");
    let second = lock.try_acquire(&key, &permits(2)).await.expect("try");
    let held = [
        first.expect("a free permit"),
        second.expect("a free permit"),
    ];
    let keys = harness.lock_keys(&key).await;
    assert_eq!(keys.len(), 2, "one key per permit");
    let range = format!("{}/permit/", harness.config().lock_name(&key));
    for (lease, kv) in held.iter().zip(&keys) {
        let name = String::from_utf8_lossy(kv.key()).into_owned();
        assert!(name.starts_with(&range), "{name:?} is in {range:?}");
        assert_eq!(lease.fencing_token(), kv.create_revision() as u64);
    }
    assert_ne!(keys[0].key(), keys[1].key(), "two permits, two names");
    for lease in held {
        lease.release().await.expect("release");
    }
    harness.assert_clean(&key).await;
}

/// Every key in the permits' range counts against the limit, whoever put it: two foreign
/// keys fill two permits, and a third permit fits only for a limit of three.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_keys_in_the_permits_range_count_as_holders() {
    let harness = EtcdHarness::from_env();
    let key = fresh_key();
    let foreign = [
        put_foreign_permit(&harness, &key, "a").await,
        put_foreign_permit(&harness, &key, "b").await,
    ];
    let lock = harness.lock().await;
    let refused = lock.try_acquire(&key, &permits(2)).await.expect("try");
    assert!(refused.is_none(), "two of two permits are taken");
    let lease = lock.try_acquire(&key, &permits(3)).await.expect("try");
    lease
        .expect("two holders leave a third permit of three")
        .release()
        .await
        .expect("release");
    for foreign in foreign {
        delete(&harness, &foreign).await;
    }
    harness.assert_clean(&key).await;
}

/// A waiter is let in by a deletion ahead of it, promptly; every waiter behind a deleted
/// key counts the deletion once (one wake-up each, and no request), so one release costs as
/// many wake-ups as waiters queued behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deletion_ahead_wakes_each_waiter_behind_it_once() {
    let harness = EtcdHarness::from_env();
    let key = fresh_key();
    let foreign = put_foreign_permit(&harness, &key, "holder").await;
    let clients = [harness.lock().await, harness.lock().await];
    let mut waiters = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        waiters.push(acquire_in_task(client, &key, waiting(permits(1))));
        wait_for_keys(&harness, &key, 2 + i).await;
    }
    // A waiter's key exists before its watch and read do: give both waiters time to be
    // watching (the deletion would otherwise be read, not heard).
    sleep(Duration::from_millis(500)).await;
    let woken = || clients.iter().map(|c| c.stats().wakeups).sum::<u64>();
    assert_eq!(woken(), 0, "nothing freed yet");
    delete(&harness, &foreign).await;
    let first = timeout(Duration::from_secs(2), waiters.remove(0))
        .await
        .expect("the first waiter is let in promptly")
        .expect("task")
        .expect("acquire");
    until("each of the two waiters heard the deletion", || {
        woken() == 2
    })
    .await;
    first.release().await.expect("release");
    let second = timeout(Duration::from_secs(2), waiters.remove(0))
        .await
        .expect("the second waiter is let in promptly")
        .expect("task")
        .expect("acquire");
    until("the second waiter heard the first one's release", || {
        woken() == 3
    })
    .await;
    // Nothing is heard twice (two watches per waiter deliver each deletion twice).
    sleep(Duration::from_millis(200)).await;
    assert_eq!(woken(), 3);
    second.release().await.expect("release");
    harness.assert_clean(&key).await;
}

/// Waiters get freed permits in the order they came (by their keys' create revisions),
/// whichever holder lets go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_permits_in_arrival_order() {
    const N: u32 = 2;
    let harness = EtcdHarness::from_env();
    let key = fresh_key();
    let holder = harness.lock().await;
    let mut held = Vec::new();
    for _ in 0..N {
        held.push(holder.try_acquire(&key, &permits(N)).await.expect("try"));
    }
    let mut waiters = Vec::new();
    for i in 0..3 {
        let client = harness.lock().await;
        waiters.push(acquire_in_task(&client, &key, waiting(permits(N))));
        wait_for_keys(&harness, &key, N as usize + 1 + i).await;
    }
    // The newer holder lets go first: the oldest waiter still comes in first.
    let mut granted = Vec::new();
    held.pop()
        .flatten()
        .expect("held")
        .release()
        .await
        .expect("release");
    for next in 0..3 {
        let lease = timeout(Duration::from_secs(5), &mut waiters[next])
            .await
            .unwrap_or_else(|_| panic!("waiter {next} was let in"))
            .expect("task")
            .expect("acquire");
        assert!(
            waiters[next + 1..].iter().all(|w| !w.is_finished()),
            "a later waiter came in before waiter {next}"
        );
        granted.push(lease);
        if next < 2 {
            granted.remove(0).release().await.expect("release");
        }
    }
    for lease in granted.into_iter().chain(held.into_iter().flatten()) {
        lease.release().await.expect("release");
    }
    harness.assert_clean(&key).await;
}

/// A waiter whose own key is deleted (an operator, a revoked lease) fails with
/// `LeaseLost` at once instead of waiting on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_key_is_deleted_fails_with_lease_lost() {
    let harness = EtcdHarness::from_env();
    let key = fresh_key();
    let foreign = put_foreign_permit(&harness, &key, "holder").await;
    let client = harness.lock().await;
    let waiter = acquire_in_task(&client, &key, waiting(permits(1)));
    wait_for_keys(&harness, &key, 2).await;
    let keys = harness.lock_keys(&key).await;
    let ours = String::from_utf8_lossy(keys[1].key()).into_owned();
    delete(&harness, &ours).await;
    let err = timeout(Duration::from_secs(2), waiter)
        .await
        .expect("the waiter answers at once")
        .expect("task")
        .expect_err("its key is gone");
    assert_eq!(err.kind(), ErrorKind::LeaseLost, "{err}");
    delete(&harness, &foreign).await;
    harness.assert_clean(&key).await;
}

/// A key is a lock or a semaphore, not both; where they meet on etcd, an exclusive hold
/// (ours, Go's `Mutex`, `etcdctl lock`) waits for the permit holders under its prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_hold_waits_for_permit_holders() {
    let harness = EtcdHarness::from_env();
    let key = fresh_key();
    let lock = harness.lock().await;
    let permit = lock
        .try_acquire(&key, &permits(3))
        .await
        .expect("try")
        .expect("a free permit");
    let other = harness.lock().await;
    let exclusive = LockOptions::new().ttl(Duration::from_secs(10));
    let refused = other.try_acquire(&key, &exclusive).await.expect("try");
    assert!(refused.is_none(), "a permit holder keeps a writer out");
    permit.release().await.expect("release");
    other
        .try_acquire(&key, &exclusive)
        .await
        .expect("try")
        .expect("free once the permit is released")
        .release()
        .await
        .expect("release");
    harness.assert_clean(&key).await;
}
