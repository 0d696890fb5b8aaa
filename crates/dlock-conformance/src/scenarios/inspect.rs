//! Looking without touching: who holds a key and who waits ([`DistributedLock::inspect`]),
//! the held keys under a prefix ([`DistributedLock::list`]), and the figures every client
//! records ([`dlock_core::telemetry`]).

use std::sync::Arc;
use std::time::Duration;

use dlock_core::telemetry::{
    ACQUIRE_SECONDS, CLEANUPS_PENDING, HANDOFFS_TOTAL, HOLD_SECONDS, LEASES_HELD,
    LEASES_LOST_TOTAL, RENEWALS_TOTAL,
};
use dlock_core::{DistributedLock, ErrorKind, KeyStatus, Lease, LockOptions, Mode, WaiterView};
use tokio::time::{Instant, sleep, timeout};

use super::{SLACK, must_take, opts, waiting};
use crate::Ctx;
use crate::figures::Figures;

/// How long a queued acquire may take to show on the server.
const SHOWS_WITHIN: Duration = Duration::from_secs(10);

async fn inspect(client: &dyn DistributedLock, key: &str) -> KeyStatus {
    client
        .inspect(key)
        .await
        .unwrap_or_else(|e| panic!("inspect({key}): {e}"))
}

/// Inspect `key` until `done` says the status is what is awaited, at most
/// [`SHOWS_WITHIN`]; the last status either way.
pub(super) async fn inspect_until(
    client: &dyn DistributedLock,
    key: &str,
    done: impl Fn(&KeyStatus) -> bool,
) -> KeyStatus {
    let until = Instant::now() + SHOWS_WITHIN;
    loop {
        let status = inspect(client, key).await;
        if done(&status) || Instant::now() >= until {
            return status;
        }
        // The poll's interval.
        sleep(Duration::from_millis(50)).await;
    }
}

pub(super) fn waiting_count(status: &KeyStatus) -> usize {
    status.waiters.as_ref().map_or(0, Vec::len)
}

/// `status` shows exactly `lease` as its holder, with what the backend declares.
fn shows_holder(status: &KeyStatus, lease: &Lease, ttl: Duration, who: bool) {
    assert_eq!(status.holders.len(), 1, "one holder: {status:?}");
    let holder = &status.holders[0];
    assert_eq!(holder.mode, lease.mode(), "{status:?}");
    if let Some(token) = holder.fencing_token {
        assert_eq!(
            token,
            lease.fencing_token(),
            "the holder's token: {status:?}"
        );
    }
    if let Some(left) = holder.ttl_left {
        assert!(
            left <= ttl + SLACK,
            "ttl left {left:?} over the ttl {ttl:?}"
        );
    }
    if who {
        assert!(
            holder.who.as_ref().is_some_and(|w| !w.is_empty()),
            "the backend declares holders named (`who`): {status:?}"
        );
    }
}

