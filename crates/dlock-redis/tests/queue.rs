//! The key's queue of waiters: waiting clients are served in arrival order, a release wakes
//! one waiter, an abandoned waiter holds the line up for a bounded time, a release nobody
//! announced is noticed within a refresh, `try_acquire` does not jump the queue, and the
//! queue goes with its last waiter.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedisHarness, forget_fence, server_micros, set_foreign, unique_key, until_queued};
use dlock_conformance::testkit::must_take;
use dlock_core::{DistributedLock, LockOptions, Wait};
use dlock_redis::RedisLock;
use dlock_redis::server::{Names, TOUCH_EVERY, WAITER_LEASE};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A waiter that crashed at the head of the queue: its entry, written as the acquire
/// script writes one, with the smallest ticket and an expiry `lease` from now.
async fn ghost_waiter(admin: &mut MultiplexedConnection, names: &Names, lease: Duration) {
    let now = server_micros(admin).await;
    let expires = now + u64::try_from(lease.as_micros()).expect("µs");
    let _: () = admin.zadd(&names.queue, "ghost", 0).await.expect("ZADD");
    let _: () = admin
        .zadd(&names.waiters, "ghost", expires)
        .await
        .expect("ZADD");
    let ms = i64::try_from(lease.as_millis()).expect("ms");
    let _: () = admin.pexpire(&names.queue, ms).await.expect("PEXPIRE");
    let _: () = admin.pexpire(&names.waiters, ms).await.expect("PEXPIRE");
}

fn waiting(secs: u64) -> LockOptions {
    LockOptions::new().wait(Wait::For(Duration::from_secs(secs)))
}

