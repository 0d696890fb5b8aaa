//! The backends lockbench knows (the seven, and Redis behind Sentinel and as a Cluster): their
//! URLs, how to start them, and whether they answer.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use dlock::{DistributedLock, ErrorKind, LockError, LockOptions};
use dlock_core::raw::url::{self as raw_url, Host, LockUrl};
use serde::Serialize;

/// A backend, as named on the command line and in the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Kind {
    Memory,
    Redis,
    /// Redis through Sentinel (`redis+sentinel://`).
    #[serde(rename = "redis-sentinel")]
    RedisSentinel,
    /// A Redis Cluster (`redis+cluster://`).
    #[serde(rename = "redis-cluster")]
    RedisCluster,
    Redlock,
    Zookeeper,
    Etcd,
    Mysql,
    Postgres,
}

impl Kind {
    pub(crate) const ALL: [Kind; 9] = [
        Kind::Memory,
        Kind::Redis,
        Kind::RedisSentinel,
        Kind::RedisCluster,
        Kind::Redlock,
        Kind::Zookeeper,
        Kind::Etcd,
        Kind::Mysql,
        Kind::Postgres,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Memory => "memory",
            Kind::Redis => "redis",
            Kind::RedisSentinel => "redis-sentinel",
            Kind::RedisCluster => "redis-cluster",
            Kind::Redlock => "redlock",
            Kind::Zookeeper => "zookeeper",
            Kind::Etcd => "etcd",
            Kind::Mysql => "mysql",
            Kind::Postgres => "postgres",
        }
    }

    /// The environment variable that overrides the default URL.
    pub(crate) fn env_var(self) -> Option<&'static str> {
        match self {
            Kind::Memory => None,
            Kind::Redis => Some("DLOCK_REDIS_URL"),
            Kind::RedisSentinel => Some("DLOCK_REDIS_SENTINEL_URL"),
            Kind::RedisCluster => Some("DLOCK_REDIS_CLUSTER_URL"),
            Kind::Redlock => Some("DLOCK_REDLOCK_URL"),
            Kind::Zookeeper => Some("DLOCK_ZK_URL"),
            Kind::Etcd => Some("DLOCK_ETCD_URL"),
            Kind::Mysql => Some("DLOCK_MYSQL_URL"),
            Kind::Postgres => Some("DLOCK_POSTGRES_URL"),
        }
    }

    /// The address `scripts/backends up` starts the server on.
    pub(crate) fn default_url(self) -> &'static str {
        match self {
            Kind::Memory => "memory://lockbench",
            Kind::Redis => "redis://127.0.0.1:6379",
            Kind::RedisSentinel => {
                "redis+sentinel://dlock:dlock-secret@127.0.0.1:26391,127.0.0.1:26392,127.0.0.1:26393/dlock"
            }
            Kind::RedisCluster => {
                "redis+cluster://dlock:dlock-secret@127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103"
            }
            Kind::Redlock => {
                "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005"
            }
            Kind::Zookeeper => "zk://127.0.0.1:2181",
            Kind::Etcd => "etcd://127.0.0.1:2379",
            Kind::Mysql => "mysql://dlock:dlock@127.0.0.1:3306/dlock",
            Kind::Postgres => "postgres://dlock:dlock@127.0.0.1:5432/dlock",
        }
    }

    /// The URL to use: the env var if set, else the default.
    pub(crate) fn url(self) -> String {
        self.env_var()
            .and_then(|v| std::env::var(v).ok())
            .filter(|v| !v.trim().is_empty())
            .unwrap_or_else(|| self.default_url().to_owned())
    }

    /// The command that starts this backend's server.
    pub(crate) fn start_command(self) -> Option<&'static str> {
        match self {
            Kind::Memory => None,
            Kind::Redis => Some("scripts/backends up redis"),
            Kind::RedisSentinel => Some("scripts/backends up redis-sentinel"),
            Kind::RedisCluster => Some("scripts/backends up redis-cluster"),
            Kind::Redlock => Some("scripts/backends up redlock"),
            Kind::Zookeeper => Some("scripts/backends up zookeeper"),
            Kind::Etcd => Some("scripts/backends up etcd"),
            Kind::Mysql => Some("scripts/backends up mariadb"),
            Kind::Postgres => Some("scripts/backends up postgres"),
        }
    }

    /// Whether lockbench itself was built with this backend's feature (its raw client).
    pub(crate) fn compiled(self) -> bool {
        match self {
            Kind::Memory => cfg!(feature = "memory"),
            Kind::Redis | Kind::RedisSentinel | Kind::RedisCluster => cfg!(feature = "redis"),
            Kind::Redlock => cfg!(feature = "redlock"),
            Kind::Zookeeper => cfg!(feature = "zookeeper"),
            Kind::Etcd => cfg!(feature = "etcd"),
            Kind::Mysql => cfg!(feature = "mysql"),
            Kind::Postgres => cfg!(feature = "postgres"),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Kind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.trim().to_ascii_lowercase().as_str() {
            "memory" | "mem" => Kind::Memory,
            "redis" => Kind::Redis,
            "redis-sentinel" | "sentinel" => Kind::RedisSentinel,
            "redis-cluster" | "cluster" => Kind::RedisCluster,
            "redlock" => Kind::Redlock,
            "zookeeper" | "zk" => Kind::Zookeeper,
            "etcd" => Kind::Etcd,
            "mysql" | "mariadb" => Kind::Mysql,
            "postgres" | "postgresql" | "pg" => Kind::Postgres,
            other => {
                return Err(format!(
                    "unknown backend {other:?} (expected all, or a list of: memory, redis, redis-sentinel, redis-cluster, redlock, zookeeper, etcd, mysql, postgres)"
                ));
            }
        })
    }
}

