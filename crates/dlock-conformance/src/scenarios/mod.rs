//! One scenario per promise of the contract (DESIGN.md, "The contract"). Each takes a
//! [`Ctx`], uses keys under the context's fresh prefix, and ends with [`Ctx::finish`], which
//! checks that nothing was left on the server.
//!
//! The scenarios are grouped by concern: one holder at a time (`exclusion`), waiting for a
//! key (`waiters`), leases over time (`leases`), one client holding many keys at once
//! (`many`), shared holds beside exclusive ones (`shared`), counted holds of a semaphore
//! (`permits`), and what must be refused or
//! reported (`errors`). All of them are re-exported
//! here, at `scenarios::<name>`.

mod errors;
mod exclusion;
mod leases;
mod many;
mod permits;
mod shared;
mod waiters;

pub use errors::*;
pub use exclusion::*;
pub use leases::*;
pub use many::*;
pub use permits::*;
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
