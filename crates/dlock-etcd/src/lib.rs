//! A distributed lock on etcd v3 that excludes, and is excluded by, etcd's own `concurrency.Mutex` and `etcdctl lock`, with shared (read) holds beside exclusive ones, counting semaphores (permits), and leader elections that interoperate with `concurrency.Election` and `etcdctl elect`.
//!
//! ```no_run
//! # async fn demo() -> dlock_core::Result<()> {
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, LockOptions, Wait};
//!
//! let lock = dlock_etcd::from_url("etcd://127.0.0.1:2379,127.0.0.1:22379").await?;
//! let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
//! let lease = lock.acquire("reports/nightly", &opts).await?;
//! // ... work, passing lease.fencing_token() to storage that checks it ...
//! lease.release().await
//! # }
//! ```
//!
//! [`EtcdLock`] is a [`dlock_core::raw::LockClient`]: it adds key checks, the process-local
//! queue per key, one deadline per acquire and the renewal watchdog to the etcd protocol
//! below. Clones share one gRPC channel, balanced over the endpoints.
//!
//! # Protocol
//!
//! The key layout and the wait are those of Go's `concurrency.Mutex` (etcd 3.4 to 3.7):
//! the lock `K` is the etcd prefix `{lock name}/`, where the lock name is
//! [`EtcdConfig::lock_name`] (`{prefix}{K}`, with `%` and `/` percent-encoded), and each
//! contender puts one key under it attached to a lease: `{lock name}/{lease id in lowercase
//! hex}` (a shared hold: `{lock name}/read/{lease id}`, below), on a lease of its own or on the client's shared lease (below); on the shared
//! lease, `{lock name}/{lease id}-{attempt number}` (hex) while an earlier key of that
//! plain name is still ours (held, or being deleted in the background). One name per
//! lease, lock and mode keeps the prefix's ranges short: etcd's range walks every name under
//! the prefix with history since the last compaction.
//! The oldest key (lowest create revision) holds the lock; the others queue in creation
//! order. `etcdctl lock <lock name>` and `concurrency.NewMutex(session, "<lock name>")`
//! therefore queue in the same line as this crate: with the default prefix `dlock/`, the
//! dlock key `cron` and `etcdctl lock dlock/cron` exclude each other (and with `prefix=`,
//! empty, `etcdctl lock cron`).
//!
//! **Leases.** A hold the core renews (`auto_renew`, the default) puts its key on the
//! client's *shared lease* of ⌈ttl⌉ seconds, as Go's `concurrency.Session` does: one per
//! client and ttl, granted by the first acquire that needs it, kept alive by one task
//! every ttl/3 on one keep-alive stream, each keep-alive with one linearizable read beside
//! it (a leader cut off from its quorum renews leases in memory; the read proves a quorum
//! backs it). When the last key on it is released, the lease **lingers one ttl**, kept
//! alive and holding no key, so that the client's next acquire reuses it instead of
//! paying a grant and a revoke (two raft commits) per lock cycle; it is revoked when the
//! linger ends, or at once when the client (its last clone) is dropped (a revoke
//! [`dlock_core::settle`] waits for). A lingering lease
//! is the only thing a finished lock leaves on the server: no key, so no lock state (a
//! crashed client's lease expires with its ttl). A hold with auto-renew off gets a lease
//! of its own, so that its ttl frees its key. Lease ids are picked at random by this client (so a grant whose answer is
//! lost can still be revoked).
//!
//! **Acquire** (`my` = our key, `rev` = its create revision):
//! 1. Join the shared lease (granting it if there is none), or grant a lease of our own.
//! 2. One transaction: if `create_revision(my) == 0`, put `my` with the lease (its value
//!    names us: see [Inspecting](#inspecting)), and read the oldest key under the prefix. `rev` is the transaction's revision. (A key of our name
//!    that exists already is a stray of ours: an abandoned attempt's put that landed after
//!    its background delete. It is deleted and the transaction sent again.)
//! 3. If the oldest key is `my`, the lock is ours; the fencing token is `rev`.
//! 4. Otherwise `try_acquire` deletes `my` (revokes its own lease) and answers `None`. A
//!    shared lease the put finds gone on the server is declared lost and replaced once.
//! 5. `acquire` reads the predecessor (the newest key created before `my`) with a
//!    member-local read (below), then watches, on one watch stream, the deletion of `my`
//!    and, with two watches, the deletion of the predecessor, while the shared lease's
//!    keeper keeps our key alive (an own lease is kept alive every ttl/3 meanwhile). The
//!    watches start at the current revision, so etcd delivers their events at once (a
//!    watch that starts in the past is caught up by a loop that runs every 100 ms, which
//!    is what Go's `waitDeletes` pays under contention); if the store moved on between
//!    the read and the watches, one read after they exist closes the gap. The second
//!    watch is there because etcd files a watch "from now" in that slow group too when a
//!    write lands between its reading the revision and registering the watch: under
//!    contention 1.4 % of wake-ups came 20–90 ms late with one watch, 0–0.05 % with two.
//! 6. When the predecessor is deleted (one wake-up per release), one read-only transaction
//!    reads the newest key with `create_revision < rev` and `my`, member-local
//!    (serializable: no leader round, not queued behind the writes in flight), trusted
//!    only if the member has applied the deletion (its revision is at least the event's;
//!    else it is read again through the leader): once no key is older than ours, none can
//!    be again, and a later deletion of `my` is seen by its watch. `my` gone means the lease
//!    expired or was revoked, and the acquire fails with [`LeaseLost`] (so does the loss of
//!    the shared lease while waiting); no older key means
//!    the lock is ours; otherwise wait for that key, as in step 5.
//!    A lease can expire on the server a moment before its key is deleted, so a grant
//!    whose keep-alive fell due while waiting (keep-alives failed, or a read was slow) is
//!    confirmed with one extend (below) before it is handed out; [`dlock_core::raw::LockClient`]
//!    does this for every ttl backend.
//! 7. If `my` is deleted while waiting, the acquire fails with [`LeaseLost`] at once. At the
//!    deadline, on cancellation (the future dropped) or an error, `my` is deleted (an own
//!    lease revoked) in the background: nobody queues behind an abandoned key. The name
//!    stays ours until that delete ends (a later attempt takes a suffixed name), which
//!    makes it safe without knowing `rev`. An attempt cut off during its put may still
//!    have that put applied after the delete, leaving a key nobody waits behind; so a
//!    shared lease is *suspect* for 2 × request timeout + ttl after such an abandon (or a
//!    background delete that gave up), and meanwhile its keeper, after each renewal, lists
//!    the keys on it (one `LeaseTimeToLive` with keys: a leader read, no raft commit) and
//!    deletes each whose name nothing of this client claims (the names carry the lease id,
//!    so only this client puts keys there). That costs one read per ttl/3, only on a lease
//!    that recently had an abandon.
//!
//! **Shared holds** (`LockOptions::shared`, readers) queue in the same line. A reader's key
//! is `{lock name}/read/{lease id}` (the readers' range of etcd's experimental `RWMutex`,
//! suffixed as above), and a reader waits only for the keys that exclude it: every key
//! under the prefix *outside* the readers' range (dlock's exclusive keys, Go's `Mutex`'s,
//! `etcdctl lock`'s, whose names are lease ids in hex, and any other name, to be safe).
//! Those are two ranges, either side of `{lock name}/read/`, so in the steps above a
//! reader's transaction reads the oldest key of each (step 2: held if neither is older
//! than `my`), and its waits read and watch the newest older key of either (steps 5–6).
//! A writer (exclusive, unchanged) waits for every older key, readers' included. So
//! readers hold together; a writer waits for every reader and writer before it; a reader
//! that comes after a waiting writer (of any client, or of any tool) queues behind it,
//! so readers cannot starve a writer; and `etcdctl lock` and Go's `Mutex` wait for our
//! readers as for a writer (conservative: they exclude readers too). Go's `RWMutex`
//! interoperates halfway: its writers (`{lock name}/write/…`) and readers are seen right
//! by ours, but its readers wait only for its own writers' range, not for our writers.
//! **Wake-ups:** a reader watches the newest older *exclusive* key, a writer its
//! immediate predecessor of either kind, so a writer's release wakes exactly the readers
//! it admits (each once) and a reader's release wakes at most the writer right behind it;
//! a reader queued behind a waiting writer is not woken until that writer's release.
//! **Tokens** stay the create revision of `my`: a writer's is above every token handed
//! out on the key before it (it waited for every older key), a reader's above every
//! earlier writer's (a writer created after it waits for it); readers' tokens are
//! distinct but say nothing about each other. Measured (lockbench read-mostly, one key,
//! nine shared holds in ten, single member, busy 2 cores): 711–1,014 cycles/s at 8
//! clients, 578–796 at 32 (p50 4.9–7.5 ms and 34–47 ms): a writer behind readers pays a
//! read and a watch per hop as the readers before it release.
//!
//! **Permits** ([`LockOptions::permits`](dlock_core::LockOptions::permits), a counting
//! semaphore; etcd has no standard one) queue in a line of their own. A permit's key is
//! `{lock name}/permit/{lease id}` (suffixed as above while the client holds another
//! permit of the lock), on the same leases as a lock's key, and a permit attempt looks
//! only at the permits' range `{lock name}/permit/`: every key in it counts as a holder,
//! whoever put it. With a limit of `n`:
//! 1. As step 1 above.
//! 2. One transaction: if `create_revision(my) == 0`, put `my` and read the names of the
//!    `n` oldest keys in the permits' range. The permit is ours if fewer than `n` of them
//!    are older than `my` (each attempt counts against its own `n`: Curator's rule for
//!    limits that disagree); the token is `rev`. `try_acquire` otherwise deletes `my`.
//! 3. `acquire` opens one watch stream with two watches on the deletions in the permits'
//!    range, from the current revision (two for the reason of step 5; one round trip),
//!    then reads `my` and the names of every older permit key in one member-local read,
//!    trusted only at or after the watches' start (else read again through the leader).
//! 4. Each deletion of one of those names that a watch delivers is counted off locally,
//!    with no request: no key can become older than `my`, so the names are all there is
//!    to wait for. When fewer than `n` are left, the permit is ours (its hold's watch on
//!    `my` starts at that deletion's revision). A deletion of `my` (the range holds it
//!    too) fails the acquire with [`LeaseLost`] at once; a broken watch is opened again
//!    and the older keys read again. Timeouts and cancellation delete `my`, as in step 7.
//!
//! Hold, extend and release are a lock's (below). A crashed holder's permit comes back
//! when its lease expires, as a lock does. **Fair:** with agreeing limits a waiter has
//! every older key of the waiter before it, and that waiter besides, so waiters are let in
//! in create-revision order. **Wake-ups:** a range watch delivers every deletion in the
//! range to every waiter, so a release wakes each waiter queued behind it once (each
//! counted in [`LockStats::wakeups`](dlock_core::LockStats)), at the cost of an event and
//! no request; only one of them is let in. **Tokens** are `rev`: unique on the key, and
//! with agreeing limits above every permit's let in before; a waiter passed by an
//! attempt with a larger limit may be let in after it with a smaller token. A key is a
//! lock or a semaphore: an exclusive hold (ours, Go's `Mutex`, `etcdctl lock`) and a
//! reader wait for permit keys as for any key under the prefix, while permits do not see
//! lock keys. Measured (an ad-hoc loop of acquire + release with no hold, 5 s, release
//! build, single member, 2 busy shared cores, two runs; not lockbench): one client
//! 669–770 cycles/s (the mutex 729–834); 8 clients on `permits(2)` 594–806 (acquire p50
//! 6.3–7.1 ms, p99 43–76 ms; the mutex at 8: 508–553); 32 clients on `permits(8)`
//! 699–928 (p50 21–27 ms, p99 87–108 ms).
//!
//! **Hold.** The client watches every held key on one watch stream (one watch per key,
//! created with one message, no round trip, 90 to 100 ms into the hold and from the
//! revision it was won at, so a hold shorter than 90 ms costs no watch and no deletion is
//! missed; one task of the client starts the watches as they fall due, so a hold costs no
//! task or timer of its own): a deletion of
//! `my` (an operator, a broken lease) fires that hold's `lost()` at once (within 100 ms
//! plus etcd's 100 ms catch-up of a watch started in the past). A hold on the shared lease is granted
//! [kept alive](dlock_core::raw::Grant::kept_alive): the watchdog keeps no timer and sends
//! no renewal for it, and an extend by hand costs no request: it answers from the keeper's
//! last keep-alive (alive while the
//! server-side deadline, less a tenth of the ttl, has not passed). Loss of the shared
//! lease (a keep-alive says it is gone, or none is answered, with its quorum read, by a
//! tenth of the ttl before it could expire) fires `lost()` on every hold on it, and only
//! on those; the next acquire gets a fresh lease. On an own lease, extend is a
//! keep-alive and, concurrently, a read of `my` (it must still have create revision
//! `rev`); either saying no is [`NotHeld`]. Extending with another ttl moves `my` to a
//! lease of that ttl (the shared one of that ttl, or a new own one; a transaction putting
//! `my` with it if `create_revision(my) == rev`): etcd cannot change a lease's ttl, and
//! the key, its create revision and the token stay.
//!
//! **Release.** A transaction deletes `my` only if `create_revision(my) == rev`
//! ([`NotHeld`] otherwise). An own lease is then revoked in the background; the shared
//! lease is left (it lingers if it holds no key any more). A delete on a shared lease that
//! got no answer is sent again in the background (with backoff, 8 times), since the lease
//! outlives the hold; if all fail, the lease's sweep (Acquire, step 7) deletes the key. A request etcd refuses as "too many requests" (its apply backlog)
//! did nothing and is sent again within the request timeout.
//!
//! ## Round trips
//!
//! Every write is a raft commit (a quorum of fsyncs); reads are linearizable (a leader
//! round, no log entry); keep-alives are served by the leader from memory (etcd 3.4 does
//! not checkpoint leases unless configured to).
//!
//! | operation | requests (sequential) | raft commits |
//! |---|---|---|
//! | `try_acquire`, free (shared lease alive or lingering) | transaction (put-if-absent, oldest key: its create revision compared with ours) | 1 |
//! | `try_acquire`, held (shared lease alive) | transaction, delete | 2 |
//! | `try_acquire`/`acquire`, shared | as exclusive: the transaction reads the oldest key of two ranges instead of one, a waiter's reads the newest older key of two | as exclusive |
//! | `try_acquire`, permit free | transaction (put-if-absent, names of the `n` oldest permit keys) | 1 |
//! | `try_acquire`, every permit taken | transaction, delete | 2 |
//! | `acquire`, permit with a wake-up | transaction, watch (two, one round trip), member-local read (names of the older permit keys); on each release ahead: none (the event is counted) | 1 |
//! | extend, release, hand-off of a permit | as a lock's | as a lock's |
//! | first acquire of a ttl (none in the last ttl), or auto-renew off | lease grant, transaction | 2 |
//! | `acquire` with a wake-up | transaction, member-local read, watch (and a member-local read if the store moved meanwhile); on the release: one member-local read | 1 |
//! | extend, shared lease | none (the keeper's last answer) | 0 |
//! | extend, own lease | keep-alive ‖ read of `my` (in parallel) | 0 |
//! | extend (new ttl) | (grant of that ttl's lease if none,) transaction | 1 (+1) |
//! | release | transaction (fenced delete) (then a revoke in the background for an own lease; a shared one is revoked one ttl after its last key goes) | 1 (+1) |
//! | contended hand-off | the holder's delete → watch event → the waiter's member-local read | 1 |
//! | keeping N holds of one ttl | one keep-alive and one read per ttl/3, for all N | 0 |
//! | `inspect` | range read of the lock's prefix (values included), then one `LeaseTimeToLive` per distinct holder lease, in parallel | 0 |
//! | `list` | keys-only range read of the namespace under the prefix | 0 |
//! | owner: first acquire, re-entry, release | transaction; transaction, transaction (count + 1); transaction (count − 1, or delete) | 1; 2; 1 |
//! | owner: renewal of a re-entry | linearizable read of the holding key | 0 |
//! | campaign, resign | as `acquire`, release | as `acquire`, release |
//! | proclaim | transaction (put-if-ours) | 1 |
//! | `leader()` | range read of the oldest key under the prefix (limit 1) | 0 |
//! | observe | one watch on the prefix (one round trip), then a `leader()` per change and per second | 0 |
//!
//! Each client holds one keep-alive stream per ttl in use (plus one per own lease) and one
//! watch stream for all its held keys, multiplexed on its connection. A waiter has its own
//! watch stream while it waits.
//!
//! Measured (lockbench, single member, 2 shared cores, noisy; before → after the linger,
//! one name per lease and lock, and the deferred watch): uncontended acquire + release
//! 2.40× → 1.43–2.05× the raw put + delete; 8 and 32 clients on their own keys 627/801
//! → 1,071–1,569/1,109–1,689 cycles/s (4.1/4.6× → 1.6–1.9/1.6–2.7× raw). Then (two runs
//! before, five after, busier) the two watches and member-local reads: the
//! contended hand-off p99 32–67 ms → 15–39 ms at 8 clients and 18–27 → 16–29 ms at 32,
//! about the raw put + delete's own p99 at that concurrency in the same runs (8–28 ms at
//! 8, 22–106 ms at 32: etcd's write and backend-commit stalls, which every hand-off's
//! delete and read wait behind); uncontended 1.23–1.72× (1.33–1.43× before). The lock
//! costs 130–190 µs of client time per cycle over the same two transactions sent bare
//! (interleaved, p50: bare put + delete 1.03–1.15 ms, the transactions 1.11–1.24 ms, the
//! lock 1.24–1.43 ms).

