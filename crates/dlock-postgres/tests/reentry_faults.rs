//! Reentrant holds on PostgreSQL when something goes wrong between a count change and its
//! answer: a re-entry given up mid-statement, a count change that timed out, an idle side
//! connection the server ended, a hold's session killed before its client noticed, a
//! holder connection stuck in a statement or cut off by the network. The
//! count stays what the leases handed out say, and the key is never re-entered past its
//! holder's end.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::PostgresHarness;
use common::reentry::{client, harness, owned, plain, rows, take};
use dlock_conformance::Harness;
use dlock_core::{DistributedLock, ErrorKind, Wait};
use tokio::time::{Instant, sleep};

/// Lock the owner row of `key` in a transaction of `admin`: count changes wait for it.
async fn lock_owner_row(h: &PostgresHarness, admin: &mut sqlx::PgConnection, key: &str) {
    let id = h.id_of(key).await.unwrap().expect("the key's id");
    let owners = format!("{}_owner", h.config().table);
    sqlx::query("BEGIN").execute(&mut *admin).await.unwrap();
    sqlx::query(&format!(
        "SELECT 1 FROM {owners} WHERE ns = $1 AND id = $2 FOR UPDATE"
    ))
    .bind(h.config().namespace)
    .bind(id)
    .execute(&mut *admin)
    .await
    .unwrap();
}

/// A client whose sessions carry the `application_name` `app`, with `options` added.
async fn client_named(h: &PostgresHarness, app: &str, options: &str) -> Arc<dyn DistributedLock> {
    let mut url = dlock_conformance::url_with_option(&h.url(), &format!("application_name={app}"));
    if !options.is_empty() {
        url = dlock_conformance::url_with_option(&url, options);
    }
    h.connect(&url).await.expect("connect")
}

/// Whether a session of the client named `app` waits for a lock (a row, here).
async fn waiting_for_a_lock(admin: &mut sqlx::PgConnection, app: &str) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = $1 \
         AND wait_event_type = 'Lock')",
    )
    .bind(app)
    .fetch_one(admin)
    .await
    .unwrap()
}

/// Poll until the owner rows of `key` are `want` (up to 10 s).
async fn rows_become(h: &PostgresHarness, key: &str, want: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = rows(h, key).await;
        if now == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "owner rows of {key}: {now:?}, want {want:?}"
        );
        // The poll's interval, until the deadline.
        sleep(Duration::from_millis(50)).await;
    }
}

/// The last lease of `key` was released: the key is freed at once, or when an earlier
/// re-entry's ttl runs out if its timed-out count change committed after all.
async fn freed_after_a_timed_out_count(h: &PostgresHarness, key: &str) {
    let next = client(h)
        .await
        .acquire(key, &plain().wait(Wait::For(Duration::from_secs(10))))
        .await
        .expect("the key is freed");
    next.release().await.unwrap();
}

/// An acquire that stops waiting for its re-entry (here its deadline passes while the
/// re-entry's `UPDATE` waits for the row) leaves no entry counted: the re-entry runs to
/// its end in a task of its own and gives back the entry nobody took. (Dropped mid-
/// statement, it once left an entry nobody held, which kept the key past the last release
/// until its ttl.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reentry_given_up_mid_statement_counts_nothing() {
    let h = harness();
    let app = format!("dlock-given-up-{}", std::process::id());
    let (a, c) = (client(&h).await, client(&h).await);
    let b = client_named(&h, &app, "").await;
    let key = dlock_conformance::testkit::unique_key("pg-reentry-dropped");
    let first = take(&*a, &key, &owned("job-1")).await;
    let mut admin = h.admin().await.unwrap();
    lock_owner_row(&h, &mut admin, &key).await;
    // b's re-entry waits for the row past its acquire's deadline.
    let gave_up = b
        .acquire(
            &key,
            &owned("job-1").wait(Wait::For(Duration::from_millis(500))),
        )
        .await;
    assert!(
        gave_up.is_err(),
        "the re-entry could not be answered in time"
    );
    sqlx::query("COMMIT").execute(&mut admin).await.unwrap();
    // The re-entry's UPDATE goes through (count 2), then the entry nobody took is given
    // back (count 1).
    let deadline = Instant::now() + Duration::from_secs(10);
    while waiting_for_a_lock(&mut admin, &app).await {
        assert!(
            Instant::now() < deadline,
            "b's re-entry still waits for the row"
        );
        // The poll's interval, until the deadline.
        sleep(Duration::from_millis(20)).await;
    }
    rows_become(&h, &key, &[format!("{key} (owner row: job-1, count 1)")]).await;
    first.release().await.unwrap();
    // The last release frees the key at once.
    let next = c
        .acquire(&key, &plain().wait(Wait::For(Duration::from_millis(500))))
        .await
        .expect("the key is free after the last release");
    next.release().await.unwrap();
    assert!(rows(&h, &key).await.is_empty());
}

