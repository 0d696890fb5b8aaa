//! One scenario per promise of the contract (DESIGN.md, "The contract"). Each takes a
//! [`Ctx`], uses keys under the context's fresh prefix, and ends with [`Ctx::finish`], which
//! checks that nothing was left on the server.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::{
    DistributedLock, ErrorKind, Expiry, Lease, LockOptions, LostReason, Wait, Wakeup,
};
use futures::future::join_all;
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep, timeout};

use crate::{Ctx, History, Hold};

/// Extra time allowed over a computed bound, for a loaded 2-core machine.
const SLACK: Duration = Duration::from_secs(3);

fn opts(cx: &Ctx) -> LockOptions {
    LockOptions::new().ttl(cx.harness().ttl())
}

fn waiting(cx: &Ctx, wait: Duration) -> LockOptions {
    opts(cx).wait(Wait::For(wait))
}

async fn must_take(client: &dyn DistributedLock, key: &str, opts: &LockOptions) -> Lease {
    match client.try_acquire(key, opts).await {
        Ok(Some(lease)) => lease,
        Ok(None) => panic!("{key} should be free, but try_acquire found it held"),
        Err(e) => panic!("try_acquire({key}) failed: {e}"),
    }
}

async fn must_be_held(client: &dyn DistributedLock, key: &str, opts: &LockOptions, why: &str) {
    match client.try_acquire(key, opts).await {
        Ok(None) => {}
        Ok(Some(lease)) => panic!(
            "{key} should be held ({why}), but another client took it (token {})",
            lease.fencing_token()
        ),
        Err(e) => panic!("try_acquire({key}) failed: {e}"),
    }
}

fn join_panics<T>(results: Vec<Result<T, tokio::task::JoinError>>) -> Vec<T> {
    results
        .into_iter()
        .map(|r| match r {
            Ok(v) => v,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            Err(e) => panic!("task failed: {e}"),
        })
        .collect()
}

/// The first few violations of a history, one a line.
fn violations_report(violations: &[crate::Violation]) -> String {
    const SHOWN: usize = 5;
    let mut lines: Vec<String> = violations
        .iter()
        .take(SHOWN)
        .map(ToString::to_string)
        .collect();
    if violations.len() > SHOWN {
        lines.push(format!("… and {} more", violations.len() - SHOWN));
    }
    format!(
        "{} history violations:\n  {}",
        violations.len(),
        lines.join("\n  ")
    )
}

/// Promise 1: Many clients (separate connections), many tasks, one key: no two holders overlap,
/// and a read-modify-write done under the lock loses no update.
pub async fn mutual_exclusion(cx: Ctx) {
    const CLIENTS: usize = 4;
    const TASKS: usize = 3;
    const ROUNDS: u64 = 5;
    let key = cx.key("shared");
    let history = History::new();
    let counter = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(cx.client().await);
    }
    // Read from a client in use: a connection that fails fails the test, it does not turn
    // the token check off.
    let ordered = clients[0].capabilities().fencing.is_ordered();
    let mut tasks = Vec::new();
    for (c, client) in clients.into_iter().enumerate() {
        for _ in 0..TASKS {
            let (client, key, history, counter) = (
                client.clone(),
                key.clone(),
                history.clone(),
                counter.clone(),
            );
            let opts = waiting(&cx, Duration::from_secs(120));
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lease = client
                        .acquire(&key, &opts)
                        .await
                        .expect("acquire under contention");
                    let start = Instant::now();
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    // A fixed pause, not a poll: it widens the read-modify-write window.
                    sleep(Duration::from_millis(1)).await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    let end = Instant::now();
                    assert!(!lease.is_lost(), "lease lost in calm weather");
                    history.record(Hold {
                        client: c,
                        key: key.clone(),
                        token: lease.fencing_token(),
                        start,
                        end,
                        lost_at: None,
                    });
                    lease.release().await.expect("release");
                }
            }));
        }
    }
    join_panics(join_all(tasks).await);
    let violations = history.check(ordered);
    assert!(violations.is_empty(), "{}", violations_report(&violations));
    let total = (CLIENTS * TASKS) as u64 * ROUNDS;
    assert_eq!(
        counter.load(Ordering::SeqCst),
        total,
        "updates under the lock were lost"
    );
    assert_eq!(history.holds().len() as u64, total);
    cx.finish().await;
}

/// Promise 2: try_acquire answers at once: `None` while held (by another client, or by another task
/// of the same client), a lease once free.
pub async fn try_acquire_answers_at_once(cx: Ctx) {
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let opts = opts(&cx);
    let lease = must_take(&*a, &key, &opts).await;
    let asked = Instant::now();
    must_be_held(&*b, &key, &opts, "held by a").await;
    must_be_held(&*a, &key, &opts, "held by another task of a").await;
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "try_acquire on a held key took {:?}",
        asked.elapsed()
    );
    lease.release().await.expect("release");
    must_take(&*b, &key, &opts)
        .await
        .release()
        .await
        .expect("release");
    cx.finish().await;
}

