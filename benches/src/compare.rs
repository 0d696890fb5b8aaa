//! `--compare BASELINE.json`: every figure of this run next to the same figure of an earlier
//! run's `lockbench.json`, so that a regression shows.
//!
//! Results are matched by backend, workload, client count and raw operation. The baseline
//! is read as plain JSON (not into [`Report`]), so a file from an older lockbench still
//! compares on the fields both runs have. Ratios to raw are the figures to trust on a shared
//! machine: absolute times drift with its load, a ratio measured in one run much less.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

use crate::report::{Report, fmt_rate, fmt_us};

/// A change beyond this fraction is marked better or worse.
const NOTABLE: f64 = 0.10;

/// How a figure reads: which direction is an improvement, and how it prints.
#[derive(Debug, Clone, Copy)]
enum Figure {
    /// Operations per second: higher is better.
    Rate,
    /// Microseconds: lower is better.
    Micros,
    /// A plain number where lower is better (ratio to raw, wake-ups per acquisition).
    Lower,
    /// A plain number where higher is better (Jain fairness, the share of terms observed).
    Higher,
}

/// The figures compared, in the order they are printed.
const FIGURES: &[(&str, Figure)] = &[
    ("ratio_to_raw", Figure::Lower),
    ("per_sec", Figure::Rate),
    ("p50_us", Figure::Micros),
    ("p99_us", Figure::Micros),
    ("max_wait_us", Figure::Micros),
    ("wakeups_per_acquire", Figure::Lower),
    ("jain", Figure::Higher),
    ("vs_two_singles", Figure::Lower),
    ("wait_vs_two_singles", Figure::Lower),
    ("wait_p50_us", Figure::Micros),
    ("wait_p99_us", Figure::Micros),
    ("lag_p50_us", Figure::Micros),
    ("lag_p99_us", Figure::Micros),
    ("observed_share", Figure::Higher),
];

/// Figures compared only for the workloads whose table shows them: elsewhere the wait is
/// not the headline (a contended run's is its hand-off, an uncontended one's half its cycle).
const ONLY_FOR: &[(&str, &[&str])] = &[
    ("wait_p50_us", &["semaphore", "sets"]),
    ("wait_p99_us", &["semaphore", "sets"]),
];

/// Whether `field` is compared for `scenario`.
fn compared(field: &str, scenario: &str) -> bool {
    ONLY_FOR
        .iter()
        .find(|(f, _)| *f == field)
        .is_none_or(|(_, scenarios)| scenarios.contains(&scenario))
}

impl Figure {
    fn show(self, v: f64) -> String {
        match self {
            Figure::Rate => fmt_rate(v),
            Figure::Micros => fmt_us(Some(v)),
            Figure::Lower | Figure::Higher => format!("{v:.2}"),
        }
    }

    fn lower_is_better(self) -> bool {
        matches!(self, Figure::Micros | Figure::Lower)
    }
}

/// Read and check a baseline before anything is measured, so a wrong path costs no run.
pub(crate) fn load(path: &Path) -> Result<Value, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("--compare {}: {e}", path.display()))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| format!("--compare {}: not JSON: {e}", path.display()))?;
    if !value.get("backends").is_some_and(Value::is_array) {
        return Err(format!(
            "--compare {}: not a lockbench.json (no `backends` list)",
            path.display()
        ));
    }
    Ok(value)
}

/// One result's identity: backend, workload, clients, raw operation.
type Id = (String, String, u64, String);

fn results(report: &Value) -> Vec<(Id, &Value)> {
    let mut out = Vec::new();
    for backend in report["backends"].as_array().into_iter().flatten() {
        let name = backend["backend"].as_str().unwrap_or_default().to_string();
        for r in backend["results"].as_array().into_iter().flatten() {
            if r["status"].as_str() != Some("ok") {
                continue;
            }
            let id = (
                name.clone(),
                r["scenario"].as_str().unwrap_or_default().to_string(),
                r["clients"].as_u64().unwrap_or_default(),
                r["op"].as_str().unwrap_or_default().to_string(),
            );
            out.push((id, r));
        }
    }
    out
}

