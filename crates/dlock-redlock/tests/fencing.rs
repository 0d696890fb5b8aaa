//! Fencing tokens increase across holders that reach the lock through different majorities:
//! each grant's token is written back to a majority before the lease is reported, and any
//! two majorities share a node.

mod common;

use common::{RedlockHarness, must_take, unique_key};
use dlock_core::LockOptions;
use dlock_redis::server::Names;
use redis::AsyncCommands;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_increase_across_disjoint_pairs_of_majorities() {
    let harness = RedlockHarness::from_env();
    // Client a reaches nodes 0, 1, 2 (3 and 4 are dead ports for it); b reaches 2, 3, 4.
    let a_url = harness.url_with_dead_nodes(&[3, 4]);
    let b_url = harness.url_with_dead_nodes(&[0, 1]);
    let a = harness.lock_at(&a_url).await;
    let b = harness.lock_at(&b_url).await;
    let key = unique_key("fence-majorities");
    let names = Names::new(harness.prefix(), &key);
    // Node 0's counter is far ahead of the others (as after many grants through it): only
    // the write-back can carry it to node 2, which b's majority shares with a's.
    let (secs, _): (u64, u64) = redis::cmd("TIME")
        .query_async(&mut harness.admin(0).await.expect("admin"))
        .await
        .expect("TIME");
    let ahead = secs * 1_000_000 + 3_600_000_000;
    let _: () = harness
        .admin(0)
        .await
        .expect("admin")
        .set(&names.fence, ahead)
        .await
        .expect("SET fence");
    let mut tokens = Vec::new();
    for round in 0..6 {
        let client = if round % 2 == 0 { &a } else { &b };
        let lease = must_take(client, &key, &LockOptions::new()).await;
        tokens.push(lease.fencing_token());
        lease.release().await.expect("release");
    }
    assert!(
        tokens[0] > ahead,
        "a's token {} ignores node 0's counter {ahead}",
        tokens[0]
    );
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens did not increase across majorities: {tokens:?}"
    );
    // Every node of each majority holds at least the token it granted last.
    for node in 0..5 {
        let fence: Option<u64> = harness
            .admin(node)
            .await
            .expect("admin")
            .get(&names.fence)
            .await
            .expect("GET fence");
        let last = if node < 2 { tokens[4] } else { tokens[5] };
        assert!(fence >= Some(last), "node {node}: fence {fence:?} < {last}");
    }
    harness.forget_fence(&key).await;
}