/// A lock URL split (by dlock-core's URL layer) into the parts the raw clients need.
#[derive(Debug, Clone)]
#[cfg_attr(
    not(any(
        feature = "redis",
        feature = "redlock",
        feature = "zookeeper",
        feature = "etcd",
        feature = "mysql",
        feature = "postgres"
    )),
    allow(dead_code)
)]
pub(crate) struct Parts {
    pub(crate) scheme: String,
    /// `host:port` each, the port defaulted per scheme.
    pub(crate) hosts: Vec<String>,
    url: LockUrl,
}

impl Parts {
    pub(crate) fn parse(url: &str) -> Result<Parts, String> {
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        let default_port = raw_url::default_port(&scheme.to_ascii_lowercase()).unwrap_or(0);
        let url = LockUrl::parse("lockbench", url, &[], default_port).map_err(|e| e.to_string())?;
        Ok(Parts {
            scheme: url.scheme().to_owned(),
            hosts: url.hosts().iter().map(ToString::to_string).collect(),
            url,
        })
    }

    /// The URL's path without its leading `/` (the master name of a Sentinel URL).
    #[allow(dead_code)] // unused when Redis is compiled out
    pub(crate) fn path(&self) -> &str {
        self.url.path().trim_start_matches('/')
    }

    /// `scheme://[userinfo@]host[path and query]` for one host (`host:port`).
    #[allow(dead_code)] // unused when every networked backend is compiled out
    pub(crate) fn single(&self, scheme: &str, host: &str, with_path: bool) -> String {
        let host = Host::parse("lockbench", host, 0).expect("a host of this URL");
        let whole = self.url.with_hosts(vec![host]).expose();
        let after = whole.split_once("://").map_or("", |(_, rest)| rest);
        // The user information cannot hold '/' or '?' (the URL layer refuses such URLs).
        let end = if with_path {
            after.len()
        } else {
            after.find(['/', '?']).unwrap_or(after.len())
        };
        format!("{scheme}://{}", &after[..end])
    }
}

/// A URL with any password replaced by `***`, for output.
pub(crate) fn redact(url: &str) -> String {
    raw_url::redact(url)
}

/// Why a backend is not measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SkipReason {
    /// Not in `--backends`.
    NotSelected,
    /// lockbench or dlock was built without the backend.
    CompiledOut,
    /// The server did not answer.
    Unreachable,
    /// The URL was rejected.
    InvalidConfig,
}

/// A backend that is not measured, and what to do about it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Skipped {
    pub(crate) backend: Kind,
    pub(crate) reason: SkipReason,
    pub(crate) detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) start_command: Option<&'static str>,
}

/// Connect one client through the facade, bounded by `timeout`.
pub(crate) async fn connect(
    url: &str,
    timeout: Duration,
) -> Result<Arc<dyn DistributedLock>, String> {
    match tokio::time::timeout(timeout, dlock::connect(url)).await {
        Ok(Ok(lock)) => Ok(lock),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err(format!("connect did not finish within {timeout:?}")),
    }
}

