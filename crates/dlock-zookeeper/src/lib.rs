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
//! Needs ZooKeeper 3.5 or later (container nodes, `create2`; 3.6 for woken election
//! observers, see [Elections](#elections)); tested with 3.8.0.
//!
//! # Protocol
//!
//! A key maps to the directory `{base}/{segment}`: `{base}` is the URL's chroot path
//! followed by `root` (default `/dlock`), `{segment}` the key percent-encoded into one path
//! segment (everything outside `[A-Za-z0-9._:@-]`, and names made only of dots; keys whose
//! encoding is longer than 240 bytes keep a readable prefix and a SHA-256 digest). No key
//! reaches outside `{base}` and two keys never share a directory. Every node the lock
//! creates gets the ACL that [Security](#security) describes. A lock (or lease) node's
//! data is the creating process's
//! [`holder_description`](dlock_core::holder_description) (`NAME@HOST:PID`), a key
//! directory's the key itself (both written by the create that makes the node, no request
//! of their own; see [Inspecting](#inspecting)).
//!
//! **Acquire**
//! 1. Send, in one round trip (one session's requests are answered in order): `create
//!    {dir}/_c_{uuid}-lock-` (exclusive; `_c_{uuid}-__WRIT__` with `curator=read_write_lock`,
//!    see [Interop](#interop-with-curator-go-zookeeper-and-kazoo)) or
//!    `{dir}/_c_{uuid}-__READ__` (shared, see
//!    [Shared holds](#shared-holds)) as an ephemeral-sequential node and `getChildren {dir}`, whose
//!    answer already holds the new node. The key directory is usually there (it outlives
//!    its last lock node, see Release). If it is not (`NoNode`: first use of the key, or
//!    the server reaped it), send `create {dir}` as a container node ahead of the same two
//!    requests, in one round trip; if the base path is missing too, create it (persistent
//!    nodes) and start again. The directory is not created on every acquire: a create that
//!    fails (`NodeExists`) is still a write the ensemble agrees on and logs.
//! 2. Contenders are the children whose names end in `-lock-`, `latch-` (an election
//!    candidate's, see [Elections](#elections)), `__lock__` or `__WRIT__`
//!    (exclusive), `__READ__` or `__rlock__` (shared), followed by 10 digits, ordered by
//!    those digits. An exclusive node holds the key when it is the lowest; a shared node
//!    when no exclusive node is lower. If ours holds, the key is ours; the fencing token is
//!    our node's `czxid`.
//! 3. Otherwise (`try_acquire`: delete our node and answer "held") set a watch on one
//!    node only (`getData` with a watch): an exclusive node watches the contender just
//!    before it, a shared node the last exclusive contender before it. `NoNode` means it went away
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
//!    looked up by its uuid first). A session that expires while waiting is replaced and
//!    the acquire starts over.
//!
//! **Release**: `delete` our node, one write. `NoNode` means the node was not ours any
//! more: `NotHeld`. On connection loss the delete is retried, then left to a background
//! task while the session lives. The key directory stays, as with Curator: it is a
//! container node, which the server's container reaper deletes once it is empty (every
//! `znode.container.checkIntervalMs`, a JVM system property of the server, default 60 s;
//! the reaper's delete fails harmlessly if a contender created a node meanwhile, and an
//! acquire that finds the directory gone creates it again). Deleting it on every release
//! would cost the next acquire's `create {dir}` too: two writes per cycle for nothing.
//!
//! **What stays on the server**: only the empty key directories of keys used recently
//! (for a semaphore, `{dir}` and its empty `locks` and `leases`), each until the
//! reaper's next pass (at most about two check intervals, three for a semaphore's; they hold no
//! lock and no session, and no data but their key). No lock node outlives its lock: released, withdrawn and
//! abandoned nodes are deleted, and a dead session's go with it.
//!
//! **Extend / renewal**: the session keeps the node, so nothing is extended on the server,
//! the lease's ttl is not used, and nothing is asked of the server either: the session's
//! heartbeats keep every node of the client alive at once, and each lease's watch on its
//! own node (see Loss) says when it was deleted. The grant is marked
//! [kept alive](dlock_core::raw::Grant::kept_alive): the watchdog sends no renewals and keeps
//! no timer per lease. [`Lease::extend`](dlock_core::Lease::extend) answers `Ok` at once while the client is connected and no
//! deletion of our node has been notified; `NotHeld` once it has, or once the session
//! ended; while the client is disconnected they wait for it to reconnect (the loss signal
//! bounds that wait). So holding many keys costs no requests per renewal, and a busy server
//! cannot make a renewal late. The server sends a deletion's notification when the delete
//! commits, ahead of its answer to any later request of this session.
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
//! # Shared holds
//!
//! [`LockOptions::shared`](dlock_core::LockOptions::shared) takes a read hold: Curator's
//! `InterProcessReadWriteLock` recipe, with its node names, on the same directory as the
//! mutex (steps above). Any number of shared holds hold together; an exclusive hold waits
//! for every node ahead of it, shared or not. Readers that arrive while a writer waits
//! queue behind its node, so a stream of readers cannot starve a writer, across clients,
//! by the server's order alone; the queue is FIFO in both modes.
//!
//! - **Which node a reader watches**: the *last* exclusive node before it. Curator's read
//!   lock watches the first one instead, and is woken (and lists the directory) once per
//!   writer ahead of it. The last writer ahead of us can only go once every earlier writer
//!   went, or by giving up, so its deletion is in the usual case the one that admits us.
//! - **Wake-ups**: a writer's release wakes exactly the readers between it and the next
//!   exclusive node (all of them admitted, one wake-up each), or the next writer if it is
//!   directly behind (one wake-up). A writer queued behind several readers watches the one
//!   just before it: each reader that leaves before the others wakes it at most once, as
//!   for Curator's write lock; a release wakes at most one writer.
//! - **Tokens**: the node's `czxid` in both modes. A writer holds only once every node
//!   created before its own is gone, and no node created after it can hold first: its token
//!   is greater than every token handed out on the key before it, shared or exclusive. A
//!   reader's token is greater than the token of every writer that held before it (those
//!   writers' nodes were created before the reader's); readers holding together have
//!   distinct tokens in no particular order.
//! - **Round trips**: as for the mutex, in both modes (table below).
//!
//! # Permits
//!
//! [`LockOptions::permits`](dlock_core::LockOptions::permits) takes one of N permits (a
//! counting semaphore): Apache Curator's `InterProcessSemaphoreV2` recipe, with its layout
//! and names, so dlock and Curator holders of one path with the same N count each other's
//! permits. The key directory `{dir}` (mapped from the key as for a lock) holds two
//! children: `locks`, the directory of a mutex (the lock recipe above, exclusive,
//! `_c_{uuid}-lock-` names whatever `curator` says, as Curator's `InterProcessMutex`), and
//! `leases`, one ephemeral-sequential `_c_{uuid}-lease-{seq}` node per holder. `{dir}`,
//! `locks` and `leases` are container nodes, made when missing as Curator's
//! `creatingParentContainersIfNeeded` makes them. Use a key either as a lock or as a
//! semaphore: a lock and a semaphore on one key do not see each other.
//!
//! **Acquire** (a limit of N)
//! 1. Take the mutex on `{dir}/locks` (steps 1 to 5 above; `try_acquire` gives up at once
//!    if another acquirer holds it). Acquirers hold it in turn, FIFO: at most one counts
//!    the leases at a time, and a waiter that came first is admitted first.
//! 2. Send `create {dir}/leases/_c_{uuid}-lease-` (ephemeral-sequential) and `getChildren
//!    {dir}/leases` in one round trip (`leases` missing: `create` it as a container ahead
//!    of the same two, as for a key directory). If our node is not listed, create it
//!    again (Curator's `RETRY_DUE_TO_MISSING_NODE`).
//! 3. If `leases` has at most N children (ours included; every child counts, whatever its
//!    name, as in Curator) the permit is ours: `delete` our mutex node and answer. The
//!    fencing token is our lease node's `czxid`.
//! 4. Otherwise (`try_acquire`: delete both nodes, in one round trip, and answer "held")
//!    `getChildren {dir}/leases` with a watch, still holding the mutex, and count again
//!    each time the watch fires (a lease released, or its holder's session ended; each
//!    counted in [`LockStats::wakeups`](dlock_core::LockStats)). Nobody else creates a
//!    lease meanwhile (they wait for the mutex), so a release is what wakes us.
//! 5. Timeout, failure or cancellation: both nodes are deleted (in the background if need
//!    be), as for a lock's node.
//!
//! Clients that disagree on N each count the holders against their own N (Curator's
//! rule): beside two holders of `Permits(2)`, `Permits(2)` waits and `Permits(3)` gets in.
//!
//! **Release**: `delete` our lease node, one write; `NoNode` is `NotHeld`. The directories
//! stay for the container reaper: `locks` and `leases` go at its first pass once empty,
//! `{dir}` at the next one. **Extend, renewal, loss**: as for a lock, on the lease node
//! (the session keeps it; the watch on it reports its deletion). **Crash**: the lease node
//! goes with the session, one session timeout after the last heartbeat.
//!
//! - **Never more than N**: a holder was admitted seeing at most N lease nodes, its own
//!   created before it looked. Of N+1 holders at one instant, the last to count saw every
//!   other's node (created before their own counts, not yet deleted): N+1 nodes. This
//!   holds whatever the mutex does; the mutex gives the order and keeps waiters from all
//!   counting at once.
//! - **Tokens**: leases are created under the mutex and admitted in the order they were
//!   created (a later acquirer creates its lease only after the earlier one let the mutex
//!   go, admitted), so a permit's `czxid` is greater than every earlier permit's on the
//!   key: strict, as for the mutex. (A client that creates lease nodes without the mutex
//!   breaks the order, not the cap.)
//! - **Wake-ups**: a release wakes only the acquirer counting under the mutex (one
//!   notification, one listing); when that one is admitted, its mutex delete wakes the next
//!   waiter in the mutex queue, which creates its lease and counts. Waiters further back
//!   are not woken.
//!
//! **Curator interop** (`tests/permits.rs`, with the nodes made as Curator makes them):
//! `new InterProcessSemaphoreV2(client, ZookeeperConfig::key_dir(key), n)` on the same
//! ensemble and N. Curator writes its host address into its lease nodes, ours carry our
//! holder description; neither side reads them.
//! Curator's `SharedCountReader` limit is not read: give dlock the same number.
//!
//! # Round trips
//!
//! Measured through a proxy that delays each direction by half a round trip
//! (`tests/round_trips.rs`):
//!
//! | operation | round trips | requests |
//! |---|---|---|
//! | `try_acquire` / `acquire`, key free | 1 | `create` node + `getChildren`, pipelined |
//! | the same, key directory missing (first use, or reaped) | 2 | the above (`NoNode`), then `create` dir + `create` node + `getChildren`, pipelined |
//! | `try_acquire`, key held | 2 | `create` node + `getChildren`, then `delete` node |
//! | `acquire` that waits | 2 to queue | the above, then `getData` with a watch on the predecessor |
//! | contended hand-off | 2 from the release call | the release's `delete` (1/2), the watch notification to the next waiter only (1/2), its `getChildren` (1) |
//! | `extend` (by hand; the watchdog sends none) | 0 | none: the session's state and the node's watch answer |
//! | after each grant | none waited for | `exists` with a watch on our node, sent by the loss signal |
//! | `release` | 1 | `delete` node |
//! | first use of a new base path | +3 | `NoNode` for the node, then for the directory; `create` the base path's nodes; the pipelined creates again |
//! | permit `try_acquire` / `acquire`, a permit free | 3 | mutex `create` + `getChildren`; lease `create` + `getChildren`; mutex `delete` |
//! | the same, directories missing (first use) | 7 | mutex `create` (`NoNode`); `create locks` (`NoNode`); `create {dir}`; `locks` + mutex node + listing; lease (`NoNode`); `leases` + lease + listing; mutex `delete` (5 when only `locks` and `leases` were reaped) |
//! | permit `try_acquire`, every permit held | 3 | mutex, lease and count as above, then both `delete`s together |
//! | permit `try_acquire`, another acquirer holds the mutex | 2 | mutex `create` + `getChildren`, then `delete` |
//! | permit hand-off to the counting waiter | 3 from the release call | the release's `delete` (1/2), the children watch's notification (1/2), `getChildren` with a watch (1), mutex `delete` (1) |
//! | permit `release` | 1 | `delete` lease node |
//! | [`from_url`] with credentials | +2 | `auth` once the session is open, then `getACL` on the base path |
//! | [`from_url`] with `auth=sasl` | +2 (by the protocol, not measured) | the `DIGEST-MD5` exchange (two `sasl` packets, the first pipelined with the connect request), then `whoAmI` and `getACL` on the base path, pipelined; again on every reconnection |
//!
//! Permit round trips are measured with a 400 ms round trip (busy-machine write latency
//! adds up over their three writes). Writes per uncontended permit cycle: four (mutex
//! node `create` and `delete`, lease node `create` and `delete`).
//!
//! Writes per uncontended cycle: two (`create` node, `delete` node), as the raw ephemeral
//! create + delete; plus two reads (`getChildren`, and the loss signal's `exists`).
//!
//! On loopback (standalone 3.8.0 server, 2 shared cores): `try_acquire` + `release` p50
//! 1.6 ms (p99 12 ms); release-to-waiter hand-off p50 1.9 ms (p99 8 ms); a permit's
//! `try_acquire` + `release` p50 2.7 ms (p99 10 ms). In `lockbench`
//! (same machine, busy, five runs), one client's acquire + release of one key costs 0.63×
//! to 1.39× the raw ephemeral create + delete measured in the same run, p50 0.74 to
//! 0.84 ms (1.9× to 3.3× and 1.4 to 3.4 ms before the key directory's create and delete
//! were cut).
//!
//! # Elections
//!
//! [`Election`](dlock_core::Election) runs Apache Curator's `LeaderLatch` recipe on the
//! key directory, so a dlock candidate and a Curator `LeaderLatch(client, path, id)` on
//! [`ZookeeperConfig::key_dir`] of the key never both lead. Needs ZooKeeper 3.6 or later
//! for woken observers (`addWatch`; on 3.5 they read the leader every second instead, see
//! Observe below).
//!
//! - **Campaign**: the lock recipe above (steps 1 to 5: the same round trips, waiting,
//!   deadline, cancellation and protected create), with the node
//!   `{dir}/_c_{uuid}-latch-{seq}` (Curator's `LeaderLatch` name, its `LOCK_NAME` after
//!   the protected prefix) whose data is the candidate's **value**, written by the create.
//!   The candidate leads when its node is the lowest contender, and watches the one just
//!   before it until then. The **term** is the node's `czxid`, as for a lock's fencing
//!   token: strictly larger for every new leader. One round trip when the directory
//!   exists.
//! - **Which nodes a candidate waits for**: every contender (step 2), and `latch-` counts
//!   as an exclusive name for every dlock hold. So a campaign waits behind a plain lock on
//!   the key, and a plain lock (exclusive or shared) waits behind a leader and the
//!   candidates queued ahead of it, as on other backends. Curator's latch sorts every
//!   child by the text after its last `latch-`: our candidates' nodes are ordered with its
//!   own by sequence, so both sides agree who leads and who is next; our plain `-lock-`
//!   nodes sort after all of them (by their whole name), so **Curator's latch does not wait
//!   for a dlock plain lock on the key** (dlock's locks do wait for Curator's latch). Use a
//!   key either as an election or as a lock beside Curator.
//! - **Proclaim**: `setData` on our own node (any version), one round trip. The node's
//!   name holds our uuid and it is ephemeral on our session: nobody else's node can be at
//!   that path, so no version check is needed; `NoNode` (deleted, or our session ended) is
//!   [`NotHeld`](dlock_core::LockError::NotHeld). The term stays.
//! - **Resign**: the release above, one `delete`; the next candidate's watch fires.
//! - **Leader** ([`Election::leader`](dlock_core::Election::leader)): two round trips,
//!   `getChildren {dir}`, then `getData` of the lowest contender if it is exclusive (a
//!   candidate's, Curator's, or a plain lock's node): its data is the value (a Curator
//!   participant's id), its `czxid` the term. One round trip when the key has no
//!   contender. [`inspect`](dlock_core::DistributedLock::inspect) shows the same node as
//!   the exclusive holder, its data as `who`.
//! - **Observe**: the stream adds a persistent recursive watch on `{dir}` (`addWatch`, one
//!   round trip, set before it returns; the directory need not exist). Every create,
//!   delete and data change of a node in it wakes the observer: a candidate queued, a
//!   leader resigned, a session expired (the server deletes its node, and notifies), a
//!   proclaim. A grant needs no event of its own: a candidate leads the moment the nodes
//!   ahead of it are deleted, and that deletion is the event. An observer sees a change
//!   half a round trip after it commits and reads the leader (2 round trips); a proclaim
//!   shows three round trips after its call (`tests/round_trips.rs`). Wake-ups
//!   **coalesce**: a task takes the watch's events as they arrive and marks a
//!   `tokio::sync::watch` channel changed, so the events that arrive while an observer
//!   reads the leader, or while nobody polls its stream, leave one pending wake-up (one
//!   leader read), never a queue that grows with the key's traffic (`tests/election.rs`:
//!   100 queue changes, at most a few wake-ups). Dropping the stream aborts the task,
//!   which drops the watch (the client removes it). Declared
//!   [`Observe::Woken`](dlock_core::Observe::Woken) with a `recheck` of 1 s, which only
//!   bounds notifications lost while the observer's connection moves to another member
//!   (ZOOKEEPER-4698; a reconnection wakes the observer too). The stream ends with an
//!   error when the observer's session ends. **ZooKeeper 3.5** has no `addWatch`: the
//!   subscription gets `Unimplemented`, logs a warning, and the observer reads the leader
//!   every second instead, so a leader that leads for less may be missed (what
//!   [`Observe::Polled`](dlock_core::Observe::Polled) `{ every: 1 s }` promises).
//!   The capabilities still say `Woken`: they are known before any I/O, and neither the
//!   handshake nor zookeeper-client tells the server's version (it is only learnt when
//!   the first observer subscribes). One session may observe and wait as a
//!   candidate at once: the server sends one notification per deletion, and the client
//!   hands it to both watches (`tests/election.rs`).
//! - **Interop**, `tests/leader_latch.rs` (Curator's nodes and rule on a raw session): a
//!   Curator participant leading makes a dlock candidate (and a plain lock) wait and
//!   `leader()` names its id; a dlock leader makes a Curator participant wait until it
//!   resigns.
//!
//! # Key sets
//!
//! A set of keys taken as one hold ([`LockExt::acquire_all`](dlock_core::LockExt::acquire_all))
//! is taken key by key, in ascending byte order, each key with the protocol above: one
//! lock node per key, created in that order on the client's one session, so N free keys cost
//! N times a single key's round trips, each key's token is its own node's czxid, and a lost
//! session loses every key of the set at once. Not one `multi` for the whole set: a `multi`
//! cannot wait in a key's queue. While a set is being taken, its keys taken so far are held
//! by the set's nodes: a waiter on one of them watches its predecessor as usual and is woken
//! when the set deletes its node on release, or when it gives the key back because a later
//! key stayed busy (before `acquire_all` returns).
#![doc = include_str!("reentry.md")]
#![doc = include_str!("operating.md")]
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod acquire;
mod auth;
mod config;
mod contender;
mod election;
mod error;
mod held;
mod inspect;
mod nodes;
mod reentry;
mod request;
mod semaphore;
mod session;
#[cfg(feature = "tls")]
mod tls;

