//! [`EtcdConfig`]: endpoints, key prefix, timeouts, TLS and credentials, parsed from a URL.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use dlock_core::raw::key;
use dlock_core::raw::parse_duration;
use dlock_core::raw::url::{Host, LockUrl};
use dlock_core::{LockError, Result, Secret};
use etcd_client::{Certificate, Identity, TlsOptions};

use crate::NAME;

/// The range every timeout option accepts.
const TIMEOUTS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);

/// The port used when a host names none.
const DEFAULT_PORT: u16 = 2379;

/// How to reach etcd and where to put the lock keys.
///
/// Built from a URL with [`EtcdConfig::from_url`] (see the crate docs for the grammar) and
/// adjusted with [`EtcdConfig::with_option`], which takes the same option names as the
/// URL's query. `Debug` never shows the password.
///
/// | option | default | meaning |
/// |---|---|---|
/// | `prefix` | `dlock/` | prepended verbatim to every lock name (see [`EtcdConfig::lock_name`]); empty to share lock names with `etcdctl lock` |
/// | `connect_timeout` | `5s` | bound on connecting (and authenticating) in `from_url` |
/// | `request_timeout` (alias `timeout`) | `5s` | bound on every request to the server |
/// | `ca` (alias `cacert`) | none, required by `etcds://` | PEM file of the CA that signed the servers' certificates |
/// | `cert`, `key` | none | PEM client certificate and its private key, for client-certificate auth |
/// | `domain` | the host name | name to check the server certificate against |
/// | `user`, `password` | none | etcd user (also from the URL's `user:password@`) |
///
/// Durations are written `250ms`, `5s`, `1.5s` or `2m`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdConfig {
    endpoints: Vec<String>,
    tls: bool,
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    domain: Option<String>,
    user: Option<String>,
    password: Option<Secret>,
    prefix: String,
    connect_timeout: Duration,
    request_timeout: Duration,
}

/// The option names of the URL query and [`EtcdConfig::with_option`]: one spelling each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConfigKey {
    Prefix,
    ConnectTimeout,
    RequestTimeout,
    Ca,
    Cert,
    Key,
    Domain,
    User,
    Password,
}

impl FromStr for ConfigKey {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "prefix" => Self::Prefix,
            "connect_timeout" => Self::ConnectTimeout,
            "request_timeout" | "timeout" => Self::RequestTimeout,
            "ca" | "cacert" => Self::Ca,
            "cert" => Self::Cert,
            "key" => Self::Key,
            "domain" => Self::Domain,
            "user" | "username" => Self::User,
            "password" => Self::Password,
            other => {
                return Err(LockError::invalid_config(
                    NAME,
                    format!(
                        "unknown option {other:?} (known: prefix, connect_timeout, \
                         request_timeout, ca, cert, key, domain, user, password)"
                    ),
                ));
            }
        })
    }
}

impl EtcdConfig {
    /// The default key prefix. Lock keys live under it, so no unrelated key of the cluster
    /// (`jobs/1` beside a lock named `jobs`) can stand in a lock's queue.
    pub const DEFAULT_PREFIX: &'static str = "dlock/";