/// The holder and the waiters queued behind it show as they are, as the backend declares
/// ([`Capabilities::inspect`](dlock_core::Capabilities::inspect)), and looking changes
/// nothing: the hand-offs that follow go as if nobody had looked.
pub async fn inspect_shows_the_holder_and_the_queue(cx: Ctx) {
    let (a, b, c, d) = (
        cx.client().await,
        cx.client().await,
        cx.client().await,
        cx.client().await,
    );
    let caps = d.capabilities();
    let view = caps.inspect.waiters;
    let (key, ttl) = (cx.key("k"), cx.harness().ttl());
    let free = inspect(&*d, &key).await;
    assert!(free.holders.is_empty(), "a free key: {free:?}");
    assert_eq!(
        free.waiters.is_some(),
        view != WaiterView::Hidden,
        "waiters shown as declared ({view:?}): {free:?}"
    );
    assert_eq!(waiting_count(&free), 0, "{free:?}");

    let lease = must_take(&*a, &key, &opts(&cx)).await;
    shows_holder(&inspect(&*d, &key).await, &lease, ttl, caps.inspect.who);

    // A writer, then a reader where the backend takes them, queue behind the holder.
    let second = match caps.shared {
        true => waiting(&cx, Duration::from_secs(60)).shared(),
        false => waiting(&cx, Duration::from_secs(60)),
    };
    let take = |client: Arc<dyn DistributedLock>, opts: LockOptions| {
        let key = key.clone();
        tokio::spawn(async move { client.acquire(&key, &opts).await.expect("a queued acquire") })
    };
    let first_waiter = take(b, waiting(&cx, Duration::from_secs(60)));
    let queued = inspect_until(&*d, &key, |s| waiting_count(s) >= 1).await;
    if view == WaiterView::Hidden {
        // Nothing to wait for: a fixed pause orders the two waiters.
        sleep(Duration::from_millis(300)).await;
    } else {
        assert_eq!(
            waiting_count(&queued),
            1,
            "the first waiter shows: {queued:?}"
        );
    }
    let second_waiter = take(c, second);
    let status = inspect_until(&*d, &key, |s| waiting_count(s) >= 2).await;
    shows_holder(&status, &lease, ttl, caps.inspect.who);
    if view != WaiterView::Hidden {
        let waiters = status.waiters.as_ref().expect("declared visible");
        assert_eq!(waiters.len(), 2, "both waiters show: {status:?}");
        if view == WaiterView::Queue && caps.shared {
            let modes: Vec<_> = waiters.iter().map(|w| w.mode).collect();
            assert!(
                matches!(
                    modes[..],
                    [None | Some(Mode::Exclusive), None | Some(Mode::Shared)]
                ),
                "the writer first, then the reader: {status:?}"
            );
        }
    }

    // The hand-offs go on as if nobody had looked.
    lease.release().await.expect("release");
    let (mut first_waiter, mut second_waiter) = (first_waiter, second_waiter);
    let (first, other) = tokio::select! {
        first = &mut first_waiter => (first, second_waiter),
        first = &mut second_waiter => (first, first_waiter),
    };
    let first = first.expect("the waiter's task");
    let status = inspect(&*d, &key).await;
    shows_holder(&status, &first, ttl, caps.inspect.who);
    if view != WaiterView::Hidden {
        assert_eq!(waiting_count(&status), 1, "one waiter left: {status:?}");
    }
    first.release().await.expect("release");
    let last = timeout(cx.harness().handoff_bound() + SLACK, other)
        .await
        .expect("the last waiter gets the key")
        .expect("the waiter's task");
    last.release().await.expect("release");
    let free = inspect_until(&*d, &key, |s| s.holders.is_empty()).await;
    assert!(free.holders.is_empty(), "free again: {free:?}");
    assert_eq!(waiting_count(&free), 0, "{free:?}");
    cx.finish().await;
}

/// Every shared hold and every permit of a key shows as a holder of its own.
pub async fn inspect_shows_every_shared_holder_and_permit(cx: Ctx) {
    let (a, b, d) = (cx.client().await, cx.client().await, cx.client().await);
    let caps = d.capabilities();
    let mut asked = Vec::new();
    if caps.shared {
        asked.push(("read", opts(&cx).shared()));
    }
    if caps.permits {
        asked.push(("permits", opts(&cx).permits(3)));
    }
    for (name, held) in asked {
        let key = cx.key(name);
        let leases = [
            must_take(&*a, &key, &held).await,
            must_take(&*b, &key, &held).await,
        ];
        let status = inspect(&*d, &key).await;
        assert_eq!(status.holders.len(), 2, "{name}: both holders: {status:?}");
        for holder in &status.holders {
            let same_kind = match held.mode {
                Mode::Permits(_) => matches!(holder.mode, Mode::Permits(_)),
                mode => holder.mode == mode,
            };
            assert!(same_kind, "{name}: each holder's mode: {status:?}");
        }
        let mut tokens: Vec<_> = status
            .holders
            .iter()
            .filter_map(|h| h.fencing_token)
            .collect();
        if tokens.len() == 2 {
            let mut expected: Vec<_> = leases.iter().map(Lease::fencing_token).collect();
            tokens.sort_unstable();
            expected.sort_unstable();
            assert_eq!(tokens, expected, "{name}: the holders' tokens: {status:?}");
        }
        for lease in leases {
            lease.release().await.expect("release");
        }
        let free = inspect_until(&*d, &key, |s| s.holders.is_empty()).await;
        assert!(free.holders.is_empty(), "{name}: free again: {free:?}");
    }
    cx.finish().await;
}