pub use auth::{Digest, Sasl};
pub use config::{CuratorRecipe, Tls, ZookeeperConfig};
pub use session::ZookeeperBackend;

use dlock_core::Result;
use dlock_core::raw::LockClient;

/// The backend's name in errors and logs.
const NAME: &str = "zookeeper";

/// The ZooKeeper lock: a [`LockClient`] of a [`ZookeeperBackend`].
pub type ZookeeperLock = LockClient<ZookeeperBackend>;

/// URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["zk", "zookeeper", "zks"];

/// Parse `url` (see [URL](crate#url)), then open a session within the connect timeout
/// (see [`ZookeeperBackend::connect`]).
///
/// # Errors
/// [`LockError::InvalidConfig`](dlock_core::LockError::InvalidConfig) for a bad URL, before
/// any network I/O, or TLS files that cannot be read;
/// [`LockError::Unavailable`](dlock_core::LockError::Unavailable) when no member answers
/// within the connect timeout; [`LockError::Backend`](dlock_core::LockError::Backend) when
/// the server refuses the session, the TLS handshake or the credentials.
pub async fn from_url(url: &str) -> Result<ZookeeperLock> {
    let config = ZookeeperConfig::from_url(url)?;
    Ok(LockClient::new(ZookeeperBackend::connect(config).await?))
}
