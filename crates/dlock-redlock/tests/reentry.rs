//! Reentrant holds on the Redlock nodes: the hold record beside the lock key on every node
//! (`{<lock key>}:reentry`: owner, token, fence, one field per lease that counts), how a
//! majority of re-entries grants, what is given back when a round is not a re-entry, and
//! that nothing is left behind.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use common::{RedlockHarness, must_take, unique_key};
use dlock_conformance::Harness;
use dlock_core::{DistributedLock, LockOptions, Wait};
use dlock_redis::server::Names;
use futures::future::join_all;
use redis::AsyncCommands;

const TTL: Duration = Duration::from_secs(10);

fn owner(id: &str) -> LockOptions {
    LockOptions::new().ttl(TTL).owner(id)
}

fn record_name(harness: &RedlockHarness, key: &str) -> String {
    format!("{{{}}}:reentry", Names::new(harness.prefix(), key).key)
}

/// Each node's hold record of `key` (empty where there is none).
async fn records(harness: &RedlockHarness, key: &str) -> Vec<HashMap<String, String>> {
    let record = record_name(harness, key);
    let mut all = Vec::new();
    for i in 0..harness.config().nodes.len() {
        let mut admin = harness.admin(i).await.expect("admin connection");
        all.push(admin.hgetall(&record).await.expect("HGETALL"));
    }
    all
}

/// How many leases each node's record counts.
async fn counts(harness: &RedlockHarness, key: &str) -> Vec<usize> {
    records(harness, key)
        .await
        .iter()
        .map(|r| r.keys().filter(|f| f.starts_with("l:")).count())
        .collect()
}

/// Each node's remaining ttl of `key`'s lock, in ms (-2: none).
async fn pttls(harness: &RedlockHarness, key: &str) -> Vec<i64> {
    let lock = Names::new(harness.prefix(), key).key;
    let mut all = Vec::new();
    for i in 0..harness.config().nodes.len() {
        let mut admin = harness.admin(i).await.expect("admin connection");
        all.push(admin.pttl(&lock).await.expect("PTTL"));
    }
    all
}

/// Nothing of `key` is left on any node but its fence counter.
async fn assert_clean(harness: &RedlockHarness, key: &str) {
    let left = harness.residue(key).await.expect("residue");
    assert!(left.is_empty(), "left on the nodes: {left:?}");
    harness.forget_fence(key).await;
}

async fn is_free(lock: &dyn DistributedLock, key: &str) -> bool {
    match lock
        .try_acquire(key, &LockOptions::new().ttl(TTL))
        .await
        .expect("try_acquire")
    {
        Some(lease) => {
            lease.release().await.expect("release");
            true
        }
        None => false,
    }
}

/// Every node counts each entry; releases lower the counts; the last one frees the key and
/// removes the record everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_record_counts_each_entry_and_goes_with_the_last() {
    let harness = RedlockHarness::from_env();
    let lock = harness.lock().await;
    let key = unique_key("reentry-count");
    let first = must_take(&lock, &key, &owner("job-1")).await;
    let second = must_take(&lock, &key, &owner("job-1")).await;
    let third = must_take(&lock, &key, &owner("job-1")).await;
    assert_eq!(second.fencing_token(), first.fencing_token());
    assert_eq!(third.fencing_token(), first.fencing_token());
    assert_eq!(counts(&harness, &key).await, [3; 5]);
    let record = &records(&harness, &key).await[0];
    assert_eq!(record["owner"], "job-1");
    assert_eq!(record["fence"], first.fencing_token().to_string());
    assert_eq!(
        Some(&record["token"]),
        harness.values(&key).await[0].as_ref(),
        "the record names the lock key's value"
    );
    first.release().await.expect("release");
    assert_eq!(counts(&harness, &key).await, [2; 5]);
    assert!(!is_free(&lock, &key).await);
    third.release().await.expect("release");
    assert!(!is_free(&lock, &key).await);
    second.release().await.expect("release");
    assert_eq!(harness.values(&key).await, [None, None, None, None, None]);
    assert_clean(&harness, &key).await;
}

