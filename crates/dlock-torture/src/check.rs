//! The checks at the end of a run: the history of holds, the fenced store's log, and the
//! faults, against what the backend declares.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use dlock_conformance::{Hold, Violation as ConformanceViolation};
use dlock_core::{Capabilities, FaultSafety};
use serde::Serialize;

use crate::clock::ms;
use crate::faults::{FaultKind, FaultRec};
use crate::store::{HoldRec, WriteRec};

/// A broken promise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Violation {
    pub(crate) what: &'static str,
    pub(crate) detail: String,
}

impl Violation {
    pub(crate) fn new(what: &'static str, detail: impl Into<String>) -> Self {
        Self {
            what,
            detail: detail.into(),
        }
    }
}

/// What the history checks found.
#[derive(Debug, Default)]
pub(crate) struct Analysis {
    pub(crate) holds: usize,
    /// Pairs of overlapping holds that a declared fault allowed and the fenced store kept
    /// apart.
    pub(crate) fenced_overlaps: BTreeMap<FaultKind, usize>,
    /// The earlier holds of those pairs: stale holders whose writes the store fenced off.
    pub(crate) stale_holders: BTreeMap<FaultKind, BTreeSet<u64>>,
    /// Writes the store rejected during faults that allow it.
    pub(crate) expected_rejections: usize,
    /// Per key, the most permit holders at once (empty without permit holds).
    pub(crate) most_permit_holders: BTreeMap<String, usize>,
    pub(crate) violations: Vec<Violation>,
}

pub(crate) struct Input<'a> {
    pub(crate) holds: &'a [HoldRec],
    pub(crate) log: &'a [WriteRec],
    pub(crate) faults: &'a [FaultRec],
    pub(crate) caps: Capabilities,
    /// How long after a fault ended its effects may still show (an old holder hearing of
    /// its loss, a late write).
    pub(crate) grace: u64,
    /// When the run ended (for holds that never ended, which is itself reported).
    pub(crate) run_end: u64,
    /// When the run started, for relative times in messages.
    pub(crate) t0: u64,
}

impl Input<'_> {
    pub(crate) fn rel(&self, t: u64) -> String {
        format!("{:.3}s", ms(t.saturating_sub(self.t0)) / 1000.0)
    }

    pub(crate) fn describe(&self, h: &HoldRec) -> String {
        let lost = match (h.lost_at, &h.lost_reason) {
            (Some(t), Some(why)) => format!(", told lost at {} ({why})", self.rel(t)),
            _ => String::new(),
        };
        let outcome = h
            .outcome
            .as_deref()
            .map(|o| format!(", release: {o}"))
            .unwrap_or_default();
        format!(
            "hold {:x} (process {}, token {}, requested {}, held {}..{}{lost}{outcome})",
            h.id,
            h.process,
            h.token,
            self.rel(h.requested),
            self.rel(h.start),
            h.end
                .map_or_else(|| "never ended".to_owned(), |t| self.rel(t)),
        )
    }

    /// Whether fault `f` may leave a holder in `process` believing in a lease that another
    /// client was given: the backend does not declare it exclusive through `f`, and `f` hit
    /// that holder (a pause of its process; a restart, a lost member, a failover and a
    /// fault of a member's link or clock hit everyone).
    fn may_stale(&self, f: &FaultRec, process: u32) -> bool {
        let hit = match f.kind {
            FaultKind::Pause => f.victim.as_ref().is_some_and(|v| v.process == process),
            FaultKind::Restart
            | FaultKind::Member
            | FaultKind::Failover
            | FaultKind::Split
            | FaultKind::Cut
            | FaultKind::Slow
            | FaultKind::Loss
            | FaultKind::Delay
            | FaultKind::Clock => true,
            FaultKind::Kill | FaultKind::Partition | FaultKind::ClientClock => false,
        };
        hit && f.kind.declared(&self.caps.faults) != FaultSafety::Exclusive
    }

    /// A fault after which `later` started while `earlier` still trusted its lease, and
    /// which may cost exclusion. A paused process may hold either side: its grant may have
    /// come just before the pause and been noted just after it.
    pub(crate) fn excusing_fault(&self, earlier: &HoldRec, later: &HoldRec) -> Option<&FaultRec> {
        self.faults.iter().find(|f| {
            later.start >= f.start
                && later.start <= f.end + self.grace
                && (self.may_stale(f, earlier.process) || self.may_stale(f, later.process))
        })
    }

    /// A fault during `hold`'s life that may leave it writing with a stale token.
    fn fault_allowing_stale_writes(&self, hold: &HoldRec) -> Option<&FaultRec> {
        let (from, to) = (hold.requested, hold.end.unwrap_or(self.run_end));
        self.faults.iter().find(|f| {
            from <= f.end + self.grace && to >= f.start && self.may_stale(f, hold.process)
        })
    }

    pub(crate) fn fault_at(&self, t: u64) -> Option<&FaultRec> {
        self.faults
            .iter()
            .find(|f| t >= f.start && t <= f.end + self.grace)
    }
}

