//! Reentrant holds ([`Owner`](dlock_core::Owner)): an owner that holds a key takes it again
//! at once with the same fencing token, from any client or process; the key stays held
//! until the owner's last lease is released; other owners wait and then get a higher
//! token; a crashed owner frees the key whatever its count; a lease of an earlier hold
//! cannot touch a later one. On a backend that declares no reentrant holds
//! ([`Reentry::Unsupported`]), each scenario checks the refusal instead.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{DistributedLock, ErrorKind, Lease, LockOptions, Reentry, Wait};
use futures::future::join_all;
use tokio::time::{Instant, sleep, timeout};

use super::{
    SLACK, declared_or_refused, join_panics, must_be_held, must_take, opts, unreachable_client,
    waiting,
};
use crate::{Ctx, OWNER_ENTRIES};

/// The options of owner `id`'s holds.
fn owned(cx: &Ctx, id: &str) -> LockOptions {
    opts(cx).owner(id)
}

/// On a backend without reentrant holds: an acquire with an owner is refused with
/// `Unsupported` and the key untouched; `None` then.
async fn reentrant_or_refused(cx: Ctx) -> Option<(Ctx, Reentry)> {
    let reentry = cx.client().await.capabilities().reentrant;
    let cx = declared_or_refused(cx, reentry.is_supported(), owned_default()).await?;
    Some((cx, reentry))
}

fn owned_default() -> LockOptions {
    LockOptions::new().owner("job-1")
}

/// The owner's entry into a key it holds: granted at once, with `token`.
async fn reenter(client: &dyn DistributedLock, key: &str, opts: &LockOptions, token: u64) -> Lease {
    let lease = timeout(SLACK, client.acquire(key, &opts.wait(Wait::No)))
        .await
        .expect("a re-entry answers at once")
        .unwrap_or_else(|e| panic!("the owner re-enters {key}: {e}"));
    assert_eq!(
        lease.fencing_token(),
        token,
        "a re-entry of one continuous hold keeps its fencing token"
    );
    lease
}

/// `client` takes `key` within a hand-off (it was just freed) and gives it back: the
/// token it got.
async fn takes_after_release(cx: &Ctx, client: &dyn DistributedLock, key: &str, why: &str) -> u64 {
    let lease = client
        .acquire(key, &waiting(cx, SLACK + cx.harness().handoff_bound()))
        .await
        .unwrap_or_else(|e| panic!("{why}: {e}"));
    let token = lease.fencing_token();
    lease.release().await.expect("release");
    token
}

/// Wait (up to `bound`) until `lease` is lost.
async fn lost_within(lease: &Lease, bound: Duration, what: &str) {
    timeout(bound, lease.lost())
        .await
        .unwrap_or_else(|_| panic!("{what}: lost() did not fire within {bound:?}"));
}

/// The capabilities scenario: a backend either takes reentrant holds or refuses them
/// before any I/O.
pub async fn reentry_is_declared(cx: Ctx) {
    let Some((cx, _)) = reentrant_or_refused(cx).await else {
        return;
    };
    let client = cx.client().await;
    client
        .validate(&cx.key("k"), &owned(&cx, "job-1"))
        .expect("a declared owner hold validates");
    cx.finish().await;
}

/// An owner that holds a key takes it again at once, by `acquire` and `try_acquire`, with
/// the same fencing token.
pub async fn reentry_succeeds_at_once_with_the_same_token(cx: Ctx) {
    let Some((cx, _)) = reentrant_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let client = cx.client().await;
    let opts = owned(&cx, "job-1");
    let first = must_take(&*client, &key, &opts).await;
    let token = first.fencing_token();
    let second = reenter(&*client, &key, &opts, token).await;
    let third = client
        .try_acquire(&key, &opts)
        .await
        .expect("try_acquire")
        .expect("try_acquire re-enters the owner's hold");
    assert_eq!(third.fencing_token(), token);
    // Waiting forever is no different: the owner holds the key.
    let fourth = timeout(SLACK, client.acquire(&key, &opts.wait(Wait::Forever)))
        .await
        .expect("a re-entry with Wait::Forever answers at once")
        .expect("re-entry");
    assert_eq!(fourth.fencing_token(), token);
    for lease in [first, second, third, fourth] {
        lease.release().await.expect("release");
    }
    cx.finish().await;
}

