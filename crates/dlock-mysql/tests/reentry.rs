//! Reentrant holds on MySQL / MariaDB, in both modes: the `{table}_owner` row is gone once
//! the hold ends, a stale row (its hold gone) is ignored and cleaned, entries from many
//! tasks of two clients share one token and the key frees exactly after the last release,
//! an owner that waits enters its hold taken meanwhile by another client within a round,
//! and the first client keeps the lock while another client's lease counts, until it is
//! released or stops renewing.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::MysqlHarness;
use dlock_conformance::Harness;
use dlock_conformance::testkit::unique_key;
use dlock_core::{DistributedLock, Lease, LockOptions, Reentry, Wait};
use futures::future::join_all;
use sqlx::Executor;
use tokio::time::{Instant, sleep, timeout};

async fn client(h: &MysqlHarness) -> Arc<dyn DistributedLock> {
    h.client().await.expect("the MySQL server answers")
}

fn owned(id: &str) -> LockOptions {
    LockOptions::new()
        .ttl(Duration::from_secs(3))
        .owner(id)
        .wait(Wait::For(Duration::from_secs(10)))
}

/// `key` is held by someone: a plain try from `c` answers busy.
async fn held(c: &dyn DistributedLock, key: &str) -> bool {
    let opts = LockOptions::new().wait(Wait::No);
    match c.try_acquire(key, &opts).await.expect("try_acquire") {
        Some(lease) => {
            lease.release().await.expect("release");
            false
        }
        None => true,
    }
}

/// Wait (up to `bound`) until `key` frees; how long it took.
async fn frees_within(c: &dyn DistributedLock, key: &str, bound: Duration) -> Duration {
    let started = Instant::now();
    let opts = LockOptions::new().wait(Wait::For(bound));
    let lease = c
        .acquire(key, &opts)
        .await
        .unwrap_or_else(|e| panic!("{key} frees within {bound:?}: {e}"));
    lease.release().await.expect("release");
    started.elapsed()
}

async fn no_owner_rows(h: &MysqlHarness, key: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let rows = h.all_owner_rows(key).await.expect("owner rows");
        if rows.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "owner rows left for {key}: {rows:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
}

macro_rules! both_modes {
    ($($test:ident),* $(,)?) => {
        mod row {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::MysqlHarness::from_env()).await;
                }
            )*
        }
        mod named {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test(super::MysqlHarness::named()).await;
                }
            )*
        }
    };
}

both_modes!(
    first_session_is_declared_and_the_row_goes_with_the_hold,
    a_stale_row_is_ignored_and_cleaned,
    many_tasks_of_two_clients_share_one_hold,
    a_waiting_owner_enters_a_hold_taken_meanwhile_elsewhere,
    the_first_client_keeps_the_lock_while_another_clients_lease_counts,
    a_lease_that_stops_renewing_stops_counting,
    cancelled_reentries_leave_no_entry,
    a_longer_ttl_in_the_holding_client_keeps_its_session,
    a_reentry_left_after_the_first_lease_hears_a_partition_in_time,
    a_reentry_stuck_in_a_partition_answers_before_the_key_frees,
);

async fn first_session_is_declared_and_the_row_goes_with_the_hold(h: MysqlHarness) {
    let key = unique_key("row");
    let a = client(&h).await;
    assert_eq!(a.capabilities().reentrant, Reentry::FirstSession);
    let first = a.acquire(&key, &owned("job-1")).await.expect("acquire");
    let again = a.acquire(&key, &owned("job-1")).await.expect("re-enter");
    assert_eq!(again.fencing_token(), first.fencing_token());
    let rows = h.all_owner_rows(&key).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (rows[0].1.as_str(), rows[0].2, rows[0].3),
        ("job-1", first.fencing_token(), 2)
    );
    let status = a.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders.len(), 1, "one holder: {status:?}");
    assert_eq!(status.holders[0].fencing_token, Some(first.fencing_token()));
    let who = status.holders[0].who.clone().unwrap_or_default();
    assert!(who.ends_with(" (owner job-1, held 2 times)"), "{who}");
    first.release().await.expect("release");
    assert_eq!(h.all_owner_rows(&key).await.unwrap()[0].3, 1);
    again.release().await.expect("release");
    // The client that holds the lock lets it go with its last lease: at once.
    assert!(
        !held(&*client(&h).await, &key).await,
        "free after the last release"
    );
    no_owner_rows(&h, &key).await;
    assert!(h.owner_rows(&key).await.unwrap().is_empty());
}

