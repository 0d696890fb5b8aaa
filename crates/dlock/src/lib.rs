//! One async [`DistributedLock`] trait with real backends behind it; [`connect`] picks one
//! from a URL, so swapping Redis for ZooKeeper is a change of configuration, not of code.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> dlock::Result<()> {
//! use std::time::Duration;
//! use dlock::{LockOptions, Wait};
//!
//! let lock = dlock::connect("memory://").await?; // or redis://…, zk://…, etcd://…
//! let opts = LockOptions::new().ttl(Duration::from_secs(10)).wait(Wait::For(Duration::from_secs(2)));
//! let lease = lock.acquire("invoices/2026-11", &opts).await?;
//! println!("holding {} with fencing token {}", lease.key(), lease.fencing_token());
//! lease.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Backends
//!
//! | scheme | backend | feature | crate |
//! |---|---|---|---|
//! | `memory://[NAME]` | in-process (tasks of one process) | `memory` | `dlock-memory` |
//! | `redis://`, `rediss://` | one Redis server | `redis` | `dlock-redis` |
//! | `redis+sentinel://`, `rediss+sentinel://` | the Redis master Sentinel names | `redis` | `dlock-redis` |
//! | `redis+cluster://`, `rediss+cluster://` | a Redis Cluster | `redis` | `dlock-redis` |
//! | `redlock://`, `redlocks://` | Redlock over independent Redis nodes | `redlock` | `dlock-redlock` |
//! | `zk://`, `zookeeper://`, `zks://` | ZooKeeper | `zookeeper` | `dlock-zookeeper` |
//! | `etcd://`, `etcds://` | etcd v3 | `etcd` | `dlock-etcd` |
//! | `mysql://`, `mariadb://` | MySQL 8 / MariaDB row lock | `mysql` | `dlock-mysql` |
//! | `postgres://`, `postgresql://` | PostgreSQL advisory lock | `postgres` | `dlock-postgres` |
//!
//! All features are on by default, and so is `blocking`: [`blocking`] is the same API for
//! code that is not async (threads, CLI tools, build scripts).
//!
//! Each backend is a cargo feature; a URL whose backend is compiled out is
//! [`LockError::InvalidConfig`] naming the feature to enable. A backend's URL options are
//! documented in its crate.
//!
//! # What every backend promises
//!
//! The contract is written out on [`DistributedLock`]; the `dlock-conformance` suite checks
//! it against each real server. Where backends differ (fair waiters, fencing strength, how a
//! silent holder loses the key), [`DistributedLock::capabilities`] says so.

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

use std::sync::Arc;

use dlock_core::raw::url as raw_url;

#[cfg(feature = "blocking")]
pub mod blocking;

pub use dlock_core::{
    BoxError, Capabilities, DistributedLock, Election, ErrorKind, Expiry, FaultSafety, Faults,
    Fencing, HolderStatus, Inspection, KeyStatus, Leader, Leadership, Lease, LeaseSet, LockError,
    LockExt, LockOptions, LockStats, LostReason, LostSignal, Mode, Observe, Owner, Reentry, Result,
    Secret, Wait, WaiterStatus, WaiterView, Wakeup, election, holder_description, set_holder_name,
    settle, telemetry,
};

/// A backend, chosen by the URL scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheme {
    /// `memory://`
    Memory,
    /// `redis://`, `rediss://` (TLS); `redis+sentinel://`, `redis+cluster://` (and their
    /// `rediss+` forms): one Redis server, a master found through Sentinel, a Redis Cluster
    Redis,
    /// `redlock://`, `redlocks://` (TLS)
    Redlock,
    /// `zk://`, `zookeeper://`, `zks://` (TLS)
    ZooKeeper,
    /// `etcd://`, `etcds://` (TLS)
    Etcd,
    /// `mysql://`, `mariadb://`
    MySql,
    /// `postgres://`, `postgresql://`
    Postgres,
}