//! ## Differences from Go's `concurrency.Mutex`
//!
//! - **One shared lease per client and ttl** for auto-renewed holds (a session per ttl),
//!   but **a lease of its own** for a hold with auto-renew off, whose ttl must free its key
//!   (the conformance suite checks it). Release and cancellation delete exactly the key
//!   they made. Re-entrance through a shared session (`Lock` twice on one session) does
//!   not exist: no two live attempts share a key, and the process-local queue of
//!   [`dlock_core::raw::LockClient`] serialises tasks of one client. Re-entry is by owner
//!   instead, from any client (see [Reentrant holds](#reentrant-holds)).
//! - **Our key is checked after every wait**, and watched while waiting: a waiter whose key
//!   vanished (its lease expired or was revoked) fails with [`LeaseLost`] instead of
//!   believing it holds the lock (the 3.4 client lacks the check, etcd #11429; no released
//!   client watches its own key while waiting, #19597).
//! - **Release is fenced** on `create_revision(my) == rev`, so a retried or late release can
//!   never delete a newer holder's key (Go's `Unlock` deletes unconditionally, #22082).
//! - **The waiter watches its predecessor from the current revision, twice**: Go's watch
//!   from the read's revision lands in etcd's unsynced watcher group under contention,
//!   and so does a watch from now created while a write lands; that group is caught up
//!   every 100 ms, which delays the hand-off by up to 100 ms. Its reads are member-local,
//!   checked against the revision they must cover.
//! - **Cancellation and timeouts delete the queued key** (Go deletes it only when `Lock`'s
//!   context is cancelled).
//! - **Loss is signalled**: `lost()` fires when the key is deleted, when a keep-alive says
//!   the lease is gone, or when renewals keep failing until the lease could have expired
//!   (Go's `Session.Done()` only closes after the keep-alive channel gives up).
//! - **Read-write holds** in the Mutex's queue: Go has none there (its experimental
//!   `RWMutex` keeps writers under `{name}/write/`, which its Mutex does not know); ours
//!   keep every exclusive key where the Mutex puts it.
//! - **Permits**: Go's `concurrency` package has no semaphore; ours keep their keys in
//!   `{name}/permit/`, which a `Mutex` on the same name waits for.
//! - **Keys carry a value**: ours are put with `NAME@HOST:PID`
//!   ([`holder_description`](dlock_core::holder_description); a permit's followed by
//!   ` permits=N`; an election candidate's: its value, as Go's `Election` puts it), read
//!   back by `inspect` (see [Inspecting](#inspecting)). Go's `Mutex`
//!   puts an empty value and never reads it, so `etcdctl lock` and Go services are not
//!   disturbed (the crate's etcdctl tests check both directions); their keys show in
//!   `inspect` named by their lease.
//! - The server-side `Lock` RPC (v3lock) is never used: without a lease it orphans a 60 s
//!   lease, and on 3.4 it runs the Mutex without the post-wait check.
//!
//! ## Leases and ttl
//!
//! etcd counts lease ttls in whole seconds and has a minimum, ⌈1.5 × election timeout⌉
//! (2 s with the default 1 s election timeout), which it applies silently. The lease is
//! granted for ⌈ttl⌉ seconds; it is renewed every third of that and `lost()` fires a tenth
//! of it before it could expire, so rounding up only lengthens how long the
//! server keeps the key of a crashed holder: at most max(⌈ttl⌉, minimum) plus the half
//! second between the lessor's expiry checks.
//!
//! # Key sets
//!
//! A set of keys taken as one hold ([`LockExt::acquire_all`](dlock_core::LockExt::acquire_all))
//! is taken key by key, in ascending byte order, each key with the protocol above: one
//! key per lock under the client's shared lease, so N free keys cost N acquire transactions,
//! each key's token is its own create revision, and the shared lease keeps them all alive
//! (one revoke or expiry loses every key of the set at once). Not one transaction for the
//! whole set: a transaction cannot wait in a key's queue. While a set is being taken, its
//! keys taken so far are held: a waiter on one of them watches its predecessor as usual and
//! is woken when the set deletes that key on release, or gives it back because a later key
//! stayed busy (before `acquire_all` returns).
//!
//! # Reentrant holds
//!
//! An acquire with [`LockOptions::owner`](dlock_core::LockOptions::owner) puts its key as
//! above, with the value `\x01dlock-owner {count} {owner} {NAME@HOST:PID}` (count 1): the
//! owner and the hold count live in the **holding key's value** (the control character
//! keeps it apart from every other writer: Go's `Mutex` and `etcdctl lock` put empty values,
//! election values have none), and the holding key's create revision stays the token of
//! every entry. Every change of the count is one transaction compared on the holding key's
//! mod revision, putting with `ignore_lease` (the key stays on its lease and keeps its
//! create revision); a transaction that lost a race returns the key as it is now, and is
//! sent again on that.
//!
//! - **First acquire** (the key free): the acquire's one transaction (its read of the
//!   oldest key carries the value). 1 round trip, 1 commit.
//! - **Re-entry** (the oldest key is the owner's, whoever put it: this client, another,
//!   another process): the acquire's transaction, then one transaction raising the count
//!   and deleting the key it just queued. 2 round trips, 2 commits (a third, and so on,
//!   per concurrent change of the count). It runs in a task of its own: an acquire dropped
//!   meanwhile leaves the count as it was. Its grant has no key or lease of its own.
//!   - **In the client whose lease the holding key is on** (the first client: the
//!     client registers each owner key before it puts it), the grant lives exactly as
//!     long as that lease: it is kept alive with it (no renewal, no request of its own),
//!     and its `lost()` is that lease's signal, the one a plain hold of the client gets:
//!     the shared lease's keeper's, a tenth of the ttl before the server may expire the
//!     lease; on an own lease (auto-renew off), the same instant counted from its last
//!     keep-alive, sent by the first grant's renewals or, once that grant is released,
//!     by the client keeping the lease. So it is told before another client can take the
//!     key even when no other lease of the hold is left in the client. A manual extend
//!     checks that lease's state, then reads the key (one round trip, as before).
//!   - **In another client**, it is **not kept alive**: its renewal (every ttl/3) is one
//!     linearizable read checking the holding key still has its create revision and
//!     owner; it learns of a loss at its next check.
//!
//!   Either way its `lost()` also fires on the key's deletion (the client's watch on
//!   held keys).
//! - **Release**: one transaction lowering the count, or deleting the key when it is the
//!   last entry (1 round trip when no other entry changed the count since this grant last
//!   saw it; else one more per change). Any client may delete the key: the last release,
//!   wherever it is, frees it and wakes the next waiter. When the first client's grant is
//!   released with entries left, that client keeps the key's lease (the shared lease's
//!   keeper, or keep-alives of an own lease) until the key is deleted (seen by a watch,
//!   checked by a read every ttl), then leaves it as a released key does.
//! - **Renewal** of the first grant: as any hold's. An extend with a longer ttl moves the
//!   key to a lease of that ttl; a shorter one never moves it (other entries count on it).
//! - **Waiting**: an owner's waiter watches the holder (the oldest key) instead of its
//!   predecessor, since the key may become its owner's before its own turn: it re-enters
//!   when the holder it finds is its owner's. Each release of a holder then wakes every
//!   owner's waiter once (a member-local read each).
//!
//! Declared [`Reentry::FirstSession`](dlock_core::Reentry): the hold lives on the lease of
//! the client that created the key. When that client crashes or is cut off, its lease
//! expires and the key goes whatever the count (a ttl, as for any crashed holder); that
//! client's own entries are told before (its lease's signal), the other clients' entries
//! learn it from the watch or at their next check. A restarted
//! process with the same owner id can re-enter, and release, entries it left while the
//! first client lives (their count is on the server); if the restarted process *was* the
//! first client, its hold ends with its old lease, within a ttl, and a re-entry meanwhile
//! is lost at that point. Nothing else is left: the count goes with the key. A count
//! change whose answer is lost is not sent again (it could count twice): a release that
//! fails that way may leave its entry counted, and the key then frees with the first
//! client's lease.
//!
//! # Inspecting
//!
//! Each contender key is put with a value naming its holder: this process's
//! [`holder_description`](dlock_core::holder_description) (`NAME@HOST:PID`; an election
//! candidate's: its value, see [Elections](#elections); an owner's: its owner and count,
//! shown `job-7 (held 3 times) NAME@HOST:PID`), followed for a permit by its
//! limit (` permits=N`, which etcd keeps nowhere else). It rides on the acquire's put (no
//! request of its own), and an extend that moves the key to a lease of another ttl keeps
//! it (`ignore_value`). Both reads below are linearizable (a leader
//! round, no raft commit) and change nothing on the server.
//!
//! - [`inspect`](dlock_core::DistributedLock::inspect)`(key)`: one range read of every
//!   key under `{lock name}/`, values included, oldest first. Holders are told from
//!   waiters by the acquire's own rules: an exclusive key (a name outside `read/` and
//!   `permit/`: ours, Go's, etcdctl's) holds when it is the oldest key; a reader when no
//!   key outside the readers' range is older; a permit when fewer than its own limit of
//!   permit keys are older. The others are the waiters, in create-revision order (the
//!   queue), with the mode their names and values give. A holder's `fencing_token` is its
//!   key's create revision (the token its acquire handed out); `who` is the key's value,
//!   or `lease {id in hex}` for an empty one (Go's `Mutex`, `etcdctl lock`: the lease
//!   `etcdctl lease revoke` would take); `since` is `None` (etcd keeps no timestamps);
//!   `ttl_left` is the holder's lease's remaining ttl in whole seconds, from one
//!   `LeaseTimeToLive` per distinct holder lease (served by the leader, no commit; sent in
//!   parallel, 16 at a time, so one more round trip for a mutex or for readers on a few
//!   leases; `None` where it cannot be read). A permit key without a limit (put by a dlock
//!   before this one) shows holding, with `Permits(0)`. The key of a `try_acquire` that
//!   found the lock busy, or of an abandoned attempt, shows as a waiter until it is deleted.
//! - [`list`](dlock_core::DistributedLock::list)`(prefix)`: one keys-only range read of
//!   every etcd key under `{prefix option}{escaped prefix}`, each lock name (up to its
//!   first `/`) decoded back to its key. The escaping is reversible and keeps prefixes
//!   (character by character), so the range holds exactly the locks of keys starting with
//!   `prefix`; a name that does not encode back to itself is not dlock's and is skipped. A
//!   lock with any key has a holder (its oldest key), so every lock found is listed. The
//!   read returns every contender's name, waiters included; with `prefix=` (empty) and an
//!   empty list prefix it covers the whole keyspace, and an unrelated key `a/b` is listed
//!   as the held key `a` (it stands in that lock's queue).
//!
//! # Elections
//!
//! An election ([`dlock_core::Election`]) is the mutex above, laid out as Go's
//! `concurrency.Election` lays it out (etcd 3.4 to 3.7), which is Go's `Mutex` with the
//! candidate's value as its key's value: a candidate's key is `{lock name}/{lease id}`
//! (suffixed on the shared lease as above), put with the **value** in place of the
//! holder's description; the oldest key under `{lock name}/` leads, and its create
//! revision, the lock's fencing token, is the **term** (Go's `Election::Rev`).
//!
//! - **Campaign**: the exclusive acquire, with its round trips, waiting, deadline and
//!   cancellation (Go: `Txn(If(CreateRevision(k) == 0)).Then(Put(k, value, lease))`, then
//!   wait for the deletion of every older key). A campaign's key is on the shared lease
//!   unless auto-renew is off, as a hold's.
//! - **Proclaim**: one transaction, `if create_revision(my) == rev then put(my, value,
//!   lease)` with the lease our key is on now (one raft commit; Go's `Proclaim`). Refused
//!   with [`NotHeld`] once the key is gone or not ours: it never touches another
//!   candidate's key. An extend with another ttl moves the key with its value
//!   (`ignore_value`), so a proclaimed value stays.
//! - **Resign**: the fenced release (Go's `Resign` is the same transaction).
//! - **Leader**: one linearizable range read of the oldest key under the prefix (sorted by
//!   create revision, limit 1: Go's `Get(prefix, WithFirstCreate())`; no raft commit):
//!   its value and create revision, or `None` without keys. A reader's or a permit's key
//!   is no leader (`None`: the key is held shared); an empty value (Go's `Mutex`,
//!   `etcdctl lock`) shows as `lease {id}`, as in `inspect`, which shows the same leader
//!   (its `who` is the value, byte for byte).
//! - **Observe**: [`leader_changes`](dlock_core::raw::Backend::leader_changes) is one watch
//!   on the whole prefix (every put and delete), on a stream of its own, created (the
//!   server's answer read) before it returns; each response with events wakes the
//!   observer, who reads the leader (one read). Every change of leader is an event: a
//!   grant *is* the deletion of the key before it (the next key is then the oldest), a
//!   proclaim is a put, and a crashed leader's lease expiry deletes its key, an event too.
//!   So the observer's recheck ([`Observe::Woken`](dlock_core::Observe), 1 s) only bounds
//!   a watch that stalls without failing; a broken or canceled watch (the client connects
//!   with `require_leader`, so a member cut off from its leader cancels it) ends the
//!   stream with an error. Every candidate's queueing put wakes observers too (a read
//!   each, which finds no change).
//!
//! **Compatibility:** `etcdctl elect <lock name> PROPOSAL` and Go's
//! `concurrency.NewElection(session, "<lock name>")` stand in the same line as our
//! candidates (with the default prefix: the dlock key `svc` is `etcdctl elect dlock/svc`),
//! read our leader and value (`etcdctl elect -l` prints them, proclaims included), and we
//! read theirs; the crate's etcdctl tests check both directions. Go's `Campaign` on a
//! session that already has a key under the prefix takes that key over; ours never share
//! one (a second candidate of one client on the shared lease gets a suffixed name).
//!
//! Measured (release build, single member, 2 shared cores, 200 each): a free campaign p50
//! 0.88 ms (p99 2.1 ms), resign 0.78 ms (1.5 ms), proclaim 0.61 ms (4.7 ms), `leader()`
//! 0.34 ms (2.7 ms); an observer sees a proclaim 1.0 ms (5.3 ms) after it was sent.
//!
//! # Capabilities
//!
//! | capability | value | why |
//! |---|---|---|
//! | fair | yes | waiters queue by create revision, a total order kept by raft |
//! | fencing | strict | the token is `my`'s create revision: cluster-wide, persisted, strictly increasing across holders, crashes and restarts (a writer's above every earlier token, a reader's above every earlier writer's) |
//! | expiry | ttl | the lease ends ⌈ttl⌉ s after the last keep-alive (see above) |
//! | releases on disconnect | no | the key lives until its lease expires; a closed connection does not end a lease |
//! | wake-up | notification, one per release | each waiter watches only its predecessor's key (a reader: the newest older exclusive key, so a writer's release wakes each reader it admits once); permits are the exception: a release wakes every permit waiter behind it once (an event, no request) |
//! | permits | yes | keys in `{lock name}/permit/`; held while fewer than the limit are older; waiters count the deletions ahead off a range watch (see above) |
//! | shared | yes | readers' keys in `{lock name}/read/`; a reader waits only for older keys outside it, a writer for every older key (see above) |
//! | faults: holder paused | fenced | a paused holder cannot hear `lost()`; the next holder's token is higher |
//! | faults: server restart, member down | exclusive | keys, leases and revisions are persisted and replicated; a new leader extends every lease, so no key frees early |
//! | inspect | who, waiters as a queue, list | each key's value names its holder (an empty one: its lease); every waiter has a key, ordered by create revision; lock names decode back to keys |
//! | reentrant | first session | the owner and count in the holding key's value, changed by transactions compared on its mod revision; the key lives on the lease of the client that created it (see [Reentrant holds](#reentrant-holds)) |
//! | election | woken, recheck 1 s | a watch on the lock prefix sees every grant (the deletion before it), proclaim, resignation and expiry; the recheck only bounds a stalled watch |
//! | max key length | 1024 bytes | the default; encoded names are at most 3 KiB, far below etcd's 1.5 MiB request limit |
//!
//! # URL
//!
//! ```text
//! etcd://[user[:password]@]host[:port][,host[:port]…][/][?option=value&…]
//! etcds://[user[:password]@]host[:port][,…]?ca=PATH[&cert=PATH&key=PATH][&domain=NAME][&…]
//! ```
//!
//! The port defaults to 2379; IPv6 hosts are written `[::1]:2379`. `etcds://` uses TLS and
//! needs `ca`. User and password (percent-encoded in the URL, or the `user` and `password`
//! options) authenticate with etcd's auth. Options (also settable with
//! [`EtcdConfig::with_option`]):
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `prefix` | `dlock/` | prepended verbatim to lock names: the dlock key `cron` is the etcdctl lock `dlock/cron`; `prefix=` (empty) makes it `cron`, but then any unrelated key under `cron/` stands in the lock's queue |
//! | `connect_timeout` | `5s` | bound on connecting, authenticating and the first `Status` request |
//! | `request_timeout` (`timeout`) | `5s` | bound on every request |
//! | `ca` (`cacert`) | — | PEM CA certificate (`etcds://` only, required there) |
//! | `cert`, `key` | — | PEM client certificate and key, together (`etcds://` only) |
//! | `domain` | the host | server name to verify (`etcds://` only) |
//! | `user` (`username`), `password` | — | etcd user and password |
//!
//! Durations: `250ms`, `5s`, `1.5s`, `2m`. An unknown option, a malformed value or an
//! unreadable TLS file is [`InvalidConfig`](dlock_core::LockError::InvalidConfig) before
//! any network I/O; no error or `Debug` output shows the password.
#![doc = include_str!("failure_modes.md")]
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod acquire;
mod config;
mod connection;
mod election;
mod error;
mod held;
mod inspect;
mod keywatch;
mod lease;
mod lock;
mod permits;
mod reentry;
mod shared;
mod watch;

