//! [`RedisConfig`]: where the server is, how to talk to it, and how keys are named.
//!
//! The URL grammar is shared with `dlock-redlock`, which names several servers in one URL:
//! [`split_url`] takes a URL apart (scheme, credentials, one or more `host:port`, database,
//! query) and [`RedisConfig::with_option`] applies each query option through one
//! [`ConfigKey`] spelling.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use dlock_core::raw::parse_duration;
use dlock_core::{LockError, Result};
use percent_encoding::percent_decode_str;

use crate::NAME;

/// The range every timeout option accepts.
const TIMEOUTS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);

/// How to reach one Redis server and how lock keys are named on it.
///
/// Built from a URL with [`RedisConfig::from_url`], or from [`RedisConfig::new`] and
/// [`with_option`](RedisConfig::with_option). `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
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
    pub password: Option<String>,
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
        }
    }

    /// Parse `redis://[user:pass@]host[:port][/db][?option=value&…]` (or `rediss://` for
    /// TLS). No network I/O.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is wrong: the scheme, the port, the
    /// database, an unknown option or a bad option value.
    pub fn from_url(url: &str) -> Result<Self> {
        let parts = split_url(NAME, url, crate::SCHEMES)?;
        let [(host, port)] = <[_; 1]>::try_from(parts.hosts).map_err(|hosts| {
            LockError::invalid_config(
                NAME,
                format!(
                    "a redis:// URL names one server, this one names {} (use redlock:// for several)",
                    hosts.len()
                ),
            )
        })?;
        parts.options.iter().try_fold(
            Self {
                tls: parts.tls,
                username: parts.username,
                password: parts.password,
                db: parts.db,
                ..Self::new(host, port)
            },
            |config, (key, value)| config.with_option(key, value),
        )
    }

    /// Set one option by its URL query name: `prefix`, `connect_timeout` or
    /// `response_timeout` (durations as `5s`, `500ms`, or bare milliseconds `1500`).
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
        }
        Ok(self)
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
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .field("prefix", &self.prefix)
            .field("connect_timeout", &self.connect_timeout)
            .field("response_timeout", &self.response_timeout)
            .finish()
    }
}

/// The options a URL query may set, with their one spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum ConfigKey {
    /// `prefix`: [`RedisConfig::prefix`].
    Prefix,
    /// `connect_timeout`: [`RedisConfig::connect_timeout`], e.g. `5s`, `500ms`, `1500`
    /// (bare numbers are milliseconds).
    ConnectTimeout,
    /// `response_timeout`: [`RedisConfig::response_timeout`], same format.
    ResponseTimeout,
}

impl FromStr for ConfigKey {
    type Err = LockError;

    fn from_str(key: &str) -> Result<Self> {
        match key {
            "prefix" => Ok(Self::Prefix),
            "connect_timeout" => Ok(Self::ConnectTimeout),
            "response_timeout" => Ok(Self::ResponseTimeout),
            other => Err(LockError::invalid_config(
                NAME,
                format!(
                    "unknown option {other:?} (known: prefix, connect_timeout, response_timeout)"
                ),
            )),
        }
    }
}

/// A Redis-style URL taken apart, before its options are applied.
#[derive(Clone, PartialEq, Eq)]
pub struct UrlParts {
    /// Whether the scheme was the TLS one.
    pub tls: bool,
    /// Every `host:port` of the authority, in order (the port defaults to 6379).
    pub hosts: Vec<(String, u16)>,
    /// Percent-decoded user name.
    pub username: Option<String>,
    /// Percent-decoded password.
    pub password: Option<String>,
    /// Database number from the path, default 0.
    pub db: i64,
    /// Percent-decoded query options, in order.
    pub options: Vec<(String, String)>,
}

impl fmt::Debug for UrlParts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UrlParts")
            .field("tls", &self.tls)
            .field("hosts", &self.hosts)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("db", &self.db)
            .field("options", &self.options)
            .finish()
    }
}