/// A count change that got no answer within the response timeout may still commit (the
/// server goes on with it until it notices the closed connection): it is never sent again
/// on another connection, which would count it twice. Here the re-entry's `UPDATE` waits
/// for the owner row: one session of the client ever waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_count_change_that_timed_out_is_not_sent_again() {
    let h = harness();
    let a = client(&h).await;
    let app = format!("dlock-timedout-{}", std::process::id());
    // 2 s: the key's id and the try before the re-entry fit in it on a loaded machine.
    let b = client_named(&h, &app, "response_timeout=2s").await;
    let key = dlock_conformance::testkit::unique_key("pg-reentry-timed-out");
    // b's side connection has been used (the key's id): a reused one.
    take(
        &*b,
        &dlock_conformance::testkit::unique_key("pg-warm"),
        &plain(),
    )
    .await
    .release()
    .await
    .unwrap();
    let first = take(&*a, &key, &owned("job-1")).await;
    let mut admin = h.admin().await.unwrap();
    lock_owner_row(&h, &mut admin, &key).await;
    let reentry = {
        let (b, key) = (b.clone(), key.clone());
        tokio::spawn(async move { b.try_acquire(&key, &owned("job-1")).await })
    };
    let mut watch = h.admin().await.unwrap();
    let mut waited = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !reentry.is_finished() {
        assert!(Instant::now() < deadline, "the re-entry never answered");
        let pids: Vec<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE application_name = $1 \
             AND wait_event_type = 'Lock'",
        )
        .bind(&app)
        .fetch_all(&mut watch)
        .await
        .unwrap();
        waited.extend(pids);
        // The poll's interval, until the re-entry answers (its response timeout).
        sleep(Duration::from_millis(20)).await;
    }
    let answer = reentry.await.unwrap();
    assert!(
        matches!(&answer, Err(e) if e.kind() == ErrorKind::Unavailable),
        "answered: {answer:?}"
    );
    assert_eq!(
        waited.len(),
        1,
        "sessions that sent the count change: {waited:?}"
    );
    sqlx::query("COMMIT").execute(&mut admin).await.unwrap();
    first.release().await.unwrap();
    freed_after_a_timed_out_count(&h, &key).await;
}

/// A count change in the first client runs on its holder connection without waiting for
/// the owner row (here another transaction holds it past the response timeout): it goes
/// to a side connection instead, and the holder connection, with every hold it carries,
/// lives on. Waiting there, a count change that timed out would end it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_busy_owner_row_never_ends_the_holder_connection() {
    let h = harness();
    let app = format!("dlock-busy-row-{}", std::process::id());
    let a = client_named(&h, &app, "response_timeout=2s").await;
    let key = dlock_conformance::testkit::unique_key("pg-reentry-busy-row");
    let first = take(&*a, &key, &owned("job-1")).await;
    let [holder] = h.sessions_on(&key, true).await.unwrap()[..] else {
        panic!("one holder session");
    };
    let mut admin = h.admin().await.unwrap();
    lock_owner_row(&h, &mut admin, &key).await;
    let answer = a.try_acquire(&key, &owned("job-1")).await;
    // The side connection waited for the row until its response timeout.
    assert!(
        matches!(&answer, Err(e) if e.kind() == ErrorKind::Unavailable),
        "answered: {answer:?}"
    );
    sqlx::query("COMMIT").execute(&mut admin).await.unwrap();
    assert!(
        h.session_exists(holder).await.unwrap(),
        "the holder connection ended"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(200), first.lost())
            .await
            .is_err(),
        "the first lease was lost"
    );
    let again = take(&*a, &key, &owned("job-1")).await;
    assert_eq!(again.fencing_token(), first.fencing_token());
    again.release().await.unwrap();
    first.release().await.unwrap();
    freed_after_a_timed_out_count(&h, &key).await;
}

