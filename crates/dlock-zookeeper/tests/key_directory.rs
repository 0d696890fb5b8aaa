//! The key directory outlives its last lock node: a release deletes only its node, and the
//! server's container reaper removes the empty directory later (see the crate docs'
//! Release). These tests check what that rests on: the directory stays empty, the reaper
//! removes it, and an acquire that finds it gone makes it again.

mod common;

use std::time::Duration;

use common::ZookeeperHarness;
use dlock_conformance::Harness;
use dlock_core::LockOptions;
use tokio::time::{Instant, sleep};
use zookeeper_client as zk;

/// The server's container check interval (`znode.container.checkIntervalMs`, not set by
/// `scripts/backends`: the default). A shorter one would make the reaper test quicker, but
/// it would also reap key directories between the steps of the round-trip tests.
const CHECK_INTERVAL: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_key_leaves_only_its_empty_directory() {
    let harness = ZookeeperHarness::from_env();
    let lock = harness.must_client().await;
    let key = format!("keydir-{}/k", uuid::Uuid::new_v4().simple());
    let zk = harness.raw().await.expect("raw client");
    let dir = harness.config().key_dir(&key);
    let lease = lock.try_acquire(&key, &LockOptions::new()).await;
    lease
        .expect("try_acquire")
        .expect("free")
        .release()
        .await
        .expect("release");

    match zk.list_children(&dir).await {
        Ok(children) => assert_eq!(children, Vec::<String>::new(), "{dir}"),
        // The reaper's pass came in the moment between.
        Err(zk::Error::NoNode) => {}
        Err(e) => panic!("list {dir}: {e}"),
    }
}

/// The server cannot be asked whether a node is a container (its stat says
/// `ephemeralOwner` 0 like a persistent node's): the reaper's pass shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_reaps_an_empty_key_directory() {
    let harness = ZookeeperHarness::from_env();
    let lock = harness.must_client().await;
    let key = format!("keydir-{}/k", uuid::Uuid::new_v4().simple());
    let lease = lock.try_acquire(&key, &LockOptions::new()).await;
    lease
        .expect("try_acquire")
        .expect("free")
        .release()
        .await
        .expect("release");

    let zk = harness.raw().await.expect("raw client");
    let dir = harness.config().key_dir(&key);
    // One pass of the reaper comes within an interval; two, and a margin for a busy server.
    let deadline = Instant::now() + CHECK_INTERVAL * 2 + Duration::from_secs(30);
    loop {
        match zk.check_stat(&dir).await {
            Ok(None) => return,
            Ok(Some(_)) => assert!(
                Instant::now() < deadline,
                "{dir} is still there after {:?}",
                CHECK_INTERVAL * 2
            ),
            Err(e) => panic!("stat {dir}: {e}"),
        }
        sleep(Duration::from_secs(1)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_whose_directory_was_reaped_is_taken_again() {
    let harness = ZookeeperHarness::from_env();
    let lock = harness.must_client().await;
    let key = format!("keydir-{}/k", uuid::Uuid::new_v4().simple());
    let opts = LockOptions::new();
    let lease = lock.try_acquire(&key, &opts).await.expect("try_acquire");
    lease.expect("free").release().await.expect("release");

    // What the reaper does to an empty container.
    let zk = harness.raw().await.expect("raw client");
    let dir = harness.config().key_dir(&key);
    match zk.delete(&dir, None).await {
        // Or the reaper was first.
        Ok(()) | Err(zk::Error::NoNode) => {}
        Err(e) => panic!("delete {dir}: {e}"),
    }

    let lease = lock.try_acquire(&key, &opts).await.expect("try_acquire");
    let lease = lease.expect("the key is free after its directory was reaped");
    assert!(
        harness
            .client()
            .await
            .expect("second client")
            .try_acquire(&key, &opts)
            .await
            .expect("try_acquire")
            .is_none(),
        "the key is held again"
    );
    lease.release().await.expect("release");
}
