//! Shared holds on MySQL / MariaDB, beyond the shared suite: they are InnoDB's own shared
//! row lock, so plain SQL sessions locking the row take part; one release admits every
//! queued reader, each woken once; a reader that gives up leaves no waiter on the server.

mod common;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use common::MysqlHarness;
use dlock_core::{DistributedLock, ErrorKind, Lease, LockOptions, Wait};
use sqlx::Executor;
use tokio::time::sleep;

const TTL: Duration = Duration::from_secs(10);

fn harness() -> MysqlHarness {
    MysqlHarness::from_env()
}

async fn client(h: &MysqlHarness) -> Arc<dyn DistributedLock> {
    h.must_client().await
}

fn unique(name: &str) -> String {
    dlock_conformance::testkit::unique_key(name)
}

fn write() -> LockOptions {
    LockOptions::new().ttl(TTL)
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

async fn is_busy(client: &dyn DistributedLock, key: &str, opts: &LockOptions) -> bool {
    client.try_acquire(key, opts).await.expect("try").is_none()
}

/// The key's row as a binary literal, for plain SQL on the lock table.
fn row_literal(key: &str) -> String {
    let mut out = String::from("X'");
    for b in common::row_name(key).bytes() {
        let _ = write!(out, "{b:02X}");
    }
    out.push('\'');
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_sql_shared_lock_on_the_row_is_a_reader_and_for_update_a_writer() {
    let h = harness();
    let key = unique("plain-sql");
    let c = client(&h).await;
    // The first hold creates the key's row, which plain SQL then locks.
    take(&*c, &key, &write())
        .await
        .release()
        .await
        .expect("release");
    let table = &h.config().table;
    let row = row_literal(&key);
    let shared_clause = match h
        .admin()
        .await
        .expect("admin")
        .fetch_one("SELECT VERSION()")
        .await
    {
        Ok(v) if sqlx::Row::get::<String, _>(&v, 0).contains("MariaDB") => "LOCK IN SHARE MODE",
        _ => "FOR SHARE",
    };

    let mut sql = h.admin().await.expect("admin connection");
    sql.execute("BEGIN").await.expect("begin");
    sql.execute(format!("SELECT 1 FROM `{table}` WHERE name = {row} {shared_clause}").as_str())
        .await
        .expect("a plain shared lock on the row");
    let reader = take(&*c, &key, &read()).await;
    assert!(
        is_busy(&*c, &key, &write()).await,
        "a plain SQL reader and a dlock reader keep a dlock writer out"
    );
    reader.release().await.expect("release the reader");
    sql.execute("ROLLBACK").await.expect("rollback");

    sql.execute("BEGIN").await.expect("begin");
    sql.execute(format!("SELECT 1 FROM `{table}` WHERE name = {row} FOR UPDATE").as_str())
        .await
        .expect("a plain exclusive lock on the row");
    assert!(
        is_busy(&*c, &key, &read()).await,
        "a plain SQL writer keeps a dlock reader out"
    );
    sql.execute("ROLLBACK").await.expect("rollback");
    take(&*c, &key, &read())
        .await
        .release()
        .await
        .expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_release_admits_every_queued_reader_each_woken_once() {
    const READERS: usize = 3;
    let h = harness();
    let key = unique("admit-all");
    let writer_client = client(&h).await;
    let writer = take(&*writer_client, &key, &write()).await;
    let mut readers = Vec::new();
    for _ in 0..READERS {
        readers.push(client(&h).await);
    }
    let waiting: Vec<_> = readers
        .iter()
        .map(|c| {
            let (c, key) = (c.clone(), key.clone());
            tokio::spawn(async move {
                let opts = read().wait(Wait::For(Duration::from_secs(20)));
                c.acquire(&key, &opts).await
            })
        })
        .collect();
    assert!(
        h.wait_for_waiters(&key, READERS as u64).await,
        "the readers never all waited on the server"
    );
    let woken_before: u64 = readers.iter().map(|c| c.stats().wakeups).sum();

    let writer_token = writer.fencing_token();
    writer.release().await.expect("release the writer");
    let mut leases = Vec::new();
    for task in waiting {
        let lease = task
            .await
            .expect("join")
            .expect("each reader takes the key");
        assert!(
            lease.fencing_token() > writer_token,
            "a reader's token is above the earlier writer's"
        );
        leases.push(lease);
    }
    let woken: u64 = readers.iter().map(|c| c.stats().wakeups).sum::<u64>() - woken_before;
    assert_eq!(woken, READERS as u64, "one wake-up per admitted reader");
    for lease in leases {
        lease.release().await.expect("release a reader");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_gives_up_leaves_no_waiter_behind() {
    let h = harness();
    let key = unique("reader-gives-up");
    let (a, b) = (client(&h).await, client(&h).await);
    let writer = take(&*a, &key, &write()).await;

    let err = b
        .acquire(&key, &read().wait(Wait::For(Duration::from_millis(300))))
        .await
        .expect_err("a writer holds the key");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    // The waiting statement was killed: no session of b waits on the row.
    sleep(Duration::from_millis(150)).await;
    assert_eq!(h.waiters_on(&key).await.expect("lock waits"), 0);

    // Right after the writer releases, another writer takes the key at once: the reader
    // that gave up never took it later.
    writer.release().await.expect("release");
    take(&*a, &key, &write())
        .await
        .release()
        .await
        .expect("release");
    take(&*b, &key, &read())
        .await
        .release()
        .await
        .expect("release");
}
