//! Inspecting on ZooKeeper beyond the suite's scenarios: what the nodes carry (`who`), other
//! clients' nodes, a semaphore's leases and `locks` queue, keys whose directory name is
//! shortened, and that looking writes nothing (see the crate docs' Inspecting).

mod common;

use std::time::{Duration, SystemTime};

use common::ZookeeperHarness;
use common::proxy::delaying_proxy;
use dlock_conformance::Harness;
use dlock_conformance::figures::Figures;
use dlock_core::telemetry::HANDOFFS_TOTAL;
use dlock_core::{DistributedLock, KeyStatus, LockOptions, Mode, Wait, holder_description};
use tokio::time::{Instant, sleep};
use zookeeper_client::{self as zk, CreateMode};

fn prefix() -> String {
    format!("inspect-{}/", uuid::Uuid::new_v4().simple())
}

fn waiting(opts: LockOptions) -> LockOptions {
    opts.wait(Wait::For(Duration::from_secs(30)))
}

/// Inspect `key` until `done`, at most 10 s; the last status either way.
async fn inspect_until(
    lock: &dyn DistributedLock,
    key: &str,
    done: impl Fn(&KeyStatus) -> bool,
) -> KeyStatus {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let status = lock.inspect(key).await.expect("inspect");
        if done(&status) || Instant::now() >= until {
            return status;
        }
        sleep(Duration::from_millis(20)).await;
    }
}