/// Take apart `scheme://[user[:pass]@]host[:port][,host[:port]…][/db][?k=v&…]`.
///
/// `schemes` is `[plain, tls]`. Errors name `backend` and never contain the password.
pub fn split_url(backend: &'static str, url: &str, schemes: &[&str]) -> Result<UrlParts> {
    let bad = |message: String| LockError::invalid_config(backend, message);
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| bad(format!("not a URL (expected {}://host:port)", schemes[0])))?;
    let tls = match schemes.iter().position(|s| s.eq_ignore_ascii_case(scheme)) {
        Some(i) => i == 1,
        None => {
            return Err(bad(format!(
                "scheme {scheme:?} is not {}",
                schemes
                    .iter()
                    .map(|s| format!("{s}://"))
                    .collect::<Vec<_>>()
                    .join(" or ")
            )));
        }
    };
    if rest.contains('#') {
        return Err(bad("a URL fragment (#…) is not allowed".into()));
    }
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let decode = |what: &str, s: &str| -> Result<String> {
        percent_decode_str(s)
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|_| bad(format!("the {what} is not valid percent-encoded UTF-8")))
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(info) => {
            let (user, pass) = match info.split_once(':') {
                Some((u, p)) => (u, Some(p)),
                None => (info, None),
            };
            let user = (!user.is_empty())
                .then(|| decode("user name", user))
                .transpose()?;
            let pass = pass.map(|p| decode("password", p)).transpose()?;
            (user, pass)
        }
    };
    if hostlist.is_empty() {
        return Err(bad("the URL names no server (expected host:port)".into()));
    }
    let hosts = hostlist
        .split(',')
        .map(|h| parse_host(backend, h))
        .collect::<Result<Vec<_>>>()?;
    let db = match path.trim_end_matches('/') {
        "" => 0,
        db => db.parse::<i64>().ok().filter(|d| *d >= 0).ok_or_else(|| {
            bad(format!(
                "the path {db:?} is not a database number (expected /0, /1, …)"
            ))
        })?,
    };
    let mut options = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        options.push((decode("option name", k)?, decode("option value", v)?));
    }
    Ok(UrlParts {
        tls,
        hosts,
        username,
        password,
        db,
        options,
    })
}

fn parse_host(backend: &'static str, hostport: &str) -> Result<(String, u16)> {
    let bad = |message: String| LockError::invalid_config(backend, message);
    let bracketed = hostport.starts_with('[');
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        // [IPv6]:port
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| bad(format!("unclosed '[' in host {hostport:?}")))?;
        match after {
            "" => (host, None),
            p => (
                host,
                Some(p.strip_prefix(':').ok_or_else(|| {
                    bad(format!(
                        "expected :port after the IPv6 address in {hostport:?}"
                    ))
                })?),
            ),
        }
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let allowed =
        |c: char| c.is_ascii_alphanumeric() || ".-_".contains(c) || (bracketed && c == ':');
    if host.is_empty() || !host.chars().all(allowed) {
        return Err(bad(format!("{hostport:?} is not a valid host[:port]")));
    }
    let port = match port {
        None => RedisConfig::DEFAULT_PORT,
        Some(p) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
            bad(format!(
                "port {p:?} of {host:?} is not a number from 1 to 65535"
            ))
        })?,
    };
    Ok((host.to_owned(), port))
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
            ("redis://ho st:6379", "valid host"),
            ("redis://u:sekrit-pw@bad host:1", "valid host"),
            ("redis://u:sekrit-pw@127.0.0.1:6379?bogus=1", "bogus"),
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
    fn debug_hides_the_password() {
        let config = RedisConfig::from_url("redis://u:sekrit-pw@127.0.0.1:6379").unwrap();
        let text = format!("{config:?}");
        assert!(!text.contains("sekrit"), "{text}");
        assert!(text.contains("redacted"), "{text}");
        let parts = split_url("redis", "redis://u:sekrit-pw@h:1", crate::SCHEMES).unwrap();
        assert!(!format!("{parts:?}").contains("sekrit"));
    }

    #[test]
    fn several_hosts_split_in_order() {
        let parts = split_url(
            "redlock",
            "redlocks://a:7001,b,[::1]:7003/2?prefix=x",
            &["redlock", "redlocks"],
        )
        .unwrap();
        assert!(parts.tls);
        assert_eq!(
            parts.hosts,
            vec![
                ("a".to_owned(), 7001),
                ("b".to_owned(), 6379),
                ("::1".to_owned(), 7003)
            ]
        );
        assert_eq!(parts.db, 2);
        assert_eq!(parts.options, vec![("prefix".to_owned(), "x".to_owned())]);
    }
}
