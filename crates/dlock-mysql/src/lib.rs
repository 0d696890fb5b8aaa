//! A dlock backend on MySQL or MariaDB: a key is a row, held by a `SELECT … FOR UPDATE` in a
//! transaction kept open on a dedicated connection (`mode=row`, the default), or a named
//! lock (`GET_LOCK`) on a holder connection that carries many (`mode=named`, for clients
//! that hold many keys).
//!
//! ```no_run
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock_core::Result<()> {
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, LockOptions, Wait};
//!
//! let lock = dlock_mysql::from_url("mysql://app:secret@db.internal:3306/app").await?;
//! let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
//! let lease = lock.acquire("reports/nightly", &opts).await?;
//! // ... work, passing lease.fencing_token() to storage that checks it ...
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! Built on [sqlx](https://docs.rs/sqlx)'s MySQL driver, which speaks to both servers.
//! Tested on MariaDB 10.11; the SQL is portable to MySQL 8 (see *MySQL 8 and MariaDB*).
//!
//! # Two modes: which one
//!
//! | | `mode=row` (the default) | `mode=named` (for many keys) |
//! |---|---|---|
//! | a held key is | a row locked by `SELECT … FOR UPDATE` in a transaction kept open | a named lock, `GET_LOCK(name, …)` |
//! | connections | one per held key and one per waiter | holder connections carrying any number of keys; one per waiter |
//! | keys one client holds at once ([`max_held`](dlock_core::Capabilities::max_held)) | `max_connections` (≤ 10,000, and the server's `max_connections`) | memory only |
//! | renewal cost | one ping per held key per ttl/3 | one ping per holder connection per ttl/3 |
//! | grant order | MariaDB: queue order; MySQL 8: contention-weighted | not promised (metadata-lock queue) |
//! | visible in SQL as | `{table}_held` rows read `READ UNCOMMITTED` (see *Inspecting*), InnoDB lock waits | `IS_USED_LOCK(name)`, `performance_schema.metadata_locks` (MySQL) |
//! | shared holds ([`shared`](dlock_core::Capabilities::shared)) | yes: InnoDB's shared row lock (see *Shared holds*) | no: `GET_LOCK` has no shared form, so a shared acquire is refused with `Unsupported` before any I/O |
//! | permits ([`permits`](dlock_core::Capabilities::permits)) | yes: a row lock on one of the key's N slot rows (see *Permits*) | no: `GET_LOCK` cannot wait for any one of N names, so a permit acquire is refused with `Unsupported` before any I/O |
//! | an election leader's value ([`election`](dlock_core::Capabilities::election)) | the `who` of its hold's uncommitted `{table}_held` row | a committed `{table}_value` row, trusted while `IS_USED_LOCK` names the connection that wrote it (see *Elections*) |
//!
//! **Choose `mode=named` to hold many keys from one process** (a lock per entity, thousands
//! held at once): 10,000 held keys cost a few holder connections and a few pings a second.
//! Both modes keep every promise of the conformance suite (it runs in both), take fencing
//! tokens from the same source (MariaDB: the `{table}_seq` sequence; MySQL 8: the
//! `{table}_fence` counters), and free a dead client's keys at once.
//!
//! **Row mode stays the default** because a key's holders must all use one mode: a row
//! lock and a named lock on the same key do not exclude each other, so changing the
//! default would let an upgraded client and a not-yet-upgraded one hold a key together
//! during a rolling upgrade. Switch every client of a table at once (or use a new
//! `table`). Row mode also keeps MariaDB's first-come grant order and shows holders and
//! waiters as table rows and InnoDB lock waits, and its locks are scoped to the database,
//! while named locks are server-wide (the table name goes into the lock name to keep two
//! tables apart). Row mode refuses the key after `max_connections` held keys with
//! `Unavailable` naming `max_connections`.
//!
//! # Protocol, `mode=row`
//!
//! Six tables, created if missing: `{table}` (default `dlock_locks`) with one row per key
//! ever locked, kept for the key's next use, `{table}_slots` (permit slots, see
//! *Permits*), `{table}_held` (each hold's own uncommitted row, see *Inspecting*),
//! `{table}_value` (named-mode leaders' values, see *Elections*), `{table}_owner`
//! (reentrant holds' owners and counts, both modes, see *Reentrant holds*), and
//! `{table}_fence` (per-key counters on
//! MySQL 8; on MariaDB the latest named-mode holder); and on MariaDB a sequence,
//! `{table}_seq`, the source of every token (created starting above every counter of
//! `{table}_fence`). Row
//! names are the key [escaped](dlock_core::raw::key::escape) to readable ASCII, long ones
//! [shortened](dlock_core::raw::key::shorten) to 255 bytes with a SHA-256 digest, in a
//! `VARBINARY(255)` primary key: compared as bytes, so `A` and `a` are two keys. Statements
//! are sent as text batches (several statements, one round trip) with names as `X'…'`
//! literals, but for the usual first try of a hold on MariaDB (step 2). Lock connections
//! run at `READ COMMITTED` with `innodb_lock_wait_timeout = 60`; on MariaDB from 10.5 in
//! row mode also with `autocommit` off, so that a statement starts the transaction without
//! a `BEGIN`. There, the batches that write a key's row or its permit slots before taking
//! them (*in autocommit* below) go on with a `BEGIN`, which commits that write; side
//! connections keep `autocommit` on. *token* below is `NEXTVAL({table}_seq)` on MariaDB,
//! `0` on MySQL 8.
//!
//! **Acquire** (steps 1, 2 and 4 in the caller's task; a wait in a task of its own that owns
//! the connection):
//! 1. Take a connection from the client's pool (it stays out of the pool while the key is
//!    held or waited for).
//! 2. One batch: `SET SESSION wait_timeout = ⌈ttl⌉` (left out when the session has it
//!    from an earlier lease), `BEGIN`, then the locking statement, which on MariaDB also
//!    *records* the hold (see *Inspecting*): `INSERT INTO {table}_held (…) SELECT name,
//!    CONNECTION_ID(), …, token, … FROM {table} WHERE name = … FOR UPDATE NOWAIT RETURNING
//!    token` (a shared hold: *lock* below, see *Shared holds*): the row lock, the token and
//!    the hold's row in one statement. MySQL 8 and MariaDB before 10.5 have no `RETURNING`
//!    (detected at connect from `VERSION()`): `SELECT token FROM
//!    {table} WHERE name = … FOR UPDATE NOWAIT`, then *record* as a statement of its own,
//!    `INSERT INTO {table}_held … SELECT … WHERE FOUND_ROWS() > 0` (only if the read locked
//!    a row). Where lock connections run with `autocommit` off, the locking statement
//!    goes alone, as a statement prepared once per connection, with the key, its holder and
//!    the row name as parameters, and starts the transaction itself: no `BEGIN`, one
//!    statement for the server to run instead of two, none to parse (a quarter less of its
//!    CPU a cycle). The batch form stays for a session whose idle timeout must be set first
//!    (its first hold, or a ttl of under 10 s, which release restores), a key's first use,
//!    a permit, and a server that refuses to prepare one more statement (its
//!    `max_prepared_stmt_count`, shared by every session: that connection then sends text
//!    only). A row: granted, go to 4. A lock error: busy. No row (the key's first use): one
//!    batch `ROLLBACK`, create the row with `INSERT …
//!    SELECT … WHERE NOT EXISTS` (a consistent read and a plain insert in autocommit, so it
//!    does not wait for a holder and never takes a locking read on a missing row, whose gap
//!    locks deadlock two inserters; two clients creating the row at once: the second's
//!    duplicate-key error makes it start over), then `BEGIN;` and the locking statement
//!    again.
//! 3. Busy: `try_acquire`, or an acquire whose deadline passed, answers "held". Otherwise
//!    one batch `SET …; BEGIN;` and the locking statement of step 2 without `NOWAIT` waits
//!    on the server, which wakes it by granting the row lock (one writer, or every reader
//!    one release admits). The batch must end with the wait: a kill that lands just after
//!    the grant then finds the session idle, whereas one landing between two statements of
//!    a batch leaves MariaDB's answer to the batch missing until the session is ended, a
//!    second later (seen as a flaky cancelled-reader scenario). On MariaDB the waiting
//!    statement records the hold itself, so the grant is complete when it returns; on
//!    MySQL 8 *record* follows on its own, one more round trip after a wait. At the deadline, or when the
//!    caller drops the future, the waiting statement is stopped with `KILL QUERY <id>`
//!    from a side connection (then `KILL <id>`, ending the session, if it does not stop
//!    within 1 s), so a waiter that gave up never takes the key later; its transaction is
//!    rolled back (InnoDB may have granted the row just before the kill).
//! 4. Granted. MariaDB: the locking statement drew the token once it held the row, so any
//!    later holder's token (drawn once it holds the row) is larger; a sequence never hands a
//!    value out twice, whatever rolls back or restarts. The lease runs from when the
//!    granted batch was sent (the session was busy until the grant, so its idle clock
//!    started later); a grant that arrives after ttl/3 is confirmed by one ping. MySQL 8:
//!    on a side connection, in autocommit, `INSERT … ON DUPLICATE KEY UPDATE fence =
//!    LAST_INSERT_ID(fence + 1), holder = <connection id>` and `SELECT LAST_INSERT_ID()`,
//!    then `SET SESSION wait_timeout = ⌈ttl⌉` on the holder, which proves the session still
//!    held the row after the token was committed and starts the lease.
//!
//! **Extend** (the watchdog, every ttl/3): `COM_PING` on the holding connection (`SET
//! SESSION wait_timeout` when the ttl changed). Any failure means the session, and with it
//! the lock, is gone or cannot be trusted: [`NotHeld`](dlock_core::LockError::NotHeld),
//! and `lost()` fires.
//!
//! **Release**: `ROLLBACK` (the row lock goes to the next waiter, if any, and the hold's
//! `{table}_held` row is undone; the transaction wrote nothing else), with `SET SESSION
//! wait_timeout = DEFAULT` in the same batch when ⌈ttl⌉ is under 10 s. The row stays; the
//! connection goes back to the pool with no transaction, and the pool drops it once it has
//! been idle for its `wait_timeout` less 1 s (at most 120 s), before the server would.
//!
//! **Crash**: a dead client's connection closes; the server rolls its transaction back and
//! the key is free at once.
//!
//! | operation (MariaDB) | round trips | measured p50 (loopback, MariaDB 10.11) |
//! |---|---|---|
//! | `try_acquire`, key free | 1: the lock batch (2 on a key's first use) | — |
//! | `try_acquire`, key held | 1 (a `ROLLBACK` follows the answer) | — |
//! | `acquire` with a wake-up | 2 + the wait: lock batch, wait batch (MySQL 8: + *record*) | — |
//! | `acquire` + `release`, key free, one client (lockbench *uncontended*) | 2: the prepared locking statement that records, `ROLLBACK`; no commit that writes | 1.02–1.06× the raw cycle (lockbench, two runs; 1.20–1.30× as a `BEGIN;` batch) |
//! | contended hand-off, `release` called → waiter holds (lockbench, 8 clients) | `ROLLBACK` → grant (MySQL 8: → *record*) | 254–295 µs (532–623 µs when *record* followed the grant on its own) |
//! | `extend` | 1 | — |
//! | `release` | 1 | — |
//! | holder's session ends (`KILL`, crash) → waiter holds | the server's roll-back → grant | — |
//! | `acquire` with a 300 ms deadline on a held key | the wait, then `KILL QUERY` (side connection) | — |
//!
//! Shared holds cost the same round trips as exclusive ones. On MySQL 8 a grant adds two
//! round trips (fence on a side connection, keep) and a commit that writes. Measured with `target/release/lockbench --backends mysql` (its
//! medians; a shared, noisy 2-core machine); the rows with `—` were not re-measured since
//! the change.
//!
//! # Shared holds
//!
//! Row mode only. [`LockOptions::shared`](dlock_core::LockOptions::shared) locks the same
//! row with InnoDB's shared row lock, *lock* = `LOCK IN SHARE MODE [NOWAIT]` on MariaDB
//! (which has no `FOR SHARE`) and `FOR SHARE [NOWAIT]` on MySQL 8 (whose `LOCK IN SHARE
//! MODE` takes no `NOWAIT`), in the same statements, steps and round trips as the
//! exclusive protocol: so dlock's readers and writers, and plain SQL sessions locking the
//! row, exclude each other in InnoDB's lock manager. Exclusive holds are unchanged and keep
//! excluding older clients of the table.
//! - **Readers share, a writer is alone**: shared row locks are compatible with each other,
//!   not with `FOR UPDATE`. `NOWAIT` answers at once in both modes (MariaDB error 1205,
//!   MySQL 3572): `try_acquire` is one round trip.
//! - **No writer starvation**: InnoDB checks a new request against every lock in the
//!   row's queue, waiting ones included, so a reader that arrives while a writer waits
//!   waits behind it, and its `NOWAIT` answers busy (checked on MariaDB 10.11: a reader
//!   holds, a writer waits, a new reader's `NOWAIT` fails and a waiting one is granted
//!   after the writer's release). MariaDB grants the queue in order; MySQL 8's CATS may
//!   grant queued readers ahead of the queued writer when the last holder releases (not
//!   tested here: no MySQL 8 server).
//! - **Wake-ups**: a writer's release grants every reader queued before the next waiting
//!   writer at once; each is woken once, by its own grant. No reader is woken to find the
//!   key busy.
//! - **Tokens**: as for a writer, drawn in the locking statement once the row lock is
//!   granted (MariaDB; MySQL 8 a counter committed after the grant). A writer's token is
//!   greater than every token handed out on the key before it, reads included (its grant
//!   waits for every reader's commit, after that reader drew); a reader's is greater than
//!   every earlier writer's. Readers that overlap get distinct tokens in no promised order.
//!   MySQL 8 records one of the overlapping readers as the fence row's `holder`.
//! - **Timeout, cancellation, crash**: as for the mutex: `KILL QUERY` stops a waiting
//!   reader, a roll-back undoes a grant that raced the kill, and a crashed reader's closed
//!   connection frees its share at once.
//!
//! lockbench's *read-mostly* workload (one key, nine shared holds in ten; loopback,
//! MariaDB 10.11, a shared 2-core machine, two runs): 8 clients 8,791–9,169 cycles/s, p50
//! 500–541 µs; 32 clients 4,702–5,750 cycles/s, p50 4.9–5.9 ms (readers queued behind a
//! waiting writer wait for it, by design).
//!
//! # Permits
//!
//! Row mode only. [`LockOptions::permits(n)`](dlock_core::LockOptions::permits) holds one
//! of the key's `n` *slots*: rows `(name, 0)` to `(name, n-1)` of `{table}_slots` (primary
//! key `(name, slot)`), made when an acquire finds no free slot and fewer than `n` rows,
//! and kept like the key rows. A permit is InnoDB's exclusive row lock on one slot, held by
//! an open transaction on a pinned connection exactly as a mutex holds the key's row: the
//! same renewal, release, idle timeout and crash release.
//!
//! **Acquire** (the same tasks, kills and roll-backs as the mutex):
//! 1. One batch: (`SET SESSION wait_timeout`), `BEGIN; SELECT COUNT(*) FROM {table}_slots
//!    WHERE name = … AND slot < n` (a consistent read: the committed slots), `SELECT token …
//!    slot < n ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED` (the lowest free slot; the
//!    scan stops at it, so no other slot is locked), then *record*. A row: granted. No row
//!    and `n` slots: busy. The count comes first because `SKIP LOCKED` also skips a slot
//!    whose creating insert has not committed yet: counted after it, slots another client
//!    was creating at that moment would count as held, and a try among clients racing to
//!    create a key's slots would answer busy with every slot free. No row and fewer
//!    slots: one batch `ROLLBACK; DO GET_LOCK(<the key's creation lock>, 2); SET SESSION
//!    innodb_lock_wait_timeout = 1; INSERT … SELECT` the missing slot numbers `WHERE NOT
//!    EXISTS` (autocommit, a consistent read, no gap locks), `BEGIN; DO RELEASE_LOCK(…)`,
//!    then step 1's statements. The creation lock, `dlock-slots:` and the first 52 hex
//!    digits of the SHA-256 of `{table}_slots`, a NUL byte and the row name, makes a key's
//!    creators take turns, so an insert only ever adds slots nobody has made: two at once
//!    would collide, and the second's duplicate-key check keeps a shared lock on the
//!    first's new slot until its transaction ends, which `SKIP LOCKED` skips, so a try
//!    that found every other slot held would answer busy with a permit free. A turn lasts
//!    one insert (whose lock wait is 1 s) and a commit; one not given within 2 s (a
//!    stalled server) is passed over. An insert that fails anyway (a writer that took no
//!    turn) starts over. A batch stopped before its release leaves the turn to the
//!    `ROLLBACK` that ends its transaction (the roll-back before a retry or a wait, or the
//!    connection's return to the pool).
//! 2. Busy: `try_acquire`, or an acquire whose deadline passed, answers "held".
//!    Otherwise wait in rounds: one batch `(SET SESSION innodb_lock_wait_timeout = 1;)
//!    BEGIN; SELECT token … WHERE name = … AND slot = s FOR UPDATE`, for slot `s` = (the
//!    connection id + the round) mod `n`. The server wakes it by granting that slot when
//!    its holder releases; after 1 s without a grant it looks at every slot again (step
//!    1's batch, no creation) and waits on the next slot. InnoDB cannot wait for any one of
//!    N rows, so this re-scan is a bounded poll: **a permit freed on a slot no waiter is
//!    queued on stays free for at most 1 s** (plus a round trip) while others wait; one
//!    queued on reaches its first waiter at once. Each waiting client sends two statements a
//!    second. At the deadline, or when the caller drops the future, the waiting statement is
//!    killed as for the mutex.
//! 3. Granted: the token as for the mutex (MariaDB: `NEXTVAL` in the locking statement;
//!    MySQL 8: the key's counter on a side connection, then the keep), so every permit has
//!    its own token, greater than every token of an earlier grant on the key.
//!
//! **Extend**, **release** and **crash** are the mutex's: a ping, `ROLLBACK`, and the
//! server's roll-back of a closed session (the slot is free at once). A connection whose
//! lock wait a permit shortened gets `innodb_lock_wait_timeout = 60` back in its release
//! batch.
//!
//! **Limits that disagree**: an acquire of `Permits(n)` is admitted while one of slots
//! `0..n` is free, so it counts the holders of those slots. When every client of a key
//! asks for the same `n` (the intended use) that is exactly "fewer than `n` holders", the
//! rule of [`Mode::Permits`](dlock_core::Mode::Permits). With disagreeing limits a holder of
//! a larger limit in a slot at or above `n` is not counted by an acquire of `n`: two holders
//! of 2 keep a third of 2 out and let one of 3 in (slot 2), but once a holder of 2 leaves,
//! an asker of 2 takes its slot beside the holder of 3. Never more than the largest limit
//! hold at once, and never more than `n` in slots below `n`.
//!
//! **Grant order**: not FIFO (not `fair`): waiters spread over the slots and leave a slot's
//! queue each round. `Permits(1)` is a mutex on slot 0 (a different row from the key's
//! mutex: a key is used either as a lock or as a semaphore).
//!
//! | permit operation (MariaDB) | round trips |
//! |---|---|
//! | `try_acquire`, a slot free | 1 |
//! | `try_acquire`, every slot held | 1 (a `ROLLBACK` follows the answer) |
//! | `try_acquire`, the key's first use (or a larger `n`) | 2: the try, the creating batch |
//! | `acquire` with a wake-up | 2 + the wait: try, wait batch; 2 more per 1 s round without a grant |
//! | `extend`, `release` | 1 |
//!
//! On MySQL 8 a grant adds the mutex's two round trips (fence, keep).
//!
//! # Protocol, `mode=named`
//!
//! A key's lock name is `dlock:` and the first 58 hex digits (232 bits) of the SHA-256 of
//! the table name, a NUL byte and the key's row name (as in row mode): always 64 lower-case
//! characters, MySQL 8's longest, and immune to MySQL's case-insensitive lock names. Named
//! locks are server-wide, hence the table in the digest. Two keys share a name only on a
//! digest collision, about n² / 2²³³ for n keys (10¹² keys: under 2⁻¹⁵³). By hand:
//! `SELECT IS_USED_LOCK(CONCAT('dlock:', LEFT(SHA2(CONCAT('dlock_locks', X'00', name), 256),
//! 58))) FROM dlock_locks_fence` lists holders' connection ids. Holder connections are run
//! by `dlock_core::raw::carrier`: auto-renewed holds of one ttl share them; a hold without
//! auto-renew gets one of its own, which nobody pings, so the server ends it ⌈ttl⌉ after
//! its last statement.
//!
//! **Acquire**:
//! 1. On a holder connection of the hold's group (opened from the pool when there is none;
//!    a pooled connection is pinged first): `SELECT GET_LOCK(name, 0)`. `0`: busy.
//! 2. Granted: on the same connection, one batch: `SET SESSION wait_timeout = ⌈ttl⌉`, the
//!    fence row's `INSERT … ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID(fence + 1)` (on
//!    MariaDB `LAST_INSERT_ID(NEXTVAL({table}_seq))`), `holder = <connection id>`
//!    (autocommit), `SELECT LAST_INSERT_ID()`: the token, taken after the grant, so any
//!    later holder's is larger. A failed batch releases
//!    the lock and fails the acquire.
//! 3. Busy: `try_acquire`, or an acquire whose deadline passed, answers "held". Otherwise,
//!    on a connection of its own, `SELECT GET_LOCK(name, round)` (round: the time left in
//!    whole seconds, at most 60, repeated) waits on the server, which wakes it by granting
//!    the lock. At the deadline, or when the caller drops the future, the statement is
//!    stopped with `KILL QUERY` (then `KILL`) and the connection closed, which frees a
//!    grant that raced the kill. Granted: step 2 on that connection, which then carries
//!    the hold and takes later holds of its group.
//!
//! **Keeping the holds**: a holder connection of auto-renewed holds sends a `COM_PING`
//! itself, once a third of the ttl after its last answered request, however many keys it
//! carries, and its holds are granted
//! [kept alive](dlock_core::raw::Grant::kept_alive): the watchdog keeps no timer and sends
//! no renewal per hold. A ping not answered by a tenth of the ttl before `wait_timeout`
//! could end the session, or any failed request, ends the connection: every hold it
//! carried, and only those, is [`NotHeld`](dlock_core::LockError::NotHeld) and `lost()`
//! fires. A manual [`Lease::extend`](dlock_core::Lease::extend) asks for a ping sent after
//! it began (`SET SESSION wait_timeout` when a longer ttl was asked); the requests of one
//! gap (ttl/30, at most 1 s) share one.
//!
//! **Release**: `SELECT RELEASE_LOCK(name)` on the connection that holds it, ahead of any
//! queued take or ping (a holder connection runs only short statements, never a wait).
//! `1`: released; otherwise [`NotHeld`](dlock_core::LockError::NotHeld). The last hold of
//! a connection also resets its `wait_timeout`, and the connection goes back to the pool.
//!
//! | operation, `mode=named` | round trips | measured (loopback, MariaDB 10.11, 10,000 keys) |
//! |---|---|---|
//! | `try_acquire`, key free | 2: `GET_LOCK`, fence batch | see *Many keys* |
//! | `try_acquire`, key held | 1 | — |
//! | `acquire` with a wake-up | 2 + the wait: try, wait, fence batch | — |
//! | keeping held keys | one ping per holder connection per ttl/3, none per key | — |
//! | `extend` by hand | 1 ping, shared with those of the same gap | — |
//! | `release` | 1 | — |
//!
//! # Many keys
//!
//! `cargo run --release -p lockbench -- --backends mysql --hold-many 10000` with
//! `DLOCK_MYSQL_URL=…?mode=named` (one client, 10,000 keys, 128 acquires in flight, held
//! 30 s; loopback, MariaDB 10.11, a shared 2-core machine): 3,209 keys/s acquired at ttl
//! 30 s (3,468/s at ttl 6 s), 0.0 % of a core while holding at either ttl, 0 false losses,
//! 0 failed releases, all released in 0.56 s. The same client in `mode=row` stops at
//! `max_connections` (100) held keys with `Unavailable` naming it. The README's *Holding
//! many keys* has every backend from the same session.
//!
//! # Key sets
//!
//! A set of keys taken as one hold ([`LockExt::acquire_all`](dlock_core::LockExt::acquire_all))
//! is taken key by key, in ascending byte order, each key with the protocol above: in
//! `mode=row` each key holds its own connection and transaction (a set of N keys keeps N
//! connections out of the pool, within `max_held`); in `mode=named` each key is one
//! `GET_LOCK` on the holder connections that carry many keys. N free keys cost N times a
//! single key's round trips, and each key has its own token. While a set is being taken, its
//! keys taken so far are held: a waiter on one of them waits in the server's lock queue and
//! is granted the key when the set releases it, or gives it back because a later key stayed
//! busy (before `acquire_all` returns).
//!
//! # Inspecting
//!
//! [`inspect`](dlock_core::DistributedLock::inspect) and
//! [`list`](dlock_core::DistributedLock::list) read with plain reads on a side connection:
//! no locking read, no write, nothing left behind, so no acquirer can find a key busy
//! because someone looked. One round trip each, in both modes.
//!
//! **`mode=row`.** InnoDB does not show a row lock nobody waits for: MariaDB has no
//! `performance_schema.data_locks`, and its `information_schema.INNODB_LOCKS` lists a lock
//! only while another transaction waits for it; `INNODB_TRX` shows that a transaction locks
//! rows, not which. The only read-only views of every granted lock are `SHOW ENGINE INNODB
//! STATUS` with the global `innodb_status_output_locks = ON` (off by default, set with
//! `SUPER`; its output is cut at 1 MB) and MySQL 8's `performance_schema.data_locks`. A
//! probe (`FOR UPDATE SKIP LOCKED` or `NOWAIT`) would take a free row's lock. So each hold
//! names itself: its granting statement (MariaDB's locking `INSERT … SELECT … RETURNING`;
//! on MySQL 8 and for permits a statement right after the locking read) is *record*, an
//! `INSERT` into `{table}_held` of
//! the row name, `CONNECTION_ID()`, the key, the mode (and a permit's `n`), the token
//! (drawn in the statement; on MySQL 8 set by the keep batch) and the client's
//! [`holder_description`](dlock_core::holder_description) (`NAME@HOST:PID`), never
//! committed: the release is a `ROLLBACK`, and a session that ends (crash, kill, idle
//! timeout) is rolled back with its lock, so the row lives exactly as long as the hold and
//! a committed read of the table is always empty. It costs no statement and no round trip
//! of its own on MariaDB 10.5+ (MySQL 8 and older MariaDB: one more statement in a try's
//! batch, one more round
//! trip after a wait), but an insert undone at release is a write where the lock alone
//! writes nothing: about 35 µs on the uncontended cycle (loopback MariaDB 10.11, raw SQL:
//! 50 → 85 µs p50), and with 8 clients on 8 keys it is most of the cycle's server time
//! (raw SQL batches: about 6,400–7,000 cycles/s with the insert, 11,000–14,000 without).
//! - `inspect(key)`: `SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED` (the next
//!   statement only), then `SELECT … FROM {table}_held WHERE name = …` (the holders: mode,
//!   token, grant time by the server's clock, `who` = the holder's description; no
//!   `ttl_left`: a session's `wait_timeout` is not visible to others), and the waiters:
//!   `information_schema.PROCESSLIST` rows whose running statement is a dlock wait for the
//!   key's row (`… WHERE name = X'…' FOR UPDATE` / `LOCK IN SHARE MODE` / `FOR SHARE`,
//!   followed by ` RETURNING token` where the wait records the hold, or a
//!   slot of it), with their mode (a permit waiter as `Permits(0)`) and `who` =
//!   `connection <id> (<host:port>)`; a session that holds the key is left out (a granted
//!   wait's statement stays in the process list a moment after its answer, while its
//!   record already shows the hold). Listed, not queued: a permit waiter waits on one
//!   slot at a time, and MySQL 8 does not grant in queue order. A waiter between two wait
//!   rounds (every 60 s; every 1 s for permits) is missing for a moment.
//! - `list(prefix)`: the same dirty read, `SELECT DISTINCT held_key FROM {table}_held`
//!   whose first bytes are the prefix.
//! - Privileges: `SELECT` on `{table}_held` (and `INSERT` for the holders, as on the other
//!   tables); `PROCESS` to see the waiters of other database users (without it, the
//!   process list shows only the user's own sessions, which covers clients that share a
//!   user).
//!
//! **`mode=named`.** One batch: `IS_USED_LOCK(name)` (the holding connection's id, or
//! `NULL`), joined with `information_schema.PROCESSLIST` for its user and address (`who` =
//! `connection <id> (<user>@<host:port>)`: sqlx sends no connection attributes, so the
//! holder's description cannot travel with the session), and with the key's
//! `{table}_fence` row when its `holder` is that connection (written at the grant: the
//! token and the grant time; a moment after a grant they may still be the previous
//! holder's, and are then left out); then the waiters: process-list sessions running
//! `SELECT GET_LOCK(X'…', n)` with the key's lock name and `n > 0` (the text names the lock,
//! as every statement is sent as text), but the holding connection (its granted
//! `GET_LOCK` may still show a moment after its answer). Listed, not queued: the
//! metadata-lock queue promises no order. `list(prefix)`: the `{table}_fence` rows in the prefix's range whose
//! lock name `IS_USED_LOCK` finds held, turned back into keys; **a key whose escaped name
//! was shortened (over 255 bytes) cannot be turned back and is not listed**. Privileges: none
//! for `IS_USED_LOCK`; `SELECT` on `{table}_fence`; `PROCESS` as above. The scan reads
//! every fence row in the prefix's range (one per key ever locked in named mode).
//!
//! **MySQL 8** (not tested here): the same statements work (`FOUND_ROWS()` is deprecated
//! from 8.0.17 but answers; the process list is `information_schema.PROCESSLIST`, also
//! deprecated in favour of `performance_schema.processlist`). MySQL 8 could show row locks
//! without *record*: `performance_schema.data_locks` lists granted record locks
//! (`LOCK_DATA` = the row name, `THREAD_ID` → `performance_schema.threads.PROCESSLIST_ID`)
//! and `data_lock_waits` the waits; named locks show in `performance_schema.metadata_locks`
//! (`OBJECT_TYPE = 'USER LEVEL LOCK'`, `LOCK_STATUS` `GRANTED` or `PENDING`). The backend
//! uses the portable form on both.
#![doc = include_str!("elections_reentry.md")]
#![doc = include_str!("operating.md")]
#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod acquire;
mod backend;
mod config;
mod election;
mod error;
mod grant;
mod held;
mod inspect;
mod named;
mod permits;
mod pool;
mod reentry;
mod sql;
mod stop;
mod tls;

use dlock_core::Result;
use dlock_core::raw::LockClient;

pub use backend::MysqlBackend;
pub use config::{LockMode, MysqlConfig};

/// The MySQL / MariaDB lock: a [`LockClient`] of a [`MysqlBackend`].
pub type MysqlLock = LockClient<MysqlBackend>;

/// URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["mysql", "mariadb"];

pub(crate) const NAME: &str = "mysql";

/// Parse `url`, connect (bounded by its `connect_timeout`), and create the lock tables if
/// missing.
///
/// # Errors
/// [`InvalidConfig`](dlock_core::LockError::InvalidConfig) for a bad URL, before any network
/// I/O; otherwise as [`MysqlBackend::connect`].
pub async fn from_url(url: &str) -> Result<MysqlLock> {
    let config = MysqlConfig::from_url(url)?;
    Ok(LockClient::new(MysqlBackend::connect(config).await?))
}
