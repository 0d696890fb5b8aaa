//! A dlock backend on PostgreSQL: a key is a session-level advisory lock
//! (`pg_advisory_lock`, or `pg_advisory_lock_shared` for a shared hold), held by a holder
//! connection that carries many.
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock_core::Result<()> {
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, LockOptions, Wait};
//!
//! let lock = dlock_postgres::from_url("postgres://app:secret@db.internal:5432/app").await?;
//! let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
//! let lease = lock.acquire("reports/nightly", &opts).await?;
//! // ... work, passing lease.fencing_token() to storage that checks it ...
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! Built on [sqlx](https://docs.rs/sqlx)'s PostgreSQL driver. Needs PostgreSQL ≥ 14
//! (`idle_session_timeout`, `client_connection_check_interval`); tested on 15.
//!
//! # Protocol
//!
//! A key is the advisory lock `pg_advisory_lock(namespace, id)`: the two-`int4` form, whose
//! first number (`namespace`, default `0x646c6f63`, "dloc") keeps dlock's locks apart from
//! other users of advisory locks in the database, most of which use the one-`bigint` form (a
//! separate space on the server). The `id` comes from a table, created if missing with two
//! sequences:
//!
//! ```sql
//! CREATE SEQUENCE dlock_keys_id AS integer;      -- lock ids
//! CREATE SEQUENCE dlock_keys_fence AS bigint;    -- fencing tokens
//! CREATE TABLE dlock_keys (
//!   name text PRIMARY KEY,                        -- the key, as given
//!   id integer NOT NULL UNIQUE DEFAULT nextval('dlock_keys_id'),
//!   created timestamptz NOT NULL DEFAULT now());
//! ```
//!
//! **Why a table, not a hash.** A key hashed to 64 bits (or 32) can collide with another
//! key, and two keys sharing a lock would block each other or, worse, a client would think
//! it holds a key it shares. With the table two names can never share an id (`UNIQUE`), no
//! matter how many keys there are, at the cost of one look-up per key per client (ids are
//! cached in the client: a mapping never changes). Key names are stored as given (up to
//! 1024 bytes, compared byte for byte: `A` and `a` are two keys) and only ever sent as bound
//! parameters.
//!
//! **Taking a lock by hand** (another application, `psql`), excluding dlock's holders of
//! the key:
//!
//! ```sql
//! SELECT pg_advisory_lock(1684828003, id) FROM dlock_keys WHERE name = 'reports/nightly';
//! -- ... work ...
//! SELECT pg_advisory_unlock(1684828003, id) FROM dlock_keys WHERE name = 'reports/nightly';
//! ```
//!
//! (the key needs its row: dlock creates it at the key's first acquire; by hand,
//! `INSERT INTO dlock_keys (name) VALUES ('reports/nightly') ON CONFLICT DO NOTHING`).
//! A reader by hand uses `pg_advisory_lock_shared` and `pg_advisory_unlock_shared` on the
//! same two numbers: it shares the key with dlock's shared holds and excludes its exclusive
//! ones. `pg_locks` shows holders and waiters: `locktype = 'advisory'`, `classid` =
//! namespace, `objid` = id, `objsubid = 2`, `mode` `ExclusiveLock` or `ShareLock`.
//!
//! **Holder connections.** A session can hold any number of advisory locks, so held keys
//! share connections: holder connections are run by `dlock_core::raw::carrier` (shared
//! with `dlock-mysql`'s named mode). Auto-renewed holds of one ttl share them; a hold
//! without auto-renew gets one of its own, which nobody pings, so the server ends it ttl
//! after its last statement. A holder connection runs only short statements, one at a
//! time, releases first. A shared one that holds nothing waits a tenth of its ttl (at most
//! 1 s) for another take, its idle timeout kept, one per ttl in a client (others go back
//! at once, and those that hold nothing close when the client is dropped): a client that
//! takes and releases plain holds back to back keeps one session and sets its timeouts
//! once. When no take comes, one
//! statement puts the timeouts back (`idle_session_timeout` 0, keepalive idle 5 s) and the
//! connection goes back to the pool; a connection of its own (a hold without auto-renew)
//! goes back at once, reset by its release. Each lock
//! connection was set up once with `synchronous_commit = on`,
//! `client_connection_check_interval = 1s` and server-side TCP keepalives (5 s idle, 1 s
//! interval, 3 probes). Every statement that sets a holder's `idle_session_timeout` raises
//! the keepalive idle to the ttl too (whole seconds, rounded up), and a connection that
//! holds nothing again gets 5 s back: otherwise a partition or a lossy link would end a
//! holder's session 8 s after the server last heard from it, before a longer ttl ran out
//! and the holder's `lost()` fired.
//!
//! **Acquire** (the first try in the caller's task; only a wait gets a task of its own):
//! 1. The key's id: from the client's cache, else `SELECT id FROM dlock_keys WHERE name =
//!    $1`, else `INSERT … ON CONFLICT (name) DO NOTHING RETURNING id` (and the `SELECT`
//!    again if another client inserted it first).
//! 2. On a holder connection of the hold's group (opened from the pool when there is none,
//!    or when every one has a take in flight and the group has fewer than 8; a pooled
//!    connection, or one that waited for a take holding nothing, is not pinged: this
//!    statement proves it, and goes once more on a new connection if it had died while
//!    idle), one statement: `pg_try_advisory_lock(namespace,
//!    id)` (`pg_try_advisory_lock_shared` for a shared hold; see *Shared holds* for a
//!    connection that already reads the key); if granted, in the same statement,
//!    `nextval('dlock_keys_fence')` (the fencing token) and
//!    `set_config('idle_session_timeout', ttl)` (with `tcp_keepalives_idle`), left out
//!    when the connection's last hold already set them to that ttl. NULL: busy.
//!    This statement and a plain hold's release are prepared statements (the key's id and
//!    the timeouts are parameters), which each connection parses and plans once and keeps:
//!    sent as text, the server parsed and planned both anew on every cycle, about half its
//!    work for a take and release.
//! 3. Busy: `try_acquire`, or an acquire whose deadline passed, answers "held". Otherwise,
//!    on a connection of its own, one batch (an implicit transaction):
//!    `set_config('lock_timeout', time left, true)` (and `statement_timeout` 0, whatever
//!    the server's or role's default) then `pg_advisory_lock(namespace, id)` (`_shared`) in
//!    a subquery, with the token and the idle timeout as in 2 once it returns. The server's
//!    lock queue wakes it by granting the lock (one waiter per release). At the deadline
//!    the server's `lock_timeout` ends the wait itself (SQLSTATE `55P03`): the waiter
//!    leaves the queue, the batch rolls back (the `lock_timeout` setting with it), nothing
//!    is left behind. Waits longer than 60 s run in rounds of 60 s (re-queuing), so a
//!    silent server is noticed. Granted, the connection becomes a holder connection of the
//!    group: it carries this hold and takes later ones.
//! 4. When the caller drops the acquire future while it waits, the task cancels the waiting
//!    statement with `pg_cancel_backend(pid)` from a side connection (then
//!    `pg_terminate_backend`, ending the session, if it does not stop within 1 s), so a
//!    waiter that gave up never takes the key later; a grant that raced the cancel is
//!    dropped with `pg_advisory_unlock_all()` before the connection is pooled again.
//!
//! **Shared holds** (a read-write lock) take the same lock, `(namespace, id)`, in
//! PostgreSQL's share mode: `pg_try_advisory_lock_shared` and `pg_advisory_lock_shared`,
//! released by `pg_advisory_unlock_shared`, on the same holder connections, with the same
//! steps, deadline (`lock_timeout`), cancellation, keeping and idle-timeout loss as
//! exclusive holds. The server's lock manager keeps them apart: any number of sessions
//! hold a lock shared, an exclusive holder is alone. A new request that conflicts with one
//! already *waiting* queues behind it (the lock's wait mask is checked before its holders;
//! checked on 15): a shared request that comes while a writer waits, even while readers
//! hold the key, waits behind the writer, and its try variant answers busy, so readers
//! cannot starve a writer. One exception, covered by the backend: the server grants a lock
//! its session already holds in that mode (re-entry) without looking at the queue. A
//! holder connection carries many holds, so a second shared hold of a key on a connection
//! that already reads it runs, in one statement, `EXISTS (… pg_locks … NOT granted)` on
//! the key's lock first and answers busy when anything waits (the acquire then queues on a
//! connection of its own, behind the writer); only then `pg_try_advisory_lock_shared`.
//! Reading `pg_locks` copies the server's whole lock table, so only re-entry pays it.
//! A writer that leaves the queue (its `lock_timeout`, a cancel) lets the readers queued
//! behind it in at once; a release that frees the key for several queued readers grants
//! each of them (one wake-up per reader let in, none for a waiter that stays queued).
//!
//! **Tokens of shared holds**: `nextval` in the granting statement, as for exclusive
//! holds. A writer's token is greater than every token handed out before its grant on the
//! key, read or write (every earlier holder was granted, and took its token, before the
//! writer was granted); a reader's is greater than every earlier writer's. Readers that
//! hold together have distinct tokens in the order of their grants, which says nothing
//! about which of them wrote last.
//!
//! **Permits** (a semaphore, `LockOptions::permits(n)`): a key of `n` permits has `n`
//! *slots*, the exclusive advisory locks `(namespace + s, id)` for `s` = 0 … `n - 1`
//! (slot 0 is the key's own lock, so `Permits(1)` is the mutex; the first numbers wrap
//! in `int4`, and a key table's namespace owns the 10,000 numbers from its own). A permit
//! is one slot, held on a holder connection like any hold:
//! 1. The key's id, as for a lock.
//! 2. Try, one statement: a recursive query tries `pg_try_advisory_lock` on slot 0, 1, …
//!    in order, each only after the previous one failed, so it takes at most one slot,
//!    the lowest free; it skips the slots its own session holds (the server would grant
//!    those again, re-entrantly: a holder connection carrying two permits of a key holds
//!    two slots). Granted: the token (`nextval`) and the idle timeout in the same
//!    statement, as for a lock. All `n` busy: NULL.
//! 3. Busy and the deadline allows a wait: the waiter holds and queues nothing on the
//!    server. It registers with the client's *listener*, one connection per client
//!    (opened at its first permit wait, until the client is dropped) that `LISTEN`s on
//!    `dlock_permits_<namespace as unsigned>`, and tries step 2 again once the listener
//!    listens, then each time it is woken, until the deadline. A release notifies the
//!    channel with the key's id; the listener wakes every waiter of that key in the client,
//!    and each tries again (one round trip each; the statement lets one in per freed
//!    slot). A session that ends (a crash, `pg_terminate_backend`) frees its slots at once
//!    but notifies nobody, so a waiter also tries again 1 s after its last try: a slot
//!    freed that way reaches a waiter within about 1 s (as does a release while the
//!    listener reconnects, 2 s after it lost its connection). Timeout and cancellation end the wait in the client: nothing
//!    to undo on the server (a try in flight that is granted after the caller left is
//!    released by its holder connection).
//! 4. Release, one statement: `pg_advisory_unlock(namespace + s, id)` and
//!    `pg_notify(channel, id)` (sent at its commit, after the unlock). Of the slots its
//!    session holds for the key, a hold frees the highest: permits of a key are alike.
//!
//! Keeping and losing permits is as for locks (the holder connection's pings and idle
//! timeout). Tokens are strictly increasing on the key, as for locks. Clients that
//! disagree on the limit: an acquire of limit `n` is admitted while one of slots
//! 0 … `n - 1` is free. When every holder agrees, that is "fewer than `n` holders"; a
//! holder of a larger limit that took a slot ≥ `n` (the lower ones were busy then) does
//! not count against a limit of `n`, so the core's rule (count every holder against one's
//! own limit) holds only while such holders keep the lower slots busy. By hand, a permit
//! is `pg_try_advisory_lock(namespace + s, id)` on a free slot, and its release
//! `SELECT pg_advisory_unlock(namespace + s, id), pg_notify('dlock_permits_<namespace>',
//! id::text)` (without the notification, waiters find the slot within 1 s). A key is
//! used either as a lock or as a semaphore: mixing them on one key is not checked.
//!
//! **Keeping the holds**: a holder connection of auto-renewed holds pings the server
//! itself, once a third of the ttl after its last answered request, however many keys it
//! carries, and its holds are granted
//! [kept alive](dlock_core::raw::Grant::kept_alive): the watchdog keeps no timer and sends
//! no renewal per hold. A ping not answered by a tenth of the ttl before the server's
//! `idle_session_timeout` could end the session, or any failed request, ends the
//! connection: each hold it carried, and only those, is
//! [`NotHeld`](dlock_core::LockError::NotHeld) and `lost()` fires. A manual
//! [`Lease::extend`](dlock_core::Lease::extend) asks for a ping sent after it began
//! (`set_config('idle_session_timeout', …)` when a longer ttl was asked: a shared session
//! keeps the largest); the requests of one gap (ttl/30, at most 1 s) share one. A hold
//! without auto-renew has a connection of its own that nobody pings, so the server ends it
//! ttl after its last request.
//!
//! **Release**: on the holding connection, ahead of any queued take or ping, one
//! statement: `pg_advisory_unlock(namespace, id)` (`_shared` for a shared hold; when it
//! was the connection's last lock and the connection goes back to the pool at once rather
//! than wait for another take, the idle timeout back to 0 too); the lock goes to the next waiter in the server's queue (to every reader
//! queued together at its head). `false` (the session did not hold it) is
//! [`NotHeld`](dlock_core::LockError::NotHeld).
//!
//! **How many keys**: one client holds as many as memory allows
//! ([`max_held`](dlock_core::Capabilities::max_held) is `None`); the server's shared lock
//! table bounds all sessions together at `max_locks_per_transaction × (max_connections +
//! max_prepared_transactions)` locks (6,400 with the defaults 64 and 100). When it is
//! full an acquire fails with [`Backend`](dlock_core::LockError::Backend) naming
//! `max_locks_per_transaction`; raise it (a server restart) for more.
//!
//! **Crash**: a dead client's connection closes; the server ends its session and frees
//! its advisory locks at once. A waiter for a lock is granted it at once; a waiter for a
//! permit finds the freed slot at its next re-check, within about 1 s.
//!
//! | operation | round trips | measured p50 (loopback, PostgreSQL 15) |
//! |---|---|---|
//! | `try_acquire`, key free (id cached) | 1 | 0.12 ms |
//! | uncontended `acquire` + `release` of one key (lockbench) | 2 | 0.248–0.256 ms (raw cycle 0.246–0.256 ms: 1.00–1.01×) |
//! | `try_acquire`, key held | 1 | 0.11 ms |
//! | shared `try_acquire`, key free or read (id cached) | 1 | 0.09 ms ¹ |
//! | shared `try_acquire` on a holder connection that already reads the key | 1 (with a read of `pg_locks`) | 0.32 ms ¹ |
//! | a writer's release → the k readers queued behind it hold | unlock → k grants (k wake-ups) | — |
//! | first acquire of a key by a client | + 1 (id found) or + 2 (id made) | — |
//! | `acquire` with a wake-up | 2 + the wait: try, wait batch | — |
//! | contended hand-off, `release` called → waiter holds | unlock → grant | 0.24 ms |
//! | keeping held keys | one ping per holder connection per ttl/3, none per key | 0.07 ms (the ping) |
//! | `extend` by hand | 1 ping, shared with those of the same gap | 0.07 ms (the ping) once the connection's last ping is a gap old; an extend sooner after it waits for the gap (ttl/30, at most 1 s): back-to-back extends of a 30 s lease measured 1 s each |
//! | `release` | 1 | 0.07 ms |
//! | holder's session ends (`pg_terminate_backend`, crash) → waiter holds | the server frees → grant | 0.88 ms |
//! | `acquire` with a 300 ms deadline on a held key | the wait, ended by `lock_timeout` | 300.7 ms |
//! | permit `try_acquire`, slot 0 free / only slot 3 of 4 free / all 4 busy ² | 1 | 0.22 / 0.21 / 0.19 ms |
//! | permit `release` | 1 (with `pg_notify`) | — |
//! | permit hand-off, `release` called → waiter holds ² | unlock + notify → listener → 1 try per waiter of the key in each client | 0.79 ms (a mutex's 0.60 ms in the same run) |
//! | permit holder's session ends → waiter holds ² | the re-check: ≤ 1 s + 1 try | 996 ms |
//! | permit `acquire` that waits, first time in a client | + the listener's connect and `LISTEN` | — |
//! | `inspect`, key held ³ | 1 (reads `pg_locks` and `pg_stat_activity`) | 1.4 ms |
//! | election `campaign`, key free ⁴ | 1 (the try with the row's upsert and `pg_notify`) | 2.2 ms |
//! | `proclaim` ⁴ | 1 (side connection; reads `pg_locks`) | 2.3 ms |
//! | `leader()`, key led ⁴ | 1 (reads `pg_locks`) | 1.8 ms |
//! | `resign` ⁴ | 1 (unlock, row deleted, `pg_notify`) | 1.5 ms |
//! | `proclaim` called → an observer sees it ⁴ | update + notify → listener → 1 read | 5.9 ms |
//! | `list`, one key held ³ | 1 (reads `pg_locks`) | 0.82 ms |
//! | owner `try_acquire`, key free ⁵ | 1 (the try with the row's upsert and `pg_notify`) | 0.63 ms |
//! | owner re-entry, in the client that holds the lock / in another client ⁶ | 1 (holder connection) / 2 (side connection; reads `pg_locks`) | 0.34 / 1.37 ms |
//! | owner `release`, the count stays above zero, in the first client / in another ⁶ | 1 (holder connection) / 1 (side connection; reads `pg_locks`) | 0.32 / 0.81 ms |
//! | owner's last `release`, in the first client ⁵ | 2 (the count, then the unlock with the row) | 1.8 ms |
//! | owner's last `release` in another client → a waiter holds ⁵ | count + notify → listener → the first client's check → unlock → grant | 2.4 ms |
//!
//! A server round trip (`SELECT 1`) measured 0.06 ms, a raw `pg_advisory_lock` +
//! `pg_advisory_unlock` pair on one connection 0.14 ms. Medians of
//! `cargo run --release -p dlock-postgres --example postgres_latency` on a shared 2-core machine; the
//! lockbench row from `lockbench --backends postgres` (two runs). What the cycle pays beyond
//! the raw pair: the hand-offs to and from the holder connection's task (a task per
//! holder connection, which waits a tenth of the ttl, at most 1 s, for the next take once
//! it holds nothing, so back-to-back cycles share one task and set the session's timeouts once),
//! and `nextval`, which WAL-logs 32 values ahead, so one acquire in 32 also commits with a
//! WAL flush.
//! ¹ From a later, quieter run, where `SELECT 1` took 0.021 ms and an exclusive
//! `try_acquire` of a free key 0.074 ms; the re-entry's `pg_locks` read grows with the
//! number of locks on the whole server.
//! ² `postgres_latency` in a busier run (`SELECT 1` took 0.082 ms, an exclusive `try_acquire`
//! of a free key 0.19 ms); a semaphore of 4 permits.
//! ³ `postgres_latency` in a run beside other builds (`SELECT 1` took 0.027 ms, an
//! exclusive `try_acquire` of a free key 0.069 ms); both grow with the server's locks and
//! sessions (see *Inspecting*).
//! ⁴ `postgres_latency` in a busier run (`SELECT 1` 0.028 ms, an exclusive `try_acquire`
//! of a free key 0.094 ms, `inspect` 3.5 ms). Each write of the election row commits with a
//! WAL flush (`synchronous_commit = on`, which the fencing tokens need), most of a
//! campaign's, proclaim's and resignation's time here.
//! ⁵ `postgres_latency` beside other builds (`SELECT 1` 0.037 ms, an exclusive
//! `try_acquire` of a free key 0.079 ms, `inspect` 2.3 ms): each count change reads
//! `pg_locks` (the hold still live) and commits with a WAL flush. See *Reentrant holds*.
//! ⁶ `postgres_latency` in a later run (`SELECT 1` 0.018 ms, an exclusive `try_acquire` of
//! a free key 0.098 ms), once the first client's count changes ran on its holder
//! connection; the code before, run just before it (`SELECT 1` 0.086 ms, `try_acquire`
//! 0.12 ms): re-entry 0.88 / 1.35 ms, count down 0.77 / 0.76 ms. What is left in another
//! client is mostly the `pg_locks` read, which copies the server's whole lock table (about
//! 1 ms with the test servers' 128,000 lock slots: `max_locks_per_transaction` 256 ×
//! `max_connections` 500). See *Reentrant holds*.
//!
//! # Many keys
//!
//! `cargo run --release -p lockbench -- --backends postgres --hold-many 10000` (one client,
//! 10,000 keys, 128 acquires in flight, held 30 s; loopback, PostgreSQL 15, a shared 2-core
//! machine): 2,693 keys/s acquired at ttl 30 s (2,626/s at ttl 6 s), 0.0 % of a core while
//! holding at either ttl, 0 false losses, 0 failed releases, all released in 2.5 s. Before
//! holder connections, one connection per key stopped the client at 100 keys
//! (`max_connections`). The README's *Holding many keys* has every backend from the same
//! session.
//!
//! # Key sets
//!
//! A set of keys taken as one hold ([`LockExt::acquire_all`](dlock_core::LockExt::acquire_all))
//! is taken key by key, in ascending byte order, each key with the protocol above: one
//! advisory lock per key on the holder connections, so N free keys cost N times a single
//! key's round trips, and each key has its own token. While a set is being
//! taken, its keys taken so far are held: a waiter on one of them waits in the server's
//! lock queue and is granted the key when the set releases it, or gives it back because a
//! later key stayed busy (before `acquire_all` returns).
//!
//! # Elections
//!
//! An election ([`Election`](dlock_core::Election)) is the key's exclusive hold, taken,
//! kept, lost and released as above; its term is the hold's fencing token. The value lives
//! in a table beside the key table, created with it (`CREATE TABLE IF NOT EXISTS` at
//! connect, serialised like the key table; see *What stays on the server*):
//!
//! ```sql
//! CREATE TABLE dlock_keys_elect (
//!   ns integer, id integer,          -- the namespace and the key's id
//!   pid integer NOT NULL,            -- the holding session (pg_backend_pid())
//!   started timestamptz,             -- the server's start (pg_postmaster_start_time())
//!   token bigint NOT NULL,           -- the leader's term
//!   value text NOT NULL,             -- what it publishes
//!   PRIMARY KEY (ns, id));
//! ```
//!
//! A row is trusted only while `pg_locks` shows its `pid` holding the key's own lock
//! exclusively, and only if it was written in this run of the server (`started` =
//! `pg_postmaster_start_time()`: after a restart a pid may be another session's, a plain
//! holder's, say): a leader whose session ended (a crash, `pg_terminate_backend`, its idle
//! timeout, a server restart) leaves its row, which nobody reads as a leader and the next
//! leader's grant overwrites. (Within one run, a pid is reused only once the operating
//! system's pids wrap around; a plain holder given a dead leader's pid while its row is
//! still there would show that leader's value until the next leader's grant.) A table of
//! an earlier version, without `started`, gets the column at connect (`ALTER TABLE … ADD
//! COLUMN IF NOT EXISTS`; a role that may not alter it gets elections refused); its old
//! rows are not trusted. The value is only ever sent as a bound parameter or as hex digits
//! (`convert_from(decode('…', 'hex'), 'UTF8')`). Observers `LISTEN` on
//! `dlock_leaders_<namespace as unsigned>` (payload: the key's id), one listener
//! connection per client, opened at its first `observe`, like the permit listener.
//!
//! - **Campaign**: an acquire whose granting statement also upserts the row (`INSERT … ON
//!   CONFLICT (ns, id) DO UPDATE`, with `pg_backend_pid()` and the token) and
//!   `pg_notify`s the channel, sent at commit: the same round trips as an acquire (1 when
//!   free). A waiting candidate's batch goes on, once granted, with `lock_timeout` 0 and
//!   the same upsert and notification (the token from `currval`), in the same transaction:
//!   still one batch. Nobody ever reads the key held without its leader's row. If the
//!   row cannot be written, the try's statement fails, and the carrier session unlocks the
//!   key at once (the session-level lock survives the statement's rollback).
//! - **Proclaim**: one statement on a side connection, the value bound:
//!   `UPDATE … SET value = $1 WHERE` the row is this term's (`token`) `AND` `pg_locks`
//!   shows its session holding the key exclusively, then `pg_notify`; no row updated is
//!   [`NotHeld`](dlock_core::LockError::NotHeld). Owner-checked without the holder
//!   connection: only this hold wrote a row with its token, and a release deletes it.
//! - **Resign** (release): the unlock statement also deletes the session's row and
//!   notifies: 1 round trip, as a release.
//! - **Leader**: one statement on a side connection: the row joined with the key table,
//!   if `pg_locks` shows its session holding the key (reads `pg_locks`, as `inspect`).
//!   A plain (non-campaign) hold of the key is no leader: `None`.
//! - **Observe**: the stream subscribes before its first read: the key's id, then the
//!   listener listening, confirmed by the server (its `LISTEN` done, then its own check
//!   notification delivered back to it), waited for at most `connect_timeout` + `response_timeout`, else the stream's first item is
//!   [`Unavailable`](dlock_core::LockError::Unavailable) naming the listener. Each
//!   notification of the key (a grant to a candidate, after a wait too, a proclaim, a
//!   release) wakes it and it reads the leader (1 round trip).
//!   [`Observe::Woken`](dlock_core::Observe::Woken) with `recheck` 1 s: a session that
//!   ended notifies nobody, so a crashed leader with no candidate waiting is seen within
//!   1 s (a waiting candidate's grant notifies at once). A listener that loses its
//!   connection connects again 2 s later; once it has not listened for more than 1 s,
//!   every observer's stream ends with `Unavailable` naming the listener (changes may have
//!   gone unheard, and the capability no longer holds): follow again, which waits for the
//!   listener as above.
//! - **Inspect** shows a leader's value as its `who` and its term as its `fencing_token`
//!   (a `LEFT JOIN` of the row on the holding pid, written in this run of the server).
//!
//! No standard PostgreSQL recipe to be compatible with; by hand, the leader of a key is
//! `SELECT value, token FROM dlock_keys_elect e JOIN dlock_keys k ON k.id = e.id WHERE
//! e.ns = 1684828003 AND k.name = '…'` when `pg_locks` shows `e.pid` holding the key and
//! `e.started = pg_postmaster_start_time()`.
//! A role that cannot create the table, where it is missing, gets elections refused
//! ([`Observe::Unsupported`](dlock_core::Observe::Unsupported) in the capabilities,
//! logged once at connect); everything else works.
//!
//! # Inspecting
//!
//! [`inspect(key)`](dlock_core::DistributedLock::inspect) is one statement on a side
//! connection, one round trip, that reads and writes nothing else: the key's row in the
//! key table (by name; a key never locked has none and shows free, and no row is made),
//! joined with the key's rows in `pg_locks` (`locktype = 'advisory'`, this database,
//! `classid` = the namespace or one of its permit slots, `objid` = the id, `objsubid = 2`)
//! and, by pid, with `pg_stat_activity` (`application_name`, `client_addr`). No
//! `pg_try_advisory_lock` probe: nothing is taken, queued or left behind.
//!
//! - **Holders**: the granted rows, one per session and lock: `ShareLock` is a
//!   [`Shared`](dlock_core::Mode::Shared) hold, `ExclusiveLock` on the key's own lock an
//!   [`Exclusive`](dlock_core::Mode::Exclusive) one, a slot lock a
//!   [`Permits(0)`](dlock_core::Mode::Permits) (the limit is not stored on the server).
//!   Slot 0 *is* the key's own lock, so a semaphore whose only permit taken is slot 0 shows
//!   as an exclusive hold; once another slot shows, slot 0 shows as a permit too. A
//!   session that holds a key twice shows once (the server counts re-entries inside the
//!   session): two shared holds of one key by one client on one holder connection are one
//!   holder. `who` is the session's `application_name`, which dlock sets to the holder's
//!   [`holder_description`](dlock_core::holder_description) (`NAME@HOST:PID`, cut to 63
//!   bytes by shortening the host name) unless the URL names one (then that name, for every
//!   connection of the client); a session without a name (a lock taken by hand) shows as
//!   `backend PID from ADDR`. `since` and `ttl_left` are `None`: `pg_locks` keeps no grant
//!   time, and a holder connection carries many keys, so its last statement and its idle
//!   timeout say nothing about one key. `fencing_token` is `None`: `nextval` hands the
//!   token to the holder only. An election's leader is the exception: its `who` is the
//!   value it publishes and its `fencing_token` its term, from its row (see *Elections*).
//! - **Waiters**: the rows not granted, first in line first (by `pg_locks.waitstart`, the
//!   `since` of each; PostgreSQL ≥ 14), with their mode and `who` as for holders: the
//!   server's lock queue of the key's own lock, exclusive and shared requests, dlock's and
//!   those by hand. A permit waiter waits in its client and holds nothing on the server, so
//!   a key seen as a semaphore answers `waiters: None`, and the permit waiters of a
//!   semaphore seen as a mutex (only slot 0 taken) are missing from its empty list.
//!
//! [`list(prefix)`](dlock_core::DistributedLock::list) is one statement too: the names in
//! the key table (`starts_with(name, prefix)`) whose id has a granted lock of this
//! namespace in `pg_locks` (any slot, any mode), sorted byte by byte (`COLLATE "C"`). Keys
//! of other key tables or namespaces are left out; waited-for keys nobody holds are not
//! listed.
//!
//! **Privileges**: none beyond connecting and `SELECT` on the key table. `pg_locks` shows
//! every session's locks to every role; `pg_stat_activity` shows every session's pid and
//! `application_name` to every role, but the client address (and the state, the query)
//! only for the role's own sessions, unless the role has `pg_read_all_stats` (or is a
//! superuser): another role's unnamed session shows as `backend PID`.
//!
//! **Cost**: reading `pg_locks` copies the server's whole lock table, taking its partition
//! locks for a moment (the more locks on the server, the longer), and `pg_stat_activity`
//! every session's status: cheap for an occasional look, not for a tight poll on a busy
//! server. Measured p50 (`postgres_latency`, loopback, PostgreSQL 15, one key held, a
//! busy run: `SELECT 1` 0.027 ms): `inspect` 1.4 ms, `list` 0.82 ms (see the table in
//! *Protocol*).
//!
//! # Capabilities
//!
//! | capability | value | why |
//! |---|---|---|
//! | fair | no | the lock manager queues waiters in arrival order, but PostgreSQL does not document it as a promise, and a wait longer than a 60 s round re-queues at the back |
//! | fencing | strict | `nextval` of a sequence, taken in the granting statement: a sequence never hands a value out twice, even after a rollback or a crash (it WAL-logs values ahead of use, flushed at commit with `synchronous_commit = on`, which the backend sets); needs `fsync` on and no failover to an asynchronous standby. The sequence keeps `CACHE 1`: a cache gives each session its own range, so a later holder on another session could get a smaller token |
//! | expiry | ttl | the holding session's `idle_session_timeout` is the ttl (milliseconds), restarted by every ping; a silent holder's session is ended by the server ttl after its last statement |
//! | releases on disconnect | yes | a closed session's advisory locks are freed at once |
//! | wake-up | notification, one per release | the lock manager grants the lock to one waiter; a release that lets k queued readers in grants each of them once (k wake-ups, each a grant) |
//! | permits | yes | N slot locks per key, the first free one taken by one statement; waiters are woken by `pg_notify` on release (every waiter of the key tries again, one per freed slot gets in) and re-check every 1 s for slots freed by ended sessions, so a crashed permit holder's permit reaches a waiter within about 1 s, not at once; not fair |
//! | shared | yes | `pg_advisory_lock_shared` on the same lock; a reader that comes while a writer waits queues behind it (the lock manager's wait mask, and a `pg_locks` check on re-entry) |
//! | max key length | 1024 bytes | names are stored as given in the key table |
//! | inspect: who | yes | each session's `application_name`, visible to every role: dlock's holders and waiters carry their holder description |
//! | inspect: waiters | queue | the server's lock queue in `pg_locks`, ordered by `waitstart`; a semaphore's waiters wait in their clients and are not shown (`None` for a key seen as a semaphore) |
//! | inspect: list | yes | the key table keeps every key's name: held ids in `pg_locks` joined with it |
//! | reentrant | first session | the count in a row of `{table}_owner`, the lock in the first client's session, which keeps it until the count is zero and frees it with its end (see *Reentrant holds*) |
//! | election | woken, recheck 1 s | the value in `{table}_elect`, written by the granting statement; grants, proclaims and releases `pg_notify` the observers' listener; a leader's ended session notifies nobody, hence the re-read every second (see *Elections*) |
//!
//! Tokens are global (one sequence for every key), so they increase across all keys, and
//! strictly per key.
#![doc = include_str!("reentry.md")]
#![doc = include_str!("operating.md")]
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod acquire;
mod backend;
mod config;
mod election;
mod error;
mod inspect;
mod permits;
mod pool;
mod reentry;
mod session;
mod sql;

use dlock_core::Result;
use dlock_core::raw::LockClient;

pub use backend::PostgresBackend;
pub use config::PostgresConfig;

/// The PostgreSQL lock: a [`LockClient`] of a [`PostgresBackend`].
pub type PostgresLock = LockClient<PostgresBackend>;

/// URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["postgres", "postgresql"];

pub(crate) const NAME: &str = "postgres";

/// Parse `url`, connect (bounded by its `connect_timeout`), and create the key table and
/// its sequences if missing.
///
/// # Errors
/// [`InvalidConfig`](dlock_core::LockError::InvalidConfig) for a bad URL, before any network
/// I/O; otherwise as [`PostgresBackend::connect`].
pub async fn from_url(url: &str) -> Result<PostgresLock> {
    let config = PostgresConfig::from_url(url)?;
    Ok(LockClient::new(PostgresBackend::connect(config).await?))
}
