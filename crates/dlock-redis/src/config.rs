//! [`RedisConfig`]: where the server is, how to talk to it, and how keys are named.
//!
//! The URL is taken apart by dlock-core's one URL layer ([`LockUrl`]);
//! [`RedisConfig::for_host`] turns it into the settings of one server (`dlock-redlock` calls
//! it once per node) and [`RedisConfig::with_option`] applies each query option through one
//! [`ConfigKey`] spelling. `redis+sentinel://` and `redis+cluster://` URLs give a
//! [`Topology`] beside those settings: the sentinels and the master's name, or the cluster's
//! seed nodes.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use dlock_core::raw::parse_duration;
use dlock_core::raw::url::{Host, LockUrl};
use dlock_core::{LockError, Result, Secret};

use crate::NAME;

mod topology;
pub use topology::{SentinelConfig, Topology};

/// The range every timeout option accepts.
const TIMEOUTS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);

/// How to reach one Redis server and how lock keys are named on it.
///
/// Built from a URL with [`RedisConfig::from_url`], or from [`RedisConfig::new`] and
/// [`with_option`](RedisConfig::with_option). `Debug` never shows the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// Server host name or IP address.
    pub host: String,
    /// Server port. Default 6379.
    pub port: u16,
    /// Talk TLS (`rediss://`). Default off.
    pub tls: bool,
    /// ACL user name (`AUTH user pass`), if any.
    pub username: Option<String>,
    /// Password, if any. Never shown by `Debug` or in errors.
    pub password: Option<Secret>,
    /// Database number (`SELECT`). Default 0.
    pub db: i64,
    /// Prepended to every lock key. Default `dlock:`; may be empty, so that a lock shares its
    /// key with another client library's lock of the same name.
    pub prefix: String,
    /// Bound on opening a connection (TCP, TLS, `AUTH`, `SELECT`, loading the scripts).
    /// Default 5 s.
    pub connect_timeout: Duration,
    /// Bound on one request's answer; a black-holed server fails the call after it.
    /// Default 2 s.
    pub response_timeout: Duration,
    /// PEM file of the CA certificate(s) to trust instead of the system's roots (`ca`).
    /// TLS only. Read when the client is built, before any network I/O.
    pub ca: Option<PathBuf>,
    /// PEM file of the client certificate chain (`cert`), for servers that check client
    /// certificates. TLS only, and only with [`key`](Self::key).
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (`key`). TLS only, and only with
    /// [`cert`](Self::cert). Its contents never appear in an error or in `Debug`.
    pub key: Option<PathBuf>,
    /// One server (`redis://`, the default), a master found through Sentinel
    /// (`redis+sentinel://`) or a Redis Cluster (`redis+cluster://`). With Sentinel or a
    /// cluster, [`host`](Self::host) and [`port`](Self::port) are the first sentinel or seed
    /// node's; the credentials, the timeouts and the TLS settings are the data nodes'.
    pub topology: Topology,
    /// Addresses to dial in place of those the servers announce (`CLUSTER SLOTS`, the
    /// master the sentinels name): for a NAT, a port forward or a proxy between the client
    /// and the servers. Each pair is (announced, dialled). Empty by default; not a URL
    /// option. A TLS certificate is checked against the dialled host.
    pub address_map: Vec<(Host, Host)>,
}

impl RedisConfig {
    /// The default port.
    pub const DEFAULT_PORT: u16 = 6379;
    /// The default port of a sentinel.
    pub const DEFAULT_SENTINEL_PORT: u16 = 26379;
    /// The default key prefix.
    pub const DEFAULT_PREFIX: &'static str = "dlock:";
    /// The default connect timeout.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default response timeout.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

