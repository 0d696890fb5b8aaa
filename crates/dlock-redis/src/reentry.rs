//! Reentrant holds ([`LockOptions::owner`](dlock_core::LockOptions::owner)) on one server:
//! the owner's acquire and the release of one entry, as [`Node`] calls, and how `inspect`
//! shows such a hold. The scripts' side is in `scripts/hold.rs`; the protocol in the crate
//! docs (*Reentrant holds*).

use std::time::Duration;

use dlock_core::KeyStatus;

use crate::error::Error;
use crate::inspect::HoldCount;
use crate::node::{Attempt, Node, Queueing};
use crate::scripts::Names;

impl Node {
    /// One attempt to take the lock `names` as (an entry of) `owner`'s reentrant hold,
    /// with a fresh writer's `token` ([`new_token`](crate::server::new_token)) for `ttl`:
    /// [`Attempt::Entered`] at once when the key is held under `owner` (the hold's count
    /// rises by this entry, and its ttl to `ttl` if that is longer), else as
    /// [`Node::acquire`] (a grant makes a hold of `owner` whose first entry is `token`).
    ///
    /// The entry is `token`'s: release it with [`Node::release_owned`] and renew it with a
    /// [`HeldKey::entry`](crate::server::HeldKey::entry) of the same token.
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script.
    pub async fn acquire_owned(
        &self,
        names: &Names,
        token: &str,
        ttl: Duration,
        queueing: &Queueing,
        owner: &str,
    ) -> Result<Attempt, Error> {
        self.acquire_with(names, token, ttl, queueing, false, Some(owner))
            .await
    }

    /// Drop the entry `token` (the token its acquire sent) from `owner`'s hold of the lock
    /// `names`, deleting the key when it was the last entry (and then calling the next
    /// waiter); leave the key's queue if `token` waits in it. `false`: the entry is not in
    /// the key's current hold (released already, or of an earlier hold).
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script.
    pub async fn release_owned(
        &self,
        names: &Names,
        token: &str,
        owner: &str,
    ) -> Result<bool, Error> {
        self.release_with(names, token, true, false, Some(owner))
            .await
    }
}

/// `status` (one exclusive holder) with an owner's hold shown in the holder's `who`:
/// `<owner> (held <count> times; <NAME@HOST:PID of the first entry>)`.
pub(crate) fn show_hold(status: &mut KeyStatus, hold: Option<HoldCount>) {
    let (Some(hold), [holder]) = (hold, status.holders.as_mut_slice()) else {
        return;
    };
    let times = match hold.count {
        1 => "once".to_owned(),
        n => format!("{n} times"),
    };
    holder.who = Some(match holder.who.take() {
        Some(who) => format!("{} (held {times}; {who})", hold.owner),
        None => format!("{} (held {times})", hold.owner),
    });
}