use dlock_core::Result;
use dlock_core::raw::LockClient;

pub use config::EtcdConfig;
pub use lock::EtcdBackend;

/// The etcd lock: a [`dlock_core::raw::LockClient`] of an [`EtcdBackend`].
pub type EtcdLock = dlock_core::raw::LockClient<EtcdBackend>;

/// URL schemes this backend serves: `etcd://` (plain text) and `etcds://` (TLS).
pub const SCHEMES: &[&str] = &["etcd", "etcds"];

/// The backend's name in errors and logs.
pub(crate) const NAME: &str = "etcd";

/// Connect to the etcd cluster named by `url`: parse and check the whole URL, then connect
/// (and authenticate), bounded by its `connect_timeout`.
///
/// # Errors
/// [`LockError::InvalidConfig`](dlock_core::LockError::InvalidConfig) for a bad URL or an
/// unreadable TLS file, before any network I/O;
/// [`LockError::Unavailable`](dlock_core::LockError::Unavailable) when no endpoint answers
/// within the connect timeout; [`LockError::Backend`](dlock_core::LockError::Backend) when
/// the server refuses (wrong credentials, not an etcd server).
pub async fn from_url(url: &str) -> Result<LockClient<EtcdBackend>> {
    let config = EtcdConfig::from_url(url)?;
    Ok(LockClient::new(EtcdBackend::connect(config).await?))
}
