//! Several keys taken as one hold ([`LockExt::acquire_all`]): all or none, no deadlock
//! between overlapping sets, nothing left behind when a key cannot be taken.

use std::time::Duration;

use dlock_core::{DistributedLock, ErrorKind, LockExt as _, LockOptions, LostReason, Wait};
use futures::future::join_all;
use tokio::time::{Instant, sleep, timeout};

use super::{SLACK, join_panics, killed_holder, must_take, opts, violations_report, waiting};
use crate::{Ctx, History, Hold};

/// The keys the set scenarios draw from.
const POOL: usize = 4;

/// Clients taking sets at once, and the sets each takes in turn.
const CLIENTS: usize = 4;
const ROUNDS: usize = 6;

/// The longest a whole contention run may take: a deadlock shows as a run that does not end.
const NO_DEADLOCK_WITHIN: Duration = Duration::from_secs(90);

/// Keys `picks` of the pool, in the order given (not sorted: the library must order them).
fn set_of(cx: &Ctx, picks: &[usize]) -> Vec<String> {
    picks.iter().map(|i| cx.key(&format!("set/{i}"))).collect()
}

/// Client `c`'s set in round `round`: two or three pool keys, in an order that differs
/// between clients, so that overlapping sets are asked for in opposite orders.
fn picks(c: usize, round: usize) -> Vec<usize> {
    let first = (c + round) % POOL;
    let len = 2 + (c + round) % 2;
    let mut picks: Vec<usize> = (0..len).map(|i| (first + i * (1 + c % 2)) % POOL).collect();
    picks.dedup();
    if c % 2 == 1 {
        picks.reverse();
    }
    picks
}

/// Overlapping key sets, asked for in opposite orders by many clients at once, never
/// deadlock (every set is taken within a generous bound) and never overlap on any key (the
/// history of each key has no two holders at once, and its tokens increase as declared).
pub async fn key_sets_never_deadlock_or_overlap(cx: Ctx) {
    let history = History::new();
    let mut tasks = Vec::new();
    let mut ordered = false;
    for c in 0..CLIENTS {
        let client = cx.client().await;
        ordered = client.capabilities().fencing.is_ordered();
        let (history, opts) = (history.clone(), waiting(&cx, NO_DEADLOCK_WITHIN));
        let sets: Vec<Vec<String>> = (0..ROUNDS).map(|r| set_of(&cx, &picks(c, r))).collect();
        tasks.push(tokio::spawn(async move {
            for keys in sets {
                let set = client
                    .acquire_all(&keys, &opts)
                    .await
                    .unwrap_or_else(|e| panic!("client {c} taking {keys:?}: {e}"));
                let start = Instant::now();
                // A fixed pause, not a poll: it gives holds time to overlap.
                sleep(Duration::from_millis(20)).await;
                let end = Instant::now();
                assert!(!set.is_lost(), "a set lost a key in calm weather");
                for lease in set.leases() {
                    history.record(Hold {
                        client: c,
                        key: lease.key().to_owned(),
                        token: lease.fencing_token(),
                        mode: lease.mode(),
                        start,
                        end,
                        lost_at: None,
                    });
                }
                set.release().await.expect("release a set");
            }
        }));
    }
    let all = timeout(NO_DEADLOCK_WITHIN + SLACK, join_all(tasks))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{CLIENTS} clients taking overlapping key sets did not finish within \
                 {NO_DEADLOCK_WITHIN:?}: a deadlock"
            )
        });
    join_panics(all);
    let expected: usize = (0..CLIENTS)
        .flat_map(|c| (0..ROUNDS).map(move |r| set_of_len(c, r)))
        .sum();
    assert_eq!(
        history.holds().len(),
        expected,
        "every key of every set held"
    );
    let violations = history.check(ordered);
    assert!(violations.is_empty(), "{}", violations_report(&violations));
    cx.finish().await;
}

/// Each of `keys` is free: `client` takes it at once (and gives it back).
async fn free(
    client: &dyn DistributedLock,
    keys: impl IntoIterator<Item = &String>,
    opts: &LockOptions,
) {
    for key in keys {
        must_take(client, key, opts)
            .await
            .release()
            .await
            .expect("release");
    }
}

fn set_of_len(c: usize, round: usize) -> usize {
    let mut picks = picks(c, round);
    picks.sort_unstable();
    picks.dedup();
    picks.len()
}

/// A set with one busy key: `acquire_all` times out near its deadline naming that key,
/// `try_acquire_all` answers `None` at once, and neither leaves any other key of the set
/// held: another client takes them at once.
pub async fn key_set_with_a_busy_key_leaves_the_others_free(cx: Ctx) {
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    // The busy key sorts between the free ones, so one free key is taken before it.
    let keys = set_of(&cx, &[2, 0, 1]);
    let busy = must_take(&*a, &keys[2], &opts(&cx)).await;
    let wait = Duration::from_millis(500);
    let started = Instant::now();
    let err = b
        .acquire_all(&keys, &waiting(&cx, wait))
        .await
        .expect_err("a set with a busy key times out");
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        matches!(&err, dlock_core::LockError::Timeout { key, .. } if *key == keys[2]),
        "the timeout names the busy key {:?}: {err}",
        keys[2]
    );
    assert!(
        took >= wait && took <= wait + SLACK,
        "timed out after {took:?} (wait {wait:?})"
    );
    free(&*c, [&keys[0], &keys[1]], &opts(&cx)).await;
    let none = b
        .try_acquire_all(&keys, &opts(&cx))
        .await
        .expect("try_acquire_all");
    assert!(none.is_none(), "try_acquire_all took a set with a busy key");
    free(&*c, [&keys[0], &keys[1]], &opts(&cx)).await;
    busy.release().await.expect("release");
    let set = b
        .try_acquire_all(&keys, &opts(&cx))
        .await
        .expect("try_acquire_all")
        .expect("every key is free now");
    assert_eq!(set.len(), 3);
    set.release().await.expect("release");
    cx.finish().await;
}

