//! Elections over the nodes: observers are woken by the nodes (well before the recheck),
//! any printable value round-trips through the nodes, and a proclaim that too few nodes
//! took is put back where it went.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedlockHarness, unique_key};
use dlock_core::{DistributedLock, Election, ErrorKind, Leader, LockOptions, Observe, Wait};
use futures::StreamExt;
use redis::AsyncCommands;
use tokio::time::{Instant, timeout};

/// Well under the declared recheck: a change seen this fast was announced.
const WOKEN_WITHIN: Duration = Duration::from_millis(400);

async fn client(harness: &RedlockHarness) -> Arc<dyn DistributedLock> {
    Arc::new(harness.lock().await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_are_woken_by_grants_proclaims_and_resignations() {
    let harness = RedlockHarness::from_env();
    let key = unique_key("election-woken");
    let watcher = client(&harness).await;
    let Observe::Woken { recheck } = watcher.capabilities().election else {
        panic!("elections are woken here");
    };
    assert!(WOKEN_WITHIN * 2 <= recheck, "{recheck:?}");
    let mut changes = Election::new(watcher, key.as_str()).observe();
    let mut next = async || {
        let started = Instant::now();
        let seen = timeout(WOKEN_WITHIN, changes.next())
            .await
            .expect("woken within 400 ms")
            .expect("the stream goes on")
            .expect("observe");
        (seen, started.elapsed())
    };
    assert_eq!(next().await.0, None);
    let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(10)));
    let a = Election::new(client(&harness).await, key.as_str()).options(opts);
    let b = Election::new(client(&harness).await, key.as_str()).options(opts);
    // Values with spaces, quotes, braces, backslashes and non-ASCII letters.
    let odd = r#"a "b" 'c'  {d}:e \f é✓ %s"#;
    let mut first = a.campaign(odd).await.expect("campaign");
    let term = first.term();
    assert_eq!(next().await.0, Some(Leader::new(odd, term)));
    first.proclaim("  second value ").await.expect("proclaim");
    assert_eq!(next().await.0, Some(Leader::new("  second value ", term)));
    // A candidate waiting in line: its grant is announced, not only the resignation.
    let waiting = tokio::spawn(async move { b.campaign("next").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.resign().await.expect("resign");
    let leading = waiting.await.expect("task").expect("campaign");
    let (mut seen, _) = next().await;
    if seen.is_none() {
        seen = next().await.0;
    }
    assert_eq!(seen, Some(Leader::new("next", leading.term())));
    assert!(leading.term() > term);
    leading.resign().await.expect("resign");
    assert_eq!(next().await.0, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_on_a_minority_is_put_back() {
    let harness = RedlockHarness::from_env();
    let key = unique_key("election-minority");
    let names = dlock_redis::server::Names::new(harness.prefix(), &key);
    let lock = client(&harness).await;
    let mut leading = Election::new(lock, key.as_str())
        .campaign("old")
        .await
        .expect("campaign");
    let token = harness.values(&key).await[0]
        .clone()
        .expect("held on node 0");
    // The hold is gone from a majority, behind the client's back.
    for i in 0..3 {
        let _: i64 = harness
            .admin(i)
            .await
            .expect("admin")
            .del(&names.key)
            .await
            .expect("DEL");
    }
    let err = leading.proclaim("new").await.expect_err("not held");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    let values = harness.values(&key).await;
    assert_eq!(values[..3], [None, None, None]);
    assert_eq!(values[3..], [Some(token.clone()), Some(token)], "put back");
    for i in 3..5 {
        let _: i64 = harness
            .admin(i)
            .await
            .expect("admin")
            .del(&names.key)
            .await
            .expect("DEL");
    }
    drop(leading);
}
