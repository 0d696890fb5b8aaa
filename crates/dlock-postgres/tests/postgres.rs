//! PostgreSQL specific behaviour, beyond the shared suite: key ids (never shared, stable,
//! usable by hand from SQL), deadlines and dropped waits that leave no waiter behind, a
//! terminated holder, fencing tokens across sessions, the idle session timeout, and holder
//! connections reused by back-to-back holds.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::PostgresHarness;
use dlock_core::{DistributedLock, ErrorKind, Lease, LockOptions, Wait};
use sqlx::{Connection, Row};
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_gets_its_own_id_and_keeps_it() {
    let h = harness();
    let a = client(&h).await;
    let o = opts(Duration::from_secs(5));
    // Keys a hash might confuse or a case-folding column might merge.
    let long = "x".repeat(990);
    let names = ["A", "a", "a ", "a\u{301}", "\u{e1}", long.as_str()];
    let keys: Vec<String> = names.iter().map(|n| unique(n)).collect();
    let mut leases = Vec::new();
    for key in &keys {
        leases.push(take(&*a, key, &o).await);
    }
    let mut ids = Vec::new();
    for key in &keys {
        ids.push(h.id_of(key).await.unwrap().expect("an id row"));
    }
    let distinct: std::collections::HashSet<_> = ids.iter().collect();
    assert_eq!(distinct.len(), keys.len(), "ids {ids:?}");
    for lease in leases {
        lease.release().await.unwrap();
    }
    // A new client (empty cache) finds the same ids.
    let b = client(&h).await;
    for (key, id) in keys.iter().zip(&ids) {
        take(&*b, key, &o).await.release().await.unwrap();
        assert_eq!(h.id_of(key).await.unwrap(), Some(*id), "{key}");
    }
    // The table refuses a second row with an id in use: two names can never share a lock.
    let mut admin = h.admin().await.unwrap();
    let sql = format!(
        "INSERT INTO {} (name, id) VALUES ($1, $2)",
        h.config().table
    );
    let err = sqlx::query(&sql)
        .bind(unique("impostor"))
        .bind(ids[0])
        .execute(&mut admin)
        .await
        .expect_err("a duplicate id is refused");
    assert!(err.to_string().contains("duplicate key"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_application_takes_the_same_lock_by_hand() {
    let h = harness();
    let a = client(&h).await;
    let key = unique("by-hand");
    let o = opts(Duration::from_secs(5));
    take(&*a, &key, &o).await.release().await.unwrap();

    // As the docs say: SELECT pg_advisory_lock(namespace, id) FROM dlock_keys WHERE name = …
    let mut other = h.admin().await.unwrap();
    let sql = format!(
        "SELECT pg_try_advisory_lock($2, id) FROM {} WHERE name = $1",
        h.config().table
    );
    let row = sqlx::query(&sql)
        .bind(&key)
        .bind(h.config().namespace)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(row.get::<bool, _>(0), "the key is free");
    assert!(
        a.try_acquire(&key, &o).await.unwrap().is_none(),
        "held by hand"
    );
    // A waiter is granted the lock when the other application unlocks.
    let waiter = {
        let a = a.clone();
        let key = key.clone();
        tokio::spawn(async move {
            a.acquire(
                &key,
                &opts(Duration::from_secs(5)).wait(Wait::For(Duration::from_secs(10))),
            )
            .await
        })
    };
    sleep(Duration::from_millis(200)).await;
    let unlock = format!(
        "SELECT pg_advisory_unlock($2, id) FROM {} WHERE name = $1",
        h.config().table
    );
    let started = Instant::now();
    sqlx::query(&unlock)
        .bind(&key)
        .bind(h.config().namespace)
        .execute(&mut other)
        .await
        .unwrap();
    let lease = waiter
        .await
        .unwrap()
        .expect("granted after the manual unlock");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let row = sqlx::query(&sql)
        .bind(&key)
        .bind(h.config().namespace)
        .fetch_one(&mut other)
        .await
        .unwrap();
    assert!(!row.get::<bool, _>(0), "dlock holds it now");
    lease.release().await.unwrap();
    other.close().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_300ms_deadline_times_out_on_the_server_and_leaves_no_waiter() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let key = unique("deadline");
    let lease = take(&*a, &key, &opts(Duration::from_secs(5))).await;
    let started = Instant::now();
    let err = b
        .acquire(
            &key,
            &opts(Duration::from_secs(5)).wait(Wait::For(Duration::from_millis(300))),
        )
        .await
        .expect_err("held");
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        took >= Duration::from_millis(300) && took < Duration::from_millis(800),
        "{took:?}"
    );
    // lock_timeout ended the wait on the server: nobody waits, at once.
    assert!(h.sessions_on(&key, false).await.unwrap().is_empty());
    lease.release().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_wait_is_cancelled_on_the_server() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let key = unique("dropped");
    let lease = take(&*a, &key, &opts(Duration::from_secs(5))).await;
    let forever = opts(Duration::from_secs(5)).wait(Wait::Forever);
    let gave_up = timeout(Duration::from_millis(500), b.acquire(&key, &forever)).await;
    assert!(gave_up.is_err(), "still waiting");
    // pg_cancel_backend from a side connection removes the waiter from the queue.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !h.sessions_on(&key, false).await.unwrap().is_empty() {
        assert!(Instant::now() < deadline, "the waiter is still queued");
        sleep(Duration::from_millis(20)).await;
    }
    lease.release().await.unwrap();
    // The freed key goes to nobody: the cancelled waiter did not take it.
    let again = take(&*a, &key, &opts(Duration::from_secs(5))).await;
    again.release().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminated_holder_fires_lost_and_frees_the_key_at_once() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let key = unique("terminated");
    let lease = take(&*a, &key, &opts(Duration::from_secs(3))).await;
    let first = lease.fencing_token();
    let waiter = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            let lease = b
                .acquire(
                    &key,
                    &opts(Duration::from_secs(3)).wait(Wait::For(Duration::from_secs(10))),
                )
                .await;
            (lease, started.elapsed())
        })
    };
    sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    use dlock_conformance::Harness;
    h.break_lease(&key).await.unwrap();
    let (next, _) = waiter.await.unwrap();
    let next = next.expect("the waiter gets the key");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(next.fencing_token() > first);
    // The old holder hears of it by its next ping (ttl/3).
    timeout(Duration::from_secs(3), lease.lost())
        .await
        .expect("lost() fires");
    assert_eq!(
        lease.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    next.release().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holders_session_has_the_ttl_as_idle_timeout() {
    let h = harness();
    let a = client(&h).await;
    let key = unique("idle");
    // No renewal: the server ends the silent session after the ttl and frees the key.
    let o = opts(Duration::from_millis(700)).auto_renew(false);
    let lease = take(&*a, &key, &o).await;
    let pid = h.sessions_on(&key, true).await.unwrap();
    assert_eq!(pid.len(), 1);
    sleep(Duration::from_millis(1500)).await;
    assert!(
        h.sessions_on(&key, true).await.unwrap().is_empty(),
        "freed by the server"
    );
    assert!(
        !h.session_exists(pid[0]).await.unwrap(),
        "the session ended"
    );
    assert_eq!(
        lease.release().await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    // A released key's connection goes back to the pool without the timeout, once it
    // waited a tenth of the ttl for another take.
    let lease = take(&*a, &key, &opts(Duration::from_millis(700))).await;
    let pid = h.sessions_on(&key, true).await.unwrap()[0];
    lease.release().await.unwrap();
    rested(&h, pid).await;
    let reused = take(&*a, &unique("after"), &opts(Duration::from_secs(10))).await;
    sleep(Duration::from_millis(1200)).await;
    reused
        .release()
        .await
        .expect("the pooled connection kept no 700 ms timeout");
}

/// The last statement session `pid` ran, as the server shows it.
async fn last_statement(h: &PostgresHarness, pid: i32) -> String {
    let mut admin = h.admin().await.unwrap();
    sqlx::query_scalar("SELECT query FROM pg_stat_activity WHERE pid = $1")
        .bind(pid)
        .fetch_optional(&mut admin)
        .await
        .unwrap()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_right_after_a_release_reuses_the_session_without_setting_its_timeouts_again() {
    let h = harness();
    let a = client(&h).await;
    let key = unique("linger");
    // The holder connection waits a tenth of the ttl (at most 1 s) for another take.
    let o = opts(Duration::from_secs(30));
    take(&*a, &key, &o).await.release().await.unwrap();
    // A stalled machine may let the carrier retire between two steps: a few tries.
    let mut seen = Vec::new();
    let pid = loop {
        let lease = take(&*a, &key, &o).await;
        let pid = h.sessions_on(&key, true).await.unwrap()[0];
        let take_statement = last_statement(&h, pid).await;
        lease.release().await.unwrap();
        let release_statement = last_statement(&h, pid).await;
        if !take_statement.contains("set_config") && !release_statement.contains("set_config") {
            break pid;
        }
        seen.push((take_statement, release_statement));
        assert!(seen.len() < 5, "every take set the timeouts: {seen:#?}");
    };
    // No take came: the session goes back to its defaults, then to the pool.
    rested(&h, pid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_one_idle_holder_connection_per_ttl_waits_for_takes() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let o = opts(Duration::from_secs(30));
    // A stalled machine may end the first connection's wait between two steps: a few tries.
    let mut seen = Vec::new();
    loop {
        // a's holder connection, holding nothing now, waits for another take.
        take(&*a, &unique("first"), &o)
            .await
            .release()
            .await
            .unwrap();
        // a waits for a key b holds: its wait's connection becomes a second holder
        // connection of the same ttl.
        let key = unique("second");
        let held = take(&*b, &key, &o).await;
        let wait = {
            let (a, key) = (a.clone(), key.clone());
            let o = o.wait(Wait::For(Duration::from_secs(20)));
            tokio::spawn(async move { a.acquire(&key, &o).await })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while h.sessions_on(&key, false).await.unwrap().is_empty() {
            assert!(Instant::now() < deadline, "a never waited for {key}");
            sleep(Duration::from_millis(20)).await;
        }
        held.release().await.unwrap();
        let lease = wait.await.unwrap().expect("granted after b's release");
        let pid = h.sessions_on(&key, true).await.unwrap()[0];
        lease.release().await.unwrap();
        // The first one still waits: this one goes back to the pool at once, reset.
        let statement = last_statement(&h, pid).await;
        if statement.contains("'idle_session_timeout', '0'") {
            break;
        }
        seen.push(statement);
        assert!(
            seen.len() < 5,
            "every second connection stayed set: {seen:#?}"
        );
    }
}

/// Wait until session `pid`'s last statement put its timeouts back to the defaults.
async fn rested(h: &PostgresHarness, pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let statement = last_statement(h, pid).await;
        if statement.contains("'idle_session_timeout', '0'") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the idle holder connection kept its timeout: {statement}"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_racing_to_create_a_key_share_one_id_and_take_it_in_turn() {
    let h = harness();
    let key = unique("race");
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client(&h).await);
    }
    let o = opts(Duration::from_secs(5)).wait(Wait::For(Duration::from_secs(20)));
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|c| {
            let key = key.clone();
            tokio::spawn(async move {
                let lease = c.acquire(&key, &o).await?;
                let token = lease.fencing_token();
                sleep(Duration::from_millis(5)).await;
                lease.release().await?;
                Ok::<u64, dlock_core::LockError>(token)
            })
        })
        .collect();
    let mut tokens = Vec::new();
    for task in tasks {
        tokens.push(task.await.unwrap().expect("every client gets the key"));
    }
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 8, "tokens are never handed out twice");
    let mut admin = h.admin().await.unwrap();
    let sql = format!("SELECT count(*) FROM {} WHERE name = $1", h.config().table);
    let rows: i64 = sqlx::query_scalar(&sql)
        .bind(&key)
        .fetch_one(&mut admin)
        .await
        .unwrap();
    assert_eq!(rows, 1, "one row, one id");
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_idle_connections_are_replaced() {
    use dlock_conformance::Harness;
    let h = harness();
    let app = format!("dlock-replace-{:x}", rand_suffix());
    let url = dlock_conformance::url_with_option(&h.url(), &format!("application_name={app}"));
    let a = h.connect(&url).await.expect("connect");
    let key = unique("replaced");
    let o = opts(Duration::from_secs(5));
    take(&*a, &key, &o).await.release().await.unwrap();
    // As a server restart would: every idle session of this client ends.
    let mut admin = h.admin().await.unwrap();
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&app)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(ended.len() >= 2, "a lock and a side connection: {ended:?}");
    sleep(Duration::from_millis(200)).await;
    // The next acquire notices the dead pooled connections and opens new ones.
    take(&*a, &key, &o).await.release().await.unwrap();
    take(&*a, &unique("fresh"), &o)
        .await
        .release()
        .await
        .unwrap();
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .subsec_nanos()
        .into()
}