/// A holder process that took a set and was killed (SIGKILL) frees every key of the set
/// within the backend's crash bound.
pub async fn crashed_key_set_holder_frees_every_key(cx: Ctx) {
    let keys = set_of(&cx, &[1, 0, 2]);
    let b = cx.client().await;
    let bound = b.capabilities().crash_release_bound(cx.harness().ttl()) + SLACK;
    let (_holder, killed) = killed_holder(&cx, &keys.join("\n"), &opts(&cx)).await;
    let set = b
        .acquire_all(&keys, &waiting(&cx, bound + Duration::from_secs(10)))
        .await
        .unwrap_or_else(|e| panic!("the crashed holder's keys free: {e}"));
    let took = killed.elapsed();
    assert!(
        took <= bound,
        "the crashed holder's set freed after {took:?} (bound {bound:?})"
    );
    set.release().await.expect("release");
    cx.finish().await;
}

/// Dropping an `acquire_all` future while it waits for a busy key gives back the keys it
/// had taken (in the background, which `settle` waits for) and delays nobody: once the busy
/// key is released, another client takes the whole set at once.
pub async fn cancelled_key_set_leaves_nothing(cx: Ctx) {
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let keys = set_of(&cx, &[0, 1, 2]);
    let busy = must_take(&*a, &keys[1], &opts(&cx)).await;
    let gave_up = timeout(
        Duration::from_millis(500),
        b.acquire_all(&keys, &opts(&cx).wait(Wait::Forever)),
    )
    .await;
    assert!(gave_up.is_err(), "the set should still have been waiting");
    assert!(
        dlock_core::settle(Duration::from_secs(10)).await,
        "the cancelled set's keys were not given back within 10 s"
    );
    free(&*c, [&keys[0]], &opts(&cx)).await;
    busy.release().await.expect("release");
    let set = c
        .acquire_all(&keys, &waiting(&cx, cx.harness().handoff_bound() + SLACK))
        .await
        .expect("nobody who gave up holds or blocks the set");
    set.release().await.expect("release");
    cx.finish().await;
}

/// A bad key anywhere in a set, or an empty set, is refused before any key of the set is
/// taken: the good keys stay free.
pub async fn bad_key_in_a_set_is_refused_before_any_key_is_taken(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let good = cx.key("set/good");
    let too_long = "k".repeat(a.capabilities().max_key_len + 1);
    for bad in ["", "nul\0key", too_long.as_str()] {
        // The good key sorts first, so a key-by-key taker would take it before the bad one.
        let keys = [bad, good.as_str()];
        let err = a
            .acquire_all(&keys, &opts(&cx))
            .await
            .expect_err("a set with a bad key");
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
        let err = a
            .try_acquire_all(&keys, &opts(&cx))
            .await
            .expect_err("a set with a bad key");
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
        free(&*b, [&good], &opts(&cx)).await;
    }
    let none: [&str; 0] = [];
    let err = a
        .acquire_all(&none, &opts(&cx))
        .await
        .expect_err("an empty set");
    assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
    cx.finish().await;
}

/// A set's `lost()` fires when any one of its keys is lost (here, broken as an operator
/// would), naming a lost key; releasing the set then reports the loss and frees the rest.
pub async fn key_set_lost_fires_when_any_key_is_lost(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let keys = set_of(&cx, &[0, 1, 2]);
    let set = a.acquire_all(&keys, &opts(&cx)).await.expect("a free set");
    cx.harness()
        .break_lease(&keys[1])
        .await
        .expect("break the lease");
    let bound = cx.harness().ttl() + SLACK;
    let (key, reason) = timeout(bound, set.lost())
        .await
        .unwrap_or_else(|_| panic!("the set's lost() did not fire within {bound:?}"));
    // Where the broken key's connection carries the set's other keys too (one holder
    // connection, one session), they go with it: then any of them may be named first.
    assert!(
        keys.iter().any(|k| k == key),
        "lost() names a key of the set: {key:?}"
    );
    let broken = set.get(&keys[1]).expect("in the set");
    timeout(bound, broken.lost())
        .await
        .unwrap_or_else(|_| panic!("the broken key's lost() did not fire within {bound:?}"));
    assert!(
        matches!(reason, LostReason::NotHeld | LostReason::SessionEnded(_)),
        "{reason}"
    );
    assert!(set.is_lost());
    let err = set.release().await.expect_err("a set with a lost key");
    assert!(
        matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost),
        "{err}"
    );
    free(&*b, [&keys[0], &keys[2]], &opts(&cx)).await;
    cx.finish().await;
}
