//! The measurements: raw server round trips, and the single-key lock workloads (the
//! key-set workload is in [`crate::sets`]).
//!
//! Every measurement runs its loops for `warmup + duration`; only operations that complete
//! their acquire (or raw request) inside the `duration` window after the warm-up count.
//! All clients of one measurement share one monotonic clock (`tokio::time::Instant`), so a
//! hand-off is timed from the instant the previous holder called `release` to the instant
//! the next holder's `acquire` returned.

use std::sync::Arc;
use std::time::Duration;

use dlock::{DistributedLock, LockOptions, Mode, Wait};
use dlock_conformance::{History, Hold};
use futures::future::join_all;
use tokio::time::{Instant, sleep, sleep_until};

use crate::backends::{self, Kind};
use crate::raw::RawConn;
use crate::server_load::cpu_time;
use crate::stats::Histogram;

/// What every measurement shares.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) hold: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) ttl: Duration,
    /// Fresh per run: every key lockbench touches starts with it.
    pub(crate) prefix: String,
}

impl Plan {
    pub(crate) fn options(&self) -> LockOptions {
        LockOptions::new()
            .ttl(self.ttl)
            .wait(Wait::For(Duration::from_secs(60).max(self.hold * 64)))
    }

    /// How long a measurement may take before it is declared hung.
    pub(crate) fn limit(&self, clients: usize) -> Duration {
        self.warmup + self.duration + Duration::from_secs(90) + self.hold * clients as u32 * 2
    }
}

/// The window in which operations count.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Window {
    pub(crate) start: Instant,
    pub(crate) stop: Instant,
}

impl Window {
    pub(crate) fn after_warmup(plan: &Plan) -> Self {
        let start = Instant::now() + plan.warmup;
        Self {
            start,
            stop: start + plan.duration,
        }
    }

    pub(crate) fn contains(&self, t: Instant) -> bool {
        t >= self.start && t < self.stop
    }
}

/// This process's CPU time (user + system, every thread) over `window`, read when the
/// window opens and when it closes: the client's side of a measurement's cost, lockbench's
/// own bookkeeping of each operation included. `None` when `getrusage` fails.
pub(crate) async fn cpu_over(window: Window) -> Option<Duration> {
    sleep_until(window.start).await;
    let start = cpu_time();
    sleep_until(window.stop).await;
    Some(cpu_time()?.saturating_sub(start?))
}

/// Which raw operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawOp {
    Ping,
    Cycle,
}

/// A raw measurement.
#[derive(Debug)]
pub(crate) struct RawMeasure {
    pub(crate) ops: u64,
    pub(crate) per_sec: f64,
    pub(crate) latency: Histogram,
    /// This process's CPU time over the window ([`cpu_over`]).
    pub(crate) cpu: Option<Duration>,
}

/// `clients` raw clients, each on its own connection and key, repeating `op`.
pub(crate) async fn raw(
    kind: Kind,
    url: &str,
    clients: usize,
    op: RawOp,
    plan: &Plan,
) -> Result<RawMeasure, String> {
    let conns = join_all((0..clients).map(|i| {
        let key = format!("{}-raw{clients}-{i}", plan.prefix);
        async move { RawConn::connect(kind, url, &key, plan.connect_timeout).await }
    }))
    .await;
    let mut ok = Vec::new();
    let mut first_err = None;
    for c in conns {
        match c {
            Ok(c) => ok.push(c),
            Err(e) => first_err = first_err.or(Some(e)),
        }
    }
    if let Some(e) = first_err {
        join_all(ok.into_iter().map(RawConn::close)).await;
        return Err(format!("raw connect: {e}"));
    }
    let window = Window::after_warmup(plan);
    let tasks: Vec<_> = ok
        .into_iter()
        .map(|mut conn| {
            tokio::spawn(async move {
                let mut hist = Histogram::default();
                let mut result = Ok(());
                loop {
                    let begin = Instant::now();
                    if begin >= window.stop {
                        break;
                    }
                    let r = match op {
                        RawOp::Ping => conn.ping().await,
                        RawOp::Cycle => conn.cycle().await,
                    };
                    if let Err(e) = r {
                        result = Err(e);
                        break;
                    }
                    if window.contains(begin) {
                        hist.record(begin.elapsed());
                    }
                }
                conn.close().await;
                result.map(|()| hist)
            })
        })
        .collect();
    let (cpu, joined) = tokio::time::timeout(
        plan.limit(clients),
        futures::future::join(cpu_over(window), join_all(tasks)),
    )
    .await
    .map_err(|_| {
        format!(
            "the raw clients did not finish within {:?}",
            plan.limit(clients)
        )
    })?;
    let mut latency = Histogram::default();
    for r in joined {
        latency.merge(&r.map_err(|e| format!("raw task panicked: {e}"))??);
    }
    Ok(RawMeasure {
        ops: latency.count(),
        per_sec: latency.count() as f64 / plan.duration.as_secs_f64(),
        latency,
        cpu,
    })
}

