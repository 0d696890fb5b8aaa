//! Hand-off by notification across the nodes, and the cost of an uncontended lock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedlockHarness, wait_for_subscribers};
use dlock_conformance::testkit::{hand_offs, summary, uncontended, unique_key};
use dlock_core::DistributedLock;
use dlock_redis::server::Names;

const ROUNDS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_acquires_within_milliseconds_of_the_release() {
    let harness = RedlockHarness::from_env();
    let waiter = Arc::new(harness.lock().await);
    let key = unique_key("handoff");
    let channel = Names::new(harness.prefix(), &key).channel;
    let every_node: Vec<usize> = (0..harness.config().nodes.len()).collect();
    let times = hand_offs(
        Arc::new(harness.lock().await),
        waiter.clone(),
        &key,
        ROUNDS,
        || wait_for_subscribers(&harness, &channel, &every_node),
    )
    .await;
    let (median, line) = summary("redlock hand-off", &times);
    eprintln!("{line}");
    assert!(
        median < Duration::from_millis(100),
        "median hand-off {median:?}: {times:?}"
    );
    let wakeups = waiter.stats().wakeups;
    assert!(
        (1..=ROUNDS as u64).contains(&wakeups),
        "{wakeups} wake-ups for {ROUNDS} hand-offs: the five nodes' announcements of one release must wake the waiter once"
    );
    harness.assert_free_everywhere(&key).await;
    harness.forget_fence(&key).await;
}

/// Uncontended acquire + release: a round on all nodes in parallel, the fence write-back
/// to the nodes behind the highest counter, and a release round.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uncontended_acquire_and_release() {
    let harness = RedlockHarness::from_env();
    let key = unique_key("uncontended");
    let times = uncontended(&harness.lock().await, &key, 200).await;
    let (median, line) = summary("redlock uncontended acquire+release", &times);
    eprintln!("{line}");
    assert!(median < Duration::from_millis(100), "median {median:?}");
    harness.forget_fence(&key).await;
}
