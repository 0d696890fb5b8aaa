//! lockbench: the same lock workloads on every dlock backend, each shown next to what the
//! server's own minimal round trips cost.
//!
//! ```text
//! cargo run --release -p lockbench -- [--backends all|memory,redis,…] [--clients 1,8,32]
//!     [--duration 2s] [--warmup 500ms] [--hold 0ms] [--rounds 3] [--out target/lockbench]
//!     [--compare BASELINE.json]
//! cargo run --release -p lockbench -- --hold-many 10000 [--hold-for 30s] [--ttl 30s] …
//! ```
//!
//! With `--hold-many N`, lockbench runs only the hold-many workload on each selected
//! backend: one client takes N keys, holds them with auto-renew and releases them (see
//! [`hold_many`]).
//!
//! Every backend is reached through `dlock::connect(url)` only, with the URLs of
//! `scripts/backends` unless `DLOCK_<BACKEND>_URL` says otherwise. Backends that do not
//! answer are listed with the command that starts them; the in-memory backend always runs.
//! Each lock measurement feeds the conformance history checker: a run with an overlap is a
//! failure (exit status 1), never a number. See `benches/README.md` for the columns.

mod backends;
mod chart;
mod compare;
mod connect;
mod elections;
mod hold_many;
mod raw;
mod report;
mod run;
mod server_load;
mod sets;
mod stats;
mod tables;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng as _;

use crate::backends::{Kind, SkipReason, Skipped};
use crate::report::{BackendReport, Failure, Report, Scenario, ScenarioResult};
use crate::run::{Plan, RawOp, Workload};

/// Compare dlock's backends: raw server round trips, uncontended, contended and spread
/// locking, key sets and leader elections, checked for mutual exclusion.
#[derive(Debug, Parser)]
#[command(name = "lockbench", version)]
struct Args {
    /// `all`, or a comma-separated list of: memory, redis, redlock, zookeeper, etcd, mysql,
    /// postgres.
    #[arg(long, default_value = "all")]
    backends: String,
    /// Client counts for the contended, spread, key-set and election workloads (and the raw
    /// baseline).
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    clients: Vec<usize>,
    /// How long each measurement counts operations, after the warm-up.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// How long each measurement runs before it starts counting.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// How many times each ratio's two measurements (the raw cycle, then the uncontended or
    /// spread run it is the unit of) are made back to back; the round with the median ratio
    /// is kept, and every round's ratio is reported.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// How long each holder keeps the lock before releasing it.
    #[arg(long, default_value = "0ms", value_parser = humantime::parse_duration)]
    hold: Duration,
    /// Lease ttl (auto-renewed every ttl/3 while held).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Bound on connecting and on the reachability probe, per backend.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    connect_timeout: Duration,
    /// Run only the hold-many workload: one client takes this many distinct keys (capped at
    /// the backend's declared `max_held`), holds them for `--hold-for` with auto-renew at
    /// `--ttl`, and releases them all.
    #[arg(long, value_name = "N")]
    hold_many: Option<usize>,
    /// How long the hold-many workload holds its keys.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    hold_for: Duration,
    /// Where lockbench.json and lockbench.svg are written.
    #[arg(long, default_value = "target/lockbench")]
    out: PathBuf,
    /// An earlier run's lockbench.json: print each figure of this run next to it, with the
    /// change (copy the file away first: this run overwrites `--out`'s).
    #[arg(long, value_name = "BASELINE.json")]
    compare: Option<PathBuf>,
}

/// One measurement to make.
#[derive(Debug, Clone, Copy)]
enum Step {
    Raw(RawOp, usize),
    Lock(Workload, usize),
    /// The raw cycle of this many clients, then the lock workload it is the unit of,
    /// `--rounds` times (see [`paired`]).
    Pair(Workload, usize),
    /// The key-set workload with this many clients (1: the uncontended set).
    Sets(usize),
    /// The election workload with this many candidates (and one observer).
    Elections(usize),
    HoldMany(usize),
}

