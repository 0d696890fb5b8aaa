//! Shared holds on PostgreSQL, beyond the shared suite: re-entry on a holder connection
//! that must not pass a waiting writer, interop with `pg_advisory_lock_shared` taken by
//! hand, a writer's timeout that lets the readers queued behind it in, a release that
//! admits every queued reader with one wake-up each, and the idle session timeout.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::PostgresHarness;
use dlock_core::{DistributedLock, ErrorKind, Lease, LockOptions, Mode, Wait};
use sqlx::{Connection, Row};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

fn harness() -> PostgresHarness {
    PostgresHarness::from_env()
}

async fn client(h: &PostgresHarness) -> Arc<dyn DistributedLock> {
    h.must_client().await
}

fn unique(name: &str) -> String {
    dlock_conformance::testkit::unique_key(name)
}

fn write() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(5))
}

fn read() -> LockOptions {
    write().shared()
}

async fn take(client: &dyn DistributedLock, key: &str, opts: &LockOptions) -> Lease {
    client
        .try_acquire(key, opts)
        .await
        .expect("try_acquire")
        .unwrap_or_else(|| panic!("{key} should be free for a {} hold", opts.mode))
}

/// `acquire` in a task of its own, waiting up to `wait`.
fn waiting(
    client: &Arc<dyn DistributedLock>,
    key: &str,
    opts: LockOptions,
    wait: Duration,
) -> JoinHandle<dlock_core::Result<Lease>> {
    let (client, key) = (client.clone(), key.to_owned());
    tokio::spawn(async move { client.acquire(&key, &opts.wait(Wait::For(wait))).await })
}

