//! Reentrant holds on PostgreSQL, beyond the shared suite: the count row of the owner table
//! (cleaned up, a crashed holder's row ignored and replaced, swept at connect), the first
//! client keeping the advisory lock for other clients' leases (never stacked under another
//! hold of the key), concurrent entries from tasks of two clients, and the other clients'
//! leases expiring when they stop renewing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::PostgresHarness;
use common::reentry::{busy, client, harness, owned, plain, rows, take};
use dlock_core::{DistributedLock, Lease, Reentry, Wait};
use futures::future::join_all;
use tokio::time::{Instant, sleep, timeout};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_session_is_declared_and_the_row_goes_with_the_hold() {
    let h = harness();
    let a = client(&h).await;
    assert_eq!(a.capabilities().reentrant, Reentry::FirstSession);
    let key = dlock_conformance::testkit::unique_key("pg-reentry-row");
    let first = take(&*a, &key, &owned("job-1")).await;
    let second = take(&*a, &key, &owned("job-1")).await;
    assert_eq!(first.fencing_token(), second.fencing_token());
    assert_eq!(
        rows(&h, &key).await,
        [format!("{key} (owner row: job-1, count 2)")]
    );
    // One session holds the key, once (the re-entry did not stack the advisory lock).
    assert_eq!(h.sessions_on(&key, true).await.unwrap().len(), 1);
    let status = a.inspect(&key).await.unwrap();
    assert_eq!(status.holders.len(), 1);
    let who = status.holders[0].who.clone().unwrap_or_default();
    assert!(who.starts_with("job-1 (held 2 times) in "), "{who}");
    assert_eq!(status.holders[0].fencing_token, Some(first.fencing_token()));
    first.release().await.unwrap();
    assert_eq!(
        rows(&h, &key).await,
        [format!("{key} (owner row: job-1, count 1)")]
    );
    second.release().await.unwrap();
    assert!(rows(&h, &key).await.is_empty());
    h.assert_no_session_on(&key).await;
    // An owner id with quotes reaches the server as data.
    let odd = take(&*a, &key, &owned("it's-'x'")).await;
    assert_eq!(
        rows(&h, &key).await,
        [format!("{key} (owner row: it's-'x', count 1)")]
    );
    odd.release().await.unwrap();
    assert!(rows(&h, &key).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_clients_count_changes_run_on_its_holder_connection() {
    // There the session that holds the lock proves the hold live; a side connection would
    // read `pg_locks`, a copy of the server's whole lock table, for each. A long ttl keeps
    // the holder connection's pings out of its last statement.
    let h = harness();
    let a = client(&h).await;
    let key = dlock_conformance::testkit::unique_key("pg-reentry-holder");
    let opts = owned("job-1").ttl(Duration::from_secs(60));
    let first = take(&*a, &key, &opts).await;
    let [pid] = h.sessions_on(&key, true).await.unwrap()[..] else {
        panic!("one holder session");
    };
    let again = take(&*a, &key, &opts).await;
    assert_eq!(again.fencing_token(), first.fencing_token());
    let last = h.last_statement(pid).await.unwrap();
    assert!(last.contains("holds = o.holds + 1"), "{last}");
    again.release().await.unwrap();
    let last = h.last_statement(pid).await.unwrap();
    assert!(last.contains("holds = o.holds - 1"), "{last}");
    assert_eq!(
        rows(&h, &key).await,
        [format!("{key} (owner row: job-1, count 1)")]
    );
    first.release().await.unwrap();
    assert!(rows(&h, &key).await.is_empty());
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_row_is_ignored_replaced_and_swept() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let key = dlock_conformance::testkit::unique_key("pg-reentry-stale");
    let gone = take(&*a, &key, &owned("job-1")).await;
    let _again = take(&*a, &key, &owned("job-1")).await;
    let [pid] = h.sessions_on(&key, true).await.unwrap()[..] else {
        panic!("one holder session");
    };
    h.kill_session(pid).await.unwrap();
    timeout(Duration::from_secs(5), gone.lost())
        .await
        .expect("the first client's lease is lost with its session");
    // The row (count 2) stays, ignored (unless a client of a test running meanwhile swept
    // it at connect): the same owner in another client takes a new hold.
    assert!(h.owner_rows(&key, false).await.unwrap().is_empty());
    let next = take(&*b, &key, &owned("job-1")).await;
    assert!(next.fencing_token() > gone.fencing_token());
    assert_eq!(
        rows(&h, &key).await,
        [format!("{key} (owner row: job-1, count 1)")]
    );
    next.release().await.unwrap();
    assert!(rows(&h, &key).await.is_empty());

    // A row left by a killed session is swept by the next client's connect.
    let gone = take(&*b, &key, &owned("job-2")).await;
    let [pid] = h.sessions_on(&key, true).await.unwrap()[..] else {
        panic!("one holder session");
    };
    h.kill_session(pid).await.unwrap();
    assert!(rows(&h, &key).await.len() <= 1);
    assert!(h.owner_rows(&key, false).await.unwrap().is_empty());
    let _c = client(&h).await;
    assert!(rows(&h, &key).await.is_empty(), "swept at connect");
    drop(gone);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_client_keeps_the_lock_for_the_others_and_never_stacks_it() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    let key = dlock_conformance::testkit::unique_key("pg-reentry-keep");
    let first = take(&*a, &key, &owned("job-1")).await;
    let token = first.fencing_token();
    let holder = h.sessions_on(&key, true).await.unwrap();
    let from_b = take(&*b, &key, &owned("job-1")).await;
    assert_eq!(from_b.fencing_token(), token);
    first.release().await.unwrap();
    sleep(Duration::from_millis(200)).await;
    // The first client keeps the key's lock in its session for b's lease.
    assert_eq!(h.sessions_on(&key, true).await.unwrap(), holder);
    busy(&*b, &key, "the second client's lease counts").await;
    // The first client itself: a plain hold, or another owner, is not granted on the
    // session that keeps the lock (the server would stack it); it waits on its own.
    busy(
        &*a,
        &key,
        "the first client keeps the lock for another client",
    )
    .await;
    assert!(
        a.try_acquire(&key, &owned("job-2"))
            .await
            .unwrap()
            .is_none()
    );
    // The owner re-enters in the first client: its lease joins the kept lock. (Before the
    // plain waiter below, which takes the client's local turn on the key.)
    let back = take(&*a, &key, &owned("job-1")).await;
    assert_eq!(back.fencing_token(), token);
    back.release().await.unwrap();
    let waiter = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move {
            let lease = a
                .acquire(&key, &plain().wait(Wait::For(Duration::from_secs(10))))
                .await
                .expect("the plain waiter gets the key after the owner's last lease");
            (lease.fencing_token(), Instant::now(), lease)
        })
    };
    sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "b's lease still counts");
    let released = Instant::now();
    from_b.release().await.unwrap();
    let (next, at, lease) = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is granted")
        .unwrap();
    assert!(next > token);
    assert!(
        at.duration_since(released) < Duration::from_secs(1),
        "woken by the notification, not the re-check: {:?}",
        at.duration_since(released)
    );
    assert_eq!(h.sessions_on(&key, true).await.unwrap().len(), 1);
    assert!(rows(&h, &key).await.is_empty());
    lease.release().await.unwrap();
    h.assert_no_session_on(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_entries_of_two_clients_share_one_hold() {
    const TASKS: usize = 8;
    let h = harness();
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let key = dlock_conformance::testkit::unique_key("pg-reentry-many");
    let entries: Vec<_> = (0..2 * TASKS)
        .map(|i| {
            let client = if i % 2 == 0 { a.clone() } else { b.clone() };
            let key = key.clone();
            tokio::spawn(async move {
                client
                    .acquire(
                        &key,
                        &owned("job-1").wait(Wait::For(Duration::from_secs(10))),
                    )
                    .await
                    .expect("every entry of the owner is granted")
            })
        })
        .collect();
    let mut leases: Vec<Lease> = join_all(entries)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let token = leases[0].fencing_token();
    assert!(
        leases.iter().all(|l| l.fencing_token() == token),
        "one hold: {:?}",
        leases.iter().map(Lease::fencing_token).collect::<Vec<_>>()
    );
    assert_eq!(
        rows(&h, &key).await,
        [format!("{key} (owner row: job-1, count {})", 2 * TASKS)]
    );
    // Released concurrently, all but one: the key stays held.
    let last = leases.pop().unwrap();
    let releases = leases.into_iter().map(|l| async move { l.release().await });
    for result in join_all(releases).await {
        result.expect("release");
    }
    busy(&*c, &key, "one lease still counts").await;
    assert_eq!(
        rows(&h, &key).await,
        [format!("{key} (owner row: job-1, count 1)")]
    );
    last.release().await.unwrap();
    let next = c
        .acquire(&key, &plain().wait(Wait::For(Duration::from_secs(2))))
        .await
        .expect("the key frees after the last release");
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();
    assert!(rows(&h, &key).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_clients_counts_that_stop_renewing_expire() {
    let h = harness();
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let key = dlock_conformance::testkit::unique_key("pg-reentry-expire");
    let first = take(&*a, &key, &owned("job-1")).await;
    // A lease of another client that is never renewed nor released (its process died):
    // its entry counts until its ttl after the last renewal. (Its client keeps its local
    // turn on the key: a third client waits.)
    let short = owned("job-1")
        .ttl(Duration::from_millis(1500))
        .auto_renew(false);
    let remote = take(&*b, &key, &short).await;
    std::mem::forget(remote);
    let released = Instant::now();
    first.release().await.unwrap();
    busy(&*a, &key, "the other client's entry still counts").await;
    let next = c
        .acquire(&key, &plain().wait(Wait::For(Duration::from_secs(10))))
        .await
        .expect("the key frees once the other client's entry expired");
    let after = released.elapsed();
    assert!(
        after >= Duration::from_millis(1000) && after < Duration::from_secs(4),
        "freed {after:?} after the first client's release (entry ttl 1.5 s, re-check 1 s)"
    );
    assert!(rows(&h, &key).await.is_empty());
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_of_one_owner_in_two_clients_share_the_hold_one_of_them_gets() {
    let h = harness();
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let key = dlock_conformance::testkit::unique_key("pg-reentry-waiters");
    let other = take(&*c, &key, &owned("job-2")).await;
    let before = other.fencing_token();
    let waiters: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|client| {
            let key = key.clone();
            tokio::spawn(async move {
                let lease = client
                    .acquire(
                        &key,
                        &owned("job-1").wait(Wait::For(Duration::from_secs(10))),
                    )
                    .await
                    .expect("both waiters of the owner get the key");
                (lease, Instant::now())
            })
        })
        .collect();
    sleep(Duration::from_millis(300)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()));
    let released = Instant::now();
    other.release().await.unwrap();
    let got: Vec<(Lease, Instant)> = join_all(waiters)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        got[0].0.fencing_token(),
        got[1].0.fencing_token(),
        "one hold"
    );
    assert!(got[0].0.fencing_token() > before);
    for (_, at) in &got {
        let after = at.duration_since(released);
        assert!(
            after < Duration::from_millis(900),
            "granted {after:?} after the release"
        );
    }
    assert_eq!(
        rows(&h, &key).await,
        [format!("{key} (owner row: job-1, count 2)")]
    );
    // The loser's wait was cancelled: one session holds the key, nobody waits.
    assert_eq!(h.sessions_on(&key, true).await.unwrap().len(), 1);
    assert!(h.sessions_on(&key, false).await.unwrap().is_empty());
    for (lease, _) in got {
        lease.release().await.unwrap();
    }
    h.assert_no_session_on(&key).await;
    assert!(rows(&h, &key).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_hold_outlives_its_first_leases_ttl_while_another_client_renews() {
    let h = harness();
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let key = dlock_conformance::testkit::unique_key("pg-reentry-unpinged");
    // The first lease is not renewed: its holder connection is its own, nobody pings it.
    let short = owned("job-1")
        .ttl(Duration::from_millis(1500))
        .auto_renew(false);
    let first = take(&*a, &key, &short).await;
    let holder = h.sessions_on(&key, true).await.unwrap();
    let from_b = take(&*b, &key, &owned("job-1")).await;
    first.release().await.unwrap();
    // Well past the first lease's ttl: the first client keeps the session alive for b.
    sleep(Duration::from_secs(4)).await;
    assert_eq!(h.sessions_on(&key, true).await.unwrap(), holder);
    assert!(!from_b.is_lost());
    busy(&*c, &key, "b's auto-renewed lease counts").await;
    from_b.release().await.unwrap();
    let next = c
        .acquire(&key, &plain().wait(Wait::For(Duration::from_secs(2))))
        .await
        .expect("the key frees after b's release");
    next.release().await.unwrap();
    assert!(rows(&h, &key).await.is_empty());
}

/// An owner's wait granted by the server's queue is a new hold with count 1: the waiter
/// never re-enters the hold of its own waiting session. (Its re-entry loop, woken by its
/// own grant's notification or re-checking, once re-entered it: an entry nobody held kept
/// the key past the last release, and the owner's next acquire shared the old token; or
/// the stopped wait gave back the hold whose re-entry it handed out.) Made certain here:
/// the owner row, naming the waiting session, is written before the grant and held locked
/// while the waiter is granted: its batch waits for the row, and its re-entry loop sees the
/// row all along (a re-entry of it would wait for the row too, then count it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owners_granted_wait_never_reenters_its_own_hold() {
    let h = harness();
    let (a, b) = (client(&h).await, client(&h).await);
    // Three rounds: which of the batch and the re-entry gets the row first is the server's
    // choice.
    for _ in 0..3 {
        own_wait_round(&h, &a, &b).await;
    }
}

async fn own_wait_round(
    h: &PostgresHarness,
    a: &Arc<dyn DistributedLock>,
    b: &Arc<dyn DistributedLock>,
) {
    let key = dlock_conformance::testkit::unique_key("pg-reentry-own-wait");
    let other = take(&**b, &key, &plain()).await;
    let before = other.fencing_token();
    let waiter = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move {
            a.acquire(
                &key,
                &owned("job-1").wait(Wait::For(Duration::from_secs(20))),
            )
            .await
            .expect("the owner's wait is granted")
        })
    };
    let pid = loop {
        if let [pid] = h.sessions_on(&key, false).await.unwrap()[..] {
            break pid;
        }
        sleep(Duration::from_millis(20)).await;
    };
    let id = h.id_of(&key).await.unwrap().expect("the key's id");
    let owners = format!("{}_owner", h.config().table);
    let ns = h.config().namespace;
    // A row for the waiting session, as its grant writes it, then locked. A client that
    // connects meanwhile (another test's) sweeps the rows of sessions that hold nothing,
    // as the waiting one does not yet: written again until the lock covers it.
    let mut admin = h.admin().await.unwrap();
    loop {
        sqlx::query(&format!(
            "INSERT INTO {owners} (ns, id, owner, pid, started, token, holds, expires) \
             VALUES ($1, $2, 'job-1', $3, pg_postmaster_start_time(), 1, 1, NULL) \
             ON CONFLICT (ns, id) DO UPDATE SET owner = 'job-1', pid = $3, holds = 1, \
               started = pg_postmaster_start_time()"
        ))
        .bind(ns)
        .bind(id)
        .bind(pid)
        .execute(&mut admin)
        .await
        .unwrap();
        sqlx::query("BEGIN").execute(&mut admin).await.unwrap();
        let locked = sqlx::query(&format!(
            "SELECT 1 FROM {owners} WHERE ns = $1 AND id = $2 AND pid = $3 FOR UPDATE"
        ))
        .bind(ns)
        .bind(id)
        .bind(pid)
        .fetch_optional(&mut admin)
        .await
        .unwrap();
        if locked.is_some() {
            break;
        }
        sqlx::query("ROLLBACK").execute(&mut admin).await.unwrap();
    }
    other.release().await.unwrap();
    // Granted, the waiter's batch waits for the row; its re-entry loop re-checks (every
    // second) meanwhile, and passes over the row of its own session.
    sleep(Duration::from_millis(2500)).await;
    assert!(!waiter.is_finished());
    sqlx::query("COMMIT").execute(&mut admin).await.unwrap();
    let lease = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("granted")
        .unwrap();
    assert!(lease.fencing_token() > before);
    // Anything the waiter's re-entry loop did has landed by now.
    sleep(Duration::from_millis(300)).await;
    assert_eq!(
        rows(h, &key).await,
        [format!("{key} (owner row: job-1, count 1)")]
    );
    busy(&**b, &key, "the granted wait holds the key").await;
    assert!(!lease.is_lost());
    let token = lease.fencing_token();
    lease.release().await.unwrap();
    let next = take(&**a, &key, &owned("job-1")).await;
    assert!(next.fencing_token() > token, "a new hold");
    next.release().await.unwrap();
    assert!(rows(h, &key).await.is_empty());
    h.assert_no_session_on(&key).await;
}