impl Scheme {
    /// Every scheme string and the backend it selects.
    pub const ALL: &'static [(&'static str, Scheme)] = &[
        ("memory", Scheme::Memory),
        ("redis", Scheme::Redis),
        ("rediss", Scheme::Redis),
        ("redis+sentinel", Scheme::Redis),
        ("rediss+sentinel", Scheme::Redis),
        ("redis+cluster", Scheme::Redis),
        ("rediss+cluster", Scheme::Redis),
        ("redlock", Scheme::Redlock),
        ("redlocks", Scheme::Redlock),
        ("zk", Scheme::ZooKeeper),
        ("zookeeper", Scheme::ZooKeeper),
        ("zks", Scheme::ZooKeeper),
        ("etcd", Scheme::Etcd),
        ("etcds", Scheme::Etcd),
        ("mysql", Scheme::MySql),
        ("mariadb", Scheme::MySql),
        ("postgres", Scheme::Postgres),
        ("postgresql", Scheme::Postgres),
    ];

    /// The backend a URL names. Looks only at the scheme, so nothing else of the URL (a
    /// password, say) can end up in the error.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when the URL has no `scheme://` or the scheme is unknown.
    pub fn parse(url: &str) -> Result<Scheme> {
        let Some(scheme) = url.split_once("://").map(|(s, _)| s) else {
            return Err(LockError::invalid_config(
                "dlock",
                format!(
                    "not a lock URL (expected scheme://…, one of {})",
                    Self::names()
                ),
            ));
        };
        // Echo the scheme only if it looks like one: text before a later "://" may be
        // credentials.
        let lower = raw_url::scheme(url);
        let shown = match &lower {
            Some(_) => format!("{scheme:?}"),
            None => "in this URL".to_owned(),
        };
        Self::ALL
            .iter()
            .find(|(name, _)| Some(*name) == lower.as_deref())
            .map(|(_, s)| *s)
            .ok_or_else(|| {
                LockError::invalid_config(
                    "dlock",
                    format!("unknown scheme {shown} (supported: {})", Self::names()),
                )
            })
    }

    /// The cargo feature of the `dlock` crate that compiles this backend in.
    pub fn feature(self) -> &'static str {
        match self {
            Scheme::Memory => "memory",
            Scheme::Redis => "redis",
            Scheme::Redlock => "redlock",
            Scheme::ZooKeeper => "zookeeper",
            Scheme::Etcd => "etcd",
            Scheme::MySql => "mysql",
            Scheme::Postgres => "postgres",
        }
    }

    /// Whether this backend is compiled in.
    pub fn is_enabled(self) -> bool {
        match self {
            Scheme::Memory => cfg!(feature = "memory"),
            Scheme::Redis => cfg!(feature = "redis"),
            Scheme::Redlock => cfg!(feature = "redlock"),
            Scheme::ZooKeeper => cfg!(feature = "zookeeper"),
            Scheme::Etcd => cfg!(feature = "etcd"),
            Scheme::MySql => cfg!(feature = "mysql"),
            Scheme::Postgres => cfg!(feature = "postgres"),
        }
    }

    fn names() -> String {
        Self::ALL
            .iter()
            .map(|(n, _)| format!("{n}://"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Connect to the lock service a URL names, e.g. `redis://127.0.0.1:6379` or
/// `zk://10.0.0.1:2181,10.0.0.2:2181/app`.
///
/// The URL is checked completely before any network I/O; connecting is bounded by the
/// backend's connect timeout. Passwords in the URL never appear in errors, logs or `Debug`
/// output.
///
/// # Errors
/// [`LockError::InvalidConfig`] for a malformed URL, an unknown option, or a backend whose
/// feature is off; [`LockError::Unavailable`] when the server cannot be reached;
/// [`LockError::Backend`] when it refuses (wrong credentials, wrong kind of server).
pub async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>> {
    let scheme = Scheme::parse(url)?;
    match scheme {
        #[cfg(feature = "memory")]
        Scheme::Memory => Ok(Arc::new(dlock_memory::from_url(url)?)),
        #[cfg(feature = "redis")]
        Scheme::Redis => Ok(Arc::new(dlock_redis::from_url(url).await?)),
        #[cfg(feature = "redlock")]
        Scheme::Redlock => Ok(Arc::new(dlock_redlock::from_url(url).await?)),
        #[cfg(feature = "zookeeper")]
        Scheme::ZooKeeper => Ok(Arc::new(dlock_zookeeper::from_url(url).await?)),
        #[cfg(feature = "etcd")]
        Scheme::Etcd => Ok(Arc::new(dlock_etcd::from_url(url).await?)),
        #[cfg(feature = "mysql")]
        Scheme::MySql => Ok(Arc::new(dlock_mysql::from_url(url).await?)),
        #[cfg(feature = "postgres")]
        Scheme::Postgres => Ok(Arc::new(dlock_postgres::from_url(url).await?)),
        // Reached only when a backend's feature is off.
        #[allow(unreachable_patterns)]
        _ => Err(LockError::invalid_config(
            "dlock",
            format!(
                "{}:// needs the `{}` feature of the dlock crate, which is not enabled in this build",
                url.split_once("://").map_or("", |(s, _)| s),
                scheme.feature()
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_parse_case_insensitively() {
        assert_eq!(Scheme::parse("REDIS://h").unwrap(), Scheme::Redis);
        for url in [
            "redis+sentinel://h:26379/mymaster",
            "Rediss+Sentinel://h/mymaster",
            "redis+cluster://a:7000,b:7001",
            "rediss+cluster://a:7000",
        ] {
            assert_eq!(Scheme::parse(url).unwrap(), Scheme::Redis, "{url}");
        }
        assert_eq!(Scheme::parse("zookeeper://h").unwrap(), Scheme::ZooKeeper);
        assert_eq!(Scheme::parse("ZKS://h?ca=/c").unwrap(), Scheme::ZooKeeper);
        assert_eq!(Scheme::parse("mariadb://u:p@h/db").unwrap(), Scheme::MySql);
        assert_eq!(
            Scheme::parse("PostgreSQL://u:p@h/db").unwrap(),
            Scheme::Postgres
        );
    }

    #[test]
    fn unknown_scheme_names_it_but_not_the_rest_of_the_url() {
        let err = Scheme::parse("cockroach://user:hunter22@h/db").unwrap_err();
        let text = err.to_string();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        assert!(text.contains("cockroach"), "{text}");
        assert!(!text.contains("hunter22"), "{text}");
        assert!(Scheme::parse("just-a-host:6379").is_err());
        let err = Scheme::parse("admin:hunter22@redis.local/0?cb=http://x").unwrap_err();
        assert!(!err.to_string().contains("hunter22"), "{err}");
    }

    #[tokio::test]
    async fn connect_memory() {
        let lock = connect("memory://facade-test").await.unwrap();
        assert_eq!(lock.backend_name(), "memory");
        let lease = lock
            .try_acquire("k", &LockOptions::new())
            .await
            .unwrap()
            .unwrap();
        lease.release().await.unwrap();
    }
}
