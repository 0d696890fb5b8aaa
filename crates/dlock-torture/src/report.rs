//! The report: Markdown for people (stdout), JSON for tools (`--report FILE`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use dlock_core::{Capabilities, Expiry, Fencing};
use serde::Serialize;

use crate::check::{Analysis, Violation};
use crate::clock::ms;
use crate::coordinator::{Config, Timings};
use crate::faults::{FaultKind, FaultRec, safety_name};
use crate::key_sets::SetSweep;
use crate::store::{HoldRec, State};

/// The final check: keys free for a fresh client once every worker is gone.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct FinalCheck {
    pub(crate) keys: usize,
    pub(crate) free_at_once: usize,
    /// Whether the servers' own lock state was read (keys, nodes, rows under the run's stem).
    pub(crate) residue_checked: bool,
    /// What was left there.
    pub(crate) residue: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Declared {
    pub(crate) fencing: String,
    pub(crate) expiry: String,
    pub(crate) holder_paused: &'static str,
    pub(crate) server_restart: &'static str,
    pub(crate) member_down: &'static str,
    pub(crate) member_cut: &'static str,
    pub(crate) slow_link: &'static str,
    pub(crate) clock_jump: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct FaultOut {
    pub(crate) kind: FaultKind,
    /// Seconds since the run started.
    pub(crate) at_s: f64,
    pub(crate) duration_ms: f64,
    /// The worker process hit, for kill, pause and partition.
    pub(crate) victim: Option<u32>,
    /// Keys the victim held when hit.
    pub(crate) held: Vec<String>,
    /// Units stopped, for restart and member; the member hit, for cut, slow, loss and
    /// clock; the offset, for client-clock.
    pub(crate) units: Vec<String>,
    /// From the fault's start until another process held each key the victim held (the
    /// slowest key).
    pub(crate) takeover_ms: Option<f64>,
    /// From the fault's end until a lock was acquired again.
    pub(crate) recovery_ms: Option<f64>,
    /// From the fault's end until every key had been acquired again (includes the rest of
    /// the holds that were running).
    pub(crate) all_keys_ms: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct KindOut {
    pub(crate) injected: usize,
    pub(crate) declared: &'static str,
    /// Pairs of overlapping holds the fenced store kept apart.
    pub(crate) fenced_overlaps: usize,
    /// Holders that overlapped a later one and were fenced off.
    pub(crate) stale_holders: usize,
    pub(crate) takeover_ms_max: Option<f64>,
    pub(crate) recovery_ms_median: Option<f64>,
    pub(crate) recovery_ms_max: Option<f64>,
    pub(crate) all_keys_ms_max: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) backend: &'static str,
    pub(crate) url: String,
    pub(crate) seed: u64,
    pub(crate) duration_s: f64,
    pub(crate) workers: usize,
    pub(crate) tasks: usize,
    pub(crate) clients: usize,
    pub(crate) keys: usize,
    pub(crate) ttl_ms: f64,
    pub(crate) pause_and_partition_ms: f64,
    pub(crate) declared: Declared,
    /// What each hold took: `locks`, `semaphore of N permits`, or `key sets of up to K`.
    pub(crate) workload: String,
    pub(crate) holds: usize,
    /// Of `holds`, the shared (read) ones (0 where the backend declares no shared holds).
    pub(crate) shared_holds: usize,
    /// The semaphore workload's limit (`--permits`), if it ran.
    pub(crate) permits: Option<u32>,
    /// Of `holds`, the permit (semaphore) ones.
    pub(crate) permit_holds: usize,
    /// Per key, the most permit holders at once (not counting holders a declared fault may
    /// have left stale): equal to `permits` when the run really overlapped.
    pub(crate) most_permit_holders: BTreeMap<String, usize>,
    /// The key-set workload's largest set (`--key-sets`), if it ran.
    pub(crate) key_sets: Option<usize>,
    /// Sets granted by `acquire_all` (each set counts once; each of its keys is one of
    /// `holds`).
    pub(crate) sets_taken: usize,
    /// Of `sets_taken`, the shared ones.
    pub(crate) shared_sets: usize,
    /// Sets granted, by how many keys they held.
    pub(crate) sets_by_size: BTreeMap<usize, usize>,
    /// The longest stretch without a set granted, until the workers were told to stop.
    pub(crate) longest_set_stall_ms: Option<f64>,
    pub(crate) holds_per_key: BTreeMap<String, usize>,
    pub(crate) leases_lost: usize,
    /// Re-entries into reentrant holds that got the hold's token (the reentry workload).
    pub(crate) reentries: u64,
    pub(crate) writes_accepted: usize,
    pub(crate) writes_rejected: usize,
    pub(crate) acquire_errors: BTreeMap<String, u64>,
    pub(crate) acquire_error_samples: BTreeMap<String, String>,
    pub(crate) release_outcomes: BTreeMap<String, u64>,
    pub(crate) by_kind: BTreeMap<FaultKind, KindOut>,
    pub(crate) not_injected: BTreeMap<FaultKind, String>,
    pub(crate) faults: Vec<FaultOut>,
    pub(crate) final_check: FinalCheck,
    pub(crate) violations: Vec<Violation>,
    pub(crate) passed: bool,
}

pub(crate) struct Inputs<'a> {
    pub(crate) backend: &'static str,
    pub(crate) url: String,
    pub(crate) cfg: &'a Config,
    pub(crate) caps: &'a Capabilities,
    pub(crate) timings: &'a Timings,
    pub(crate) state: &'a State,
    pub(crate) holds: &'a [HoldRec],
    pub(crate) faults: &'a [FaultRec],
    pub(crate) analysis: &'a Analysis,
    /// The key-set workload's summary, if it ran.
    pub(crate) sets: Option<&'a SetSweep>,
    pub(crate) not_injected: &'a [(FaultKind, String)],
    pub(crate) final_check: FinalCheck,
    pub(crate) violations: Vec<Violation>,
    pub(crate) t0: u64,
    pub(crate) run_end: u64,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn max(v: impl IntoIterator<Item = f64>) -> Option<f64> {
    v.into_iter().reduce(f64::max)
}

impl Report {
    pub(crate) fn build(i: Inputs<'_>) -> Self {
        let caps = i.caps;
        let faults: Vec<FaultOut> = i
            .faults
            .iter()
            .map(|f| {
                let takeovers: Vec<f64> = f
                    .takeovers
                    .iter()
                    .filter_map(|(_, t)| t.map(|t| ms(t.saturating_sub(f.start))))
                    .collect();
                FaultOut {
                    kind: f.kind,
                    at_s: ms(f.start.saturating_sub(i.t0)) / 1000.0,
                    duration_ms: ms(f.end - f.start),
                    victim: f.victim.as_ref().map(|v| v.process),
                    held: f
                        .victim
                        .as_ref()
                        .map(|v| v.held.clone())
                        .unwrap_or_default(),
                    units: f.units.clone(),
                    takeover_ms: max(takeovers),
                    recovery_ms: f.first_acquire.map(|t| ms(t.saturating_sub(f.end))),
                    all_keys_ms: f.recovered.map(|t| ms(t.saturating_sub(f.end))),
                }
            })
            .collect();
        let mut by_kind = BTreeMap::new();
        for kind in FaultKind::ALL {
            let of: Vec<&FaultOut> = faults.iter().filter(|f| f.kind == kind).collect();
            if of.is_empty() {
                continue;
            }
            by_kind.insert(
                kind,
                KindOut {
                    injected: of.len(),
                    declared: safety_name(kind.declared(&caps.faults)),
                    fenced_overlaps: i.analysis.fenced_overlaps.get(&kind).copied().unwrap_or(0),
                    stale_holders: i.analysis.stale_holders.get(&kind).map_or(0, BTreeSet::len),
                    takeover_ms_max: max(of.iter().filter_map(|f| f.takeover_ms)),
                    recovery_ms_median: median(of.iter().filter_map(|f| f.recovery_ms).collect()),
                    recovery_ms_max: max(of.iter().filter_map(|f| f.recovery_ms)),
                    all_keys_ms_max: max(of.iter().filter_map(|f| f.all_keys_ms)),
                },
            );
        }
        let mut holds_per_key = BTreeMap::new();
        for h in i.holds {
            *holds_per_key.entry(h.key.clone()).or_default() += 1;
        }
        let accepted = i.state.log.iter().filter(|w| w.accepted).count();
        Report {
            backend: i.backend,
            url: i.url,
            seed: i.cfg.seed,
            duration_s: ms(i.run_end - i.t0) / 1000.0,
            workers: i.cfg.workers,
            tasks: i.cfg.tasks,
            clients: i.cfg.clients,
            keys: i.cfg.keys,
            ttl_ms: i.cfg.ttl.as_secs_f64() * 1000.0,
            pause_and_partition_ms: i.timings.fault_hold.as_secs_f64() * 1000.0,
            declared: Declared {
                fencing: match caps.fencing {
                    Fencing::None => "none".to_owned(),
                    Fencing::BestEffort { .. } => "best effort".to_owned(),
                    Fencing::Strict => "strict".to_owned(),
                },
                expiry: match caps.expiry {
                    Expiry::Ttl => "ttl".to_owned(),
                    Expiry::Session { timeout } => format!("session ({timeout:?})"),
                },
                holder_paused: safety_name(caps.faults.holder_paused),
                server_restart: safety_name(caps.faults.server_restart),
                member_down: safety_name(caps.faults.member_down),
                member_cut: safety_name(caps.faults.member_cut),
                slow_link: safety_name(caps.faults.slow_link),
                clock_jump: safety_name(caps.faults.clock_jump),
            },
            workload: match (i.cfg.permits, i.cfg.key_sets) {
                (Some(n), _) => format!("semaphore of {n} permits"),
                (None, Some(k)) => format!("key sets of up to {k}"),
                (None, None) if i.cfg.election => "elections".to_owned(),
                (None, None) if i.cfg.reentry => "reentrant holds".to_owned(),
                (None, None) => "locks".to_owned(),
            },
            holds: i.analysis.holds,
            shared_holds: i.holds.iter().filter(|h| h.shared).count(),
            permits: i.cfg.permits,
            permit_holds: i.holds.iter().filter(|h| h.permits.is_some()).count(),
            most_permit_holders: i.analysis.most_permit_holders.clone(),
            key_sets: i.cfg.key_sets,
            sets_taken: i.sets.map_or(0, |s| s.sets),
            shared_sets: i.sets.map_or(0, |s| s.shared_sets),
            sets_by_size: i.sets.map(|s| s.by_size.clone()).unwrap_or_default(),
            longest_set_stall_ms: i.sets.map(|s| ms(s.longest_stall)),
            holds_per_key,
            leases_lost: i.holds.iter().filter(|h| h.lost_at.is_some()).count(),
            reentries: i.state.reentries,
            writes_accepted: accepted,
            writes_rejected: i.state.log.len() - accepted,
            acquire_errors: i.state.acquire_errors.clone(),
            acquire_error_samples: i.state.error_samples.clone(),
            release_outcomes: i.state.release_outcomes.clone(),
            by_kind,
            not_injected: i.not_injected.iter().cloned().collect(),
            faults,
            final_check: i.final_check,
            passed: i.violations.is_empty(),
            violations: i.violations,
        }
    }

    pub(crate) fn markdown(&self) -> String {
        let mut md = String::new();
        let _ = writeln!(md, "## torture: {} at `{}`\n", self.backend, self.url);
        let _ = writeln!(
            md,
            "{} · {} · seed {} · {:.1} s · {} workers × {} tasks ({} clients each) · {} keys · ttl {:.0} ms · pauses and partitions {:.1} s\n",
            if self.passed {
                "**passed**"
            } else {
                "**FAILED**"
            },
            self.workload,
            self.seed,
            self.duration_s,
            self.workers,
            self.tasks,
            self.clients,
            self.keys,
            self.ttl_ms,
            self.pause_and_partition_ms / 1000.0,
        );
        let d = &self.declared;
        let _ = writeln!(
            md,
            "Declared: fencing {}, expiry {}; holder paused: {}, server restart: {}, member down: {}, member cut off: {}, slow link: {}, clock jump: {}.\n",
            d.fencing,
            d.expiry,
            d.holder_paused,
            d.server_restart,
            d.member_down,
            d.member_cut,
            d.slow_link,
            d.clock_jump
        );
        let errors = if self.acquire_errors.is_empty() {
            "none".to_owned()
        } else {
            self.acquire_errors
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        md.push_str("| holds checked (shared) | writes accepted | writes rejected | leases lost | acquire errors | violations |\n|---|---|---|---|---|---|\n");
        let _ = writeln!(
            md,
            "| {} ({}) | {} | {} | {} | {} | **{}** |\n",
            self.holds,
            self.shared_holds,
            self.writes_accepted,
            self.writes_rejected,
            self.leases_lost,
            errors,
            self.violations.len()
        );
        if self.workload == "reentrant holds" {
            let _ = writeln!(
                md,
                "Reentrant holds: {} re-entries got their hold's token; each hold was left lease by lease with a fenced write after each.\n",
                self.reentries
            );
        }
        if let Some(n) = self.permits {
            let most = self
                .most_permit_holders
                .iter()
                .map(|(k, m)| format!("`{k}` {m}"))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                md,
                "Semaphore: every hold one of {n} permits ({} permit holds); most holders at once per key: {}.\n",
                self.permit_holds,
                if most.is_empty() { "none" } else { &most }
            );
        }
        if let Some(k) = self.key_sets {
            let sizes = self
                .sets_by_size
                .iter()
                .map(|(size, n)| format!("{n} of {size} keys"))
                .collect::<Vec<_>>()
                .join(", ");
            let _ = writeln!(
                md,
                "Key sets: every hold a set of 2 to {k} keys taken with `acquire_all` ({} sets, {} of them shared: {}); longest stretch without a set granted: {}.\n",
                self.sets_taken,
                self.shared_sets,
                if sizes.is_empty() { "none" } else { &sizes },
                fmt_ms(self.longest_set_stall_ms)
            );
        }
        if !self.by_kind.is_empty() {
            md.push_str(
                "| fault | injected | declared | stale holders fenced (overlapping holds) | takeover of the victim's keys (max) | first acquire after the fault (median / max) | every key acquired again (max) |\n\
                 |---|---|---|---|---|---|---|\n",
            );
            for (kind, k) in &self.by_kind {
                let _ = writeln!(
                    md,
                    "| {kind} | {} | {} | {} ({}) | {} | {} / {} | {} |",
                    k.injected,
                    k.declared,
                    k.stale_holders,
                    k.fenced_overlaps,
                    fmt_ms(k.takeover_ms_max),
                    fmt_ms(k.recovery_ms_median),
                    fmt_ms(k.recovery_ms_max),
                    fmt_ms(k.all_keys_ms_max)
                );
            }
            md.push_str(
                "\nTakeover: from the fault's start until another process held each key the victim held. \
                 The other two: from the fault's end (the process reaped, SIGCONT, the network healed, \
                 the servers answering again).\n\n",
            );
        }
        for (kind, why) in &self.not_injected {
            let _ = writeln!(md, "Not injected: {kind} ({why}).");
        }
        if !self.not_injected.is_empty() {
            md.push('\n');
        }
        let _ = writeln!(
            md,
            "Final check: {}/{} keys free at once for a fresh client after the workers stopped; {}.\n",
            self.final_check.free_at_once,
            self.final_check.keys,
            match (
                self.final_check.residue_checked,
                self.final_check.residue.len()
            ) {
                (false, _) => "server state not read".to_owned(),
                (true, 0) => "nothing left on the servers".to_owned(),
                (true, n) => format!("{n} leftovers on the servers"),
            }
        );
        if !self.faults.is_empty() {
            md.push_str(
                "<details><summary>faults</summary>\n\n\
                 | at | fault | target | lasted | takeover | first acquire after | every key after |\n\
                 |---|---|---|---|---|---|---|\n",
            );
            for f in &self.faults {
                let target = match f.victim {
                    Some(p) if f.held.is_empty() => format!("worker {p} (holding nothing)"),
                    Some(p) => format!("worker {p} holding {}", f.held.join(", ")),
                    None => f.units.join(", "),
                };
                let _ = writeln!(
                    md,
                    "| {:.2} s | {} | {target} | {} | {} | {} | {} |",
                    f.at_s,
                    f.kind,
                    fmt_ms(Some(f.duration_ms)),
                    fmt_ms(f.takeover_ms),
                    fmt_ms(f.recovery_ms),
                    fmt_ms(f.all_keys_ms)
                );
            }
            md.push_str("\n</details>\n\n");
        }
        if self.violations.is_empty() {
            md.push_str("Violations: none.\n");
        } else {
            md.push_str("Violations:\n\n");
            for v in self.violations.iter().take(50) {
                let _ = writeln!(md, "- **{}**: {}", v.what, v.detail);
            }
            if self.violations.len() > 50 {
                let _ = writeln!(md, "- … and {} more", self.violations.len() - 50);
            }
        }
        md
    }
}

fn fmt_ms(v: Option<f64>) -> String {
    match v {
        None => "—".to_owned(),
        Some(v) if v >= 1000.0 => format!("{:.2} s", v / 1000.0),
        Some(v) => format!("{v:.0} ms"),
    }
}