fn waiters(status: &KeyStatus) -> usize {
    status.waiters.as_ref().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn looking_writes_nothing() {
    let harness = ZookeeperHarness::from_env();
    let raw = harness.raw().await.expect("raw client");
    // A base path nobody made yet: inspect and list answer "nothing", and do not make it.
    let root = format!("/dlock-inspect-{}", uuid::Uuid::new_v4().simple());
    let url = dlock_conformance::url_with_option(&harness.url(), &format!("root={root}"));
    let fresh = harness.connect(&url).await.expect("client");
    let status = fresh.inspect("k").await.expect("inspect");
    assert_eq!(status, KeyStatus::new("k", true));
    assert_eq!(fresh.list("").await.expect("list"), Vec::<String>::new());
    assert_eq!(raw.check_stat(&root).await.expect("stat"), None, "{root}");

    // A key never used, in a base path that exists: its directory is not made.
    let lock = harness.must_client().await;
    let (used, unused) = (format!("{}used", prefix()), format!("{}unused", prefix()));
    let lease = lock.try_acquire(&used, &LockOptions::new()).await;
    let lease = lease.expect("try_acquire").expect("free");
    let status = lock.inspect(&unused).await.expect("inspect");
    assert!(!status.is_held() && waiters(&status) == 0, "{status:?}");
    let dir = harness.config().key_dir(&unused);
    assert_eq!(raw.check_stat(&dir).await.expect("stat"), None, "{dir}");
    lease.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_and_waiters_are_named_and_ordered() {
    let harness = ZookeeperHarness::from_env();
    let (a, b, c) = (
        harness.must_client().await,
        harness.must_client().await,
        harness.must_client().await,
    );
    let key = format!("{}k", prefix());
    let before = SystemTime::now() - Duration::from_secs(5);
    let lease = a.acquire(&key, &LockOptions::new()).await.expect("free");
    let take = |lock: std::sync::Arc<dyn DistributedLock>, opts: LockOptions| {
        let key = key.clone();
        tokio::spawn(async move { lock.acquire(&key, &opts).await.expect("waiter") })
    };
    let writer = take(b, waiting(LockOptions::new()));
    inspect_until(&*a, &key, |s| waiters(s) == 1).await;
    let reader = take(c, waiting(LockOptions::new().shared()));
    let status = inspect_until(&*a, &key, |s| waiters(s) == 2).await;

    let me = Some(holder_description().to_owned());
    assert_eq!(status.holders.len(), 1, "{status:?}");
    let holder = &status.holders[0];
    assert_eq!(holder.mode, Mode::Exclusive);
    assert_eq!(holder.fencing_token, Some(lease.fencing_token()));
    assert_eq!(holder.who, me);
    assert_eq!(holder.ttl_left, None, "a session hold");
    let since = holder.since.expect("the node's ctime");
    assert!(since > before && since < SystemTime::now() + Duration::from_secs(5));
    let queue = status.waiters.as_ref().expect("waiters shown");
    let modes: Vec<_> = queue.iter().map(|w| w.mode).collect();
    assert_eq!(modes, [Some(Mode::Exclusive), Some(Mode::Shared)]);
    assert!(queue.iter().all(|w| w.who == me && w.since.is_some()));

    // On the wire: the node carries the description, the directory the key.
    let raw = harness.raw().await.expect("raw client");
    let dir = harness.config().key_dir(&key);
    let (data, _) = raw.get_data(&dir).await.expect("the key directory");
    assert_eq!(data, key.as_bytes());
    let mut nodes = raw.list_children(&dir).await.expect("list");
    nodes.sort_by(|x, y| common::sequence(x).cmp(&common::sequence(y)));
    let (data, _) = raw
        .get_data(&format!("{dir}/{}", nodes[0]))
        .await
        .expect("the holder's node");
    assert_eq!(data, holder_description().as_bytes());

    lease.release().await.expect("release");
    let writer = writer.await.expect("writer");
    let status = inspect_until(&*a, &key, |s| waiters(s) == 0 || s.holders.len() == 1).await;
    assert_eq!(
        status.holders[0].fencing_token,
        Some(writer.fencing_token())
    );
    writer.release().await.expect("release");
    reader
        .await
        .expect("reader")
        .release()
        .await
        .expect("release");
}

/// Curator writes its IP address into its nodes, kazoo (by default) nothing: shown as
/// `who` and as no `who`; other clients' nodes hold and queue as dlock counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_clients_nodes_show_what_they_carry() {
    let harness = ZookeeperHarness::from_env();
    let lock = harness.must_client().await;
    let raw = harness.raw().await.expect("raw client");
    let prefix = prefix();
    let key = format!("{prefix}curator");
    let dir = harness.config().key_dir(&key);
    let container = CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let node = CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    raw.create(&dir, &[], &container).await.expect("dir");
    let curator = format!("{dir}/_c_{}-lock-", uuid::Uuid::new_v4());
    let (_, seq) = raw
        .create(&curator, b"10.1.2.3", &node)
        .await
        .expect("Curator's node");
    let curator = format!("{curator}{seq}");
    let kazoo = format!("{dir}/{}__rlock__", uuid::Uuid::new_v4().simple());
    let (_, seq) = raw.create(&kazoo, &[], &node).await.expect("kazoo's node");
    let kazoo = format!("{kazoo}{seq}");

    let status = lock.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(status.holders[0].who.as_deref(), Some("10.1.2.3"));
    let queue = status.waiters.as_ref().expect("waiters shown");
    assert_eq!(queue.len(), 1, "{status:?}");
    assert_eq!(
        (queue[0].mode, queue[0].who.as_deref()),
        (Some(Mode::Shared), None)
    );
    // A directory without dlock's data is still a key: its name says which.
    assert_eq!(lock.list(&prefix).await.expect("list"), [key.as_str()]);
    for node in [curator, kazoo] {
        raw.delete(&node, None).await.expect("delete");
    }
    let free = inspect_until(&*lock, &key, |s| !s.is_held()).await;
    assert!(!free.is_held() && waiters(&free) == 0, "{free:?}");
}

/// A waiter whose holder lets go before the waiter's watch is set (the waiter's node is
/// queued behind the holder, but its next request finds the holder gone) is still granted
/// after a wait: a hand-off. The waiter's link is slow, so the release always lands between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_gone_before_the_watch_still_counts_a_hand_off() {
    let figures = Figures::installed();
    let harness = ZookeeperHarness::from_env();
    let a = harness.must_client().await;
    let proxy = delaying_proxy(harness.server_addrs()[0], Duration::from_millis(300)).await;
    let url = harness.url_with_addrs(&[proxy.addr()]);
    let b = harness
        .connect(&url)
        .await
        .expect("a client through the proxy");
    let key = format!("{}handoff", prefix());
    let first = a.acquire(&key, &LockOptions::new()).await.expect("free");
    let waiter = {
        let key = key.clone();
        tokio::spawn(async move { b.acquire(&key, &waiting(LockOptions::new())).await })
    };
    // The waiter's node is on the server; its listing is still 300 ms away from it.
    let queued = inspect_until(&*a, &key, |s| waiters(s) == 1).await;
    assert_eq!(waiters(&queued), 1, "{queued:?}");
    first.release().await.expect("release");
    let second = waiter.await.expect("the waiter's task").expect("granted");
    let labels = [
        ("backend", "zookeeper"),
        ("key", key.as_str()),
        ("primitive", "exclusive"),
    ];
    assert_eq!(
        figures.sum(HANDOFFS_TOTAL, &labels, false),
        1.0,
        "the grant after the release is a hand-off"
    );
    second.release().await.expect("release");
}

