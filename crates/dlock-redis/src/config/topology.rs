//! [`Topology`]: one server, a master found through Sentinel, or a Redis Cluster. The
//! `redis+sentinel://` and `redis+cluster://` schemes choose it; the URL's hosts are then
//! the sentinels or the seed nodes, and its path the master's name (Sentinel) or nothing (a
//! cluster has one database).

use dlock_core::raw::url::{Host, LockUrl};
use dlock_core::{LockError, Result, Secret};

use super::RedisConfig;
use crate::NAME;

/// Which Redis deployment a [`RedisConfig`] reaches.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Topology {
    /// One server at [`RedisConfig::host`] and [`RedisConfig::port`].
    #[default]
    Server,
    /// The master of a group that Sentinel watches, asked of the sentinels on every
    /// (re)connect.
    Sentinel(SentinelConfig),
    /// A Redis Cluster, discovered from its seed nodes.
    Cluster {
        /// The nodes asked for the cluster's layout, in order (any reachable one will do).
        seeds: Vec<Host>,
    },
}

/// Where the sentinels are and which master to ask them for. `Debug` never shows the
/// password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelConfig {
    /// The master's name, as the sentinels know it (the URL's path).
    pub master: String,
    /// The sentinels, asked in order until one names the master.
    pub sentinels: Vec<Host>,
    /// ACL user for the sentinels (`sentinel_user`), if they need one.
    pub username: Option<String>,
    /// Password for the sentinels (`sentinel_password`), if they need one.
    pub password: Option<Secret>,
}

/// The port of a host the URL names without one: a sentinel's for `redis+sentinel://`
/// (and `rediss+sentinel://`), else a data node's.
pub(super) fn default_port(url: &str) -> u16 {
    let scheme = dlock_core::raw::url::scheme(url).unwrap_or_default();
    match scheme.as_str() {
        "redis+sentinel" | "rediss+sentinel" => RedisConfig::DEFAULT_SENTINEL_PORT,
        _ => RedisConfig::DEFAULT_PORT,
    }
}

impl Topology {
    /// The topology a parsed URL's scheme asks for, over the URL's hosts: `None` for the
    /// one-server schemes (`redis://`, `rediss://`), whose path is a database number.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a Sentinel URL without a master name and for a
    /// cluster URL with a path.
    pub(super) fn of_url(url: &LockUrl) -> Result<Option<Self>> {
        let hosts = url.hosts().to_vec();
        match url.scheme() {
            "redis+sentinel" | "rediss+sentinel" => {
                let path = url.path().strip_prefix('/').unwrap_or(url.path());
                let master = path.strip_suffix('/').unwrap_or(path);
                if master.is_empty() || master.contains('/') {
                    return Err(LockError::invalid_config(
                        NAME,
                        "a redis+sentinel:// URL names the master after the sentinels \
                         (redis+sentinel://host:26379,host:26379/MASTER)",
                    ));
                }
                Ok(Some(Self::Sentinel(SentinelConfig {
                    master: master.to_owned(),
                    sentinels: hosts,
                    username: None,
                    password: None,
                })))
            }
            "redis+cluster" | "rediss+cluster" => {
                if !matches!(url.path(), "" | "/") {
                    return Err(LockError::invalid_config(
                        NAME,
                        "a redis+cluster:// URL has no path: a cluster has one database, 0",
                    ));
                }
                Ok(Some(Self::Cluster { seeds: hosts }))
            }
            _ => Ok(None),
        }
    }

    /// The topology's part of [`RedisConfig::validate`]: Sentinel needs sentinels and a
    /// master's name, a cluster seed nodes and database `db` 0.
    pub(super) fn validate(&self, db: i64) -> Result<()> {
        match self {
            Topology::Server => {}
            Topology::Sentinel(sentinel) => {
                if sentinel.master.is_empty() || sentinel.sentinels.is_empty() {
                    return Err(LockError::invalid_config(
                        NAME,
                        "Sentinel needs at least one sentinel and the master's name",
                    ));
                }
            }
            Topology::Cluster { seeds } => {
                if seeds.is_empty() {
                    return Err(LockError::invalid_config(
                        NAME,
                        "a cluster needs at least one seed node",
                    ));
                }
                if db != 0 {
                    return Err(LockError::invalid_config(
                        NAME,
                        "a cluster has one database, 0",
                    ));
                }
            }
        }
        Ok(())
    }

    /// The Sentinel settings, for option `key`, which only a Sentinel URL has.
    pub(super) fn sentinel_for(&mut self, key: &str) -> Result<&mut SentinelConfig> {
        match self {
            Self::Sentinel(sentinel) => Ok(sentinel),
            _ => Err(LockError::invalid_config(
                NAME,
                format!("option {key} is for redis+sentinel:// URLs"),
            )),
        }
    }
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;