/// A holder connection stuck in a statement tells the other holds it carries lost before
/// the server's idle timeout could end its session and hand their keys on, not at the
/// response timeout: the carrier keeps them alive alone, and cannot tell a statement that
/// waits on the server (here an owner's first take, whose row insert waits for another
/// transaction's uncommitted row of the key) from one that never reached it (a connection
/// cut off, as in the torture run that found this).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_holder_connection_stuck_in_a_statement_tells_its_holds_lost_within_their_ttl() {
    let h = harness();
    let app = format!("dlock-stuck-{}", std::process::id());
    let a = client_named(&h, &app, "response_timeout=20s").await;
    let (held_key, stuck_key) = (
        dlock_conformance::testkit::unique_key("pg-stuck-held"),
        dlock_conformance::testkit::unique_key("pg-stuck-owned"),
    );
    // The stuck key's row exists (its id), and nobody holds it.
    take(&*a, &stuck_key, &plain())
        .await
        .release()
        .await
        .unwrap();
    let id = h.id_of(&stuck_key).await.unwrap().expect("the key's id");
    let held = take(&*a, &held_key, &plain()).await;
    let mut admin = h.admin().await.unwrap();
    sqlx::query("BEGIN").execute(&mut admin).await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {}_owner (ns, id, owner, pid, started, token, holds) \
         VALUES ($1, $2, 'someone', 0, now(), 0, 1)",
        h.config().table
    ))
    .bind(h.config().namespace)
    .bind(id)
    .execute(&mut admin)
    .await
    .unwrap();
    let stuck = {
        let (a, key) = (a.clone(), stuck_key.clone());
        tokio::spawn(async move { a.try_acquire(&key, &owned("job-1")).await })
    };
    // The take reaches the row and waits for it.
    let mut watch = h.admin().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while !waiting_for_a_lock(&mut watch, &app).await {
        assert!(
            Instant::now() < deadline,
            "the owner's take never waited for the row"
        );
        // The poll's interval, until the take waits.
        sleep(Duration::from_millis(10)).await;
    }
    let lost = tokio::time::timeout(Duration::from_secs(4), held.lost()).await;
    assert!(
        lost.is_ok(),
        "the hold on the stuck holder connection was not told lost within 4 s (ttl 3 s)"
    );
    sqlx::query("ROLLBACK").execute(&mut admin).await.unwrap();
    let _ = stuck.await.unwrap();
    // Its key is free (the session was closed), and so is the other.
    for key in [&held_key, &stuck_key] {
        let next = client(&h)
            .await
            .acquire(key, &plain().wait(Wait::For(Duration::from_secs(10))))
            .await
            .expect("the key is free");
        next.release().await.unwrap();
    }
}

/// Side connections whose sessions the server ended while they were idle (an
/// administrator's terminate, as a server's idle session timeout would) are replaced for
/// count changes too: the server's message says the statement never ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_changes_replace_idle_connections_the_server_ended() {
    let h = harness();
    let app = format!("dlock-ended-{}", std::process::id());
    let a = client_named(&h, &app, "").await;
    let key = dlock_conformance::testkit::unique_key("pg-reentry-ended");
    let first = take(&*a, &key, &owned("job-1")).await;
    let second = take(&*a, &key, &owned("job-1")).await;
    let [holder] = h.sessions_on(&key, true).await.unwrap()[..] else {
        panic!("one holder session");
    };
    let mut admin = h.admin().await.unwrap();
    let ended: Vec<i32> = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND pid <> $2",
    )
    .bind(&app)
    .bind(holder)
    .fetch_all(&mut admin)
    .await
    .unwrap();
    assert!(!ended.is_empty(), "a side connection to end");
    for pid in ended {
        // Returns once the session is gone.
        h.kill_session(pid).await.unwrap();
    }
    let third = take(&*a, &key, &owned("job-1")).await;
    assert_eq!(third.fencing_token(), first.fencing_token());
    assert_eq!(
        rows(&h, &key).await,
        [format!("{key} (owner row: job-1, count 3)")]
    );
    second
        .release()
        .await
        .expect("a release counted on a new side connection");
    third.release().await.unwrap();
    first.release().await.unwrap();
    h.assert_no_session_on(&key).await;
    assert!(rows(&h, &key).await.is_empty());
}

