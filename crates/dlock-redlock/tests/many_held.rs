//! Many keys held by one client over all the nodes: each node renews them in batches.

mod common;

use std::time::Duration;

use common::{RedlockHarness, unique_key};
use dlock_core::{DistributedLock, LockOptions};
use dlock_redis::server::Names;
use futures::StreamExt;

/// 2,000 keys held at a 2 s ttl through several renewal intervals: none is lost, and every
/// release finds its key still held on a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_held_keys_are_all_kept_and_released() {
    let harness = RedlockHarness::from_env();
    let lock = harness.lock().await;
    let run = unique_key("many-held");
    let opts = LockOptions::new().ttl(Duration::from_secs(2));
    let keys: Vec<String> = (0..2000).map(|i| format!("{run}/{i}")).collect();
    let leases: Vec<_> = futures::stream::iter(&keys)
        .map(|key| lock.try_acquire(key, &opts))
        .buffer_unordered(64)
        .collect()
        .await;
    let leases: Vec<_> = leases
        .into_iter()
        .map(|l| l.expect("try_acquire").expect("fresh keys are free"))
        .collect();

    // Five renewal intervals (one every ttl / 3 or a little sooner).
    tokio::time::sleep(Duration::from_secs(4)).await;

    let lost = leases.iter().filter(|l| l.is_lost()).count();
    let failed: Vec<_> = futures::stream::iter(leases)
        .map(|lease| lease.release())
        .buffer_unordered(64)
        .filter_map(|r| std::future::ready(r.err()))
        .collect()
        .await;
    // The fence counters, one pipeline per node.
    for i in 0..harness.config().nodes.len() {
        let mut admin = harness.admin(i).await.expect("admin connection");
        let mut forget = redis::pipe();
        for key in &keys {
            forget.del(Names::new(harness.prefix(), key).fence).ignore();
        }
        let _: () = forget.query_async(&mut admin).await.expect("DEL fences");
    }
    assert_eq!(lost, 0, "leases lost while renewed in batches");
    assert!(failed.is_empty(), "failed releases: {failed:?}");
}
