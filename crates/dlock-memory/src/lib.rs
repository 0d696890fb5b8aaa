//! An in-process lock server: dlock's embedded default, and the conformance suite's proof
//! that the suite can pass (and, with a broken backend, fail).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock_core::Result<()> {
//! use dlock_core::{DistributedLock, LockOptions};
//!
//! let lock = dlock_memory::from_url("memory://")?;
//! let lease = lock.acquire("jobs/cleanup", &LockOptions::new()).await?;
//! assert!(lock.try_acquire("jobs/cleanup", &LockOptions::new()).await?.is_none());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! A [`MemoryServer`] plays the part of the lock server; each [`MemoryLock`] made with
//! [`MemoryServer::client`] is an independent client of it, as separate connections to a
//! real server would be. It keeps the whole contract: ttl expiry, renewal, strictly
//! increasing fencing tokens, a lost signal, and FIFO waiters woken by notification.
//! Nothing survives the process, so it locks across tasks of one process only.
//!
//! # URL
//! `memory://` is the process-wide default server; `memory://NAME` a named one. Every
//! `from_url` with the same URL is a new client of the same server.
//!
//! # Key sets
//!
//! A set of keys ([`LockExt::acquire_all`](dlock_core::LockExt::acquire_all)) is taken key by
//! key in ascending byte order, as on every backend; a waiter on a key the set already took
//! waits for that key's release, or for the set to give it back when a later key stays busy.
//!
//! # Capabilities
//! | capability | value |
//! |---|---|
//! | fair | yes: FIFO hand-off on release |
//! | fencing | strict (per process) |
//! | expiry | ttl |
//! | wake-up | notification, one waiter per release |
//!
//! # Fault hooks
//! For tests of the suite itself: [`MemoryServer::break_lease`] deletes a key as an operator
//! would, [`MemoryBackend::set_partitioned`] cuts a client off, [`MemoryBackend::crash`]
//! makes it vanish without releasing.

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod backend;
mod server;

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use dlock_core::raw::LockClient;
use dlock_core::raw::url::LockUrl;
use dlock_core::{LockError, Result};

pub use backend::MemoryBackend;
pub use server::MemoryServer;

/// The memory backend's lock: a [`LockClient`] of a [`MemoryBackend`].
pub type MemoryLock = LockClient<MemoryBackend>;

/// URL schemes this backend serves.
pub const SCHEMES: &[&str] = &["memory"];

/// A new client of the server named by `url` (`memory://` or `memory://NAME`).
///
/// # Errors
/// [`LockError::InvalidConfig`] for another scheme, or a URL with a port, credentials, a
/// path or a query.
pub fn from_url(url: &str) -> Result<MemoryLock> {
    let parsed = LockUrl::parse("memory", url, SCHEMES, 0)?;
    let name = match parsed.hosts() {
        [] => String::new(),
        [host] if host.port == 0 => host.name.clone(),
        _ => {
            return Err(LockError::invalid_config(
                "memory",
                "memory:// takes only a server name: memory:// or memory://NAME",
            ));
        }
    };
    if parsed.username().is_some()
        || parsed.password().is_some()
        || !matches!(parsed.path(), "" | "/")
        || !parsed.options().is_empty()
    {
        return Err(LockError::invalid_config(
            "memory",
            "memory:// takes only a server name: memory:// or memory://NAME",
        ));
    }
    static SERVERS: OnceLock<Mutex<HashMap<String, MemoryServer>>> = OnceLock::new();
    let mut servers = SERVERS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    Ok(servers.entry(name).or_default().client())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::ErrorKind;

    #[test]
    fn urls() {
        for good in ["memory://", "memory://a", "memory://a/"] {
            from_url(good).unwrap();
        }
        for bad in [
            "memory://a:1",
            "memory://u:p@a",
            "memory://a/b",
            "memory://a?x=1",
            "redis://a",
            "nonsense",
        ] {
            assert_eq!(
                from_url(bad).unwrap_err().kind(),
                ErrorKind::InvalidConfig,
                "{bad}"
            );
        }
    }

    #[test]
    fn the_shared_url_table_passes() {
        dlock_conformance::urls::check_parser(
            |password, host| format!("memory://app:{password}@{host}"),
            |url| from_url(url).map(|c| format!("{c:?}")),
        );
    }
}
