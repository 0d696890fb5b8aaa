//! Reentrant holds on ZooKeeper, beyond the conformance scenarios: the owner and count live
//! in the holding node's data and nowhere else, concurrent re-entries from two clients all
//! get the node's token and the key frees exactly after the last release, an owner waiting
//! behind another holder re-enters when the key passes to its owner, and a plain waiter
//! behind an owner hold is not woken by the count's changes.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::ZookeeperHarness;
use common::proxy::{RoundTrips, delaying_proxy};
use dlock_conformance::Harness;
use dlock_core::{DistributedLock, ErrorKind, Lease, LockOptions, Wait};
use futures::future::join_all;
use tokio::time::{sleep, timeout};
use zookeeper_client as zk;

fn key(name: &str) -> String {
    format!("reentry-{}/{name}", uuid::Uuid::new_v4().simple())
}

fn owned(owner: &str) -> LockOptions {
    LockOptions::new()
        .owner(owner)
        .wait(Wait::For(Duration::from_secs(10)))
}

/// The lock nodes in `key`'s directory, with their data.
async fn nodes(harness: &ZookeeperHarness, key: &str) -> Vec<(String, String)> {
    let zk = harness.raw().await.expect("raw client");
    let dir = harness.config().key_dir(key);
    let children = match zk.list_children(&dir).await {
        Err(zk::Error::NoNode) => return Vec::new(),
        children => children.expect("list"),
    };
    let mut nodes = Vec::new();
    for child in children {
        let (data, _) = zk.get_data(&format!("{dir}/{child}")).await.expect("read");
        nodes.push((child, String::from_utf8_lossy(&data).into_owned()));
    }
    nodes
}

async fn is_free(lock: &dyn DistributedLock, key: &str) -> bool {
    match lock
        .try_acquire(key, &LockOptions::new())
        .await
        .expect("try")
    {
        Some(lease) => {
            lease.release().await.expect("release");
            true
        }
        None => false,
    }
}

#[tokio::test]
async fn the_count_lives_in_the_holding_node_and_nowhere_else() {
    let harness = ZookeeperHarness::from_env();
    let lock = harness.must_client().await;
    let key = key("count");
    let opts = owned("job-7");
    let first = lock.acquire(&key, &opts).await.expect("first");
    let second = lock.acquire(&key, &opts).await.expect("second");
    let third = lock.acquire(&key, &opts).await.expect("third");
    let token = first.fencing_token();
    assert!([&second, &third].iter().all(|l| l.fencing_token() == token));
    let found = nodes(&harness, &key).await;
    assert_eq!(found.len(), 1, "one node holds the hold: {found:?}");
    assert!(
        found[0].0.contains("-lock-"),
        "a Curator mutex node: {found:?}"
    );
    assert!(
        found[0].1.starts_with("dlock-owner/1 3 job-7 "),
        "the owner and count are the node's data: {found:?}"
    );
    let status = lock.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders.len(), 1);
    assert_eq!(status.holders[0].fencing_token, Some(token));
    let who = status.holders[0].who.clone().unwrap_or_default();
    assert!(who.starts_with("job-7 (held 3 times) by "), "{who}");
    second.release().await.expect("release");
    assert!(
        nodes(&harness, &key).await[0]
            .1
            .starts_with("dlock-owner/1 2 job-7 ")
    );
    first.release().await.expect("release");
    assert!(!third.is_lost());
    third.release().await.expect("last release");
    assert_eq!(nodes(&harness, &key).await, Vec::new(), "nothing is left");
}

#[tokio::test]
async fn concurrent_reentries_from_two_clients_share_the_token_and_free_after_the_last() {
    const TASKS: usize = 8;
    let harness = ZookeeperHarness::from_env();
    let (a, b, c) = (
        harness.must_client().await,
        harness.must_client().await,
        harness.must_client().await,
    );
    let key = key("concurrent");
    let opts = owned("job-8");
    let first = a.acquire(&key, &opts).await.expect("first");
    let token = first.fencing_token();
    let entries: Vec<_> = (0..2 * TASKS)
        .map(|i| {
            let client = if i % 2 == 0 { a.clone() } else { b.clone() };
            let (key, opts) = (key.clone(), opts);
            tokio::spawn(async move { client.acquire(&key, &opts).await.expect("re-entry") })
        })
        .collect();
    let leases: Vec<Lease> = join_all(entries)
        .await
        .into_iter()
        .map(|l| l.expect("task"))
        .collect();
    assert!(leases.iter().all(|l| l.fencing_token() == token));
    let found = nodes(&harness, &key).await;
    assert_eq!(found.len(), 1, "our queued nodes are gone: {found:?}");
    let count = format!("dlock-owner/1 {} job-8 ", 2 * TASKS + 1);
    assert!(found[0].1.starts_with(&count), "{found:?}");
    first.release().await.expect("release");
    let mut leases = leases;
    let last = leases.pop().expect("a lease");
    let released = join_all(leases.into_iter().map(|l| l.release())).await;
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    assert!(!is_free(&*c, &key).await, "the last lease still counts");
    assert!(!last.is_lost());
    last.release().await.expect("last release");
    assert!(is_free(&*c, &key).await, "free after the last release");
    assert_eq!(nodes(&harness, &key).await, Vec::new());
}

