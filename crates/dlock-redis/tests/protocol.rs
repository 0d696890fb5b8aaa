//! The protocol as other clients of the server see it: key names, tokens, the fence
//! counter, sharing a key with another library's lock, and the script cache.

mod common;

use std::time::Duration;

use common::{RedisHarness, forget_fence, set_foreign, unique_key};
use dlock_core::{DistributedLock, ErrorKind, LockOptions, Wait};
use dlock_redis::server::Names;
use redis::AsyncCommands;
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_tokens_and_the_fence_counter_are_as_documented() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("names");
    let names = Names::new(&harness.config().prefix, &key);
    assert_eq!(names.key, format!("{}{key}", harness.config().prefix));
    let ttl = Duration::from_secs(5);
    let lease = lock
        .try_acquire(&key, &LockOptions::new().ttl(ttl))
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let token: String = admin.get(&names.key).await.expect("GET lock");
    // 128 random bits in hex, a space, and the holder's NAME@HOST:PID.
    let (random, who) = token.split_once(' ').expect("random bits, then the holder");
    assert_eq!(random.len(), 32, "{token}");
    assert!(random.chars().all(|c| c.is_ascii_hexdigit()), "{token}");
    assert_eq!(who, dlock_core::holder_description(), "{token}");
    let status = lock.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders[0].who.as_deref(), Some(who), "{status:?}");
    assert_eq!(status.holders[0].fencing_token, Some(lease.fencing_token()));
    let pttl: i64 = admin.pttl(&names.key).await.expect("PTTL lock");
    assert!((1..=5000).contains(&pttl), "lock pttl {pttl}");
    let fence: u64 = admin.get(&names.fence).await.expect("GET fence");
    assert_eq!(fence, lease.fencing_token());
    let fence_pttl: i64 = admin.pttl(&names.fence).await.expect("PTTL fence");
    assert!(
        fence_pttl > 3_600_000,
        "the fence counter should outlive the ttl by an hour: {fence_pttl}"
    );
    // The token is floored by the server clock (µs since the epoch).
    let (secs, _): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut admin)
        .await
        .expect("TIME");
    let now_us = secs * 1_000_000;
    assert!(
        fence + 60_000_000 > now_us && fence < now_us + 60_000_000,
        "token {fence} is not near the server time {now_us} µs"
    );
    lease.release().await.expect("release");
    let gone: Option<String> = admin.get(&names.key).await.expect("GET lock");
    assert_eq!(gone, None);
    let _: () = admin.del(&names.fence).await.expect("DEL fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_when_the_counter_is_lost() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("fence-lost");
    let names = Names::new(&harness.config().prefix, &key);
    let mut last = 0;
    for _ in 0..5 {
        let lease = lock
            .acquire(&key, &LockOptions::new())
            .await
            .expect("acquire");
        assert!(
            lease.fencing_token() > last,
            "{} after {last}",
            lease.fencing_token()
        );
        last = lease.fencing_token();
        lease.release().await.expect("release");
        // As a restart without persistence would: the counter is gone.
        let _: () = admin.del(&names.fence).await.expect("DEL fence");
    }
}