pub(crate) fn analyse(input: &Input<'_>) -> Analysis {
    let mut out = Analysis {
        holds: input.holds.len(),
        ..Analysis::default()
    };
    let mut by_key: BTreeMap<&str, Vec<&HoldRec>> = BTreeMap::new();
    for hold in input.holds {
        by_key.entry(&hold.key).or_default().push(hold);
        if hold.end.is_none() {
            out.violations.push(Violation::new(
                "unfinished hold",
                format!(
                    "{} on {:?} was never released nor ended by its process's death",
                    input.describe(hold),
                    hold.key
                ),
            ));
        }
    }
    for holds in by_key.values_mut() {
        holds.sort_by_key(|h| (h.start, h.id));
    }
    // Accepted writes of each hold: the first and last store sequence numbers.
    let mut accepted: HashMap<u64, (u64, u64)> = HashMap::new();
    for w in input.log.iter().filter(|w| w.accepted) {
        let e = accepted.entry(w.hold).or_insert((w.seq, w.seq));
        e.0 = e.0.min(w.seq);
        e.1 = e.1.max(w.seq);
    }
    let pairs = overlaps(&by_key, input.run_end);
    for (earlier, later) in &pairs {
        check_overlap(input, &accepted, earlier, later, &mut out);
    }
    let permits = crate::permits::sweep(input, &by_key, &mut out);
    cross_check(input, &pairs, &permits.over_limit, &mut out);
    out.most_permit_holders = permits.most_holders;
    if input.caps.fencing.is_ordered() {
        token_order(input, &by_key, &mut out);
    }
    store_log(input, &mut out);
    for f in input.faults.iter().filter(|f| f.recovered.is_none()) {
        out.violations.push(Violation::new(
            "no recovery",
            format!(
                "after the {} at {}, not every key was acquired again within the recovery limit",
                f.kind,
                input.rel(f.start)
            ),
        ));
    }
    out
}

/// Every pair of holds of a key where the later started while the earlier was still
/// trusted (not released, not told it was lost), unless both are shared (readers or
/// permits, whose count [`crate::permits`] checks).
fn overlaps<'a>(
    by_key: &BTreeMap<&str, Vec<&'a HoldRec>>,
    run_end: u64,
) -> Vec<(&'a HoldRec, &'a HoldRec)> {
    let mut pairs = Vec::new();
    for holds in by_key.values() {
        let mut active: Vec<&HoldRec> = Vec::new();
        for &hold in holds {
            active.retain(|a| a.trusted_until(run_end) > hold.start);
            pairs.extend(
                active
                    .iter()
                    .filter(|a| !(a.shares() && hold.shares()))
                    .map(|&a| (a, hold)),
            );
            active.push(hold);
        }
    }
    pairs
}

fn check_overlap(
    input: &Input<'_>,
    accepted: &HashMap<u64, (u64, u64)>,
    earlier: &HoldRec,
    later: &HoldRec,
    out: &mut Analysis,
) {
    let what = format!(
        "on {:?}: {} started while {} still held it",
        later.key,
        input.describe(later),
        input.describe(earlier)
    );
    if let Some(fault) = input.excusing_fault(earlier, later) {
        // Allowed if the store kept them apart: the older token's accepted writes all came
        // before the newer one's.
        let (old, new) = if earlier.token < later.token {
            (earlier, later)
        } else {
            (later, earlier)
        };
        let apart = match (accepted.get(&old.id), accepted.get(&new.id)) {
            (Some(o), Some(n)) => o.1 < n.0,
            _ => true,
        };
        if earlier.token != later.token && apart {
            *out.fenced_overlaps.entry(fault.kind).or_default() += 1;
            out.stale_holders
                .entry(fault.kind)
                .or_default()
                .insert(earlier.id);
        } else {
            out.violations.push(Violation::new(
                "unfenced overlap",
                format!(
                    "{what}, during the {} at {} (declared {}), and the fenced store accepted writes of both interleaved",
                    fault.kind,
                    input.rel(fault.start),
                    crate::faults::safety_name(fault.kind.declared(&input.caps.faults))
                ),
            ));
        }
        return;
    }
    let during = input.fault_at(later.start).map_or_else(
        || "in calm weather".to_owned(),
        |f| {
            format!(
                "during the {} at {} (declared {})",
                f.kind,
                input.rel(f.start),
                crate::faults::safety_name(f.kind.declared(&input.caps.faults))
            )
        },
    );
    out.violations
        .push(Violation::new("overlap", format!("{what}, {during}")));
}

