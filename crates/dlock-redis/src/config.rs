//! [`RedisConfig`]: where the server is, how to talk to it, and how keys are named.
//!
//! The URL is taken apart by dlock-core's one URL layer ([`LockUrl`]);
//! [`RedisConfig::for_host`] turns it into the settings of one server (`dlock-redlock` calls
//! it once per node) and [`RedisConfig::with_option`] applies each query option through one
//! [`ConfigKey`] spelling.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use dlock_core::raw::parse_duration;
use dlock_core::raw::url::{Host, LockUrl};
use dlock_core::{LockError, Result, Secret};

use crate::NAME;

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
}

impl RedisConfig {
    /// The default port.
    pub const DEFAULT_PORT: u16 = 6379;
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
        }
    }

    /// Parse `redis://[user:pass@]host[:port][/db][?option=value&…]` (or `rediss://` for
    /// TLS). No network I/O.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is wrong: the scheme, the port, the
    /// database, an unknown option or a bad option value.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = LockUrl::parse(NAME, url, crate::SCHEMES, Self::DEFAULT_PORT)?;
        match url.hosts() {
            [host] => Self::for_host(NAME, &url, host),
            [] => Err(LockError::invalid_config(
                NAME,
                "the URL names no server (expected redis://host:port)",
            )),
            hosts => Err(LockError::invalid_config(
                NAME,
                format!(
                    "a redis:// URL names one server, this one names {} (use redlock:// for several)",
                    hosts.len()
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
        let config = Self {
            tls: matches!(url.scheme(), "rediss" | "redlocks"),
            username: url.username().map(str::to_owned),
            password: url.password().cloned(),
            db,
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
    /// `key` (paths of PEM files; TLS only, checked by [`validate`](Self::validate)).
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
        }
        Ok(self)
    }

    /// Check that the options fit together: `ca`, `cert` and `key` only with TLS
    /// (`rediss://`, `redlocks://`), and `cert` and `key` together. Parsing a URL and
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
        Ok(())
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
            other => Err(LockError::invalid_config(
                NAME,
                format!(
                    "unknown option {other:?} (known: prefix, connect_timeout, \
                     response_timeout, ca, cert, key)"
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
mod tests {
    use super::*;
    use dlock_core::ErrorKind;

    #[test]
    fn good_urls() {
        let base = RedisConfig::new("127.0.0.1", 6379);
        let cases: Vec<(&str, RedisConfig)> = vec![
            ("redis://127.0.0.1:6379", base.clone()),
            ("redis://127.0.0.1", base.clone()),
            ("redis://127.0.0.1:6379/", base.clone()),
            (
                "rediss://cache.example:6380/3",
                RedisConfig {
                    tls: true,
                    db: 3,
                    ..RedisConfig::new("cache.example", 6380)
                },
            ),
            (
                "REDIS://u:p%40ss@127.0.0.1:6379",
                RedisConfig {
                    username: Some("u".into()),
                    password: Some("p@ss".into()),
                    ..base.clone()
                },
            ),
            (
                "redis://:only-pass@127.0.0.1:6379",
                RedisConfig {
                    password: Some("only-pass".into()),
                    ..base.clone()
                },
            ),
            (
                "redis://127.0.0.1:6379?prefix=",
                RedisConfig {
                    prefix: String::new(),
                    ..base.clone()
                },
            ),
            (
                "redis://127.0.0.1:6379/1?prefix=app%3Alocks%3A&connect_timeout=250ms&response_timeout=3s",
                RedisConfig {
                    db: 1,
                    prefix: "app:locks:".into(),
                    connect_timeout: Duration::from_millis(250),
                    response_timeout: Duration::from_secs(3),
                    ..base.clone()
                },
            ),
            (
                "redis://127.0.0.1:6379?response_timeout=1500ms",
                RedisConfig {
                    response_timeout: Duration::from_millis(1500),
                    ..base.clone()
                },
            ),
            ("redis://[::1]:7000", RedisConfig::new("::1", 7000)),
            (
                "rediss://127.0.0.1:6380?ca=/etc/redis/ca.pem",
                RedisConfig {
                    tls: true,
                    ca: Some("/etc/redis/ca.pem".into()),
                    ..RedisConfig::new("127.0.0.1", 6380)
                },
            ),
            (
                "rediss://127.0.0.1:6380?cert=client.pem&key=%2Fsecrets%2Fclient.key&ca=ca.pem",
                RedisConfig {
                    tls: true,
                    ca: Some("ca.pem".into()),
                    cert: Some("client.pem".into()),
                    key: Some("/secrets/client.key".into()),
                    ..RedisConfig::new("127.0.0.1", 6380)
                },
            ),
        ];
        for (url, want) in cases {
            let got = RedisConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(got, want, "{url}");
        }
        assert_eq!(RedisConfig::new("::1", 7000).addr(), "[::1]:7000");
    }

    #[test]
    fn bad_urls_are_invalid_config_without_the_password() {
        let cases = [
            ("", "not a URL"),
            ("127.0.0.1:6379", "not a URL"),
            ("http://127.0.0.1:6379", "scheme"),
            ("redlock://a:1,b:2,c:3", "scheme"),
            ("redis://", "no server"),
            ("redis://127.0.0.1:notaport", "port"),
            ("redis://127.0.0.1:0", "port"),
            ("redis://127.0.0.1:70000", "port"),
            ("redis://a:1,b:2", "one server"),
            ("redis://127.0.0.1:6379/x", "database"),
            ("redis://127.0.0.1:6379/-1", "database"),
            ("redis://127.0.0.1:6379/0/1", "database"),
            (
                "redis://127.0.0.1:6379?nonsense=1",
                "unknown option \"nonsense\"",
            ),
            (
                "redis://127.0.0.1:6379?connect_timeout=forever",
                "connect_timeout",
            ),
            (
                "redis://127.0.0.1:6379?response_timeout=0ms",
                "out of range",
            ),
            (
                "redis://127.0.0.1:6379?response_timeout=1500",
                "not a duration",
            ),
            ("redis://127.0.0.1:6379#frag", "fragment"),
            ("redis://ho st:6379", "host name"),
            ("redis://u:sekrit-pw@bad host:1", "host name"),
            ("redis://u:sekrit-pw@127.0.0.1:6379?bogus=1", "bogus"),
            ("redis://127.0.0.1:6379?ca=/ca.pem", "option ca is for TLS"),
            (
                "redis://127.0.0.1:6379?cert=/c.pem&key=/k.pem",
                "option cert is for TLS",
            ),
            ("redis://127.0.0.1:6379?key=/k.pem", "option key is for TLS"),
            (
                "rediss://127.0.0.1:6379?cert=/c.pem",
                "cert and key go together",
            ),
            (
                "rediss://127.0.0.1:6379?key=/k.pem",
                "cert and key go together",
            ),
            ("rediss://127.0.0.1:6379?ca=", "option ca needs a path"),
            (
                "rediss://127.0.0.1:6379?cert=&key=/k.pem",
                "option cert needs a path",
            ),
        ];
        for (url, needle) in cases {
            let err = RedisConfig::from_url(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
            let text = format!("{err} {err:?}");
            assert!(text.contains(needle), "{url}: {text}");
            assert!(!text.contains("sekrit"), "{url}: {text}");
        }
    }

    #[test]
    fn a_config_built_by_hand_is_validated() {
        let plain = RedisConfig {
            ca: Some("/ca.pem".into()),
            ..RedisConfig::new("127.0.0.1", 6379)
        };
        let err = plain.validate().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        assert!(err.to_string().contains("option ca is for TLS"), "{err}");
        let half = RedisConfig {
            tls: true,
            key: Some("/k.pem".into()),
            ..RedisConfig::new("127.0.0.1", 6379)
        };
        let err = half.validate().unwrap_err();
        assert!(
            err.to_string().contains("cert and key go together"),
            "{err}"
        );
        // Node::new checks too, naming the backend it was given, before any I/O.
        let err = crate::server::Node::new(&half, "redlock").unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        assert!(err.to_string().contains("redlock"), "{err}");
    }

    #[test]
    fn debug_hides_the_password() {
        let config = RedisConfig::from_url("redis://u:sekrit-pw@127.0.0.1:6379").unwrap();
        let text = format!("{config:?}");
        assert!(!text.contains("sekrit"), "{text}");
        assert!(text.contains("redacted"), "{text}");
    }

    #[test]
    fn the_shared_url_table_passes() {
        dlock_conformance::urls::check_parser(
            |password, host| format!("redis://app:{password}@{host}:6379/0?prefix=p"),
            |url| RedisConfig::from_url(url).map(|c| format!("{c:?}")),
        );
    }
}
