//! Many keys held by one client: renewals go out in batches, and each key is answered by
//! itself.

mod common;

use std::time::Duration;

use common::{RedisHarness, forget_fence, unique_key};
use dlock_core::{DistributedLock, ErrorKind, LockOptions, LostReason};
use dlock_redis::server::{Attempt, HeldKey, Names, Node, Queueing, new_token};
use redis::AsyncCommands;
use tokio::time::timeout;

/// Renewals queued together go out as one batch; a key in it that is no longer ours
/// (deleted by hand) answers "not ours", and the others are renewed.
#[tokio::test]
async fn a_renewal_batch_answers_each_key_by_itself() {
    let harness = RedisHarness::from_env();
    let node = Node::new(harness.config(), "redis").expect("node");
    let mut admin = harness.admin().await.expect("admin connection");
    let run = unique_key("batch-answers");
    let mut held = Vec::new();
    for i in 0..5 {
        let names = Names::new(&harness.config().prefix, &format!("{run}/{i}"));
        let token = new_token();
        let attempt = node
            .acquire(&names, &token, Duration::from_secs(5), &Queueing::default())
            .await
            .expect("acquire");
        assert!(matches!(attempt, Attempt::Taken { .. }), "{attempt:?}");
        held.push((HeldKey::new(&names, &token), names));
    }
    let _: () = admin.del(&held[2].1.key).await.expect("DEL");

    // Queued in one poll, before the node's renewal task runs: one batch.
    let answers = futures::future::join_all(
        held.iter()
            .map(|(key, _)| node.renew(key, Duration::from_secs(60))),
    )
    .await;
    let answers: Vec<bool> = answers.into_iter().map(|a| a.expect("renew")).collect();
    assert_eq!(answers, [true, true, false, true, true]);
    for (i, (_, names)) in held.iter().enumerate() {
        let pttl: i64 = admin.pttl(&names.key).await.expect("PTTL");
        if i == 2 {
            assert_eq!(pttl, -2, "the deleted key stays deleted");
        } else {
            assert!(pttl > 5_000, "key {i} was renewed to 60 s (pttl {pttl})");
        }
    }
    for (key, names) in &held {
        let _ = node.release(names, key.token(), false).await;
        let _: () = admin.del(&names.fence).await.expect("DEL fence");
    }
}

/// Through the public API: the lease whose key was deleted by hand is lost (`NotHeld`);
/// the leases renewed in the same batches are kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_whose_key_was_deleted_is_lost() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin connection");
    let run = unique_key("batch-lost");
    let ttl = Duration::from_secs(1);
    let mut leases = Vec::new();
    for i in 0..20 {
        let lease = lock
            .try_acquire(&format!("{run}/{i}"), &LockOptions::new().ttl(ttl))
            .await
            .expect("try_acquire")
            .expect("free");
        leases.push(lease);
    }
    let victim = leases.remove(7);
    let _: () = admin
        .del(Names::new(&harness.config().prefix, victim.key()).key)
        .await
        .expect("DEL");

    let reason = timeout(ttl * 3, victim.lost())
        .await
        .expect("lost() fires at the next renewal");
    assert_eq!(reason, LostReason::NotHeld);
    // Another two renewal intervals for the others.
    tokio::time::sleep(ttl).await;
    assert!(leases.iter().all(|l| !l.is_lost()), "a kept lease was lost");
    let err = victim
        .release()
        .await
        .expect_err("the victim's key is gone");
    assert!(
        matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost),
        "{err}"
    );
    for lease in leases {
        let key = lease.key().to_owned();
        lease.release().await.expect("release a kept lease");
        forget_fence(&mut admin, &harness.config().prefix, &key).await;
    }
    forget_fence(&mut admin, &harness.config().prefix, &format!("{run}/7")).await;
}