    /// A server at `host:port` with every other setting at its default.
    pub fn new(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
            tls: false,
            username: None,
            password: None,
            db: 0,
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            ca: None,
            cert: None,
            key: None,
            topology: Topology::Server,
            address_map: Vec::new(),
        }
    }

    /// Parse `redis://[user:pass@]host[:port][/db][?option=value&…]` (or `rediss://` for
    /// TLS), `redis+sentinel://[user:pass@]host:port[,host:port…]/MASTER[?…]` or
    /// `redis+cluster://[user:pass@]host:port[,host:port…][?…]` (each also with `rediss+`).
    /// No network I/O.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is wrong: the scheme, the port, the
    /// database or master name, an unknown option or a bad option value. Never the
    /// password.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = LockUrl::parse(NAME, url, crate::SCHEMES, topology::default_port(url))?;
        let Some(first) = url.hosts().first() else {
            return Err(LockError::invalid_config(
                NAME,
                "the URL names no server (expected redis://host:port)",
            ));
        };
        match Topology::of_url(&url)? {
            Some(topology) => Self::with_url(NAME, &url, first, 0, topology),
            None if url.hosts().len() == 1 => Self::for_host(NAME, &url, first),
            None => Err(LockError::invalid_config(
                NAME,
                format!(
                    "a redis:// URL names one server, this one names {} (use redis+cluster:// \
                     for a cluster, redis+sentinel:// for sentinels, redlock:// for independent \
                     servers)",
                    url.hosts().len()
                ),
            )),
        }
    }

    /// The settings a parsed `redis://` or `redlock://` URL gives the server `host`: TLS
    /// from the scheme (`rediss`, `redlocks`), credentials, the database from the path, and
    /// every query option. Errors name `backend`.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a path that is not a database number, an unknown
    /// option, a bad value, or options that do not fit together (see
    /// [`validate`](Self::validate)).
    pub fn for_host(backend: &'static str, url: &LockUrl, host: &Host) -> Result<Self> {
        let path = url.path().strip_prefix('/').unwrap_or(url.path());
        let db = match path.trim_end_matches('/') {
            "" => 0,
            db => db.parse::<i64>().ok().filter(|d| *d >= 0).ok_or_else(|| {
                LockError::invalid_config(
                    backend,
                    format!("the path {db:?} is not a database number (expected /0, /1, …)"),
                )
            })?,
        };
        Self::with_url(backend, url, host, db, Topology::Server)
    }

    /// The settings of `url` for `host` with database `db` and `topology`: TLS from the
    /// scheme, the credentials and every query option, checked.
    fn with_url(
        backend: &'static str,
        url: &LockUrl,
        host: &Host,
        db: i64,
        topology: Topology,
    ) -> Result<Self> {
        let config = Self {
            tls: matches!(
                url.scheme(),
                "rediss" | "redlocks" | "rediss+sentinel" | "rediss+cluster"
            ),
            username: url.username().map(str::to_owned),
            password: url.password().cloned(),
            db,
            topology,
            ..Self::new(host.name.clone(), host.port)
        };
        url.options()
            .iter()
            .try_fold(config, |config, (key, value)| {
                config.with_option(key, value)
            })
            .and_then(|config| config.validate().map(|()| config))
            .map_err(|e| named(backend, e))
    }

    /// Set one option by its URL query name: `prefix`, `connect_timeout` or
    /// `response_timeout` (durations as `250ms`, `5s`, `1.5s` or `2m`), `ca`, `cert` or
    /// `key` (paths of PEM files; TLS only, checked by [`validate`](Self::validate)),
    /// `sentinel_user` and `sentinel_password` (the sentinels' credentials; Sentinel only).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for an unknown key or a bad value, naming it.
    pub fn with_option(mut self, key: &str, value: &str) -> Result<Self> {
        match key.parse::<ConfigKey>()? {
            ConfigKey::Prefix => self.prefix = value.to_owned(),
            ConfigKey::ConnectTimeout => {
                self.connect_timeout = parse_duration(NAME, key, value, TIMEOUTS)?
            }
            ConfigKey::ResponseTimeout => {
                self.response_timeout = parse_duration(NAME, key, value, TIMEOUTS)?
            }
            ConfigKey::Ca => self.ca = Some(path(key, value)?),
            ConfigKey::Cert => self.cert = Some(path(key, value)?),
            ConfigKey::Key => self.key = Some(path(key, value)?),
            ConfigKey::SentinelUser => {
                self.topology.sentinel_for(key)?.username =
                    Some(value.to_owned()).filter(|u| !u.is_empty());
            }
            ConfigKey::SentinelPassword => {
                self.topology.sentinel_for(key)?.password = Some(Secret::new(value))
            }
        }
        Ok(self)
    }

    /// Check that the options fit together: `ca`, `cert` and `key` only with TLS
    /// (`rediss://`, `redlocks://`, `rediss+…://`), and `cert` and `key` together; for a
    /// cluster, database 0. Parsing a URL and
    /// building a client call it, so a config built field by field is checked too. No I/O:
    /// the files are read when the client is built.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the option.
    pub fn validate(&self) -> Result<()> {
        let files = [("ca", &self.ca), ("cert", &self.cert), ("key", &self.key)];
        if !self.tls
            && let Some((option, _)) = files.iter().find(|(_, file)| file.is_some())
        {
            return Err(LockError::invalid_config(
                NAME,
                format!("option {option} is for TLS: use the rediss:// (or redlocks://) scheme"),
            ));
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err(LockError::invalid_config(
                NAME,
                "cert and key go together: give both or neither",
            ));
        }
        self.topology.validate(self.db)
    }

    /// Where to dial the server that announces itself as `host:port` (see
    /// [`address_map`](Self::address_map)).
    pub fn dial(&self, host: &str, port: u16) -> (String, u16) {
        self.address_map
            .iter()
            .find(|(from, _)| from.name == host && from.port == port)
            .map_or_else(
                || (host.to_owned(), port),
                |(_, to)| (to.name.clone(), to.port),
            )
    }

    /// The same settings for another server (used by `dlock-redlock` for its nodes).
    pub fn at(&self, host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
            ..self.clone()
        }
    }

    /// `host:port`, as errors and logs show the server (never with credentials).
    pub fn addr(&self) -> String {
        Host::new(self.host.clone(), self.port).to_string()
    }
}

