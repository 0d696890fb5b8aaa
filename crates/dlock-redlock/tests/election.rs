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
    let token = harness.held_everywhere(&key).await;
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

/// What `token` becomes when a proclaim of `value` runs: the same random bits.
fn with_value(token: &str, value: &str) -> String {
    format!("{} {value}", &token[..32])
}

/// A leadership of `value` on `key` with `opts`, and its token (once every node holds it).
async fn lead(
    harness: &RedlockHarness,
    key: &str,
    value: &str,
    opts: LockOptions,
) -> (dlock_core::Leadership, String) {
    let leading = Election::new(client(harness).await, key)
        .options(opts)
        .campaign(value)
        .await
        .expect("campaign");
    let token = harness.held_everywhere(key).await;
    (leading, token)
}

/// Poll a proclaim of `value` once (its scripts go out to every node), wait until a
/// majority of the nodes shows it, then drop the future unanswered: a proclaim that ran on
/// the nodes but whose answers never reached the handle. `false` when the answers came
/// within that first poll (the proclaim then simply succeeded; the caller tries again).
async fn proclaim_and_drop(
    harness: &RedlockHarness,
    leading: &mut dlock_core::Leadership,
    key: &str,
    token: &str,
    value: &str,
) -> bool {
    use futures::FutureExt;
    let expected = Some(with_value(token, value));
    let mut proclaim = Box::pin(leading.proclaim(value));
    if let Some(answer) = (&mut proclaim).now_or_never() {
        answer.expect("proclaim");
        return false;
    }
    let started = Instant::now();
    loop {
        let values = harness.values(key).await;
        if values.iter().filter(|v| **v == expected).count() >= 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the proclaim never ran on a majority: {values:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(proclaim);
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_dropped_after_it_ran_leaves_the_leadership_held() {
    let harness = RedlockHarness::from_env();
    let key = unique_key("election-lost-proclaim");
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let (mut leading, token) = lead(&harness, &key, "old", opts).await;
    // The proclaim script is loaded on every node by its first call (`NOSCRIPT`, then a
    // second request), so that the proclaims below run with their first request.
    leading.proclaim("warm").await.expect("proclaim");
    let mut lost = None;
    for attempt in 0..100 {
        let value = format!("lost {attempt}");
        if proclaim_and_drop(&harness, &mut leading, &key, &token, &value).await {
            lost = Some(value);
            break;
        }
    }
    let lost = lost.expect("a proclaim dropped before its answers");
    assert_ne!(leading.value(), lost, "the handle never heard the answers");
    // A majority holds the new token, the handle the old one: the same owner.
    leading
        .lease()
        .extend(Duration::from_secs(10))
        .await
        .expect("extend after a lost proclaim");
    let watcher = Election::new(client(&harness).await, key.as_str());
    assert_eq!(
        watcher.leader().await.expect("leader"),
        Some(Leader::new(lost.as_str(), leading.term()))
    );
    leading.proclaim("found").await.expect("proclaim again");
    let found = Some(with_value(&token, "found"));
    assert!(harness.values(&key).await.iter().all(|v| *v == found));
    leading
        .resign()
        .await
        .expect("resign after a lost proclaim");
    assert_eq!(harness.values(&key).await, [None, None, None, None, None]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leaders_renewal_keeps_its_term_alive_on_every_node() {
    let harness = RedlockHarness::from_env();
    let key = unique_key("election-term-alive");
    let names = dlock_redis::server::Names::new(harness.prefix(), &key);
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let (leading, _) = lead(&harness, &key, "v", opts).await;
    // As if the leader had led for an hour: the counters about to expire.
    for i in 0..5 {
        let _: bool = harness
            .admin(i)
            .await
            .expect("admin")
            .pexpire(&names.fence, 2_000)
            .await
            .expect("PEXPIRE");
    }
    leading
        .lease()
        .extend(Duration::from_secs(10))
        .await
        .expect("extend");
    for i in 0..5 {
        let pttl: i64 = harness
            .admin(i)
            .await
            .expect("admin")
            .pttl(&names.fence)
            .await
            .expect("PTTL");
        assert!(
            pttl > 3_600_000,
            "node {i}: the term outlives the hold: {pttl}"
        );
    }
    leading.resign().await.expect("resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_is_read_while_the_fences_disagree() {
    let harness = RedlockHarness::from_env();
    let key = unique_key("election-unsettled");
    let names = dlock_redis::server::Names::new(harness.prefix(), &key);
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let (leading, _) = lead(&harness, &key, "v", opts).await;
    let term = leading.term();
    // No two nodes agree (a write-back under way, as seen by a reader): node i shows
    // term + i.
    for i in 0..5u64 {
        let _: () = harness
            .admin(usize::try_from(i).unwrap())
            .await
            .expect("admin")
            .set(&names.fence, term + i)
            .await
            .expect("SET fence");
    }
    let watcher = Election::new(client(&harness).await, key.as_str());
    // The highest fence a majority (3 of 5) reached.
    assert_eq!(
        watcher.leader().await.expect("leader"),
        Some(Leader::new("v", term + 2))
    );
    leading.resign().await.expect("resign");
    assert_eq!(watcher.leader().await.expect("leader"), None);
}