/// Promise 3a: acquire with a wait gives up with `Timeout` close to the deadline while the key
/// stays held.
pub async fn acquire_times_out_near_deadline(cx: Ctx) {
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let lease = must_take(&*a, &key, &opts(&cx)).await;
    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let err = b
        .acquire(&key, &waiting(&cx, wait))
        .await
        .expect_err("the key is held");
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        took >= wait - Duration::from_millis(20),
        "gave up early, after {took:?}"
    );
    assert!(
        took <= wait + Duration::from_millis(1500),
        "gave up late, after {took:?}"
    );
    let no_wait = b
        .acquire(&key, &opts(&cx).wait(Wait::No))
        .await
        .expect_err("the key is held");
    assert_eq!(no_wait.kind(), ErrorKind::Timeout, "{no_wait}");
    lease.release().await.expect("release");
    cx.finish().await;
}

/// Promise 3b: A waiter is woken by the release, not by a polling timer: it acquires within the
/// harness's hand-off bound.
pub async fn waiter_is_woken_on_release(cx: Ctx) {
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    // A long ttl, so a waiter cannot be woken by the holder's expiry instead.
    let long = opts(&cx).ttl(Duration::from_secs(60));
    let lease = must_take(&*a, &key, &long).await;
    let waiter = {
        let (b, key, opts) = (
            b.clone(),
            key.clone(),
            waiting(&cx, Duration::from_secs(60)),
        );
        tokio::spawn(async move {
            let lease = b
                .acquire(&key, &opts)
                .await
                .expect("waiter acquires after release");
            (Instant::now(), lease)
        })
    };
    // A fixed pause, not a poll: let the waiter queue (not observable) before the release.
    sleep(Duration::from_millis(500)).await;
    let released = Instant::now();
    lease.release().await.expect("release");
    let (acquired, lease) = join_panics(vec![waiter.await]).remove(0);
    let handoff = acquired.saturating_duration_since(released);
    let bound = cx.harness().handoff_bound();
    assert!(
        handoff <= bound,
        "hand-off took {handoff:?} (bound {bound:?}): the waiter was not woken by the release"
    );
    lease.release().await.expect("release");
    cx.finish().await;
}

/// Promise 4: A lease that expired (or was broken) and whose key was taken by another client cannot
/// release or extend: it gets `NotHeld`, and the new holder keeps the key.
pub async fn stale_lease_cannot_release_or_extend(cx: Ctx) {
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let caps = a.capabilities();
    let once = opts(&cx).auto_renew(false);
    // By expiry, where the ttl is what ends a lease.
    if caps.expiry == Expiry::Ttl {
        let key = cx.key("expired");
        let stale = must_take(&*a, &key, &once).await;
        let bound = cx.harness().ttl() + SLACK;
        let newer = b
            .acquire(&key, &waiting(&cx, bound))
            .await
            .expect("the key frees after its ttl");
        assert!(stale.is_lost(), "the expired lease was not reported lost");
        let err = stale
            .release()
            .await
            .expect_err("a stale lease must not release");
        assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
        must_be_held(&*c, &key, &once, "the new holder must be undisturbed").await;
        newer.release().await.expect("the new holder releases");
    }
    // By an operator deleting the lock behind the holder's back.
    let key = cx.key("broken");
    let stale = must_take(&*a, &key, &once).await;
    cx.harness()
        .break_lease(&key)
        .await
        .expect("break the lease");
    let newer = b
        .acquire(&key, &waiting(&cx, Duration::from_secs(10)))
        .await
        .expect("the broken key is free");
    let err = stale
        .extend(cx.harness().ttl())
        .await
        .expect_err("a stale lease must not extend");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    let err = stale
        .release()
        .await
        .expect_err("a stale lease must not release");
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    must_be_held(&*c, &key, &once, "the new holder must be undisturbed").await;
    newer.release().await.expect("the new holder releases");
    cx.finish().await;
}

async fn crashed_holder(cx: &Ctx, key: &str) -> (Box<dyn crate::Holder>, Instant) {
    let mut holder = cx
        .harness()
        .spawn_holder(cx.test(), key, cx.harness().ttl())
        .await
        .unwrap_or_else(|e| panic!("{}", cx.unreachable_message(&e)));
    let b = cx.client().await;
    must_be_held(&*b, key, &opts(cx), "the holder process holds it").await;
    holder.kill().await;
    (holder, Instant::now())
}

