//! Shared holds on ZooKeeper beyond the contract: Curator's `InterProcessReadWriteLock`
//! node names on the wire (dlock readers make `__READ__` nodes; a `__WRIT__` node, as
//! Curator's write lock makes it, excludes dlock readers and writers; with
//! `curator=read_write_lock` dlock writers make such nodes), and the wake-ups of a release
//! that admits several readers.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::ZookeeperHarness;
use dlock_conformance::Harness;
use dlock_core::{DistributedLock, LockOptions, Wait};
use dlock_zookeeper::CuratorRecipe;
use tokio::time::{Instant, sleep, timeout};
use zookeeper_client::{self as zk, CreateMode};

fn key(name: &str) -> String {
    format!("rw-{}/{name}", uuid::Uuid::new_v4().simple())
}

async fn connect(harness: &ZookeeperHarness) -> Arc<dyn DistributedLock> {
    harness.must_client().await
}

fn waiting() -> LockOptions {
    LockOptions::new().wait(Wait::For(Duration::from_secs(30)))
}

/// The children of `key`'s directory.
async fn children(harness: &ZookeeperHarness, raw: &zk::Client, key: &str) -> Vec<String> {
    match raw.list_children(&harness.config().key_dir(key)).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {key}: {e}"),
    }
}

/// Wait until `key`'s directory holds `n` lock nodes.
async fn wait_for_nodes(harness: &ZookeeperHarness, raw: &zk::Client, key: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let count = children(harness, raw, key).await.len();
        if count == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} holds {count} nodes, expected {n}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// Create, on `raw`'s session, the node Curator's read-write lock makes for `tag`
/// (`__WRIT__` or `__READ__`): `_c_{uuid}-{tag}{seq}`, ephemeral-sequential. The key's
/// directory must exist.
async fn curator_node(
    harness: &ZookeeperHarness,
    raw: &zk::Client,
    key: &str,
    tag: &str,
) -> String {
    let dir = harness.config().key_dir(key);
    let prefix = format!("{dir}/_c_{}-{tag}", uuid::Uuid::new_v4());
    let mode = CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
    let (_, sequence) = raw.create(&prefix, &[], &mode).await.expect("create");
    format!("{prefix}{sequence}")
}

