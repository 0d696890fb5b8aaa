//! Elections as the server sees them: the value in the lock key's token, what a proclaim
//! leaves there, and what the key's channel carries for observers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedisHarness, unique_key};
use dlock_core::{DistributedLock, Election, Leader, LockOptions, Wait};
use dlock_redis::server::{Names, token_holder};
use futures::StreamExt;
use futures::stream::BoxStream;
use redis::AsyncCommands;
use tokio::time::{Instant, timeout};

fn election(lock: dlock_redis::RedisLock, key: &str) -> Election {
    let lock: Arc<dyn DistributedLock> = Arc::new(lock);
    Election::new(lock, key).options(
        LockOptions::new()
            .ttl(Duration::from_secs(10))
            .wait(Wait::For(Duration::from_secs(10))),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_round_trip_through_the_token_inspect_and_a_proclaim() {
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("election-values");
    let names = Names::new(&harness.config().prefix, &key);
    let e = election(harness.lock().await, &key);
    let inspector = harness.lock().await;
    let values = [
        "10.0.0.7:8080",
        "alpha: draining, then gone",
        " leading and  double spaces ",
        "ünïcødé ✓ 東京 🦀",
        "r-looks-like-a-reader p3.and-a-permit",
    ];
    for (value, next) in values.iter().zip(values.iter().rev()) {
        let mut leading = e.campaign(value).await.expect("campaign");
        let token: String = admin.get(&names.key).await.expect("GET lock");
        assert_eq!(token_holder(&token), Some(*value), "{token:?}");
        let status = inspector.inspect(&key).await.expect("inspect");
        assert_eq!(status.holders[0].who.as_deref(), Some(*value));
        assert_eq!(status.holders[0].fencing_token, Some(leading.term()));
        assert_eq!(
            e.leader().await.expect("leader"),
            Some(Leader::new(*value, leading.term()))
        );
        let before: i64 = admin.pttl(&names.key).await.expect("PTTL");
        leading.proclaim(next).await.expect("proclaim");
        let after: i64 = admin.pttl(&names.key).await.expect("PTTL");
        assert!(
            0 < after && after <= before,
            "KEEPTTL: {before} then {after}"
        );
        let moved: String = admin.get(&names.key).await.expect("GET lock");
        assert_eq!(moved[..32], token[..32], "the owner identity stays");
        assert_eq!(
            e.leader().await.expect("leader"),
            Some(Leader::new(*next, leading.term()))
        );
        // The hold goes on under the new token: renewals and the release find it ours.
        leading
            .lease()
            .extend(Duration::from_secs(10))
            .await
            .expect("extend after a proclaim");
        let fence_pttl: i64 = admin.pttl(&names.fence).await.expect("PTTL fence");
        assert!(
            fence_pttl > 3_600_000,
            "the term outlives the hold: {fence_pttl}"
        );
        leading.resign().await.expect("resign after a proclaim");
        let exists: bool = admin.exists(&names.key).await.expect("EXISTS");
        assert!(!exists, "a resignation deletes the key");
    }
}

/// A raw subscriber to `channel`, or `None` on a server this test cannot reach without
/// the crate's own options (TLS, a password).
async fn raw_subscriber(harness: &RedisHarness, channel: &str) -> Option<redis::aio::PubSub> {
    let config = harness.config();
    if config.tls || config.password.is_some() {
        eprintln!("skipped: the raw subscriber speaks plain Redis without AUTH");
        return None;
    }
    let client =
        redis::Client::open(format!("redis://{}/{}", config.addr(), config.db)).expect("client");
    let mut pubsub = client.get_async_pubsub().await.expect("pubsub");
    pubsub.subscribe(channel).await.expect("SUBSCRIBE");
    Some(pubsub)
}

/// The messages that arrive on `pubsub` within `within`.
async fn heard(pubsub: &mut redis::aio::PubSub, within: Duration) -> Vec<String> {
    let mut messages = pubsub.on_message();
    let mut out = Vec::new();
    while let Ok(Some(msg)) = timeout(within, messages.next()).await {
        out.push(msg.get_payload::<String>().expect("payload"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_grants_proclaims_and_resignations_publish_and_plain_holds_do_not() {
    let harness = RedisHarness::from_env();
    let key = unique_key("election-channel");
    let names = Names::new(&harness.config().prefix, &key);
    let Some(mut pubsub) = raw_subscriber(&harness, &names.channel).await else {
        return;
    };
    let quiet = Duration::from_millis(200);
    let lock = harness.lock().await;
    let lease = lock
        .acquire(&key, &LockOptions::new())
        .await
        .expect("plain acquire");
    lease.release().await.expect("plain release");
    assert_eq!(heard(&mut pubsub, quiet).await, Vec::<String>::new());

    let e = election(lock, &key);
    let mut leading = e.campaign("first").await.expect("campaign");
    assert_eq!(heard(&mut pubsub, quiet).await, ["!leader"], "grant");
    leading.proclaim("first, again").await.expect("proclaim");
    assert_eq!(heard(&mut pubsub, quiet).await, ["!leader"], "proclaim");

    // A waiting candidate: the release calls it by its token, and its grant publishes.
    let waiting = election(harness.lock().await, &key);
    let second = tokio::spawn(async move { waiting.campaign("second").await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    leading.resign().await.expect("resign");
    let leading = second.await.expect("task").expect("campaign");
    let messages = heard(&mut pubsub, quiet).await;
    assert_eq!(messages.len(), 3, "{messages:?}");
    assert_eq!(messages[0], "!leader", "the release: {messages:?}");
    assert!(
        token_holder(&messages[1]) == Some("second"),
        "the call: {messages:?}"
    );
    assert_eq!(messages[2], "!leader", "the grant: {messages:?}");
    leading.resign().await.expect("resign");
    assert_eq!(heard(&mut pubsub, quiet).await, ["!leader"], "resign");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_are_woken_well_before_the_recheck() {
    let harness = RedisHarness::from_env();
    let key = unique_key("election-woken");
    let leader = election(harness.lock().await, &key);
    let watcher = election(harness.lock().await, &key);
    let mut changes = watcher.observe();
    let next = async |changes: &mut BoxStream<'static, dlock_core::Result<Option<Leader>>>| {
        timeout(Duration::from_secs(5), changes.next())
            .await
            .expect("a change")
            .expect("the stream goes on")
            .expect("no error")
    };
    assert_eq!(next(&mut changes).await, None);
    let mut leading = leader.campaign("v0").await.expect("campaign");
    assert_eq!(next(&mut changes).await.map(|l| l.value), Some("v0".into()));
    // The recheck is 500 ms: an observer that only polled would see a change after 250
    // ms on average and after 200 ms in 3 of 5 cases; woken, it takes a round trip.
    let mut slowest = Duration::ZERO;
    for i in 1..=5 {
        let value = format!("v{i}");
        let sent = Instant::now();
        leading.proclaim(&value).await.expect("proclaim");
        assert_eq!(next(&mut changes).await.map(|l| l.value), Some(value));
        slowest = slowest.max(sent.elapsed());
    }
    assert!(slowest < Duration::from_millis(200), "slowest {slowest:?}");
    leading.resign().await.expect("resign");
    assert_eq!(next(&mut changes).await, None);
}

/// What `token` becomes when a proclaim of `value` runs: the same random bits.
fn with_value(token: &str, value: &str) -> String {
    format!("{} {value}", &token[..32])
}

/// Poll a proclaim of `value` once (its script goes out), wait until the server shows
/// it at `key`, then drop the future unanswered: a proclaim that ran on the server but
/// whose answer never reached the handle (a caller's timeout, a `select!` that went the
/// other way). `false` when the answer came within that first poll (a local server can
/// be that fast): the proclaim then simply succeeded, and the caller tries again.
async fn proclaim_and_drop(
    leading: &mut dlock_core::Leadership,
    value: &str,
    admin: &mut redis::aio::MultiplexedConnection,
    key: &str,
    token: &str,
) -> bool {
    use futures::FutureExt;
    let expected = with_value(token, value);
    let mut proclaim = Box::pin(leading.proclaim(value));
    if let Some(answer) = (&mut proclaim).now_or_never() {
        answer.expect("proclaim");
        return false;
    }
    let started = Instant::now();
    loop {
        let now: Option<String> = admin.get(key).await.expect("GET lock");
        if now.as_deref() == Some(expected.as_str()) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the proclaim never ran: {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    drop(proclaim);
    true
}

/// [`proclaim_and_drop`] until one is dropped unanswered; the value it left.
async fn lose_a_proclaim(
    leading: &mut dlock_core::Leadership,
    admin: &mut redis::aio::MultiplexedConnection,
    key: &str,
    token: &str,
) -> String {
    for attempt in 0..100 {
        let value = format!("lost {attempt}");
        if proclaim_and_drop(leading, &value, admin, key, token).await {
            return value;
        }
    }
    panic!("every proclaim was answered within its first poll");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proclaim_dropped_after_it_ran_leaves_the_leadership_held() {
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("election-lost-proclaim");
    let names = Names::new(&harness.config().prefix, &key);
    let e = election(harness.lock().await, &key);
    let mut leading = e.campaign("old").await.expect("campaign");
    let token: String = admin.get(&names.key).await.expect("GET lock");
    let lost = lose_a_proclaim(&mut leading, &mut admin, &names.key, &token).await;
    assert_ne!(leading.value(), lost, "the handle never heard the answer");
    // The server holds the new token, the handle the old one: the same owner.
    leading
        .lease()
        .extend(Duration::from_secs(10))
        .await
        .expect("extend after a lost proclaim");
    assert!(!leading.is_lost());
    assert_eq!(
        e.leader().await.expect("leader"),
        Some(Leader::new(lost.as_str(), leading.term()))
    );
    // A second lost answer in a row (this one not applied: the key is then set back by
    // hand to the old value, as if the swap had not run) changes nothing either.
    let _: () = admin
        .set_options(
            &names.key,
            &token,
            redis::SetOptions::default().with_expiration(redis::SetExpiry::KEEPTTL),
        )
        .await
        .expect("SET KEEPTTL");
    leading
        .lease()
        .extend(Duration::from_secs(10))
        .await
        .expect("extend after a proclaim that did not run");
    // A proclaim after a lost one finds the key ours, whatever value it holds.
    lose_a_proclaim(&mut leading, &mut admin, &names.key, &token).await;
    leading.proclaim("latest").await.expect("proclaim again");
    let now: String = admin.get(&names.key).await.expect("GET lock");
    assert_eq!(now, with_value(&token, "latest"));
    leading.resign().await.expect("resign after lost proclaims");
    let exists: bool = admin.exists(&names.key).await.expect("EXISTS");
    assert!(!exists, "the resignation deleted the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_checks_compare_the_random_part_only() {
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("election-owner");
    let names = Names::new(&harness.config().prefix, &key);
    let lock = harness.lock().await;
    let e = election(harness.lock().await, &key);
    let leading = e.campaign("mine").await.expect("campaign");
    let token: String = admin.get(&names.key).await.expect("GET lock");
    // Another owner's token (other random bits, the same value) is not ours.
    let other = format!(
        "{:032x} mine",
        u128::from_str_radix(&token[..32], 16).unwrap() ^ 1
    );
    let _: () = admin.set(&names.key, &other).await.expect("SET");
    let err = leading
        .lease()
        .extend(Duration::from_secs(10))
        .await
        .expect_err("another owner's key");
    assert_eq!(err.kind(), dlock_core::ErrorKind::NotHeld, "{err}");
    let now: String = admin.get(&names.key).await.expect("GET lock");
    assert_eq!(now, other, "left alone");
    let _: () = admin.del(&names.key).await.expect("DEL");
    drop(leading);
    drop(lock);
}