impl Step {
    /// How many measurements the step makes: a pair two a round, the others one.
    fn measurements(self, rounds: usize) -> usize {
        match self {
            Step::Pair(..) => 2 * rounds,
            _ => 1,
        }
    }

    fn label(self) -> String {
        match self {
            Step::Raw(RawOp::Ping, n) => format!("raw ping ×{n}"),
            Step::Raw(RawOp::Cycle, n) => format!("raw cycle ×{n}"),
            Step::Pair(workload, n) => {
                format!("raw cycle ×{n} + {}", Step::Lock(workload, n).label())
            }
            Step::Lock(Workload::Uncontended, _) => "uncontended".into(),
            Step::Lock(Workload::Contended, n) => format!("contended ×{n}"),
            Step::Lock(Workload::Spread, n) => format!("spread ×{n}"),
            Step::Lock(Workload::ReadMostly, n) => format!("read-mostly ×{n}"),
            Step::Lock(Workload::Semaphore, n) => format!("semaphore ×{n}"),
            Step::Lock(Workload::Reentrant, _) => "reentrant".into(),
            Step::Sets(n) => format!("sets ×{n}"),
            Step::Elections(n) => format!("elections ×{n}"),
            Step::HoldMany(n) => format!("hold-many {n}"),
        }
    }
}

/// The measurements for one backend, in order: the raw cycle of one client first (the
/// uncontended and contended ratios' unit), paired with the uncontended run; the raw cycle
/// of N clients paired with the spread run of N, right before the read-mostly run of N,
/// whose ratios it is the unit of too (measured at the start, it was some tens of seconds
/// older than them, and a shared machine's load drifts); then the key sets, one client
/// first (the uncontended set, set against `uncontended`); the elections last. With
/// rounds, the raw cycle kept is the median round's, so the unit of what follows a pair
/// may be up to `2 × (rounds − 1)` measurements older than it (a round is two).
fn steps(kind: Kind, clients: &[usize]) -> Vec<Step> {
    let mut multi: Vec<usize> = clients.iter().copied().filter(|&n| n >= 2).collect();
    multi.sort_unstable();
    multi.dedup();
    if multi.is_empty() {
        multi.push(2);
    }
    let mut out = Vec::new();
    if kind != Kind::Memory {
        out.push(Step::Raw(RawOp::Ping, 1));
    }
    out.push(Step::Pair(Workload::Uncontended, 1));
    out.push(Step::Lock(Workload::Reentrant, 1));
    out.extend(multi.iter().map(|&n| Step::Lock(Workload::Contended, n)));
    for &n in &multi {
        out.push(Step::Pair(Workload::Spread, n));
        out.push(Step::Lock(Workload::ReadMostly, n));
    }
    out.extend(multi.iter().map(|&n| Step::Lock(Workload::Semaphore, n)));
    out.push(Step::Sets(1));
    out.extend(multi.iter().map(|&n| Step::Sets(n)));
    out.extend(multi.iter().map(|&n| Step::Elections(n)));
    out
}

fn selected(spec: &str) -> Result<(Vec<Kind>, bool), String> {
    if spec.trim().eq_ignore_ascii_case("all") {
        return Ok((Kind::ALL.to_vec(), false));
    }
    let mut kinds = spec
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(str::parse)
        .collect::<Result<Vec<Kind>, _>>()?;
    kinds.sort();
    kinds.dedup();
    if kinds.is_empty() {
        return Err("--backends is empty".into());
    }
    Ok((kinds, true))
}

