//! The key-set workload: N clients on [`KEYS`] keys, each taking a random set of
//! [`SET_SIZE`] of them as one hold with `LockExt::acquire_all`.
//!
//! Each client loops: pick [`SET_SIZE`] distinct keys at random, name them in random order,
//! `acquire_all` (the core takes them one by one in ascending byte order, so overlapping
//! sets never deadlock), hold `--hold`, release the set. With one client the sets never
//! meet: that run is the uncontended cost of a set, which the report divides by twice the
//! uncontended single-key cycle of the same run.
//!
//! Every key of every set is recorded as a hold in the conformance suite's `History`, with
//! that key's own fencing token: two holders of one key at once (or a token going back) is
//! a failure, never a number.

use std::sync::Arc;

use dlock::{DistributedLock, LockExt as _, Mode};
use dlock_conformance::{History, Hold};
use futures::future::join_all;
use rand::SeedableRng as _;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use tokio::time::{Instant, sleep};

use crate::backends;
use crate::run::{LockFailure, Plan, Window};
use crate::stats::Histogram;

/// The keys every run draws its sets from.
pub(crate) const KEYS: usize = 8;

/// The keys in one set.
pub(crate) const SET_SIZE: usize = 2;

/// A key-set measurement that kept mutual exclusion on every key.
#[derive(Debug)]
pub(crate) struct SetsMeasure {
    /// Sets acquired in the window.
    pub(crate) count: u64,
    pub(crate) per_sec: f64,
    /// `acquire_all` call → set release returned, for sets acquired in the window.
    pub(crate) cycle: Histogram,
    /// `acquire_all` call → `acquire_all` returned.
    pub(crate) wait: Histogram,
    /// Sets acquired in the window per client.
    pub(crate) per_client: Vec<u64>,
    /// Key holds the history checker saw (one per key of each set, warm-up and drain
    /// included).
    pub(crate) holds_checked: usize,
}

/// One task's record.
#[derive(Debug, Default)]
struct TaskRecord {
    /// (key index, token, acquire_all returned, release called), one per key of each set.
    holds: Vec<(usize, u64, Instant, Instant)>,
    cycle: Histogram,
    wait: Histogram,
    in_window: u64,
}

/// Run the key-set workload with `clients` clients, each from its own
/// `dlock::connect(url)`.
pub(crate) async fn run(
    url: &str,
    clients: usize,
    plan: &Plan,
) -> Result<SetsMeasure, LockFailure> {
    let connected =
        join_all((0..clients).map(|_| backends::connect(url, plan.connect_timeout))).await;
    let locks: Vec<Arc<dyn DistributedLock>> = connected
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("connect: {e}"))?;
    run_with(locks, plan).await
}