/// Take and release `key` once: its directory exists then, as after any first acquire.
async fn make_key_dir(lock: &dyn dlock_core::DistributedLock, key: &str) {
    let first = lock
        .try_acquire(key, &LockOptions::new())
        .await
        .expect("try_acquire");
    first
        .expect("a fresh key is free")
        .release()
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_make_curator_read_nodes_and_writers_keep_the_mutex_name() {
    let harness = ZookeeperHarness::from_env();
    let raw = harness.raw().await.expect("raw client");
    let lock = connect(&harness).await;
    let key = key("names");
    let reader = lock
        .try_acquire(&key, &LockOptions::new().shared())
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let names = children(&harness, &raw, &key).await;
    reader.release().await.expect("release");
    let reads: Vec<_> = names.iter().filter(|n| n.contains("-__READ__")).collect();
    assert!(
        names.len() == 1 && reads.len() == 1 && names[0].starts_with("_c_"),
        "a shared hold's node: {names:?} (expected one `_c_{{uuid}}-__READ__{{seq}}`)"
    );
    let writer = lock
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("try_acquire")
        .expect("the key is free again");
    let names = children(&harness, &raw, &key).await;
    writer.release().await.expect("release");
    assert!(
        names.len() == 1 && names[0].starts_with("_c_") && names[0].contains("-lock-"),
        "an exclusive hold's node: {names:?} (expected one `_c_{{uuid}}-lock-{{seq}}`)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_write_node_excludes_readers_and_writers_until_deleted() {
    let harness = ZookeeperHarness::from_env();
    let raw = harness.raw().await.expect("raw client");
    let lock = connect(&harness).await;
    let key = key("curator-writer");
    make_key_dir(&*lock, &key).await;
    let curator_writer = curator_node(&harness, &raw, &key, "__WRIT__").await;

    let read_refused = lock
        .try_acquire(&key, &LockOptions::new().shared())
        .await
        .expect("try");
    let write_refused = lock
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("try");
    let reader = {
        let (lock, key) = (lock.clone(), key.clone());
        tokio::spawn(async move { lock.acquire(&key, &waiting().shared()).await })
    };
    wait_for_nodes(&harness, &raw, &key, 2).await;
    let released = Instant::now();
    raw.delete(&curator_writer, None)
        .await
        .expect("delete the writer's node");
    let lease = timeout(Duration::from_secs(10), reader)
        .await
        .expect("the reader is admitted within 10 s of the writer's release")
        .expect("task")
        .expect("acquire");
    let admitted = released.elapsed();
    lease.release().await.expect("release");
    assert!(
        read_refused.is_none() && write_refused.is_none() && admitted < Duration::from_secs(5),
        "a Curator writer held: shared try {}, exclusive try {}; reader admitted {admitted:?} after its release",
        read_refused.is_some(),
        write_refused.is_some(),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_read_node_shares_with_readers_and_excludes_writers() {
    let harness = ZookeeperHarness::from_env();
    let raw = harness.raw().await.expect("raw client");
    let lock = connect(&harness).await;
    let key = key("curator-reader");
    make_key_dir(&*lock, &key).await;
    let curator_reader = curator_node(&harness, &raw, &key, "__READ__").await;

    let reader = lock
        .try_acquire(&key, &LockOptions::new().shared())
        .await
        .expect("try");
    let reader_shared = reader.is_some();
    if let Some(lease) = reader {
        lease.release().await.expect("release");
    }
    let writer_refused = lock
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("try");
    raw.delete(&curator_reader, None)
        .await
        .expect("delete the reader's node");
    assert!(
        reader_shared && writer_refused.is_none(),
        "with a Curator reader holding: shared try held {reader_shared}, exclusive try held {}",
        writer_refused.is_some()
    );
}

/// A writer's release admits the three readers queued behind it and wakes exactly those:
/// the writer queued behind the readers is not woken by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_admits_readers_wakes_only_those_readers() {
    const READERS: usize = 3;
    let harness = ZookeeperHarness::from_env();
    let raw = harness.raw().await.expect("raw client");
    let key = key("wakeups");
    let holder = connect(&harness).await;
    let writer = holder
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let mut readers = Vec::new();
    let mut reader_clients = Vec::new();
    for i in 0..READERS {
        let (client, reader_key) = (connect(&harness).await, key.clone());
        reader_clients.push(client.clone());
        readers.push(tokio::spawn(async move {
            client.acquire(&reader_key, &waiting().shared()).await
        }));
        wait_for_nodes(&harness, &raw, &key, i + 2).await;
    }
    let next_writer_client = connect(&harness).await;
    let next_writer = {
        let (client, key) = (next_writer_client.clone(), key.clone());
        tokio::spawn(async move { client.acquire(&key, &waiting()).await })
    };
    wait_for_nodes(&harness, &raw, &key, READERS + 2).await;

    writer.release().await.expect("release");
    let mut leases = Vec::new();
    for reader in readers {
        let lease = timeout(Duration::from_secs(10), reader)
            .await
            .expect("every reader is admitted within 10 s")
            .expect("task")
            .expect("acquire");
        leases.push(lease);
    }
    // Give a (wrongly) woken writer time to be counted.
    sleep(Duration::from_millis(200)).await;
    let readers_woken: u64 = reader_clients.iter().map(|c| c.stats().wakeups).sum();
    let writer_woken = next_writer_client.stats().wakeups;
    for lease in leases {
        lease.release().await.expect("release");
    }
    let next = timeout(Duration::from_secs(10), next_writer)
        .await
        .expect("the writer follows the readers")
        .expect("task")
        .expect("acquire");
    next.release().await.expect("release");
    assert_eq!(
        (readers_woken, writer_woken),
        (READERS as u64, 0),
        "wake-ups of the release that admitted {READERS} readers (readers, queued writer)"
    );
}

/// Curator's read lock rule, as its `InterProcessReadWriteLock` applies it to `children`:
/// order every child by the text after the last `__READ__` or `__WRIT__` (the whole name
/// when neither occurs), and hold when no child containing `__WRIT__` is before `ours`.
fn curator_reader_holds(children: &[String], ours: &str) -> bool {
    let sort_key = |name: &str| {
        let cut = ["__READ__", "__WRIT__"]
            .iter()
            .filter_map(|tag| name.rfind(tag).map(|i| i + tag.len()))
            .max();
        cut.map_or(name, |i| &name[i..]).to_owned()
    };
    let mut order: Vec<&String> = children.iter().collect();
    order.sort_by_key(|name| sort_key(name));
    order
        .iter()
        .take_while(|name| name.as_str() != ours)
        .all(|name| !name.contains("__WRIT__"))
}

/// With `curator=read_write_lock`, a dlock writer makes Curator's write-lock node, and a
/// Curator reader that queues after it is ordered behind it and waits, as Curator would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_curator_read_write_lock_a_writer_makes_a_curator_write_node_readers_wait_for() {
    let harness = ZookeeperHarness::from_env();
    let raw = harness.raw().await.expect("raw client");
    let url = dlock_conformance::url_with_option(&harness.url(), "curator=read_write_lock");
    let lock = dlock_zookeeper::from_url(&url).await.expect("connect");
    assert_eq!(
        lock.backend().config().curator,
        CuratorRecipe::ReadWriteLock
    );
    let key = key("curator-rw-writer");
    let writer = lock
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");
    let ours = children(&harness, &raw, &key).await;
    let curator_reader = curator_node(&harness, &raw, &key, "__READ__").await;
    let reader_name = curator_reader
        .rsplit('/')
        .next()
        .expect("a name")
        .to_owned();
    let both = children(&harness, &raw, &key).await;
    let waits_behind_writer = !curator_reader_holds(&both, &reader_name);
    writer.release().await.expect("release");
    let after_release = children(&harness, &raw, &key).await;
    let holds_after_release = curator_reader_holds(&after_release, &reader_name);
    raw.delete(&curator_reader, None)
        .await
        .expect("delete the reader's node");
    assert!(
        ours.len() == 1
            && ours[0].starts_with("_c_")
            && ours[0].contains("-__WRIT__")
            && waits_behind_writer
            && holds_after_release,
        "writer's node {ours:?} (expected one `_c_{{uuid}}-__WRIT__{{seq}}`); a Curator reader \
         queued after it: waits {waits_behind_writer} in {both:?}, holds once it is released \
         {holds_after_release} in {after_release:?}"
    );
}
