//! Elections on ZooKeeper beyond the contract: one client that waits as a candidate and
//! observes at once (one session: a data watch on the leader's node from the waiting
//! candidate beside the observer's persistent recursive watch on the key directory), and
//! what a campaign shows in `inspect`; and that a burst of changes wakes an observer that
//! was not polling once, not once per change.

mod common;

use std::time::Duration;

use common::ZookeeperHarness;
use dlock_core::raw::Backend;
use dlock_core::{Election, Leader, LockOptions, Mode, Wait};
use dlock_zookeeper::ZookeeperBackend;
use futures::StreamExt;
use tokio::time::{sleep, timeout};
use zookeeper_client::{self as zk, CreateMode};

const PROMPTLY: Duration = Duration::from_secs(5);

/// Both watches of one session fire for the leader's deletion: the waiting candidate
/// leads and the observer sees it; `inspect` shows the leader's value and term as its
/// holder and the other candidate as a waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_session_waits_and_observes() {
    let harness = ZookeeperHarness::from_env();
    let (lock, leader) = (harness.must_client().await, harness.must_client().await);
    let key = format!("election-{}/k", uuid::Uuid::new_v4().simple());
    let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(60)));
    let election = Election::new(lock.clone(), key.clone()).options(opts);
    let mut changes = election.observe();
    let mut next = async || {
        let item = timeout(PROMPTLY, changes.next())
            .await
            .expect("a change in time");
        item.expect("the stream goes on").expect("observe")
    };
    assert_eq!(next().await, None);
    // A client's own candidates queue in the client first (one node per key at a time):
    // the leader is another client's, so this session's candidate waits on the server.
    let first = Election::new(leader, key.clone())
        .campaign("first")
        .await
        .expect("campaign");
    assert_eq!(next().await, Some(Leader::new("first", first.term())));
    let waiting = tokio::spawn({
        let election = election.clone();
        async move { election.campaign("second").await }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "two leaders");
    let status = lock.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders.len(), 1);
    let holder = &status.holders[0];
    assert_eq!(holder.mode, Mode::Exclusive);
    assert_eq!(holder.who.as_deref(), Some("first"));
    assert_eq!(holder.fencing_token, Some(first.term()));
    let waiters = status.waiters.expect("waiters shown");
    assert_eq!(waiters.len(), 1);
    assert_eq!(waiters[0].who.as_deref(), Some("second"));

    first.resign().await.expect("resign");
    let second = timeout(PROMPTLY, waiting)
        .await
        .expect("the waiting candidate leads")
        .expect("task")
        .expect("campaign");
    // The observer may see nobody between the two, or the new leader at once.
    let mut seen = next().await;
    if seen.is_none() {
        seen = next().await;
    }
    assert_eq!(seen, Some(Leader::new("second", second.term())));
    second.resign().await.expect("resign");
    assert_eq!(next().await, None);
}

/// How many candidates queue (and all but one withdraw) in the burst.
const BURST: usize = 50;

/// Wake-ups coalesce: while neither the backend's change stream nor `observe` is polled,
/// 50 candidates queue behind the leader, 49 withdraw and the leader resigns (100 node
/// events, each a wake-up before coalescing). Once polled, the change stream has at most
/// a few wake-ups pending (one leader read for the whole burst, not 100), `observe`
/// reports the last candidate as the leader at once, and the next change wakes both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_changes_wakes_an_idle_observer_once() {
    let harness = ZookeeperHarness::from_env();
    let backend = ZookeeperBackend::connect(harness.config())
        .await
        .expect("connect");
    let (lock, observer) = (harness.must_client().await, harness.must_client().await);
    let raw = harness.raw().await.expect("a raw session");
    let key = format!("election-{}/burst", uuid::Uuid::new_v4().simple());
    let dir = harness.config().key_dir(&key);

    let first = Election::new(lock, key.clone())
        .campaign("first")
        .await
        .expect("campaign");
    let mut wakeups = backend
        .leader_changes(&key)
        .await
        .expect("subscribe")
        .expect("the server wakes observers (ZooKeeper 3.6+)");
    let mut changes = Election::new(observer, key.clone()).observe();
    let mut next = async || {
        let item = timeout(PROMPTLY, changes.next())
            .await
            .expect("a change in time");
        item.expect("the stream goes on").expect("observe")
    };
    assert_eq!(next().await, Some(Leader::new("first", first.term())));

    // Candidates queue (Curator's `LeaderLatch` node: a raw session queues as many as it
    // likes at once) and withdraw; then the leader resigns and the last one leads.
    let ephemeral = CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let mut queued = Vec::with_capacity(BURST);
    for i in 0..BURST {
        let node = format!("{dir}/_c_{}-latch-", uuid::Uuid::new_v4());
        let value = format!("candidate {i}");
        let (stat, sequence) = raw
            .create(&node, value.as_bytes(), &ephemeral)
            .await
            .expect("queue");
        queued.push((format!("{node}{sequence}"), value, stat.czxid));
    }
    let (last, value, czxid) = queued.pop().expect("a candidate");
    for (node, _, _) in &queued {
        raw.delete(node, None).await.expect("withdraw");
    }
    first.resign().await.expect("resign");
    // Every event reaches the observers' sessions.
    sleep(Duration::from_secs(1)).await;

    let mut pending = 0;
    while let Ok(item) = timeout(Duration::from_millis(300), wakeups.next()).await {
        item.expect("the stream goes on").expect("a wake-up");
        pending += 1;
    }
    assert!(
        (1..=3).contains(&pending),
        "{pending} wake-ups pending after {} changes",
        2 * BURST
    );
    let term = u64::try_from(czxid).expect("a positive czxid");
    assert_eq!(next().await, Some(Leader::new(value, term)));

    // Still woken afterwards: the last candidate withdraws.
    raw.delete(&last, None).await.expect("withdraw");
    timeout(PROMPTLY, wakeups.next())
        .await
        .expect("a wake-up in time")
        .expect("the stream goes on")
        .expect("a wake-up");
    assert_eq!(next().await, None);
}
