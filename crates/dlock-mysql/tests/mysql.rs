//! MySQL / MariaDB specific behaviour, beyond the shared suite: a holder's connection killed
//! on the server, sub-second deadlines and the waiter left behind, key encoding, the lock
//! table's shape, the session idle timeout's rounding, and `inspect` never listing a holder
//! as a waiter.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::MysqlHarness;
use dlock_core::{DistributedLock, ErrorKind, Lease, LockOptions, LostReason, Wait};
use sqlx::Executor;
use tokio::time::{Instant, sleep, timeout};

fn harness() -> MysqlHarness {
    MysqlHarness::from_env()
}

async fn client(h: &MysqlHarness) -> Arc<dyn DistributedLock> {
    h.must_client().await
}

/// A key no other test uses, under `mysql-test-` (the row names some tests check).
fn unique(name: &str) -> String {
    format!("mysql-{}", dlock_conformance::testkit::unique_key(name))
}

fn opts(ttl: Duration) -> LockOptions {
    LockOptions::new().ttl(ttl)
}

async fn take(client: &dyn DistributedLock, key: &str, opts: &LockOptions) -> Lease {
    client
        .try_acquire(key, opts)
        .await
        .expect("try_acquire")
        .unwrap_or_else(|| panic!("{key} should be free"))
}