/// Promise 5: A holder process killed with SIGKILL frees the key within the backend's bound (ttl,
/// session timeout, or at once when the server frees on disconnect).
pub async fn crash_release(cx: Ctx) {
    let key = cx.key("k");
    let b = cx.client().await;
    let bound = b.capabilities().crash_release_bound(cx.harness().ttl()) + SLACK;
    let (_holder, killed) = crashed_holder(&cx, &key).await;
    let lease = b
        .acquire(&key, &waiting(&cx, bound + Duration::from_secs(10)))
        .await
        .expect("the crashed holder's key frees");
    let took = killed.elapsed();
    assert!(
        took <= bound,
        "the key freed {took:?} after the crash (bound {bound:?})"
    );
    lease.release().await.expect("release");
    cx.finish().await;
}

/// Promise 8b: The next holder after a crash gets a greater fencing token than the crashed one
/// (where fencing is ordered).
pub async fn fencing_monotonic_after_crash(cx: Ctx) {
    let key = cx.key("k");
    let b = cx.client().await;
    let bound = b.capabilities().crash_release_bound(cx.harness().ttl()) + SLACK;
    let (holder, _) = crashed_holder(&cx, &key).await;
    let lease = b
        .acquire(&key, &waiting(&cx, bound + Duration::from_secs(10)))
        .await
        .expect("the crashed holder's key frees");
    if b.capabilities().fencing.is_ordered() {
        assert!(
            lease.fencing_token() > holder.token(),
            "token {} after a crashed holder's token {}",
            lease.fencing_token(),
            holder.token()
        );
    }
    lease.release().await.expect("release");
    cx.finish().await;
}

/// Promise 6a: With auto-renew, a lease held for 5 x ttl stays exclusive and is never lost.
pub async fn renewal_keeps_lease(cx: Ctx) {
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let ttl = cx.harness().ttl();
    let lease = must_take(&*a, &key, &opts(&cx)).await;
    let until = Instant::now() + ttl * 5;
    while Instant::now() < until {
        must_be_held(&*b, &key, &opts(&cx), "auto-renew keeps it").await;
        assert!(!lease.is_lost(), "a renewed lease was lost: {:?}", lease);
        sleep(ttl / 4).await;
    }
    lease
        .release()
        .await
        .expect("a renewed lease releases cleanly");
    cx.finish().await;
}

/// Promise 6b: Without auto-renew the key frees after the ttl, and the holder was told (`lost`)
/// before another client took it. On session backends the ttl is not used: the lease lives
/// with the session, as declared.
pub async fn key_frees_after_ttl_without_renewal(cx: Ctx) {
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let ttl = cx.harness().ttl();
    let once = opts(&cx).auto_renew(false);
    let lease = must_take(&*a, &key, &once).await;
    match a.capabilities().expiry {
        Expiry::Ttl => {
            let granted = Instant::now();
            let newer = b
                .acquire(&key, &waiting(&cx, ttl + SLACK))
                .await
                .expect("the key frees after its ttl");
            let took = granted.elapsed();
            assert!(
                lease.is_lost(),
                "the key was taken but the old holder was not told"
            );
            assert!(
                took + Duration::from_millis(50) >= ttl.mul_f64(0.9),
                "the key freed after {took:?}, before its ttl {ttl:?}"
            );
            assert_eq!(
                timeout(Duration::from_millis(10), lease.lost()).await.ok(),
                Some(LostReason::Expired)
            );
            newer.release().await.expect("release");
            assert_eq!(
                lease.release().await.expect_err("expired").kind(),
                ErrorKind::NotHeld
            );
        }
        Expiry::Session { .. } => {
            sleep(ttl * 2).await;
            must_be_held(
                &*b,
                &key,
                &once,
                "a session lease does not expire with the ttl",
            )
            .await;
            assert!(!lease.is_lost());
            lease.release().await.expect("release");
        }
    }
    cx.finish().await;
}

/// Promise 6c: a manual extend moves the lease's deadline both ways: a longer ttl keeps the
/// key past its first ttl; a shorter one makes `lost()` fire by the new deadline, before
/// another client takes the key. On session backends the ttl is not used, as declared.
pub async fn manual_extend_moves_the_deadline(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let ttl = cx.harness().ttl();
    let once = opts(&cx).auto_renew(false);
    let longer = must_take(&*a, &cx.key("longer"), &once).await;
    sleep(ttl / 2).await;
    longer
        .extend(ttl * 3)
        .await
        .expect("extend to a longer ttl");
    sleep(ttl).await; // past the first ttl
    must_be_held(&*b, &cx.key("longer"), &once, "extended past its first ttl").await;
    assert!(
        !longer.is_lost(),
        "an extended lease was reported lost: {longer:?}"
    );
    longer.release().await.expect("release an extended lease");
    if a.capabilities().expiry == Expiry::Ttl {
        let key = cx.key("shorter");
        let shorter = must_take(&*a, &key, &once.ttl(ttl * 5)).await;
        let mut signal = shorter.lost_signal();
        shorter.extend(ttl).await.expect("extend to a shorter ttl");
        let extended = Instant::now();
        let fired = timeout(ttl + Duration::from_secs(1), signal.lost()).await;
        assert!(
            fired.is_ok(),
            "lost() did not fire by the shorter deadline ({ttl:?} after the extend)"
        );
        let lost_after = extended.elapsed();
        let newer = b
            .acquire(&key, &waiting(&cx, ttl * 5 + SLACK))
            .await
            .expect("the key frees");
        assert!(
            extended.elapsed() >= lost_after,
            "another client took the key before lost() fired"
        );
        newer.release().await.expect("release");
        drop(shorter);
    }
    cx.finish().await;
}

