//! The hold-many workload: one client takes N distinct keys, holds them with auto-renew
//! while lockbench stays idle, and releases them all.
//!
//! It measures what holding costs at scale: the acquire rate, the client's CPU while it only
//! renews, the server's requests per second meanwhile, and whether every lease survived
//! (`lost()` never fired) and released cleanly.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::{DistributedLock, Lease, LockOptions, LostSignal, Wait};
use futures::stream::{self, FuturesUnordered, StreamExt as _};
use serde::Serialize;
use tokio::time::{Instant, sleep};

use crate::backends::{self, Kind};
use crate::report::{BackendReport, Scenario, fmt_rate, fmt_us};
use crate::run::Plan;
use crate::server_load::{Counter, cpu_time};

/// Acquires (and releases) in flight at once.
pub(crate) const IN_FLIGHT: usize = 128;

/// What one hold-many run found. Times in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HoldMany {
    /// The N asked for (`--hold-many`).
    pub(crate) requested: usize,
    /// The keys tried: N, or the backend's `Capabilities::max_held` when lower.
    pub(crate) keys: usize,
    /// The backend's declared `max_held`, when it lowered N.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) capped_by_max_held: Option<usize>,
    pub(crate) in_flight: usize,
    pub(crate) acquired: usize,
    pub(crate) acquire_failures: usize,
    /// Keys not tried: after the first acquire failure no new acquire starts.
    pub(crate) not_tried: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) first_acquire_error: Option<String>,
    /// First acquire call → last acquire returned.
    pub(crate) acquire_ms: f64,
    /// Keys acquired per second over `acquire_ms`.
    pub(crate) acquire_per_sec: f64,
    /// The measured hold window.
    pub(crate) hold_ms: f64,
    /// This process's CPU time over the hold window ÷ its wall time, in % of one core.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpu_percent: Option<f64>,
    /// The server's counter delta over the hold window ÷ its wall time (server-wide).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) server_requests_per_sec: Option<f64>,
    /// The same counter's rate before anything was acquired, over a quarter of the hold
    /// (1–5 s): what the rest of the server's clients cause.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) server_idle_per_sec: Option<f64>,
    /// What the server counter is, or why there is none.
    pub(crate) server_counter: String,
    /// Leases whose `lost()` fired before their release was called.
    pub(crate) false_losses: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) first_loss: Option<String>,
    pub(crate) failed_releases: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) first_release_error: Option<String>,
    /// First release call → last release returned.
    pub(crate) release_ms: f64,
}

