//! Permits on ZooKeeper beyond the contract: the layout of Curator's
//! `InterProcessSemaphoreV2` on the wire (`locks` and `leases` under the key directory,
//! Curator's node names, container directories), and dlock and Curator holders of one
//! path counting each other's permits. There is no JVM here: [`CuratorSemaphore`] makes
//! the nodes Curator makes, in Curator's order, on a raw session.

mod common;

use std::time::Duration;

use common::ZookeeperHarness;
use dlock_core::{LockOptions, Wait};
use tokio::time::{Instant, sleep, timeout};
use zookeeper_client::{self as zk, CreateMode};

fn key(name: &str) -> String {
    format!("sem-{}/{name}", uuid::Uuid::new_v4().simple())
}

fn permits(n: u32) -> LockOptions {
    LockOptions::new().permits(n)
}

/// The children of `path`, none when it is missing.
async fn children(raw: &zk::Client, path: &str) -> Vec<String> {
    match raw.list_children(path).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {path}: {e}"),
    }
}

/// Curator's `InterProcessSemaphoreV2(client, path, max_leases)`, step by step as its
/// `internalAcquire1Lease` runs: hold the `InterProcessMutex` on `{path}/locks`, create an
/// ephemeral-sequential protected `lease-` node in `{path}/leases` (parents made as
/// containers), list `leases` with a watch until it has at most `max_leases` children,
/// then release the mutex. A lease is returned by deleting its node.
struct CuratorSemaphore {
    raw: zk::Client,
    path: String,
    max_leases: usize,
}

impl CuratorSemaphore {
    /// Create `{parent}/_c_{uuid}-{name}` ephemeral-sequential, making missing parents as
    /// containers (`creatingParentContainersIfNeeded().withProtection()`).
    async fn create_protected(&self, parent: &str, name: &str) -> String {
        let path = format!("{parent}/_c_{}-{name}", uuid::Uuid::new_v4());
        let node = CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let container = CreateMode::Container.with_acls(zk::Acls::anyone_all());
        loop {
            match self.raw.create(&path, &[], &node).await {
                Ok((_, sequence)) => return format!("{path}{sequence}"),
                Err(zk::Error::NoNode) => {
                    for dir in [self.path.as_str(), parent] {
                        match self.raw.create(dir, &[], &container).await {
                            Ok(_) | Err(zk::Error::NodeExists) => {}
                            Err(e) => panic!("create {dir}: {e}"),
                        }
                    }
                }
                Err(e) => panic!("create {path}: {e}"),
            }
        }
    }

    /// The `InterProcessMutex` on `{path}/locks`: our node, then until it is the lowest
    /// by the sequence after `lock-`, a watch on the one before it.
    async fn lock(&self) -> String {
        let locks = format!("{}/locks", self.path);
        let ours = self.create_protected(&locks, "lock-").await;
        let seq = |name: &str| name.rsplit("lock-").next().unwrap_or_default().to_owned();
        loop {
            let mut order = children(&self.raw, &locks).await;
            order.sort_by_key(|name| seq(name));
            let at = order
                .iter()
                .position(|n| ours.ends_with(n.as_str()))
                .expect("our lock node is listed");
            if at == 0 {
                return ours;
            }
            match self
                .raw
                .get_and_watch_data(&format!("{locks}/{}", order[at - 1]))
                .await
            {
                Ok((_, _, watcher)) => {
                    watcher.changed().await;
                }
                Err(zk::Error::NoNode) => {}
                Err(e) => panic!("watch: {e}"),
            }
        }
    }

    /// Take one lease; returns its node's path.
    async fn acquire(&self) -> String {
        let lock = self.lock().await;
        let leases = format!("{}/leases", self.path);
        let lease = self.create_protected(&leases, "lease-").await;
        loop {
            let (children, watcher) = self
                .raw
                .list_and_watch_children(&leases)
                .await
                .expect("list leases");
            assert!(children.iter().any(|c| lease.ends_with(c.as_str())));
            if children.len() <= self.max_leases {
                break;
            }
            watcher.changed().await;
        }
        self.raw
            .delete(&lock, None)
            .await
            .expect("release the mutex");
        lease
    }

    async fn release(&self, lease: &str) {
        self.raw
            .delete(lease, None)
            .await
            .expect("return the lease");
    }
}

async fn curator(harness: &ZookeeperHarness, key: &str, max_leases: usize) -> CuratorSemaphore {
    CuratorSemaphore {
        raw: harness.raw().await.expect("raw client"),
        path: harness.config().key_dir(key),
        max_leases,
    }
}