/// Promise 7a: When the lease is broken on the server, `lost()` fires (at the latest at the next
/// renewal).
pub async fn lost_fires_when_lease_broken(cx: Ctx) {
    let key = cx.key("k");
    let a = cx.client().await;
    let lease = must_take(&*a, &key, &opts(&cx)).await;
    cx.harness()
        .break_lease(&key)
        .await
        .expect("break the lease");
    let bound = cx.harness().ttl() + SLACK;
    let reason = timeout(bound, lease.lost())
        .await
        .unwrap_or_else(|_| panic!("lost() did not fire within {bound:?}"));
    assert!(
        matches!(reason, LostReason::NotHeld | LostReason::SessionEnded(_)),
        "{reason}"
    );
    let err = lease
        .release()
        .await
        .expect_err("a broken lease must not release");
    assert!(
        matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost),
        "{err}"
    );
    cx.finish().await;
}

/// Promise 7b: A holder cut off from the server is told its lease is lost before another client
/// can take the key.
pub async fn lost_fires_before_partitioned_lease_is_taken(cx: Ctx) {
    let key = cx.key("k");
    let (a, cut) = cx
        .harness()
        .partitioned_client()
        .await
        .unwrap_or_else(|e| panic!("{}", cx.unreachable_message(&e)));
    let b = cx.client().await;
    let lease = must_take(&*a, &key, &opts(&cx)).await;
    cut.cut();
    let bound = b
        .capabilities()
        .crash_release_bound(cx.harness().ttl())
        .max(cx.harness().ttl())
        + SLACK;
    let newer = b
        .acquire(&key, &waiting(&cx, bound + Duration::from_secs(30)))
        .await
        .expect("the cut-off holder's key frees");
    // Read the lease's own state, not a watcher task's record, which a busy scheduler could
    // run late.
    assert!(
        lease.is_lost(),
        "another client took the key but the cut-off holder was not told before"
    );
    newer.release().await.expect("release");
    cut.heal();
    drop(lease);
    cx.finish().await;
}

/// Promise 8a: Fencing tokens strictly increase across successive holders (where declared).
pub async fn fencing_tokens_increase(cx: Ctx) {
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let mut tokens = Vec::new();
    for i in 0..6 {
        let client = if i % 2 == 0 { &a } else { &b };
        let lease = must_take(&**client, &key, &opts(&cx)).await;
        tokens.push(lease.fencing_token());
        lease.release().await.expect("release");
    }
    if a.capabilities().fencing.is_ordered() {
        assert!(
            tokens.windows(2).all(|w| w[0] < w[1]),
            "tokens did not increase: {tokens:?}"
        );
    } else {
        assert_eq!(tokens.len(), 6);
    }
    cx.finish().await;
}

/// Promise 9: Different keys never block each other, however close they are: a key and its
/// children, case, trailing space, percent-encoding, separators the backend uses inside its
/// own names, and letters a collation might fold. All are held at once.
pub async fn independent_keys(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let base = cx.key("near");
    let mut keys = vec![base.clone(), base.to_uppercase()];
    for suffix in [
        "/child", "/", " ", "%2F", "%2f", ":fence", "}:fence", "/../x", ".", "ss", "ß", "é",
        "e\u{301}", "\\",
    ] {
        keys.push(format!("{base}{suffix}"));
    }
    // The same client and another one, alternately.
    let mut leases = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let client = if i % 2 == 0 { &a } else { &b };
        match client.try_acquire(key, &opts(&cx)).await {
            Ok(Some(lease)) => leases.push(lease),
            Ok(None) => panic!(
                "{key:?} is busy while only {:?} are held: the backend merges distinct keys",
                &keys[..i]
            ),
            Err(e) => panic!("try_acquire({key:?}): {e}"),
        }
    }
    // A waiter parked on a held key does not hold up its own client on other keys.
    let parked = tokio::spawn({
        let (b, key, opts) = (
            b.clone(),
            base.clone(),
            waiting(&cx, Duration::from_secs(60)),
        );
        async move { b.acquire(&key, &opts).await }
    });
    // A fixed pause, not a poll: let the waiter park (not observable) before the next call.
    sleep(Duration::from_millis(200)).await;
    let other = tokio::time::timeout(
        Duration::from_secs(5),
        b.try_acquire(&cx.key("other"), &opts(&cx)),
    )
    .await
    .expect("a parked waiter held up its client's try_acquire of another key")
    .expect("try_acquire")
    .expect("another key is free while a waiter is parked");
    other.release().await.expect("release");
    for lease in leases {
        lease.release().await.expect("release");
    }
    parked
        .await
        .expect("the parked waiter's task")
        .expect("the parked waiter gets the key once it is released")
        .release()
        .await
        .expect("release");
    cx.finish().await;
}

