//! One acquisition's protocol ([`Attempt`]): the transaction that puts our key and reads
//! the owner, then the wait for each predecessor's deletion. A shared attempt (a reader)
//! looks only at the keys that block it: every key under the prefix outside the readers'
//! range ([`blocking_ranges`]); a permit attempt only at the permits' range, and waits as
//! [`crate::permits`] says.

use std::fmt;
use std::sync::atomic::Ordering;

use dlock_core::raw::Deadline;
use dlock_core::{LockError, Mode, Owner, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnResponse, WatchFilterType, WatchOptions,
};

use crate::NAME;
use crate::connection::{Conn, ranged, revision};
use crate::error::{Error, lease_lost};
use crate::inspect::key_value;
use crate::lease::KeyLease;
use crate::reentry::{Entry, Hold, owner_value};
use crate::watch::{OWN_WATCH, OwnWatch, Seen};

/// How many times in a row a waiter's watch may break (the stream fails, or the server
/// cancels a watch) before the acquire gives up.
pub(crate) const WATCH_BREAKS: u32 = 3;

/// How many watches a waiter puts on its predecessor (see [`Attempt::wait`]).
const PREDECESSOR_WATCHES: i64 = 2;

/// How an attempt ended.
pub(crate) enum Outcome {
    /// We hold the key. `seen` is a revision at which our key was the oldest; `watch`
    /// the waiter's stream, whose own-key watch becomes the lost signal; `waited`: the key
    /// was busy at our transaction, and we waited for the holds before ours to end.
    Held {
        rev: i64,
        seen: i64,
        watch: Option<Box<OwnWatch>>,
        waited: bool,
    },
    /// The key is held and the deadline does not allow waiting.
    Busy,
    /// The shared lease was gone on the server; no key was put.
    LeaseGone,
    /// The key was held under our owner: that hold's count was raised, and our key
    /// deleted (see [`crate::reentry`]).
    Reentered(Entry, tokio::time::Instant, bool),
    /// Within the attempt only: a waiter found the key held under its owner.
    Reenter(Hold),
}

/// A waiter's next step.
enum Next {
    /// Read who is ahead of us, in a state at least as new as this revision.
    Check(i64),
    /// Wait for this predecessor, which existed at this revision.
    Wait(Vec<u8>, i64),
    /// Nobody is ahead of us at this revision.
    Held(i64),
    /// The watch broke (`true`: the server refused or canceled it).
    Broken(bool, String),
    /// The key is held under our owner: re-enter that hold.
    Enter(Box<Hold>),
}

/// Who is ahead of a waiter.
enum Ahead {
    /// Nobody: the key is ours.
    Nobody,
    /// This key (the predecessor; an owner's waiter: the holder).
    Key(Vec<u8>),
    /// Our owner's hold (an owner's waiter only).
    Owner(Box<Hold>),
}

impl Next {
    fn broken(refused: bool, why: impl fmt::Display) -> Self {
        Self::Broken(refused, why.to_string())
    }
}

/// The name under the lock prefix below which shared holds put their keys
/// (`{lock name}/read/{lease id}`, the readers' layout of etcd's experimental `RWMutex`).
/// Every other key under the prefix is exclusive to a reader: ours, Go's `Mutex`'s and
/// `etcdctl lock`'s names are lease ids in hex, which never start with `r`.
pub(crate) const READERS: &str = "read/";

/// The name under the lock prefix below which permit holds put their keys
/// (`{lock name}/permit/{lease id}`). Lease ids in hex never start with `p`, so no lock
/// key of ours, Go's or etcdctl's falls in it.
pub(crate) const PERMITS: &str = "permit/";

