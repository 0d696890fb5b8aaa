//! dlock on ZooKeeper: ephemeral-sequential lock nodes, a watch on the predecessor only, and a
//! lease that lives as long as the client's session.
//!
//! ```no_run
//! # async fn demo() -> dlock_core::Result<()> {
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, LockOptions, Wait};
//!
//! let lock = dlock_zookeeper::from_url("zk://127.0.0.1:2181?session_timeout=10s").await?;
//! let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
//! let lease = lock.acquire("reports/nightly", &opts).await?;
//! // ... work, passing lease.fencing_token() (the lock node's czxid) to storage ...
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! The recipe is ZooKeeper's lock recipe as Apache Curator's `InterProcessMutex` runs it,
//! with Curator's node names, so Curator, go-zookeeper and (configured) kazoo clients
//! exclude each other with dlock on the same key. One client holds one session; every lease
//! taken through it lives as long as that session, so the lease's ttl is not used: a
//! crashed holder's key frees one session timeout after its last heartbeat
//! ([`Expiry::Session`](dlock_core::Expiry::Session)).
//!
//! Needs ZooKeeper 3.5 or later (container nodes, `create2`); tested with 3.8.0.
//!
//! # Protocol
//!
//! A key maps to the directory `{base}/{segment}`: `{base}` is the URL's chroot path
//! followed by `root` (default `/dlock`), `{segment}` the key percent-encoded into one path
//! segment (everything outside `[A-Za-z0-9._:@-]`, and names made only of dots; keys whose
//! encoding is longer than 240 bytes keep a readable prefix and a SHA-256 digest). No key
//! reaches outside `{base}` and two keys never share a directory.
//!
//! **Acquire**
//! 1. Send, in one round trip (one session's requests are answered in order): `create
//!    {dir}` as a container node (`NodeExists` while the key is in use), `create
//!    {dir}/_c_{uuid}-lock-` as an ephemeral-sequential node, and `getChildren {dir}`, whose
//!    answer already holds the new node. If the base path is missing (`NoNode`), create it
//!    (persistent nodes) and start again.
//! 2. Contenders are the children whose names end in `-lock-` or `__lock__` followed by 10
//!    digits, ordered by those digits. The lowest holds the lock: if that is our node, the
//!    key is ours; the fencing token is our node's `czxid`.
//! 3. Otherwise (`try_acquire`: delete our node and answer "held") set a watch on the
//!    contender just before ours only (`getData` with a watch). `NoNode` means it went away
//!    already: list again at once. When the watch fires, whatever the event, list again
//!    (step 2): a watch event never means "you hold it" by itself. Each such wake-up is
//!    counted in [`LockStats::wakeups`](dlock_core::LockStats). If our own node is gone
//!    from the listing (an operator deleted it), queue again with a new node.
//! 4. When the connection drops during the create, its outcome is unknown. Once connected
//!    again: `sync`, list the directory, and look for a child starting `_c_{uuid}-`; accept
//!    it only if its `ephemeralOwner` is our session (a node with our uuid from another
//!    session is deleted); otherwise create again (Curator's protected mode).
//! 5. When the wait times out, fails, or the acquire future is dropped, our node is deleted
//!    (retried on connection loss, in a background task if need be; an unanswered create is
//!    looked up by its uuid first), and the key directory too when that leaves it empty.
//!    A session that expires while waiting is replaced and the acquire starts over.
//!
//! **Release**: `delete` our node and, in the same round trip, the key directory (refused
//! with `NotEmpty` while others wait; container nodes are reaped by the server too, but
//! only at its check interval). `NoNode` means the node was not ours any more: `NotHeld`.
//! On connection loss the delete is retried, then left to a background task while the
//! session lives.
//!
//! **Extend / renewal**: the session keeps the node, so nothing is extended on the server
//! and the lease's ttl is not used. [`Lease::extend`](dlock_core::Lease::extend) and the
//! watchdog's renewals only check that the node is still there and ours (`exists`):
//! `NotHeld` after an operator deleted it.
//!
//! **Loss**: each lease watches its own node (`exists` with a watch) and the session's
//! state. [`Lease::lost`](dlock_core::Lease::lost) fires when the node is deleted, when the
//! session expires or is closed, or when the client stays disconnected for `1/4` of the
//! session timeout `T`. The client reports a disconnection after `2T/5` without a byte from
//! the server and pings after `3T/20` idle, so by then the server may have last heard from
//! us `17T/20` ago: the holder hears of the loss `3T/20` before the server can expire the
//! session and hand the key on. (Curator reports LOST a whole `T` after SUSPENDED, which
//! can be after another client took the key.)
//!
//! # Round trips
//!
//! Measured through a proxy that delays each direction by half a round trip
//! (`tests/round_trips.rs`):
//!
//! | operation | round trips | requests |
//! |---|---|---|
//! | `try_acquire` / `acquire`, key free | 1 | `create` dir + `create` node + `getChildren`, pipelined |
//! | `try_acquire`, key held | 2 | the above, then `delete` node + `delete` dir, pipelined |
//! | `acquire` that waits | 2 to queue | the above, then `getData` with a watch on the predecessor |
//! | contended hand-off | 2 from the release call | the release's `delete` (1/2), the watch notification to the next waiter only (1/2), its `getChildren` (1) |
//! | `extend` / each renewal (every ttl/3) | 1 | `exists` on our node |
//! | `release` | 1 | `delete` node + `delete` dir, pipelined |
//! | first use of a new base path | +2 | `create` the base path's nodes, then start again |
//!
//! On loopback (standalone 3.8.0 server, 2 shared cores): `try_acquire` + `release` p50
//! 2.5 ms (p99 14 ms); release-to-waiter hand-off p50 2.2 ms (p99 8 ms).
//!
//! # Capabilities
//!
//! | capability | value | why |
//! |---|---|---|
//! | fair | yes | waiters queue by sequence number, FIFO |
//! | fencing | strict | the node's `czxid`: zxids only grow, across leader elections and restarts |
//! | expiry | session (`ttl` not used) | the ephemeral node lives as long as the session; a silent holder loses it one session timeout after its last heartbeat |
//! | releases on disconnect | no | a closed connection is not a closed session: the session (and the lock) survives until it times out, so a client can move to another member |
//! | wake-up | notification, one per release | only the next contender watches the holder's node |
//! | max key length | 1024 bytes | the default; long keys are shortened with a digest |
//!
//! # URL
//!
//! ```text
//! zk://host1[:port],host2[:port]...[/chroot][?option=value&...]
//! ```
//! `zookeeper://` is accepted too. The port defaults to 2181; IPv6 hosts go in brackets.
//! The chroot path is a prefix for every node the lock creates (it is created if missing).
//! Credentials in the URL are refused (ZooKeeper auth is not supported yet).
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `root` | `/dlock` | the path (under the chroot) holding one directory per key |
//! | `session_timeout` | `10s` | asked of the server, which negotiates it into its `minSessionTimeout..=maxSessionTimeout` (2 to 20 ticks by default); the crash-release bound. `1500ms`, `2s`, `1.5s`, `1m` |
//! | `connect_timeout` | `5s` | how long opening a session may take, in [`from_url`] and when an expired session is replaced |
//!
//! # Failure modes
//!
//! - **Holder crash**: its session stops heartbeating; the server expires it one session
//!   timeout later, deletes its node, and the next waiter's watch fires.
//! - **Partition of the holder**: the holder's client reports `Disconnected` after `2/5` of
//!   the session timeout and `lost()` fires `1/4` of it later, before the server expires
//!   the session (at one session timeout) and the next waiter takes the key. If the holder
//!   reconnects in time the node is still there, but the lease was already reported lost.
//! - **A member stops**: the client moves its session to another member; the node, the
//!   watches and the lease stay valid, provided it reconnects within `1/4` of the session
//!   timeout (measured in `tests/ensemble.rs`: disconnected for 0.4 s, with a 10 s session
//!   that allows 2.5 s; choose a session timeout that leaves room for a leader election).
//! - **The ensemble loses its majority or restarts**: no session can be kept; `lost()`
//!   fires as for a partition (measured: 3.4 s after a majority stopped, 10 s session).
//!   Sessions that the new leader still knows are restored on reconnect with their nodes;
//!   the others expire and their nodes go.
//! - **Operator deletes the lock node**: `lost()` fires at once (`NotHeld`); `release` and
//!   `extend` answer `NotHeld`; the next waiter takes the key.
//! - **Request timeouts**: no request waits longer than a session timeout (the client
//!   cannot keep the session longer than that without an answer either), and never past the
//!   acquire's deadline.
//!
//! # Interop with Curator, go-zookeeper and kazoo
//!
//! Another client excludes dlock on a key when it locks the same directory,
//! [`ZookeeperConfig::key_dir`] of the key (`/dlock/orders%2F42` for the key `orders/42`).
//!
//! - **Curator** `InterProcessMutex` on the same directory (`{base}/{segment}`): its nodes
//!   are `_c_{uuid}-lock-{seq}` like ours and it orders every child by the text after the
//!   last `lock-`, so both sides see the same order. Do not put other children in a lock
//!   directory: Curator counts them as contenders. Curator's revocation (writing
//!   `__REVOKE__` to the holder's node) is not supported: dlock ignores it.
//! - **go-zookeeper** `zk.NewLock(conn, dir, acl)`: nodes `_c_{32 hex}-lock-{seq}`, ordered
//!   by sequence; same order as ours.
//! - **kazoo** `Lock(client, dir, extra_lock_patterns=["-lock-"])` (kazoo 2.8+): it then
//!   counts our nodes, and we count its `{hex}__lock__{seq}` nodes. Without the option kazoo
//!   ignores our nodes and both can hold the key at once. kazoo and Curator must never share
//!   a directory (Curator sorts kazoo's nodes by their whole name).
//! - Sequence numbers wrap after 2^31 creates in one directory (ZOOKEEPER-2944) and every
//!   implementation's order breaks then; dlock deletes empty directories, which resets the
//!   counter.

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod acquire;
mod config;
mod contender;
mod error;
mod held;
mod nodes;
mod request;
mod session;

pub use config::ZookeeperConfig;
pub use session::ZookeeperBackend;

use dlock_core::Result;
use dlock_core::raw::LockClient;

/// The backend's name in errors and logs.
const NAME: &str = "zookeeper";

/// The ZooKeeper lock: a [`LockClient`] of a [`ZookeeperBackend`].
pub type ZookeeperLock = LockClient<ZookeeperBackend>;

/// URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["zk", "zookeeper"];

/// Parse `url` (see [URL](crate#url)), then open a session within the connect timeout.
///
/// # Errors
/// [`LockError::InvalidConfig`](dlock_core::LockError::InvalidConfig) for a bad URL, before
/// any network I/O; [`LockError::Unavailable`](dlock_core::LockError::Unavailable) when no
/// member answers within the connect timeout; [`LockError::Backend`](dlock_core::LockError::Backend)
/// when the server refuses the session.
pub async fn from_url(url: &str) -> Result<ZookeeperLock> {
    let config = ZookeeperConfig::from_url(url)?;
    Ok(LockClient::new(ZookeeperBackend::connect(config).await?))
}