/// Start `lock` waiting for `key`; it sends `(i, when it acquired)` on `won` and releases
/// at once.
fn spawn_waiter(
    lock: RedisLock,
    key: &str,
    i: usize,
    won: mpsc::UnboundedSender<(usize, Instant)>,
) -> tokio::task::JoinHandle<()> {
    let key = key.to_owned();
    tokio::spawn(async move {
        let lease = lock.acquire(&key, &waiting(60)).await.expect("acquire");
        let _ = won.send((i, Instant::now()));
        lease.release().await.expect("release");
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_clients_acquire_in_arrival_order() {
    const WAITERS: usize = 6;
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("fifo");
    let names = Names::new(&harness.config().prefix, &key);
    let holder = must_take(&harness.lock().await, &key, &LockOptions::new()).await;
    let (won, mut order) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        tasks.push(spawn_waiter(harness.lock().await, &key, i, won.clone()));
        until_queued(&mut admin, &names, i + 1).await;
    }
    holder.release().await.expect("release");
    let mut served = Vec::new();
    for _ in 0..WAITERS {
        served.push(order.recv().await.expect("a waiter acquires").0);
    }
    assert_eq!(served, (0..WAITERS).collect::<Vec<_>>());
    for task in tasks {
        task.await.expect("waiter");
    }
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_one_waiter() {
    const WAITERS: usize = 8;
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("one-wakeup");
    let names = Names::new(&harness.config().prefix, &key);
    let holder = must_take(&harness.lock().await, &key, &LockOptions::new()).await;
    let (won, mut order) = mpsc::unbounded_channel();
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let lock = harness.lock().await;
        clients.push(lock.clone());
        tasks.push(spawn_waiter(lock, &key, i, won.clone()));
        until_queued(&mut admin, &names, i + 1).await;
    }
    let before: u64 = clients.iter().map(|c| c.stats().wakeups).sum();
    holder.release().await.expect("release");
    for _ in 0..WAITERS {
        order.recv().await.expect("a waiter acquires");
    }
    for task in tasks {
        task.await.expect("waiter");
    }
    let woken: u64 = clients.iter().map(|c| c.stats().wakeups).sum::<u64>() - before;
    assert_eq!(
        woken, WAITERS as u64,
        "{WAITERS} releases woke waiters {woken} times"
    );
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_waiter_is_skipped_within_its_lease_and_a_refresh() {
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("abandoned");
    let names = Names::new(&harness.config().prefix, &key);
    let holder = must_take(&harness.lock().await, &key, &LockOptions::new()).await;
    ghost_waiter(&mut admin, &names, WAITER_LEASE).await;
    let abandoned = Instant::now();
    let (won, mut order) = mpsc::unbounded_channel();
    let task = spawn_waiter(harness.lock().await, &key, 0, won);
    until_queued(&mut admin, &names, 2).await;
    // The release calls the ghost, which never comes.
    holder.release().await.expect("release");
    let (_, acquired) = order.recv().await.expect("the live waiter acquires");
    let after = acquired - abandoned;
    assert!(
        after + Duration::from_millis(100) >= WAITER_LEASE,
        "acquired {after:?} after the ghost's last refresh: it jumped the queue"
    );
    assert!(
        after <= WAITER_LEASE + TOUCH_EVERY + Duration::from_millis(500),
        "acquired {after:?} after the ghost's last refresh (bound {:?})",
        WAITER_LEASE + TOUCH_EVERY
    );
    task.await.expect("waiter");
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_release_is_noticed_within_a_refresh() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock_at(&harness.url_with_option("prefix=")).await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("foreign-release");
    let names = Names::new("", &key);
    // Another library's lock, for 30 s; it is deleted long before that.
    assert!(set_foreign(&mut admin, &key, 30_000).await);
    let (won, mut order) = mpsc::unbounded_channel();
    let task = spawn_waiter(lock, &key, 0, won);
    until_queued(&mut admin, &names, 1).await;
    let _: () = admin.del(&key).await.expect("DEL");
    let deleted = Instant::now();
    let (_, acquired) = order.recv().await.expect("the waiter acquires");
    let after = acquired - deleted;
    assert!(
        after <= TOUCH_EVERY + Duration::from_millis(500),
        "noticed the foreign release after {after:?} (bound {TOUCH_EVERY:?})"
    );
    task.await.expect("waiter");
    forget_fence(&mut admin, "", &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_does_not_jump_the_queue() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("no-barging");
    let names = Names::new(&harness.config().prefix, &key);
    // A live waiter is first in line for a free key (its turn, not yet taken).
    ghost_waiter(&mut admin, &names, Duration::from_secs(60)).await;
    let got = lock
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("try_acquire");
    assert!(
        got.is_none(),
        "try_acquire took a key another waiter is first for"
    );
    let _: () = admin
        .del(&[&names.queue, &names.waiters])
        .await
        .expect("DEL");
    must_take(&lock, &key, &LockOptions::new())
        .await
        .release()
        .await
        .expect("release");
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_goes_with_its_last_waiter() {
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("queue-hygiene");
    let names = Names::new(&harness.config().prefix, &key);
    let holder = must_take(&harness.lock().await, &key, &LockOptions::new()).await;
    // One waiter that is served, one that gives up.
    let (won, mut order) = mpsc::unbounded_channel();
    let served = spawn_waiter(harness.lock().await, &key, 0, won);
    until_queued(&mut admin, &names, 1).await;
    let quitter = Arc::new(harness.lock().await);
    let gave_up = {
        let (quitter, key) = (quitter.clone(), key.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new().wait(Wait::For(Duration::from_millis(300)));
            quitter.acquire(&key, &opts).await
        })
    };
    until_queued(&mut admin, &names, 2).await;
    assert!(gave_up.await.expect("task").is_err(), "the key was held");
    holder.release().await.expect("release");
    order.recv().await.expect("the waiter acquires");
    served.await.expect("waiter");
    let started = Instant::now();
    loop {
        let left: usize = admin
            .exists(&[&names.queue, &names.waiters])
            .await
            .expect("EXISTS");
        if left == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "the queue keys outlived the last waiter"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}
