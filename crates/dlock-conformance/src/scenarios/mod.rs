//! One scenario per promise of the contract (DESIGN.md, "The contract"). Each takes a
//! [`Ctx`], uses keys under the context's fresh prefix, and ends with [`Ctx::finish`], which
//! checks that nothing was left on the server.
//!
//! The scenarios are grouped by concern: one holder at a time (`exclusion`), waiting for a
//! key (`waiters`), leases over time (`leases`), one client holding many keys at once
//! (`many`), shared holds beside exclusive ones (`shared`), counted holds of a semaphore
//! (`permits`), several keys taken as one (`sets`), looking at keys and figures without
//! touching them (`inspect`), leader elections (`election`), reentrant holds of an owner (`reentry`), and what must be refused or
//! reported (`errors`). All of them are re-exported
//! here, at `scenarios::<name>`.

mod election;
mod errors;
mod exclusion;
mod inspect;
mod leases;
mod many;
mod permits;
mod reentry;
mod sets;
mod shared;
mod waiters;

pub use election::*;
pub use errors::*;
pub use exclusion::*;
pub use inspect::*;
pub use leases::*;
pub use many::*;
pub use permits::*;
pub use reentry::*;
pub use sets::*;
pub use shared::*;
pub use waiters::*;

use std::time::Duration;

use dlock_core::{DistributedLock, Lease, LockOptions, Mode, Wait};
use futures::future::join_all;
use tokio::time::{Instant, sleep};

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

/// `clients` fresh clients take `key` `rounds` times each, in the mode `mode(client, round)`
/// and otherwise with `opts`, each hold lasting `pause` (a fixed pause, not a poll: it gives
/// holds time to overlap). Every hold is recorded; none may be lost in calm weather.
/// Returns the history and whether the backend declares ordered tokens.
async fn contend(
    cx: &Ctx,
    key: &str,
    (clients, rounds): (usize, usize),
    opts: LockOptions,
    pause: Duration,
    mode: fn(usize, usize) -> Mode,
) -> (History, bool) {
    let history = History::new();
    let mut tasks = Vec::new();
    let mut ordered = false;
    for c in 0..clients {
        let client = cx.client().await;
        ordered = client.capabilities().fencing.is_ordered();
        let (key, history) = (key.to_owned(), history.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..rounds {
                let lease = client
                    .acquire(&key, &opts.mode(mode(c, round)))
                    .await
                    .expect("acquire under contention");
                let start = Instant::now();
                sleep(pause).await;
                history.record(Hold {
                    client: c,
                    key: key.clone(),
                    token: lease.fencing_token(),
                    mode: lease.mode(),
                    start,
                    end: Instant::now(),
                    lost_at: None,
                });
                assert!(!lease.is_lost(), "lease lost in calm weather");
                lease.release().await.expect("release");
            }
        }));
    }
    join_panics(join_all(tasks).await);
    assert_eq!(history.holds().len(), clients * rounds);
    (history, ordered)
}

/// On a backend that does not declare `asked`'s mode (`declared` is false): check that both
/// `try_acquire` and `acquire` refuse it with `Unsupported`, that the key was not touched,
/// and finish; `None` then. Otherwise hand the context back.
async fn declared_or_refused(cx: Ctx, declared: bool, asked: LockOptions) -> Option<Ctx> {
    if declared {
        return Some(cx);
    }
    let client = cx.client().await;
    let key = cx.key("refused");
    for answer in [
        client.try_acquire(&key, &asked).await.map(drop),
        client.acquire(&key, &asked.wait(Wait::No)).await.map(drop),
    ] {
        let err = answer.expect_err("a mode the backend does not declare");
        assert_eq!(err.kind(), dlock_core::ErrorKind::Unsupported, "{err}");
    }
    // The key was not touched: an exclusive hold takes it at once.
    must_take(&*client, &key, &opts(&cx))
        .await
        .release()
        .await
        .expect("release");
    cx.finish().await;
    None
}

/// A client of an unreachable server, or `None` when none can even be made.
async fn unreachable_client(cx: &Ctx) -> Option<std::sync::Arc<dyn DistributedLock>> {
    match cx.harness().unreachable_client().await {
        Ok(client) => Some(client),
        Err(e) if e.kind() == dlock_core::ErrorKind::Unavailable => None,
        Err(e) => panic!("a client of an unreachable server: {e}"),
    }
}

/// A request in `asked`'s mode to an unreachable server reaches the network only where
/// the mode is `declared`: it answers `Unavailable` then, `Unsupported` otherwise, within
/// the client's timeouts.
async fn dead_server_answers(
    dead: &dyn DistributedLock,
    key: &str,
    asked: &LockOptions,
    declared: bool,
) {
    let answer = tokio::time::timeout(Duration::from_secs(30), dead.try_acquire(key, asked))
        .await
        .expect("an unreachable server answers within its timeouts");
    let err = answer.expect_err("nothing answers");
    let expected = if declared {
        dlock_core::ErrorKind::Unavailable
    } else {
        dlock_core::ErrorKind::Unsupported
    };
    assert_eq!(
        err.kind(),
        expected,
        "{} declared = {declared}: {err}",
        asked.mode
    );
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
