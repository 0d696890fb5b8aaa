//! A distributed lock on etcd, compatible with etcd's own `concurrency.Mutex` and `etcdctl lock`.
//!
//! ```no_run
//! # async fn demo() -> dlock_core::Result<()> {
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, LockOptions, Wait};
//!
//! let lock = dlock_etcd::from_url("etcd://127.0.0.1:2379?prefix=locks/").await?;
//! let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
//! let lease = lock.acquire("reports/nightly", &opts).await?;
//! // ... work, passing lease.fencing_token() to storage that checks it ...
//! lease.release().await
//! # }
//! ```
//!
//! TODO: protocol docs.

mod config;
mod error;
mod lock;

pub use config::EtcdConfig;
pub use lock::{EtcdBackend, from_url};

/// The etcd lock: a [`dlock_core::LockClient`] of an [`EtcdBackend`].
pub type EtcdLock = dlock_core::LockClient<EtcdBackend>;

/// URL schemes this backend serves: `etcd://` (plain text) and `etcds://` (TLS).
pub const SCHEMES: &[&str] = &["etcd", "etcds"];
