//! The semaphore check: no permit hold starts while its limit of other permit holds of the
//! key are trusted, except where a declared fault may have left some of them stale; and
//! the most holders each key had at once, which shows whether the run reached the limit.

use std::collections::{BTreeMap, BTreeSet};

use crate::check::{Analysis, Input, Violation};
use crate::store::HoldRec;

/// What the sweep found besides violations (those go to the [`Analysis`]).
#[derive(Debug, Default)]
pub(crate) struct PermitSweep {
    /// Per key, the most permit holders trusted at once, not counting holders a declared
    /// fault may have left stale.
    pub(crate) most_holders: BTreeMap<String, usize>,
    /// Holds that started while their limit of permit holds were trusted (stale or not):
    /// what the conformance checker must agree with.
    pub(crate) over_limit: BTreeSet<u64>,
}

/// Sweep each key's permit holds in start order (`by_key` is sorted by start).
pub(crate) fn sweep(
    input: &Input<'_>,
    by_key: &BTreeMap<&str, Vec<&HoldRec>>,
    out: &mut Analysis,
) -> PermitSweep {
    let mut found = PermitSweep::default();
    for (key, holds) in by_key {
        let mut active: Vec<&HoldRec> = Vec::new();
        for &hold in holds {
            let Some(limit) = hold.permits else {
                continue;
            };
            active.retain(|a| a.trusted_until(input.run_end) > hold.start);
            let limit = limit as usize;
            // A holder that a declared fault may have left believing in an expired permit
            // does not count against the limit, as a stale mutex holder does not.
            let (stale, fresh): (Vec<&HoldRec>, Vec<&HoldRec>) = active
                .iter()
                .partition(|a| input.excusing_fault(a, hold).is_some());
            let most = found.most_holders.entry((*key).to_owned()).or_default();
            *most = (*most).max(fresh.len() + 1);
            if active.len() >= limit {
                found.over_limit.insert(hold.id);
                if fresh.len() >= limit {
                    out.violations.push(over_limit(input, hold, limit, &fresh));
                } else {
                    for a in stale {
                        let fault = input.excusing_fault(a, hold).expect("partitioned above");
                        *out.fenced_overlaps.entry(fault.kind).or_default() += 1;
                        out.stale_holders
                            .entry(fault.kind)
                            .or_default()
                            .insert(a.id);
                    }
                }
            }
            active.push(hold);
        }
    }
    found
}

fn over_limit(input: &Input<'_>, hold: &HoldRec, limit: usize, fresh: &[&HoldRec]) -> Violation {
    let during = input.fault_at(hold.start).map_or_else(
        || "in calm weather".to_owned(),
        |f| format!("during the {} at {}", f.kind, input.rel(f.start)),
    );
    let holders: Vec<String> = fresh.iter().map(|h| input.describe(h)).collect();
    Violation::new(
        "over limit",
        format!(
            "on {:?}: {} started as one of {limit} permits while {} permit holds were trusted, {during}: {}",
            hold.key,
            input.describe(hold),
            fresh.len(),
            holders.join("; ")
        ),
    )
}