/// The comparison table (Markdown), with a line for every result of this run that the
/// baseline lacks.
pub(crate) fn markdown(report: &Report, baseline: &Value) -> String {
    let now = match serde_json::to_value(report) {
        Ok(v) => v,
        Err(e) => return format!("\ncannot compare: {e}\n"),
    };
    let before = results(baseline);
    let mut out = String::from(
        "\n**Against the baseline** (change = now against then; marked where it moved by \
         more than 10 %):\n\n| backend | workload | figure | baseline | now | change |\n\
         |---|---|---|---:|---:|---:|\n",
    );
    let mut unmatched = Vec::new();
    for (id, r) in results(&now) {
        let Some((_, old)) = before.iter().find(|(b, _)| *b == id) else {
            unmatched.push(label(&id));
            continue;
        };
        for &(field, figure) in FIGURES.iter().filter(|(f, _)| compared(f, &id.1)) {
            let (Some(then), Some(now)) = (old[field].as_f64(), r[field].as_f64()) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {} | {} | {field} | {} | {} | {} |",
                id.0,
                workload(&id),
                figure.show(then),
                figure.show(now),
                change(figure, then, now)
            );
        }
    }
    if !unmatched.is_empty() {
        let _ = writeln!(out, "\nNot in the baseline: {}.", unmatched.join(", "));
    }
    out
}

fn workload(id: &Id) -> String {
    match (id.1.as_str(), id.3.as_str()) {
        ("raw", op) => format!("raw {op} ×{}", id.2),
        ("uncontended", _) => "uncontended".into(),
        (scenario, _) => format!("{scenario} ×{}", id.2),
    }
}

fn label(id: &Id) -> String {
    format!("{} {}", id.0, workload(id))
}

/// `+12.0 % worse`, `-3.1 %`, …: the relative change, judged by the figure's direction.
fn change(figure: Figure, then: f64, now: f64) -> String {
    if then == 0.0 {
        return if now == 0.0 { "=".into() } else { "new".into() };
    }
    let rel = (now - then) / then.abs();
    let worse = if figure.lower_is_better() {
        rel > NOTABLE
    } else {
        rel < -NOTABLE
    };
    let better = if figure.lower_is_better() {
        rel < -NOTABLE
    } else {
        rel > NOTABLE
    };
    let mark = if worse {
        " **worse**"
    } else if better {
        " better"
    } else {
        ""
    };
    format!("{:+.1} %{mark}", rel * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_longer_latency_is_worse_and_a_higher_rate_better() {
        assert_eq!(change(Figure::Micros, 100.0, 150.0), "+50.0 % **worse**");
        assert_eq!(change(Figure::Rate, 100.0, 150.0), "+50.0 % better");
        assert_eq!(change(Figure::Higher, 1.0, 0.8), "-20.0 % **worse**");
        assert_eq!(change(Figure::Lower, 2.0, 2.1), "+5.0 %");
        assert_eq!(change(Figure::Lower, 0.0, 0.0), "=");
    }

    #[test]
    fn results_match_on_backend_workload_clients_and_op() {
        let then = serde_json::json!({"backends": [{"backend": "redis", "results": [
            {"scenario": "raw", "clients": 1, "op": "cycle", "status": "ok", "p50_us": 100.0},
            {"scenario": "contended", "clients": 8, "status": "ok", "jain": 1.0},
            {"scenario": "contended", "clients": 32, "status": "failed"}
        ]}]});
        let ids: Vec<String> = results(&then).iter().map(|(id, _)| label(id)).collect();
        assert_eq!(ids, ["redis raw cycle ×1", "redis contended ×8"]);
    }

    #[test]
    fn waits_are_compared_where_their_table_shows_them() {
        assert!(compared("wait_p99_us", "sets") && compared("wait_p50_us", "semaphore"));
        assert!(!compared("wait_p50_us", "contended") && !compared("wait_p99_us", "spread"));
        assert!(compared("per_sec", "contended") && compared("vs_two_singles", "sets"));
    }

    #[test]
    fn a_file_without_backends_is_refused_before_any_run() {
        let dir = std::env::temp_dir().join(format!("lockbench-compare-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("x.json");
        std::fs::write(&path, "{\"machine\": {}}").unwrap();
        assert!(load(&path).unwrap_err().contains("no `backends` list"));
        std::fs::write(&path, "not json").unwrap();
        assert!(load(&path).unwrap_err().contains("not JSON"));
        assert!(load(&dir.join("missing.json")).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
