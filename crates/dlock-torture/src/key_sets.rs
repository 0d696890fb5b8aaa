//! The key-set workload's summary and its progress check: how many sets were taken (by
//! size), and the longest stretch of the run in which no set was granted, which must stay
//! within the recovery limit (plus the longest fault), or the sets stopped being granted:
//! a deadlock, or a wait budget that never ends.
//!
//! The keys of a set are checked one by one as holds of their own (`check.rs`, unchanged).

use std::collections::{BTreeMap, BTreeSet};

use crate::check::{Input, Violation};
use crate::clock::ms;
use crate::store::HoldRec;

/// What the key-set holds of a run add up to.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct SetSweep {
    /// Sets granted (each counts once, whatever its size).
    pub(crate) sets: usize,
    /// Of `sets`, the ones taken shared.
    pub(crate) shared_sets: usize,
    /// Sets granted, by how many keys they held.
    pub(crate) by_size: BTreeMap<usize, usize>,
    /// The longest stretch without a set granted, from the run's start (or a grant) to the
    /// next grant (or the stop), in ns; and when it began.
    pub(crate) longest_stall: u64,
    pub(crate) stall_from: u64,
}

/// Sum up the sets among `holds` and find the longest stretch of `[from, to]` in which
/// none was granted.
pub(crate) fn sweep(holds: &[HoldRec], from: u64, to: u64) -> SetSweep {
    let mut sets: BTreeMap<u64, (usize, bool, u64)> = BTreeMap::new();
    for h in holds {
        if let Some(set) = h.set {
            let e = sets.entry(set).or_insert((0, h.shared, h.start));
            e.0 += 1;
        }
    }
    let mut out = SetSweep {
        sets: sets.len(),
        shared_sets: sets.values().filter(|s| s.1).count(),
        ..SetSweep::default()
    };
    for (size, ..) in sets.values() {
        *out.by_size.entry(*size).or_default() += 1;
    }
    let grants: BTreeSet<u64> = sets.values().map(|s| s.2).collect();
    let mut last = from;
    for t in grants.into_iter().chain([to]) {
        let t = t.clamp(from, to);
        if t - last > out.longest_stall {
            out.longest_stall = t - last;
            out.stall_from = last;
        }
        last = last.max(t);
    }
    out
}

/// A violation when no set was granted for longer than `limit` ns.
pub(crate) fn progress(input: &Input<'_>, sweep: &SetSweep, limit: u64) -> Option<Violation> {
    (sweep.longest_stall > limit).then(|| {
        Violation::new(
            "no progress",
            format!(
                "no key set was granted for {:.1} s from {} (the limit is {:.1} s: the recovery limit plus the longest fault); {} sets in all",
                ms(sweep.longest_stall) / 1000.0,
                input.rel(sweep.stall_from),
                ms(limit) / 1000.0,
                sweep.sets
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn key(id: u64, set: u64, start: u64) -> HoldRec {
        HoldRec {
            id,
            process: 1,
            key: format!("k{id}"),
            token: id,
            shared: false,
            permits: None,
            set: Some(set),
            requested: start,
            start,
            end: Some(start + 1),
            lost_at: None,
            lost_reason: None,
            outcome: Some("ok".into()),
        }
    }

    #[test]
    fn sets_count_once_by_size() {
        let holds = [
            key(1, 1, 2 * S),
            key(2, 1, 2 * S),
            key(3, 3, 5 * S),
            key(4, 3, 5 * S),
            key(5, 3, 5 * S),
        ];
        let s = sweep(&holds, 0, 6 * S);
        assert_eq!(s.sets, 2);
        assert_eq!(s.by_size, BTreeMap::from([(2, 1), (3, 1)]));
        assert_eq!((s.longest_stall, s.stall_from), (3 * S, 2 * S));
    }

    #[test]
    fn the_stall_runs_to_the_stop_and_from_the_start() {
        let holds = [key(1, 1, 2 * S), key(2, 1, 2 * S)];
        let s = sweep(&holds, 0, 20 * S);
        assert_eq!((s.longest_stall, s.stall_from), (18 * S, 2 * S));
        let s = sweep(&[], S, 20 * S);
        assert_eq!((s.sets, s.longest_stall, s.stall_from), (0, 19 * S, S));
    }
}
