//! Permits (counting semaphores) as the server and other clients see them: permit holders
//! are members of the sorted set at the lock key, a release calls only the waiter whose
//! turn it makes, a crashed holder's permit comes back at its own entry's expiry, a free
//! permit promised to a waiter is not taken by a newcomer, and a permit is given back to a
//! node (Redlock's extension) only where one is free.

mod common;

use std::time::Duration;

use common::{
    RedisHarness, forget_fence, server_micros, set_foreign, unique_key, until_queued,
    wait_for_subscribers,
};
use dlock_conformance::testkit::must_take;
use dlock_core::{DistributedLock, Lease, LockOptions, Wait};
use dlock_redis::server::{Names, Node, new_permit_token};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;
use tokio::time::Instant;

fn permits(n: u32) -> LockOptions {
    LockOptions::new().permits(n).ttl(Duration::from_secs(30))
}

/// A permit entry of a holder that crashed: written as the acquire script writes one,
/// expiring `left` from now by the server clock.
async fn ghost_permit(
    admin: &mut MultiplexedConnection,
    names: &Names,
    limit: u32,
    left: Duration,
) {
    let expires = server_micros(admin).await + u64::try_from(left.as_micros()).expect("µs");
    let _: () = admin
        .zadd(&names.key, new_permit_token(limit), expires)
        .await
        .expect("ZADD");
}