/// The options a URL query may set, with their one spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum ConfigKey {
    /// `prefix`: [`RedisConfig::prefix`].
    Prefix,
    /// `connect_timeout`: [`RedisConfig::connect_timeout`], e.g. `5s`, `500ms`.
    ConnectTimeout,
    /// `response_timeout`: [`RedisConfig::response_timeout`], same format.
    ResponseTimeout,
    /// `ca`: [`RedisConfig::ca`], a path.
    Ca,
    /// `cert`: [`RedisConfig::cert`], a path.
    Cert,
    /// `key`: [`RedisConfig::key`], a path.
    Key,
    /// `sentinel_user`: [`SentinelConfig::username`].
    SentinelUser,
    /// `sentinel_password`: [`SentinelConfig::password`].
    SentinelPassword,
}

impl FromStr for ConfigKey {
    type Err = LockError;

    fn from_str(key: &str) -> Result<Self> {
        match key {
            "prefix" => Ok(Self::Prefix),
            "connect_timeout" => Ok(Self::ConnectTimeout),
            "response_timeout" => Ok(Self::ResponseTimeout),
            "ca" => Ok(Self::Ca),
            "cert" => Ok(Self::Cert),
            "key" => Ok(Self::Key),
            "sentinel_user" => Ok(Self::SentinelUser),
            "sentinel_password" => Ok(Self::SentinelPassword),
            other => Err(LockError::invalid_config(
                NAME,
                format!(
                    "unknown option {other:?} (known: prefix, connect_timeout, \
                     response_timeout, ca, cert, key, sentinel_user, sentinel_password)"
                ),
            )),
        }
    }
}

/// The value of a file option: a path, never empty.
fn path(option: &str, value: &str) -> Result<PathBuf> {
    if value.is_empty() {
        return Err(LockError::invalid_config(
            NAME,
            format!("option {option} needs a path (of a PEM file)"),
        ));
    }
    Ok(PathBuf::from(value))
}

/// Option errors come from [`RedisConfig::with_option`] and [`RedisConfig::validate`]:
/// name the backend the URL is for.
pub(crate) fn named(backend: &'static str, e: LockError) -> LockError {
    match e {
        LockError::InvalidConfig {
            message, source, ..
        } => LockError::InvalidConfig {
            backend,
            message,
            source,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests;