async fn measure(
    kind: Kind,
    url: &str,
    step: Step,
    plan: &Plan,
    hold_for: Duration,
) -> ScenarioResult {
    match step {
        Step::HoldMany(n) => {
            let r = ScenarioResult::new(Scenario::HoldMany, 1);
            match hold_many::run(kind, url, n, hold_for, plan).await {
                Ok(h) => {
                    let mut r = match h.problem() {
                        Some(problem) => r.failed(problem, None),
                        None => r,
                    };
                    r.count = h.acquired as u64;
                    r.per_sec = h.acquire_per_sec;
                    r.hold_many = Some(h);
                    r
                }
                Err(e) => r.failed(e, None),
            }
        }
        Step::Sets(n) => {
            let r = ScenarioResult::new(Scenario::Sets, n);
            match sets::run(url, n, plan).await {
                Ok(m) => {
                    let mut r = r
                        .latency(&m.cycle)
                        .waits(&m.wait)
                        .fairness(m.per_client.clone());
                    r.count = m.count;
                    r.per_sec = m.per_sec;
                    r.holds_checked = Some(m.holds_checked);
                    r.overlaps = Some(0);
                    r
                }
                Err(f) => r.failed(f.error, Some(f.overlaps)),
            }
        }
        Step::Elections(n) => {
            let r = ScenarioResult::new(Scenario::Elections, n);
            match elections::run(url, n, plan).await {
                Ok(m) => {
                    let mut r = r.latency(&m.handover).fairness(m.per_client.clone());
                    r.count = m.count;
                    r.per_sec = m.per_sec;
                    r.holds_checked = Some(m.holds_checked);
                    r.overlaps = Some(0);
                    r.observed(&m.lag, m.observed)
                }
                Err(f) => r.failed(f.error, Some(f.overlaps)),
            }
        }
        Step::Raw(op, n) => {
            let mut r = ScenarioResult::new(Scenario::Raw, n);
            r.op = Some(match op {
                RawOp::Ping => "ping",
                RawOp::Cycle => "cycle",
            });
            match run::raw(kind, url, n, op, plan).await {
                Ok(m) => {
                    r.count = m.ops;
                    r.per_sec = m.per_sec;
                    r.client_cpu_us = report::per_op_us(m.cpu, m.ops);
                    r.latency(&m.latency)
                }
                Err(e) => r.failed(e, None),
            }
        }
        // A pair's lock run alone (`paired` makes the pairs).
        Step::Lock(workload, n) | Step::Pair(workload, n) => {
            let scenario = match workload {
                Workload::Uncontended => Scenario::Uncontended,
                Workload::Contended => Scenario::Contended,
                Workload::Spread => Scenario::Spread,
                Workload::ReadMostly => Scenario::ReadMostly,
                Workload::Semaphore => Scenario::Semaphore,
                Workload::Reentrant => Scenario::Reentrant,
            };
            let mut r = ScenarioResult::new(scenario, n);
            r.permits = workload.permits(n);
            match run::lock(url, workload, n, plan).await {
                Ok(m) => {
                    let mut r = match workload {
                        Workload::Contended => r.latency(&m.handoff).fairness(m.per_client.clone()),
                        _ => r.latency(&m.cycle),
                    }
                    .waits(&m.wait);
                    r.count = m.count;
                    r.per_sec = m.per_sec;
                    r.client_cpu_us = report::per_op_us(m.cpu, m.count);
                    r.holds_checked = Some(m.holds_checked);
                    r.overlaps = Some(0);
                    if workload == Workload::Semaphore {
                        r.most_holders = Some(m.most_at_once);
                    }
                    if workload == Workload::Contended && m.count > 0 {
                        r.wakeups_per_acquire =
                            Some((m.wakeups as f64 / m.count as f64 * 100.0).round() / 100.0);
                    }
                    r
                }
                Err(f) => r.failed(f.error, Some(f.overlaps)),
            }
        }
    }
}