async fn a_stale_row_is_ignored_and_cleaned(h: MysqlHarness) {
    let key = unique_key("stale");
    let (a, b) = (client(&h).await, client(&h).await);
    // A crashed holder's row: owner job-1, five entries, a hold that is gone.
    let mut admin = h.admin().await.unwrap();
    let insert = format!(
        "INSERT INTO `{}` (name, owner, token, entries, expires) \
         VALUES (X'{}', 'job-1', 7, 5, NOW(6) + INTERVAL 1 HOUR)",
        h.config().owner_table(),
        common::row_name(&key)
            .bytes()
            .map(|b| format!("{b:02X}"))
            .collect::<String>()
    );
    admin.execute(insert.as_str()).await.unwrap();
    assert!(
        h.owner_rows(&key).await.unwrap().is_empty(),
        "a stale row is not residue"
    );
    // A plain holder: the stale row must not let job-1 in.
    let plain = a
        .acquire(&key, &LockOptions::new().ttl(Duration::from_secs(3)))
        .await
        .expect("plain acquire");
    let tried = b.try_acquire(&key, &owned("job-1")).await.expect("try");
    assert!(tried.is_none(), "a stale row of the owner is not its hold");
    // That look removed the stale row.
    no_owner_rows(&h, &key).await;
    plain.release().await.expect("release");
    // Stale again, then a new hold of the owner overwrites it.
    admin.execute(insert.as_str()).await.unwrap();
    let lease = b.acquire(&key, &owned("job-1")).await.expect("acquire");
    assert_ne!(lease.fencing_token(), 7);
    let rows = h.all_owner_rows(&key).await.unwrap();
    assert_eq!(
        (rows[0].2, rows[0].3),
        (lease.fencing_token(), 1),
        "{rows:?}"
    );
    lease.release().await.expect("release");
    no_owner_rows(&h, &key).await;
}

async fn many_tasks_of_two_clients_share_one_hold(h: MysqlHarness) {
    const TASKS: usize = 8;
    let key = unique_key("many");
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let first = a.acquire(&key, &owned("job-1")).await.expect("acquire");
    let token = first.fencing_token();
    let tasks = (0..2 * TASKS).map(|i| {
        let (client, key) = (if i < TASKS { a.clone() } else { b.clone() }, key.clone());
        tokio::spawn(async move { client.acquire(&key, &owned("job-1")).await })
    });
    let mut leases: Vec<Lease> = join_all(tasks)
        .await
        .into_iter()
        .map(|r| r.expect("task").expect("re-entry"))
        .collect();
    assert!(leases.iter().all(|l| l.fencing_token() == token));
    assert_eq!(
        h.all_owner_rows(&key).await.unwrap()[0].3,
        1 + 2 * TASKS as u32
    );
    leases.push(first);
    // Released from both ends, concurrently, all but one.
    let last = leases.remove(TASKS);
    let released = join_all(leases.into_iter().map(Lease::release)).await;
    assert!(released.iter().all(Result::is_ok), "{released:?}");
    assert!(held(&*c, &key).await, "the last lease still counts");
    assert_eq!(h.all_owner_rows(&key).await.unwrap()[0].3, 1);
    last.release().await.expect("release");
    let took = frees_within(&*c, &key, Duration::from_secs(3)).await;
    assert!(
        took < Duration::from_secs(1),
        "freed {took:?} after the last release"
    );
    no_owner_rows(&h, &key).await;
}

async fn a_waiting_owner_enters_a_hold_taken_meanwhile_elsewhere(h: MysqlHarness) {
    let key = unique_key("race");
    let (p, a, b) = (client(&h).await, client(&h).await, client(&h).await);
    let plain = p
        .acquire(&key, &LockOptions::new().ttl(Duration::from_secs(3)))
        .await
        .expect("plain acquire");
    // Both clients of job-1 wait for the plain holder; one gets the key, the other must
    // enter that hold (not wait for it to end).
    let waiters: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .map(|c| {
            let key = key.clone();
            tokio::spawn(async move {
                let lease = c.acquire(&key, &owned("job-1")).await.expect("acquire");
                (lease, Instant::now())
            })
        })
        .collect();
    sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    plain.release().await.expect("release");
    let got: Vec<_> = join_all(waiters)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();
    assert_eq!(got[0].0.fencing_token(), got[1].0.fencing_token());
    for (_, at) in &got {
        let after = at.duration_since(released);
        assert!(
            after < Duration::from_millis(2500),
            "an owner waited {after:?}"
        );
    }
    for (lease, _) in got {
        lease.release().await.expect("release");
    }
    frees_within(&*p, &key, Duration::from_secs(3)).await;
    no_owner_rows(&h, &key).await;
}

