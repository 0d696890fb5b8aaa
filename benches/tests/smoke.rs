//! Smoke test: run the lockbench binary for about a second per measurement on every backend
//! it can reach, then check its JSON: every scenario for every measured backend (key sets
//! included, with their uncontended cost against single keys; elections where the backend
//! declares them), all of them ok, zero overlaps.
//!
//! An overlap fails the test at once. A measurement that fails otherwise (an error, or a
//! window that counted nothing: what a loaded shared machine's stall of a second can do to
//! an 800 ms window) is printed and measured once more, its backend alone; failing twice
//! fails the test.
//!
//! CI starts every server, so a backend compiled into lockbench *and* into `dlock` that does
//! not answer fails this test (naming `scripts/backends up <name>`). To run it against fewer
//! servers set `LOCKBENCH_SMOKE_BACKENDS=memory,redis` (the list lockbench is given, and
//! the list that must answer).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Command;

use serde_json::Value;

const SCENARIOS: [&str; 8] = [
    "raw",
    "uncontended",
    "contended",
    "spread",
    "read_mostly",
    "semaphore",
    "sets",
    "elections",
];

fn field<'a>(v: &'a Value, name: &str) -> &'a Value {
    v.get(name)
        .unwrap_or_else(|| panic!("lockbench.json lacks {name:?} in {v}"))
}

/// One lockbench run: its output and its JSON report.
struct Run {
    stdout: String,
    report: Value,
}

/// Run lockbench on `backends`; it must exit cleanly, or (code 1) with failed measurements
/// that its report lists.
fn lockbench(backends: &str) -> Run {
    let out = tempfile::tempdir().expect("temp dir");
    let run = Command::new(env!("CARGO_BIN_EXE_lockbench"))
        .args(["--backends", backends])
        .args(["--clients", "4", "--duration", "800ms", "--warmup", "100ms"])
        .args(["--rounds", "2"])
        .arg("--out")
        .arg(out.path())
        .output()
        .expect("run lockbench");
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    let failed_measurements = run.status.code() == Some(1) && stderr.contains("FAILED");
    assert!(
        run.status.success() || failed_measurements,
        "lockbench exited with {}\n--- stderr\n{stderr}\n--- stdout\n{stdout}",
        run.status
    );
    if !stderr.is_empty() {
        eprintln!("--- lockbench --backends {backends}: stderr\n{stderr}");
    }
    let json = std::fs::read_to_string(out.path().join("lockbench.json")).expect("lockbench.json");
    let report: Value = serde_json::from_str(&json).expect("lockbench.json is JSON");
    let svg = std::fs::read_to_string(out.path().join("lockbench.svg")).expect("lockbench.svg");
    assert!(
        svg.contains("<svg") && svg.contains("<text"),
        "the chart has no text"
    );
    Run { stdout, report }
}

/// The measured backends of a report.
fn measured(report: &Value) -> &Vec<Value> {
    field(report, "backends").as_array().expect("backends list")
}

/// Every measurement of `report` that saw two holders at once: never a stall's doing.
fn overlaps(report: &Value) -> Vec<String> {
    let mut found = Vec::new();
    for b in measured(report) {
        for r in field(b, "results").as_array().expect("results list") {
            if r["overlaps"].as_u64().is_some_and(|n| n > 0) {
                found.push(format!(
                    "{} {} ×{}: {}",
                    b["backend"], r["scenario"], r["clients"], r["overlaps"]
                ));
            }
        }
    }
    found
}

#[test]
fn lockbench_measures_every_reachable_backend_without_overlaps() {
    let restricted = std::env::var("LOCKBENCH_SMOKE_BACKENDS")
        .ok()
        .filter(|s| !s.trim().is_empty());
    let backends = restricted.clone().unwrap_or_else(|| "all".into());
    let first = lockbench(&backends);
    let report = &first.report;

    // What was not measured, and why.
    let mut unreachable = Vec::new();
    let mut compiled_out = Vec::new();
    for s in field(report, "skipped")
        .as_array()
        .expect("skipped is a list")
    {
        let name = field(s, "backend").as_str().unwrap_or_default().to_owned();
        let line = format!(
            "{name} ({})",
            field(s, "detail").as_str().unwrap_or_default()
        );
        match field(s, "reason").as_str() {
            Some("compiled_out") => compiled_out.push(line),
            Some("not_selected") => {}
            _ => {
                let start = s
                    .get("start_command")
                    .and_then(Value::as_str)
                    .map(|c| format!(" — start it with `{c}`"))
                    .unwrap_or_default();
                unreachable.push(format!("{line}{start}"));
            }
        }
    }
    eprintln!("lockbench smoke: not compiled in: {compiled_out:?}");
    assert!(
        unreachable.is_empty(),
        "backends compiled in but not reachable (set LOCKBENCH_SMOKE_BACKENDS to restrict the list): {unreachable:#?}"
    );
    if restricted.is_some() {
        // Everything asked for must be compiled in, too.
        assert!(
            compiled_out.is_empty(),
            "LOCKBENCH_SMOKE_BACKENDS names backends this build lacks: {compiled_out:?}"
        );
    }

    assert!(
        measured(report).iter().any(|b| b["backend"] == "memory"),
        "the memory backend always runs: {:?}",
        measured(report)
    );
    let overlapped = overlaps(report);
    assert!(
        overlapped.is_empty(),
        "two holders at once: {overlapped:#?}"
    );

    let mut names = Vec::new();
    let mut again = Vec::new();
    for b in measured(report) {
        let name = field(b, "backend").as_str().expect("backend name");
        names.push(name.to_owned());
        if let Err(e) = catch_unwind(AssertUnwindSafe(|| check(b, &first.stdout))) {
            let why = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_default();
            eprintln!("lockbench smoke: {name} failed a check ({why}); measuring it once more");
            again.push(name.to_owned());
        }
    }
    if again.is_empty() {
        assert!(
            field(report, "failures")
                .as_array()
                .is_some_and(Vec::is_empty)
        );
    } else {
        let second = lockbench(&again.join(","));
        let overlapped = overlaps(&second.report);
        assert!(
            overlapped.is_empty(),
            "two holders at once: {overlapped:#?}"
        );
        let remeasured: Vec<&str> = measured(&second.report)
            .iter()
            .filter_map(|b| b["backend"].as_str())
            .collect();
        assert_eq!(remeasured, again, "the second run measured other backends");
        for b in measured(&second.report) {
            check(b, &second.stdout);
        }
        assert!(
            field(&second.report, "failures")
                .as_array()
                .is_some_and(Vec::is_empty)
        );
    }
    eprintln!("lockbench smoke: measured {names:?}; measured again {again:?}");
}

