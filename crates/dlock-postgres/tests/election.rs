//! Elections on PostgreSQL, beyond the shared suite: the election table's row (written
//! with the grant, gone with the release, ignored once its session ended), values that
//! SQL would trip on, `inspect` showing a leader, a row of an earlier run of the server
//! ignored, observers woken by the server well before their re-check, subscribed before
//! `leader_changes` returns, and told (an error) when their listener is lost.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::PostgresHarness;
use dlock_core::{DistributedLock, Election, ErrorKind, Leader, LockOptions, Observe, Wait};
use futures::StreamExt;
use sqlx::Row;
use tokio::time::{Instant, timeout};

fn harness() -> PostgresHarness {
    PostgresHarness::from_env()
}

fn unique(name: &str) -> String {
    dlock_conformance::testkit::unique_key(name)
}

fn election(client: Arc<dyn DistributedLock>, key: &str) -> Election {
    Election::new(client, key).options(
        LockOptions::new()
            .ttl(Duration::from_secs(10))
            .wait(Wait::For(Duration::from_secs(10))),
    )
}

/// The election table's rows of `key`: (pid, token, value).
async fn rows_of(h: &PostgresHarness, key: &str) -> Vec<(i32, i64, String)> {
    let mut admin = h.admin().await.expect("admin");
    let table = &h.config().table;
    let sql = format!(
        "SELECT e.pid, e.token, e.value FROM {table}_elect e JOIN {table} k ON k.id = e.id \
         WHERE e.ns = $2 AND k.name = $1"
    );
    sqlx::query(&sql)
        .bind(key)
        .bind(h.config().namespace)
        .fetch_all(&mut admin)
        .await
        .expect("the election table")
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_row_comes_with_the_grant_and_goes_with_the_release() {
    let h = harness();
    let (a, b) = (h.must_client().await, h.must_client().await);
    let key = unique("row");
    let tricky = "it's \\ \"quoted\" ; DROP TABLE x; -- é 😀 $$ '' \\x00";
    let mut leading = election(a, &key).campaign(tricky).await.expect("campaign");
    let rows = rows_of(&h, &key).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].2, tricky);
    assert_eq!(rows[0].1 as u64, leading.term());
    assert_eq!(h.sessions_on(&key, true).await.unwrap(), [rows[0].0]);

    // inspect shows the leader's value and term, leader() the same.
    let status = b.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(status.holders[0].who.as_deref(), Some(tricky));
    assert_eq!(status.holders[0].fencing_token, Some(leading.term()));
    let e = election(b.clone(), &key);
    assert_eq!(
        e.leader().await.unwrap(),
        Some(Leader::new(tricky, leading.term()))
    );

    leading.proclaim("plain").await.expect("proclaim");
    assert_eq!(rows_of(&h, &key).await[0].2, "plain");
    leading.resign().await.expect("resign");
    assert!(
        rows_of(&h, &key).await.is_empty(),
        "the row outlived the release"
    );
    assert_eq!(e.leader().await.unwrap(), None);

    // A plain hold of the key is no leader, and shows its holder description.
    let plain = b
        .try_acquire(&key, &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    assert_eq!(e.leader().await.unwrap(), None);
    let status = b.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders[0].fencing_token, None);
    assert_ne!(status.holders[0].who.as_deref(), Some("plain"));
    plain.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_leaders_row_is_ignored_then_replaced() {
    let h = harness();
    let (a, b) = (h.must_client().await, h.must_client().await);
    let key = unique("stale");
    let leading = election(a, &key)
        .campaign("doomed")
        .await
        .expect("campaign");
    let pid = rows_of(&h, &key).await[0].0;
    h.kill_session(pid).await.expect("kill");
    timeout(Duration::from_secs(5), leading.lost())
        .await
        .expect("lost() fires");
    // The row is still there; nobody trusts it.
    assert_eq!(rows_of(&h, &key).await.len(), 1);
    let e = election(b.clone(), &key);
    assert_eq!(e.leader().await.unwrap(), None);
    let status = b.inspect(&key).await.expect("inspect");
    assert!(!status.is_held(), "{status:?}");
    // The next leader overwrites it.
    let next = e.campaign("next").await.expect("campaign");
    let rows = rows_of(&h, &key).await;
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].1 as u64, rows[0].2.as_str()),
        (next.term(), "next")
    );
    next.resign().await.unwrap();
    drop(leading);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observers_are_woken_well_before_their_recheck() {
    let h = harness();
    let (a, b, watcher) = (
        h.must_client().await,
        h.must_client().await,
        h.must_client().await,
    );
    let Observe::Woken { recheck } = watcher.capabilities().election else {
        panic!("PostgreSQL wakes observers");
    };
    let key = unique("woken");
    let mut changes = election(watcher, &key).observe();
    assert_eq!(changes.next().await.unwrap().unwrap(), None);
    let prompt = recheck / 3;
    let mut next = async |what: &str| {
        let started = Instant::now();
        let seen = timeout(recheck * 2, changes.next())
            .await
            .unwrap_or_else(|_| panic!("{what}: no change"))
            .unwrap()
            .unwrap();
        let took = started.elapsed();
        assert!(took < prompt, "{what}: seen after {took:?}");
        seen
    };

    let mut first = election(a, &key).campaign("first").await.unwrap();
    assert_eq!(
        next("grant").await,
        Some(Leader::new("first", first.term()))
    );
    first.proclaim("first, again").await.unwrap();
    assert_eq!(
        next("proclaim").await,
        Some(Leader::new("first, again", first.term()))
    );
    // A candidate granted after a wait notifies too.
    let waiting = tokio::spawn(async move { election(b, &key).campaign("second").await });
    tokio::time::sleep(Duration::from_millis(200)).await;
    first.resign().await.unwrap();
    let second = waiting.await.unwrap().unwrap();
    let mut seen = next("hand-over").await;
    if seen.is_none() {
        seen = next("the waiter's grant").await;
    }
    assert_eq!(seen, Some(Leader::new("second", second.term())));
    second.resign().await.unwrap();
    assert_eq!(next("resign").await, None);
}