/// Promise 10: Where fair, waiters acquire in arrival order; otherwise every waiter still gets the
/// key, one at a time.
pub async fn fairness(cx: Ctx) {
    const WAITERS: usize = 4;
    let key = cx.key("k");
    let a = cx.client().await;
    let fair = a.capabilities().fair;
    let holder = must_take(&*a, &key, &opts(&cx).ttl(Duration::from_secs(60))).await;
    let order = Arc::new(Mutex::new(Vec::new()));
    let history = History::new();
    let mut waiters = Vec::new();
    for i in 0..WAITERS {
        let client = cx.client().await;
        let (key, order, history, opts) = (
            key.clone(),
            order.clone(),
            history.clone(),
            waiting(&cx, Duration::from_secs(60)),
        );
        waiters.push(tokio::spawn(async move {
            let lease = client
                .acquire(&key, &opts)
                .await
                .expect("every waiter acquires");
            let start = Instant::now();
            order.lock().await.push(i);
            // A fixed pause, not a poll: hold the key a moment, so an overlap would show.
            sleep(Duration::from_millis(20)).await;
            history.record(Hold {
                client: i,
                key,
                token: lease.fencing_token(),
                start,
                end: Instant::now(),
                lost_at: None,
            });
            lease.release().await.expect("release");
        }));
        // Arrival order: a fixed pause, not a poll (queueing is not observable), to queue.
        sleep(Duration::from_millis(300)).await;
    }
    holder.release().await.expect("release");
    join_panics(join_all(waiters).await);
    let order = order.lock().await.clone();
    assert_eq!(order.len(), WAITERS);
    if fair {
        assert_eq!(
            order,
            (0..WAITERS).collect::<Vec<_>>(),
            "a fair backend served waiters out of arrival order"
        );
    }
    let violations = history.check(false);
    assert!(violations.is_empty(), "{}", violations_report(&violations));
    cx.finish().await;
}

