//! The results: the JSON document, and the Markdown tables printed on stdout.

use std::fmt::Write as _;
use std::time::Duration;

use dlock::{Capabilities, Expiry, Fencing, Wakeup};
use serde::Serialize;

use crate::backends::{Kind, Skipped};
use crate::hold_many::HoldMany;
use crate::stats::{Histogram, jain};

/// Everything one lockbench run found; written as `lockbench.json`.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) lockbench: &'static str,
    /// Seconds since the Unix epoch when the run started.
    pub(crate) started_unix: u64,
    pub(crate) machine: Machine,
    pub(crate) config: Config,
    pub(crate) backends: Vec<BackendReport>,
    pub(crate) skipped: Vec<Skipped>,
    pub(crate) failures: Vec<Failure>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Machine {
    pub(crate) cores: usize,
    pub(crate) cpu: String,
    pub(crate) os: String,
}

impl Machine {
    pub(crate) fn detect() -> Self {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("model name"))
                    .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_owned());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| format!(" {}", s.trim()))
            .unwrap_or_default();
        Self {
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            cpu,
            os: format!("{}{kernel}", std::env::consts::OS),
        }
    }
}

#[derive(Debug, Serialize)]
pub(crate) struct Config {
    pub(crate) duration_ms: u64,
    pub(crate) warmup_ms: u64,
    pub(crate) hold_ms: u64,
    pub(crate) ttl_ms: u64,
    pub(crate) clients: Vec<usize>,
    pub(crate) prefix: String,
    /// `--hold-many`: when set, the run measured only the hold-many workload.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hold_many: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hold_for_ms: Option<u64>,
    /// `--rounds`: the pairs measured for each uncontended and spread ratio.
    pub(crate) rounds: usize,
}

#[derive(Debug, Serialize)]
pub(crate) struct BackendReport {
    pub(crate) backend: Kind,
    /// The URL, password redacted.
    pub(crate) url: String,
    pub(crate) server: String,
    pub(crate) capabilities: Caps,
    /// What the raw "ping" and "cycle" are on this server.
    pub(crate) raw_ping: Option<&'static str>,
    pub(crate) raw_cycle: &'static str,
    pub(crate) results: Vec<ScenarioResult>,
}

#[derive(Debug, Serialize)]
pub(crate) struct Caps {
    pub(crate) fair: bool,
    pub(crate) fencing: String,
    pub(crate) expiry: String,
    pub(crate) wakeup: String,
    /// Shared (read) holds beside exclusive ones.
    pub(crate) shared: bool,
    /// Permit (semaphore) holds.
    pub(crate) permits: bool,
    /// Elections, and how observers learn of a new leader: `unsupported`,
    /// `woken (recheck 500 ms)`, `polled every 250 ms`.
    pub(crate) election: String,
}

