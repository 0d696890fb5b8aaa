//! MySQL / MariaDB backend for dlock.

mod config;
mod error;
mod lock;
mod pool;
mod sql;

use dlock_core::{LockClient, Result};

pub use config::MysqlConfig;
pub use lock::MysqlBackend;

/// The MySQL / MariaDB lock: a [`LockClient`] of a [`MysqlBackend`].
pub type MysqlLock = LockClient<MysqlBackend>;

/// URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["mysql", "mariadb"];

pub(crate) const NAME: &str = "mysql";

/// Parse `url`, connect, and create the lock tables if missing.
///
/// # Errors
/// See [`MysqlBackend::connect`].
pub async fn from_url(url: &str) -> Result<MysqlLock> {
    let config = MysqlConfig::from_url(url)?;
    Ok(LockClient::new(MysqlBackend::connect(config).await?))
}
