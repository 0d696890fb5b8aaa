//! Reentrant holds ([`Owner`]): on every node the owner and the hold's leases live in a
//! hold record beside the lock key, under the same ttl, changed only by the owner scripts
//! (see [`scripts`]); here is what a quorum of their answers means.
//!
//! **What a majority of re-entries means.** An owner's acquire runs one take-or-re-enter
//! script per node in one round. A node *re-entered* when its current hold (the record
//! whose token is the lock key's value) belongs to the owner: it added the lease's field
//! and kept the hold alive for at least the ttl from then on. The acquire is a re-entry
//! when at least `Q` nodes re-entered **the same hold** (the same hold token) and the
//! validity `ttl - (now - t1) - drift` of the round that began at `t1` is still positive.
//! Then the hold lives on those `Q` nodes until `t1 + ttl - drift` at least, exactly what
//! a fresh Redlock grant guarantees, so the lease is as safe as the hold's first one, and
//! no other holder can have a majority meanwhile (those `Q` nodes refuse it). Its fencing
//! token is the highest fence those nodes recorded for the hold: every grant writes its
//! fence back to the records of a majority before it is reported (and no record holds a
//! higher one), so any `Q` re-entered nodes include one with the hold's token. Re-entries
//! of another hold (a minority left from an earlier one), nodes taken afresh, and every
//! node of a round that was neither a re-entry nor a grant get the lease's field taken
//! back (owner-checked: only the field this acquire added goes, so a give-back is exact
//! even where the answer was lost); the acquire then waits, or retries, as any other.

pub(crate) mod held;
#[macro_use]
mod lua;
pub(crate) mod scripts;

use dlock_core::raw::spawn_cleanup;
use dlock_core::{LockError, Owner, Result};
use dlock_redis::server::Names;
use rand::Rng;

pub(crate) use scripts::{Answer, Entry};

/// The suffix of a hold record's name: `{<lock key>}:reentry`.
const RECORD_SUFFIX: &str = "}:reentry";

impl Entry {
    /// A new lease of `owner` on the lock `names`: a fresh random lease field.
    pub(crate) fn new(names: &Names, owner: Owner) -> Self {
        let random: u128 = rand::rng().random();
        Self {
            record: record_name(&names.key),
            names: names.clone(),
            owner,
            lease: format!("l:{random:032x}"),
        }
    }

    /// Take the lease's field back on `which` nodes (what a round added where it did not
    /// win, or may have added where the answer was lost), leaving the queue as `queued`.
    pub(crate) async fn give_back(
        &self,
        cluster: &crate::cluster::Cluster,
        which: &[usize],
        queued: &str,
        limit: std::time::Duration,
        announce: bool,
    ) {
        if which.is_empty() {
            return;
        }
        cluster
            .on(which, limit, "release", |n| {
                self.release(n, queued, announce)
            })
            .await;
    }

    /// A guard around an owner's acquire round: dropped before [`Guard::run`] finishes, it
    /// takes the lease's field back on every node in the background.
    pub(crate) fn guard(&self, nodes: &[dlock_redis::server::Node], queued: &str) -> Guard {
        Guard {
            entry: Some((self.clone(), nodes.to_vec(), queued.to_owned())),
        }
    }
}

/// See [`Entry::guard`].
pub(crate) struct Guard {
    entry: Option<(Entry, Vec<dlock_redis::server::Node>, String)>,
}

impl Guard {
    /// Run the round under the guard.
    pub(crate) async fn run<T>(mut self, round: impl Future<Output = T>) -> T {
        let out = round.await;
        self.entry = None;
        out
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some((entry, nodes, queued)) = self.entry.take() else {
            return;
        };
        for node in nodes {
            let (entry, queued) = (entry.clone(), queued.clone());
            spawn_cleanup(async move {
                let result = entry.release(&node, &queued, true).await;
                tracing::debug!(key = %entry.names.key, ?result, "took an owner's entry back after a cancelled acquire");
            });
        }
    }
}

/// The name of the hold record of the lock key `lock`.
pub(crate) fn record_name(lock: &str) -> String {
    format!("{{{lock}{RECORD_SUFFIX}")
}

/// Refuse `key` if under `prefix` its lock key would be another lock's hold record
/// (`{<prefix><other key>}:reentry`), as [`Names::check`] refuses the other side keys.
pub(crate) fn check_key(prefix: &str, key: &str) -> Result<()> {
    if !prefix.is_empty() && !prefix.starts_with('{') {
        return Ok(());
    }
    let lock = format!("{prefix}{key}");
    if lock.starts_with(&format!("{{{prefix}")) && lock.ends_with(RECORD_SUFFIX) {
        return Err(LockError::invalid_key(
            key,
            "under this key prefix the key names another lock's hold record \
             ({<prefix><key>}:reentry); use another key, or a prefix such as dlock:",
        ));
    }
    Ok(())
}

/// The hold a majority re-entered, by the rule in the module docs: its token, and the
/// highest fence its re-entered nodes recorded. `reentered` is each re-entered node's
/// `(index, hold token, fence)`.
pub(crate) fn majority(reentered: &[(usize, String, u64)], quorum: usize) -> Option<(String, u64)> {
    reentered.iter().find_map(|(_, hold, _)| {
        let same: Vec<u64> = reentered
            .iter()
            .filter(|(_, h, _)| h == hold)
            .map(|(_, _, fence)| *fence)
            .collect();
        (same.len() >= quorum).then(|| (hold.clone(), same.into_iter().max().unwrap_or(0)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_majority_of_one_hold_is_a_reentry() {
        let re = |i, h: &str, f| (i, h.to_owned(), f);
        let one = [re(0, "a", 5), re(1, "a", 7), re(3, "a", 7)];
        assert_eq!(majority(&one, 3), Some(("a".into(), 7)));
        // Re-entries of two holds are not a majority of either.
        let two = [re(0, "a", 5), re(1, "a", 5), re(2, "b", 9), re(3, "b", 9)];
        assert_eq!(majority(&two, 3), None);
        assert_eq!(majority(&[], 3), None);
    }

    #[test]
    fn record_names_are_refused_as_keys_where_they_could_clash() {
        assert_eq!(record_name("dlock:k"), "{dlock:k}:reentry");
        assert!(check_key("dlock:", "{x}:reentry").is_ok());
        assert!(check_key("", "{x}:reentry").is_err());
        assert!(check_key("{", "{x}:reentry").is_err());
        assert!(check_key("", "x:reentry").is_ok());
    }
}
