//! Leases over time: stale leases, crashed holders, renewal, ttl expiry, manual extends,
//! lost leases, fencing tokens and dropped leases.

use std::time::Duration;

use dlock_core::{ErrorKind, Expiry, LockOptions, LostReason};
use tokio::time::{Instant, sleep, timeout};

use super::{SLACK, must_be_held, must_take, opts, waiting};
use crate::Ctx;

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
    killed_holder(cx, key, &opts(cx)).await
}

/// A holder process that took `key` with `held` and was then killed (SIGKILL), and when.
pub(super) async fn killed_holder(
    cx: &Ctx,
    key: &str,
    held: &LockOptions,
) -> (Box<dyn crate::Holder>, Instant) {
    let mut holder = cx
        .harness()
        .spawn_holder(cx.test(), key, held)
        .await
        .unwrap_or_else(|e| panic!("{}", cx.unreachable_message(&e)));
    let b = cx.client().await;
    // A reader's key is busy for a writer; any other hold's for one like it.
    let probe = match held.mode {
        dlock_core::Mode::Shared => opts(cx),
        _ => *held,
    };
    // A key of several lines is a set: each of its keys is held.
    for key in key.lines() {
        must_be_held(&*b, key, &probe, "the holder process holds it").await;
    }
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
