//! Hand-off by notification: a waiter acquires within milliseconds of the release, woken
//! by the release message rather than by a timer.

mod common;

use std::time::Duration;

use common::RedisHarness;
use dlock_core::{DistributedLock, LockOptions, Wait};
use dlock_redis::protocol::Names;
use redis::AsyncCommands;
use tokio::time::Instant;

const ROUNDS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_acquires_within_milliseconds_of_the_release() {
    let harness = RedisHarness::from_env();
    let prefix = harness.config().prefix.clone();
    let holder = harness.lock().await;
    let waiter = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = common::unique_key("handoff");
    let channel = Names::new(&prefix, &key).channel;
    // A long ttl: only the release can wake the waiter, never the holder's expiry.
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let mut handoffs = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let lease = holder.acquire(&key, &long).await.expect("holder acquires");
        let task = {
            let (waiter, key) = (waiter.clone(), key.clone());
            tokio::spawn(async move {
                let opts = long.wait(Wait::For(Duration::from_secs(20)));
                let lease = waiter.acquire(&key, &opts).await.expect("waiter acquires");
                (Instant::now(), lease)
            })
        };
        // Release once the waiter listens on the channel (and its re-try has failed).
        common::wait_for_subscriber(&mut admin, &channel).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released = Instant::now();
        lease.release().await.expect("release");
        let (acquired, lease) = task.await.expect("waiter task");
        handoffs.push(acquired.saturating_duration_since(released));
        lease.release().await.expect("waiter releases");
    }
    handoffs.sort();
    let median = handoffs[ROUNDS / 2];
    eprintln!(
        "redis hand-off over {ROUNDS} rounds: median {median:?}, min {:?}, max {:?}",
        handoffs[0],
        handoffs[ROUNDS - 1]
    );
    assert!(
        median < Duration::from_millis(100),
        "median hand-off {median:?}: {handoffs:?}"
    );
    let wakeups = waiter.stats().wakeups;
    assert!(
        (1..=ROUNDS as u64).contains(&wakeups),
        "{wakeups} wake-ups for {ROUNDS} hand-offs: something other than the releases woke the waiter"
    );
    let left: Option<String> = admin.get(Names::new(&prefix, &key).key).await.expect("GET");
    assert_eq!(left, None, "the lock key is left after the last release");
    common::forget_fence(&mut admin, &prefix, &key).await;
}

/// Uncontended acquire + release: two round trips (one script each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_and_release_take_two_round_trips() {
    const CYCLES: usize = 200;
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    let key = common::unique_key("uncontended");
    let mut cycles = Vec::with_capacity(CYCLES);
    for _ in 0..CYCLES {
        let started = Instant::now();
        let lease = lock
            .try_acquire(&key, &LockOptions::new())
            .await
            .expect("try_acquire")
            .expect("free");
        lease.release().await.expect("release");
        cycles.push(started.elapsed());
    }
    cycles.sort();
    let median = cycles[CYCLES / 2];
    eprintln!(
        "redis uncontended acquire+release over {CYCLES} cycles: median {median:?}, p99 {:?}",
        cycles[CYCLES * 99 / 100]
    );
    assert!(median < Duration::from_millis(50), "median {median:?}");
    let mut admin = harness.admin().await.expect("admin connection");
    common::forget_fence(&mut admin, &harness.config().prefix, &key).await;
}