/// Check that `kind` is compiled in and its server answers a lock round trip.
pub(crate) async fn probe(
    kind: Kind,
    url: &str,
    key: &str,
    timeout: Duration,
) -> Result<(), Skipped> {
    let skipped = |reason, detail: String| Skipped {
        backend: kind,
        reason,
        detail,
        start_command: if reason == SkipReason::Unreachable {
            kind.start_command()
        } else {
            None
        },
    };
    if !kind.compiled() {
        return Err(skipped(
            SkipReason::CompiledOut,
            format!("lockbench was built without its `{}` feature", kind.name()),
        ));
    }
    let lock = match tokio::time::timeout(timeout, dlock::connect(url)).await {
        Ok(Ok(lock)) => lock,
        Ok(Err(e)) => return Err(classify(kind, &e, &skipped)),
        Err(_) => {
            return Err(skipped(
                SkipReason::Unreachable,
                format!("connect did not finish within {timeout:?}"),
            ));
        }
    };
    let round_trip = async {
        match lock.try_acquire(key, &LockOptions::new()).await {
            Ok(Some(lease)) => lease
                .release()
                .await
                .map_err(|e| classify(kind, &e, &skipped)),
            Ok(None) => Err(skipped(
                SkipReason::Unreachable,
                format!("the probe key {key:?} is held by someone else"),
            )),
            Err(e) => Err(classify(kind, &e, &skipped)),
        }
    };
    match tokio::time::timeout(timeout, round_trip).await {
        Ok(result) => result,
        Err(_) => Err(skipped(
            SkipReason::Unreachable,
            format!("a try_acquire + release did not finish within {timeout:?}"),
        )),
    }
}

/// Sort a facade error into a skip reason.
fn classify(kind: Kind, e: &LockError, skipped: &dyn Fn(SkipReason, String) -> Skipped) -> Skipped {
    let text = e.to_string();
    let in_facade = dlock::Scheme::parse(kind.default_url()).is_ok_and(|s| s.is_enabled());
    match e.kind() {
        // `dlock::connect` names the missing feature when the backend is not compiled in.
        ErrorKind::InvalidConfig if !in_facade => skipped(SkipReason::CompiledOut, text),
        ErrorKind::InvalidConfig => skipped(SkipReason::InvalidConfig, text),
        _ => skipped(SkipReason::Unreachable, text),
    }
}

/// The backends the tests must reach: every one compiled in, or those named in
/// `LOCKBENCH_SMOKE_BACKENDS`.
#[cfg(test)]
pub(crate) fn test_backends() -> Vec<Kind> {
    let only: Option<Vec<Kind>> = std::env::var("LOCKBENCH_SMOKE_BACKENDS")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split(',').filter_map(|k| k.parse().ok()).collect());
    Kind::ALL
        .into_iter()
        .filter(|k| k.compiled())
        .filter(|k| only.as_ref().is_none_or(|o| o.contains(k)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_split_multi_host_urls() {
        let p = Parts::parse("redlock://:pw@a:1,b:2,c:3/x?timeout=5").unwrap();
        assert_eq!(p.scheme, "redlock");
        assert_eq!(p.hosts, ["a:1", "b:2", "c:3"]);
        assert_eq!(p.single("redis", "b:2", false), "redis://:pw@b:2");
        let m = Parts::parse("mysql://u:p@h:3306/db").unwrap();
        assert_eq!(m.single("mysql", "h:3306", true), "mysql://u:p@h:3306/db");
        assert!(!format!("{m:?}").contains(":p@"));
        assert!(Parts::parse("nonsense").is_err());
    }

    #[test]
    fn redact_hides_passwords() {
        assert_eq!(
            redact("mysql://dlock:secret@127.0.0.1:3306/dlock"),
            "mysql://dlock:***@127.0.0.1:3306/dlock"
        );
        assert_eq!(redact("redis://127.0.0.1:6379"), "redis://127.0.0.1:6379");
        assert!(!redact("redis://:pw@h:1/0").contains("pw"));
    }

    #[test]
    fn names_round_trip() {
        for kind in Kind::ALL {
            assert_eq!(kind.name().parse::<Kind>().unwrap(), kind);
        }
        assert_eq!("mariadb".parse::<Kind>().unwrap(), Kind::Mysql);
        assert_eq!("PostgreSQL".parse::<Kind>().unwrap(), Kind::Postgres);
        assert!("cockroach".parse::<Kind>().is_err());
    }
}