/// Wait until nothing of `prefix` is left on the server (rows are deleted as keys free).
async fn assert_clean(h: &MysqlHarness, prefix: &str) {
    use dlock_conformance::Harness;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = h.residue(prefix).await.expect("residue");
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left on the server: {left:?}");
        sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_holders_connection_fires_lost_and_frees_the_key() {
    let h = harness();
    let key = unique("killed");
    let (a, b) = (client(&h).await, client(&h).await);
    let ttl = Duration::from_secs(2);
    let lease = take(&*a, &key, &opts(ttl)).await;
    let id = h
        .holder_of(&key)
        .await
        .expect("find the holder")
        .expect("the key has a holder");

    let mut admin = h.admin().await.expect("admin connection");
    admin
        .execute(format!("KILL {id}").as_str())
        .await
        .expect("KILL the holder's connection");
    let killed = Instant::now();

    // The server rolled the session back: another client gets the key at once.
    let newer = b
        .acquire(&key, &opts(ttl).wait(Wait::For(Duration::from_secs(10))))
        .await
        .expect("the killed holder's key frees");
    assert!(
        killed.elapsed() < Duration::from_secs(2),
        "the key freed {:?} after KILL",
        killed.elapsed()
    );
    assert!(newer.fencing_token() > lease.fencing_token());

    // The holder hears of it at its next ping (every ttl/3).
    let reason = timeout(ttl + Duration::from_secs(3), lease.lost())
        .await
        .expect("lost() fires after the holder's connection was killed");
    assert!(
        matches!(reason, LostReason::NotHeld | LostReason::SessionEnded(_)),
        "{reason}"
    );
    let err = lease
        .release()
        .await
        .expect_err("a killed lease cannot release");
    assert!(
        matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost),
        "{err}"
    );
    assert!(
        b.try_acquire(&key, &opts(ttl))
            .await
            .expect("try")
            .is_none(),
        "the new holder keeps the key"
    );
    newer.release().await.expect("the new holder releases");
    assert_clean(&h, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_300ms_deadline_times_out_and_leaves_no_waiter_behind() {
    let h = harness();
    let key = unique("deadline");
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let ttl = Duration::from_secs(10);
    let holder = take(&*a, &key, &opts(ttl)).await;

    let wait = Duration::from_millis(300);
    let started = Instant::now();
    let err = b
        .acquire(&key, &opts(ttl).wait(Wait::For(wait)))
        .await
        .expect_err("the key is held");
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        took >= wait - Duration::from_millis(10),
        "gave up early: {took:?}"
    );
    assert!(
        took < wait + Duration::from_secs(1),
        "gave up late: {took:?}"
    );
    // innodb_lock_wait_timeout counts whole seconds; the waiting statement was killed, so
    // the server has no waiter of b left (read after MariaDB's 0.1 s refresh).
    sleep(Duration::from_millis(150)).await;
    assert_eq!(h.waiters_on(&key).await.expect("lock waits"), 0);

    // A dropped acquire future leaves no waiter either. First see it wait on the server
    // (which also shows that the check above can see a waiter).
    let waiting = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move { b.acquire(&key, &opts(ttl)).await.map(drop) }
    });
    assert!(
        h.wait_for_waiters(&key, 1).await,
        "the waiting acquire never showed on the server"
    );
    waiting.abort();
    assert!(
        h.wait_for_waiters(&key, 0).await,
        "a dropped waiter still waits on the server"
    );

    // Right after the holder releases, the key is free: nobody who gave up got it later.
    holder.release().await.expect("release");
    let lease = take(&*c, &key, &opts(ttl)).await;
    lease.release().await.expect("release");
    // And b's connections are clean: b can take the key too.
    let lease = take(&*b, &key, &opts(ttl)).await;
    lease.release().await.expect("release");
    assert_clean(&h, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_differ_in_case_or_far_in_are_different_locks() {
    let h = harness();
    let prefix = unique("");
    let keys = [
        format!("{prefix}A"),
        format!("{prefix}a"),
        format!("{prefix}a "),
        format!("{prefix}a%20"),
        format!("{prefix}it's \\ \"quoted\" `x`"),
        format!("{prefix}\u{43a}\u{43b}\u{44e}\u{447} \u{1f512}"),
        format!("{prefix}{}", "k".repeat(900)),
        format!("{prefix}{}x", "k".repeat(899)),
    ];
    let (a, b) = (client(&h).await, client(&h).await);
    let mut leases = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        // Alternate clients, so no local gate is involved: the server keeps them apart.
        let client = if i % 2 == 0 { &a } else { &b };
        leases.push(take(&**client, key, &opts(Duration::from_secs(10))).await);
    }
    for key in &keys {
        assert!(
            a.try_acquire(key, &opts(Duration::from_secs(10)))
                .await
                .expect("try")
                .is_none(),
            "{key:?} should be held"
        );
    }
    let rows = {
        use dlock_conformance::Harness;
        h.residue(&prefix).await.expect("rows")
    };
    assert_eq!(rows.len(), keys.len(), "one row per key: {rows:?}");
    assert!(
        rows.iter()
            .all(|r| r.len() <= 255 && r.starts_with("mysql-test-"))
    );
    for lease in leases {
        lease.release().await.expect("release");
    }
    assert_clean(&h, &prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_idle_connection_is_replaced() {
    let h = harness();
    let key = unique("idle");
    let a = client(&h).await;
    let ttl = Duration::from_secs(5);
    let lease = take(&*a, &key, &opts(ttl)).await;
    let id = h.holder_of(&key).await.expect("holder").expect("holder");
    lease.release().await.expect("release");
    // The released connection is idle in a's pool; end it on the server, as a restart would.
    h.kill_session(id).await.expect("kill the idle connection");
    let lease = take(&*a, &key, &opts(ttl)).await;
    assert_ne!(h.holder_of(&key).await.expect("holder"), Some(id));
    lease.release().await.expect("release");
    assert_clean(&h, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sub_second_ttl_is_rounded_up_to_a_whole_second_on_the_server() {
    let h = harness();
    let key = unique("short-ttl");
    let (a, b) = (client(&h).await, client(&h).await);
    let ttl = Duration::from_millis(300);
    let lease = take(&*a, &key, &opts(ttl).auto_renew(false)).await;
    let granted = Instant::now();
    // The holder is told at once (before its ttl ends) ...
    let reason = timeout(Duration::from_secs(1), lease.lost())
        .await
        .expect("lost() fires within the ttl");
    assert_eq!(reason, LostReason::Expired);
    assert!(granted.elapsed() < ttl);
    // ... and the server ends the silent session after wait_timeout = ceil(ttl) = 1 s.
    let newer = b
        .acquire(&key, &opts(ttl).wait(Wait::For(Duration::from_secs(5))))
        .await
        .expect("the key frees after the session's idle timeout");
    let freed = granted.elapsed();
    assert!(freed >= Duration::from_millis(900), "freed after {freed:?}");
    assert!(freed < Duration::from_secs(4), "freed after {freed:?}");
    newer.release().await.expect("release");
    assert_eq!(
        lease.release().await.expect_err("expired").kind(),
        ErrorKind::NotHeld
    );
    assert_clean(&h, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_table_option_names_the_tables_and_unsafe_tables_are_refused() {
    let h = harness();
    let suffix = format!("{:x}", std::process::id());
    let base = h.config().clone();
    let url = |table: &str| {
        format!(
            "mysql://{}:{}@{}/{}?table={table}",
            base.user,
            base.password.as_ref().map_or("", |p| p.expose()),
            base.addr(),
            base.database
        )
    };
    let mut admin = h.admin().await.expect("admin connection");
    let drop_tables = |t: &str| {
        format!(
            "DROP TABLE IF EXISTS `{t}`, `{t}_fence`, `{t}_seq`, `{t}_slots`, `{t}_held`, \
             `{t}_value`, `{t}_owner`"
        )
    };

    // A table of our own, created on first use.
    let own = format!("dlock_t_{suffix}");
    let lock = dlock_mysql::from_url(&url(&own)).await.expect("connect");
    let lease = take(&lock, "k", &opts(Duration::from_secs(5))).await;
    assert_eq!(lease.fencing_token(), 1, "new token tables start at 1");
    lease.release().await.expect("release");
    admin
        .execute(drop_tables(&own).as_str())
        .await
        .expect("drop");

    // A case-insensitive name column would merge `A` and `a`; MyISAM has no row locks.
    let unsafe_tables = [
        (
            format!("dlock_ci_{suffix}"),
            "name VARCHAR(255) COLLATE utf8mb4_general_ci PRIMARY KEY",
            "InnoDB",
            "collation",
        ),
        (
            format!("dlock_narrow_{suffix}"),
            "name VARBINARY(64) PRIMARY KEY",
            "InnoDB",
            "VARBINARY(255)",
        ),
        (
            format!("dlock_myisam_{suffix}"),
            "name VARBINARY(255) PRIMARY KEY",
            "MyISAM",
            "engine",
        ),
    ];
    for (table, columns, engine, named) in unsafe_tables {
        admin
            .execute(format!("CREATE TABLE `{table}` ({columns}) ENGINE={engine}").as_str())
            .await
            .expect("create a table of the wrong shape");
        let err = dlock_mysql::from_url(&url(&table))
            .await
            .expect_err("an unsafe table is refused");
        admin
            .execute(drop_tables(&table).as_str())
            .await
            .expect("drop");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{table}: {err}");
        assert!(err.to_string().contains(named), "{table}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_database_is_refused_by_the_server() {
    let h = harness();
    let c = h.config();
    let url = format!(
        "mysql://{}:{}@{}/no_such_database_here",
        c.user,
        c.password.as_ref().map_or("", |p| p.expose()),
        c.addr()
    );
    let err = dlock_mysql::from_url(&url)
        .await
        .expect_err("unknown database");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_is_bounded_by_the_deadline_and_named_in_the_error() {
    let h = harness();
    let c = h.config();
    let url = format!(
        "mysql://{}:{}@{}/{}?max_connections=1&connect_timeout=500ms",
        c.user,
        c.password.as_ref().map_or("", |p| p.expose()),
        c.addr(),
        c.database
    );
    let lock = dlock_mysql::from_url(&url).await.expect("connect");
    let (one, two) = (unique("one"), unique("two"));
    // The only lock connection is pinned by this lease.
    let held = take(&lock, &one, &opts(Duration::from_secs(10))).await;

    let started = Instant::now();
    let err = lock
        .acquire(
            &two,
            &opts(Duration::from_secs(10)).wait(Wait::For(Duration::from_millis(200))),
        )
        .await
        .expect_err("no connection to wait with");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        started.elapsed() < Duration::from_millis(450),
        "{:?}",
        started.elapsed()
    );

    let err = lock
        .try_acquire(&two, &opts(Duration::from_secs(10)))
        .await
        .expect_err("no connection to try with");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("max_connections"), "{err}");

    held.release().await.expect("release");
    let lease = take(&lock, &two, &opts(Duration::from_secs(10))).await;
    lease.release().await.expect("release");
    assert_clean(&h, &one).await;
    assert_clean(&h, &two).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_racing_to_create_a_row_all_get_the_key_in_turn() {
    let h = harness();
    let prefix = unique("race/");
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(client(&h).await);
    }
    for round in 0..15 {
        // Every client asks for a key nobody used yet: they all create its row at once.
        let key = format!("{prefix}{round}");
        let tasks = clients.iter().map(|c| {
            let (c, key) = (c.clone(), key.clone());
            tokio::spawn(async move {
                let lease = c
                    .acquire(
                        &key,
                        &opts(Duration::from_secs(10)).wait(Wait::For(Duration::from_secs(30))),
                    )
                    .await?;
                lease.release().await
            })
        });
        for result in futures::future::join_all(tasks).await {
            result
                .expect("task")
                .expect("every racing client gets the key");
        }
    }
    assert_clean(&h, &prefix).await;
}

/// A session that holds a key is never listed as its waiter. A granted wait's statement
/// stays in the process list a moment after its answer, while its record already shows the
/// hold (seen once in a full `scripts/test` run); made to last here: a session holds the
/// key's row with its record, then runs a statement with a wait's text on that row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_is_never_listed_as_a_waiter_of_its_key() {
    let h = harness();
    let key = unique("holder-no-waiter");
    let a = client(&h).await;
    // The key's row, made by a first hold.
    let first = take(&*a, &key, &opts(Duration::from_secs(5))).await;
    first.release().await.expect("release");
    let (table, name) = (&h.config().table, common::literal(&common::row_name(&key)));
    let mut holder = h.admin().await.expect("admin connection");
    holder.execute("BEGIN").await.expect("BEGIN");
    holder
        .execute(
            format!(
                "INSERT INTO `{table}_held` (name, conn, held_key, mode, permits, token, who) \
                 SELECT name, CONNECTION_ID(), name, 'exclusive', 0, 1, 'test-holder' \
                 FROM `{table}` WHERE name = {name} FOR UPDATE"
            )
            .as_str(),
        )
        .await
        .expect("hold the row, with its record");
    let wait_text = format!("SELECT SLEEP(3) FROM `{table}` WHERE name = {name} FOR UPDATE");
    let running = tokio::spawn(async move {
        holder.execute(wait_text.as_str()).await.expect("the sleep");
        holder
    });
    let mut admin = h.admin().await.expect("admin connection");
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let shown: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE 'SELECT SLEEP(3)%'",
        )
        .fetch_one(&mut admin)
        .await
        .expect("the process list");
        if shown > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the statement never showed");
        sleep(Duration::from_millis(20)).await;
    }
    let status = a.inspect(&key).await.expect("inspect");
    let who: Vec<_> = status.holders.iter().map(|h| h.who.as_deref()).collect();
    assert_eq!(who, [Some("test-holder")], "{status:?}");
    assert!(
        status.waiters.as_ref().is_some_and(Vec::is_empty),
        "no waiter: {status:?}"
    );
    let mut holder = running.await.expect("the sleeping session");
    holder.execute("ROLLBACK").await.expect("ROLLBACK");
    assert_clean(&h, &key).await;
}
