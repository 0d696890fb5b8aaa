//! Losing the server or the connection while a lease is held.

mod common;

use std::time::Duration;

use common::{RedisHarness, forget_fence, unique_key, wait_for_subscriber};
use dlock_conformance::{Harness, Proxy};
use dlock_core::{DistributedLock, ErrorKind, LockOptions, LostReason, Wait};
use dlock_redis::server::Names;
use redis::AsyncCommands;
use tokio::time::{Instant, timeout};

/// The server goes away (every connection closed, new ones refused): `lost()` fires before
/// the key expires on the server, so before anyone else can take it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_before_the_key_expires_when_the_server_goes_away() {
    let harness = RedisHarness::from_env();
    let proxy = Proxy::start(harness.server_addrs()[0])
        .await
        .expect("proxy");
    let holder = harness
        .lock_at(&harness.url_with_addrs(&[proxy.addr()]))
        .await;
    let other = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("server-gone");
    let names = Names::new(&harness.config().prefix, &key);
    let ttl = Duration::from_secs(2);
    let lease = holder
        .try_acquire(&key, &LockOptions::new().ttl(ttl))
        .await
        .expect("try_acquire")
        .expect("free");
    // Let one renewal go through, then take the server away.
    tokio::time::sleep(ttl / 2).await;
    assert!(!lease.is_lost());
    drop(proxy);
    let gone = Instant::now();
    let reason = timeout(ttl * 2, lease.lost())
        .await
        .expect("lost() fires within the ttl");
    let lost_at = Instant::now();
    assert!(matches!(reason, LostReason::Unreachable(_)), "{reason}");
    assert!(
        lost_at - gone <= ttl,
        "lost() fired {:?} after the server went away (ttl {ttl:?})",
        lost_at - gone
    );
    // The server still had the key when the holder was told.
    let pttl: i64 = admin.pttl(&names.key).await.expect("PTTL");
    assert!(
        pttl > 0,
        "the key expired before lost() fired (pttl {pttl})"
    );
    let next = other
        .acquire(
            &key,
            &LockOptions::new().wait(Wait::For(Duration::from_secs(10))),
        )
        .await
        .expect("the key frees after its ttl");
    assert!(Instant::now() > lost_at);
    next.release().await.expect("release");
    assert!(lease.release().await.is_err());
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

/// Every connection of a holder and a waiter is reset (as `CLIENT KILL` or a server-side
/// timeout would): the holder reconnects and keeps its lease, the waiter subscribes again
/// and is still woken by the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_connections_are_reopened_and_the_lease_kept() {
    let harness = RedisHarness::from_env();
    let proxy = Proxy::start(harness.server_addrs()[0])
        .await
        .expect("proxy");
    let url = harness.url_with_addrs(&[proxy.addr()]);
    let holder = harness.lock_at(&url).await;
    let waiter = harness.lock_at(&url).await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("reset");
    let names = Names::new(&harness.config().prefix, &key);
    let ttl = Duration::from_secs(1);
    let lease = holder
        .try_acquire(&key, &LockOptions::new().ttl(ttl))
        .await
        .expect("try_acquire")
        .expect("free");
    let task = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(ttl)
                .wait(Wait::For(Duration::from_secs(30)));
            let lease = waiter
                .acquire(&key, &opts)
                .await
                .expect("the waiter acquires");
            (Instant::now(), lease)
        })
    };
    wait_for_subscriber(&mut admin, &names.channel).await;
    // Reset every connection through the proxy: held silently, then closed.
    proxy.cut();
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.heal();
    // The lease survives several renewals on new connections.
    tokio::time::sleep(ttl * 3).await;
    assert!(
        !lease.is_lost(),
        "the lease was lost after a connection reset: {lease:?}"
    );
    assert!(!task.is_finished(), "the waiter took a held key");
    // The waiter listens again (on a new subscriber connection) and is woken by the release.
    wait_for_subscriber(&mut admin, &names.channel).await;
    let released = Instant::now();
    lease.release().await.expect("release on a new connection");
    let (acquired, next) = task.await.expect("waiter task");
    let handoff = acquired.saturating_duration_since(released);
    assert!(
        handoff < Duration::from_millis(500),
        "hand-off after the reset took {handoff:?}"
    );
    next.release().await.expect("release");
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

/// A waiting acquire ends at its deadline even when the attempt it makes on waking meets a
/// server that went silent: the deadline, not the response timeout (2 s), bounds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_ends_at_its_deadline_when_the_server_goes_silent() {
    let harness = RedisHarness::from_env();
    let holder = harness.lock().await;
    let key = unique_key("silent-wait");
    let proxy = Proxy::start(harness.server_addrs()[0])
        .await
        .expect("proxy");
    let waiter = harness
        .lock_at(&harness.url_with_addrs(&[proxy.addr()]))
        .await;
    // Held for 400 ms without renewal: the waiter wakes by its ttl timer and tries again.
    let lease = holder
        .try_acquire(
            &key,
            &LockOptions::new()
                .ttl(Duration::from_millis(400))
                .auto_renew(false),
        )
        .await
        .expect("try_acquire")
        .expect("free");
    let started = Instant::now();
    let wait = tokio::spawn(async move {
        waiter
            .acquire(
                &key,
                &LockOptions::new().wait(Wait::For(Duration::from_millis(900))),
            )
            .await
            .map(|lease| lease.fencing_token())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    proxy.cut();
    let result = wait.await.expect("the waiting task");
    let took = started.elapsed();
    let err = result.expect_err("the server went silent before the key freed");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        took < Duration::from_millis(1_600),
        "the wait outlived its 900 ms deadline: {took:?}"
    );
    drop(lease);
}