/// `list` names exactly the held keys under a prefix, where the backend can enumerate
/// them, and is refused with `Unsupported` where it cannot.
pub async fn list_shows_held_keys_under_a_prefix(cx: Ctx) {
    let (a, d) = (cx.client().await, cx.client().await);
    let prefix = cx.key("list/");
    if !d.capabilities().inspect.list {
        let err = d.list(&prefix).await.expect_err("list is not declared");
        assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
        cx.finish().await;
        return;
    }
    let (one, two, other) = (cx.key("list/a"), cx.key("list/b/c"), cx.key("listed"));
    let mut leases = Vec::new();
    for key in [&two, &other, &one] {
        leases.push(must_take(&*a, key, &opts(&cx)).await);
    }
    let listed = d.list(&prefix).await.expect("list");
    assert_eq!(
        listed,
        [one.clone(), two.clone()],
        "the held keys under {prefix:?}"
    );
    let everything = d.list(cx.prefix()).await.expect("list");
    assert_eq!(
        everything,
        [one, two, other],
        "the held keys under the scenario's prefix"
    );
    for lease in leases {
        lease.release().await.expect("release");
    }
    let until = Instant::now() + SHOWS_WITHIN;
    loop {
        let listed = d.list(&prefix).await.expect("list");
        if listed.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "released keys still listed: {listed:?}"
        );
        sleep(Duration::from_millis(50)).await;
    }
    cx.finish().await;
}

/// The figures of [`dlock_core::telemetry`] are recorded for this backend: each acquire's
/// outcome (acquired, busy, timeout), a hand-off, a renewal, a loss, the leases held, the
/// holds' durations and the background clean-ups.
pub async fn figures_are_recorded(cx: Ctx) {
    let figures = Figures::installed();
    let (a, b) = (cx.client().await, cx.client().await);
    let backend = a.backend_name();
    let key = cx.key("figures");
    let count = |name: &str, key: &str, extra: &[(&str, &str)]| {
        let mut labels = vec![("backend", backend), ("key", key)];
        labels.extend_from_slice(extra);
        figures.sum(
            name,
            &labels,
            name == LEASES_HELD || name == CLEANUPS_PENDING,
        )
    };
    let outcome = |o| [("primitive", "exclusive"), ("outcome", o)];

    let lease = must_take(&*a, &key, &opts(&cx)).await;
    assert_eq!(
        count(LEASES_HELD, &key, &[]),
        1.0,
        "{LEASES_HELD} while held (is another metrics recorder installed?)"
    );
    assert!(
        b.try_acquire(&key, &opts(&cx))
            .await
            .expect("try")
            .is_none()
    );
    let err = b
        .acquire(&key, &waiting(&cx, Duration::from_millis(200)))
        .await
        .expect_err("busy");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    lease.extend(cx.harness().ttl()).await.expect("extend");
    let waiter = {
        let (b, key, opts) = (
            b.clone(),
            key.clone(),
            waiting(&cx, Duration::from_secs(30)),
        );
        tokio::spawn(async move { b.acquire(&key, &opts).await.expect("hand-off") })
    };
    // The waiter must be waiting when the key is released: seen on the server where the
    // backend shows its waiters, else given a fixed pause.
    if a.capabilities().inspect.waiters == WaiterView::Hidden {
        sleep(Duration::from_millis(300)).await;
    } else {
        let queued = inspect_until(&*a, &key, |s| waiting_count(s) >= 1).await;
        assert!(waiting_count(&queued) >= 1, "the waiter shows: {queued:?}");
    }
    lease.release().await.expect("release");
    let second = waiter.await.expect("the waiter's task");
    cx.harness()
        .break_lease(&key)
        .await
        .expect("break the lease");
    let reason = timeout(cx.harness().ttl() + SLACK, second.lost())
        .await
        .expect("lost() fires");
    drop(second);
    assert!(
        dlock_core::settle(Duration::from_secs(10)).await,
        "clean-ups settle"
    );

    for (name, extra, at_least) in [
        (ACQUIRE_SECONDS, outcome("acquired"), 2.0),
        (ACQUIRE_SECONDS, outcome("busy"), 1.0),
        (ACQUIRE_SECONDS, outcome("timeout"), 1.0),
        (RENEWALS_TOTAL, outcome("ok"), 1.0),
    ] {
        let seen = count(name, &key, &extra);
        assert!(seen >= at_least, "{name} {extra:?}: {seen} < {at_least}");
    }
    let handoffs = count(HANDOFFS_TOTAL, &key, &[]);
    assert!(handoffs >= 1.0, "{HANDOFFS_TOTAL}: {handoffs}");
    let holds = count(HOLD_SECONDS, &key, &[]);
    assert_eq!(holds, 2.0, "{HOLD_SECONDS}: one sample per lease");
    let lost = count(LEASES_LOST_TOTAL, &key, &[]);
    assert_eq!(lost, 1.0, "{LEASES_LOST_TOTAL} ({reason})");
    assert_eq!(count(LEASES_HELD, &key, &[]), 0.0, "{LEASES_HELD} after");
    assert!(
        figures.seen(CLEANUPS_PENDING),
        "{CLEANUPS_PENDING} is recorded"
    );
    cx.finish().await;
}
