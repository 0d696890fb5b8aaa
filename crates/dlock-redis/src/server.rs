//! One Redis server speaking dlock's lock protocol: the building blocks of a lock over
//! several independent servers.
//!
//! [`RedisLock`](crate::RedisLock) runs this protocol on one server; `dlock-redlock` runs
//! it on N independent servers and counts votes. Both use exactly these pieces, so the
//! scripts, key names, tokens, wake-ups and clean-up are written once:
//!
//! - [`Node`]: one server (a command connection, the lock scripts, a subscriber
//!   connection). [`Node::acquire`] answers an [`Attempt`]: taken with a fencing token, or
//!   busy with the holder's token and remaining ttl; [`Node::extend`] and
//!   [`Node::release`] are owner-checked (they answer `false` when the key is not ours).
//!   Renewals are batched per node: [`Node::renew`] takes a [`HeldKey`] (made once per
//!   held key), and the node's renewal task sends what has queued as one script call.
//!   A caller that batches renewals itself (Redlock, over all its nodes at once) sends
//!   its batch with [`Node::renew_many`]: one script call, one answer per key. Both batch
//!   the same way: a [`TaskQueue`] into a task started on first use, which [`gather`]s
//!   what queued in one moment (one timer tick's renewals) into one batch.
//! - [`Names`] (a lock key, its fence counter and its release channel, in one hash slot)
//!   and [`new_token`] (a holder's random token, 128 bits, and the holder's description), [`new_reader_token`] for a
//!   shared hold (`r` and 128 bits: every script tells the mode by the token), and
//!   [`new_permit_token`] for a permit (`p`, the limit, `.`, 128 bits: the scripts read
//!   each holder's and waiter's limit from its token).
//! - [`Waiter`] and [`View`]: a waiting acquire subscribes to the key's release channel on
//!   every server *before* it re-tries (so a release in between is not missed), then
//!   sleeps until enough holders announced their release ([`Wake`]) or the shortest
//!   remaining ttl of the [`View`]s it holds runs out.
//! - [`Node::inspect`] reads one server's [`NodeStatus`] of a key (its [`NodeHolder`]s
//!   and [`NodeWaiter`]s) without changing anything; [`Node::held_keys`] lists the keys
//!   held under a prefix. [`token_mode`] and [`token_holder`] read a token's mode and the
//!   holder description it carries.
//! - [`Node::acquire_owned`], [`Node::release_owned`] and [`HeldKey::entry`]: an entry of
//!   an owner's reentrant hold on one server (the hold hash [`Names::hold`] beside the
//!   key; [`Attempt::Entered`] when the key was held under the owner already).
//! - [`InFlight`]: a guard around an acquire request; if the caller drops the future
//!   before the answers arrive, the key may be ours on some servers, so it is released
//!   there in the background.
//! - [`NodeError`]: one failed request to one server. [`NodeError::is_unavailable`] tells a
//!   server that did not answer (for a quorum, a vote against) from one that refused;
//!   [`NodeError::into_lock_error`] maps it to the public error.
//!
//! An acquire over N servers, as `dlock-redlock` does it: [`Names::new`] and
//! [`new_token`]; under an [`InFlight`] guard, [`Node::acquire`] on every server in
//! parallel; with a quorum of [`Attempt::Taken`] the key is held, otherwise
//! [`Node::release`] everywhere, turn each answer into a [`View`] and
//! [`Waiter::subscribe`] / [`Waiter::sleep`] before the next round.

pub use crate::error::Error as NodeError;
pub use crate::gather::{TaskQueue, gather};
pub use crate::inspect::{NodeHolder, NodeStatus, NodeWaiter};
pub use crate::lock::InFlight;
pub use crate::node::{Attempt, ClusterCommands, Connection, Node, Queueing};
pub use crate::renew::HeldKey;
pub use crate::scripts::{
    Names, TOUCH_EVERY, WAITER_LEASE, is_permit_token, is_reader_token, new_permit_token,
    new_reader_token, new_token, token_for, token_holder, token_mode,
};
pub use crate::wait::{Subscribed, View, Waiter, Wake};
