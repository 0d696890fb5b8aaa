//! No herd: with 20 waiters on one key, each release wakes exactly one waiter (the next in
//! line), and the key is handed on in arrival order.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::ZookeeperHarness;
use dlock_conformance::Harness;
use dlock_core::{DistributedLock, LockOptions, Wait};
use tokio::sync::{mpsc, oneshot};
use tokio::time::{Instant, sleep, timeout};

const WAITERS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_wakes_one_waiter() {
    let harness = ZookeeperHarness::from_env();
    let key = format!("herd-{}/k", uuid::Uuid::new_v4().simple());
    let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(120)));
    let connect = || async {
        harness.client().await.unwrap_or_else(|e| {
            panic!("cannot use the zookeeper server at {}: {e}\n  start it with: scripts/backends up zookeeper", harness.url())
        })
    };
    let holder_client = connect().await;
    let holder = holder_client
        .try_acquire(&key, &opts)
        .await
        .expect("try_acquire")
        .expect("a fresh key is free");

    // Waiters queue one after the other, each on its own session.
    let (won_tx, mut won_rx) = mpsc::unbounded_channel::<(usize, oneshot::Sender<()>)>();
    let mut clients: Vec<Arc<dyn DistributedLock>> = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let client = connect().await;
        clients.push(client.clone());
        let (waiter_key, won) = (key.clone(), won_tx.clone());
        tasks.push(tokio::spawn(async move {
            let lease = client
                .acquire(&waiter_key, &opts)
                .await
                .expect("every waiter acquires");
            let (done_tx, done_rx) = oneshot::channel();
            won.send((i, done_tx)).expect("the test listens");
            let _ = done_rx.await;
            lease.release().await.expect("release");
        }));
        // Arrival order on the server: this waiter's node exists before the next one starts.
        wait_for_nodes(&harness, &key, i + 2).await;
    }
    let wakeups = || clients.iter().map(|c| c.stats().wakeups).sum::<u64>();
    assert_eq!(wakeups(), 0, "waiters were woken before any release");

    let mut order = Vec::new();
    let mut per_release = Vec::new();
    let mut release: Box<dyn FnOnce() -> tokio::task::JoinHandle<()> + Send> =
        { Box::new(move || tokio::spawn(async move { holder.release().await.expect("release") })) };
    for _ in 0..WAITERS {
        let before = wakeups();
        let released = Instant::now();
        release().await.expect("release task");
        let (winner, done) = timeout(Duration::from_secs(10), won_rx.recv())
            .await
            .expect("a waiter wins within 10 s")
            .expect("a waiter wins");
        let handoff = released.elapsed();
        // Give any other (wrongly) woken waiter time to be counted.
        sleep(Duration::from_millis(200)).await;
        per_release.push(wakeups() - before);
        order.push((winner, handoff));
        release = Box::new(move || {
            tokio::spawn(async move {
                let _ = done.send(());
            })
        });
    }
    release().await.expect("last release");
    for task in tasks {
        task.await.expect("waiter task");
    }
    let winners: Vec<usize> = order.iter().map(|(w, _)| *w).collect();
    assert_eq!(
        winners,
        (0..WAITERS).collect::<Vec<_>>(),
        "hand-off not in arrival order"
    );
    assert!(
        per_release.iter().all(|&w| w == 1),
        "wake-ups per release: {per_release:?} (each release must wake exactly one waiter)"
    );
    let slowest = order.iter().map(|(_, h)| *h).max().unwrap_or_default();
    assert!(
        slowest < Duration::from_secs(1),
        "slowest hand-off {slowest:?}"
    );
    wait_for_nodes(&harness, &key, 0).await;
}

/// Wait until `key`'s directory holds `n` lock nodes (`0`: empty, or gone).
async fn wait_for_nodes(harness: &ZookeeperHarness, key: &str, n: usize) {
    let zk = harness.raw().await.expect("raw client");
    let dir = harness.config().key_dir(key);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let count = match zk.list_children(&dir).await {
            Ok(children) => Some(children.len()),
            Err(zookeeper_client::Error::NoNode) => None,
            Err(e) => panic!("list {dir}: {e}"),
        };
        if count == Some(n) || (n == 0 && count.is_none()) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{dir} holds {count:?} nodes, expected {n}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}