impl HoldMany {
    /// Why the run failed, if it did: any acquire failure, false loss or failed release.
    pub(crate) fn problem(&self) -> Option<String> {
        let mut parts = Vec::new();
        if self.acquire_failures > 0 {
            parts.push(format!(
                "{} of {} acquires failed, {} taken, {} not tried after that (first: {})",
                self.acquire_failures,
                self.keys,
                self.acquired,
                self.not_tried,
                self.first_acquire_error.as_deref().unwrap_or("?")
            ));
        }
        if self.false_losses > 0 {
            parts.push(format!(
                "{} of {} held leases fired lost() (first: {})",
                self.false_losses,
                self.acquired,
                self.first_loss.as_deref().unwrap_or("?")
            ));
        }
        if self.failed_releases > 0 {
            parts.push(format!(
                "{} of {} releases failed (first: {})",
                self.failed_releases,
                self.acquired,
                self.first_release_error.as_deref().unwrap_or("?")
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

/// One client (one `dlock::connect(url)`) takes `requested` keys (capped at the backend's
/// `max_held`), holds them for `hold_for` with auto-renew at the plan's ttl, watching every
/// lease's `lost()`, then releases them all.
pub(crate) async fn run(
    kind: Kind,
    url: &str,
    requested: usize,
    hold_for: Duration,
    plan: &Plan,
) -> Result<HoldMany, String> {
    let lock = backends::connect(url, plan.connect_timeout)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let max_held = lock.capabilities().max_held;
    let keys = max_held.map_or(requested, |max| max.min(requested));
    let mut counter = match Counter::open(kind, url, plan.connect_timeout).await {
        Ok(counter) => counter.map(|c| (c.describe().to_owned(), c)),
        Err(e) => {
            warn_no_counter(kind, &e);
            None
        }
    };
    let opts = LockOptions::new()
        .ttl(plan.ttl)
        .wait(Wait::For(Duration::from_secs(60)))
        .auto_renew(true);
    let names: Vec<String> = (0..keys)
        .map(|i| format!("{}/hold{requested}/{i}", plan.prefix))
        .collect();

    let timeout = plan.connect_timeout;
    let idle_window = (hold_for / 4).clamp(Duration::from_secs(1), Duration::from_secs(5));
    let server_idle_per_sec = match counter.as_mut() {
        Some((_, c)) => rate(c, idle_window, timeout).await,
        None => None,
    };

    let started = Instant::now();
    let (leases, acquire_errors) = acquire_all(&lock, names, opts).await;
    let acquire_time = started.elapsed();

    // One idle task awaits every lease's lost(), as an application protecting its work
    // would; it notes the first that fires.
    let first_loss = Arc::new(Mutex::new(None));
    let signals: Vec<_> = leases
        .iter()
        .map(|l| (l.key().to_owned(), l.lost_signal()))
        .collect();
    let watcher = tokio::spawn(watch(signals, first_loss.clone()));

    let counted_before = match counter.as_mut() {
        Some((_, c)) => c.read(timeout).await.ok(),
        None => None,
    };
    let (cpu_before, hold_start) = (cpu_time(), Instant::now());
    sleep(hold_for).await;
    let (cpu_after, held) = (cpu_time(), hold_start.elapsed());
    let counted = match (counter.as_mut(), counted_before) {
        (Some((_, c)), Some(before)) => c
            .read(timeout)
            .await
            .ok()
            .map(|after| after.saturating_sub(before + c.own_per_read())),
        _ => None,
    };

    let lost: Vec<&Lease> = leases.iter().filter(|l| l.is_lost()).collect();
    let false_losses = lost.len();
    let first_loss = first_loss
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .or_else(|| lost.first().map(|l| format!("{}: lost", l.key())));
    watcher.abort();

    let acquired = leases.len();
    let release_start = Instant::now();
    let release_errors = release_all(leases).await;
    let release_time = release_start.elapsed();

    let secs = held.as_secs_f64();
    Ok(HoldMany {
        requested,
        keys,
        capped_by_max_held: max_held.filter(|&max| max < requested),
        in_flight: IN_FLIGHT,
        acquired,
        acquire_failures: acquire_errors.len(),
        not_tried: keys - acquired - acquire_errors.len(),
        first_acquire_error: acquire_errors.into_iter().next(),
        acquire_ms: ms(acquire_time),
        acquire_per_sec: acquired as f64 / acquire_time.as_secs_f64().max(1e-9),
        hold_ms: ms(held),
        cpu_percent: cpu_before
            .zip(cpu_after)
            .map(|(b, a)| round2(a.saturating_sub(b).as_secs_f64() / secs * 100.0)),
        server_requests_per_sec: counted.map(|n| round2(n as f64 / secs)),
        server_idle_per_sec,
        server_counter: match (&counter, counted) {
            (Some((what, _)), Some(_)) => what.clone(),
            (Some((what, _)), None) => format!("{what}: not readable"),
            (None, _) => "n/a".to_owned(),
        },
        false_losses,
        first_loss,
        failed_releases: release_errors.len(),
        first_release_error: release_errors.into_iter().next(),
        release_ms: ms(release_time),
    })
}

fn warn_no_counter(kind: Kind, e: &str) {
    eprintln!("lockbench: {kind}: the server's request counter cannot be read: {e}");
}

/// The counter's rate over `window` from now, its own reads not counted.
async fn rate(counter: &mut Counter, window: Duration, timeout: Duration) -> Option<f64> {
    let before = counter.read(timeout).await.ok()?;
    let start = Instant::now();
    sleep(window).await;
    let after = counter.read(timeout).await.ok()?;
    let n = after.saturating_sub(before + counter.own_per_read());
    Some(round2(n as f64 / start.elapsed().as_secs_f64()))
}

fn ms(d: Duration) -> f64 {
    round2(d.as_secs_f64() * 1000.0)
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// Await every signal; note the first loss as `key: reason`.
async fn watch(signals: Vec<(String, LostSignal)>, first: Arc<Mutex<Option<String>>>) {
    let mut pending: FuturesUnordered<_> = signals
        .into_iter()
        .map(|(key, mut signal)| async move { (key, signal.lost().await) })
        .collect();
    while let Some((key, reason)) = pending.next().await {
        if let Some(reason) = reason {
            first
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get_or_insert_with(|| format!("{key}: {reason}"));
        }
    }
}

/// Take every key, [`IN_FLIGHT`] at a time: the leases and the errors (`key: error`).
/// After the first failure no new acquire starts: a backend at its limit (each failure
/// waiting out a connect timeout) is reported in one round, not one per key.
async fn acquire_all(
    lock: &Arc<dyn DistributedLock>,
    names: Vec<String>,
    opts: LockOptions,
) -> (Vec<Lease>, Vec<String>) {
    let failed = Arc::new(AtomicBool::new(false));
    let results: Vec<_> = stream::iter(names)
        .map(|key| {
            let (lock, failed) = (lock.clone(), failed.clone());
            async move {
                if failed.load(Ordering::SeqCst) {
                    return None;
                }
                let result = lock.acquire(&key, &opts).await;
                if result.is_err() {
                    failed.store(true, Ordering::SeqCst);
                }
                Some(result.map_err(|e| format!("{key}: {e}")))
            }
        })
        .buffer_unordered(IN_FLIGHT)
        .filter_map(|r| async move { r })
        .collect()
        .await;
    let mut leases = Vec::with_capacity(results.len());
    let mut errors = Vec::new();
    for result in results {
        match result {
            Ok(lease) => leases.push(lease),
            Err(e) => errors.push(e),
        }
    }
    (leases, errors)
}

/// Release every lease, [`IN_FLIGHT`] at a time: the errors (`key: error`).
async fn release_all(leases: Vec<Lease>) -> Vec<String> {
    stream::iter(leases)
        .map(|lease| async move {
            let key = lease.key().to_owned();
            lease.release().await.map_err(|e| format!("{key}: {e}"))
        })
        .buffer_unordered(IN_FLIGHT)
        .filter_map(|r| async move { r.err() })
        .collect()
        .await
}

/// The Markdown table of the hold-many results.
pub(crate) fn markdown(
    s: &mut String,
    backends: &[BackendReport],
    hold_for: Duration,
    ttl: Duration,
) {
    let _ = writeln!(
        s,
        "\n### Hold many: one client holds N keys for {}, auto-renewed at ttl {}\n",
        humantime::format_duration(hold_for),
        humantime::format_duration(ttl)
    );
    let _ = writeln!(
        s,
        "| backend | keys | acquire all | acquired/s | client CPU | server req/s | counter | false losses | failed releases | release all |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|");
    for b in backends {
        for r in b
            .results
            .iter()
            .filter(|r| r.scenario == Scenario::HoldMany)
        {
            let Some(h) = &r.hold_many else {
                let error = r.error.as_deref().unwrap_or("no result");
                let _ = writeln!(s, "| {} | **FAILED**: {error} | | | | | | | | |", b.backend);
                continue;
            };
            let mut keys = h.acquired.to_string();
            if h.acquire_failures > 0 {
                let _ = write!(
                    keys,
                    " of {} (**{} failed**, {} not tried)",
                    h.keys, h.acquire_failures, h.not_tried
                );
            }
            if let Some(max) = h.capped_by_max_held {
                let _ = write!(keys, " (max_held {max} < {})", h.requested);
            }
            let bold = |n: usize| {
                if n == 0 {
                    "0".to_owned()
                } else {
                    format!("**{n}**")
                }
            };
            let _ = writeln!(
                s,
                "| {} | {keys} | {} | {} | {} | {} | {} | {} | {} | {} |",
                b.backend,
                fmt_us(Some(h.acquire_ms * 1000.0)),
                fmt_rate(h.acquire_per_sec),
                h.cpu_percent.map_or("—".into(), |c| format!("{c:.1} %")),
                match (h.server_requests_per_sec, h.server_idle_per_sec) {
                    (Some(r), Some(idle)) => format!("{} (idle {})", fmt_rate(r), fmt_rate(idle)),
                    (Some(r), None) => fmt_rate(r),
                    _ => "n/a".into(),
                },
                h.server_counter,
                bold(h.false_losses),
                bold(h.failed_releases),
                fmt_us(Some(h.release_ms * 1000.0)),
            );
        }
    }
    let _ = writeln!(
        s,
        "\nclient CPU: lockbench's own CPU time over the hold window ÷ its wall time (% of one \
         core; lockbench is idle meanwhile). server req/s: the server's counter over the same \
         window, server-wide (other clients of the server count too; idle: the same counter \
         before anything was acquired). {IN_FLIGHT} acquires \
         (releases) in flight."
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            duration: Duration::from_millis(300),
            warmup: Duration::ZERO,
            hold: Duration::ZERO,
            connect_timeout: Duration::from_secs(10),
            ttl: Duration::from_millis(600),
            prefix: format!("lbtest{:08x}", rand::random::<u32>()),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn holds_every_key_through_renewals_and_releases_them() {
        let h = run(
            Kind::Memory,
            "memory://hold-many-test",
            500,
            Duration::from_millis(1500),
            &plan(),
        )
        .await
        .expect("hold-many on memory");
        assert_eq!((h.keys, h.acquired, h.acquire_failures), (500, 500, 0));
        assert_eq!((h.false_losses, h.failed_releases), (0, 0), "{h:?}");
        assert!(h.problem().is_none());
        assert!(h.hold_ms >= 1500.0 && h.cpu_percent.is_some(), "{h:?}");
        assert_eq!(h.server_counter, "n/a");
    }

    #[test]
    fn any_loss_or_failed_release_is_a_problem() {
        let mut h = HoldMany {
            requested: 10,
            keys: 10,
            capped_by_max_held: None,
            in_flight: IN_FLIGHT,
            acquired: 10,
            acquire_failures: 0,
            not_tried: 0,
            first_acquire_error: None,
            acquire_ms: 1.0,
            acquire_per_sec: 1.0,
            hold_ms: 1.0,
            cpu_percent: None,
            server_requests_per_sec: None,
            server_idle_per_sec: None,
            server_counter: "n/a".into(),
            false_losses: 0,
            first_loss: None,
            failed_releases: 0,
            first_release_error: None,
            release_ms: 1.0,
        };
        assert!(h.problem().is_none());
        h.false_losses = 2;
        h.failed_releases = 1;
        let problem = h.problem().expect("a problem");
        assert!(
            problem.contains("2 of 10 held leases fired lost()"),
            "{problem}"
        );
        assert!(problem.contains("1 of 10 releases failed"), "{problem}");
    }
}