/// A hold whose session was killed before its client noticed (its next ping is 20 s away)
/// is never re-entered there, even after earlier re-entries of it, and the entry taken
/// before the kill is not released as if it still held: each count change checks the
/// session still holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_session_killed_unnoticed_is_never_reentered() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let key = dlock_conformance::testkit::unique_key("pg-reentry-killed");
    let opts = owned("job-1").ttl(Duration::from_secs(60));
    let first = take(&*a, &key, &opts).await;
    let seen = take(&*a, &key, &opts).await;
    assert_eq!(seen.fencing_token(), first.fencing_token());
    seen.release().await.unwrap();
    let entry = take(&*a, &key, &opts).await;
    let [pid] = h.sessions_on(&key, true).await.unwrap()[..] else {
        panic!("one holder session");
    };
    h.kill_session(pid).await.unwrap();
    let other = take(&*b, &key, &plain()).await;
    let again = a.try_acquire(&key, &opts).await.expect("try_acquire");
    assert!(
        again.is_none(),
        "re-entered hold {} of a killed session while {} holds the key",
        first.fencing_token(),
        other.fencing_token()
    );
    assert!(entry.release().await.is_err(), "released as if held");
    other.release().await.unwrap();
    drop(first);
}

/// The first client's hold of `key` (two entries with `reentered`), on a client behind a
/// proxy; then the network cut while `count_change` (a re-entry, or the release of an
/// entry) runs on the holder connection. The change gets no answer: the carrier gives the
/// session up before the server's idle timeout could end it, so the hold is told lost
/// before anyone else can take the key (another client waits for it on a direct
/// connection), and the change answers within its bound. Returns the change's answer.
async fn cut_under_a_count_change<T, F>(
    reentered: bool,
    count_change: impl FnOnce(Arc<dyn DistributedLock>, String, Option<dlock_core::Lease>) -> F,
) -> T
where
    F: std::future::Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let h = harness();
    let (a, cut) = h
        .partitioned_client()
        .await
        .expect("a client behind a proxy");
    let key = dlock_conformance::testkit::unique_key("pg-cut-count");
    let first = take(&*a, &key, &owned("job-cut")).await;
    let second = match reentered {
        true => Some(take(&*a, &key, &owned("job-cut")).await),
        false => None,
    };
    let mut lost = first.lost_signal();
    let lost = tokio::spawn(async move {
        lost.lost().await;
        Instant::now()
    });
    cut.cut();
    let change = tokio::spawn(count_change(a.clone(), key.clone(), second));
    let b = client(&h).await;
    let granted = tokio::spawn(async move {
        let lease = b
            .acquire(&key, &plain().wait(Wait::For(Duration::from_secs(20))))
            .await
            .expect("another client takes the key once the cut session ends");
        let at = Instant::now();
        lease.release().await.unwrap();
        at
    });
    let answer = tokio::time::timeout(Duration::from_secs(8), change)
        .await
        .expect("the count change answers within 8 s (ttl 3 s)")
        .unwrap();
    let lost_at = tokio::time::timeout(Duration::from_secs(8), lost)
        .await
        .expect("the hold is told lost within 8 s (ttl 3 s)")
        .unwrap();
    let granted_at = granted.await.unwrap();
    assert!(
        lost_at <= granted_at,
        "the hold was told lost {:?} after another client took the key",
        lost_at - granted_at
    );
    cut.heal();
    answer
}

/// A re-entry whose count change is cut off on the holder connection is not granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reentry_cut_off_on_the_holder_connection_is_lost_before_the_key_is_free() {
    let answer = cut_under_a_count_change(false, |a, key, _| async move {
        a.try_acquire(&key, &owned("job-cut"))
            .await
            .map(|l| l.is_some())
    })
    .await;
    assert!(
        !matches!(answer, Ok(true)),
        "re-entered a hold whose session was cut off"
    );
}

/// The release of an entry cut off on the holder connection answers that the hold is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_release_cut_off_on_the_holder_connection_is_lost_before_the_key_is_free() {
    let answer = cut_under_a_count_change(true, |_, _, second| async move {
        second.expect("the second entry").release().await
    })
    .await;
    let err = answer.expect_err("released an entry whose session was cut off");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
}