async fn the_first_client_keeps_the_lock_while_another_clients_lease_counts(h: MysqlHarness) {
    let key = unique_key("keep");
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let opts = owned("job-1").ttl(Duration::from_secs(1));
    let first = a.acquire(&key, &opts).await.expect("acquire");
    let second = b.acquire(&key, &opts).await.expect("re-enter");
    first.release().await.expect("release");
    // Past the first lease's ttl, several times: the first client keeps the session.
    sleep(Duration::from_millis(2500)).await;
    assert!(held(&*c, &key).await, "the second client's lease counts");
    assert!(!second.is_lost());
    // The first client enters again while it only polls: it renews again.
    let third = a
        .acquire(&key, &opts)
        .await
        .expect("re-enter in the first client");
    assert_eq!(third.fencing_token(), second.fencing_token());
    third.release().await.expect("release");
    second.release().await.expect("release");
    let took = frees_within(&*c, &key, Duration::from_secs(3)).await;
    assert!(
        took < Duration::from_secs(1),
        "freed {took:?} after the last release"
    );
    no_owner_rows(&h, &key).await;
}

async fn a_lease_that_stops_renewing_stops_counting(h: MysqlHarness) {
    let key = unique_key("expire");
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let first = a.acquire(&key, &owned("job-1")).await.expect("acquire");
    let opts = owned("job-1").ttl(Duration::from_secs(1)).auto_renew(false);
    let unrenewed = b.acquire(&key, &opts).await.expect("re-enter");
    first.release().await.expect("release");
    // The entry of `unrenewed` still counts, until a ttl after it was taken.
    let took = frees_within(&*c, &key, Duration::from_secs(5)).await;
    assert!(
        took < Duration::from_secs(3),
        "freed {took:?} after the first release"
    );
    assert!(unrenewed.release().await.is_err(), "its hold is over");
    no_owner_rows(&h, &key).await;
}

async fn cancelled_reentries_leave_no_entry(h: MysqlHarness) {
    let key = unique_key("cancel");
    let (a, b, c) = (client(&h).await, client(&h).await, client(&h).await);
    let first = a.acquire(&key, &owned("job-1")).await.expect("acquire");
    // Re-entries from both clients, given up at every point of their round trips.
    for i in 0..30u64 {
        let client = if i % 2 == 0 { &a } else { &b };
        let gave_up = Duration::from_micros(100 * i);
        if let Ok(lease) = timeout(gave_up, client.acquire(&key, &owned("job-1"))).await {
            lease.expect("re-entry").release().await.expect("release");
        }
    }
    let deadline = Instant::now() + Duration::from_secs(3);
    while h.all_owner_rows(&key).await.unwrap()[0].3 != 1 {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            h.all_owner_rows(&key).await
        );
        sleep(Duration::from_millis(50)).await;
    }
    first.release().await.expect("release");
    frees_within(&*c, &key, Duration::from_secs(1)).await;
    no_owner_rows(&h, &key).await;
}

async fn a_longer_ttl_in_the_holding_client_keeps_its_session(h: MysqlHarness) {
    let key = unique_key("longer");
    let (a, c) = (client(&h).await, client(&h).await);
    let first = a
        .acquire(&key, &owned("job-1").ttl(Duration::from_secs(1)))
        .await
        .expect("acquire");
    let longer = a
        .acquire(&key, &owned("job-1").ttl(Duration::from_secs(6)))
        .await
        .expect("re-enter");
    first.release().await.expect("release");
    // The session was kept for 1 s of silence; the longer lease renews every 2 s.
    sleep(Duration::from_millis(3500)).await;
    assert!(!longer.is_lost(), "the longer lease keeps the hold");
    assert!(held(&*c, &key).await);
    longer.release().await.expect("release");
    frees_within(&*c, &key, Duration::from_secs(1)).await;
    no_owner_rows(&h, &key).await;
}

/// When `lease` is told it is lost (spawned: the test goes on meanwhile).
fn lost_at(lease: &Lease) -> tokio::task::JoinHandle<Instant> {
    let mut signal = lease.lost_signal();
    tokio::spawn(async move {
        signal.lost().await;
        Instant::now()
    })
}