    /// Defaults for these `host:port` endpoints, in plain text (no TLS).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when the list is empty or an endpoint is malformed.
    pub fn new<S: AsRef<str>>(endpoints: &[S]) -> Result<Self> {
        if endpoints.is_empty() {
            return Err(LockError::invalid_config(NAME, "no endpoint given"));
        }
        let endpoints = endpoints
            .iter()
            .map(|e| Host::parse(NAME, e.as_ref(), DEFAULT_PORT).map(|h| h.to_string()))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            endpoints,
            tls: false,
            ca: None,
            cert: None,
            key: None,
            domain: None,
            user: None,
            password: None,
            prefix: Self::DEFAULT_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(5),
        })
    }

    /// Parse `etcd://host[:port][,host[:port]…][?option=value&…]` or the TLS form
    /// `etcds://…?ca=PATH`, with optional `user:password@` before the hosts.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is wrong; the message never contains the
    /// password.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = LockUrl::parse(NAME, url, crate::SCHEMES, DEFAULT_PORT)?;
        if !matches!(url.path(), "" | "/") {
            return Err(LockError::invalid_config(
                NAME,
                format!(
                    "a path ({:?}) is not allowed: use ?prefix= for a key prefix",
                    url.path()
                ),
            ));
        }
        let hosts: Vec<String> = url.hosts().iter().map(Host::to_string).collect();
        let mut config = Self::new(&hosts)?;
        config.tls = url.scheme() == "etcds";
        config.user = url.username().map(str::to_owned);
        config.password = url.password().cloned();
        for (name, value) in url.options() {
            config = config.with_option(name, value)?;
        }
        config.validate()?;
        Ok(config)
    }

    /// Set one option by name (the names of the URL query; see the table above).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for an unknown name or a bad value.
    pub fn with_option(mut self, name: &str, value: &str) -> Result<Self> {
        match name.parse::<ConfigKey>()? {
            ConfigKey::Prefix => self.prefix = value.to_owned(),
            ConfigKey::ConnectTimeout => {
                self.connect_timeout = parse_duration(NAME, name, value, TIMEOUTS)?
            }
            ConfigKey::RequestTimeout => {
                self.request_timeout = parse_duration(NAME, name, value, TIMEOUTS)?
            }
            ConfigKey::Ca => self.ca = Some(non_empty(name, value)?.into()),
            ConfigKey::Cert => self.cert = Some(non_empty(name, value)?.into()),
            ConfigKey::Key => self.key = Some(non_empty(name, value)?.into()),
            ConfigKey::Domain => self.domain = Some(non_empty(name, value)?.to_owned()),
            ConfigKey::User => self.user = Some(non_empty(name, value)?.to_owned()),
            ConfigKey::Password => self.password = Some(Secret::new(value)),
        }
        Ok(self)
    }

    /// Check the options fit together: TLS options only with `etcds://` (which needs `ca`),
    /// `cert` and `key` together, a password only with a user.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the conflict.
    pub fn validate(&self) -> Result<()> {
        let tls_option = [
            ("ca", self.ca.is_some()),
            ("cert", self.cert.is_some()),
            ("key", self.key.is_some()),
            ("domain", self.domain.is_some()),
        ]
        .into_iter()
        .find(|(_, set)| *set);
        if !self.tls {
            if let Some((option, _)) = tls_option {
                return Err(LockError::invalid_config(
                    NAME,
                    format!("option {option} is for TLS: use the etcds:// scheme"),
                ));
            }
        } else if self.ca.is_none() {
            return Err(LockError::invalid_config(
                NAME,
                "etcds:// needs ca=PATH (the CA certificate that signed the servers')",
            ));
        }
        if self.cert.is_some() != self.key.is_some() {
            return Err(LockError::invalid_config(
                NAME,
                "cert and key go together: give both or neither",
            ));
        }
        if self.password.is_some() && self.user.is_none() {
            return Err(LockError::invalid_config(
                NAME,
                "a password needs a user name",
            ));
        }
        Ok(())
    }

    /// The endpoints as the client dials them (`http://host:port` or `https://host:port`).
    pub fn endpoints(&self) -> Vec<String> {
        let scheme = if self.tls { "https" } else { "http" };
        self.endpoints
            .iter()
            .map(|hp| format!("{scheme}://{hp}"))
            .collect()
    }

    /// The key prefix (default [`DEFAULT_PREFIX`](Self::DEFAULT_PREFIX)).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Bound on connecting and authenticating (default 5 s).
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Bound on every request to the server (default 5 s).
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// The etcd user, if any.
    pub fn user(&self) -> Option<&str> {
        self.user.as_deref()
    }

    /// The lock name of `key`: `{prefix}{key}` with `%` and `/` percent-encoded (`%25`,
    /// `%2F`). The lock's etcd keys are `{lock name}/{lease id in hex}`, exactly as
    /// `etcdctl lock <lock name>` and Go's `concurrency.NewMutex(session, <lock name>)`
    /// name theirs, so each excludes the other. Encoding `/` keeps nested keys apart: the
    /// lock `a` never sees the keys of the lock `a/b`.
    ///
    /// ```
    /// let config = dlock_etcd::EtcdConfig::from_url("etcd://127.0.0.1:2379?prefix=locks/")?;
    /// assert_eq!(config.lock_name("reports/nightly"), "locks/reports%2Fnightly");
    /// assert_eq!(config.lock_name("cron"), "locks/cron");
    /// # Ok::<(), dlock_core::LockError>(())
    /// ```
    pub fn lock_name(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key::escape(key, |c| c != '/'))
    }

    pub(crate) fn credentials(&self) -> Option<(String, String)> {
        self.user.clone().map(|user| {
            let password = self.password.as_ref().map_or("", Secret::expose);
            (user, password.to_owned())
        })
    }

    /// The TLS settings, reading the PEM files (local I/O only).
    pub(crate) fn tls_options(&self) -> Result<Option<TlsOptions>> {
        if !self.tls {
            return Ok(None);
        }
        let mut tls = TlsOptions::new();
        if let Some(ca) = &self.ca {
            tls = tls.ca_certificate(Certificate::from_pem(read_pem("ca", ca)?));
        }
        if let (Some(cert), Some(key)) = (&self.cert, &self.key) {
            tls = tls.identity(Identity::from_pem(
                read_pem("cert", cert)?,
                read_pem("key", key)?,
            ));
        }
        if let Some(domain) = &self.domain {
            tls = tls.domain_name(domain.clone());
        }
        Ok(Some(tls))
    }
}

