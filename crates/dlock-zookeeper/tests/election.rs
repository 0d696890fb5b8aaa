//! Elections on ZooKeeper beyond the contract: one client that waits as a candidate and
//! observes at once (one session: a data watch on the leader's node from the waiting
//! candidate beside the observer's persistent recursive watch on the key directory), and
//! what a campaign shows in `inspect`.

mod common;

use std::time::Duration;

use common::ZookeeperHarness;
use dlock_core::{Election, Leader, LockOptions, Mode, Wait};
use futures::StreamExt;
use tokio::time::{sleep, timeout};

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
