//! One acquisition's protocol ([`Attempt`]): the transaction that puts our key and reads
//! the owner, then the wait for each predecessor's deletion.

use std::fmt;
use std::sync::atomic::Ordering;

use dlock_core::raw::Deadline;
use dlock_core::{LockError, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    WatchFilterType, WatchOptions,
};

use crate::NAME;
use crate::connection::{Conn, ranged, revision};
use crate::error::{Error, lease_lost};
use crate::lease::KeyLease;
use crate::watch::{OWN_WATCH, OwnWatch, Seen};

/// How many times in a row a waiter's watch may break (the stream fails, or the server
/// cancels a watch) before the acquire gives up.
const WATCH_BREAKS: u32 = 3;

/// How an attempt ended.
pub(crate) enum Outcome {
    /// We hold the key. `seen` is a revision at which our key was the oldest; `watch`
    /// the waiter's stream, whose own-key watch becomes the lost signal.
    Held {
        rev: i64,
        seen: i64,
        watch: Option<Box<OwnWatch>>,
    },
    /// The key is held and the deadline does not allow waiting.
    Busy,
    /// The shared lease was gone on the server; no key was put.
    LeaseGone,
}

/// A waiter's next step.
enum Next {
    /// Read who is ahead of us.
    Check,
    /// Wait for this predecessor, which existed at this revision.
    Wait(Vec<u8>, i64),
    /// Nobody is ahead of us at this revision.
    Held(i64),
    /// The watch broke (`true`: the server refused or canceled it).
    Broken(bool, String),
}

impl Next {
    fn broken(refused: bool, why: impl fmt::Display) -> Self {
        Self::Broken(refused, why.to_string())
    }
}

/// One acquisition of `key`: its lock prefix and its own etcd key.
pub(crate) struct Attempt<'a> {
    pub(crate) conn: &'a Conn,
    pub(crate) key: &'a str,
    pub(crate) prefix: String,
    pub(crate) my_key: String,
}

impl Attempt<'_> {
    /// Grant an own lease (a shared one is granted already), create our key and read the
    /// owner in one transaction, then wait for our turn if the deadline allows.
    pub(crate) async fn run(&self, lease: &mut KeyLease, deadline: Deadline) -> Result<Outcome> {
        const OP: &str = "acquire";
        lease.prepare(OP).await?;
        let oldest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let newest_two = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(2);
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.my_key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    self.my_key.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(lease.id())),
                ),
                TxnOp::get(self.prefix.as_str(), Some(oldest)),
                TxnOp::get(self.prefix.as_str(), Some(newest_two)),
            ]);
        let answer = match self.conn.txn(OP, txn).await {
            // The shared lease ended on the server before its keeper noticed.
            Err(e) if e.is_lease_not_found() && matches!(lease, KeyLease::Shared(_)) => {
                return Ok(Outcome::LeaseGone);
            }
            answer => answer?,
        };
        if !answer.succeeded() {
            return Err(Error::Protocol {
                op: OP,
                what: "the key of a fresh attempt already existed",
            }
            .into());
        }
        let rev = revision(OP, answer.header())?;
        let ops = answer.op_responses();
        let owner = ranged(OP, &ops, 1)?.first().map(KeyValue::create_revision);
        if owner == Some(rev) {
            return Ok(Outcome::Held {
                rev,
                seen: rev,
                watch: None,
            });
        }
        if !deadline.may_wait() {
            return Ok(Outcome::Busy);
        }
        // Ours is the newest key, so the second newest is the one we wait for.
        let predecessor = ranged(OP, &ops, 2)?
            .iter()
            .find(|kv| kv.create_revision() < rev)
            .map(|kv| (kv.key().to_vec(), rev));
        self.wait(lease, rev, predecessor).await
    }

    /// Wait until no key under the prefix is older than ours: watch the deletion of the
    /// newest older key (only it: one wake-up per release) and of our own key, keep our
    /// lease alive, re-check after each deletion.
    ///
    /// The predecessor's watch starts at the current revision, so etcd serves it from its
    /// synced watcher group at once (a watch starting in the past is caught up by a loop
    /// that runs every 100 ms, which would delay the hand-off). If the store moved on
    /// since the read that named the predecessor, a read after the watch exists closes the
    /// gap: a deletion before it is seen by that read, one after it by the watch.
    async fn wait(
        &self,
        lease: &mut KeyLease,
        rev: i64,
        known: Option<(Vec<u8>, i64)>,
    ) -> Result<Outcome> {
        const OP: &str = "acquire";
        let mut watch: Option<Box<OwnWatch>> = None;
        let mut next_id = OWN_WATCH + 1;
        let mut breaks = 0;
        let mut next = match known {
            Some((predecessor, seen)) => Next::Wait(predecessor, seen),
            None => Next::Check,
        };
        loop {
            let (predecessor, seen) = match next {
                Next::Wait(predecessor, seen) => (predecessor, seen),
                Next::Check | Next::Broken(..) => match self.check(rev).await? {
                    (None, seen) => return Ok(Outcome::Held { rev, seen, watch }),
                    (Some(predecessor), seen) => (predecessor, seen),
                },
                Next::Held(seen) => return Ok(Outcome::Held { rev, seen, watch }),
            };
            let stream = match &mut watch {
                Some(stream) => stream,
                None => watch.insert(self.conn.watch_own(OP, &self.my_key, seen).await?),
            };
            let mut pred_id = next_id.max(stream.own_id + 1);
            next_id = pred_id + 1;
            let options = WatchOptions::new()
                .with_filters([WatchFilterType::NoPut])
                .with_watch_id(pred_id);
            self.conn
                .call_once(
                    OP,
                    stream.stream.watch(predecessor.as_slice(), Some(options)),
                )
                .await?;
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
                let deleted = match stream.classify(&response, Some(pred_id)) {
                    Seen::Created(id, revision) => {
                        // The id the server gave, should it not honour the one asked for.
                        pred_id = id;
                        if revision <= seen {
                            continue;
                        }
                        match self.check(rev).await? {
                            (Some(still), _) if still == predecessor => continue,
                            (Some(other), seen) => Next::Wait(other, seen),
                            (None, seen) => Next::Held(seen),
                        }
                    }
                    Seen::PredecessorDeleted => Next::Check,
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
                let _ = stream.stream.cancel(pred_id).await;
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

    /// One linearizable read: the newest key older than ours, and our own key. Fails with
    /// `LeaseLost` when our key is gone.
    async fn check(&self, rev: i64) -> Result<(Option<Vec<u8>>, i64)> {
        const OP: &str = "acquire";
        let newest_older = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_max_create_revision(rev - 1)
            .with_limit(1);
        let txn = Txn::new().and_then([
            TxnOp::get(self.prefix.as_str(), Some(newest_older)),
            TxnOp::get(self.my_key.as_str(), None),
        ]);
        let answer = self.conn.txn(OP, txn).await?;
        let seen = revision(OP, answer.header())?;
        let ops = answer.op_responses();
        let mine = ranged(OP, &ops, 1)?.first().map(KeyValue::create_revision);
        if mine != Some(rev) {
            return Err(lease_lost(
                self.key,
                "our waiting key was deleted (its lease expired or was revoked)",
            ));
        }
        let predecessor = ranged(OP, &ops, 0)?.first().map(|kv| kv.key().to_vec());
        Ok((predecessor, seen))
    }
}