/// Run the key-set workload with these clients (one task each).
pub(crate) async fn run_with(
    locks: Vec<Arc<dyn DistributedLock>>,
    plan: &Plan,
) -> Result<SetsMeasure, LockFailure> {
    let clients = locks.len();
    let ordered_tokens = locks[0].capabilities().fencing.is_ordered();
    let keys: Arc<[String]> = (0..KEYS)
        .map(|k| format!("{}/sets{clients}/{k}", plan.prefix))
        .collect();
    let opts = plan.options();
    let hold = plan.hold;
    let window = Window::after_warmup(plan);
    let tasks: Vec<_> = locks
        .iter()
        .enumerate()
        .map(|(i, lock)| {
            let (lock, keys) = (lock.clone(), keys.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::from_rng(&mut rand::rng());
                let mut order: Vec<usize> = (0..KEYS).collect();
                let mut rec = TaskRecord::default();
                loop {
                    // SET_SIZE distinct keys, named in random order.
                    order.shuffle(&mut rng);
                    let picked = &order[..SET_SIZE];
                    let names: Vec<&str> = picked.iter().map(|&k| keys[k].as_str()).collect();
                    let call = Instant::now();
                    if call >= window.stop {
                        break;
                    }
                    let set = match lock.as_ref().acquire_all(&names, &opts).await {
                        Ok(set) => set,
                        Err(e) => return (rec, Err(format!("client {i}: acquire_all: {e}"))),
                    };
                    let acquired = Instant::now();
                    // The set holds exactly the keys asked for, each with its own token.
                    let tokens: Option<Vec<u64>> =
                        names.iter().map(|k| set.fencing_token(k)).collect();
                    let Some(tokens) = tokens.filter(|_| set.len() == SET_SIZE) else {
                        let held: Vec<String> = set.keys().map(str::to_owned).collect();
                        let _ = set.release().await;
                        return (
                            rec,
                            Err(format!(
                                "client {i}: acquire_all({names:?}) returned a set of {held:?}"
                            )),
                        );
                    };
                    if !hold.is_zero() {
                        sleep(hold).await;
                    }
                    let lost = set.is_lost();
                    let end = Instant::now();
                    let released = set.release().await;
                    let done = Instant::now();
                    for (&k, token) in picked.iter().zip(tokens) {
                        rec.holds.push((k, token, acquired, end));
                    }
                    if lost {
                        return (
                            rec,
                            Err(format!(
                                "client {i}: a key of the set was lost during the run"
                            )),
                        );
                    }
                    if let Err(e) = released {
                        return (rec, Err(format!("client {i}: release: {e}")));
                    }
                    if acquired >= window.start {
                        rec.wait.record(acquired - call);
                    }
                    if window.contains(acquired) {
                        rec.in_window += 1;
                        rec.cycle.record(done - call);
                    }
                }
                (rec, Ok(()))
            })
        })
        .collect();
    let limit = plan.limit(clients);
    let joined = tokio::time::timeout(limit, join_all(tasks))
        .await
        .map_err(|_| format!("the clients did not finish within {limit:?}"))?;

    let history = History::new();
    let mut measure = SetsMeasure {
        count: 0,
        per_sec: 0.0,
        cycle: Histogram::default(),
        wait: Histogram::default(),
        per_client: Vec::with_capacity(clients),
        holds_checked: 0,
    };
    let mut errors = Vec::new();
    for (i, joined) in joined.into_iter().enumerate() {
        let (rec, result) = match joined {
            Ok(r) => r,
            Err(e) => (
                TaskRecord::default(),
                Err(format!("client {i} panicked: {e}")),
            ),
        };
        if let Err(e) = result {
            errors.push(e);
        }
        measure.count += rec.in_window;
        measure.per_client.push(rec.in_window);
        measure.cycle.merge(&rec.cycle);
        measure.wait.merge(&rec.wait);
        measure.holds_checked += rec.holds.len();
        for &(k, token, start, end) in &rec.holds {
            history.record(Hold {
                client: i,
                key: keys[k].clone(),
                token,
                mode: Mode::Exclusive,
                start,
                end,
                lost_at: None,
            });
        }
    }
    drop(locks);
    let violations = history.check(ordered_tokens);
    if !violations.is_empty() {
        let overlaps = violations
            .iter()
            .filter(|v| matches!(v, dlock_conformance::Violation::Overlap { .. }))
            .count();
        let shown: Vec<String> = violations.iter().take(3).map(|v| v.to_string()).collect();
        return Err(LockFailure {
            error: format!(
                "{} history violation(s) ({overlaps} overlaps) in {} key holds: {}",
                violations.len(),
                measure.holds_checked,
                shown.join("; ")
            ),
            overlaps,
        });
    }
    if !errors.is_empty() {
        return Err(format!("{} client error(s): {}", errors.len(), errors.join("; ")).into());
    }
    measure.per_sec = measure.count as f64 / plan.duration.as_secs_f64();
    Ok(measure)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    use crate::run::tests::plan;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn overlapping_sets_are_taken_and_checked_key_by_key() {
        for clients in [1, 6] {
            let m = run("memory://lockbench-sets-test", clients, &plan())
                .await
                .unwrap_or_else(|f| panic!("×{clients}: {}", f.error));
            assert!(m.count > 0 && m.wait.count() > 0, "×{clients}");
            assert_eq!(m.per_client.len(), clients);
            assert_eq!(m.per_client.iter().sum::<u64>(), m.count);
            assert!(
                m.holds_checked as u64 >= m.count * SET_SIZE as u64,
                "×{clients}: every key of every set is checked"
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_holders_of_a_key_are_a_failure_not_a_number() {
        let plan = Plan {
            hold: Duration::from_millis(2),
            ..plan()
        };
        let clients: Vec<Arc<dyn DistributedLock>> = (0..6)
            .map(|_| {
                Arc::new(dlock_core::raw::LockClient::new(
                    crate::run::tests::AlwaysGrants::default(),
                )) as Arc<dyn DistributedLock>
            })
            .collect();
        let failure = run_with(clients, &plan)
            .await
            .expect_err("six clients granted every key at once must fail");
        assert!(failure.overlaps > 0, "{}", failure.error);
        assert!(failure.error.contains("overlap"), "{}", failure.error);
    }
}