/// `step` measured, or reported `unsupported` where the backend's capabilities say it lacks
/// the feature (not a failure: the backend says so itself, and the table names it).
async fn measure_or_skip(
    kind: Kind,
    url: &str,
    step: Step,
    plan: &Plan,
    hold_for: Duration,
    capabilities: dlock::Capabilities,
) -> ScenarioResult {
    match step {
        Step::Lock(Workload::ReadMostly, n) if !capabilities.shared => {
            ScenarioResult::new(Scenario::ReadMostly, n).unsupported()
        }
        Step::Lock(Workload::Semaphore, n) if !capabilities.permits => {
            let mut r = ScenarioResult::new(Scenario::Semaphore, n).unsupported();
            r.permits = Workload::Semaphore.permits(n);
            r
        }
        Step::Lock(Workload::Reentrant, n) if !capabilities.reentrant.is_supported() => {
            ScenarioResult::new(Scenario::Reentrant, n).unsupported()
        }
        Step::Elections(n) if capabilities.election == dlock::Observe::Unsupported => {
            ScenarioResult::new(Scenario::Elections, n).unsupported()
        }
        _ => measure(kind, url, step, plan, hold_for).await,
    }
}

/// A ratio's two measurements, `rounds` times back to back: the raw cycle of `n` clients,
/// then `workload` (uncontended or spread), whose ratio to raw is their quotient. Keeps the
/// round with the median ratio (of an even count the upper middle one, never the more
/// flattering), with every round's ratio on its lock result: a moment of load on the
/// shared machine that moves one round of three does not move the figure. A failed
/// measurement ends the rounds, and its round is the one kept.
async fn paired(
    kind: Kind,
    url: &str,
    (workload, n): (Workload, usize),
    plan: &Plan,
    hold_for: Duration,
    rounds: usize,
) -> Vec<ScenarioResult> {
    let mut done = Vec::new();
    for _ in 0..rounds {
        let raw = measure(kind, url, Step::Raw(RawOp::Cycle, n), plan, hold_for).await;
        let lock = measure(kind, url, Step::Lock(workload, n), plan, hold_for).await;
        match report::round_ratio(&raw, &lock) {
            Some(ratio) => done.push((raw, lock, ratio)),
            None => return vec![raw, lock],
        }
    }
    let ratios: Vec<f64> = done.iter().map(|(_, _, ratio)| *ratio).collect();
    let Some(kept) = report::median_index(&ratios) else {
        return Vec::new();
    };
    let (raw, mut lock, _) = done.swap_remove(kept);
    lock.round_ratios = Some(ratios.iter().map(|r| (r * 100.0).round() / 100.0).collect());
    vec![raw, lock]
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let (kinds, explicit) = match selected(&args.backends) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("lockbench: {e}");
            return ExitCode::from(2);
        }
    };
    if args.clients.is_empty() || args.clients.contains(&0) {
        eprintln!("lockbench: --clients needs counts of at least 1, e.g. 1,8,32");
        return ExitCode::from(2);
    }
    if args.hold_many == Some(0) || args.hold_for.is_zero() {
        eprintln!("lockbench: --hold-many and --hold-for must be more than zero");
        return ExitCode::from(2);
    }
    if args.duration.is_zero() {
        eprintln!("lockbench: --duration must be more than zero");
        return ExitCode::from(2);
    }
    if args.rounds == 0 {
        eprintln!("lockbench: --rounds must be at least 1");
        return ExitCode::from(2);
    }
    let baseline = match args.compare.as_deref().map(compare::load).transpose() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("lockbench: {e}");
            return ExitCode::from(2);
        }
    };
    let plan = Plan {
        duration: args.duration,
        warmup: args.warmup,
        hold: args.hold,
        connect_timeout: args.connect_timeout,
        ttl: args.ttl,
        prefix: format!("lb{:08x}", rand::rng().random::<u32>()),
    };
    if let Err(e) = dlock::LockOptions::new()
        .ttl(plan.ttl)
        .validate("lockbench")
    {
        eprintln!("lockbench: --ttl: {e}");
        return ExitCode::from(2);
    }
    let started_unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());

    // Which backends answer.
    let mut skipped = Vec::new();
    let mut targets = Vec::new();
    for kind in Kind::ALL {
        if !kinds.contains(&kind) {
            skipped.push(Skipped {
                backend: kind,
                reason: SkipReason::NotSelected,
                detail: "not in --backends".into(),
                start_command: None,
            });
            continue;
        }
        let url = kind.url();
        let probe_key = format!("{}/probe", plan.prefix);
        match backends::probe(kind, &url, &probe_key, plan.connect_timeout).await {
            Ok(()) => match connect::server_version(kind, &url, plan.connect_timeout).await {
                Ok(version) => targets.push((kind, url, version)),
                Err(e) => skipped.push(Skipped {
                    backend: kind,
                    reason: SkipReason::Unreachable,
                    detail: format!("the lock answered but the raw client did not: {e}"),
                    start_command: kind.start_command(),
                }),
            },
            Err(s) => skipped.push(s),
        }
    }
    for s in skipped
        .iter()
        .filter(|s| s.reason != SkipReason::NotSelected)
    {
        let start = s
            .start_command
            .map(|c| format!("; start it with `{c}`"))
            .unwrap_or_default();
        eprintln!("lockbench: skipping {}: {}{start}", s.backend, s.detail);
    }

    let plans: Vec<(Kind, Vec<Step>)> = targets
        .iter()
        .map(|(kind, _, _)| match args.hold_many {
            Some(n) => (*kind, vec![Step::HoldMany(n)]),
            None => (*kind, steps(*kind, &args.clients)),
        })
        .collect();
    // Counted in measurements, so that the bar and its estimate follow the time.
    let total: usize = plans
        .iter()
        .flat_map(|(_, s)| s.iter().map(|step| step.measurements(args.rounds)))
        .sum();
    let bar = ProgressBar::new(total as u64).with_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg} (eta {eta})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );

    let mut backends_out = Vec::new();
    let mut failures = Vec::new();
    for ((kind, url, server), (_, steps)) in targets.iter().zip(plans) {
        let capabilities = match backends::connect(url, plan.connect_timeout).await {
            Ok(lock) => lock.capabilities(),
            Err(e) => {
                skipped.push(Skipped {
                    backend: *kind,
                    reason: SkipReason::Unreachable,
                    detail: e,
                    start_command: kind.start_command(),
                });
                bar.inc(
                    steps
                        .iter()
                        .map(|s| s.measurements(args.rounds) as u64)
                        .sum(),
                );
                continue;
            }
        };
        let (raw_ping, raw_cycle) = raw::describe(*kind);
        let mut report = BackendReport {
            backend: *kind,
            url: backends::redact(url),
            server: server.clone(),
            capabilities: capabilities.into(),
            raw_ping,
            raw_cycle,
            results: Vec::new(),
        };
        for step in steps {
            bar.set_message(format!("{kind} {}", step.label()));
            let results = match step {
                Step::Pair(workload, n) => {
                    let pair = (workload, n);
                    paired(*kind, url, pair, &plan, args.hold_for, args.rounds).await
                }
                _ => vec![
                    measure_or_skip(*kind, url, step, &plan, args.hold_for, capabilities).await,
                ],
            };
            for result in results {
                if let Some(error) = &result.error {
                    bar.suspend(|| eprintln!("lockbench: {kind} {} FAILED: {error}", step.label()));
                    failures.push(Failure {
                        backend: *kind,
                        scenario: result.scenario,
                        clients: result.clients,
                        error: error.clone(),
                    });
                }
                report.results.push(result);
            }
            bar.inc(step.measurements(args.rounds) as u64);
        }
        report.compute_ratios();
        backends_out.push(report);
    }
    bar.finish_and_clear();

    let report = Report {
        lockbench: env!("CARGO_PKG_VERSION"),
        started_unix,
        machine: report::Machine::detect(),
        config: report::Config {
            duration_ms: plan.duration.as_millis() as u64,
            warmup_ms: plan.warmup.as_millis() as u64,
            hold_ms: plan.hold.as_millis() as u64,
            ttl_ms: plan.ttl.as_millis() as u64,
            clients: args.clients.clone(),
            prefix: plan.prefix.clone(),
            hold_many: args.hold_many,
            hold_for_ms: args.hold_many.map(|_| args.hold_for.as_millis() as u64),
            rounds: args.rounds,
        },
        backends: backends_out,
        skipped,
        failures,
    };
    print!("{}", report.markdown());
    if let Some(baseline) = &baseline {
        print!("{}", compare::markdown(&report, baseline));
    }

    let mut status = 0u8;
    if let Err(e) = std::fs::create_dir_all(&args.out) {
        eprintln!("lockbench: cannot create {}: {e}", args.out.display());
        status = 2;
    } else {
        let json = args.out.join("lockbench.json");
        let svg = args.out.join("lockbench.svg");
        match serde_json::to_string_pretty(&report)
            .map_err(|e| e.to_string())
            .and_then(|s| std::fs::write(&json, s).map_err(|e| e.to_string()))
        {
            Ok(()) => eprintln!("lockbench: wrote {}", json.display()),
            Err(e) => {
                eprintln!("lockbench: cannot write {}: {e}", json.display());
                status = 2;
            }
        }
        // The chart compares the lock workloads; a hold-many run has none.
        if args.hold_many.is_none() {
            match chart::write(&report, &svg) {
                Ok(()) => eprintln!("lockbench: wrote {}", svg.display()),
                Err(e) => {
                    eprintln!("lockbench: {e}");
                    status = 2;
                }
            }
        }
    }
    if !report.failures.is_empty() {
        eprintln!(
            "lockbench: {} measurement(s) FAILED: {}",
            report.failures.len(),
            report
                .failures
                .iter()
                .map(|f| format!("{} {} ×{}", f.backend, f.scenario.name(), f.clients))
                .collect::<Vec<_>>()
                .join(", ")
        );
        return ExitCode::from(1);
    }
    let missing: Vec<_> = report
        .skipped
        .iter()
        .filter(|s| explicit && s.reason != SkipReason::NotSelected)
        .map(|s| s.backend.to_string())
        .collect();
    if !missing.is_empty() {
        eprintln!(
            "lockbench: requested backend(s) not measured: {}",
            missing.join(", ")
        );
        status = status.max(2);
    }
    ExitCode::from(status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_measure_each_raw_cycle_next_to_what_it_is_the_unit_of() {
        let labels: Vec<String> = steps(Kind::Redis, &[1, 8, 32])
            .into_iter()
            .map(Step::label)
            .collect();
        assert_eq!(
            labels,
            [
                "raw ping ×1",
                "raw cycle ×1 + uncontended",
                "reentrant",
                "contended ×8",
                "contended ×32",
                "raw cycle ×8 + spread ×8",
                "read-mostly ×8",
                "raw cycle ×32 + spread ×32",
                "read-mostly ×32",
                "semaphore ×8",
                "semaphore ×32",
                "sets ×1",
                "sets ×8",
                "sets ×32",
                "elections ×8",
                "elections ×32"
            ]
        );
        let memory: Vec<String> = steps(Kind::Memory, &[1])
            .into_iter()
            .map(Step::label)
            .collect();
        assert_eq!(
            memory,
            [
                "raw cycle ×1 + uncontended",
                "reentrant",
                "contended ×2",
                "raw cycle ×2 + spread ×2",
                "read-mostly ×2",
                "semaphore ×2",
                "sets ×1",
                "sets ×2",
                "elections ×2"
            ]
        );
    }

    #[test]
    fn backend_lists() {
        assert_eq!(selected("all").unwrap(), (Kind::ALL.to_vec(), false));
        assert_eq!(
            selected("redis,memory,zk").unwrap(),
            (vec![Kind::Memory, Kind::Redis, Kind::Zookeeper], true)
        );
        assert!(selected("redis,cockroach").is_err());
        assert!(selected(",").is_err());
    }
}