/// Poll (up to 5 s) until `n` requests wait in the server's queue for `key`.
async fn until_queued(h: &PostgresHarness, key: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let queued = h.sessions_on(key, false).await.expect("pg_locks").len();
        if queued >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key}: {queued} of {n} requests queued after 5 s"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_readers_share_its_holder_connection() {
    let h = harness();
    let a = client(&h).await;
    let key = unique("re-entry");
    let first = take(&*a, &key, &read()).await;
    let second = take(&*a, &key, &read()).await;
    // Both on the one holder connection: the session holds the lock twice.
    assert_eq!(h.sessions_on(&key, true).await.unwrap().len(), 1);
    assert!(second.fencing_token() > first.fencing_token());
    first.release().await.expect("release the first reader");
    assert!(
        a.try_acquire(&key, &write()).await.unwrap().is_none(),
        "the second reader still holds the key"
    );
    second.release().await.expect("release the second reader");
    take(&*a, &key, &write()).await.release().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_a_connection_that_already_reads_does_not_pass_a_waiting_writer() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let key = unique("re-entry-behind-writer");
    let first = take(&*a, &key, &read()).await;
    let writer = waiting(&b, &key, write(), Duration::from_secs(20));
    until_queued(&h, &key, 1).await;
    // The server would grant its session's re-entry past the queue; the backend does not.
    assert!(
        a.try_acquire(&key, &read()).await.unwrap().is_none(),
        "a later reader of the holding client passed the waiting writer"
    );
    let late = waiting(&a, &key, read(), Duration::from_secs(20));
    until_queued(&h, &key, 2).await;
    first.release().await.expect("release the first reader");
    let writing = writer.await.unwrap().expect("the writer goes first");
    assert!(
        !late.is_finished(),
        "the late reader got in beside the writer"
    );
    let written = writing.fencing_token();
    writing.release().await.unwrap();
    let reading = late.await.unwrap().expect("the late reader follows");
    assert!(reading.fencing_token() > written);
    reading.release().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_by_hand_share_with_dlock_readers_and_exclude_its_writers() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let key = unique("by-hand");
    take(&*a, &key, &write()).await.release().await.unwrap();
    let table = &h.config().table;
    let ns = h.config().namespace;
    // As the crate docs say: pg_advisory_lock_shared(namespace, id) FROM dlock_keys …
    let mut other = h.admin().await.unwrap();
    let by_hand = |f: &str| format!("SELECT {f}($2, id) FROM {table} WHERE name = $1");
    let row = sqlx::query(&by_hand("pg_try_advisory_lock_shared"))
        .bind(&key)
        .bind(ns)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(row.get::<bool, _>(0), "the key is free");
    let reading = take(&*a, &key, &read()).await;
    assert!(
        b.try_acquire(&key, &write()).await.unwrap().is_none(),
        "a writer while read by hand and by dlock"
    );
    // pg_locks shows dlock's reader in share mode beside the one by hand.
    let sql = format!(
        "SELECT count(*) FROM pg_locks l JOIN {table} k ON l.locktype = 'advisory' \
         AND l.classid = ($2::int)::oid AND l.objid = k.id::oid AND l.objsubid = 2 \
         WHERE k.name = $1 AND l.mode = 'ShareLock' AND l.granted"
    );
    let readers: i64 = sqlx::query_scalar(&sql)
        .bind(&key)
        .bind(ns)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert_eq!(readers, 2);
    reading.release().await.unwrap();
    let writer = waiting(&b, &key, write(), Duration::from_secs(10));
    until_queued(&h, &key, 1).await;
    sqlx::query(&by_hand("pg_advisory_unlock_shared"))
        .bind(&key)
        .bind(ns)
        .execute(&mut other)
        .await
        .unwrap();
    let writing = writer
        .await
        .unwrap()
        .expect("granted after the unlock by hand");
    // And a writer by dlock excludes a reader by hand.
    let row = sqlx::query(&by_hand("pg_try_advisory_lock_shared"))
        .bind(&key)
        .bind(ns)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(!row.get::<bool, _>(0), "read by hand while dlock writes");
    writing.release().await.unwrap();
    other.close().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_times_out_lets_the_readers_queued_behind_it_in() {
    let h = harness();
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let key = unique("writer-timeout");
    let first = take(&*a, &key, &read()).await;
    // Long enough for the late reader to queue behind it on a loaded machine.
    let writer = waiting(&b, &key, write(), Duration::from_secs(3));
    until_queued(&h, &key, 1).await;
    let late = waiting(&c, &key, read(), Duration::from_secs(10));
    until_queued(&h, &key, 2).await;
    let err = writer.await.unwrap().expect_err("the reader holds on");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    // The server's lock_timeout took the writer out of the queue and granted the reader.
    let reading = timeout(Duration::from_secs(1), late)
        .await
        .expect("the late reader is let in when the writer leaves")
        .unwrap()
        .expect("the late reader holds");
    assert_eq!(reading.mode(), Mode::Shared);
    first.release().await.unwrap();
    reading.release().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_release_admits_every_queued_reader_with_one_wake_up_each() {
    const READERS: usize = 3;
    let h = harness();
    let a = client(&h).await;
    let key = unique("admit-readers");
    let writing = take(&*a, &key, &write()).await;
    let mut readers = Vec::new();
    let mut waits = Vec::new();
    for _ in 0..READERS {
        let reader = client(&h).await;
        waits.push(waiting(&reader, &key, read(), Duration::from_secs(10)));
        readers.push(reader);
    }
    until_queued(&h, &key, READERS).await;
    writing.release().await.unwrap();
    let mut leases = Vec::new();
    for wait in waits {
        leases.push(wait.await.unwrap().expect("every queued reader is let in"));
    }
    let wakeups: u64 = readers.iter().map(|r| r.stats().wakeups).sum();
    assert_eq!(wakeups, READERS as u64, "one wake-up per reader let in");
    for lease in leases {
        lease.release().await.unwrap();
    }
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_readers_session_ends_after_the_ttl_and_frees_the_key() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let key = unique("idle-reader");
    // No renewal: a connection of its own, which the server ends ttl after its last request.
    let o = read().ttl(Duration::from_millis(700)).auto_renew(false);
    let lease = take(&*a, &key, &o).await;
    let writer = waiting(&b, &key, write(), Duration::from_secs(10));
    let writing = writer
        .await
        .unwrap()
        .expect("the writer gets the key when the reader's session ends");
    timeout(Duration::from_secs(2), lease.lost())
        .await
        .expect("the silent reader hears it lost its hold");
    assert_eq!(
        lease.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    writing.release().await.unwrap();
    h.assert_no_session_on(&key).await;
}
