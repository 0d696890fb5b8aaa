//! Permits on MySQL / MariaDB, beyond the shared suite: a key's permits are slot rows of
//! `{table}_slots`, created on first use and kept, and a permit is a slot's row lock (so a
//! plain SQL session locking a slot takes a permit); clients racing to create a key's
//! slots all get in at once, taking turns to create them; and the documented rule for disagreeing limits (each counts
//! the holders of the slots below its own limit).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::MysqlHarness;
use dlock_core::{DistributedLock, Lease, LockOptions};
use futures::future::join_all;
use sqlx::{Executor, Row};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);

async fn client(h: &MysqlHarness) -> Arc<dyn DistributedLock> {
    h.must_client().await
}

fn unique(name: &str) -> String {
    dlock_conformance::testkit::unique_key(name)
}

fn permits(n: u32) -> LockOptions {
    LockOptions::new().ttl(TTL).permits(n)
}

async fn take(client: &dyn DistributedLock, key: &str, n: u32) -> Lease {
    client
        .try_acquire(key, &permits(n))
        .await
        .expect("try_acquire")
        .unwrap_or_else(|| panic!("{key} should have a free permit of {n}"))
}

async fn is_busy(client: &dyn DistributedLock, key: &str, n: u32) -> bool {
    client
        .try_acquire(key, &permits(n))
        .await
        .expect("try")
        .is_none()
}

/// The key's row name as a binary literal, for plain SQL on the slots table.
fn name_literal(key: &str) -> String {
    let hex: String = common::row_name(key)
        .bytes()
        .map(|b| format!("{b:02X}"))
        .collect();
    format!("X'{hex}'")
}

/// The key's creation lock, computed on the server as the crate docs state it: `dlock-slots:`
/// and the first 52 hex digits of the SHA-256 of the slots table's name, a NUL byte and the
/// key's row name.
fn creation_lock(h: &MysqlHarness, key: &str) -> String {
    format!(
        "CONCAT('dlock-slots:', LEFT(SHA2(CONCAT('{}', 0x00, {}), 256), 52))",
        h.config().slots_table(),
        name_literal(key)
    )
}

