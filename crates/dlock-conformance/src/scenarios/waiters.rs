//! Waiting for a key: timeouts, wake-ups on release, fairness, the herd cost of a release
//! and cancelled waits.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{ErrorKind, Wait, Wakeup};
use futures::future::join_all;
use tokio::sync::Mutex;
use tokio::time::{Instant, sleep, timeout};

use super::{join_panics, must_take, opts, violations_report, waiting};
use crate::{Ctx, History, Hold};

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
                mode: lease.mode(),
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
