//! Inspecting on PostgreSQL, beyond the shared suite: who a holder is (its session's
//! `application_name`, the holder description unless the URL names one), sessions by hand,
//! a semaphore's slots, and reading without writing (no key row made, other namespaces left
//! out of `list`).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::PostgresHarness;
use dlock_conformance::{Harness, url_with_option as with_option};
use dlock_core::{DistributedLock, Lease, LockOptions, Mode};
use sqlx::Connection;

fn harness() -> PostgresHarness {
    PostgresHarness::from_env()
}

async fn client(h: &PostgresHarness) -> Arc<dyn DistributedLock> {
    h.must_client().await
}

fn unique(name: &str) -> String {
    dlock_conformance::testkit::unique_key(name)
}

async fn take(client: &dyn DistributedLock, key: &str, opts: &LockOptions) -> Lease {
    client
        .try_acquire(key, opts)
        .await
        .expect("try_acquire")
        .unwrap_or_else(|| panic!("{key} should be free"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_never_locked_is_free_and_gets_no_row() {
    let h = harness();
    let a = client(&h).await;
    let key = unique("never");
    let status = a.inspect(&key).await.expect("inspect");
    assert!(!status.is_held(), "{status:?}");
    assert_eq!(status.waiters, Some(Vec::new()), "{status:?}");
    assert_eq!(h.id_of(&key).await.unwrap(), None, "inspect made a key row");
    assert!(a.list(&key).await.expect("list").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holders_are_named_by_their_sessions() {
    let h = harness();
    let (a, d) = (client(&h).await, client(&h).await);
    let named = h
        .connect(&with_option(&h.url(), "application_name=billing"))
        .await
        .expect("a client named in its URL");
    let opts = LockOptions::new().ttl(Duration::from_secs(10));

    // By default, the holder description of this process.
    let key = unique("who");
    let lease = take(&*a, &key, &opts).await;
    let status = d.inspect(&key).await.expect("inspect");
    let who = status.holders[0].who.clone().expect("who");
    assert!(
        who.ends_with(&format!(":{}", std::process::id())) && who.contains('@'),
        "NAME@HOST:PID: {who}"
    );
    assert_eq!(status.holders[0].mode, Mode::Exclusive);
    assert_eq!(
        status.holders[0].fencing_token, None,
        "not visible to others"
    );
    lease.release().await.unwrap();

    // A name the URL gives is kept.
    let lease = take(&*named, &key, &opts).await;
    let status = d.inspect(&key).await.expect("inspect");
    assert_eq!(
        status.holders[0].who.as_deref(),
        Some("billing"),
        "{status:?}"
    );
    lease.release().await.unwrap();

    // A session by hand, without a name: its backend pid and address; a waiter by hand
    // shows when it began to wait.
    let id = h.id_of(&key).await.unwrap().expect("an id row");
    let ns = h.config().namespace;
    let mut by_hand = h.admin().await.unwrap();
    sqlx::query("SELECT pg_advisory_lock($1, $2)")
        .bind(ns)
        .bind(id)
        .execute(&mut by_hand)
        .await
        .unwrap();
    let waiter = {
        let key = key.clone();
        let b = client(&h).await;
        tokio::spawn(async move {
            let opts = LockOptions::new().wait(dlock_core::Wait::For(Duration::from_secs(30)));
            b.acquire(&key, &opts).await.expect("the waiter")
        })
    };
    let until = tokio::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        let status = d.inspect(&key).await.expect("inspect");
        let queued = status.waiters.as_ref().is_some_and(|w| !w.is_empty());
        if queued || tokio::time::Instant::now() > until {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let holder = status.holders[0].who.as_deref().unwrap_or_default();
    assert!(holder.starts_with("backend "), "{status:?}");
    let waiters = status.waiters.as_ref().expect("waiters shown");
    assert_eq!(waiters.len(), 1, "{status:?}");
    assert_eq!(waiters[0].mode, Some(Mode::Exclusive));
    assert!(waiters[0].since.is_some(), "waitstart: {status:?}");
    assert!(waiters[0].who.as_deref().is_some_and(|w| w.contains('@')));
    sqlx::query("SELECT pg_advisory_unlock_all()")
        .execute(&mut by_hand)
        .await
        .unwrap();
    by_hand.close().await.unwrap();
    waiter.await.unwrap().release().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphores_slots_are_permits_and_its_waiters_are_not_shown() {
    let h = harness();
    let (a, d) = (client(&h).await, client(&h).await);
    let key = unique("sem");
    let opts = LockOptions::new().permits(2);
    let first = take(&*a, &key, &opts).await;
    // Slot 0 alone is the key's own lock: it looks like a mutex.
    let status = d.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders[0].mode, Mode::Exclusive, "{status:?}");
    let second = take(&*a, &key, &opts).await;
    let status = d.inspect(&key).await.expect("inspect");
    let modes: Vec<_> = status.holders.iter().map(|h| h.mode).collect();
    assert_eq!(modes, [Mode::Permits(0), Mode::Permits(0)], "{status:?}");
    assert_eq!(status.waiters, None, "{status:?}");
    assert_eq!(d.list(&key).await.expect("list"), [key.as_str()]);
    first.release().await.unwrap();
    second.release().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_leaves_out_other_namespaces() {
    let h = harness();
    let d = client(&h).await;
    let other_ns = h.config().namespace.wrapping_add(20_000);
    let other = h
        .connect(&with_option(&h.url(), &format!("namespace={other_ns}")))
        .await
        .expect("a client of another namespace");
    let prefix = unique("ns/");
    let (mine, theirs) = (format!("{prefix}mine"), format!("{prefix}theirs"));
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let held = [
        take(&*d, &mine, &opts).await,
        take(&*other, &theirs, &opts).await,
    ];
    assert_eq!(d.list(&prefix).await.expect("list"), [mine.as_str()]);
    assert_eq!(other.list(&prefix).await.expect("list"), [theirs.as_str()]);
    assert!(!d.inspect(&theirs).await.expect("inspect").is_held());
    for lease in held {
        lease.release().await.unwrap();
    }
}