/// A semaphore: the lease nodes hold, except the one the acquirer holding the `locks` mutex
/// counts with; the `locks` queue waits, first in line first. A hand-off counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_show_leases_as_holders_and_the_mutex_queue_as_waiters() {
    let figures = Figures::installed();
    let harness = ZookeeperHarness::from_env();
    let (a, b, c) = (
        harness.must_client().await,
        harness.must_client().await,
        harness.must_client().await,
    );
    let prefix = prefix();
    let key = format!("{prefix}permits");
    let one = LockOptions::new().permits(1);
    let first = a.acquire(&key, &one).await.expect("free");
    assert_eq!(a.list(&prefix).await.expect("list"), [key.as_str()]);
    let take = |lock: std::sync::Arc<dyn DistributedLock>| {
        let key = key.clone();
        tokio::spawn(async move { lock.acquire(&key, &waiting(one)).await.expect("waiter") })
    };
    let second = take(b);
    inspect_until(&*a, &key, |s| waiters(s) == 1).await;
    let third = take(c);
    let status = inspect_until(&*a, &key, |s| waiters(s) == 2).await;
    assert_eq!(
        status.holders.len(),
        1,
        "the counting waiter's lease is no hold: {status:?}"
    );
    assert_eq!(status.holders[0].fencing_token, Some(first.fencing_token()));
    assert!(matches!(status.holders[0].mode, Mode::Permits(_)));
    let queue = status.waiters.as_ref().expect("waiters shown");
    assert_eq!(queue.len(), 2, "{status:?}");
    assert!(
        queue
            .iter()
            .all(|w| matches!(w.mode, Some(Mode::Permits(_))))
    );

    first.release().await.expect("release");
    let second = second.await.expect("second");
    let status = inspect_until(&*a, &key, |s| waiters(s) == 1).await;
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(
        status.holders[0].fencing_token,
        Some(second.fencing_token())
    );
    let labels = [
        ("backend", "zookeeper"),
        ("key", key.as_str()),
        ("primitive", "permits"),
    ];
    assert!(
        figures.sum(HANDOFFS_TOTAL, &labels, false) >= 1.0,
        "a permit granted after waiting is a hand-off"
    );
    second.release().await.expect("release");
    third
        .await
        .expect("third")
        .release()
        .await
        .expect("release");
    let until = Instant::now() + Duration::from_secs(10);
    while !a.list(&prefix).await.expect("list").is_empty() {
        assert!(
            Instant::now() < until,
            "a released semaphore is still listed"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// A key too long for one path segment is shortened with a digest; its directory's data
/// (the key, written by dlock when it makes the directory) names it for `list`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_keys_are_listed_from_their_directory() {
    let harness = ZookeeperHarness::from_env();
    let lock = harness.must_client().await;
    let prefix = prefix();
    let long = format!("{prefix}{}", "x/".repeat(300));
    let dir = harness.config().key_dir(&long);
    assert!(dir.contains("%%"), "shortened: {dir}");
    let lease = lock.try_acquire(&long, &LockOptions::new()).await;
    let lease = lease.expect("try_acquire").expect("free");
    assert_eq!(lock.list(&prefix).await.expect("list"), [long.as_str()]);
    // Prefixes beyond the directory name's readable part.
    assert_eq!(lock.list(&long).await.expect("list"), [long.as_str()]);
    let other = format!("{prefix}{}y", "x/".repeat(299));
    assert_eq!(lock.list(&other).await.expect("list"), Vec::<String>::new());

    // A shortened directory someone else made, without the key as its data: not listed.
    let raw = harness.raw().await.expect("raw client");
    let foreign = format!("{prefix}{}", "z/".repeat(300));
    let foreign_dir = harness.config().key_dir(&foreign);
    let container = CreateMode::Container.with_acls(zk::Acls::anyone_all());
    let node = CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    raw.create(&foreign_dir, &[], &container)
        .await
        .expect("dir");
    let planted = format!("{foreign_dir}/x-lock-");
    let (_, seq) = raw.create(&planted, &[], &node).await.expect("a lock node");
    assert!(lock.inspect(&foreign).await.expect("inspect").is_held());
    assert_eq!(lock.list(&prefix).await.expect("list"), [long.as_str()]);
    raw.delete(&format!("{planted}{seq}"), None)
        .await
        .expect("delete");
    lease.release().await.expect("release");
}