/// The key's slot numbers in the slots table, and delete them (the test's clean-up).
async fn slots_then_delete(h: &MysqlHarness, key: &str) -> Vec<u16> {
    let mut admin = h.admin().await.expect("admin connection");
    let table = h.config().slots_table();
    let name = name_literal(key);
    let rows = admin
        .fetch_all(format!("SELECT slot FROM `{table}` WHERE name = {name} ORDER BY slot").as_str())
        .await
        .expect("read the slots");
    admin
        .execute(format!("DELETE FROM `{table}` WHERE name = {name}").as_str())
        .await
        .expect("delete the slots");
    rows.iter().map(|r| r.get::<u16, _>(0)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_are_rows_made_when_needed_and_kept_and_a_plain_sql_lock_on_one_takes_a_permit() {
    let h = MysqlHarness::from_env();
    let c = client(&h).await;
    let key = unique("slots");
    let three = [
        take(&*c, &key, 3).await,
        take(&*c, &key, 3).await,
        take(&*c, &key, 3).await,
    ];
    // A larger limit that finds its slots below 3 held adds the ones it lacks.
    take(&*c, &key, 5).await.release().await.expect("release");
    for lease in three {
        lease.release().await.expect("release");
    }

    let mut sql = h.admin().await.expect("admin connection");
    sql.execute("BEGIN").await.expect("begin");
    let lock = format!(
        "SELECT slot FROM `{}` WHERE name = {} AND slot = 0 FOR UPDATE",
        h.config().slots_table(),
        name_literal(&key)
    );
    sql.fetch_one(lock.as_str()).await.expect("lock slot 0");
    assert!(
        is_busy(&*c, &key, 1).await,
        "a session locking slot 0 holds the only permit of 1"
    );
    let second = take(&*c, &key, 2).await;
    sql.execute("ROLLBACK").await.expect("rollback");
    second.release().await.expect("release");

    assert_eq!(slots_then_delete(&h, &key).await, [0, 1, 2, 3, 4]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_racing_to_create_a_keys_slots_all_get_a_permit_at_once() {
    const N: u32 = 8;
    let h = MysqlHarness::from_env();
    let key = unique("race");
    let mut clients = Vec::new();
    for _ in 0..N {
        clients.push(client(&h).await);
    }
    let tries = clients.iter().map(|c| {
        let key = key.clone();
        async move {
            let asked = Instant::now();
            let lease = c.try_acquire(&key, &permits(N)).await.expect("try_acquire");
            (lease, asked.elapsed())
        }
    });
    let answers = join_all(tries).await;
    let slowest = answers
        .iter()
        .map(|(_, took)| *took)
        .max()
        .unwrap_or_default();
    // Creators take turns, each turn one insert.
    assert!(
        slowest < Duration::from_secs(3),
        "a try_acquire took {slowest:?}"
    );
    let leases: Vec<Lease> = answers.into_iter().filter_map(|(l, _)| l).collect();
    assert_eq!(leases.len(), N as usize, "every racing client got a permit");
    for lease in leases {
        lease.release().await.expect("release");
    }
    assert_eq!(slots_then_delete(&h, &key).await.len(), N as usize);
}

/// Clients creating a key's slots take turns (`GET_LOCK` of the key's creation lock), so
/// that no creator's duplicate-key check locks a slot another one just made; a turn held
/// for more than 2 s (a stuck creator) is passed over, and a creator gives its turn back
/// once its slots are made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn creators_of_a_keys_slots_take_turns_and_pass_over_a_stuck_one() {
    let h = MysqlHarness::from_env();
    let c = client(&h).await;
    let (stuck, key) = (unique("stuck-turn"), unique("turn"));
    let mut sql = h.admin().await.expect("admin connection");
    let is_free = |key: &str| format!("SELECT IS_FREE_LOCK({})", creation_lock(&h, key));
    let held: i64 = sql
        .fetch_one(format!("SELECT GET_LOCK({}, 0)", creation_lock(&h, &stuck)).as_str())
        .await
        .expect("take the turn")
        .get(0);
    assert_eq!(held, 1);

    let asked = Instant::now();
    let lease = take(&*c, &stuck, 2).await;
    assert!(
        asked.elapsed() >= Duration::from_millis(1900),
        "the creator waited for the turn a plain session held, {:?}",
        asked.elapsed()
    );
    lease.release().await.expect("release");

    let lease = take(&*c, &key, 2).await;
    // Asked while the lease holds its connection: the batch itself gave the turn back.
    let free: i64 = sql
        .fetch_one(is_free(&key).as_str())
        .await
        .expect("is free")
        .get(0);
    assert_eq!(free, 1, "the creator gave its turn back");
    lease.release().await.expect("release");
    assert_eq!(slots_then_delete(&h, &stuck).await, [0, 1]);
    assert_eq!(slots_then_delete(&h, &key).await, [0, 1]);
}

/// A creator whose insert fails with the turn held (it met a slot a plain SQL session
/// inserted without taking a turn, and waited out its lock wait) starts over, and gives
/// the turn back as it does: it is never left to the connection's next user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_creator_whose_insert_fails_gives_its_turn_back() {
    let h = MysqlHarness::from_env();
    let c = client(&h).await;
    let key = unique("failed-turn");
    let mut sql = h.admin().await.expect("admin connection");
    sql.execute("BEGIN").await.expect("begin");
    let insert = format!(
        "INSERT INTO `{}` (name, slot) VALUES ({}, 0)",
        h.config().slots_table(),
        name_literal(&key)
    );
    sql.execute(insert.as_str()).await.expect("insert slot 0");
    let creator = {
        let (c, key) = (c.clone(), key.clone());
        tokio::spawn(async move { take(&*c, &key, 2).await })
    };
    // The creator's insert, once it runs (its read view taken), can only wait for the
    // uncommitted slot, then fail (duplicate key).
    let hex = name_literal(&key)
        .trim_start_matches("X'")
        .trim_end_matches('\'')
        .to_owned();
    let waiting = format!(
        "SELECT COUNT(*) FROM information_schema.PROCESSLIST \
           WHERE INFO LIKE 'INSERT INTO%' AND LOCATE('{hex}', INFO) > 0"
    );
    let polled = Instant::now();
    loop {
        let n: i64 = sql.fetch_one(waiting.as_str()).await.expect("poll").get(0);
        if n > 0 {
            break;
        }
        assert!(
            polled.elapsed() < Duration::from_secs(10),
            "the creator's insert never ran"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sql.execute("COMMIT").await.expect("commit");
    creator
        .await
        .expect("the creator")
        .release()
        .await
        .expect("release");
    let is_free = format!("SELECT IS_FREE_LOCK({})", creation_lock(&h, &key));
    let free: i64 = sql
        .fetch_one(is_free.as_str())
        .await
        .expect("is free")
        .get(0);
    assert_eq!(free, 1, "the creator gave its turn back");
    assert_eq!(slots_then_delete(&h, &key).await, [0, 1]);
}

/// The rule the crate docs state for disagreeing limits: an acquire of `Permits(n)` is
/// admitted while one of slots `0..n` is free, so it counts the holders of those slots.
/// Two holders of 2 and one of 3 (slot 2); when a holder of 2 leaves, an asker of 2 gets
/// its slot although three holders were there before it: it does not count slot 2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_counts_the_holders_of_the_slots_below_it() {
    let h = MysqlHarness::from_env();
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let key = unique("limits");
    let first = take(&*a, &key, 2).await;
    let second = take(&*b, &key, 2).await;
    assert!(is_busy(&*c, &key, 2).await, "slots 0 and 1 are held");
    let third = take(&*c, &key, 3).await;
    assert!(is_busy(&*c, &key, 3).await, "slots 0 to 2 are held");
    first.release().await.expect("release");
    let fourth = take(&*a, &key, 2).await;
    for lease in [second, third, fourth] {
        lease.release().await.expect("release");
    }
    assert_eq!(slots_then_delete(&h, &key).await, [0, 1, 2]);
}