impl From<Capabilities> for Caps {
    fn from(c: Capabilities) -> Self {
        Self {
            fair: c.fair,
            fencing: match c.fencing {
                Fencing::None => "none".into(),
                Fencing::BestEffort { why } => format!("best-effort ({why})"),
                Fencing::Strict => "strict".into(),
            },
            expiry: match c.expiry {
                Expiry::Ttl => "ttl".into(),
                Expiry::Session { timeout } => format!("session {timeout:?}"),
            },
            wakeup: match c.wakeup {
                Wakeup::Polling => "polling".into(),
                Wakeup::Notification {
                    one_per_release: true,
                    ..
                } => "notification, one per release".into(),
                Wakeup::Notification {
                    one_per_release: false,
                    ..
                } => "notification, all waiters".into(),
            },
            shared: c.shared,
            permits: c.permits,
            election: crate::elections::observe_label(c.election),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Scenario {
    Raw,
    Uncontended,
    Contended,
    Spread,
    /// N clients on one key, nine shared holds in ten.
    #[serde(rename = "read_mostly")]
    ReadMostly,
    /// N clients on one key, every hold one of N/4 permits.
    Semaphore,
    /// N clients on eight keys, each hold a random set of two (`acquire_all`).
    Sets,
    /// N candidates campaigning in one election, one observer following it.
    Elections,
    /// One client holding `--hold-many` keys.
    #[serde(rename = "hold_many")]
    HoldMany,
    /// One client re-entering a key its owner holds.
    Reentrant,
}

impl Scenario {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Scenario::Raw => "raw",
            Scenario::Uncontended => "uncontended",
            Scenario::Contended => "contended",
            Scenario::Spread => "spread",
            Scenario::ReadMostly => "read-mostly",
            Scenario::Semaphore => "semaphore",
            Scenario::Sets => "sets",
            Scenario::Elections => "elections",
            Scenario::HoldMany => "hold-many",
            Scenario::Reentrant => "reentrant",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    Ok,
    Failed,
    /// The backend does not declare what the workload needs (shared holds, permits,
    /// elections).
    Unsupported,
}

/// One measurement. Latencies are in microseconds; a failed measurement has no numbers.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ScenarioResult {
    pub(crate) scenario: Scenario,
    pub(crate) clients: usize,
    /// For `raw`: `ping` or `cycle`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) op: Option<&'static str>,
    pub(crate) status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
    /// Operations (raw) or acquisitions (lock scenarios) in the measured window.
    pub(crate) count: u64,
    pub(crate) per_sec: f64,
    /// raw: one operation; uncontended and spread: acquire + release; contended: hand-off;
    /// elections: hand-over (`resign` call → the next `campaign` returned).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) p99_us: Option<f64>,
    /// acquire call → acquire returned.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) wait_p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) wait_p99_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_wait_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) per_client: Option<Vec<u64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) jain: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) wakeups_per_acquire: Option<f64>,
    /// Raw results and the lock workloads of `run::lock` (spread's N keys included): this
    /// process's CPU time over the measured window (user + system, every thread) per
    /// operation or acquisition, in µs to 0.01: the client's side of the cost,
    /// lockbench's own bookkeeping included.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) client_cpu_us: Option<f64>,
    /// How many times the server's raw operations this costs (see the README).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ratio_to_raw: Option<f64>,
    /// Uncontended and spread: the ratio of each round (a raw cycle, then this run), in
    /// order; the round kept is the median one, whose ratio is `ratio_to_raw`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) round_ratios: Option<Vec<f64>>,
    /// Holds the conformance history checker saw; present for lock scenarios.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) holds_checked: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) overlaps: Option<usize>,
    /// Semaphore: the permits each hold took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) permits: Option<u32>,
    /// Semaphore: the most holders of the key at once (must equal `permits`; more is a
    /// violation the history checker reports).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) most_holders: Option<usize>,
    /// Sets with one client: the set's cycle p50 ÷ twice the uncontended single-key cycle
    /// p50 of the same run (about 1 when a set of two costs two single keys).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) vs_two_singles: Option<f64>,
    /// Sets with one client: `acquire_all` p50 ÷ twice the uncontended `acquire` p50.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) wait_vs_two_singles: Option<f64>,
    /// Elections: a `campaign` returned → the observer reported that term, over the terms
    /// it reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lag_p50_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lag_p99_us: Option<f64>,
    /// Elections: the terms of the window the observer reported.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) terms_observed: Option<u64>,
    /// Elections: `terms_observed` ÷ `count` (1 when the observer saw every leader).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) observed_share: Option<f64>,
    /// The hold-many figures (present even when the run failed, for what it did hold).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hold_many: Option<HoldMany>,
}

fn us(d: Option<Duration>) -> Option<f64> {
    d.map(|d| d.as_nanos() as f64 / 1000.0)
}

impl ScenarioResult {
    pub(crate) fn new(scenario: Scenario, clients: usize) -> Self {
        Self {
            scenario,
            clients,
            op: None,
            status: Status::Ok,
            error: None,
            count: 0,
            per_sec: 0.0,
            p50_us: None,
            p99_us: None,
            wait_p50_us: None,
            wait_p99_us: None,
            max_wait_us: None,
            per_client: None,
            jain: None,
            wakeups_per_acquire: None,
            client_cpu_us: None,
            ratio_to_raw: None,
            round_ratios: None,
            holds_checked: None,
            overlaps: None,
            permits: None,
            most_holders: None,
            vs_two_singles: None,
            wait_vs_two_singles: None,
            lag_p50_us: None,
            lag_p99_us: None,
            terms_observed: None,
            observed_share: None,
            hold_many: None,
        }
    }

    pub(crate) fn failed(mut self, error: String, overlaps: Option<usize>) -> Self {
        self.status = Status::Failed;
        self.error = Some(error);
        self.overlaps = overlaps;
        self
    }

    /// Not measured: the backend does not declare what the workload needs.
    pub(crate) fn unsupported(mut self) -> Self {
        self.status = Status::Unsupported;
        self
    }

    pub(crate) fn latency(mut self, h: &Histogram) -> Self {
        self.p50_us = us(h.quantile(0.5));
        self.p99_us = us(h.quantile(0.99));
        self
    }

    pub(crate) fn waits(mut self, h: &Histogram) -> Self {
        self.wait_p50_us = us(h.quantile(0.5));
        self.wait_p99_us = us(h.quantile(0.99));
        self.max_wait_us = us((h.count() > 0).then(|| h.max()));
        self
    }

    /// The observer's lag and what share of `count` terms it saw (set `count` first).
    pub(crate) fn observed(mut self, lag: &Histogram, terms: u64) -> Self {
        self.lag_p50_us = us(lag.quantile(0.5));
        self.lag_p99_us = us(lag.quantile(0.99));
        self.terms_observed = Some(terms);
        self.observed_share =
            (self.count > 0).then(|| (terms as f64 / self.count as f64 * 1000.0).round() / 1000.0);
        self
    }

    pub(crate) fn fairness(mut self, per_client: Vec<u64>) -> Self {
        self.jain = Some((jain(&per_client) * 1000.0).round() / 1000.0);
        self.per_client = Some(per_client);
        self
    }

    pub(crate) fn ok(&self) -> bool {
        self.status == Status::Ok
    }
}

/// A measurement that failed, for the summary.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Failure {
    pub(crate) backend: Kind,
    pub(crate) scenario: Scenario,
    pub(crate) clients: usize,
    pub(crate) error: String,
}

impl BackendReport {
    pub(crate) fn find(
        &self,
        scenario: Scenario,
        clients: usize,
        op: Option<&str>,
    ) -> Option<&ScenarioResult> {
        self.results
            .iter()
            .find(|r| r.scenario == scenario && r.clients == clients && r.op == op)
    }

