//! Fenced writes on Redis, with tokens from dlock's Redis backend (best-effort fencing).

#![cfg(feature = "redis")]

mod common;

use common::{Handover, unique_name, unreachable};
use dlock::Fencing;
use dlock_fence::{FenceError, redis as fenced};
use redis::aio::MultiplexedConnection;

async fn connect() -> (String, MultiplexedConnection) {
    let url = common::url("DLOCK_REDIS_URL", "redis://127.0.0.1:6379");
    let client =
        redis::Client::open(url.as_str()).unwrap_or_else(|e| unreachable("Redis", "redis", e));
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .unwrap_or_else(|e| unreachable("Redis", "redis", e));
    (url, conn)
}

/// dlock-redis's fence counter of `key` (`{<prefix><key>}:fence`, its docs' key table), under
/// the URL's `prefix` option (raw) or the default `dlock:`.
fn fence_counter(url: &str, key: &str) -> String {
    let query = url.split_once('?').map_or("", |(_, q)| q);
    let prefix = query
        .split('&')
        .find_map(|pair| pair.strip_prefix("prefix="))
        .unwrap_or("dlock:");
    format!("{{{prefix}{key}}}:fence")
}

async fn delete(conn: &mut MultiplexedConnection, key: &str) {
    let _: i64 = redis::cmd("DEL")
        .arg(key)
        .query_async(conn)
        .await
        .expect("DEL");
}

#[tokio::test]
async fn the_late_write_of_a_holder_that_lost_its_lease_is_refused() {
    let (url, mut conn) = connect().await;
    let (lock_key, data) = (unique_name(), unique_name());
    let handover = Handover::after_lost_lease(&url, "Redis", "redis", &lock_key).await;
    assert!(matches!(
        handover.capabilities.fencing,
        Fencing::BestEffort { .. }
    ));
    let (stale, newer) = (
        handover.stale.fencing_token(),
        handover.newer.fencing_token(),
    );
    // Best effort still orders successive holders while the server's state survives.
    assert!(stale < newer, "stale {stale}, newer {newer}");

    fenced::set(&mut conn, &data, "newer", newer)
        .await
        .expect("the newer holder writes");
    let late = fenced::set(&mut conn, &data, "stale", stale).await;

    assert!(
        matches!(late, Err(FenceError::StaleToken { token, stored }) if token == stale && stored == newer),
        "{late:?}"
    );
    let kept: Option<(String, u64)> = fenced::get(&mut conn, &data).await.expect("read back");
    assert_eq!(kept, Some(("newer".to_owned(), newer)));
    delete(&mut conn, &data).await;
    handover.finish().await;
    delete(&mut conn, &fence_counter(&url, &lock_key)).await;
}

/// A restart without persistence loses the fence counter; dlock floors the next token by
/// the server clock, so (while that clock does not step back) the next holder still
/// outranks the paused one and the check still refuses the late write.
#[tokio::test]
async fn the_late_write_is_refused_even_after_the_fence_counter_was_lost() {
    let (url, mut conn) = connect().await;
    let (lock_key, data) = (unique_name(), unique_name());
    let first = dlock::connect(&url)
        .await
        .unwrap_or_else(|e| unreachable("Redis", "redis", e));
    let paused = dlock::LockOptions::new()
        .ttl(std::time::Duration::from_secs(1))
        .auto_renew(false);
    let stale_lease = first
        .try_acquire(&lock_key, &paused)
        .await
        .expect("acquire")
        .expect("free");
    // What a restart without persistence does to the counter (named in dlock-redis's docs).
    delete(&mut conn, &fence_counter(&url, &lock_key)).await;
    let handover_wait = dlock::LockOptions::new()
        .ttl(std::time::Duration::from_secs(30))
        .wait(dlock::Wait::For(std::time::Duration::from_secs(30)));
    let second = dlock::connect(&url)
        .await
        .unwrap_or_else(|e| unreachable("Redis", "redis", e));
    let newer_lease = second
        .acquire(&lock_key, &handover_wait)
        .await
        .expect("acquire after expiry");
    let (stale, newer) = (stale_lease.fencing_token(), newer_lease.fencing_token());
    assert!(stale < newer, "stale {stale}, newer {newer}");

    fenced::set(&mut conn, &data, "newer", newer)
        .await
        .expect("the newer holder writes");
    let late = fenced::set(&mut conn, &data, "stale", stale).await;

    assert!(late.as_ref().is_err_and(FenceError::is_stale), "{late:?}");
    delete(&mut conn, &data).await;
    newer_lease.release().await.expect("release");
    delete(&mut conn, &fence_counter(&url, &lock_key)).await;
}

#[tokio::test]
async fn an_equal_token_is_refused_only_a_larger_one_writes() {
    let (_, mut conn) = connect().await;
    let data = unique_name();
    fenced::set(&mut conn, &data, "first", 5)
        .await
        .expect("first write");

    let equal = fenced::set(&mut conn, &data, "again", 5).await;
    let smaller = fenced::set(&mut conn, &data, "older", 4).await;
    // 10 is shorter than 9 as text but larger as a number.
    fenced::set(&mut conn, &data, "larger", 10)
        .await
        .expect("a larger token writes");

    assert!(
        matches!(
            equal,
            Err(FenceError::StaleToken {
                token: 5,
                stored: 5
            })
        ),
        "{equal:?}"
    );
    assert!(
        matches!(
            smaller,
            Err(FenceError::StaleToken {
                token: 4,
                stored: 5
            })
        ),
        "{smaller:?}"
    );
    let kept: Option<(String, u64)> = fenced::get(&mut conn, &data).await.expect("read back");
    assert_eq!(kept, Some(("larger".to_owned(), 10)));
    delete(&mut conn, &data).await;
}