/// A counter ahead of the server clock (a clock stepped back, tokens handed out faster
/// than one per µs) is not overwritten by the clock: the next token is the counter's + 1,
/// and the counter keeps its hour past the ttl.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_ahead_of_the_clock_still_rises_by_one() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("fence-ahead");
    let names = Names::new(&harness.config().prefix, &key);
    // Far ahead of any server clock (µs of the year 2096), and exact in a Lua number.
    let ahead: u64 = 4_000_000_000_000_000;
    let _: () = admin.set(&names.fence, ahead).await.expect("SET fence");
    for expected in [ahead + 1, ahead + 2] {
        let lease = lock
            .acquire(&key, &LockOptions::new())
            .await
            .expect("acquire");
        assert_eq!(lease.fencing_token(), expected);
        let counter: u64 = admin.get(&names.fence).await.expect("GET fence");
        assert_eq!(counter, expected, "the counter holds the token handed out");
        let pttl: i64 = admin.pttl(&names.fence).await.expect("PTTL fence");
        assert!(pttl > 3_600_000, "the counter outlives the ttl: {pttl}");
        lease.release().await.expect("release");
    }
    let _: () = admin.del(&names.fence).await.expect("DEL fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_prefix_shares_the_key_with_another_librarys_lock() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock_at(&harness.url_with_option("prefix=")).await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("foreign");
    // Another library (redis-py, redsync, node-redlock) holds the same name.
    let foreign_ttl = Duration::from_millis(800);
    assert!(set_foreign(&mut admin, &key, foreign_ttl.as_millis() as u64).await);
    let started = Instant::now();
    assert!(
        lock.try_acquire(&key, &LockOptions::new())
            .await
            .expect("try_acquire")
            .is_none(),
        "the other library's lock must exclude ours"
    );
    // Their release announces nothing: our waiter wakes when their ttl runs out.
    let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(10)));
    let lease = lock
        .acquire(&key, &opts)
        .await
        .expect("acquire after their ttl");
    let took = started.elapsed();
    assert!(
        took + Duration::from_millis(50) >= foreign_ttl
            && took < foreign_ttl + Duration::from_secs(2),
        "acquired {took:?} after a foreign lock of {foreign_ttl:?}"
    );
    let ours: String = admin.get(&key).await.expect("GET");
    assert_ne!(ours, "their-token");
    // Our lock excludes theirs in turn.
    assert!(!set_foreign(&mut admin, &key, 1000).await);
    lease.release().await.expect("release");
    forget_fence(&mut admin, "", &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_without_expiry_is_rechecked() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock_at(&harness.url_with_option("prefix=")).await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("no-expiry");
    let _: () = admin.set(&key, "their-token").await.expect("SET");
    let waiter = {
        let (lock, key) = (lock.clone(), key.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(20)));
            let lease = lock
                .acquire(&key, &opts)
                .await
                .expect("acquire once they delete it");
            (Instant::now(), lease)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Their release: a plain DEL, no announcement.
    let deleted = Instant::now();
    let _: () = admin.del(&key).await.expect("DEL");
    let (acquired, lease) = waiter.await.expect("waiter");
    let took = acquired.saturating_duration_since(deleted);
    assert!(
        took < Duration::from_secs(3),
        "re-checked {took:?} after the delete"
    );
    lease.release().await.expect("release");
    forget_fence(&mut admin, "", &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_a_script_flush() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("noscript");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .expect("SCRIPT FLUSH");
    let lease = lock
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("acquire after NOSCRIPT")
        .expect("free");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .expect("SCRIPT FLUSH");
    lease
        .extend(Duration::from_secs(10))
        .await
        .expect("extend after NOSCRIPT");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut admin)
        .await
        .expect("SCRIPT FLUSH");
    lease.release().await.expect("release after NOSCRIPT");
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_to_a_plain_server_fails_fast_with_a_typed_error() {
    let harness = RedisHarness::from_env();
    let addr = harness.config().addr();
    let started = Instant::now();
    let err = dlock_redis::from_url(&format!("rediss://{addr}?connect_timeout=2s"))
        .await
        .expect_err("a plain server does not speak TLS");
    assert!(
        matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Backend),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_an_empty_prefix_no_key_reaches_another_locks_fence_counter() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock_at(&harness.url_with_option("prefix=")).await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("victim");
    let victim = Names::new("", &key);
    let lease = lock
        .try_acquire(&key, &LockOptions::new().ttl(Duration::from_secs(5)))
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let fence: u64 = admin.get(&victim.fence).await.expect("GET fence");
    // The key that would be the victim's fence counter is refused before any I/O.
    let err = lock
        .try_acquire(&victim.fence, &LockOptions::new())
        .await
        .expect_err("a fence-shaped key is refused");
    assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
    let after: u64 = admin.get(&victim.fence).await.expect("GET fence");
    assert_eq!(after, fence, "the victim's counter is untouched");
    lease.release().await.expect("release");
    let _: () = admin.del(&victim.fence).await.expect("DEL fence");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_of_another_kind_is_named_as_such() {
    let url = format!("redis://{}", common::not_redis_server());
    let err = dlock_redis::from_url(&url)
        .await
        .expect_err("an HTTP server is not Redis");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    let text = err.to_string();
    assert!(text.contains("did not answer as Redis"), "{text}");
    assert!(!text.contains('\n'), "one line, not the parser's: {text}");
}