/// A permit waiter that crashed at the head of the queue, its entry expiring `left` from
/// now.
async fn ghost_waiter(
    admin: &mut MultiplexedConnection,
    names: &Names,
    limit: u32,
    left: Duration,
) {
    let expires = server_micros(admin).await + u64::try_from(left.as_micros()).expect("µs");
    let token = new_permit_token(limit);
    let _: () = admin.zadd(&names.queue, &token, 0).await.expect("ZADD");
    let _: () = admin
        .zadd(&names.waiters, &token, expires)
        .await
        .expect("ZADD");
    let ms = i64::try_from(left.as_millis()).expect("ms");
    let _: () = admin.pexpire(&names.queue, ms).await.expect("PEXPIRE");
    let _: () = admin.pexpire(&names.waiters, ms).await.expect("PEXPIRE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_holders_are_a_sorted_set_that_plain_set_nx_clients_see_busy() {
    let harness = RedisHarness::from_env();
    let url = harness.url_with_option("prefix=");
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("permits-interop");
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(must_take(&harness.lock_at(&url).await, &key, &permits(3)).await);
    }
    let members: Vec<String> = admin.zrange(&key, 0, -1).await.expect("ZRANGE");
    assert_eq!(members.len(), 2);
    assert!(
        members.iter().all(|m| m.starts_with("p3.")
            && m.split_once(' ').is_some_and(
                |(random, who)| random.len() == 35 && who == dlock_core::holder_description()
            )),
        "{members:?}"
    );
    assert!(
        !set_foreign(&mut admin, &key, 30_000).await,
        "a plain SET NX took a key permit holders hold"
    );
    for lease in held {
        lease.release().await.expect("release");
    }
    let gone: bool = admin.exists(&key).await.expect("EXISTS");
    assert!(!gone, "the last permit's release leaves the key");
    forget_fence(&mut admin, "", &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_release_wakes_only_the_first_waiter_once() {
    const WAITERS: usize = 3;
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("permit-wakeups");
    let names = Names::new(&harness.config().prefix, &key);
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(must_take(&harness.lock().await, &key, &permits(2)).await);
    }
    let mut clients = Vec::new();
    let mut waiters: Vec<JoinHandle<Lease>> = Vec::new();
    for i in 0..WAITERS {
        let client = harness.lock().await;
        clients.push(client.clone());
        let key = key.clone();
        waiters.push(tokio::spawn(async move {
            let wait = permits(2).wait(Wait::For(Duration::from_secs(60)));
            client.acquire(&key, &wait).await.expect("waiter acquires")
        }));
        until_queued(&mut admin, &names, i + 1).await;
    }
    wait_for_subscribers(&mut admin, &names.channel, WAITERS).await;
    let wakeups = || -> u64 { clients.iter().map(|c| c.stats().wakeups).sum() };
    let mut granted = Vec::new();
    for turn in 0..2 {
        held.remove(0).release().await.expect("release");
        // Waiters are served in the order they queued: the first one left gets in.
        let lease = waiters.remove(0).await.expect("waiter");
        granted.push(lease);
        assert_eq!(
            wakeups(),
            turn + 1,
            "each release wakes one waiter, once (after {} releases)",
            turn + 1
        );
        until_queued(&mut admin, &names, WAITERS - 1 - turn as usize).await;
    }
    assert!(
        !waiters[0].is_finished(),
        "the last waiter got in with both permits held"
    );
    granted.remove(0).release().await.expect("release");
    let last = waiters.remove(0).await.expect("waiter");
    assert_eq!(wakeups(), 3);
    for lease in granted.into_iter().chain([last]) {
        lease.release().await.expect("release");
    }
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permit_comes_back_at_its_own_expiry_not_the_keys() {
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("permit-crash");
    let names = Names::new(&harness.config().prefix, &key);
    // A live holder with a long ttl sets the key's expiry; the crashed one's entry ends
    // in 1 s.
    let long = must_take(
        &harness.lock().await,
        &key,
        &LockOptions::new().permits(2).ttl(Duration::from_secs(60)),
    )
    .await;
    ghost_permit(&mut admin, &names, 2, Duration::from_secs(1)).await;
    let waiter = harness.lock().await;
    let asked = Instant::now();
    let lease = waiter
        .acquire(&key, &permits(2).wait(Wait::For(Duration::from_secs(20))))
        .await
        .expect("the crashed holder's permit comes back");
    let took = asked.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "the permit came back after {took:?}, not at its entry's expiry (1 s)"
    );
    assert!(!long.is_lost());
    lease.release().await.expect("release");
    long.release().await.expect("release");
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_does_not_take_a_permit_promised_to_a_waiter() {
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("permit-promised");
    let names = Names::new(&harness.config().prefix, &key);
    let holder = must_take(&harness.lock().await, &key, &permits(2)).await;
    // One permit is free, and a waiter (crashed, its entry alive for 2 s more) is first
    // in line for it.
    ghost_waiter(&mut admin, &names, 2, Duration::from_secs(2)).await;
    let newcomer = harness.lock().await;
    let refused = newcomer.try_acquire(&key, &permits(2)).await.expect("try");
    assert!(
        refused.is_none(),
        "try_acquire took the first waiter's permit"
    );
    // A client with a higher limit counts against its own: it gets in past the waiter.
    let wider = must_take(&newcomer, &key, &permits(3)).await;
    wider.release().await.expect("release");
    // Once the crashed waiter's entry expires, the permit is the next waiter's.
    let asked = Instant::now();
    let lease = newcomer
        .acquire(&key, &permits(2).wait(Wait::For(Duration::from_secs(20))))
        .await
        .expect("the permit frees when the crashed waiter is dropped");
    assert!(
        asked.elapsed() < Duration::from_secs(6),
        "{:?}",
        asked.elapsed()
    );
    lease.release().await.expect("release");
    holder.release().await.expect("release");
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_gives_a_permit_back_only_where_one_is_free() {
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("permit-claim");
    let names = Names::new(&harness.config().prefix, &key);
    let node = Node::new(harness.config(), "redis").expect("node");
    let ttl = Duration::from_secs(30);
    let full = [
        must_take(&harness.lock().await, &key, &permits(2)).await,
        must_take(&harness.lock().await, &key, &permits(2)).await,
    ];
    let lost = new_permit_token(2);
    assert!(
        !node.claim(&names, &lost, ttl, 1).await.expect("claim"),
        "a permit came back to a node whose permits are all taken"
    );
    let [first, second] = full;
    first.release().await.expect("release");
    assert!(node.claim(&names, &lost, ttl, 1).await.expect("claim"));
    let count: usize = admin.zcard(&names.key).await.expect("ZCARD");
    assert_eq!(count, 2);
    assert!(node.release(&names, &lost, true).await.expect("release"));
    second.release().await.expect("release");
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}