    /// The raw cycle at `clients`, when it was measured successfully.
    pub(crate) fn raw_cycle(&self, clients: usize) -> Option<&ScenarioResult> {
        self.find(Scenario::Raw, clients, Some("cycle"))
            .filter(|r| r.ok())
    }

    /// Fill in `ratio_to_raw` on every lock result from the raw results of this run, and
    /// the uncontended set's cost against two single keys from this run's uncontended one.
    pub(crate) fn compute_ratios(&mut self) {
        let raw_p50 = self.raw_cycle(1).and_then(|r| r.p50_us);
        let single = self
            .find(Scenario::Uncontended, 1, None)
            .filter(|r| r.ok())
            .map(|r| (r.p50_us, r.wait_p50_us));
        let raw_rates: Vec<(usize, f64)> = self
            .results
            .iter()
            .filter(|r| r.scenario == Scenario::Raw && r.op == Some("cycle") && r.ok())
            .map(|r| (r.clients, r.per_sec))
            .collect();
        for r in self.results.iter_mut().filter(|r| r.ok()) {
            if r.scenario == Scenario::Sets && r.clients == 1 {
                let two = |set: Option<f64>, one: Option<f64>| match (set, one) {
                    (Some(set), Some(one)) if one > 0.0 => {
                        Some((set / (2.0 * one) * 100.0).round() / 100.0)
                    }
                    _ => None,
                };
                if let Some((cycle, wait)) = single {
                    r.vs_two_singles = two(r.p50_us, cycle);
                    r.wait_vs_two_singles = two(r.wait_p50_us, wait);
                }
            }
            r.ratio_to_raw = match r.scenario {
                Scenario::Raw
                | Scenario::HoldMany
                | Scenario::Semaphore
                | Scenario::Sets
                | Scenario::Elections => None,
                Scenario::Uncontended | Scenario::Contended | Scenario::Reentrant => {
                    latency_ratio(r.p50_us, raw_p50)
                }
                Scenario::Spread | Scenario::ReadMostly => raw_rates
                    .iter()
                    .find(|(n, _)| *n == r.clients)
                    .and_then(|&(_, raw)| rate_ratio(raw, r.per_sec)),
            }
            .map(|x| (x * 100.0).round() / 100.0);
        }
    }
}

/// A latency ratio to raw: the lock's p50 over the raw cycle's. `None` without both.
fn latency_ratio(lock_p50: Option<f64>, raw_p50: Option<f64>) -> Option<f64> {
    match (lock_p50, raw_p50) {
        (Some(lock), Some(raw)) if raw > 0.0 => Some(lock / raw),
        _ => None,
    }
}

/// A throughput ratio to raw: the raw cycle's rate over the lock's. `None` when the lock
/// made no cycle.
fn rate_ratio(raw_per_sec: f64, lock_per_sec: f64) -> Option<f64> {
    (lock_per_sec > 0.0).then(|| raw_per_sec / lock_per_sec)
}

/// The ratio to raw of one round (a raw cycle, then a lock run), by the formula
/// [`BackendReport::compute_ratios`] uses for the lock run's scenario: a rate ratio for
/// spread, a latency ratio otherwise. `None` when either failed or has no figure.
pub(crate) fn round_ratio(raw: &ScenarioResult, lock: &ScenarioResult) -> Option<f64> {
    if !raw.ok() || !lock.ok() {
        return None;
    }
    match lock.scenario {
        Scenario::Spread => rate_ratio(raw.per_sec, lock.per_sec),
        _ => latency_ratio(lock.p50_us, raw.p50_us),
    }
}

/// `cpu` spread over `ops` operations, in µs to 0.01 (an in-memory raw cycle costs about
/// 0.1 µs); `None` without either.
pub(crate) fn per_op_us(cpu: Option<Duration>, ops: u64) -> Option<f64> {
    let cpu = cpu?;
    (ops > 0).then(|| (cpu.as_secs_f64() * 1e6 / ops as f64 * 100.0).round() / 100.0)
}

/// The index of the median of `ratios` (of an even count the upper middle one: a ratio
/// is a cost, so the pick never flatters), `None` when there are none.
pub(crate) fn median_index(ratios: &[f64]) -> Option<usize> {
    let mut order: Vec<usize> = (0..ratios.len()).collect();
    order.sort_by(|&a, &b| ratios[a].total_cmp(&ratios[b]));
    order.get(ratios.len() / 2).copied()
}

/// `1.2 µs`, `340 µs`, `12.3 ms`.
pub(crate) fn fmt_us(us: Option<f64>) -> String {
    let Some(us) = us else { return "—".into() };
    if us < 1.0 {
        format!("{:.0} ns", us * 1000.0)
    } else if us < 10.0 {
        format!("{us:.1} µs")
    } else if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 10_000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else if us < 1_000_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1_000_000.0)
    }
}