/// A record left by a crashed hold (its lock key gone) or naming a hold that is not the
/// key's (another holder's key) never counts: the owner takes the key afresh, or waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_record_is_ignored_and_replaced() {
    let harness = RedlockHarness::from_env();
    let lock = harness.lock().await;
    let key = unique_key("reentry-stale");
    let record = record_name(&harness, &key);
    let forge = |token: &'static str| {
        let (harness, record) = (&harness, record.clone());
        async move {
            for i in 0..harness.config().nodes.len() {
                let mut admin = harness.admin(i).await.expect("admin connection");
                let fields = [
                    ("owner", "job-1"),
                    ("token", token),
                    ("fence", "7"),
                    ("l:0", "1"),
                ];
                let _: () = admin.hset_multiple(&record, &fields).await.expect("HSET");
                let _: () = admin.pexpire(&record, 60_000).await.expect("PEXPIRE");
            }
        }
    };
    // The crashed hold's lock key expired before its record: a fresh hold.
    forge("0123456789abcdef0123456789abcdef gone@host:1").await;
    let fresh = must_take(&lock, &key, &owner("job-1")).await;
    assert!(fresh.fencing_token() > 7, "a fresh hold gets a fresh token");
    assert_eq!(
        counts(&harness, &key).await,
        [1; 5],
        "the stale record was replaced"
    );
    fresh.release().await.expect("release");
    assert_clean(&harness, &key).await;

    // A plain holder has the key; a record of the owner that names another token does not
    // let the owner in.
    let plain = must_take(&lock, &key, &LockOptions::new().ttl(TTL)).await;
    forge("fedcba9876543210fedcba9876543210 other@host:1").await;
    // (From another client: this one's plain lease keeps its own tasks out.)
    let refused = harness
        .lock()
        .await
        .try_acquire(&key, &owner("job-1"))
        .await
        .expect("try_acquire");
    assert!(refused.is_none(), "the owner does not enter a plain hold");
    plain.release().await.expect("release");
    // The owner's try removed the stale records it met.
    assert_clean(&harness, &key).await;
}

/// Eight tasks of one client and eight of another re-enter together: every lease has the
/// hold's token, and the key frees exactly with the last release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reentries_share_one_token_and_the_key_frees_after_the_last() {
    let harness = RedlockHarness::from_env();
    let (a, b, other) = (
        Arc::new(harness.lock().await),
        Arc::new(harness.lock().await),
        harness.lock().await,
    );
    let key = unique_key("reentry-concurrent");
    let first = must_take(&*a, &key, &owner("job-1")).await;
    let token = first.fencing_token();
    let tasks = (0..16).map(|i| {
        let client = if i % 2 == 0 { a.clone() } else { b.clone() };
        let key = key.clone();
        tokio::spawn(async move {
            client
                .acquire(
                    &key,
                    &owner("job-1").wait(Wait::For(Duration::from_secs(10))),
                )
                .await
                .expect("re-entry")
        })
    });
    let mut leases: Vec<_> = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();
    assert!(leases.iter().all(|l| l.fencing_token() == token));
    assert_eq!(counts(&harness, &key).await, [17; 5]);
    first.release().await.expect("release");
    let last = leases.pop().expect("16 leases");
    join_all(leases.into_iter().map(|l| l.release()))
        .await
        .into_iter()
        .for_each(|r| r.expect("release"));
    assert!(!is_free(&other, &key).await, "one lease still counts");
    assert_eq!(counts(&harness, &key).await, [1; 5]);
    last.release().await.expect("release");
    assert!(
        is_free(&other, &key).await,
        "the last release frees the key"
    );
    assert_clean(&harness, &key).await;
}

/// A re-entry needs a majority of the nodes, not all: a client that reaches only three of
/// five re-enters with the hold's token. A re-entry never shortens the hold, and a renewal
/// gives the lease back to the nodes that did not count it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_reenters_and_renewals_complete_the_rest() {
    let harness = RedlockHarness::from_env();
    let lock = harness.lock().await;
    let key = unique_key("reentry-majority");
    let long = must_take(&lock, &key, &owner("job-1")).await;
    let partial = harness.lock_at(&harness.url_with_dead_nodes(&[3, 4])).await;
    let short = partial
        .try_acquire(
            &key,
            &LockOptions::new()
                .ttl(Duration::from_secs(2))
                .owner("job-1")
                .auto_renew(false),
        )
        .await
        .expect("try_acquire")
        .expect("a majority re-enters");
    assert_eq!(short.fencing_token(), long.fencing_token());
    assert_eq!(counts(&harness, &key).await, [2, 2, 2, 1, 1]);
    assert!(
        pttls(&harness, &key).await.iter().all(|t| *t > 5_000),
        "a 2 s re-entry does not shorten a 10 s hold"
    );
    // The full client's renewal gives the hold back to two nodes that lost it.
    for i in [0, 1] {
        let mut admin = harness.admin(i).await.expect("admin connection");
        let lock_key = Names::new(harness.prefix(), &key).key;
        let _: () = admin.del(&lock_key).await.expect("DEL");
        let _: () = admin.del(record_name(&harness, &key)).await.expect("DEL");
    }
    long.extend(TTL).await.expect("a majority still holds it");
    assert_eq!(counts(&harness, &key).await, [1, 1, 2, 1, 1]);
    assert_eq!(
        records(&harness, &key).await[0]["fence"],
        long.fencing_token().to_string()
    );
    short.release().await.expect("release");
    assert!(!is_free(&lock, &key).await, "the long lease still counts");
    long.release().await.expect("release");
    assert_clean(&harness, &key).await;
}

