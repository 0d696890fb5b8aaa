//! The storage side of dlock's fencing tokens: write only if no newer holder has written.
//!
//! ```no_run
//! # async fn demo(lock: &dyn dlock::DistributedLock, conn: &mut redis::aio::MultiplexedConnection) -> Result<(), Box<dyn std::error::Error>> {
//! let lease = lock.acquire("invoices/7", &dlock::LockOptions::new()).await?;
//! // … a long GC pause here may outlive the lease: another client takes the key and writes …
//! match dlock_fence::redis::set(conn, "invoices/7:data", "paid", lease.fencing_token()).await {
//!     Ok(()) => {}                                    // our write stands
//!     Err(e) if e.is_stale() => return Ok(()),        // a newer holder wrote: we are not it
//!     Err(e) => return Err(e.into()),
//! }
//! # Ok(()) }
//! ```
//!
//! # Why
//!
//! A lease is a promise with a deadline. A holder that pauses (GC, a stalled VM, a slow
//! disk) past its ttl no longer holds the lock, but may not know it yet when it writes.
//! Every lease carries a fencing token (`dlock::Lease::fencing_token`) that grows with each
//! new holder of the key; when the store keeps the token of the last write beside the data
//! and refuses a write whose token is not larger, the late write of the paused holder is
//! refused ([`FenceError::StaleToken`]) and the newer holder's write stands. The lock gives
//! mutual exclusion while everyone is on time; the fence keeps the data safe when someone
//! is not.
//!
//! This is the optimistic `version` column of SQL with the number coming from the lock
//! instead of from the row: `UPDATE t SET …, version = version + 1 WHERE id = ? AND
//! version = ?` refuses a writer who read an older version; `UPDATE t SET …, fence = :token
//! WHERE id = ? AND fence < :token` refuses a writer whose lease is older. The comparison
//! is strict (`<`, not `<=`): a second write with the same token is refused too, so a
//! retried write that already applied reports [`StaleToken`](FenceError::StaleToken) with
//! `stored == token` (treat that as done, if the write is idempotent).
//!
//! # The three forms
//!
//! ## SQL (MySQL, MariaDB, PostgreSQL)
//!
//! The table carries a fence column, `BIGINT NOT NULL DEFAULT 0`, and rows exist before they
//! are fenced (an update never creates a row: a missing one is [`FenceError::Missing`]).
//! [`mysql::update`] and [`postgres::update`] run
//!
//! ```sql
//! UPDATE invoices SET status = ?, fence = ? WHERE id = ? AND fence < ?   -- token, id, token
//! ```
//!
//! with every value bound and the identifiers checked by [`sql::FencedTable`]:
//!
//! ```no_run
//! # async fn demo(conn: &mut sqlx::MySqlConnection, token: u64) -> Result<(), dlock_fence::FenceError> {
//! use dlock_fence::sql::FencedTable;
//!
//! let invoices = FencedTable::new("invoices", "id", "fence")?;
//! dlock_fence::mysql::update(conn, &invoices, 7_i64, token, |set| {
//!     set.push("status = ").push_bind("paid");
//! })
//! .await?;
//! # Ok(()) }
//! ```
//!
//! An applied write costs one round trip; a refused one a second (reading the stored fence
//! to tell [`StaleToken`](FenceError::StaleToken) from [`Missing`](FenceError::Missing)).
//! Writing the statement by hand is as good: check that the affected-row count is 1.
//!
//! ## Redis
//!
//! The value and its token live in one hash; [`redis::set`] runs one Lua script:
//!
//! ```text
//! stored = HGET key fence
//! if stored and stored >= token: return stored     -- refused
//! HSET key value <value> fence <token>
//! ```
//!
//! ## etcd
//!
//! The token lives in a companion key ([`etcd::fence_key`], `<key>:fence`, 20 zero-padded
//! digits so bytewise order is numeric order); [`etcd::put`] is one transaction:
//!
//! ```text
//! if create_revision(key:fence) == 0: put key value, put key:fence token
//! else txn { if value(key:fence) < token: put key value, put key:fence token
//!            else get key:fence }                  -- refused
//! ```
//!
//! # Which tokens the check can trust
//!
//! The check is only as good as the order of the tokens, which the lock backend declares
//! in `dlock::Capabilities::fencing`:
//!
//! - `Strict` (MySQL, PostgreSQL, etcd, ZooKeeper): every later holder's token is larger,
//!   across holder crashes and server restarts. A refused write is always a stale one.
//! - `BestEffort` (Redis, Redlock): tokens grow while the server's state survives. dlock's
//!   Redis token is a per-key counter floored by the server clock in microseconds, so a
//!   counter lost to a restart without persistence is still outranked by the next grant,
//!   and the check still refuses the paused holder. What it cannot survive is that clock
//!   stepping back across such a loss (or a failover to a replica whose clock is behind):
//!   the next holder may then get a *smaller* token, its writes are refused, and a stale
//!   holder's larger token would be accepted. Use a `Strict` backend where that matters.
//!
//! Tokens of different lock keys are not comparable: fence each record with the token of
//! the one lock that guards it.
//!
//! # Features
//!
//! One per store, all on by default: `mysql`, `postgres`, `redis`, `etcd`.

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod error;

pub use error::{BoxError, FenceError};

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "mysql")]
pub mod mysql;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "redis")]
pub mod redis;
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub mod sql;