/// `1,234,567/s`.
pub(crate) fn fmt_rate(per_sec: f64) -> String {
    let n = per_sec.round() as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

pub(crate) fn fmt_ratio(r: Option<f64>) -> String {
    r.map_or("—".into(), |r| format!("{r:.2}×"))
}

pub(crate) fn failed_cell(r: &ScenarioResult) -> String {
    let overlaps = r
        .overlaps
        .filter(|&n| n > 0)
        .map(|n| format!(" ({n} overlaps)"))
        .unwrap_or_default();
    format!("**FAILED**{overlaps}")
}

impl Report {
    /// The Markdown shown on stdout.
    pub(crate) fn markdown(&self) -> String {
        let mut s = String::new();
        let m = &self.machine;
        let c = &self.config;
        let _ = writeln!(s, "## lockbench {}\n", self.lockbench);
        let _ = writeln!(s, "- machine: {} cores, {}, {}", m.cores, m.cpu, m.os);
        if let (Some(n), Some(hold_for)) = (c.hold_many, c.hold_for_ms) {
            let _ = writeln!(
                s,
                "- run: hold-many, {n} keys held for {} by one client, ttl {}",
                humantime::format_duration(Duration::from_millis(hold_for)),
                humantime::format_duration(Duration::from_millis(c.ttl_ms)),
            );
        } else {
            let _ = writeln!(
                s,
                "- run: {} per measurement after a {} warm-up, hold {}, ttl {}, clients {}",
                humantime::format_duration(Duration::from_millis(c.duration_ms)),
                humantime::format_duration(Duration::from_millis(c.warmup_ms)),
                humantime::format_duration(Duration::from_millis(c.hold_ms)),
                humantime::format_duration(Duration::from_millis(c.ttl_ms)),
                c.clients
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            );
        }
        for b in &self.backends {
            let _ = writeln!(s, "- {}: {} at `{}`", b.backend, b.server, b.url);
        }
        if let (Some(_), Some(hold_for)) = (c.hold_many, c.hold_for_ms) {
            let hold_for = Duration::from_millis(hold_for);
            crate::hold_many::markdown(
                &mut s,
                &self.backends,
                hold_for,
                Duration::from_millis(c.ttl_ms),
            );
        } else {
            self.lock_tables(&mut s);
        }
        self.skipped_and_failures(&mut s);
        s
    }

    /// What was not measured, and what failed.
    fn skipped_and_failures(&self, s: &mut String) {
        let skipped: Vec<_> = self
            .skipped
            .iter()
            .filter(|k| k.reason != crate::backends::SkipReason::NotSelected)
            .collect();
        if !skipped.is_empty() {
            let _ = writeln!(s, "\n### Not measured\n");
            for k in skipped {
                let reason = serde_json::to_value(k.reason)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default();
                let start = k
                    .start_command
                    .map(|c| format!(" — start it with `{c}`"))
                    .unwrap_or_default();
                let _ = writeln!(s, "- {}: {reason}: {}{start}", k.backend, k.detail);
            }
        }
        if !self.failures.is_empty() {
            let _ = writeln!(s, "\n### FAILURES\n");
            for f in &self.failures {
                let _ = writeln!(
                    s,
                    "- {} {} ×{}: {}",
                    f.backend,
                    f.scenario.name(),
                    f.clients,
                    f.error
                );
            }
        }
    }
}

#[cfg(test)]
#[path = "report_tests.rs"]
mod tests;
