//! Partitions between a holder and some of the nodes (proxies that black-hole traffic).

mod common;

use std::time::Duration;

use common::{RedlockHarness, must_take, unique_key};
use dlock_conformance::{Harness, Proxy};
use dlock_core::{DistributedLock, LockOptions, LostReason, Wait};
use tokio::time::{Instant, timeout};

async fn proxied(harness: &RedlockHarness) -> (dlock_redlock::RedlockLock, Vec<Proxy>) {
    let mut proxies = Vec::new();
    for addr in harness.server_addrs() {
        proxies.push(Proxy::start(addr).await.expect("proxy"));
    }
    let addrs: Vec<_> = proxies.iter().map(Proxy::addr).collect();
    (
        harness.lock_at(&harness.url_with_addrs(&addrs)).await,
        proxies,
    )
}

/// `other` cannot take `key`: a majority of the nodes holds it for someone else.
async fn assert_held_elsewhere(other: &impl DistributedLock, key: &str, opts: &LockOptions) {
    assert!(
        other
            .try_acquire(key, opts)
            .await
            .expect("try_acquire")
            .is_none(),
        "another client took a key held on a majority"
    );
}

/// Cut off from two of five nodes, a holder keeps its lease (renewals reach a majority),
/// and nobody else can take the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_partition_keeps_the_lease() {
    let harness = RedlockHarness::from_env();
    let (holder, proxies) = proxied(&harness).await;
    let other = harness.lock().await;
    let key = unique_key("minority-cut");
    // Not shorter: a healthy node's copy must outlive a renewal that a loaded machine
    // delays (at 1 s one expired once under a full test run, failing the extend).
    let ttl = Duration::from_secs(2);
    let opts = LockOptions::new().ttl(ttl);
    let lease = must_take(&holder, &key, &opts).await;
    proxies[0].cut();
    proxies[3].cut();
    let until = Instant::now() + ttl * 4;
    while Instant::now() < until {
        assert!(
            !lease.is_lost(),
            "lost with a majority reachable: {lease:?}"
        );
        assert_held_elsewhere(&other, &key, &opts).await;
        tokio::time::sleep(ttl / 4).await;
    }
    lease.release().await.expect("release through the majority");
    for proxy in &proxies {
        proxy.heal();
    }
    // The nodes the holder could not reach free the key when its ttl runs out.
    let next = other
        .acquire(&key, &opts.wait(Wait::For(Duration::from_secs(10))))
        .await
        .expect("the key frees");
    next.release().await.expect("release");
    harness.forget_fence(&key).await;
}

/// Cut off from three of five nodes, a holder is told its lease is lost before anyone else
/// can take the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_partition_loses_the_lease_before_anyone_takes_it() {
    let harness = RedlockHarness::from_env();
    let (holder, proxies) = proxied(&harness).await;
    let other = harness.lock().await;
    let key = unique_key("majority-cut");
    let ttl = Duration::from_secs(1);
    let opts = LockOptions::new().ttl(ttl);
    let lease = must_take(&holder, &key, &opts).await;
    let mut signal = lease.lost_signal();
    let lost_at = tokio::spawn(async move {
        let reason = signal.lost().await;
        (Instant::now(), reason)
    });
    for proxy in &proxies[..3] {
        proxy.cut();
    }
    let next = other
        .acquire(&key, &opts.wait(Wait::For(Duration::from_secs(10))))
        .await
        .expect("the cut-off holder's key frees");
    let taken = Instant::now();
    let (lost, reason) = timeout(Duration::from_secs(1), lost_at)
        .await
        .expect("lost() fired")
        .expect("watcher");
    assert!(
        matches!(reason, Some(LostReason::Unreachable(_))),
        "{reason:?}"
    );
    assert!(
        lost <= taken,
        "lost() fired {:?} after the key was taken",
        lost - taken
    );
    next.release().await.expect("release");
    for proxy in &proxies {
        proxy.heal();
    }
    drop(lease);
    harness.forget_fence(&key).await;
}

/// Two of five nodes answering slowly (a round trip of 2 s, longer than the per-node
/// timeout) slow neither an acquire nor a release: each is decided once a majority answered,
/// and the lease holds the key. Before, each waited out the slow nodes' timeout (1.5 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_minority_of_nodes_delays_neither_acquire_nor_release() {
    let harness = RedlockHarness::from_env();
    let (holder, proxies) = proxied(&harness).await;
    let other = harness.lock().await;
    let key = unique_key("slow-minority");
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    // Connected (and the scripts loaded) on every node before the delay.
    must_take(&holder, &key, &opts)
        .await
        .release()
        .await
        .expect("release");
    let slow = dlock_conformance::proxy::Delay {
        base: Duration::from_secs(1),
        jitter: Duration::ZERO,
    };
    proxies[1].delay(slow);
    proxies[4].delay(slow);
    let began = Instant::now();
    let lease = must_take(&holder, &key, &opts).await;
    let took = began.elapsed();
    assert!(
        took < Duration::from_millis(1000),
        "the acquire waited for the slow nodes: {took:?}"
    );
    assert_held_elsewhere(&other, &key, &opts).await;
    let began = Instant::now();
    lease.release().await.expect("release");
    let took = began.elapsed();
    assert!(
        took < Duration::from_millis(1000),
        "the release waited for the slow nodes: {took:?}"
    );
    // The slow nodes still run both, in order: the key ends up free on every node.
    harness.assert_free_everywhere(&key).await;
    for proxy in &proxies {
        proxy.heal();
    }
    harness.forget_fence(&key).await;
}