/// A late grant of an owner's wait whose holder connection is told lost at once (measured
/// from the waiting statement, its idle timeout may have passed) is not handed out, and the
/// acquire's next try does not re-enter it either (the server still showed the session for
/// a moment): it waits again, as a plain acquire does, and gets a live hold. (It once
/// re-entered the hold just told lost: a lease lost at birth, and the key another client's
/// a moment later.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hold_told_lost_is_never_reentered() {
    let h = harness();
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let key = dlock_conformance::testkit::unique_key("pg-reentry-told-lost");
    let ttl = Duration::from_millis(1500);
    let other = take(&*b, &key, &plain().ttl(ttl)).await;
    let waiter = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move {
            a.acquire(
                &key,
                &owned("job-1")
                    .ttl(ttl)
                    .wait(Wait::For(Duration::from_secs(10))),
            )
            .await
            .expect("the owner's wait is granted")
        })
    };
    // Longer than the ttl: the grant comes after the waiting statement's idle timeout.
    sleep(Duration::from_millis(2000)).await;
    other.release().await.unwrap();
    let lease = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("granted")
        .unwrap();
    sleep(Duration::from_millis(300)).await;
    assert!(!lease.is_lost(), "the lease handed out was lost at once");
    busy(&*c, &key, "the owner's lease holds the key").await;
    assert_eq!(
        rows(&h, &key).await,
        [format!("{key} (owner row: job-1, count 1)")]
    );
    lease.release().await.unwrap();
    h.assert_no_session_on(&key).await;
    assert!(rows(&h, &key).await.is_empty());
}