/// A hold left on a minority of the nodes is not re-entered: the owner takes the key afresh
/// on the others, with a higher token, and takes its entry back where it re-entered the
/// old hold (the old hold's count there is unchanged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_of_reentries_is_given_back() {
    let harness = RedlockHarness::from_env();
    let lock = harness.lock().await;
    let key = unique_key("reentry-minority");
    let old = must_take(&lock, &key, &owner("job-1")).await;
    let lock_key = Names::new(harness.prefix(), &key).key;
    for i in 2..5 {
        let mut admin = harness.admin(i).await.expect("admin connection");
        let _: () = admin.del(&lock_key).await.expect("DEL");
    }
    let new = lock
        .try_acquire(&key, &owner("job-1"))
        .await
        .expect("try_acquire")
        .expect("the owner takes the three free nodes");
    assert!(new.fencing_token() > old.fencing_token());
    assert_eq!(counts(&harness, &key).await, [1; 5]);
    let values = harness.values(&key).await;
    assert_ne!(values[0], values[4], "two holds: the old one on two nodes");
    new.release().await.expect("release");
    // Not held (a majority does not count it), but where it still counted, its release
    // freed the old hold's nodes.
    assert!(old.release().await.is_err(), "the old hold is not held");
    assert_clean(&harness, &key).await;
}

/// Owner holds and plain holds exclude each other, both ways.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_and_plain_holders_wait_for_each_other() {
    let harness = RedlockHarness::from_env();
    let (a, b) = (harness.lock().await, harness.lock().await);
    let key = unique_key("reentry-plain");
    let owned = must_take(&a, &key, &owner("job-1")).await;
    let waiting = LockOptions::new()
        .ttl(TTL)
        .wait(Wait::For(Duration::from_millis(300)));
    assert!(
        b.acquire(&key, &waiting).await.is_err(),
        "a plain acquire waits"
    );
    assert!(
        b.acquire(&key, &waiting.owner("job-2")).await.is_err(),
        "another owner waits"
    );
    let token = owned.fencing_token();
    let releasing = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        owned.release().await.expect("release");
    };
    let patient = waiting.wait(Wait::For(Duration::from_secs(5)));
    let (plain, ()) = tokio::join!(b.acquire(&key, &patient), releasing);
    let plain = plain.expect("the plain waiter gets the key");
    assert!(plain.fencing_token() > token);
    assert!(
        a.try_acquire(&key, &owner("job-1"))
            .await
            .expect("try_acquire")
            .is_none(),
        "an owner does not enter a plain hold"
    );
    plain.release().await.expect("release");
    assert_clean(&harness, &key).await;
}

/// Two clients of one owner wait for a plain holder's key: when it frees, one takes it and
/// the other re-enters that hold (within the owner's one-second recheck), both with one
/// token, neither waiting for the other's release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_entries_of_one_owner_share_the_hold_they_get() {
    let harness = RedlockHarness::from_env();
    let (holder, b, c) = (
        harness.lock().await,
        harness.lock().await,
        harness.lock().await,
    );
    let key = unique_key("reentry-waiters");
    let plain = must_take(&holder, &key, &LockOptions::new().ttl(TTL)).await;
    let patient = owner("job-1").wait(Wait::For(Duration::from_secs(10)));
    let releasing = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        plain.release().await.expect("release");
        tokio::time::Instant::now()
    };
    let (first, second, released) = tokio::join!(
        b.acquire(&key, &patient),
        c.acquire(&key, &patient),
        releasing
    );
    let (first, second) = (first.expect("b's entry"), second.expect("c's entry"));
    assert!(
        released.elapsed() < Duration::from_secs(3),
        "both entries came within the recheck after the release ({:?})",
        released.elapsed()
    );
    assert_eq!(first.fencing_token(), second.fencing_token());
    assert_eq!(counts(&harness, &key).await, [2; 5]);
    first.release().await.expect("release");
    second.release().await.expect("release");
    assert_clean(&harness, &key).await;
}