/// Promise 11: The herd cost of a release, measured and checked against the declaration.
///
/// `WAITERS` clients wait for one key; it is handed down the line, one release at a time,
/// and each release's wake-ups ([`LockStats::wakeups`](dlock_core::LockStats) summed over
/// the waiting clients) are recorded. The running total may not exceed what
/// [`Wakeup::max_per_release`] allows for the waiters left (one per release where the
/// backend says so), which a wake-up counted late cannot break; and it must reach one per
/// release, since every waiter that got the key was woken: a count that stays at zero
/// fails instead of passing.
pub async fn no_herd(cx: Ctx) {
    const WAITERS: usize = 8;
    let key = cx.key("k");
    let a = cx.client().await;
    let wakeup = a.capabilities().wakeup;
    // Long leases: no wake-up may come from a lease's expiry instead of a release.
    let long = opts(&cx).ttl(Duration::from_secs(60));
    let holder = must_take(&*a, &key, &long).await;
    let mut clients = Vec::new();
    let (won_tx, mut won_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for _ in 0..WAITERS {
        let client = cx.client().await;
        clients.push(client.clone());
        let (key, opts, won) = (
            key.clone(),
            long.wait(Wait::For(Duration::from_secs(120))),
            won_tx.clone(),
        );
        waiters.push(tokio::spawn(async move {
            let lease = client
                .acquire(&key, &opts)
                .await
                .expect("every waiter acquires in the end");
            let (release_tx, release_rx) = tokio::sync::oneshot::channel::<()>();
            let _ = won.send(release_tx);
            let _ = release_rx.await;
            lease.release().await.expect("release");
        }));
    }
    // A fixed pause, not a poll: let every waiter queue (not observable) before the release.
    sleep(Duration::from_millis(1000)).await;
    let counted = || clients.iter().map(|c| c.stats().wakeups).sum::<u64>();
    let mut before = counted();
    let (mut figures, mut allowed) = (Vec::new(), 0u64);
    holder.release().await.expect("release");
    for released in 0..WAITERS {
        let left = (WAITERS - released) as u64;
        let winner = timeout(Duration::from_secs(60), won_rx.recv())
            .await
            .unwrap_or_else(|_| panic!("nobody took the key within 60 s of release {released}"))
            .expect("a waiter wins");
        // The losers' wake-ups: wait until the count has been still for 200 ms.
        let settled = Instant::now() + Duration::from_secs(5);
        let mut last = counted();
        // A fixed first pause: a wake-up not yet counted cannot be polled for.
        sleep(Duration::from_millis(300)).await;
        while counted() != last && Instant::now() < settled {
            last = counted();
            // The poll's interval: a count unchanged over it is still.
            sleep(Duration::from_millis(200)).await;
        }
        let now = counted();
        figures.push(now - before);
        before = now;
        if let Some(bound) = wakeup.max_per_release(left) {
            allowed += bound;
            let total: u64 = figures.iter().sum();
            assert!(
                total <= allowed,
                "wake-ups per release {figures:?} ({WAITERS} waiters at first, one fewer \
                 each release): {total} in all, more than the {allowed} that {wakeup:?} \
                 allows for these releases"
            );
        }
        let _ = winner.send(());
    }
    join_panics(join_all(waiters).await);
    let total: u64 = figures.iter().sum();
    tracing::info!(
        test = cx.test(),
        ?wakeup,
        wakeups_per_release = ?figures,
        mean = total as f64 / WAITERS as f64,
        "the herd cost of a release, {WAITERS} waiters at first"
    );
    if matches!(wakeup, Wakeup::Notification { .. }) {
        assert!(
            total >= WAITERS as u64,
            "LockStats::wakeups counted {figures:?} for {WAITERS} releases that each woke \
             the waiter that took the key: the count misses wake-ups"
        );
    }
    cx.finish().await;
}

/// Promise 12: Dropping an acquire future while it waits leaves nothing behind and delays nobody.
pub async fn cancelled_acquire_leaves_nothing(cx: Ctx) {
    let key = cx.key("k");
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let holder = must_take(&*a, &key, &opts(&cx)).await;
    let gave_up = timeout(Duration::from_millis(300), b.acquire(&key, &opts(&cx))).await;
    assert!(
        gave_up.is_err(),
        "the waiter should still have been waiting"
    );
    holder.release().await.expect("release");
    // Nobody is delayed: the key is free for a third client right after the release.
    let deadline = Instant::now() + Duration::from_secs(1);
    let lease = loop {
        match c.try_acquire(&key, &opts(&cx)).await.expect("try_acquire") {
            Some(lease) => break lease,
            // The poll's interval, until the deadline.
            None if Instant::now() < deadline => sleep(Duration::from_millis(20)).await,
            None => panic!("a cancelled waiter still holds or blocks the key"),
        }
    };
    // The cancelled waiter did not take the key later either.
    lease.release().await.expect("release");
    must_take(&*c, &key, &opts(&cx))
        .await
        .release()
        .await
        .expect("release");
    cx.finish().await;
}

/// Promise 13a: Empty, over-long and NUL-bearing keys are rejected with `InvalidKey` before any
/// network I/O, leaving nothing on the server.
///
/// "Before any I/O" is checked on every backend: a client connected through a network the
/// test then cuts must still refuse the bad keys at once, and must not even try to send
/// anything for them ([`Partition::traffic_while_cut`](crate::Partition)). Background
/// traffic (a heartbeat, a reconnect) may fall into one look; a request made for the bad
/// keys falls into every look. Then a valid key on the same cut client must show as
/// traffic: a count that cannot see the client fails the test instead of passing it.
pub async fn bad_keys_are_rejected_before_io(cx: Ctx) {
    const LOOKS: usize = 5;
    let a = cx.client().await;
    let keys = bad_keys(&cx, a.capabilities().max_key_len);
    for key in &keys {
        refused_at_once(&*a, key, &opts(&cx)).await;
    }
    let (cut_client, cut) = cx
        .harness()
        .partitioned_client()
        .await
        .unwrap_or_else(|e| panic!("{}", cx.unreachable_message(&e)));
    // Connected and settled: one valid acquire opens whatever the client opens lazily.
    must_take(&*cut_client, &cx.key("warm-up"), &opts(&cx))
        .await
        .release()
        .await
        .expect("release");
    // A fixed pause, not a poll: the warm-up's background traffic has no end to wait for.
    sleep(Duration::from_millis(200)).await;
    cut.cut();
    let mut looks = Vec::new();
    for _ in 0..LOOKS {
        let before = cut.traffic_while_cut();
        for key in &keys {
            refused_at_once(&*cut_client, key, &opts(&cx)).await;
        }
        // A fixed pause, not a poll (silence is what is checked): long enough for a request
        // handed to another task to reach the wire.
        sleep(Duration::from_millis(100)).await;
        looks.push(cut.traffic_while_cut() - before);
        if looks.last() == Some(&0) {
            break;
        }
    }
    assert!(
        looks.last() == Some(&0),
        "the client tried to reach the server for bad keys: traffic into the cut network \
         in each of {LOOKS} looks: {looks:?}"
    );
    // The count sees this client: a valid key does try the server.
    let before = cut.traffic_while_cut();
    let probe = (cx.key("probe"), opts(&cx));
    let tried = async {
        while cut.traffic_while_cut() == before {
            // The poll's interval.
            sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        () = tried => {}
        answer = cut_client.try_acquire(&probe.0, &probe.1) => {
            assert!(
                !matches!(answer, Ok(Some(_))),
                "acquired a key through a cut network"
            );
            assert!(
                cut.traffic_while_cut() > before,
                "a valid try_acquire on a cut network ended ({answer:?}) without trying \
                 the server: the traffic count does not see this client"
            );
        }
        () = sleep(Duration::from_secs(10)) => panic!(
            "a valid try_acquire sent nothing into the cut network within 10 s: the \
             traffic count does not see this client"
        ),
    }
    cut.heal();
    drop(cut_client);
    cx.finish().await;
}

/// The keys every backend must refuse: empty, with a NUL byte, one byte too long.
fn bad_keys(cx: &Ctx, max_key_len: usize) -> Vec<String> {
    let too_long = cx.key(&"x".repeat(max_key_len.saturating_sub(cx.prefix().len()) + 1));
    assert_eq!(too_long.len(), max_key_len + 1);
    vec![String::new(), cx.key("nul\0byte"), too_long]
}

/// Both `try_acquire` and `acquire` of `key` answer `InvalidKey`, within a second.
async fn refused_at_once(client: &dyn DistributedLock, key: &str, opts: &LockOptions) {
    let shown = format!(
        "{:?} ({} bytes)",
        key.chars().take(40).collect::<String>(),
        key.len()
    );
    let started = Instant::now();
    let limit = Duration::from_secs(5);
    let answers = [
        timeout(limit, client.try_acquire(key, opts))
            .await
            .map(|r| r.map(|_| ())),
        timeout(limit, client.acquire(key, opts))
            .await
            .map(|r| r.map(|_| ())),
    ];
    for (call, answer) in ["try_acquire", "acquire"].into_iter().zip(answers) {
        match answer {
            Err(_) => {
                panic!("{call}({shown}) did not answer within {limit:?}: it waits on the network")
            }
            Ok(Ok(())) => panic!("{call}({shown}) accepted a bad key"),
            Ok(Err(e)) => assert_eq!(e.kind(), ErrorKind::InvalidKey, "{call}({shown}): {e}"),
        }
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "refusing {shown} took {took:?}: not before any network I/O"
    );
}

/// Promise 13b: Out-of-range options are rejected with `InvalidConfig`.
pub async fn bad_options_are_rejected(cx: Ctx) {
    let a = cx.client().await;
    let key = cx.key("k");
    for ttl in [Duration::ZERO, Duration::from_secs(3 * 24 * 3600)] {
        let err = a
            .try_acquire(&key, &opts(&cx).ttl(ttl))
            .await
            .expect_err("bad ttl");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    }
    let lease = must_take(&*a, &key, &opts(&cx)).await;
    let err = lease.extend(Duration::ZERO).await.expect_err("bad ttl");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    lease
        .release()
        .await
        .expect("a lease survives a refused extend");
    cx.finish().await;
}

/// Promise 13c: Bad URLs, wrong credentials and a server of the wrong kind give the declared typed
/// error within a bound, and no error shows a password.
pub async fn bad_urls_are_rejected(cx: Ctx) {
    let key = cx.key("k");
    let cases = cx.harness().bad_urls();
    assert!(!cases.is_empty(), "the harness lists no bad URLs");
    for (url, kind) in cases {
        let attempt = async {
            let client = cx.harness().connect(&url).await?;
            client.try_acquire(&key, &opts(&cx)).await.map(|_| ())
        };
        let err = match timeout(Duration::from_secs(20), attempt).await {
            Ok(Ok(())) => panic!("{url}: accepted, expected {kind}"),
            Ok(Err(e)) => e,
            Err(_) => panic!("{url}: no answer within 20 s, expected {kind}"),
        };
        assert_eq!(err.kind(), kind, "{url}: {err}");
        if let Some(password) = password_of(&url) {
            for text in [err.to_string(), format!("{err:?}")] {
                assert!(
                    !text.contains(password),
                    "{url}: the error shows the password: {text}"
                );
            }
        }
    }
    cx.finish().await;
}

fn password_of(url: &str) -> Option<&str> {
    let authority = url.split_once("://")?.1.split('/').next()?;
    let userinfo = authority.rsplit_once('@')?.0;
    let password = userinfo.split_once(':')?.1;
    (password.len() >= 3).then_some(password)
}

/// Promise 14: With nothing behind the address, acquire fails with `Unavailable` within the connect
/// timeout.
pub async fn unavailable_server(cx: Ctx) {
    let started = Instant::now();
    let attempt = async {
        let client = cx.harness().unreachable_client().await?;
        client
            .acquire(&cx.key("k"), &waiting(&cx, Duration::from_secs(2)))
            .await
            .map(|_| ())
    };
    let err = match timeout(Duration::from_secs(20), attempt).await {
        Ok(Ok(())) => panic!("acquired from a server that does not exist"),
        Ok(Err(e)) => e,
        Err(_) => panic!("no answer within 20 s from an unreachable server"),
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    tracing::info!(test = cx.test(), took = ?started.elapsed(), "unreachable server reported");
    cx.finish().await;
}

/// Promise 14b: A server that accepts connections but never answers does not make acquire hang:
/// it ends (`Unavailable` or `Timeout`) within its wait plus the connect timeout.
pub async fn black_holed_server_does_not_hang(cx: Ctx) {
    let (a, cut) = cx
        .harness()
        .partitioned_client()
        .await
        .unwrap_or_else(|e| panic!("{}", cx.unreachable_message(&e)));
    cut.cut();
    let (key, opts) = (cx.key("k"), waiting(&cx, Duration::from_secs(2)));
    let attempt = a.acquire(&key, &opts);
    match timeout(Duration::from_secs(20), attempt).await {
        Ok(Ok(_)) => panic!("acquired through a cut network"),
        Ok(Err(e)) => assert!(
            matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
            "{e}"
        ),
        Err(_) => panic!("acquire hung for 20 s on a black-holed server"),
    }
    cut.heal();
    cx.finish().await;
}

/// Promise 15: Leases dropped without release, timed-out and cancelled waits, and a dropped client
/// leave nothing on the server.
pub async fn dropped_leases_leave_nothing(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    // A ttl far longer than the test, so only a release (not expiry) can free these keys.
    let long = opts(&cx).ttl(Duration::from_secs(60));
    let dropped = must_take(&*a, &cx.key("dropped"), &long).await;
    drop(dropped);
    let held = must_take(&*a, &cx.key("held"), &long).await;
    let _ = b
        .acquire(&cx.key("held"), &waiting(&cx, Duration::from_millis(200)))
        .await;
    let _ = timeout(
        Duration::from_millis(200),
        b.acquire(&cx.key("held"), &long),
    )
    .await;
    drop(held);
    // A lease that outlives its client value still releases on drop.
    let kept = must_take(&*b, &cx.key("client-dropped"), &long).await;
    drop(b);
    drop(kept);
    // A dropped lease is released in the background: its key frees promptly for others.
    let c = cx.client().await;
    let bound = cx.harness().handoff_bound() + Duration::from_secs(1);
    for name in ["dropped", "held", "client-dropped"] {
        let started = Instant::now();
        let lease = c
            .acquire(&cx.key(name), &waiting(&cx, bound))
            .await
            .unwrap_or_else(|e| {
                panic!("a dropped lease did not free {name} within {bound:?}: {e}")
            });
        assert!(started.elapsed() <= bound);
        lease.release().await.expect("release");
    }
    cx.finish().await;
}

/// Promise 16: One client value shared by hundreds of tasks works, and stays exclusive.
pub async fn shared_client(cx: Ctx) {
    const TASKS: usize = 200;
    const KEYS: usize = 10;
    let client = cx.client().await;
    let history = History::new();
    let tasks = (0..TASKS).map(|i| {
        let (client, history, key, opts) = (
            client.clone(),
            history.clone(),
            cx.key(&format!("k{}", i % KEYS)),
            waiting(&cx, Duration::from_secs(120)),
        );
        tokio::spawn(async move {
            let lease = client
                .acquire(&key, &opts)
                .await
                .expect("acquire from a shared client");
            let start = Instant::now();
            tokio::task::yield_now().await;
            history.record(Hold {
                client: i,
                key,
                token: lease.fencing_token(),
                start,
                end: Instant::now(),
                lost_at: None,
            });
            lease.release().await.expect("release");
        })
    });
    join_panics(join_all(tasks).await);
    assert_eq!(history.holds().len(), TASKS);
    let violations = history.check(client.capabilities().fencing.is_ordered());
    assert!(violations.is_empty(), "{}", violations_report(&violations));
    cx.finish().await;
}
