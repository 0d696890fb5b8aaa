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
//! `VARBINARY(255)` primary key: compared as bytes, so `A` and `a` are two keys. Every
//! statement is sent as a text batch (several statements, one round trip) with names as
//! `X'…'` literals. Lock connections run at `READ COMMITTED` with
//! `innodb_lock_wait_timeout = 60`. *token* below is `NEXTVAL({table}_seq)` on MariaDB,
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
//!    a row). A row: granted, go to 4. A lock error: busy. No row (the key's first use): one batch `ROLLBACK`, create the row with `INSERT …
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
//! | `acquire` + `release`, key free, one client (lockbench *uncontended*) | 2: `BEGIN;` the locking statement that records, `ROLLBACK`; no commit that writes | 0.87–1.47× the raw cycle (lockbench, three runs) |
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
//!    slots: one batch `ROLLBACK; SET SESSION innodb_lock_wait_timeout = 1; INSERT … SELECT`
//!    the missing slot numbers `WHERE NOT EXISTS` (autocommit, a consistent read, no gap
//!    locks; a duplicate-key error, or the 1 s wait of a duplicate check that meets a slot
//!    another client just created and locked, starts over), then step 1's statements.
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
//!   `connection <id> (<host:port>)`. Listed, not queued: a permit waiter waits on one
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
//! as every statement is sent as text). Listed, not queued: the metadata-lock queue
//! promises no order. `list(prefix)`: the `{table}_fence` rows in the prefix's range whose
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
//!
//! # Elections
//!
//! [`Election`](dlock_core::Election) runs on the mutex of either mode: a campaign is an
//! exclusive acquire (the same waits, deadlines, kills and tokens), whose hold carries the
//! candidate's value where `inspect` shows the holder's `who`; the term is the hold's
//! fencing token (MariaDB: `NEXTVAL({table}_seq)` drawn in the locking statement). Values
//! go to the server as hex literals (`X'…'`), like names: any UTF-8 survives and nothing
//! in a value can change a statement. There is no standard MySQL election recipe to be
//! compatible with; the leader can be read by hand with the statements below.
//!
//! **`mode=row`.** The value is the `who` of the hold's own uncommitted `{table}_held`
//! row (*record* writes it in place of the description), so it lives and dies with the
//! holding transaction: a resignation (`ROLLBACK`), a crash or a kill removes leader and
//! value together.
//! - `campaign`: the acquire's round trips (the value rides in *record*).
//! - `proclaim`: 1 round trip on the holding connection, inside the holding transaction:
//!   `UPDATE {table}_held SET who = X'…' WHERE name = … AND conn = CONNECTION_ID()`
//!   (uncommitted, rolled back with the hold). No row matched, or a connection that
//!   fails: [`NotHeld`](dlock_core::LockError::NotHeld), and the connection is closed.
//!   (sqlx asks for found rows, so proclaiming the same value again matches the row.)
//! - `leader`: 1 round trip on a side connection: `SET TRANSACTION ISOLATION LEVEL READ
//!   UNCOMMITTED; SELECT token, who FROM {table}_held WHERE name = … AND mode =
//!   'exclusive' AND token IS NOT NULL` (no process-list scan, unlike `inspect`). A plain
//!   exclusive hold of the key shows as a leader whose value is its `NAME@HOST:PID`.
//! - `resign`: the release, 1 round trip.
//!
//! **`mode=named`.** A named lock has no row to carry a value, so the leader writes a
//! committed row `(name, conn, token, value)` in `{table}_value`, keyed by the row name,
//! and a reader trusts it only while `IS_USED_LOCK(lock name)` is the `conn` that wrote
//! it: a dead leader's row is never shown.
//! - `campaign`: the acquire's round trips: the fence batch on the granted connection ends
//!   with `INSERT INTO {table}_value … VALUES (…, CONNECTION_ID(), LAST_INSERT_ID(), X'…')
//!   ON DUPLICATE KEY UPDATE …`, which replaces whatever an earlier (crashed) leader left.
//! - `proclaim`: 1 round trip on a side connection (a holder connection runs only its
//!   carrier's requests): `UPDATE {table}_value SET value = X'…' WHERE name = … AND
//!   token = <term> AND conn = IS_USED_LOCK(…)`, owner-checked by the grant's token and
//!   by the lock being that connection's now; no row matched:
//!   [`NotHeld`](dlock_core::LockError::NotHeld).
//! - `leader`: 1 round trip on a side connection: `SELECT token, value FROM
//!   {table}_value WHERE name = … AND conn = IS_USED_LOCK(…)`. Only campaign holds show:
//!   a plain acquire of the key holds the lock with no value row, so `leader` answers
//!   `None` (inspect shows it as a session), and so does a campaign granted a moment
//!   ago whose fence batch has not run yet (its campaign has not returned either).
//! - `resign`: the release batch, 1 round trip: `DELETE FROM {table}_value WHERE name = …
//!   AND conn = CONNECTION_ID(); SELECT RELEASE_LOCK(…)`, the row first, so it never
//!   outlives the lock. A leader whose holder connection died releases with one more
//!   round trip, a side-connection `DELETE` of its grant's row (`token = <term>`) unless
//!   the lock is that connection's. Hygiene: nothing is left once every leader resigned;
//!   a leader process killed while leading leaves its row (never shown) until the next
//!   campaign on the key replaces it.
//!
//! **Observing** (both modes): MySQL has no server push (no `LISTEN`/`NOTIFY`, no change
//! stream a client can subscribe to without replication privileges), so
//! [`Capabilities::election`](dlock_core::Capabilities::election) is
//! [`Observe::Polled`](dlock_core::Observe::Polled) `{ every: 250 ms }` and observers read
//! `leader` every 250 ms, one round trip each: a change is seen within 250 ms plus a round
//! trip, and a leader (or a value) that lasts less than that may be missed. The hand-over
//! itself is the mutex's: the server grants the next waiting candidate at once.
//!
//! | election operation | row mode | named mode |
//! |---|---|---|
//! | `campaign`, key free | 1 (2 on a key's first use) | 2 (`GET_LOCK`, fence batch with the value) |
//! | `campaign` with a wake-up | 2 + the wait (MySQL 8: 3) | 2 + the wait |
//! | `proclaim` | 1, holding connection | 1, side connection |
//! | `leader`; an observer | 1; 1 per 250 ms | 1; 1 per 250 ms |
//! | `resign` | 1 | 1 (+1 after the connection died) |
//!
//! Measured p50 (loopback MariaDB 10.11, a shared 2-core machine, release build, 300
//! uncontended rounds on one key): row mode `campaign` + `resign` 391 µs, `proclaim` 142
//! µs, `leader` 231 µs; named mode 659 µs, 171 µs, 160 µs.
//!
//! # Reentrant holds
//!
//! [`LockOptions::owner`](dlock_core::LockOptions::owner) (both modes, exclusive only). The
//! lock stays what it is (row mode: the row lock of the first client's open transaction;
//! named mode: the `GET_LOCK` of its holder connection), and a **committed** row of
//! `{table}_owner` beside it keeps `(name, owner, token, entries, expires)`: the owner,
//! the hold (its fencing token: the sequence, or MySQL 8's per-key counter, never hands a
//! token out twice, so it names one continuous hold), the count of the hold's leases not
//! released yet, and the latest end of a lease of another client. The row is written in
//! autocommit on side connections, never by the holding transaction, so that every client
//! sees and changes it. Every statement on it is owner-checked by owner, token,
//! `entries > 0` and **the hold being current**: row mode, the hold's uncommitted
//! `{table}_held` record with that token exists (a `READ UNCOMMITTED` read inside the
//! `UPDATE`, which takes no lock on it); named mode, the key's `{table}_fence` row has that
//! token and names the connection `IS_USED_LOCK` names. So a lease of an earlier hold never
//! touches a later one, and the row of a crashed holder (stale) is never taken for a hold.
//! - **First acquire** (key free): the acquire above, then on a side connection `INSERT …
//!   ON DUPLICATE KEY UPDATE` of the row with one entry (it replaces any stale row: the
//!   key was free). Row mode: 2 round trips (3 on a key's first use); named mode: 3.
//! - **Re-entry**: one batch on a side connection: `UPDATE {table}_owner SET entries =
//!   entries + 1, token = LAST_INSERT_ID(token), expires = GREATEST(expires, NOW(6) + ttl)
//!   WHERE` *owner check*, `SELECT ROW_COUNT(), LAST_INSERT_ID()` (matched: granted at once
//!   with the hold's token), then the row is marked ended and deleted if its hold is gone
//!   (stale). It runs in a task of its own, which releases the entry if the caller gave
//!   up meanwhile. In the client that holds the lock: 1 round trip, no lock statement. From
//!   another client the lock is tried first (it may be free): 2 (`NOWAIT` or `GET_LOCK(…,
//!   0)`, busy, then the re-entry; row mode's `ROLLBACK` of the try follows the answer).
//! - **Waiting**: an owner that finds the key held by someone else waits as any acquire
//!   does, woken by the server's grant, but in rounds of 1 s (row mode: the session's
//!   `innodb_lock_wait_timeout = 1`, so a round ends on the server without a kill; named
//!   mode: `GET_LOCK(name, 1)`), each followed by a re-entry: the owner may have taken the
//!   key meanwhile in another client just after this acquire looked (a plain wait would
//!   then last until that hold ends). 2 statements a second per waiting owner acquire.
//! - **Release**: one batch on a side connection: `UPDATE … SET entries =
//!   LAST_INSERT_ID(entries - 1) WHERE` *owner check* and `SELECT ROW_COUNT(),
//!   LAST_INSERT_ID()`; no row matched: [`NotHeld`](dlock_core::LockError::NotHeld). Entries
//!   left: 1 round trip. None left in the client that holds the lock: the row's `DELETE`
//!   (side connection) and the lock's release (`ROLLBACK` / `RELEASE_LOCK`) at once: 2
//!   round trips, the key free after them. None left in another client: 1 round trip, and
//!   the holding client frees the key at its next poll (below), within 100 ms and 2 round
//!   trips.
//! - **Renewal** (every ttl/3; owner grants are never kept alive by a carrier, since each
//!   lease's renewal is its owner check): a lease of the client that holds the lock renews
//!   that session (row mode: the ping on the holding connection, `SET SESSION wait_timeout`
//!   to the longest ttl asked, at once when a re-entry in that client asks for a longer
//!   one, which costs it a second round trip; named mode: the carrier's keep); a lease of
//!   another client sends `UPDATE … SET expires = GREATEST(expires, NOW(6) + ttl) WHERE`
//!   *owner check* (1 round trip; no row matched: `NotHeld`, and `lost()` fires). No
//!   renewal shortens anything.
//! - **Loss in the client that holds the lock**: every lease of the hold there (the
//!   first, a re-entry, the ones left after the first was released) carries that session's
//!   loss signal: the lock's own (named mode's carrier), the hold's end, and the session's
//!   idle timeout that could have run out since the last renewal of the session that
//!   succeeded, whichever lease sent it (a tenth of the longest ttl and 2 ms before). So
//!   each hears the loss before the server can give the key away, as a plain hold does
//!   (a re-entry's own timing starts at its statement on a side connection, later than the
//!   session's idle clock). A re-entry there whose statement is not answered by that
//!   instant answers [`Unavailable`](dlock_core::LockError::Unavailable) (its task
//!   releases the entry if it counted). No round trip.
//! - **The first client's leases all released, others' still counting**: only the session
//!   that holds a row lock or a named lock can let it go, so that client keeps the session
//!   (its lock connection stays out of the pool, or its carrier keeps the lock) and a task
//!   polls every 100 ms on a side connection: `UPDATE … SET entries = 0 WHERE … AND expires
//!   < NOW(6)` (every other lease stopped renewing a ttl ago: a crashed client's entries
//!   stop counting) and `SELECT entries`; at zero (or no row) it deletes the row and lets
//!   the lock go. It also renews the session every third of the longest ttl. A lease of
//!   that client entering again stops the poll.
//! - **Crash**: the first client's session ends and the server frees the key at once,
//!   whatever the count; the owner's leases in other clients see `NotHeld` at their next
//!   renewal (a third of their ttl at the latest) and delete the stale row. A crash leaves
//!   the row only when no lease of another client remains: it is ignored, and replaced or
//!   deleted by the key's next owner acquire.
//!
//! **[`Reentry::FirstSession`](dlock_core::Reentry::FirstSession)**, not `AnyLease`: the
//! lock is a row lock of one open transaction, or a named lock of one session, and only
//! that session can keep or release it; when it ends (crash, kill, idle timeout) the
//! server frees the key at once, and nothing another client does can keep it. Fence what
//! the owner's other leases write.
//!
//! **A restarted process with the same owner id** continues the hold (enters it again,
//! with the same token, and releases what it enters) while the process that took it first
//! still runs: the hold lives in that process's session. If the restarted process was that
//! first one, its session ended with it and the key was freed: its next acquire takes a
//! new hold, with a new token. Entries of the dead process are never released: they count
//! while the first client's own leases live, and stop counting a ttl after their last
//! renewal once only the poll keeps the hold.
//!
//! | owner operation | round trips |
//! |---|---|
//! | first acquire, key free | row 2 (3 on a key's first use), named 3 |
//! | re-entry from the client that holds the lock | 1 |
//! | re-entry from another client | 2 |
//! | an owner's wait | the wait, in 1 s rounds with 1 re-entry each |
//! | release, entries left | 1 |
//! | last release, in the client that holds the lock | 2 (row delete and unlock at once: 1 after the first) |
//! | last release, in another client | 1; the key frees at the holder's next poll (≤ 100 ms + 2) |
//! | renewal | holding client: 1 ping (named: the carrier's keep); another client: 1 |
//!
//! Plain holds are unchanged: no statement is added to them (in named mode an acquire of a
//! key this client keeps for an owner waits for that hold to end before `GET_LOCK`, which
//! the holding session would grant it again).
//!
//! `inspect` shows one exclusive holder with the hold's token; its `who` (the holding
//! client's, as for any hold) ends with ` (owner job-7, held 3 times)`, read from the
//! hold's row (a `LEFT JOIN` on name and token in the same statement, no round trip).
//!
//! # Capabilities
//!
//! Both modes, except `max_held`, `Some(max_connections)` in row mode and `None` in named
//! mode, and `shared` and `permits`, `true` in row mode and `false` in named mode.
//!
//! | capability | value | why |
//! |---|---|---|
//! | fair | no | InnoDB does not promise FIFO grants: MariaDB grants a row's waiters in queue order, but MySQL 8 schedules by contention weight (CATS), and an acquire that restarts (its row deleted under it) queues again |
//! | fencing | strict | drawn after the grant from a source that never goes back: MariaDB's `{table}_seq` (a value is never handed out twice, even after a roll-back or a restart: cached values are skipped), MySQL 8's per-key counter committed on its own; durable with `innodb_flush_log_at_trx_commit = 1` (the default) and no failover to an asynchronous replica |
//! | expiry | ttl | the holding session's `wait_timeout` is ⌈ttl⌉ in whole seconds, kept alive by pings; a silent holder is cut off by the server ⌈ttl⌉ after its last statement |
//! | releases on disconnect | yes | a closed connection's transaction is rolled back at once |
//! | wake-up | notification, one per release | the server grants the row lock to one writer, or to the readers one release admits (each woken once) |
//! | shared | row mode: yes; named mode: no | InnoDB's shared row lock; `GET_LOCK` has none |
//! | permits | row mode: yes; named mode: no | a row lock on one of N slot rows; `GET_LOCK` cannot wait for any one of N names. The declared wake-up is the mutex's: a permit waiter is woken by the server only when the slot it waits on frees, and otherwise finds a freed slot by its re-scan within 1 s (see *Permits*) |
//! | max key length | 1024 bytes | longer names are hashed to 255 bytes in the table |
//! | inspect | who: yes; waiters: listed; list: yes (both modes) | row mode: each hold's uncommitted `{table}_held` row carries its `holder_description` (a leader's value); named mode: the holding connection's id and address (a leader's value). Waiters: the process list's running waits, in no promised order (not a queue: see *Inspecting*). Named mode lists no key longer than its shortened name |
//! | reentrant | first session (both modes) | the lock stays in the session of the client that took it; the owner and count in a committed `{table}_owner` row (see *Reentrant holds*) |
//! | election | polled, every 250 ms (both modes) | the value beside the hold (see *Elections*); MySQL cannot wake a client when a row or a named lock changes, so observers read the leader, one round trip, every 250 ms |
//!
//! **ttl rounding**: `wait_timeout` counts whole seconds, so the server keeps a silent
//! holder's lock up to ⌈ttl⌉ (at least 1 s) after its last ping, while `lost()` fires before
//! the ttl ends. A ttl under 1 s is accepted and rounded up on the server; other clients
//! then wait up to 1 s for a crashed-but-silent (partitioned) holder.
//!
//! # URL
//!
//! `mysql://user[:password]@host[:port]/database[?option=value&…]`, or `mariadb://` (the
//! same). User name, password and database are percent-decoded. Options:
//!
//! | option | default | meaning |
//! |---|---|---|
//! | `table` | `dlock_locks` | lock table (`{table}_fence` holds the counters); letters, digits, `_`, at most 58 characters |
//! | `connect_timeout` | `5s` | bound on opening a connection (`500ms`, `5s`, `1.5s`, `2m`; a bare number is refused) |
//! | `response_timeout` | `5s` | bound on every statement that does not wait for a lock |
//! | `mode` | `row` | `row` or `named`: how a key is held (see *Two modes*); every client of a table must use the same |
//! | `max_connections` | `100` | lock connections (1 to 10,000): row mode uses one per held key and per waiter; named mode one per holder connection and per waiter. When all are in use an acquire waits for one until its deadline, at most `connect_timeout`, then fails `Unavailable` with a message naming `max_connections` |
//! | `ssl-mode` | `verify_identity` if an `ssl-ca`, `ssl-cert` or `ssl-key` is given, else `preferred` | TLS: `disabled`, `preferred`, `required`, `verify_ca`, `verify_identity` (any case); see *Security* |
//! | `ssl-ca` | none | PEM file of the CA(s) the server's certificate must chain to; only the verifying modes read it, so it is refused with the others |
//! | `ssl-cert`, `ssl-key` | none | PEM client certificate and its key, together (for a `REQUIRE X509` user) |
//!
//! An unknown option, a bad value, TLS options that do not go together, a table name that
//! is not an identifier, or a missing host, user or database is
//! [`InvalidConfig`](dlock_core::LockError::InvalidConfig) before any network I/O (a TLS
//! file that cannot be read, at connect). No error, log or `Debug` output shows the
//! password.
//!
//! # Security
//!
//! **TLS.** What the options give (`mysql://app:secret@db.internal/app?…`):
//!
//! | options | connection | the server is |
//! |---|---|---|
//! | none | TLS if the server offers it, else plain text (`preferred`) | not checked |
//! | `ssl-ca=/etc/db-ca.pem` | TLS or fail (`verify_identity`) | checked: its certificate chains to the CA and names the URL's host |
//! | `ssl-mode=verify_identity` | TLS or fail | checked against public roots (Mozilla's list built into `webpki-roots`; the system's store is not read) |
//! | `ssl-mode=verify_ca&ssl-ca=…` | TLS or fail | its certificate chains to the CA (meant to accept any name; see below) |
//! | `ssl-mode=required` | TLS or fail | not checked: encryption against listeners, not against an impostor |
//! | `ssl-mode=disabled` | plain text | not checked |
//!
//! Naming a CA or a client certificate asks for TLS, so it means `verify_identity`, the
//! mode that authenticates the server as HTTPS does. sqlx's own default, `preferred`,
//! would check no certificate and fall back to plain text against a server (or an
//! impostor) that offers no TLS: a silent downgrade. For the same reason these are refused
//! rather than half-honoured: `ssl-ca` with `disabled`, `preferred` or `required` (sqlx
//! ignores the CA there: the connection would look checked and not be), any TLS file with
//! `disabled` or `preferred`, `verify_ca` without `ssl-ca` (a certificate any public CA
//! issued to anyone would pass), and `ssl-cert` without `ssl-key`. With no option at all the
//! mode stays `preferred`, so a local server without TLS (MariaDB's default) works out of
//! the box; checking by default would refuse nearly every server that never set TLS up
//! (MySQL 8 makes itself a self-signed certificate).
//!
//! A certificate that fails the check, a server that refuses the client certificate, and a
//! `REQUIRE SSL` user asked to log in over plain text are
//! [`Backend`](dlock_core::LockError::Backend) errors, at once: not
//! [`Unavailable`](dlock_core::LockError::Unavailable), since trying again gives the same
//! answer.
//!
//! `verify_ca` with sqlx 0.8.6 checks the host name as well: sqlx misses the name-mismatch
//! error of rustls ≥ 0.23.24 (sqlx issue #3793), so it works as `verify_identity` does.
//! Give the server a certificate that names the host the URL uses.
//!
//! **The password.** Without a checked server the password is exposed to whoever can
//! answer for the server's address, whatever `ssl-mode` says: sqlx hands the password in
//! clear to a server that asks for `mysql_clear_password`, sends it in clear inside TLS for
//! `caching_sha2_password` whether or not the certificate was checked, and over plain text
//! encrypts it with an RSA key the server sends unauthenticated; `mysql_native_password`
//! sends a SHA-1 challenge response open to offline guessing. So
//! [`MysqlBackend::connect`] (and [`from_url`]) logs one `tracing` warning when a password
//! goes to a host that is not loopback (`localhost`, `127.0.0.0/8`, `::1`, read from the
//! URL, not resolved) with a mode other than `verify_identity` or `verify_ca`. The
//! warning names the server's `host:port` and the mode, never the user or the password. It
//! is a warning, not a refusal: a private link or a VPN is the operator's call. Silence it
//! by checking the server: `ssl-ca=…` (or `ssl-mode=verify_identity` for a publicly
//! signed certificate). On the server, `REQUIRE SSL` (or `REQUIRE X509`) on the lock
//! user refuses plain text whatever a client's URL says.
//!
//! # What stays on the server
//!
//! By design, and nothing else once every lock is released:
//! - `{table}` keeps one small row per key ever locked (row mode), unlocked: deleting it
//!   at each release would cost an insert and a delete per cycle. An unlocked row is not
//!   a held key. Delete rows of keys retired for good (a deleted row is recreated on the
//!   key's next use).
//! - `{table}_slots`: one small row per permit slot ever needed (a key used with
//!   `Permits(n)` keeps up to `n`), unlocked. Delete a retired key's slots with its row.
//! - `{table}_seq` (MariaDB): the token sequence. Never reset, `ALTER` or `SETVAL` it:
//!   tokens would go back.
//! - `{table}_held`: nothing a committed read sees; each hold's row is never committed
//!   and ends with its transaction (see *Inspecting*).
//! - `{table}_value`: nothing once every named-mode leader has resigned. A leader whose
//!   holder connection died leaves its row until its lease is released or dropped (a
//!   side-connection `DELETE` of that grant's row) or the next leader of the key
//!   overwrites it; a process killed while leading leaves it until the next campaign on
//!   the key. Such a row is never shown (see *Elections*).
//! - `{table}_fence`: on MySQL 8 one counter per key ever locked (the counter must never
//!   go back), with the latest holder's connection id and grant time; on MariaDB the same
//!   per key locked in named mode. Delete fence rows only of keys retired for good.
//! - `{table}_owner`: nothing once every reentrant hold has ended (its last release, or
//!   its poll, deletes the row). A hold whose first client crashed with no lease left in
//!   another client leaves its row, stale (its hold is gone, so no statement takes it for
//!   one), until the key's next owner acquire replaces or deletes it.
//!
//! Who holds a key in row mode, by hand: `SET TRANSACTION ISOLATION LEVEL READ
//! UNCOMMITTED; SELECT conn, held_key, who FROM {table}_held` (`KILL <conn>` breaks the
//! lock); MySQL 8 also lists granted record locks in `performance_schema.data_locks`.
//!
//! Existing tables are checked at connect: InnoDB, and a `name` column that compares bytes
//! (binary type or `_bin` collation) at least 255 wide; anything else is refused, since a
//! case-insensitive column would merge `A` and `a`.
//!
//! **Upgrading** from a version that took row-mode tokens from `{table}_fence` and deleted
//! rows at release: on MariaDB the new version creates `{table}_seq` starting above every
//! counter, so a table whose clients all switch at once (stop the old ones first) keeps its
//! tokens rising. Old and new clients running together on one table draw from two
//! sources, and an old client's counter may pass the sequence: switch a table's clients
//! together, or give the new ones a new `table`. Rows the old version left are used as
//! they are.
//!
//! # Failure modes
//!
//! - **Holder crash**: the kernel closes the connection, the server rolls back, the key is
//!   free at once.
//! - **Holder partitioned**: its pings fail, so `lost()` fires before the ttl ends; the
//!   server ends the silent session ⌈ttl⌉ after its last statement, then the key is free.
//!   A partitioned *waiter* cannot be killed by its client, but its session has the same
//!   idle timeout: a grant it can no longer hear of is rolled back ⌈ttl⌉ later.
//! - **Client gone while waiting** (process killed mid-wait): the server notices the closed
//!   connection when the wait ends (grant, or `innodb_lock_wait_timeout` = 60 s) and rolls
//!   back at once.
//! - **Server restart**: every session ends and every lock is freed; holders' next ping
//!   fails and `lost()` fires. Tokens continue from the durable sequence (above every value
//!   it cached) or counters. Idle pooled
//!   connections found dead are replaced on first use.
//! - **Server unreachable or silent**: connecting fails with
//!   [`Unavailable`](dlock_core::LockError::Unavailable) within `connect_timeout`; every
//!   statement that does not wait is bounded by `response_timeout`, and a waiting one by
//!   60 s + `response_timeout`.
//!
//! # MySQL 8 and MariaDB
//!
//! - `NOWAIT`: MariaDB ≥ 10.3 answers error 1205, MySQL ≥ 8.0.1 error 3572; both mean busy.
//! - Lock grant order: MariaDB queues a row's waiters first come, first served; MySQL 8
//!   (≥ 8.0.20) always uses contention-aware scheduling (CATS). Hence not `fair`.
//! - Idle timeout: MySQL ≥ 8.0.24 sends error 4031 before closing an idle session, MariaDB
//!   just closes it; `KILL` shows as 1927 (MariaDB) or 3169 (MySQL) or a closed socket.
//!   All mean the session is gone.
//! - Isolation: the session variable is `tx_isolation` on MariaDB before 11.1 and
//!   `transaction_isolation` on MySQL 8, so the backend uses the portable
//!   `SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED`. `READ COMMITTED` needs
//!   row-based binary logging when the binlog is on (MySQL 8's default `ROW`, MariaDB's
//!   default `MIXED`); with `binlog_format = STATEMENT` the row insert is refused.
//! - `innodb_lock_wait_timeout` counts whole seconds on both (MariaDB accepts 0, MySQL
//!   starts at 1), so sub-second deadlines are the client's: it kills the statement.
//! - `KILL QUERY` landing on an idle session is ignored by MariaDB's next statement; the
//!   backend does not rely on that for MySQL: after a kill it rolls back, and a connection
//!   whose roll-back fails is closed instead of pooled.
//! - Seeing who waits: MariaDB `information_schema.INNODB_LOCKS` / `INNODB_LOCK_WAITS`
//!   (only locks in a wait, refreshed at most every 0.1 s); MySQL 8
//!   `performance_schema.data_locks` / `data_lock_waits`.
//! - Tokens: MariaDB ≥ 10.3 has sequences, drawn in the locking statement (no commit);
//!   MySQL 8 has none, so its tokens are per-key counters committed on a side connection
//!   (two more round trips and a commit per grant). Detected at connect from `VERSION()`.
//! - Killing one's own sessions needs no privilege on either server.
//! - Permits: `SKIP LOCKED` needs MariaDB ≥ 10.6 or MySQL ≥ 8.0.1 (an older server
//!   answers a permit acquire with a syntax error, `Backend`; the mutex works). The
//!   permit lock wait is set per session (`innodb_lock_wait_timeout = 1`, MySQL's
//!   shortest; MySQL 8 has no per-statement `WAIT n`), and put back to 60 before the
//!   connection returns to the pool. MariaDB's 0 is not used: with it, `NEXTVAL` in a
//!   transaction fails (error 1180) while another open transaction has drawn a value.
//!   Slot numbers are generated by cross-joined digits, not a recursive CTE (MySQL 8
//!   stops those at 1,000 rows by default).

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