/// Every scenario of backend `b` measured, ok, with its figures; `stdout` has its table row.
fn check(b: &Value, stdout: &str) {
    let name = field(b, "backend").as_str().expect("backend name");
    let results = field(b, "results").as_array().expect("results list");
    for scenario in SCENARIOS {
        assert!(
            results.iter().any(|r| r["scenario"] == scenario),
            "{name}: no {scenario} result in {results:#?}"
        );
    }
    // Key sets run everywhere: uncontended (one client) and with the 4 clients.
    let set_clients: Vec<u64> = results
        .iter()
        .filter(|r| r["scenario"] == "sets")
        .filter_map(|r| r["clients"].as_u64())
        .collect();
    assert_eq!(set_clients, [1, 4], "{name}: the key-set runs");
    let shared = b["capabilities"]["shared"] == true;
    let permits = b["capabilities"]["permits"] == true;
    let elections = b["capabilities"]["election"] != "unsupported";
    for r in results {
        let what = format!("{name} {} ×{}", r["scenario"], r["clients"]);
        // Read-mostly needs shared holds: measured where declared, reported
        // `unsupported` elsewhere, never failed.
        if r["scenario"] == "read_mostly" && !shared {
            assert_eq!(r["status"], "unsupported", "{what}");
            continue;
        }
        // Elections likewise; where measured, the observer's figures are there.
        if r["scenario"] == "elections" {
            if !elections {
                assert_eq!(r["status"], "unsupported", "{what}");
                continue;
            }
            assert_eq!(r["status"], "ok", "{what}: {}", r["error"]);
            assert!(
                r["observed_share"].as_f64().is_some() && r["jain"].as_f64().is_some(),
                "{what}: no observer share or fairness"
            );
        }
        // The semaphore likewise needs permits; where measured, it reached its cap.
        if r["scenario"] == "semaphore" {
            if !permits {
                assert_eq!(r["status"], "unsupported", "{what}");
                continue;
            }
            assert_eq!(r["status"], "ok", "{what}: {}", r["error"]);
            assert!(r["permits"].as_u64().is_some(), "{what}: no permits");
            assert_eq!(r["most_holders"], r["permits"], "{what}: the cap");
        }
        assert_eq!(r["status"], "ok", "{what}: {}", r["error"]);
        assert!(
            field(r, "count").as_u64().unwrap_or(0) > 0,
            "{what}: counted nothing"
        );
        if r["scenario"] != "raw" {
            assert_eq!(r["overlaps"], 0, "{what}: overlaps");
            assert!(
                field(r, "holds_checked").as_u64().unwrap_or(0) > 0,
                "{what}: the history checker saw no holds"
            );
            // A semaphore's and an election's rates are bounded by their holds, not by
            // round trips; a key set is set against single keys instead.
            assert!(
                r["scenario"] == "semaphore"
                    || r["scenario"] == "sets"
                    || r["scenario"] == "elections"
                    || r["ratio_to_raw"].as_f64().is_some_and(|x| x > 0.0),
                "{what}: no ratio to raw"
            );
        }
        // Run with `--rounds 2`: two rounds each, the one kept among them.
        if r["scenario"] == "uncontended" || r["scenario"] == "spread" {
            let rounds = r["round_ratios"].as_array().map(Vec::len);
            assert_eq!(rounds, Some(2), "{what}: the rounds' ratios");
            assert!(
                r["round_ratios"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|x| x.as_f64() == r["ratio_to_raw"].as_f64())),
                "{what}: the ratio kept is not a round's"
            );
        }
        // Raw cycles and the lock runs report the client's CPU per cycle.
        if r["op"] == "cycle" || r["scenario"] == "uncontended" || r["scenario"] == "spread" {
            assert!(
                r["client_cpu_us"].as_f64().is_some_and(|x| x > 0.0),
                "{what}: no client CPU per cycle"
            );
        }
        if r["scenario"] == "sets" {
            assert!(
                r["wait_p50_us"].as_f64().is_some() && r["wait_p99_us"].as_f64().is_some(),
                "{what}: no acquire_all wait"
            );
            // Every key of every set went through the checker.
            assert!(
                r["holds_checked"].as_u64() >= r["count"].as_u64().map(|n| n * 2),
                "{what}: fewer key holds checked than two per set"
            );
            if r["clients"] == 1 {
                for ratio in ["vs_two_singles", "wait_vs_two_singles"] {
                    assert!(
                        r[ratio].as_f64().is_some_and(|x| x > 0.0),
                        "{what}: no {ratio}"
                    );
                }
            }
        }
    }
    assert!(
        stdout.contains(&format!("| {name} |")),
        "{name} missing from the table:\n{stdout}"
    );
}