/// A client of its own `application_name`, to find its sessions (its listener) by.
async fn named_client(h: &PostgresHarness, name: &str) -> (Arc<dyn DistributedLock>, String) {
    use dlock_conformance::Harness;
    let app = unique(name);
    let url = dlock_conformance::url_with_option(&h.url(), &format!("application_name={app}"));
    (h.connect(&url).await.expect("connect"), app)
}

/// The pid of the leader listener of the client named `app` (its last statement: the check
/// of its own `LISTEN`).
async fn listener_of(h: &PostgresHarness, app: &str) -> i32 {
    let mut admin = h.admin().await.expect("admin");
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
         AND query LIKE '%pg_notify($1, $2 ||%'",
    )
    .bind(app)
    .fetch_all(&mut admin)
    .await
    .expect("pg_stat_activity");
    assert_eq!(pids.len(), 1, "one listener: {pids:?}");
    pids[0]
}

fn recheck(client: &dyn DistributedLock) -> Duration {
    let Observe::Woken { recheck } = client.capabilities().election else {
        panic!("PostgreSQL wakes observers");
    };
    recheck
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notification_right_after_leader_changes_returns_is_heard() {
    let h = harness();
    // A fresh client: its listener starts with this call.
    let (watcher, _) = named_client(&h, "subscribed").await;
    let key = unique("subscribed");
    let mut changes = watcher
        .leader_changes(&key)
        .await
        .expect("subscribe")
        .expect("PostgreSQL wakes observers");
    let id = h.id_of(&key).await.unwrap().expect("the key's id");
    let channel = format!("dlock_leaders_{}", h.config().namespace as u32);
    let mut admin = h.admin().await.expect("admin");
    sqlx::query("SELECT pg_notify($1, $2)")
        .bind(&channel)
        .bind(id.to_string())
        .execute(&mut admin)
        .await
        .expect("notify");
    let woken = timeout(recheck(&*watcher) / 2, changes.next())
        .await
        .expect("the notification sent right after the subscription was not heard");
    assert!(matches!(woken, Some(Ok(()))), "{woken:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_listener_ends_the_observers_stream_with_an_error() {
    let h = harness();
    let (watcher, app) = named_client(&h, "listener").await;
    let recheck = recheck(&*watcher);
    let key = unique("listener");
    let e = election(watcher.clone(), &key);
    let mut changes = e.observe();
    assert_eq!(changes.next().await.unwrap().unwrap(), None);
    let pid = listener_of(&h, &app).await;
    h.kill_session(pid).await.expect("kill the listener");
    let killed = Instant::now();
    // Down longer than the re-check: the stream ends with an error naming the listener.
    let error = timeout(recheck * 3, changes.next())
        .await
        .expect("no error within the bound")
        .expect("an item")
        .expect_err("an error");
    let took = killed.elapsed();
    assert!(took >= recheck, "the error came after {took:?}");
    assert_eq!(error.kind(), ErrorKind::Unavailable, "{error}");
    assert!(
        error.to_string().contains("LISTEN dlock_leaders_"),
        "{error}"
    );
    assert!(timeout(recheck, changes.next()).await.unwrap().is_none());

    // Following again waits for the listener to listen again, then is woken as before.
    let mut again = e.observe();
    assert_eq!(again.next().await.unwrap().unwrap(), None);
    assert_ne!(listener_of(&h, &app).await, pid);
    let (candidate, _) = named_client(&h, "candidate").await;
    let leading = election(candidate, &key).campaign("back").await.unwrap();
    let seen = timeout(recheck / 2, again.next())
        .await
        .expect("woken")
        .unwrap()
        .unwrap();
    assert_eq!(seen, Some(Leader::new("back", leading.term())));
    leading.resign().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_row_from_an_earlier_run_of_the_server_is_not_trusted() {
    let h = harness();
    let client = h.must_client().await;
    let key = unique("restart");
    // A plain holder whose pid a leader of an earlier run of the server had: its row,
    // left behind by the restart, names that pid.
    let plain = client
        .try_acquire(&key, &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    let pid = h.sessions_on(&key, true).await.unwrap()[0];
    let id = h.id_of(&key).await.unwrap().expect("the key's id");
    let table = &h.config().table;
    let mut admin = h.admin().await.expect("admin");
    let write = async |admin: &mut sqlx::PgConnection, started: &str| {
        let sql = format!(
            "INSERT INTO {table}_elect (ns, id, pid, started, token, value) \
             VALUES ($1, $2, $3, {started}, 1, 'ghost') \
             ON CONFLICT (ns, id) DO UPDATE SET pid = EXCLUDED.pid, \
               started = EXCLUDED.started, token = 1, value = 'ghost'"
        );
        sqlx::query(&sql)
            .bind(h.config().namespace)
            .bind(id)
            .bind(pid)
            .execute(admin)
            .await
            .expect("the row");
    };
    write(&mut admin, "pg_postmaster_start_time() - interval '1 hour'").await;
    let e = election(client.clone(), &key);
    assert_eq!(e.leader().await.unwrap(), None);
    let status = client.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_ne!(status.holders[0].who.as_deref(), Some("ghost"));
    assert_eq!(status.holders[0].fencing_token, None);
    // The same row of this run is trusted: the server's start is all that differs.
    write(&mut admin, "pg_postmaster_start_time()").await;
    assert_eq!(e.leader().await.unwrap(), Some(Leader::new("ghost", 1)));
    plain.release().await.unwrap();
    assert_eq!(e.leader().await.unwrap(), None);
}