/// dlock counts Curator's leases and Curator counts dlock's; both queue on the same
/// `locks` mutex, so a Curator acquirer that came first is admitted first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlock_and_curator_holders_count_each_others_permits() {
    let harness = ZookeeperHarness::from_env();
    let (a, b) = (harness.must_client().await, harness.must_client().await);
    let key = key("shared");
    let curator = curator(&harness, &key, 2).await;
    let curators_first = curator.acquire().await;
    let ours = a
        .try_acquire(&key, &permits(2))
        .await
        .expect("try_acquire")
        .expect("one of two permits is free beside Curator's");
    let refused = b.try_acquire(&key, &permits(2)).await.expect("try_acquire");
    assert!(refused.is_none(), "dlock counted Curator's lease");

    // Curator asks for a third: it counts our lease too, and waits holding the mutex.
    let curator = std::sync::Arc::new(curator);
    let second = tokio::spawn({
        let curator = curator.clone();
        async move { curator.acquire().await }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "Curator counted dlock's lease");
    // A dlock waiter queues behind Curator's acquirer on the mutex.
    let waiter = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move {
            let wait = permits(2).wait(Wait::For(Duration::from_secs(30)));
            b.acquire(&key, &wait).await.expect("the dlock waiter")
        }
    });
    sleep(Duration::from_millis(300)).await;
    ours.release().await.expect("release");
    let curators_second = timeout(Duration::from_secs(10), second)
        .await
        .expect("dlock's release wakes Curator's waiter")
        .expect("task");
    sleep(Duration::from_millis(300)).await;
    assert!(
        !waiter.is_finished(),
        "two Curator leases fill both permits"
    );
    curator.release(&curators_first).await;
    let lease = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("Curator's release lets the dlock waiter in")
        .expect("task");
    lease.release().await.expect("release");
    curator.release(&curators_second).await;
}

/// A permit is a `_c_{uuid}-lease-{seq}` node in `leases`, whose czxid is the fencing
/// token; the `locks` mutex node is gone once the permit is held, and the lease node once
/// it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_is_a_curator_lease_node_and_the_mutex_is_let_go() {
    let harness = ZookeeperHarness::from_env();
    let lock = harness.must_client().await;
    let raw = harness.raw().await.expect("raw client");
    let key = key("layout");
    let dir = harness.config().key_dir(&key);
    let lease = lock
        .try_acquire(&key, &permits(3))
        .await
        .expect("try_acquire")
        .expect("free");
    let mut layout = children(&raw, &dir).await;
    layout.sort();
    assert_eq!(layout, ["leases", "locks"]);
    assert_eq!(
        children(&raw, &format!("{dir}/locks")).await,
        Vec::<String>::new()
    );
    let leases = children(&raw, &format!("{dir}/leases")).await;
    assert_eq!(leases.len(), 1, "{leases:?}");
    let name = &leases[0];
    let uuid = name
        .strip_prefix("_c_")
        .and_then(|rest| rest.get(..36))
        .expect("a protected name");
    uuid::Uuid::parse_str(uuid).expect("a uuid after _c_");
    let seq = name
        .strip_prefix(&format!("_c_{uuid}-lease-"))
        .expect("Curator's lease name");
    assert!(
        seq.len() == 10 && seq.bytes().all(|b| b.is_ascii_digit()),
        "{name}"
    );
    let stat = raw
        .check_stat(&format!("{dir}/leases/{name}"))
        .await
        .expect("stat")
        .expect("the lease node");
    assert_eq!(lease.fencing_token(), stat.czxid as u64);
    assert_ne!(stat.ephemeral_owner, 0, "ephemeral");
    lease.release().await.expect("release");
    assert_eq!(
        children(&raw, &format!("{dir}/leases")).await,
        Vec::<String>::new()
    );
}

/// An operator who deletes a holder's lease node takes the permit away: the lease reports
/// itself lost, and the permit is free for another client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_lease_node_fires_lost_and_frees_the_permit() {
    let harness = ZookeeperHarness::from_env();
    let (a, b) = (harness.must_client().await, harness.must_client().await);
    let raw = harness.raw().await.expect("raw client");
    let key = key("broken");
    let leases = format!("{}/leases", harness.config().key_dir(&key));
    let lease = a
        .try_acquire(&key, &permits(1))
        .await
        .expect("try_acquire")
        .expect("free");
    let node = children(&raw, &leases).await.pop().expect("our lease node");
    raw.delete(&format!("{leases}/{node}"), None)
        .await
        .expect("delete");
    timeout(Duration::from_secs(10), lease.lost())
        .await
        .expect("lost fires");
    let other = b
        .try_acquire(&key, &permits(1))
        .await
        .expect("try_acquire")
        .expect("the permit is free again");
    other.release().await.expect("release");
}

/// The semaphore's directories are containers, as Curator makes them: once the last
/// permit is released, the server's container reaper removes `locks` and `leases`, then
/// the key directory (within three passes: a pass may remove only one level; default
/// check interval 60 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_reaps_a_released_semaphores_directories() {
    const CHECK_INTERVAL: Duration = Duration::from_secs(60);
    let harness = ZookeeperHarness::from_env();
    let lock = harness.must_client().await;
    let key = key("reaped");
    let lease = lock.try_acquire(&key, &permits(2)).await.expect("try");
    lease.expect("free").release().await.expect("release");

    let raw = harness.raw().await.expect("raw client");
    let dir = harness.config().key_dir(&key);
    let deadline = Instant::now() + CHECK_INTERVAL * 3 + Duration::from_secs(30);
    while raw.check_stat(&dir).await.expect("stat").is_some() {
        assert!(Instant::now() < deadline, "{dir} is still there");
        sleep(Duration::from_secs(1)).await;
    }
}