fn read_pem(option: &str, path: &PathBuf) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| LockError::InvalidConfig {
        backend: NAME,
        message: format!("cannot read the {option} file {}", path.display()),
        source: Some(Box::new(e)),
    })
}

fn non_empty<'a>(name: &str, value: &'a str) -> Result<&'a str> {
    if value.is_empty() {
        return Err(LockError::invalid_config(
            NAME,
            format!("option {name} needs a value"),
        ));
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::ErrorKind;

    #[test]
    fn good_urls() {
        let secs = Duration::from_secs;
        // (url, endpoints, prefix, connect timeout, request timeout, user)
        type Case<'a> = (
            &'a str,
            &'a [&'a str],
            &'a str,
            Duration,
            Duration,
            Option<&'a str>,
        );
        let cases: &[Case<'_>] = &[
            (
                "etcd://127.0.0.1:2379",
                &["http://127.0.0.1:2379"],
                "dlock/",
                secs(5),
                secs(5),
                None,
            ),
            (
                "etcd://localhost",
                &["http://localhost:2379"],
                "dlock/",
                secs(5),
                secs(5),
                None,
            ),
            (
                "etcd://a:1,b:2,[::1]:3/",
                &["http://a:1", "http://b:2", "http://[::1]:3"],
                "dlock/",
                secs(5),
                secs(5),
                None,
            ),
            (
                "etcd://h?prefix=locks/&connect_timeout=250ms&request_timeout=1.5s",
                &["http://h:2379"],
                "locks/",
                Duration::from_millis(250),
                Duration::from_millis(1500),
                None,
            ),
            (
                "etcd://h?prefix=a%26b%3D&timeout=2m",
                &["http://h:2379"],
                "a&b=",
                secs(5),
                secs(120),
                None,
            ),
            (
                "etcd://alice:s%40cret@h:1",
                &["http://h:1"],
                "dlock/",
                secs(5),
                secs(5),
                Some("alice"),
            ),
            (
                "etcd://h?user=bob&password=pw",
                &["http://h:2379"],
                "dlock/",
                secs(5),
                secs(5),
                Some("bob"),
            ),
            (
                "etcds://h:2379?ca=/etc/ca.pem&cert=/c.pem&key=/k.pem&domain=etcd.local",
                &["https://h:2379"],
                "dlock/",
                secs(5),
                secs(5),
                None,
            ),
        ];
        for (url, endpoints, prefix, connect, request, user) in cases {
            let c = EtcdConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(c.endpoints(), *endpoints, "{url}");
            assert_eq!(c.prefix(), *prefix, "{url}");
            assert_eq!(c.connect_timeout(), *connect, "{url}");
            assert_eq!(c.request_timeout(), *request, "{url}");
            assert_eq!(c.user(), *user, "{url}");
        }
        let c = EtcdConfig::from_url("etcd://alice:s%40cret@h").unwrap();
        assert_eq!(
            c.credentials(),
            Some(("alice".to_owned(), "s@cret".to_owned()))
        );
    }

    #[test]
    fn bad_urls() {
        // (url, a word the message must contain)
        let cases = [
            ("", "not a URL"),
            ("127.0.0.1:2379", "not a URL"),
            ("redis://h", "scheme"),
            ("etcd://", "no endpoint"),
            ("etcd://h,", "no host"),
            ("etcd://h:0", "port"),
            ("etcd://h:99999", "port"),
            ("etcd://h:x", "port"),
            ("etcd://h/path", "path"),
            ("etcd://h#frag", "fragment"),
            ("etcd://h?nope=1", "unknown option \"nope\""),
            ("etcd://h?connect_timeout=5", "duration"),
            ("etcd://h?connect_timeout=0ms", "out of range"),
            ("etcd://h?request_timeout=2h", "duration"),
            ("etcd://h?request_timeout=-1s", "duration"),
            ("etcd://h?ca=/ca.pem", "etcds://"),
            ("etcds://h", "ca=PATH"),
            ("etcds://h?ca=/a&cert=/c", "cert and key"),
            ("etcd://:pw@h", "user"),
            ("etcd://h?password=pw", "user"),
            ("etcd://[::1", "closing"),
            ("etcd://[zz]:1", "IPv6"),
            ("etcd://h%20x", "host name"),
            ("etcd://u:%FF@h", "UTF-8"),
            ("ETCD://u:pa/ss@h", "percent-encode"),
        ];
        for (url, word) in cases {
            let err = EtcdConfig::from_url(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}");
            assert!(err.to_string().contains(word), "{url}: {err}");
        }
    }

    #[test]
    fn password_is_never_shown() {
        let c = EtcdConfig::from_url("etcd://alice:hunter2-secret@h").unwrap();
        assert!(!format!("{c:?}").contains("hunter2"), "{c:?}");
        let err = EtcdConfig::from_url("etcd://alice:hunter2-secret@h:0").unwrap_err();
        assert!(!format!("{err} {err:?}").contains("hunter2"));
    }

    #[test]
    fn lock_names_are_injective_and_never_nest() {
        let c = EtcdConfig::new(&["h"])
            .unwrap()
            .with_option("prefix", "")
            .unwrap();
        assert_eq!(c.lock_name("plain-name_1.x"), "plain-name_1.x");
        assert_eq!(c.lock_name("a/b"), "a%2Fb");
        assert_eq!(c.lock_name("a%2Fb"), "a%252Fb");
        assert_ne!(c.lock_name("a/b"), c.lock_name("a%2Fb"));
        // No lock name contains '/', so "{name}/" never covers another lock's keys.
        assert!(!c.lock_name("x/y/z").contains('/'));
        // By default lock names live under dlock/, away from the rest of the keyspace.
        let c = EtcdConfig::new(&["h"]).unwrap();
        assert_eq!(c.lock_name("jobs"), "dlock/jobs");
        assert_eq!(c.lock_name("x/y"), "dlock/x%2Fy");
    }

    #[test]
    fn tls_files_are_read_before_any_network_io() {
        let c = EtcdConfig::from_url("etcds://h?ca=/nonexistent/ca.pem").unwrap();
        let err = c.tls_options().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        assert!(err.to_string().contains("ca file"), "{err}");
        assert!(
            EtcdConfig::new(&["h"])
                .unwrap()
                .tls_options()
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn the_shared_url_table_passes() {
        dlock_conformance::urls::check_parser(
            |password, host| format!("etcd://app:{password}@{host}:2379?prefix=p"),
            |url| EtcdConfig::from_url(url).map(|c| format!("{c:?}")),
        );
    }
}