/// The key stays held while any lease of the owner counts, and frees with the last
/// release (and with a dropped last lease).
pub async fn reentry_keeps_the_key_until_the_last_release(cx: Ctx) {
    let Some((cx, _)) = reentrant_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let opts = owned(&cx, "job-1");
    let mut entries = crate::take_entries(&*a, &key, &opts)
        .await
        .expect("the owner enters three times");
    let token = entries[0].fencing_token();
    assert!(entries.iter().all(|l| l.fencing_token() == token));
    while entries.len() > 1 {
        // The first lease goes first: the hold is not the first lease's.
        entries.remove(0).release().await.expect("release");
        must_be_held(&*b, &key, &super::opts(&cx), "the owner still counts").await;
        must_be_held(&*b, &key, &owned(&cx, "job-2"), "another owner").await;
    }
    drop(entries);
    let next = takes_after_release(
        &cx,
        &*b,
        &key,
        "the key frees with the owner's last lease (dropped)",
    )
    .await;
    if b.capabilities().fencing.is_ordered() {
        assert!(next > token, "a later holder's token is higher");
    }
    cx.finish().await;
}

/// Another owner (in another client, and in the owner's own client) and a plain holder
/// wait while the owner holds the key, and get it, with higher tokens, after its last
/// release.
pub async fn another_owner_waits_then_gets_a_higher_token(cx: Ctx) {
    let Some((cx, _)) = reentrant_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let first = must_take(&*a, &key, &owned(&cx, "job-1")).await;
    let token = first.fencing_token();
    let second = reenter(&*a, &key, &owned(&cx, "job-1"), token).await;
    let wait = Duration::from_secs(30);
    let waiters: Vec<_> = [
        (a.clone(), owned(&cx, "job-2")),
        (b.clone(), owned(&cx, "job-3")),
        (b.clone(), opts(&cx)),
    ]
    .into_iter()
    .map(|(client, opts)| {
        let key = key.clone();
        tokio::spawn(async move {
            let lease = client
                .acquire(&key, &opts.wait(Wait::For(wait)))
                .await
                .expect("a waiter gets the key after the owner's last release");
            let got = (lease.fencing_token(), Instant::now());
            sleep(Duration::from_millis(50)).await;
            lease.release().await.expect("release");
            got
        })
    })
    .collect();
    // The waiters are waiting: seen on the server where the backend shows its waiters
    // (client b's first one; the others queue in their clients), else given a pause.
    if a.capabilities().inspect.waiters == dlock_core::WaiterView::Hidden {
        sleep(Duration::from_millis(300)).await;
    } else {
        let queued =
            super::inspect::inspect_until(&*a, &key, |s| super::inspect::waiting_count(s) >= 1)
                .await;
        assert!(
            super::inspect::waiting_count(&queued) >= 1,
            "a waiter shows: {queued:?}"
        );
    }
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "nobody else gets a key its owner holds"
    );
    first.release().await.expect("release");
    let probe = cx.client().await;
    must_be_held(
        &*probe,
        &key,
        &super::opts(&cx),
        "one of the owner's leases counts",
    )
    .await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "nobody else gets the key while one of the owner's leases counts"
    );
    let released = Instant::now();
    second.release().await.expect("release");
    let got = join_panics(join_all(waiters).await);
    let bound = cx.harness().handoff_bound() + SLACK;
    let earliest = got.iter().map(|(_, at)| *at).min().expect("three waiters");
    assert!(
        earliest.duration_since(released) <= bound,
        "the first waiter got the key {:?} after the owner's last release (bound {bound:?})",
        earliest.duration_since(released)
    );
    if a.capabilities().fencing.is_ordered() {
        assert!(
            got.iter().all(|(t, _)| *t > token),
            "tokens after the owner's {token}: {got:?}"
        );
    }
    cx.finish().await;
}

/// A second client of the same owner re-enters at once with the same token, and so do
/// tasks of both clients at once; the hold outlasts the first client's leases and frees
/// after the last one's.
pub async fn reentry_from_a_second_client(cx: Ctx) {
    const TASKS: usize = 6;
    let Some((cx, _)) = reentrant_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let opts = owned(&cx, "job-1");
    let first = must_take(&*a, &key, &opts).await;
    let token = first.fencing_token();
    let from_b = reenter(&*b, &key, &opts, token).await;
    // Tasks of both clients enter together.
    let tasks: Vec<_> = (0..TASKS)
        .map(|i| {
            let client = if i % 2 == 0 { a.clone() } else { b.clone() };
            let key = key.clone();
            tokio::spawn(async move {
                let lease = client
                    .acquire(&key, &opts.wait(Wait::For(Duration::from_secs(20))))
                    .await
                    .expect("a task of the owner re-enters");
                let token = lease.fencing_token();
                lease.release().await.expect("release");
                token
            })
        })
        .collect();
    let tokens = join_panics(join_all(tasks).await);
    assert!(
        tokens.iter().all(|t| *t == token),
        "every entry of the owner has the hold's token {token}: {tokens:?}"
    );
    // The tasks' leases were released: the hold stays while `from_b` counts.
    first.release().await.expect("release");
    must_be_held(
        &*c,
        &key,
        &super::opts(&cx),
        "the second client's lease counts",
    )
    .await;
    assert!(!from_b.is_lost(), "the second client's lease is not lost");
    from_b.release().await.expect("release");
    takes_after_release(&cx, &*c, &key, "the key frees after the owner's last lease").await;
    cx.finish().await;
}

