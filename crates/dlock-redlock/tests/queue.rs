//! The key's queue of waiters on every node: waiting clients are served in arrival order
//! (their tickets order every node's queue alike), a release wakes one waiter, and a
//! waiter abandoned on every node holds the line up for a bounded time.

mod common;

use std::time::Duration;

use common::{RedlockHarness, must_take, unique_key};
use dlock_core::{DistributedLock, LockOptions, Wait};
use dlock_redis::server::{Names, TOUCH_EVERY, WAITER_LEASE};
use dlock_redlock::RedlockLock;
use redis::AsyncCommands;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Poll (up to 10 s) until `n` waiters are in the queue on every node.
async fn until_queued(harness: &RedlockHarness, names: &Names, n: usize) {
    let started = Instant::now();
    for i in 0..harness.config().nodes.len() {
        let mut admin = harness.admin(i).await.expect("admin connection");
        loop {
            let queued: usize = admin.zcard(&names.queue).await.expect("ZCARD");
            if queued == n {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the queue on node {i} never held {n} waiters"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Start `lock` waiting for `key`; it sends `(i, when it acquired)` on `won` and releases
/// at once.
fn spawn_waiter(
    lock: RedlockLock,
    key: &str,
    i: usize,
    won: mpsc::UnboundedSender<(usize, Instant)>,
) -> tokio::task::JoinHandle<()> {
    let key = key.to_owned();
    tokio::spawn(async move {
        let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(60)));
        let lease = lock.acquire(&key, &opts).await.expect("acquire");
        let _ = won.send((i, Instant::now()));
        lease.release().await.expect("release");
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_clients_acquire_in_arrival_order_with_one_wakeup_each() {
    const WAITERS: usize = 6;
    let harness = RedlockHarness::from_env();
    let key = unique_key("fifo");
    let names = Names::new(harness.prefix(), &key);
    let holder = must_take(&harness.lock().await, &key, &LockOptions::new()).await;
    let (won, mut order) = mpsc::unbounded_channel();
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let lock = harness.lock().await;
        clients.push(lock.clone());
        tasks.push(spawn_waiter(lock, &key, i, won.clone()));
        until_queued(&harness, &names, i + 1).await;
    }
    holder.release().await.expect("release");
    let mut served = Vec::new();
    for _ in 0..WAITERS {
        served.push(order.recv().await.expect("a waiter acquires").0);
    }
    for task in tasks {
        task.await.expect("waiter");
    }
    assert_eq!(served, (0..WAITERS).collect::<Vec<_>>());
    let woken: u64 = clients.iter().map(|c| c.stats().wakeups).sum();
    assert_eq!(
        woken, WAITERS as u64,
        "{WAITERS} releases woke waiters {woken} times"
    );
    harness.forget_fence(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_waiter_is_skipped_within_its_lease_and_a_refresh() {
    let harness = RedlockHarness::from_env();
    let key = unique_key("abandoned");
    let names = Names::new(harness.prefix(), &key);
    let holder = must_take(&harness.lock().await, &key, &LockOptions::new()).await;
    // A waiter that crashed at the head of every node's queue, written as the acquire
    // script writes its entry: the smallest ticket, an expiry one lease from now.
    let lease_us = u64::try_from(WAITER_LEASE.as_micros()).expect("µs");
    let lease_ms = i64::try_from(WAITER_LEASE.as_millis()).expect("ms");
    for i in 0..harness.config().nodes.len() {
        let mut admin = harness.admin(i).await.expect("admin connection");
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut admin)
            .await
            .expect("TIME");
        let expires = secs * 1_000_000 + micros + lease_us;
        let _: () = admin.zadd(&names.queue, "ghost", 0).await.expect("ZADD");
        let _: () = admin
            .zadd(&names.waiters, "ghost", expires)
            .await
            .expect("ZADD");
        let _: () = admin
            .pexpire(&names.queue, lease_ms)
            .await
            .expect("PEXPIRE");
        let _: () = admin
            .pexpire(&names.waiters, lease_ms)
            .await
            .expect("PEXPIRE");
    }
    let abandoned = Instant::now();
    let (won, mut order) = mpsc::unbounded_channel();
    let task = spawn_waiter(harness.lock().await, &key, 0, won);
    until_queued(&harness, &names, 2).await;
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
    harness.forget_fence(&key).await;
}
