//! Reentrant holds on the server: the hold hash beside the key (its entries, its ttl, its
//! clean-up), a stale hash after a broken hold, re-entry from other clients and many tasks
//! at once, and renewals that never shorten the hold.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{RedisHarness, forget_fence, keys_under, unique_key};
use dlock_core::{DistributedLock, ErrorKind, Lease, LockOptions, Reentry, Wait};
use dlock_redis::server::{Attempt, Names, Queueing, new_token};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

fn owned(owner: &str, ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl).owner(owner)
}

async fn entries(admin: &mut MultiplexedConnection, names: &Names) -> usize {
    let fields: Vec<String> = admin.hkeys(&names.hold).await.expect("HKEYS");
    fields.iter().filter(|f| f.starts_with('+')).count()
}

async fn tidy(harness: &RedisHarness, admin: &mut MultiplexedConnection, key: &str) {
    assert_eq!(
        keys_under(harness.config(), key).await.expect("residue"),
        Vec::<String>::new(),
        "a finished hold of {key} left keys behind"
    );
    forget_fence(admin, &harness.config().prefix, key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hold_hash_counts_entries_and_goes_with_the_last() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    assert_eq!(lock.capabilities().reentrant, Reentry::AnyLease);
    let mut admin = harness.admin().await.expect("admin");
    let key = unique_key("reentry-hash");
    let names = Names::new(&harness.config().prefix, &key);
    let opts = owned("job-7", Duration::from_secs(10));
    let first = lock.acquire(&key, &opts).await.expect("first");
    let value: String = admin.get(&names.key).await.expect("GET");
    let (owner, hold, fence): (String, String, u64) = redis::cmd("HMGET")
        .arg(&names.hold)
        .arg(&["owner", "hold", "fence"])
        .query_async(&mut admin)
        .await
        .expect("HMGET");
    assert_eq!(owner, "job-7");
    assert_eq!(hold, value[..32], "the hash is of the lock key's hold");
    assert_eq!(fence, first.fencing_token());
    let second = lock.acquire(&key, &opts).await.expect("re-entry");
    let third = lock.acquire(&key, &opts).await.expect("re-entry");
    assert_eq!(second.fencing_token(), first.fencing_token());
    assert_eq!(third.fencing_token(), first.fencing_token());
    assert_eq!(entries(&mut admin, &names).await, 3);
    let lock_ttl: i64 = admin.pttl(&names.key).await.expect("PTTL");
    let hold_ttl: i64 = admin.pttl(&names.hold).await.expect("PTTL");
    assert!(
        hold_ttl > 0 && (lock_ttl - hold_ttl).abs() < 50,
        "{lock_ttl} {hold_ttl}"
    );
    let status = lock.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(status.holders[0].fencing_token, Some(first.fencing_token()));
    let who = status.holders[0].who.clone().unwrap_or_default();
    assert!(who.starts_with("job-7 (held 3 times"), "{who}");
    second.release().await.expect("release");
    first.release().await.expect("release");
    assert_eq!(entries(&mut admin, &names).await, 1);
    let still: Option<String> = admin.get(&names.key).await.expect("GET");
    assert_eq!(still.as_deref(), Some(value.as_str()));
    third.release().await.expect("release");
    let gone: Option<String> = admin.get(&names.key).await.expect("GET");
    assert_eq!(gone, None);
    tidy(&harness, &mut admin, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_hash_is_ignored_and_overwritten() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin");
    let key = unique_key("reentry-stale");
    let names = Names::new(&harness.config().prefix, &key);
    let opts = owned("job-8", Duration::from_secs(10));
    let old = lock.acquire(&key, &opts).await.expect("first");
    let _old2 = lock.acquire(&key, &opts).await.expect("re-entry");
    // The key goes (an operator's DEL); its hash stays behind with two entries.
    let _: () = admin.del(&names.key).await.expect("DEL");
    // A plain holder (another client) takes the key: the stale hash does not make it
    // the owner's.
    let (plain_client, other) = (harness.lock().await, harness.lock().await);
    let plain = plain_client
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("plain")
        .expect("the key is free");
    assert!(
        other.try_acquire(&key, &opts).await.expect("try").is_none(),
        "a stale hash let the owner into a plain hold"
    );
    plain.release().await.expect("release plain");
    // The owner takes it again: a new hold, one entry; the old leases are not of it.
    let new = other.acquire(&key, &opts).await.expect("new hold");
    assert!(new.fencing_token() > old.fencing_token());
    assert_eq!(entries(&mut admin, &names).await, 1);
    let err = old.release().await.expect_err("an earlier hold's lease");
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    assert_eq!(
        entries(&mut admin, &names).await,
        1,
        "the later hold kept its count"
    );
    new.release().await.expect("release");
    drop(_old2);
    tokio::time::sleep(Duration::from_millis(100)).await;
    tidy(&harness, &mut admin, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_of_two_clients_share_one_hold() {
    let harness = RedisHarness::from_env();
    let clients = [
        Arc::new(harness.lock().await),
        Arc::new(harness.lock().await),
    ];
    let mut admin = harness.admin().await.expect("admin");
    let key = unique_key("reentry-many");
    let names = Names::new(&harness.config().prefix, &key);
    let opts = owned("job-9", Duration::from_secs(10));
    let mut tasks = Vec::new();
    for client in &clients {
        for _ in 0..8 {
            let (client, key) = (client.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                client.acquire(&key, &opts).await.expect("acquire")
            }));
        }
    }
    let mut leases: Vec<Lease> = Vec::new();
    for task in tasks {
        leases.push(task.await.expect("task"));
    }
    let token = leases[0].fencing_token();
    assert!(leases.iter().all(|l| l.fencing_token() == token));
    assert_eq!(entries(&mut admin, &names).await, 16);
    // Another owner waits while any entry counts.
    let stranger = harness.lock().await;
    let last = leases.pop().expect("a lease");
    let releases: Vec<_> = leases
        .into_iter()
        .map(|l| tokio::spawn(async move { l.release().await }))
        .collect();
    for r in releases {
        r.await.expect("task").expect("release");
    }
    let waited = LockOptions::new().wait(Wait::For(Duration::from_millis(200)));
    let err = stranger
        .acquire(&key, &waited)
        .await
        .expect_err("still held");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    let patient = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
    let (called, released) = tokio::join!(stranger.acquire(&key, &patient), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        last.release().await
    });
    released.expect("last release");
    let next = called.expect("the key frees at the last release");
    assert!(next.fencing_token() > token);
    next.release().await.expect("release");
    tidy(&harness, &mut admin, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_reentries_never_shorten_the_hold() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin");
    let key = unique_key("reentry-ttl");
    let names = Names::new(&harness.config().prefix, &key);
    let long = lock
        .acquire(&key, &owned("job-10", Duration::from_secs(30)))
        .await
        .expect("long");
    let short = lock
        .acquire(&key, &owned("job-10", Duration::from_secs(2)))
        .await
        .expect("short");
    short.extend(Duration::from_secs(2)).await.expect("extend");
    let pttl: i64 = admin.pttl(&names.key).await.expect("PTTL");
    assert!(pttl > 25_000, "the short lease shortened the hold: {pttl}");
    let longer = lock
        .acquire(&key, &owned("job-10", Duration::from_secs(60)))
        .await
        .expect("longer");
    let pttl: i64 = admin.pttl(&names.key).await.expect("PTTL");
    let hold_pttl: i64 = admin.pttl(&names.hold).await.expect("PTTL");
    assert!(pttl > 55_000 && hold_pttl > 55_000, "{pttl} {hold_pttl}");
    for lease in [long, short, longer] {
        lease.release().await.expect("release");
    }
    tidy(&harness, &mut admin, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_hold_and_an_owner_wait_for_each_other() {
    let harness = RedisHarness::from_env();
    let (a, b) = (harness.lock().await, harness.lock().await);
    let mut admin = harness.admin().await.expect("admin");
    let key = unique_key("reentry-plain");
    let opts = owned("job-11", Duration::from_secs(10));
    let plain = a.acquire(&key, &LockOptions::new()).await.expect("plain");
    assert!(b.try_acquire(&key, &opts).await.expect("try").is_none());
    let patient = opts.wait(Wait::For(Duration::from_secs(5)));
    let (waited, released) = tokio::join!(b.acquire(&key, &patient), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        plain.release().await
    });
    released.expect("release");
    let owner = waited.expect("the owner got the key");
    assert!(
        a.try_acquire(&key, &LockOptions::new())
            .await
            .expect("try")
            .is_none()
    );
    let again = a
        .acquire(&key, &opts)
        .await
        .expect("another client of the owner");
    assert_eq!(again.fencing_token(), owner.fencing_token());
    owner.release().await.expect("release");
    again.release().await.expect("release");
    tidy(&harness, &mut admin, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_hold_is_lost_on_every_lease() {
    let harness = RedisHarness::from_env();
    let (a, b) = (harness.lock().await, harness.lock().await);
    let mut admin = harness.admin().await.expect("admin");
    let key = unique_key("reentry-lost");
    let names = Names::new(&harness.config().prefix, &key);
    let opts = owned("job-12", Duration::from_millis(600));
    let leases = [
        a.acquire(&key, &opts).await.expect("a"),
        a.acquire(&key, &opts).await.expect("a again"),
        b.acquire(&key, &opts).await.expect("b"),
    ];
    let _: () = admin.del(&[&names.key, &names.hold]).await.expect("DEL");
    for lease in &leases {
        tokio::time::timeout(Duration::from_secs(3), lease.lost())
            .await
            .expect("lost() fired");
    }
    drop(leases);
    tokio::time::sleep(Duration::from_millis(100)).await;
    tidy(&harness, &mut admin, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_released_by_its_token_alone_leaves_the_others() {
    // What a cancelled acquire's clean-up does: it knows only the token it sent.
    let harness = RedisHarness::from_env();
    let node = dlock_redis::server::Node::new(harness.config(), "redis").expect("node");
    let mut admin = harness.admin().await.expect("admin");
    let key = unique_key("reentry-node");
    let names = Names::new(&harness.config().prefix, &key);
    let ttl = Duration::from_secs(10);
    let (t1, t2) = (new_token(), new_token());
    let q = Queueing::default();
    let first = node.acquire_owned(&names, &t1, ttl, &q, "job-13").await;
    let Ok(Attempt::Taken { fence }) = first else {
        panic!("{first:?}")
    };
    let second = node.acquire_owned(&names, &t2, ttl, &q, "job-13").await;
    assert_eq!(
        second.expect("re-entry"),
        Attempt::Entered {
            fence,
            hold: t1.clone()
        }
    );
    let other = node
        .acquire_owned(&names, &new_token(), ttl, &q, "job-14")
        .await;
    assert!(matches!(other, Ok(Attempt::Busy { .. })), "{other:?}");
    assert!(!node.release_owned(&names, &t2, "job-14").await.expect("r"));
    assert!(node.release_owned(&names, &t2, "job-13").await.expect("r"));
    assert!(!node.release_owned(&names, &t2, "job-13").await.expect("r"));
    assert_eq!(entries(&mut admin, &names).await, 1);
    assert!(node.release_owned(&names, &t1, "job-13").await.expect("r"));
    tidy(&harness, &mut admin, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owners_waiting_in_two_clients_both_get_the_hold() {
    let harness = RedisHarness::from_env();
    let (plain_client, a, b) = (
        harness.lock().await,
        harness.lock().await,
        harness.lock().await,
    );
    let mut admin = harness.admin().await.expect("admin");
    let key = unique_key("reentry-queued");
    let names = Names::new(&harness.config().prefix, &key);
    let plain = plain_client
        .acquire(&key, &LockOptions::new())
        .await
        .expect("plain");
    let opts = owned("job-15", Duration::from_secs(10)).wait(Wait::For(Duration::from_secs(5)));
    // The first in line takes the key; the other learns at its next refresh (1 s) that
    // the key is its owner's, and enters the hold.
    let (first, second, ()) = tokio::join!(a.acquire(&key, &opts), b.acquire(&key, &opts), async {
        common::until_queued(&mut admin, &names, 2).await;
        common::wait_for_subscribers(&mut admin, &names.channel, 2).await;
        // Both re-tried after subscribing, and sleep.
        tokio::time::sleep(Duration::from_millis(100)).await;
        plain.release().await.expect("release");
    });
    let (first, second) = (first.expect("a"), second.expect("b"));
    assert_eq!(first.fencing_token(), second.fencing_token());
    first.release().await.expect("release");
    second.release().await.expect("release");
    tidy(&harness, &mut admin, &key).await;
}