#[tokio::test]
async fn an_owner_waiting_behind_another_holder_reenters_when_its_owner_gets_the_key() {
    let harness = ZookeeperHarness::from_env();
    let (plain, a, b) = (
        harness.must_client().await,
        harness.must_client().await,
        harness.must_client().await,
    );
    let key = key("handoff");
    let blocker = plain
        .acquire(&key, &LockOptions::new())
        .await
        .expect("plain");
    let opts = owned("job-9");
    let spawn = |client: Arc<dyn DistributedLock>| {
        let key = key.clone();
        tokio::spawn(async move { client.acquire(&key, &opts).await.expect("owner") })
    };
    let from_a = spawn(a.clone());
    sleep(Duration::from_millis(200)).await;
    let from_b = spawn(b.clone());
    sleep(Duration::from_millis(200)).await;
    assert_eq!(nodes(&harness, &key).await.len(), 3, "both owners queue");
    blocker.release().await.expect("release");
    let (from_a, from_b) = timeout(Duration::from_secs(5), async {
        (from_a.await.expect("a"), from_b.await.expect("b"))
    })
    .await
    .expect("both get the key at once");
    assert_eq!(from_a.fencing_token(), from_b.fencing_token());
    assert_eq!(nodes(&harness, &key).await.len(), 1, "b's node is gone");
    from_a.release().await.expect("release");
    assert!(!is_free(&*plain, &key).await);
    from_b.release().await.expect("release");
    assert!(is_free(&*plain, &key).await);
}

#[tokio::test]
async fn a_plain_waiter_is_not_woken_by_the_count_and_others_wait() {
    let harness = ZookeeperHarness::from_env();
    let (a, b, waiter) = (
        harness.must_client().await,
        harness.must_client().await,
        harness.must_client().await,
    );
    let key = key("waiter");
    let opts = owned("job-10");
    let first = a.acquire(&key, &opts).await.expect("first");
    let waiting = {
        let (waiter, key) = (waiter.clone(), key.clone());
        tokio::spawn(async move {
            let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(20)));
            waiter.acquire(&key, &opts).await.expect("plain waiter")
        })
    };
    sleep(Duration::from_millis(200)).await;
    for _ in 0..5 {
        let entry = b.acquire(&key, &opts).await.expect("re-entry");
        entry.release().await.expect("release");
    }
    // Another owner, and a try of the same one elsewhere, wait or give up like anyone.
    let other = b
        .try_acquire(&key, &LockOptions::new().owner("job-11"))
        .await;
    assert!(
        other.expect("try").is_none(),
        "another owner does not get in"
    );
    sleep(Duration::from_millis(200)).await;
    assert_eq!(waiter.stats().wakeups, 0, "count changes wake nobody");
    assert!(!waiting.is_finished());
    let held = first.fencing_token();
    first.release().await.expect("release");
    let next = timeout(Duration::from_secs(5), waiting)
        .await
        .expect("handed on")
        .expect("task");
    assert!(next.fencing_token() > held);
    assert_eq!(waiter.stats().wakeups, 1);
    next.release().await.expect("release");
    assert_eq!(nodes(&harness, &key).await, Vec::new());
}

#[tokio::test]
async fn the_first_session_keeps_the_hold_and_its_end_frees_the_key() {
    let harness = ZookeeperHarness::from_env();
    let (b, c) = (harness.must_client().await, harness.must_client().await);
    let key = key("first-session");
    let opts = owned("job-12");
    let a = harness.must_client().await;
    let first = a.acquire(&key, &opts).await.expect("first");
    let from_b = b.acquire(&key, &opts).await.expect("re-entry");
    assert_eq!(from_b.fencing_token(), first.fencing_token());
    // The first client's own lease goes; the hold stays in its session for b's lease.
    first.release().await.expect("release");
    sleep(Duration::from_millis(300)).await;
    assert!(!from_b.is_lost());
    assert!(!is_free(&*c, &key).await);
    // The first client closes: its session's node goes, whatever the count.
    drop(a);
    timeout(Duration::from_secs(5), from_b.lost())
        .await
        .expect("b's lease learns the hold ended");
    assert!(is_free(&*c, &key).await);
    let err = from_b.release().await.expect_err("not held any more");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
}

