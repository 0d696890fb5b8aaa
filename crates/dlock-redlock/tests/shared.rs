//! Shared holds across majorities: a reader quorum and a writer quorum always share a node,
//! whose script refuses the second hold, so readers and writers stay apart even when each
//! client reaches only its own majority of the nodes; readers share across majorities, and
//! tokens increase across modes and majorities.

mod common;

use common::{RedlockHarness, must_take, unique_key};
use dlock_core::{DistributedLock, LockOptions};

fn read() -> LockOptions {
    LockOptions::new().shared()
}

/// A refused `try_acquire` of `key` in `opts`' mode through `lock`.
async fn must_be_refused(lock: &dyn DistributedLock, key: &str, opts: &LockOptions, what: &str) {
    let answer = lock.try_acquire(key, opts).await.expect("try_acquire");
    assert!(answer.is_none(), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_and_writers_on_overlapping_majorities_exclude_each_other() {
    let harness = RedlockHarness::from_env();
    // Client a reaches nodes 0, 1, 2 (3 and 4 are dead ports for it); b reaches 2, 3, 4:
    // their majorities share node 2 only.
    let a = harness.lock_at(&harness.url_with_dead_nodes(&[3, 4])).await;
    let b = harness.lock_at(&harness.url_with_dead_nodes(&[0, 1])).await;
    let key = unique_key("rw-majorities");
    let mut tokens = Vec::new();

    let reader = must_take(&a, &key, &read()).await;
    tokens.push(reader.fencing_token());
    must_be_refused(&b, &key, &LockOptions::new(), "a writer beside a reader").await;
    let second = must_take(&b, &key, &read()).await;
    tokens.push(second.fencing_token());
    reader.release().await.expect("release");
    must_be_refused(
        &a,
        &key,
        &LockOptions::new(),
        "a writer beside the other reader",
    )
    .await;
    second.release().await.expect("release");

    let writer = must_take(&b, &key, &LockOptions::new()).await;
    tokens.push(writer.fencing_token());
    must_be_refused(&a, &key, &read(), "a reader beside a writer").await;
    writer.release().await.expect("release");
    let last = must_take(&a, &key, &read()).await;
    tokens.push(last.fencing_token());
    last.release().await.expect("release");

    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "tokens did not increase across modes and majorities: {tokens:?}"
    );
    harness.forget_fence(&key).await;
}