/// The suite's own checker must find no overlap and no hold over its permit limit that
/// the sweeps missed.
fn cross_check(
    input: &Input<'_>,
    pairs: &[(&HoldRec, &HoldRec)],
    over_limit: &BTreeSet<u64>,
    out: &mut Analysis,
) {
    let t0 = tokio::time::Instant::now();
    let at = |t: u64| t0 + Duration::from_nanos(t.saturating_sub(input.t0));
    let holds: Vec<Hold> = input
        .holds
        .iter()
        .enumerate()
        .map(|(i, h)| Hold {
            client: i,
            key: h.key.clone(),
            token: h.token,
            mode: h.mode(),
            start: at(h.start),
            end: at(h.end.unwrap_or(input.run_end)),
            lost_at: h.lost_at.map(at),
        })
        .collect();
    for v in dlock_conformance::history::check(&holds, false) {
        if let ConformanceViolation::OverLimit { hold, .. } = &v {
            let h = &input.holds[hold.client];
            if !over_limit.contains(&h.id) {
                out.violations.push(Violation::new(
                    "checker disagreement",
                    format!(
                        "dlock_conformance::check found a hold over its permit limit the sweep missed: {}",
                        input.describe(h)
                    ),
                ));
            }
        }
        if let ConformanceViolation::Overlap { first, second } = v {
            let (a, b) = (&input.holds[first.client], &input.holds[second.client]);
            if !pairs.iter().any(|(x, y)| x.id == a.id && y.id == b.id) {
                out.violations.push(Violation::new(
                    "checker disagreement",
                    format!(
                        "dlock_conformance::check found an overlap the sweep missed: {} / {}",
                        input.describe(a),
                        input.describe(b)
                    ),
                ));
            }
        }
    }
}

/// A hold must get a greater token than every hold that had surely been granted before it
/// was even requested (started before its acquire was called); a shared hold, than every
/// such exclusive hold.
fn token_order(input: &Input<'_>, by_key: &BTreeMap<&str, Vec<&HoldRec>>, out: &mut Analysis) {
    for holds in by_key.values() {
        // holds are sorted by start.
        let exclusive: Vec<&HoldRec> = holds.iter().copied().filter(|h| !h.shares()).collect();
        let (tops_all, tops_exclusive) = (prefix_tops(holds), prefix_tops(&exclusive));
        for &later in holds {
            let (rivals, tops) = if later.shares() {
                (&exclusive, &tops_exclusive)
            } else {
                (holds, &tops_all)
            };
            let before = rivals.partition_point(|h| h.start < later.requested);
            if before == 0 {
                continue;
            }
            let top = tops[before - 1];
            if top.token >= later.token {
                out.violations.push(Violation::new(
                    "token regression",
                    format!(
                        "on {:?}: {} got token {} although {} had token {} and started before it was requested",
                        later.key,
                        input.describe(later),
                        later.token,
                        input.describe(top),
                        top.token
                    ),
                ));
            }
        }
    }
}

/// For each prefix of `holds`, the hold with the greatest token in it.
fn prefix_tops<'a>(holds: &[&'a HoldRec]) -> Vec<&'a HoldRec> {
    let mut tops: Vec<&HoldRec> = Vec::with_capacity(holds.len());
    for &h in holds {
        let top = match tops.last() {
            Some(&b) if b.token >= h.token => b,
            _ => h,
        };
        tops.push(top);
    }
    tops
}

/// The store never went backwards, gave no two holds the same token, and rejected nothing
/// outside a fault that allows stale writes.
fn store_log(input: &Input<'_>, out: &mut Analysis) {
    let holds: HashMap<u64, &HoldRec> = input.holds.iter().map(|h| (h.id, h)).collect();
    let mut last: HashMap<&str, &WriteRec> = HashMap::new();
    for w in input.log {
        if !w.accepted {
            let explained = holds
                .get(&w.hold)
                .and_then(|h| input.fault_allowing_stale_writes(h));
            match explained {
                Some(_) => out.expected_rejections += 1,
                None => out.violations.push(Violation::new(
                    "unexpected rejection",
                    format!(
                        "the store rejected write #{} on {:?} (hold {:x}, token {}) at {}, outside any fault that allows stale writes: a newer token was already written",
                        w.seq,
                        w.key,
                        w.hold,
                        w.token,
                        input.rel(w.at)
                    ),
                )),
            }
            continue;
        }
        if let Some(prev) = last.get(w.key.as_str()) {
            if w.token < prev.token {
                out.violations.push(Violation::new(
                    "store went backwards",
                    format!(
                        "on {:?}: write #{} accepted token {} after #{} accepted {}",
                        w.key, w.seq, w.token, prev.seq, prev.token
                    ),
                ));
            } else if w.token == prev.token && w.hold != prev.hold {
                out.violations.push(Violation::new(
                    "shared token",
                    format!(
                        "on {:?}: holds {:x} and {:x} both wrote with token {}",
                        w.key, prev.hold, w.hold, w.token
                    ),
                ));
            }
        }
        last.insert(&w.key, w);
    }
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