/// When a client of its own (not cut) gets `key`, waiting up to `bound`.
async fn taken_at(h: &MysqlHarness, key: &str, bound: Duration) -> Instant {
    let b = client(h).await;
    let lease = b
        .acquire(key, &LockOptions::new().wait(Wait::For(bound)))
        .await
        .unwrap_or_else(|e| panic!("{key} frees within {bound:?}: {e}"));
    let at = Instant::now();
    lease.release().await.expect("release");
    at
}

/// A re-entry taken well after the holding session's last renewal, left alone once the
/// first lease is released, is told of a partition before another client can take the key:
/// the session's idle clock runs from its last renewal, not from the re-entry (a statement
/// on a side connection).
async fn a_reentry_left_after_the_first_lease_hears_a_partition_in_time(h: MysqlHarness) {
    let key = unique_key("left-cut");
    let (a, cut) = h
        .partitioned_client()
        .await
        .expect("a client behind a proxy");
    let ttl = Duration::from_secs(6);
    let first = a
        .acquire(&key, &owned("job-1").ttl(ttl))
        .await
        .expect("acquire");
    // The first lease renews the session between 1.5 s and 2 s; the next renewal comes
    // after 3 s. The re-entry comes between the two, the first lease goes, the network too.
    sleep(Duration::from_millis(2900)).await;
    let again = a
        .acquire(&key, &owned("job-1").ttl(ttl).wait(Wait::No))
        .await
        .expect("re-enter");
    assert_eq!(again.fencing_token(), first.fencing_token());
    first.release().await.expect("release");
    cut.cut();
    let lost = lost_at(&again);
    let taken = taken_at(&h, &key, Duration::from_secs(20)).await;
    let lost = timeout(Duration::from_secs(10), lost)
        .await
        .expect("the re-entry is told")
        .unwrap();
    assert!(
        lost < taken,
        "the re-entry was told {:?} after another client took the key",
        lost - taken
    );
    cut.heal();
    let _ = again.release().await;
}

/// A re-entry in the client that holds the lock, whose statement a partition swallows,
/// answers no later than the instant the holding session may have ended (by when the
/// hold's leases were told): the caller is not kept waiting past its hold's end.
async fn a_reentry_stuck_in_a_partition_answers_before_the_key_frees(h: MysqlHarness) {
    let key = unique_key("stuck-cut");
    let (a, cut) = h
        .partitioned_client()
        .await
        .expect("a client behind a proxy");
    let ttl = Duration::from_secs(2);
    let first = a
        .acquire(&key, &owned("job-1").ttl(ttl))
        .await
        .expect("acquire");
    let lost = lost_at(&first);
    cut.cut();
    let reentry = {
        let (a, key) = (a.clone(), key.clone());
        tokio::spawn(async move {
            let answer = a
                .acquire(&key, &owned("job-1").ttl(ttl).wait(Wait::No))
                .await;
            (answer.map(|l| l.fencing_token()), Instant::now())
        })
    };
    let taken = taken_at(&h, &key, Duration::from_secs(20)).await;
    let lost = timeout(Duration::from_secs(10), lost)
        .await
        .expect("the first lease is told")
        .unwrap();
    assert!(lost < taken, "told {:?} late", lost - taken);
    let (answer, answered) = timeout(Duration::from_secs(10), reentry)
        .await
        .expect("the re-entry answers")
        .unwrap();
    assert!(
        answer.is_err(),
        "no re-entry through a partition: {answer:?}"
    );
    assert!(
        answered < taken,
        "the re-entry answered {:?} after another client took the key",
        answered - taken
    );
    cut.heal();
    let _ = first.release().await;
}

/// Leases of an owner's hold still held when their runtime shuts down: their clean-up
/// tasks are dropped unrun, which must not start others without end (a stack overflow),
/// and the key frees once the session is gone.
#[test]
fn owner_leases_dropped_at_runtime_shutdown_do_not_respawn_their_cleanup() {
    let h = MysqlHarness::from_env();
    let key = unique_key("shutdown");
    let runtime = || {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    };
    let rt = runtime();
    rt.block_on(async {
        let a = client(&h).await;
        let first = a.acquire(&key, &owned("job-1")).await.expect("acquire");
        let again = a.acquire(&key, &owned("job-1")).await.expect("re-enter");
        tokio::spawn(async move {
            let _kept = (a, first, again);
            std::future::pending::<()>().await
        });
    });
    drop(rt);
    runtime().block_on(async {
        frees_within(&*client(&h).await, &key, Duration::from_secs(10)).await;
    });
}