/// A second process of the same owner re-enters at once with the same token. When the
/// first process is killed: where the hold lives on with any lease ([`Reentry::AnyLease`])
/// the second keeps the key (and it frees a ttl after that lease's release, the dead
/// process's entries never coming back); where it lives in the first holder's session
/// ([`Reentry::FirstSession`]) the key frees within the crash bound and the second's lease
/// is lost.
pub async fn reentry_from_a_second_process(cx: Ctx) {
    let Some((cx, reentry)) = reentrant_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, other) = (cx.client().await, cx.client().await);
    let ttl = cx.harness().ttl();
    let opts = owned(&cx, "job-1");
    let mut holder = cx
        .harness()
        .spawn_holder(cx.test(), &key, &opts)
        .await
        .unwrap_or_else(|e| panic!("{}", cx.unreachable_message(&e)));
    let lease = reenter(&*a, &key, &opts, holder.token()).await;
    holder.kill().await;
    let killed = Instant::now();
    let crash_bound = a.capabilities().crash_release_bound(ttl) + SLACK;
    match reentry {
        Reentry::AnyLease => {
            // Held all through the crash bound: this process's lease renews it.
            let mut every = tokio::time::interval(Duration::from_millis(250));
            while killed.elapsed() < crash_bound {
                every.tick().await;
                must_be_held(
                    &*other,
                    &key,
                    &super::opts(&cx),
                    "a live lease of the owner",
                )
                .await;
            }
            assert!(!lease.is_lost(), "the live process's lease is not lost");
            lease.release().await.expect("release");
            let next = other
                .acquire(&key, &waiting(&cx, ttl + SLACK))
                .await
                .expect("the key frees a ttl after the owner's last renewal");
            next.release().await.expect("release");
        }
        Reentry::FirstSession => {
            let next = other
                .acquire(&key, &waiting(&cx, crash_bound + Duration::from_secs(10)))
                .await
                .expect("the key frees with the first holder's session");
            assert!(
                killed.elapsed() <= crash_bound,
                "the key freed {:?} after the crash (bound {crash_bound:?})",
                killed.elapsed()
            );
            lost_within(&lease, ttl + SLACK, "the second process's lease").await;
            next.release().await.expect("release");
            let _ = lease.release().await;
        }
        Reentry::Unsupported => unreachable!("checked above"),
    }
    cx.finish().await;
}

/// A holder process that entered its key several times and is killed frees the key within
/// the crash bound, and the next holder's token is higher.
pub async fn crashed_owner_frees_the_key_whatever_its_count(cx: Ctx) {
    let Some((cx, _)) = reentrant_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let other = cx.client().await;
    let mut holder = cx
        .harness()
        .spawn_holder(cx.test(), &key, &owned(&cx, "job-1"))
        .await
        .unwrap_or_else(|e| panic!("{}", cx.unreachable_message(&e)));
    must_be_held(
        &*other,
        &key,
        &super::opts(&cx),
        "the owner process holds it",
    )
    .await;
    holder.kill().await;
    let killed = Instant::now();
    let bound = other.capabilities().crash_release_bound(cx.harness().ttl()) + SLACK;
    let next = other
        .acquire(&key, &waiting(&cx, bound + Duration::from_secs(10)))
        .await
        .unwrap_or_else(|e| {
            panic!("the key of an owner killed holding it {OWNER_ENTRIES} times frees: {e}")
        });
    assert!(
        killed.elapsed() <= bound,
        "the key freed {:?} after the crash (bound {bound:?})",
        killed.elapsed()
    );
    if other.capabilities().fencing.is_ordered() {
        assert!(next.fencing_token() > holder.token());
    }
    next.release().await.expect("release");
    cx.finish().await;
}

