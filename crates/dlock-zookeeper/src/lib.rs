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
//!
//! # Reentrant holds
//!
//! An acquire with [`LockOptions::owner`](dlock_core::LockOptions::owner) takes a reentrant
//! hold ([`Owner`](dlock_core::Owner)): exclusive, with the mutex recipe above and the
//! same node names, so Curator and kazoo still exclude it (and it them). **Where the owner
//! and count live**: in the data of the node that holds the key, nowhere else:
//! `dlock-owner/1 {count} {owner} {write id} NAME@HOST:PID`, a tag no plain hold, Curator
//! (an IP address) or kazoo (its identifier) writes, so no other node is ever re-entered.
//! Every change of the count is a compare-and-set on the node's data version, so two
//! changes never both apply to one count. The token is the node's `czxid`, as for any
//! hold; a later hold of the same owner is another node, with another path and `czxid`,
//! and every lease is checked against both (an earlier hold's lease gets `NotHeld`).
//! `inspect` shows one exclusive holder, `who` = `job-7 (held 3 times) by NAME@HOST:PID`.
//!
//! - **First acquire**: as a plain one (step 1), the create writing the data with count 1:
//!   one round trip when the key is free.
//! - **Re-entry** (this client or any other, same owner): the create + listing (1) shows
//!   another node first; `getData` of that holder (1): its data names our owner, so one
//!   `multi` (1) sets its count +1 (version-checked) and deletes our queued node (version
//!   0: it never held). Three round trips, granted at once with the holder's `czxid`. A
//!   changed version (another lease moved the count) or a vanished holder fails the whole
//!   `multi`: list again. After a lost connection, our node's absence says the `multi`
//!   applied.
//! - **Re-entry through a client that knows the hold**: each client remembers, per key,
//!   the node its last owner grant was on (until its release frees or misses it). An
//!   acquire of that owner first reads that node (`getData`) and, if it is still there
//!   with the same `czxid` and owner, raises its count with `setData` at the version read:
//!   two round trips, one write, no node of its own. A hint gone stale (the hold ended
//!   through another client) costs one request (`NoNode`), once, before the steps above.
//! - **A client that wrote the count last** also remembers what it wrote and the node's
//!   data version after it, and its next change of that count (a re-entry or a release)
//!   writes at that version at once: one round trip. A refused write (`BadVersion`:
//!   another client changed the count since; `NoNode`: the hold ended elsewhere) is a
//!   failed write the leader logs, then the node is read and written again: three round
//!   trips in all. So one process re-entering its own hold gains a round trip per change,
//!   and clients that take turns on one count lose one. A write at our version lands only
//!   on our node: data versions count per node, and a lock node's name carries a random
//!   uuid, so its path never comes back for another node; the `czxid` a `setData`
//!   answers with is checked all the same.
//! - **Waiting**: a holder of another owner (or a plain or shared hold) makes an owner
//!   wait as usual, watching the node just before its own; its `getData` goes out with the
//!   holder's (one round trip). When that node is a queued node of the same owner, the
//!   waiter watches the holder too, so when the key passes to its owner it is woken and
//!   re-enters at once (a release then wakes those waiters as well: only chains of one
//!   owner's waiters cost more than one wake-up per release). A change of a watched
//!   node's data (a count) is watched again without listing, and is not a wake-up: a
//!   waiter behind an owner hold is woken only by its deletion.
//! - **Release**: `getData`, then `setData` count −1 with the version read, or at count 1
//!   `delete` with that version (any session may delete it): two round trips, retried on
//!   a version conflict; one when this client wrote the count last (above). The key
//!   frees only at zero; the write id in the data tells after a lost connection whether
//!   our `setData` applied. (If the count moved again before we
//!   could look, that cannot be told: the call fails with `Unavailable`, and the count may
//!   stay one too high, keeping the hold until the first client's session ends.)
//!   Curator's revocation request (`__REVOKE__` written to the holder's node) wipes an
//!   owner's count: its leases then get `NotHeld`, and the node stays until its session
//!   ends; do not revoke owner holds.
//! - **Renewal**: a lease whose holding node is ephemeral on its own client's session (the
//!   first one, and re-entries through that session) is kept alive by the session, as a
//!   plain hold: no request. A re-entry from another session is **not** kept alive: each
//!   renewal (the watchdog's, every ttl/3) is one `getData` that checks the node is still
//!   there with the same `czxid` and our owner; an `exists` watch on the node fires its
//!   `lost()` as soon as the node is deleted. Nothing is ever shortened: the node has no ttl.
//! - **A queued owner node that gives up** (timeout, cancellation, `try_acquire`) is
//!   deleted with version 0; if that fails because another lease re-entered it in the
//!   instant it held, its count is lowered instead.
//!
//! **Declared [`Reentry::FirstSession`](dlock_core::Reentry::FirstSession)**: the node is
//! ephemeral on the session that created it (ZooKeeper has no other way to tie a node to
//! a live client), so the hold lives as long as that session, whatever the count: when
//! that client closes or crashes the server deletes the node (at once, or one session
//! timeout after its last heartbeat) and every lease of the owner elsewhere is lost (its
//! watch, or its next renewal, says so). While the first client lives, its session keeps
//! the node after its own leases are released, as long as other leases count, and the last
//! release anywhere deletes it. **A restarted process with the same owner id** re-enters
//! (and can release) a hold that another live client of the owner still keeps; the hold
//! of a process that died is gone with its session (a new acquire takes the key anew, with
//! a new token), so nothing it counted is left over. The entries of an owner's *other*
//! client that dies are never released: they keep the count above zero, so the hold then
//! lasts until the first client's session ends (or until a process of the owner releases
//! as many extra entries). Nothing but the holding node is ever written: no count node to
//! clean up (`tests/reentry.rs`).
//!
//! | operation (measured, `tests/reentry.rs`) | round trips | requests |
//! |---|---|---|
//! | first acquire, key free | 1 | `create` node (count 1) + `getChildren`, pipelined |
//! | re-entry, a client that saw the hold granted | 2 | `getData` of the node it was granted on; `setData` +1 (version-checked) |
//! | re-entry or `release`, the client that wrote the count last | 1 | `setData` ±1 (or `delete`) at the version it left |
//! | the same after another client wrote the count | 3 | `setData` refused (`BadVersion`); `getData`; `setData` |
//! | re-entry, a client that never did | 3 | `create` + `getChildren`; `getData` holder; `multi` (`setData` +1, `delete` ours) |
//! | `try_acquire`, another owner (or a plain hold) holds it | 3 | `create` + `getChildren`; `getData` holder; `delete` ours (version 0) |
//! | `extend`, lease on the node's own session | 0 | none |
//! | `extend`, lease from another session | 1 | `getData` |
//! | `release`, count above 1, no count written by this client | 2 | `getData`; `setData` −1 |
//! | `release`, count 1, no count written by this client | 2 | `getData`; `delete` (version-checked) |
//!
//! # Inspecting
//!
//! [`DistributedLock::inspect`](dlock_core::DistributedLock::inspect) and
//! [`list`](dlock_core::DistributedLock::list) only read (`getChildren`, `getData`): they
//! create, change and delete nothing, not even a missing key directory or base path, and
//! set no watch.
//!
//! **`inspect(key)`**, two round trips (one when the key has no node):
//! 1. `getChildren` of `{dir}`, `{dir}/locks` and `{dir}/leases`, pipelined (`NoNode`:
//!    none).
//! 2. `getData` of every lock, `locks` and lease node listed, pipelined (a node gone
//!    meanwhile is left out).
//!
//! - **Lock** (`{dir}`'s contenders, every name of step 2 of the protocol, ours or another
//!   client's): the nodes that hold in their mode (the lowest exclusive one, or every
//!   shared one with no exclusive node ahead) are the holders; the others are the waiters,
//!   first in line first ([`WaiterView::Queue`](dlock_core::WaiterView)), each with its
//!   mode (`Exclusive`, `Shared`).
//! - **Permits**: each node in `leases` is a holder (`Mode::Permits(0)`: N is not stored on
//!   the server), as Curator counts them, except the lease the acquirer at the front of
//!   the `locks` queue made and still counts with (the last lease its session created after
//!   its mutex node: its acquire has not returned); the `locks` queue, in order, are the
//!   waiters. A key used both ways shows both.
//! - For each: `fencing_token` is the node's `czxid` (the token its holder got), `since`
//!   the node's `ctime` (the server's clock), `ttl_left` `None` (the session keeps the
//!   node), `who` the node's data: `NAME@HOST:PID` for a dlock client (for a reentrant
//!   hold, `{owner} (held {n} times) by NAME@HOST:PID`), Curator's IP address, nothing for
//!   kazoo's default (`None`).
//!
//! **`list(prefix)`**, two round trips (three when a semaphore is among the keys):
//! `getChildren` of the base path; each child name is decoded back into its key
//! (percent-decoding; names the key encoding cannot produce are skipped) and kept if the
//! key starts with `prefix`. Then for each kept directory, pipelined (at most 256 at
//! once): `getChildren`; a directory with a contender is held, one with no contender but a
//! `leases` child is held if `getChildren` of its `leases` shows a lease node; an empty
//! directory (a used key's, left for the reaper) is not. The keys come back sorted.
//! Names shortened with a digest (keys whose encoding is longer than 240 bytes) keep only
//! the key's first bytes: when those cannot rule the prefix out, the directory's data is
//! read too (`getData`, in the same round trip) and is the key if its encoding is that
//! name. Directories dlock made carry their key; a shortened directory that another
//! client or an older dlock made (empty data) cannot be read back and is not listed.
//! `inspect` of such a key works (the key gives the name).
//!
//! Measured through the delaying proxy (`tests/round_trips.rs`):
//!
//! | operation | round trips | requests |
//! |---|---|---|
//! | `inspect`, key unused | 1 | `getChildren` × 3, pipelined |
//! | `inspect`, held (a holder and a waiter, or permits) | 2 | `getChildren` × 3, then `getData` per node, pipelined |
//! | `list`, lock keys | 2 | `getChildren` of the base, then one per key directory, pipelined |
//! | `list`, a semaphore among the keys | 3 | the same, then `getChildren` of its `leases` |
//! | `Election::leader` | 2 (1 with no contender) | `getChildren`, then `getData` of the lowest contender |
//! | `Leadership::proclaim` | 1 | `setData` of our node |
//! | `Election::observe`, subscribing | 1 | `addWatch` (persistent recursive) |
//!
//! # Capabilities
//!
//! | capability | value | why |
//! |---|---|---|
//! | fair | yes | waiters queue by sequence number, FIFO |
//! | permits | yes | Curator's `InterProcessSemaphoreV2`: lease nodes counted under its `locks` mutex (see [Permits](#permits)) |
//! | shared | yes | Curator's read-write lock: `__READ__` nodes share, an exclusive node waits for all before it, readers queue behind a waiting writer |
//! | fencing | strict | the node's `czxid`: zxids only grow, across leader elections and restarts |
//! | expiry | session (`ttl` not used) | the ephemeral node lives as long as the session; a silent holder loses it one session timeout after its last heartbeat |
//! | releases on disconnect | no | a closed connection is not a closed session: the session (and the lock) survives until it times out, so a client can move to another member |
//! | wake-up | notification, one per release | only the next contender watches the holder's node; a writer's release that admits readers wakes those readers; a permit's release wakes the one acquirer counting leases, whose admission wakes the next in the mutex queue; an owner's waiter queued behind a waiting node of its own owner also watches the holder (see [Reentrant holds](#reentrant-holds)); a count change wakes nobody |
//! | max key length | 1024 bytes | the default; long keys are shortened with a digest |
//! | inspect: who | yes | every lock and lease node dlock creates carries its holder's `NAME@HOST:PID` (other clients' nodes: what they wrote, Curator's IP address; kazoo's none) |
//! | inspect: waiters | queue | contenders wait in sequence order behind the holders; a semaphore's waiters are its `locks` queue |
//! | election | woken, recheck 1 s | Curator's `LeaderLatch` (`latch-` nodes carrying the value); a persistent recursive watch on the key directory wakes observers on every change, coalesced (see [Elections](#elections)); on ZooKeeper 3.5 (no `addWatch`) observers poll every second although this still says woken |
//! | reentrant | first session | the owner and count in the holding node's data, changed by compare-and-set; the node lives with the session that created it (see [Reentrant holds](#reentrant-holds)) |
//! | inspect: list | yes | the base path's children are the key directories, named by the key's reversible encoding (a shortened name: the key is the directory's data) |
//!
//! # URL
//!
//! ```text
//! zk://[user:password@]host1[:port],host2[:port]...[/chroot][?option=value&...]
//! zk://user:password@host1[:port],...[/chroot]?auth=sasl[&...]
//! zks://[user:password@]host1[:port],...[/chroot]?ca=/path/ca.pem[&cert=/path/client.pem&key=/path/client.key][&...]
//! ```
//! `zookeeper://` is accepted too. The port defaults to 2181 (for `zks://` too; the
//! server's `secureClientPort` is often 2281); IPv6 hosts go in brackets. The chroot path
//! is a prefix for every node the lock creates (it is created if missing).
//!
//! `user:password@` turns on ZooKeeper's `digest` auth and digest-only ACLs on every node
//! the lock creates (see [Security](#security)); percent-encode the password's reserved
//! characters (`@` as `%40`, `/` as `%2F`, `:` may stay). The user name cannot hold a `:`,
//! and neither may be empty. `Debug` and errors never show the password.
//!
//! With `auth=sasl` the same `user:password@` logs in with SASL `DIGEST-MD5` instead
//! (feature `sasl`, on by default), and the nodes get `sasl:{user}`-only ACLs (see
//! [Security](#security)). The user name cannot hold `:`, `/` or `@`. Kerberos (`GSSAPI`)
//! is not supported: `auth=gssapi` (or `kerberos`) is refused with
//! [`LockError::InvalidConfig`](dlock_core::LockError::InvalidConfig).
//!
//! `zks://` is TLS (feature `tls`, on by default; rustls with `ring`): every member is
//! reached over TLS, its certificate checked against `ca` and against the host name or IP
//! address in the URL. The server needs `secureClientPort` and
//! `serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory`.
//!
//! The client library asks for rustls with its default features, so the `tls` feature
//! compiles rustls's `aws-lc-rs` provider next to the workspace's `ring`; rustls then
//! cannot choose a process-wide provider by itself, and code that relies on that choice
//! (`rustls::ClientConfig::builder()`, as the `redis` crate's TLS connections do) panics
//! unless one is installed. This crate installs `ring` (unless a provider is installed
//! already) before its first TLS connection; a program that also makes other TLS
//! connections should install one at startup
//! (`rustls::crypto::ring::default_provider().install_default()`).
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `root` | `/dlock` | the path (under the chroot) holding one directory per key |
//! | `session_timeout` | `10s` | asked of the server, which negotiates it into its `minSessionTimeout..=maxSessionTimeout` (2 to 20 ticks by default); the crash-release bound. `1500ms`, `2s`, `1.5s`, `1m` |
//! | `connect_timeout` | `5s` | how long opening a session may take (TLS handshake and auth included), in [`from_url`] and when an expired session is replaced |
//! | `ca` | none; required by `zks://` | PEM file of the CA certificate(s) that signed the members' certificates |
//! | `cert`, `key` | none | PEM client certificate (chain) and its private key, for servers with `ssl.clientAuth=need` (or `want`) |
//! | `auth` | `digest` | how `user:password@` authenticates: `digest` (ZooKeeper's `digest` scheme, `addauth digest`) or `sasl` (SASL `DIGEST-MD5`); needs credentials |
//! | `curator` | `mutex` | which Curator recipe exclusive holds exclude on a shared path: `mutex` (nodes `_c_{uuid}-lock-{seq}`: Curator's `InterProcessMutex`, go-zookeeper, kazoo) or `read_write_lock` (nodes `_c_{uuid}-__WRIT__{seq}`: Curator's `InterProcessReadWriteLock`, whose mutex then ignores them); see [Interop](#interop-with-curator-go-zookeeper-and-kazoo) |
//!
//! There is no option to skip the certificate or host name check, nor a `domain` to check
//! the certificate against another name (the client library has neither safely).
//!
//! Connecting over TLS fails with [`LockError::Backend`](dlock_core::LockError::Backend)
//! naming the reason when the handshake fails for a TLS reason (the member's certificate
//! is not signed by `ca` or does not name the host; the server refused our certificate or
//! wanted one), and with [`LockError::Unavailable`](dlock_core::LockError::Unavailable)
//! when nothing answers. A `zk://` client on a TLS port is `Unavailable` (the server just
//! closes the connection).
//!
//! # Security
//!
//! **Without credentials** every node the lock creates has the ACL `world:anyone:cdrwa`,
//! as before: any client that reaches the ensemble can delete a holder's node (the next
//! waiter then takes the key while the holder still works), plant a persistent
//! `x-lock-0000000000` child that every client then waits behind forever, or read which
//! keys are in use. Use it only on an ensemble only trusted clients reach.
//!
//! **With credentials** (`user:password@`, `auth=digest` by default) every session authenticates with the `digest`
//! scheme (on every connection: ZooKeeper keeps credentials per connection, and the client
//! sends them again when it reconnects), and every node the lock creates (lock nodes, key directories, and the base path
//! nodes it creates when missing) gets one ACL entry, `digest:{user}:{hash}:cdrwa`
//! ([`Digest::id`]), and nothing else:
//!
//! - A client without the same user *and* password gets `NoAuth` for everything under the
//!   base path the lock created: it can not delete a holder's node (ZooKeeper checks a
//!   delete against the parent's ACL, the key directory's), create a child in a key
//!   directory (no planted lock node), create or delete key directories, change data or
//!   ACLs, or list which keys are held (`exists` needs no permission, though: a client
//!   that guesses a key's directory learns whether it is there).
//! - All dlock clients that share keys must use the same user and password: a key
//!   directory made by one identity refuses children from another. One identity per
//!   deployment (or per base path: give deployments different `root`s).
//! - The ACL names the digest identity only, not ZooKeeper's `auth` ACL (every identity of
//!   the creating session): over TLS with client certificates, a session is also
//!   `x509:{subject}`, and the `auth` ACL would let any client holding a certificate with
//!   that subject in, credentials or not.
//! - The first client to create the base path owns it. A base path that exists already
//!   keeps its ACL: if anyone may create or delete its children, others can still plant or
//!   remove key directories (a warning is logged when connecting); give it the
//!   deployment's ACL (`setAcl /dlock digest:{id}:cdrwa`, or create it that way before
//!   the first client runs). A base path another identity made is refused when connecting
//!   (it cannot be read: a wrong password looks the same) with
//!   [`LockError::Backend`](dlock_core::LockError::Backend).
//! - A wrong password is not refused by the server (digest auth never fails: the password
//!   only decides the identity). It is caught when connecting if the base path exists
//!   (its ACL cannot be read), otherwise by the first acquire (`NoAuth`, a
//!   [`LockError::Backend`](dlock_core::LockError::Backend)); but a wrong password on a
//!   fresh ensemble creates the base path for the wrong identity: create the base path
//!   beforehand.
//!
//! What ACLs do not protect against: anyone with the password (or the `super` digest, or
//! the ensemble's disk) can do everything the lock can; the password and the digest id
//! (which can be attacked offline) are secrets. Without TLS the password crosses the
//! network in clear text in every connection's auth packet, and anyone on the path can
//! read or inject requests: use `zks://` wherever the network is not trusted. A client
//! that may connect at all can still exhaust the server (many sessions, large requests).
//! The `dump` four-letter word lists every session's ephemeral nodes, keys included, to
//! whoever may use it (`4lw.commands.whitelist`).
//!
//! **With SASL** (`user:password@` and `auth=sasl`) every connection logs in with SASL
//! `DIGEST-MD5` (the client library runs the exchange right after the connect request, on
//! every reconnection too), and every node the lock creates gets the one ACL entry
//! `sasl:{user}:cdrwa`. What the digest ACLs above protect, these protect the same way: a
//! client without a SASL login as the same user, whether it has no credentials or is
//! logged in as another SASL user, gets `NoAuth` for deleting a holder's node, planting a
//! child in a key directory or changing ACLs (`tests/sasl_auth.rs`). The differences:
//!
//! - The server checks the password: a wrong password or an unknown user is refused at
//!   connect with [`LockError::Backend`](dlock_core::LockError::Backend) naming SASL
//!   authentication (`AuthFailed`; the server then closes the connection), and no base
//!   path is ever created for a wrong identity. The password never crosses the network
//!   (challenge and response), though a captured exchange can be attacked offline.
//! - The server needs a JAAS `Server` section with a `user_{name}="{password}"` entry per
//!   user (`org.apache.zookeeper.server.auth.DigestLoginModule`, passed with
//!   `-Djava.security.auth.login.config=...`) and the SASL provider
//!   (`authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider` in
//!   `zoo.cfg`). A server that logs nobody in (no JAAS section) is refused at connect (a
//!   `whoAmI` check, ZooKeeper 3.7+); one without the provider answers the first acquire
//!   with `InvalidACL`. `enforce.auth.enabled=true` with `enforce.auth.schemes=sasl`
//!   (3.7+) makes the server refuse clients that do not log in at all.
//! - The identity is the user name, so give each deployment a user of its own; the server's
//!   `kerberos.removeRealmFromPrincipal`-style rewriting does not apply to names without
//!   `/` or `@`, which is why those are refused. Create the base path with
//!   `sasl:{user}:cdrwa` beforehand, as for digest auth.
//! - Without TLS, SASL protects the password but not the connection (ZooKeeper negotiates
//!   no SASL integrity layer): anyone on the path can read or inject requests on an
//!   authenticated connection. `zks://` with `auth=sasl` works; over TLS, the SASL packet
//!   sent right behind the connect request is sometimes answered first by the server
//!   (3.8, Netty) and the client library gives up on that connection, so a TLS connect with
//!   SASL that no member accepted is tried again, up to three more times.
//!
//! Kerberos (`GSSAPI`) is not supported: the client library takes tickets only from the
//! system's Kerberos credential cache, needs the system's GSSAPI library to build, and
//! testing it needs a KDC; digest or `DIGEST-MD5` auth over `zks://` covers the same
//! threats.
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
//! - **Operator deletes the lock node** (or a permit's lease node): `lost()` fires at once
//!   (`NotHeld`); `release` and `extend` answer `NotHeld`; the next waiter takes the key
//!   (the permit).
//! - **Request timeouts**: no request waits longer than a session timeout (the client
//!   cannot keep the session longer than that without an answer either), and never past the
//!   acquire's deadline.
//!
//! # Interop with Curator, go-zookeeper and kazoo
//!
//! Another client excludes dlock on a key when it locks the same directory,
//! [`ZookeeperConfig::key_dir`] of the key (`/dlock/orders%2F42` for the key `orders/42`).
//!
//! **Node data.** dlock's lock and lease nodes carry the holder's `NAME@HOST:PID`
//! ([`holder_description`](dlock_core::holder_description)), and a key directory dlock
//! creates carries the key (before, both were empty). Curator writes the client's IP
//! address into its nodes and kazoo its `identifier`; none of these recipes reads a lock
//! node's data to decide anything (only Curator's revocation writes to a holder's node,
//! which dlock ignores), so mixed clients order and exclude each other as before. kazoo's
//! `contenders()` returns each node's data, so it now names dlock's holders, and
//! [Inspecting](#inspecting) shows each node's data as its `who`.
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
//! - **Curator** `InterProcessReadWriteLock` on the same directory, with dlock's shared
//!   holds: our readers' nodes are its read lock's, `_c_{uuid}-__READ__{seq}`, and it
//!   orders every child by the text after the last `__READ__` or `__WRIT__`; its writer
//!   counts every child, so it waits for our readers, and we count its `__WRIT__` and
//!   `__READ__` nodes. Readers and writers of both sides exclude each other as they should,
//!   **except dlock's exclusive holds under the default `curator=mutex`**: see the rule
//!   below, and `curator=read_write_lock`.
//! - **go-zookeeper** counts our readers' nodes as exclusive contenders (versions that
//!   split names on `lock-` and then `__`) or fails to lock while one exists (older ones,
//!   which split on `-`): never an overlap.
//! - **Curator** `LeaderLatch(client, dir, id)` with dlock's elections: see
//!   [Elections](#elections).
//! - **kazoo** `ReadLock(client, dir, extra_lock_patterns=["-lock-"])` shares with our
//!   readers and waits for our writers; we count its `__rlock__` nodes as shared holds.
//!   kazoo's `Lock` and `WriteLock` count our readers with `"__READ__"` added to
//!   `extra_lock_patterns`.
//!
//! **Which name exclusive holds use, and why `-lock-`.** Read from Curator's sources
//! (`LockInternals`, `StandardLockInternalsDriver`, `InterProcessReadWriteLock`): both
//! recipes sort *every* child of the directory, each by the text after the last occurrence
//! of its own names (the whole name when none occurs), and hold at the front of that order
//! (the read lock: when no node containing `__WRIT__` is ahead). A `_c_{uuid}-__WRIT__{seq}`
//! node has no `lock-`, so Curator's mutex sorts it by its whole name, `_c_…`, after every
//! `…lock-{seq}` node (digits sort before `_`): the mutex never waits for it. Likewise
//! the read-write lock sorts a `…-lock-{seq}` node after all of its own and ignores it.
//! A name is ordered by both recipes only if it ends in both `lock-{seq}` and
//! `__WRIT__{seq}`, which no name does (Curator's own mutex and read-write lock do not
//! exclude each other on one path either). So one exclusive node can exclude Curator's
//! mutex or Curator's read-write lock, not both. dlock's exclusive holds keep `-lock-`:
//! that keeps the interop with Curator's mutex, go-zookeeper and kazoo that existing
//! deployments rely on, and needs no change of name on upgrade. The price: **a Curator
//! read or write lock does not wait for a dlock exclusive hold, and Curator's mutex does
//! not wait for a dlock shared hold** (dlock waits for all of Curator's nodes). On a key
//! that Curator also locks, take only exclusive holds beside Curator's mutex, or only
//! shared holds beside Curator's read-write lock. (Full interop would need two nodes per
//! hold, one of each name, created in one `multi`; not done.)
//!
//! **`curator=read_write_lock`** chooses the other side for a client: its exclusive holds
//! make `_c_{uuid}-__WRIT__{seq}` nodes, as Curator's write lock does, so on a path shared
//! with Curator's `InterProcessReadWriteLock` a dlock writer and a Curator reader or writer
//! exclude each other both ways (`tests/read_write.rs` checks the names sort and block by
//! Curator's read-lock rule). Then Curator's *mutex* ignores dlock writers; go-zookeeper
//! treats them as it treats our readers' nodes (counts them, or fails to lock: never an
//! overlap); kazoo counts them with `"__WRIT__"` in `extra_lock_patterns`. Choose per
//! path which Curator recipe you share, and give every dlock client of that path the same
//! setting: dlock itself counts both names as exclusive, so mixed settings still exclude
//! each other (only Curator's view changes). Shared holds and round trips are the same either way.
//! - Sequence numbers wrap after 2^31 creates in one directory (ZOOKEEPER-2944) and every
//!   implementation's order breaks then; the server's reaper deletes empty directories,
//!   which resets the counter (a key never idle for a check interval keeps counting).

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