/// The key ranges under `prefix` (ending in `/`) whose older keys an attempt in `mode`
/// waits for, as `(start, end)`: everything under the prefix for a writer; for a reader,
/// everything but the readers' range `{prefix}read/`, i.e. the two ranges either side of
/// it; for a permit, the permits' range `{prefix}permit/` alone (its own key included),
/// of which it counts the older keys against its limit.
pub(crate) fn blocking_ranges(prefix: &str, mode: Mode) -> Vec<(String, String)> {
    // The end of a prefix range: its last byte, `/`, plus one.
    let base = prefix.strip_suffix('/').unwrap_or(prefix);
    let end = format!("{base}0");
    match mode {
        Mode::Exclusive => vec![(prefix.to_owned(), end)],
        Mode::Shared => {
            let readers = format!("{prefix}{READERS}");
            let after = format!("{prefix}{}0", READERS.trim_end_matches('/'));
            vec![(prefix.to_owned(), readers), (after, end)]
        }
        Mode::Permits(_) => {
            let permits = format!("{prefix}{PERMITS}");
            let end = format!("{prefix}{}0", PERMITS.trim_end_matches('/'));
            vec![(permits, end)]
        }
    }
}

/// How many older blocking keys an attempt in `mode` may have and still hold: none for a
/// lock, fewer than its limit for a permit.
pub(crate) fn admits(mode: Mode) -> usize {
    mode.permits().map_or(1, |n| n as usize)
}

/// The key with the highest create revision among the first key of each range answered.
fn newest<'a>(ranges: &[&'a [KeyValue]]) -> Option<&'a KeyValue> {
    ranges
        .iter()
        .filter_map(|kvs| kvs.first())
        .max_by_key(|kv| kv.create_revision())
}

/// One acquisition of `key` in `mode`: its lock prefix and its own etcd key.
pub(crate) struct Attempt<'a> {
    pub(crate) conn: &'a Conn,
    pub(crate) key: &'a str,
    pub(crate) prefix: String,
    pub(crate) my_key: String,
    pub(crate) mode: Mode,
    /// An election candidate's value, put on our key in place of the holder's description.
    pub(crate) value: Option<&'a str>,
    /// The owner of a reentrant hold (exclusive only): our key's value names it, with a
    /// count of 1, and a key found held under it is re-entered.
    pub(crate) owner: Option<Owner>,
}