/// A lease of an owner's earlier hold (removed by an operator) cannot release or extend
/// the owner's later hold of the same key: `NotHeld`, and the later hold keeps its count.
pub async fn stale_owner_lease_is_not_held(cx: Ctx) {
    let Some((cx, _)) = reentrant_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let stale = must_take(&*a, &key, &owned(&cx, "job-1")).await;
    cx.harness()
        .break_lease(&key)
        .await
        .expect("break the owner's hold");
    // The same owner takes the key again, from another client: a new hold.
    let later = b
        .acquire(
            &key,
            &owned(&cx, "job-1").wait(Wait::For(SLACK + cx.harness().handoff_bound())),
        )
        .await
        .expect("the owner takes the broken key again");
    let second = reenter(&*c, &key, &owned(&cx, "job-1"), later.fencing_token()).await;
    let err = stale
        .release()
        .await
        .expect_err("the earlier hold's lease is not held");
    assert!(
        matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost),
        "{err}"
    );
    // The later hold still counts both of its leases.
    later.release().await.expect("release");
    must_be_held(
        &*a,
        &key,
        &opts(&cx),
        "the later hold's second lease counts",
    )
    .await;
    assert!(!second.is_lost());
    second.release().await.expect("release");
    takes_after_release(
        &cx,
        &*a,
        &key,
        "the key frees after the later hold's last lease",
    )
    .await;
    cx.finish().await;
}

/// When the owner's hold is lost (an operator removes it), `lost()` fires on every lease
/// of the hold, in every client.
pub async fn lost_fires_on_every_lease_of_the_owner(cx: Ctx) {
    let Some((cx, _)) = reentrant_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let opts = owned(&cx, "job-1");
    let first = must_take(&*a, &key, &opts).await;
    let token = first.fencing_token();
    let leases = [
        reenter(&*a, &key, &opts, token).await,
        reenter(&*b, &key, &opts, token).await,
        first,
    ];
    cx.harness()
        .break_lease(&key)
        .await
        .expect("break the owner's hold");
    let bound = cx.harness().ttl() + SLACK;
    for (i, lease) in leases.iter().enumerate() {
        lost_within(lease, bound, &format!("lease {i} of the owner")).await;
    }
    let next = c
        .acquire(&key, &waiting(&cx, bound))
        .await
        .expect("the broken key frees");
    next.release().await.expect("release");
    for lease in leases {
        let _ = lease.release().await;
    }
    cx.finish().await;
}

/// Bad owner ids, and owners with a shared or permit mode or on a campaign, are refused
/// before any I/O (also by a client of a server that does not answer), and leave the key
/// untouched.
pub async fn bad_owners_are_refused_before_io(cx: Ctx) {
    let key = cx.key("k");
    let client = cx.client().await;
    let caps = client.capabilities();
    let mut clients: Vec<Arc<dyn DistributedLock>> = vec![client.clone()];
    clients.extend(unreachable_client(&cx).await);
    let long = "x".repeat(dlock_core::Owner::MAX_LEN + 1);
    for client in &clients {
        for bad in ["", "job 7", "tab\tid", "é", long.as_str()] {
            let opts = opts(&cx).owner(bad);
            let err = client
                .try_acquire(&key, &opts)
                .await
                .expect_err("bad owner");
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{bad:?}: {err}");
            let err = client.validate(&key, &opts).expect_err("bad owner");
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{bad:?}: {err}");
        }
        for mode in [opts(&cx).shared(), opts(&cx).permits(3)] {
            let asked = mode.owner("job-1");
            let err = client
                .try_acquire(&key, &asked)
                .await
                .expect_err("an owner's shared hold");
            assert_eq!(err.kind(), ErrorKind::Unsupported, "{}: {err}", asked.mode);
        }
        let election = dlock_core::Election::new(client.clone(), &key)
            .options(owned(&cx, "job-1").wait(Wait::No));
        let err = election
            .campaign("v")
            .await
            .expect_err("a campaign with an owner");
        let expected = match (caps.election, caps.reentrant) {
            (dlock_core::Observe::Unsupported, _) | (_, Reentry::Unsupported) => {
                ErrorKind::Unsupported
            }
            _ => ErrorKind::InvalidConfig,
        };
        assert_eq!(err.kind(), expected, "{err}");
    }
    // Nothing was taken: a plain hold gets the key at once.
    must_take(&*client, &key, &opts(&cx))
        .await
        .release()
        .await
        .expect("release");
    cx.finish().await;
}
