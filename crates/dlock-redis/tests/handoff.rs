//! Hand-off by notification: a waiter acquires within milliseconds of the release, woken
//! by the release message rather than by a timer. And the cost of an uncontended lock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedisHarness, forget_fence, wait_for_subscriber};
use dlock_conformance::testkit::{hand_offs, summary, uncontended, unique_key};
use dlock_core::DistributedLock;
use dlock_redis::server::Names;
use redis::AsyncCommands;

const ROUNDS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_acquires_within_milliseconds_of_the_release() {
    let harness = RedisHarness::from_env();
    let prefix = harness.config().prefix.clone();
    let waiter = Arc::new(harness.lock().await);
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("handoff");
    let names = Names::new(&prefix, &key);
    let times = hand_offs(
        Arc::new(harness.lock().await),
        waiter.clone(),
        &key,
        ROUNDS,
        || {
            let (mut admin, channel) = (admin.clone(), names.channel.clone());
            async move { wait_for_subscriber(&mut admin, &channel).await }
        },
    )
    .await;
    let (median, line) = summary("redis hand-off", &times);
    eprintln!("{line}");
    assert!(
        median < Duration::from_millis(100),
        "median hand-off {median:?}: {times:?}"
    );
    let wakeups = waiter.stats().wakeups;
    assert!(
        (1..=ROUNDS as u64).contains(&wakeups),
        "{wakeups} wake-ups for {ROUNDS} hand-offs: something other than the releases woke the waiter"
    );
    let left: Option<String> = admin.get(&names.key).await.expect("GET");
    assert_eq!(left, None, "the lock key is left after the last release");
    forget_fence(&mut admin, &prefix, &key).await;
}

/// Uncontended acquire + release: two round trips (one script each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_and_release_take_two_round_trips() {
    let harness = RedisHarness::from_env();
    let key = unique_key("uncontended");
    let times = uncontended(&harness.lock().await, &key, 200).await;
    let (median, line) = summary("redis uncontended acquire+release", &times);
    eprintln!("{line}");
    assert!(median < Duration::from_millis(50), "median {median:?}");
    let mut admin = harness.admin().await.expect("admin connection");
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}