#[tokio::test]
async fn a_hold_that_ended_elsewhere_is_not_reentered_and_refusals_leave_nothing() {
    let harness = ZookeeperHarness::from_env();
    let (a, b, c) = (
        harness.must_client().await,
        harness.must_client().await,
        harness.must_client().await,
    );
    let key = key("stale");
    let opts = owned("job-13");
    let first = a.acquire(&key, &opts).await.expect("first");
    let old = first.fencing_token();
    let from_b = b.acquire(&key, &opts).await.expect("re-entry");
    // Another owner's try leaves no node behind.
    let refused = c
        .try_acquire(&key, &LockOptions::new().owner("job-14"))
        .await;
    assert!(refused.expect("try").is_none());
    assert_eq!(nodes(&harness, &key).await.len(), 1);
    first.release().await.expect("release");
    from_b
        .release()
        .await
        .expect("the last release, through b, frees the key");
    assert_eq!(nodes(&harness, &key).await, Vec::new());
    // a last saw the hold on a node that is gone: it takes the key anew.
    let again = a.acquire(&key, &opts).await.expect("a new hold");
    assert!(again.fencing_token() > old, "a new hold, a new token");
    let found = nodes(&harness, &key).await;
    assert!(found.len() == 1 && found[0].1.starts_with("dlock-owner/1 1 job-13 "));
    let entry = a.acquire(&key, &opts).await.expect("re-entry");
    assert_eq!(entry.fencing_token(), again.fencing_token());
    entry.release().await.expect("release");
    again.release().await.expect("release");
    assert!(is_free(&*c, &key).await);
    assert_eq!(nodes(&harness, &key).await, Vec::new());
}

/// Round trips, through a proxy that delays each direction by half of `RTT` (see
/// `round_trips.rs` and the crate docs' Reentrant holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_round_trips() {
    const RTT: Duration = Duration::from_millis(200);
    let harness = ZookeeperHarness::from_env();
    let proxy = delaying_proxy(harness.server_addrs()[0], RTT / 2).await;
    let url = harness.url_with_addrs(&[proxy.addr()]);
    let a = harness
        .connect(&url)
        .await
        .expect("client through the proxy");
    let b = harness.connect(&url).await.expect("second client");
    let c = harness.connect(&url).await.expect("third client");
    let key = key("rtt");
    // Make the key directory first, without the proxy.
    let direct = harness.must_client().await;
    let lease = direct.try_acquire(&key, &LockOptions::new()).await;
    lease
        .expect("try")
        .expect("free")
        .release()
        .await
        .expect("release");
    let opts = LockOptions::new().owner("job-rtt");
    let mut trips = RoundTrips::new(RTT, &proxy);
    let raw = harness.raw().await.expect("raw client");
    trips.watch(raw, vec![harness.config().key_dir(&key)]);
    let (first, took) = trips.timed(a.try_acquire(&key, &opts)).await;
    let first = first.expect("try").expect("free");
    trips.check("first acquire, key free", took, 1);
    let (again, took) = trips.timed(a.try_acquire(&key, &opts)).await;
    let again = again.expect("try").expect("re-entry");
    // The client knows the holding node from its grant: `getData`, `setData`.
    trips.check("re-entry, same client", took, 2);
    let (twice, took) = trips.timed(a.try_acquire(&key, &opts)).await;
    let twice = twice.expect("try").expect("re-entry");
    // It wrote the node's count last: `setData` at the version it left.
    trips.check("re-entry, same client again", took, 1);
    let (from_b, took) = trips.timed(b.try_acquire(&key, &opts)).await;
    let from_b = from_b.expect("try").expect("re-entry");
    // A client that never saw the hold queues a node, reads the holder, and re-enters.
    trips.check("re-entry, another client", took, 3);
    let (from_b_again, took) = trips.timed(b.try_acquire(&key, &opts)).await;
    let from_b_again = from_b_again.expect("try").expect("re-entry");
    trips.check("re-entry, another client again", took, 2);
    let (extended, took) = trips.timed(first.extend(Duration::from_secs(30))).await;
    extended.expect("extend");
    trips.check("extend, the node's own session", took, 0);
    let (extended, took) = trips.timed(from_b.extend(Duration::from_secs(30))).await;
    extended.expect("extend");
    trips.check("extend, another session", took, 1);
    let other = LockOptions::new().owner("job-other");
    // From a client that holds nothing (b's own gate would refuse it without a request).
    let (refused, took) = trips.timed(c.try_acquire(&key, &other)).await;
    assert!(refused.expect("try").is_none());
    trips.check("try_acquire, another owner holds it", took, 3);
    // A client writes at the version it last wrote: one round trip, or three when another
    // client wrote since (`setData` refused, `getData`, `setData`).
    let releases = [
        ("release, count 5, after another client wrote", first, 3),
        ("release, count 4", again, 1),
        ("release, count 3", twice, 1),
        (
            "release, count 2, after another client wrote",
            from_b_again,
            3,
        ),
    ];
    for (what, lease, expected) in releases {
        sleep(RTT * 2).await;
        let (released, took) = trips.timed(lease.release()).await;
        released.expect("release");
        trips.check(what, took, expected);
    }
    sleep(RTT * 2).await;
    let (released, took) = trips.timed(from_b.release()).await;
    released.expect("release");
    trips.check("last release (delete at the version it wrote)", took, 1);
    trips.print("round trips");
}