/// The lock workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Workload {
    /// One client, one key.
    Uncontended,
    /// N clients, one key.
    Contended,
    /// N clients, N keys.
    Spread,
    /// N clients, one key, nine shared holds in ten (a read-write lock's common case).
    ReadMostly,
    /// N clients, one key, every hold one of N/4 permits (a semaphore).
    Semaphore,
    /// One client, one key held under an owner for the whole run: every hold a re-entry
    /// of that hold (acquire with the owner + release).
    Reentrant,
}

impl Workload {
    /// The mode of client `i`'s `n`th acquisition: every tenth one of a read-mostly run is
    /// exclusive (staggered across clients), every other workload is exclusive.
    fn mode(self, i: usize, n: usize) -> Mode {
        match self {
            Workload::ReadMostly if !(n + i).is_multiple_of(10) => Mode::Shared,
            _ => Mode::Exclusive,
        }
    }

    /// The permits of a semaphore run with `clients` clients: a quarter of them, so that
    /// three in four wait (at least one).
    pub(crate) fn permits(self, clients: usize) -> Option<u32> {
        match self {
            Workload::Semaphore => Some(u32::try_from(clients / 4).unwrap_or(u32::MAX).max(1)),
            _ => None,
        }
    }
}

/// The shortest hold of a semaphore run: with none at all, holds last a few microseconds
/// and rarely overlap, so the run would not show that the cap is reached.
pub(crate) const SEMAPHORE_MIN_HOLD: Duration = Duration::from_millis(1);

/// A lock measurement that kept mutual exclusion.
#[derive(Debug)]
pub(crate) struct LockMeasure {
    /// Acquisitions in the window.
    pub(crate) count: u64,
    pub(crate) per_sec: f64,
    /// acquire call → release returned, for acquisitions in the window.
    pub(crate) cycle: Histogram,
    /// acquire call → acquire returned.
    pub(crate) wait: Histogram,
    /// previous holder's release call → this holder's acquire returned (one key only).
    pub(crate) handoff: Histogram,
    /// Acquisitions in the window per client.
    pub(crate) per_client: Vec<u64>,
    /// Wake-ups the clients counted during the window.
    pub(crate) wakeups: u64,
    /// Holds the history checker saw (warm-up and drain included).
    pub(crate) holds_checked: usize,
    /// The most holds of the key at once, over the whole run (one key only).
    pub(crate) most_at_once: usize,
    /// This process's CPU time over the window ([`cpu_over`]).
    pub(crate) cpu: Option<Duration>,
}

/// A lock measurement that could not produce numbers.
#[derive(Debug)]
pub(crate) struct LockFailure {
    pub(crate) error: String,
    /// Overlapping holds found by the checker (0 when the failure was something else).
    pub(crate) overlaps: usize,
}

impl From<String> for LockFailure {
    fn from(error: String) -> Self {
        Self { error, overlaps: 0 }
    }
}

/// One task's record.
#[derive(Debug, Default)]
struct TaskRecord {
    holds: Vec<(u64, Mode, Instant, Instant)>,
    cycle: Histogram,
    wait: Histogram,
    in_window: u64,
}

/// Run `workload` with `clients` clients, each from its own `dlock::connect(url)`.
pub(crate) async fn lock(
    url: &str,
    workload: Workload,
    clients: usize,
    plan: &Plan,
) -> Result<LockMeasure, LockFailure> {
    let connected =
        join_all((0..clients).map(|_| backends::connect(url, plan.connect_timeout))).await;
    let locks: Vec<Arc<dyn DistributedLock>> = connected
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("connect: {e}"))?;
    lock_with(locks, workload, plan).await
}

