//! Permits on PostgreSQL, beyond the shared suite: the slot locks behind them (one holder
//! connection carrying several permits of a key takes several slots; a try takes the lowest
//! free slot and no other), slots taken by hand counting as permits, a waiter holding
//! nothing on the server, a slot freed by an ended session reaching a waiter, and a release
//! by hand with its notification.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::PostgresHarness;
use dlock_core::{DistributedLock, Lease, LockOptions, Wait};
use sqlx::postgres::PgConnection;
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

fn permits(n: u32) -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(5)).permits(n)
}

async fn take(client: &dyn DistributedLock, key: &str, opts: &LockOptions) -> Lease {
    client
        .try_acquire(key, opts)
        .await
        .expect("try_acquire")
        .unwrap_or_else(|| panic!("{key} should have a free {}", opts.mode))
}

async fn refused(client: &dyn DistributedLock, key: &str, opts: &LockOptions) {
    let got = client.try_acquire(key, opts).await.expect("try_acquire");
    assert!(got.is_none(), "{key}: a {} was granted", opts.mode);
}

/// `acquire` in a task of its own, waiting up to 30 s.
fn waiting(client: &Arc<dyn DistributedLock>, key: &str, opts: LockOptions) -> JoinHandle<Lease> {
    let (client, key) = (client.clone(), key.to_owned());
    tokio::spawn(async move {
        let wait = opts.wait(Wait::For(Duration::from_secs(30)));
        client.acquire(&key, &wait).await.expect("a waiting permit")
    })
}

/// The slots of `key` held now.
async fn slots(h: &PostgresHarness, key: &str) -> Vec<i64> {
    let held = h.slots_of(key).await.expect("pg_locks");
    held.into_iter().map(|(_, slot)| slot).collect()
}

/// Make `key`'s row (its id) with a permit taken and given back.
async fn key_id(h: &PostgresHarness, client: &dyn DistributedLock, key: &str) -> i32 {
    take(client, key, &permits(1))
        .await
        .release()
        .await
        .expect("release");
    h.id_of(key).await.expect("id").expect("the key has a row")
}

/// Take slot `slot` of key `id` by hand on `conn`, as the crate docs show.
async fn take_by_hand(h: &PostgresHarness, conn: &mut PgConnection, id: i32, slot: i32) {
    let class = h.config().namespace.wrapping_add(slot);
    let row = sqlx::query("SELECT pg_try_advisory_lock($1, $2)")
        .bind(class)
        .bind(id)
        .fetch_one(conn)
        .await
        .expect("pg_try_advisory_lock");
    assert!(row.get::<bool, _>(0), "slot {slot} should be free");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_clients_permits_of_a_key_take_different_slots() {
    let h = harness();
    let a = client(&h).await;
    let key = unique("one-carrier");
    let mut leases = Vec::new();
    for _ in 0..3 {
        leases.push(take(&*a, &key, &permits(3)).await);
    }
    let held = h.slots_of(&key).await.expect("pg_locks");
    assert_eq!(
        held.iter().map(|(_, s)| *s).collect::<Vec<_>>(),
        [0, 1, 2],
        "{held:?}"
    );
    assert!(
        held.iter().all(|(pid, _)| *pid == held[0].0),
        "one holder connection carries them: {held:?}"
    );
    // The session would be granted its own slots again: the try skips them.
    refused(&*a, &key, &permits(3)).await;
    for lease in leases {
        lease.release().await.expect("release");
    }
    assert!(slots(&h, &key).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_takes_the_lowest_free_slot_and_no_other() {
    let h = harness();
    let a = client(&h).await;
    let key = unique("lowest");
    let id = key_id(&h, &*a, &key).await;
    let mut by_hand = h.admin().await.expect("admin");
    for slot in [0, 2] {
        take_by_hand(&h, &mut by_hand, id, slot).await;
    }
    let lease = take(&*a, &key, &permits(5)).await;
    assert_eq!(
        slots(&h, &key).await,
        [0, 1, 2],
        "slot 1 only, not 3 or 4 too"
    );
    lease.release().await.expect("release");
    by_hand.close().await.expect("close");
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_taken_by_hand_count_as_permits() {
    let h = harness();
    let a = client(&h).await;
    let key = unique("by-hand");
    let id = key_id(&h, &*a, &key).await;
    let mut by_hand = h.admin().await.expect("admin");
    for slot in [0, 1] {
        take_by_hand(&h, &mut by_hand, id, slot).await;
    }
    refused(&*a, &key, &permits(2)).await;
    let third = take(&*a, &key, &permits(3)).await;
    third.release().await.expect("release");
    by_hand.close().await.expect("close");
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_holds_and_queues_nothing_on_the_server() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let key = unique("waiter");
    let held = take(&*a, &key, &permits(1)).await;
    let waiter = waiting(&b, &key, permits(1));
    // A fixed pause, not a poll: time for the waiter to have tried and started waiting.
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    assert!(h.sessions_on(&key, false).await.unwrap().is_empty());
    assert_eq!(h.sessions_on(&key, true).await.unwrap().len(), 1);
    held.release().await.expect("release");
    let lease = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the freed permit")
        .expect("waiter task");
    lease.release().await.expect("release");
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_freed_by_an_ended_session_reaches_a_waiter() {
    let h = harness();
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let key = unique("ended");
    let ending = take(&*a, &key, &permits(2)).await;
    let staying = take(&*b, &key, &permits(2)).await;
    let waiter = waiting(&c, &key, permits(2));
    let (pid, _) = h.slots_of(&key).await.unwrap()[0];
    // No release and no notification: the server frees the slot when the session ends.
    let ended = Instant::now();
    h.kill_session(pid).await.expect("pg_terminate_backend");
    let lease = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the ended session's permit")
        .expect("waiter task");
    tracing::info!(took = ?ended.elapsed(), "an ended session's permit reached a waiter");
    timeout(Duration::from_secs(10), ending.lost())
        .await
        .expect("the ended session's lease is lost");
    assert!(!staying.is_lost());
    for lease in [lease, staying] {
        lease.release().await.expect("release");
    }
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_hand_with_its_notification_lets_a_waiter_in() {
    let h = harness();
    let a = client(&h).await;
    let key = unique("notify-by-hand");
    let id = key_id(&h, &*a, &key).await;
    let mut by_hand = h.admin().await.expect("admin");
    take_by_hand(&h, &mut by_hand, id, 0).await;
    let waiter = waiting(&a, &key, permits(1));
    sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished());
    let channel = format!("dlock_permits_{}", h.config().namespace as u32);
    sqlx::query("SELECT pg_advisory_unlock($1, $2), pg_notify($3, $2::text)")
        .bind(h.config().namespace)
        .bind(id)
        .bind(&channel)
        .execute(&mut by_hand)
        .await
        .expect("release by hand");
    let lease = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter gets the permit")
        .expect("waiter task");
    lease.release().await.expect("release");
    by_hand.close().await.expect("close");
    h.assert_no_session_on(&key).await;
}