impl Attempt<'_> {
    /// Grant an own lease (a shared one is granted already), create our key and read the
    /// owner in one transaction, then wait for our turn if the deadline allows.
    pub(crate) async fn run(&self, lease: &mut KeyLease, deadline: Deadline) -> Result<Outcome> {
        const OP: &str = "acquire";
        lease.prepare(OP).await?;
        let answer = match self.put_and_read_owner(lease).await? {
            Some(answer) => answer,
            None => return Ok(Outcome::LeaseGone),
        };
        let rev = revision(OP, answer.header())?;
        let ops = answer.op_responses();
        // Each range was read oldest first, as many keys as may be older and still admit
        // us (one for a lock); our own key (in a writer's and a permit's range) is not older.
        let older = (1..=self.ranges().len())
            .map(|i| {
                ranged(OP, &ops, i)
                    .map(|kvs| kvs.iter().filter(|kv| kv.create_revision() < rev).count())
            })
            .sum::<Result<usize, Error>>()?;
        if older < admits(self.mode) {
            return Ok(Outcome::Held {
                rev,
                seen: rev,
                watch: None,
                waited: false,
            });
        }
        if let Mode::Permits(limit) = self.mode {
            return match deadline.may_wait() {
                true => self.wait_for_permit(lease, rev, limit).await,
                false => Ok(Outcome::Busy),
            };
        }
        let mut ahead = match self.owner {
            Some(owner) => ranged(OP, &ops, 1)?
                .first()
                .filter(|kv| kv.create_revision() < rev)
                .and_then(|kv| Hold::of(self.conn, self.key, kv, owner)),
            None => None,
        };
        let mut waited = false;
        loop {
            if let Some(hold) = ahead.take()
                && let Some(outcome) = self.reenter(rev, hold, waited).await?
            {
                return Ok(outcome);
            }
            if !deadline.may_wait() {
                return Ok(Outcome::Busy);
            }
            // The predecessor is read only now, by a member-local read: the transaction
            // of a free lock (the common case) reads only the oldest key.
            waited = true;
            match self.wait(lease, rev).await? {
                Outcome::Reenter(hold) => ahead = Some(hold),
                outcome => return Ok(outcome),
            }
        }
    }

    /// The ranges whose older keys this attempt waits for (see [`blocking_ranges`]).
    pub(crate) fn ranges(&self) -> Vec<(String, String)> {
        blocking_ranges(&self.prefix, self.mode)
    }

    /// The acquiring transaction: if `my` does not exist, put it with the lease and read
    /// the oldest key of each blocking range (a permit: the oldest `limit` keys, names only). `None` when the shared lease is gone on the
    /// server.
    ///
    /// A key of our name that exists already can only be a stray of ours (the names on a
    /// shared lease carry its id, and no live attempt or hold of ours uses this one): an
    /// abandoned attempt's put that timed out here but landed after its background
    /// delete. Nobody waits on its behalf, and the shared lease would keep it (and the
    /// lock busy) as long as the client lives, so it is deleted and the put made again.
    async fn put_and_read_owner(&self, lease: &KeyLease) -> Result<Option<TxnResponse>> {
        const OP: &str = "acquire";
        // The value names us for `inspect` (Go's Mutex puts an empty one and never reads
        // it); a candidate's is its published value, as Go's `Election::Campaign` puts it.
        let value = match (self.value, self.owner) {
            (Some(value), _) => value.to_owned(),
            (None, Some(owner)) => owner_value(owner.as_str(), 1, dlock_core::holder_description()),
            (None, None) => key_value(self.mode),
        };
        let mut ops = vec![TxnOp::put(
            self.my_key.as_str(),
            value,
            Some(PutOptions::new().with_lease(lease.id())),
        )];
        for (start, end) in self.ranges() {
            let mut oldest = GetOptions::new()
                .with_range(end)
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(admits(self.mode) as i64);
            // An owner reads the holder's value: its owner and count.
            if self.owner.is_none() {
                oldest = oldest.with_keys_only();
            }
            ops.push(TxnOp::get(start, Some(oldest)));
        }
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.my_key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then(ops);
        let shared = matches!(lease, KeyLease::Shared(_));
        for tries in 1..=2 {
            let answer = match self.conn.txn(OP, txn.clone()).await {
                // The shared lease ended on the server before its keeper noticed.
                Err(e) if e.is_lease_not_found() && shared => return Ok(None),
                answer => answer?,
            };
            if answer.succeeded() {
                return Ok(Some(answer));
            }
            if !shared || tries == 2 {
                break;
            }
            tracing::debug!(
                backend = NAME,
                key = self.key,
                "a stray key of an abandoned attempt had our name; deleting it"
            );
            self.conn.delete_key(OP, &self.my_key, None).await?;
        }
        Err(Error::Protocol {
            op: OP,
            what: "the key of a fresh attempt already existed",
        }
        .into())
    }

    /// Wait until no blocking key (any key under the prefix for a writer, any but the
    /// readers' for a reader) is older than ours: watch the deletion of the newest older
    /// one (only it: one wake-up per release) and of our own key, keep our lease alive,
    /// re-check after each deletion.
    ///
    /// The predecessor's watch starts at the current revision, so etcd serves it from its
    /// synced watcher group at once (a watch starting in the past is caught up by a loop
    /// that runs every 100 ms, which would delay the hand-off). If the store moved on
    /// since the read that named the predecessor, a read after the watch exists closes the
    /// gap: a deletion before it is seen by that read, one after it by the watch. Our own
    /// key's watch starts at the current revision too (created just before the
    /// predecessor's, on the same stream, so that read covers it as well).
    async fn wait(&self, lease: &mut KeyLease, rev: i64) -> Result<Outcome> {
        const OP: &str = "acquire";
        let mut watch: Option<Box<OwnWatch>> = None;
        let mut next_id = OWN_WATCH + 1;
        let mut breaks = 0;
        let mut next = Next::Check(rev);
        loop {
            // Called only once the transaction found the key busy: every grant here is
            // given after waiting.
            let held = |seen, watch| Outcome::Held {
                rev,
                seen,
                watch,
                waited: true,
            };
            let (predecessor, seen) = match next {
                Next::Wait(predecessor, seen) => (predecessor, seen),
                Next::Check(floor) => match self.check(rev, floor).await? {
                    (Ahead::Nobody, seen) => return Ok(held(seen, watch)),
                    (Ahead::Owner(hold), _) => return Ok(Outcome::Reenter(*hold)),
                    (Ahead::Key(predecessor), seen) => (predecessor, seen),
                },
                Next::Broken(..) => match self.check(rev, rev).await? {
                    (Ahead::Nobody, seen) => return Ok(held(seen, watch)),
                    (Ahead::Owner(hold), _) => return Ok(Outcome::Reenter(*hold)),
                    (Ahead::Key(predecessor), seen) => (predecessor, seen),
                },
                Next::Held(seen) => return Ok(held(seen, watch)),
                Next::Enter(hold) => return Ok(Outcome::Reenter(*hold)),
            };
            let stream = match &mut watch {
                Some(stream) => stream,
                None => watch.insert(self.conn.watch_own(OP, &self.my_key).await?),
            };
            // Two watches on the predecessor, back to back: either one's event wakes us.
            // etcd puts a watch from the current revision in its unsynced group when a
            // write lands between its reading the revision and registering the watch
            // (often, under contention), and catches that group up only every 100 ms;
            // two such races in a row are rare.
            let first = next_id.max(stream.own_id + 1);
            next_id = first + PREDECESSOR_WATCHES;
            let mut pred_ids: Vec<i64> = (first..next_id).collect();
            let mut created = 0;
            for &id in &pred_ids {
                let options = WatchOptions::new()
                    .with_filters([WatchFilterType::NoPut])
                    .with_watch_id(id);
                self.conn
                    .call_once(
                        OP,
                        stream.stream.watch(predecessor.as_slice(), Some(options)),
                    )
                    .await?;
            }
            next = loop {
                let response = tokio::select! {
                    message = stream.stream.message() => match message {
                        Ok(Some(response)) => response,
                        Ok(None) => break Next::broken(false, "the watch stream ended"),
                        Err(e) => break Next::broken(false, e),
                    },
                    () = lease.needs_tending() => {
                        lease.tend(self.key).await?;
                        continue;
                    }
                };
                let deleted = match stream.classify(&response, &pred_ids) {
                    Seen::Created(id, revision) => {
                        // The id the server gave, should it not honour the one asked for.
                        if !pred_ids.contains(&id) {
                            pred_ids.push(id);
                        }
                        created += 1;
                        // The first watch's start bounds what the read must cover.
                        if created > 1 || revision <= seen {
                            continue;
                        }
                        match self.check(rev, revision).await? {
                            (Ahead::Key(still), _) if still == predecessor => continue,
                            (Ahead::Key(other), seen) => Next::Wait(other, seen),
                            (Ahead::Nobody, seen) => Next::Held(seen),
                            (Ahead::Owner(hold), _) => Next::Enter(hold),
                        }
                    }
                    Seen::PredecessorDeleted => {
                        Next::Check(response.header().map_or(rev, |h| h.revision()))
                    }
                    Seen::OwnDeleted => {
                        return Err(lease_lost(
                            self.key,
                            "our waiting key was deleted (its lease expired or was revoked)",
                        ));
                    }
                    Seen::Canceled(why) => break Next::broken(true, why),
                    Seen::Nothing => continue,
                };
                // Our predecessor is gone: one wake-up.
                self.conn.shared.wakeups.fetch_add(1, Ordering::Relaxed);
                breaks = 0;
                for &id in &pred_ids {
                    let _ = stream.stream.cancel(id).await;
                }
                break deleted;
            };
            if let Next::Broken(refused, why) = &next {
                watch = None;
                breaks += 1;
                tracing::debug!(
                    backend = NAME,
                    key = self.key,
                    why,
                    "watch broke while waiting; re-checking"
                );
                if breaks > WATCH_BREAKS {
                    return Err(match refused {
                        true => LockError::backend(NAME, OP, why.clone()),
                        false => LockError::unavailable(NAME, OP, why.clone()),
                    });
                }
            }
        }
    }

    /// One read: the newest blocking key older than ours (an owner's waiter: the oldest,
    /// the holder, which may turn out to be its owner's hold before its own turn comes),
    /// and our own key, in a state at least as new as revision `floor`. Fails with
    /// `LeaseLost` when our key is gone.
    async fn check(&self, rev: i64, floor: i64) -> Result<(Ahead, i64)> {
        let (older, seen) = self.read_older(rev, floor, true).await?;
        let older: Vec<&[KeyValue]> = older.iter().map(Vec::as_slice).collect();
        let Some(kv) = newest(&older) else {
            return Ok((Ahead::Nobody, seen));
        };
        let hold = self
            .owner
            .and_then(|owner| Hold::of(self.conn, self.key, kv, owner));
        match hold {
            Some(hold) => Ok((Ahead::Owner(Box::new(hold)), seen)),
            None => Ok((Ahead::Key(kv.key().to_vec()), seen)),
        }
    }

    /// One read: per blocking range, its keys older than ours (`newest_only`: the newest
    /// of them; otherwise all, names only), and our own key, in a state at least as new as
    /// revision `floor`, which is the answer's. Fails with `LeaseLost` when our key is gone.
    ///
    /// The read is member-local (serializable: no leader round, not queued behind the
    /// fsync of the writes in flight), which the answer's revision makes safe: a state at
    /// or after `floor` (the predecessor's deletion, or a watch's start) in which no key
    /// is older than ours stays so, since keys only get newer revisions; and our key's
    /// deletion after that state is seen by its watch (while waiting) or by the hold's
    /// watch, which starts at that revision. A member whose state is older than `floor`
    /// (another endpoint, lagging) is not trusted: the read is made again, linearizable.
    pub(crate) async fn read_older(
        &self,
        rev: i64,
        floor: i64,
        newest_only: bool,
    ) -> Result<(Vec<Vec<KeyValue>>, i64)> {
        const OP: &str = "acquire";
        let ranges = self.ranges();
        let read = |serializable: bool| {
            let mut mine = GetOptions::new();
            if serializable {
                mine = mine.with_serializable();
            }
            let mut ops = vec![TxnOp::get(self.my_key.as_str(), Some(mine))];
            for (start, end) in &ranges {
                let mut older = GetOptions::new()
                    .with_range(end.as_str())
                    .with_max_create_revision(rev - 1);
                older = match (newest_only, self.owner) {
                    (true, None) => older
                        .with_sort(SortTarget::Create, SortOrder::Descend)
                        .with_limit(1),
                    // An owner's waiter reads the holder, with its value (owner and count).
                    (true, Some(_)) => older
                        .with_sort(SortTarget::Create, SortOrder::Ascend)
                        .with_limit(1),
                    (false, _) => older.with_keys_only(),
                };
                if serializable {
                    older = older.with_serializable();
                }
                ops.push(TxnOp::get(start.as_str(), Some(older)));
            }
            Txn::new().and_then(ops)
        };
        let mut answer = self.conn.txn(OP, read(true)).await?;
        let mut seen = revision(OP, answer.header())?;
        if seen < floor {
            tracing::debug!(
                backend = NAME,
                key = self.key,
                seen,
                floor,
                "a member-local read lagged; reading again through the leader"
            );
            answer = self.conn.txn(OP, read(false)).await?;
            seen = revision(OP, answer.header())?;
        }
        let ops = answer.op_responses();
        let mine = ranged(OP, &ops, 0)?.first().map(KeyValue::create_revision);
        if mine != Some(rev) {
            return Err(lease_lost(
                self.key,
                "our waiting key was deleted (its lease expired or was revoked)",
            ));
        }
        let older = (1..=ranges.len())
            .map(|i| ranged(OP, &ops, i).map(<[KeyValue]>::to_vec))
            .collect::<Result<Vec<_>, Error>>()?;
        Ok((older, seen))
    }
}

#[cfg(test)]
#[path = "acquire_tests.rs"]
mod tests;