/// Run `workload` with these clients (one task each).
async fn lock_with(
    locks: Vec<Arc<dyn DistributedLock>>,
    workload: Workload,
    plan: &Plan,
) -> Result<LockMeasure, LockFailure> {
    let clients = locks.len();
    let ordered_tokens = locks[0].capabilities().fencing.is_ordered();
    let name = match workload {
        Workload::Uncontended => "uncontended",
        Workload::Contended => "contended",
        Workload::Spread => "spread",
        Workload::ReadMostly => "read-mostly",
        Workload::Semaphore => "semaphore",
        Workload::Reentrant => "reentrant",
    };
    let key_of = |i: usize| match workload {
        Workload::Spread => format!("{}/{name}{clients}/{i}", plan.prefix),
        _ => format!("{}/{name}{clients}", plan.prefix),
    };
    let opts = match workload {
        Workload::Reentrant => plan.options().owner("lockbench"),
        _ => plan.options(),
    };
    let permits = workload.permits(clients);
    let hold = match permits {
        Some(_) => plan.hold.max(SEMAPHORE_MIN_HOLD),
        None => plan.hold,
    };
    let window = Window::after_warmup(plan);
    let tasks: Vec<_> = locks
        .iter()
        .enumerate()
        .map(|(i, lock)| {
            let (lock, key) = (lock.clone(), key_of(i));
            tokio::spawn(async move {
                let mut rec = TaskRecord::default();
                // The owner's hold that every cycle re-enters.
                let _held = match workload {
                    Workload::Reentrant => match lock.acquire(&key, &opts).await {
                        Ok(lease) => Some(lease),
                        Err(e) => return (rec, Err(format!("client {i}: acquire: {e}"))),
                    },
                    _ => None,
                };
                for n in 0.. {
                    let call = Instant::now();
                    if call >= window.stop {
                        break;
                    }
                    let mode = permits.map_or_else(|| workload.mode(i, n), Mode::Permits);
                    let lease = match lock.acquire(&key, &opts.mode(mode)).await {
                        Ok(lease) => lease,
                        Err(e) => return (rec, Err(format!("client {i}: acquire: {e}"))),
                    };
                    let acquired = Instant::now();
                    if !hold.is_zero() {
                        sleep(hold).await;
                    }
                    let lost = lease.is_lost();
                    let token = lease.fencing_token();
                    let end = Instant::now();
                    let released = lease.release().await;
                    let done = Instant::now();
                    rec.holds.push((token, mode, acquired, end));
                    if lost {
                        return (
                            rec,
                            Err(format!("client {i}: the lease was lost during the run")),
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
    let wakeups = async {
        let sum = || locks.iter().map(|l| l.stats().wakeups).sum::<u64>();
        sleep_until(window.start).await;
        let before = sum();
        sleep_until(window.stop).await;
        sum().saturating_sub(before)
    };
    let limit = plan.limit(clients);
    let ((wakeups, cpu), joined) = tokio::time::timeout(
        limit,
        futures::future::join(
            futures::future::join(wakeups, cpu_over(window)),
            join_all(tasks),
        ),
    )
    .await
    .map_err(|_| format!("the clients did not finish within {limit:?}"))?;

    let history = History::new();
    let mut measure = LockMeasure {
        count: 0,
        per_sec: 0.0,
        cycle: Histogram::default(),
        wait: Histogram::default(),
        handoff: Histogram::default(),
        per_client: Vec::with_capacity(clients),
        wakeups,
        holds_checked: 0,
        most_at_once: 0,
        cpu,
    };
    let mut errors = Vec::new();
    let mut all_holds = Vec::new();
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
        let key = key_of(i);
        for &(token, mode, start, end) in &rec.holds {
            history.record(Hold {
                client: i,
                key: key.clone(),
                token,
                mode,
                start,
                end,
                lost_at: None,
            });
        }
        all_holds.extend(rec.holds.iter().map(|&(_, _, start, end)| (start, end)));
    }
    drop(locks);
    measure.holds_checked = all_holds.len();
    if workload != Workload::Spread {
        measure.most_at_once = crate::stats::most_at_once(&all_holds);
    }
    // Re-entries of one hold share its token: checked for that, not for order.
    if workload == Workload::Reentrant {
        let tokens: std::collections::BTreeSet<u64> =
            history.holds().iter().map(|h| h.token).collect();
        if tokens.len() > 1 {
            return Err(LockFailure {
                error: format!("the re-entries of one hold got {} tokens", tokens.len()),
                overlaps: 0,
            });
        }
    }
    let violations = history.check(ordered_tokens && workload != Workload::Reentrant);
    if !violations.is_empty() {
        // Too many permit holders at once is the semaphore's overlap.
        let overlaps = violations
            .iter()
            .filter(|v| {
                matches!(
                    v,
                    dlock_conformance::Violation::Overlap { .. }
                        | dlock_conformance::Violation::OverLimit { .. }
                )
            })
            .count();
        let shown: Vec<String> = violations.iter().take(3).map(|v| v.to_string()).collect();
        return Err(LockFailure {
            error: format!(
                "{} history violation(s) ({overlaps} overlaps) in {} holds: {}",
                violations.len(),
                all_holds.len(),
                shown.join("; ")
            ),
            overlaps,
        });
    }
    if !errors.is_empty() {
        return Err(format!("{} client error(s): {}", errors.len(), errors.join("; ")).into());
    }
    // Fewer holders at once than permits is a figure, not a failure: a protocol that admits
    // one acquirer at a time (ZooKeeper's, as Curator's) cannot keep many short holds busy.
    // Hand-offs are between holders of one key in turn; shared holds overlap.
    if matches!(workload, Workload::Uncontended | Workload::Contended) {
        all_holds.sort_by_key(|&(start, _)| start);
        for pair in all_holds.windows(2) {
            let ((_, prev_end), (next_start, _)) = (pair[0], pair[1]);
            if window.contains(next_start) {
                measure
                    .handoff
                    .record(next_start.saturating_duration_since(prev_end));
            }
        }
    }
    measure.per_sec = measure.count as f64 / plan.duration.as_secs_f64();
    Ok(measure)
}

#[cfg(test)]
#[path = "run_tests.rs"]
pub(crate) mod tests;
