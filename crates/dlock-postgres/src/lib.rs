//! A dlock backend on PostgreSQL: a key is a session-level advisory lock
//! (`pg_advisory_lock`), held by a dedicated connection.
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
//! DOCS

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod acquire;
mod backend;
mod config;
mod error;
mod held;
mod pool;
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
