//! The backend's configuration and its URL form.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use dlock_core::raw::key;
use dlock_core::raw::parse_duration;
use dlock_core::raw::url::{Host, LockUrl};
use dlock_core::{LockError, Result};

use crate::NAME;

/// The default port when a host names none.
const DEFAULT_PORT: u16 = 2181;
/// Longest escaped key segment; longer ones are shortened with a digest
/// ([`key::shorten`]).
const MAX_SEGMENT: usize = 240;

/// How to reach the ensemble and where the lock nodes live.
///
/// Built from a URL with [`ZookeeperConfig::from_url`] (see the crate docs for the grammar)
/// or field by field with [`ZookeeperConfig::with_option`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZookeeperConfig {
    /// The ensemble members, `host:port` each. At least one.
    pub hosts: Vec<String>,
    /// The parent of every key's lock directory: the URL's chroot path followed by its
    /// `root` option. Default `/dlock`.
    pub base: String,
    /// The session timeout asked of the server (it negotiates it into its
    /// `minSessionTimeout..=maxSessionTimeout`, by default 2 to 20 ticks). A crashed holder's
    /// key frees this long after its last heartbeat. Default 10 s.
    pub session_timeout: Duration,
    /// How long establishing a session may take, in [`crate::from_url`] and when an
    /// expired session is replaced. Default 5 s.
    pub connect_timeout: Duration,
}

/// The options a URL query can set; each has one spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfigKey {
    /// `root`: the path under the chroot that holds the key directories (from a URL), or
    /// the whole base path (from [`ZookeeperConfig::with_option`]).
    Root,
    /// `session_timeout`: see [`ZookeeperConfig::session_timeout`].
    SessionTimeout,
    /// `connect_timeout`: see [`ZookeeperConfig::connect_timeout`].
    ConnectTimeout,
}

impl ConfigKey {
    /// The key as spelled in a URL query.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Root => "root",
            Self::SessionTimeout => "session_timeout",
            Self::ConnectTimeout => "connect_timeout",
        }
    }
}

impl FromStr for ConfigKey {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self> {
        [Self::Root, Self::SessionTimeout, Self::ConnectTimeout]
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                LockError::invalid_config(
                    NAME,
                    format!("unknown option {s:?} (known: root, session_timeout, connect_timeout)"),
                )
            })
    }
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl ZookeeperConfig {
    /// Default [`base`](Self::base).
    pub const DEFAULT_ROOT: &'static str = "/dlock";
    /// Default [`session_timeout`](Self::session_timeout).
    pub const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default [`connect_timeout`](Self::connect_timeout).
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

    /// A configuration for `hosts` (`host:port` each) with every default.
    pub fn new(hosts: impl IntoIterator<Item = impl Into<String>>) -> Result<Self> {
        let hosts = hosts
            .into_iter()
            .map(|h| Host::parse(NAME, &h.into(), DEFAULT_PORT).map(|h| h.to_string()))
            .collect::<Result<Vec<_>>>()?;
        if hosts.is_empty() {
            return Err(LockError::invalid_config(NAME, "no host given"));
        }
        Ok(Self {
            hosts,
            base: Self::DEFAULT_ROOT.to_owned(),
            session_timeout: Self::DEFAULT_SESSION_TIMEOUT,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
        })
    }

    /// Parse `zk://host1:port,host2:port[/chroot][?root=/dlock&session_timeout=10s&connect_timeout=5s]`.
    /// Nothing is contacted.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is wrong: another scheme, no host, a bad port,
    /// credentials (not supported), a bad path, an unknown option or a bad value.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = LockUrl::parse(NAME, url, crate::SCHEMES, DEFAULT_PORT)?;
        if url.username().is_some() || url.password().is_some() {
            return Err(LockError::invalid_config(
                NAME,
                "credentials in the URL are not supported (digest/SASL auth is not implemented)",
            ));
        }
        let hosts: Vec<String> = url.hosts().iter().map(Host::to_string).collect();
        let mut config = Self::new(hosts)?;
        let chroot = match url.path() {
            "" | "/" => "",
            path => {
                check_path(path, "chroot")?;
                path
            }
        };
        let mut root = Self::DEFAULT_ROOT.to_owned();
        for (k, v) in url.options() {
            match k.parse::<ConfigKey>()? {
                ConfigKey::Root => {
                    check_path(v, "root")?;
                    root.clone_from(v);
                }
                key => {
                    config = config.set(key, v)?;
                }
            }
        }
        config.base = format!("{chroot}{root}");
        Ok(config)
    }

    /// Set one option from its string form, with its URL query spelling (`root`,
    /// `session_timeout`, `connect_timeout`). `root` replaces the whole
    /// [`base`](Self::base) path.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the option when it is unknown or its value is bad.
    pub fn with_option(self, key: &str, value: &str) -> Result<Self> {
        self.set(key.parse()?, value)
    }

    fn set(mut self, key: ConfigKey, value: &str) -> Result<Self> {
        match key {
            ConfigKey::Root => {
                check_path(value, "root")?;
                self.base = value.to_owned();
            }
            ConfigKey::SessionTimeout => {
                self.session_timeout = parse_duration(
                    NAME,
                    &key.to_string(),
                    value,
                    Duration::from_millis(500)..=Duration::from_secs(600),
                )?;
            }
            ConfigKey::ConnectTimeout => {
                self.connect_timeout = parse_duration(
                    NAME,
                    &key.to_string(),
                    value,
                    Duration::from_millis(1)..=Duration::from_secs(600),
                )?;
            }
        }
        Ok(self)
    }

    /// The ZooKeeper connect string for the hosts (no chroot: the base path carries it).
    pub(crate) fn connect_string(&self) -> String {
        self.hosts.join(",")
    }

    /// The directory that holds `key`'s lock nodes: `{base}/{segment}`, where the segment is
    /// the key escaped into one safe path segment and, if long, shortened with a digest.
    pub fn key_dir(&self, key: &str) -> String {
        format!("{}/{}", self.base, key_segment(key))
    }
}

/// `key` as one path segment: every character outside `[A-Za-z0-9._:@-]` is
/// percent-encoded (so `/`, control characters and `%` never appear raw), a name made only
/// of dots is encoded entirely (`.` and `..` are not names), and long names are shortened
/// with a digest. Different keys always give different segments.
pub(crate) fn key_segment(key: &str) -> String {
    let keep = |c: char| c.is_ascii_alphanumeric() || "._:@-".contains(c);
    let mut escaped = key::escape(key, keep);
    if escaped.chars().all(|c| c == '.') {
        escaped = escaped.replace('.', "%2E");
    }
    key::shorten(&escaped, MAX_SEGMENT)
}

/// A ZooKeeper path: absolute, not `/`, no empty, `.` or `..` segment, no trailing `/`, and
/// no character ZooKeeper refuses.
fn check_path(path: &str, what: &str) -> Result<()> {
    let bad = |why: &str| LockError::invalid_config(NAME, format!("{what} {path:?}: {why}"));
    let Some(rest) = path.strip_prefix('/') else {
        return Err(bad("must start with '/'"));
    };
    if rest.is_empty() {
        return Err(bad("must name a node below '/'"));
    }
    for segment in rest.split('/') {
        if matches!(segment, "" | "." | "..") {
            return Err(bad("empty, '.' and '..' segments are not allowed"));
        }
        if segment.chars().any(|c| {
            let u = u32::from(c);
            [0..=0x1f, 0x7f..=0x9f, 0xd800..=0xf8ff, 0xfff0..=0xffff]
                .iter()
                .any(|r| r.contains(&u))
        }) {
            return Err(bad("holds a character ZooKeeper does not allow in paths"));
        }
    }
    if path == "/zookeeper" || path.starts_with("/zookeeper/") {
        return Err(bad("/zookeeper is reserved for the server"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::ErrorKind;
    use std::collections::HashSet;

    #[test]
    fn good_urls() {
        let s = Duration::from_secs;
        let cases: &[(&str, &[&str], &str, Duration, Duration)] = &[
            (
                "zk://127.0.0.1:2181",
                &["127.0.0.1:2181"],
                "/dlock",
                s(10),
                s(5),
            ),
            ("zk://localhost", &["localhost:2181"], "/dlock", s(10), s(5)),
            ("ZK://a:1", &["a:1"], "/dlock", s(10), s(5)),
            (
                "zookeeper://a:1,b:2,c:3",
                &["a:1", "b:2", "c:3"],
                "/dlock",
                s(10),
                s(5),
            ),
            ("zk://a:1/apps/x", &["a:1"], "/apps/x/dlock", s(10), s(5)),
            ("zk://a:1/", &["a:1"], "/dlock", s(10), s(5)),
            (
                "zk://a:1/c?root=/locks&session_timeout=2s&connect_timeout=1500ms",
                &["a:1"],
                "/c/locks",
                s(2),
                Duration::from_millis(1500),
            ),
            (
                "zk://a?session_timeout=1.5s",
                &["a:2181"],
                "/dlock",
                Duration::from_millis(1500),
                s(5),
            ),
            ("zk://a?root=%2Fx%2Fy", &["a:2181"], "/x/y", s(10), s(5)),
            (
                "zk://[::1]:2181,b",
                &["[::1]:2181", "b:2181"],
                "/dlock",
                s(10),
                s(5),
            ),
            (
                "zk://a?session_timeout=1m",
                &["a:2181"],
                "/dlock",
                s(60),
                s(5),
            ),
        ];
        for (url, hosts, base, session, connect) in cases {
            let c = ZookeeperConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(c.hosts, *hosts, "{url}");
            assert_eq!(c.base, *base, "{url}");
            assert_eq!(c.session_timeout, *session, "{url}");
            assert_eq!(c.connect_timeout, *connect, "{url}");
        }
    }

    #[test]
    fn bad_urls() {
        let cases: &[(&str, &str)] = &[
            ("redis://a:1", "is not one of zk://, zookeeper://"),
            ("zk:/a", "not a URL"),
            ("zk://", "no host given"),
            ("zk://a:1,", "no host name"),
            ("zk://a:0", "port"),
            ("zk://a:99999", "port"),
            ("zk://a:x", "port"),
            ("zk://a b:1", "host name"),
            ("zk://[zz]:1", "IPv6"),
            ("zk://user:sekrit-password@a:1", "credentials"),
            ("zk://a:1?bogus=1", "unknown option \"bogus\""),
            ("zk://a:1?root=relative", "must start with '/'"),
            ("zk://a:1?root=/", "below '/'"),
            ("zk://a:1?root=/a/../b", "'..'"),
            ("zk://a:1?root=/a/", "empty"),
            ("zk://a:1?root=/zookeeper", "reserved"),
            ("zk://a:1?root=/a%01b", "character"),
            ("zk://a:1/a//b", "empty"),
            ("zk://a:1/%FF", "UTF-8"),
            ("zk://a:1?session_timeout=abc", "not a duration"),
            ("zk://a:1?session_timeout=10", "not a duration"),
            ("zk://a:1?session_timeout=0s", "out of range"),
            ("zk://a:1?session_timeout=1h", "not a duration"),
            ("zk://a:1?connect_timeout=0ms", "out of range"),
            ("zk://a:1#frag", "fragment"),
            ("ZK://user:sekrit/x@a:1", "percent-encode"),
        ];
        for (url, why) in cases {
            let err = ZookeeperConfig::from_url(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}");
            let text = err.to_string();
            assert!(text.contains(why), "{url}: {text}");
            assert!(!text.contains("sekrit") && !format!("{err:?}").contains("sekrit"));
        }
    }

    #[test]
    fn config_keys_have_one_spelling() {
        for key in [
            ConfigKey::Root,
            ConfigKey::SessionTimeout,
            ConfigKey::ConnectTimeout,
        ] {
            assert_eq!(key.as_str().parse::<ConfigKey>().unwrap(), key);
        }
        let err = "sessionTimeout".parse::<ConfigKey>().unwrap_err();
        assert!(err.to_string().contains("sessionTimeout"), "{err}");
        let config = ZookeeperConfig::new(["a"])
            .unwrap()
            .with_option("session_timeout", "2s")
            .unwrap()
            .with_option("root", "/x")
            .unwrap();
        assert_eq!(config.session_timeout, Duration::from_secs(2));
        assert_eq!(config.base, "/x");
        let err = config.with_option("nope", "1").unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
    }

    #[test]
    fn keys_stay_inside_the_base_as_one_segment() {
        let tricky = [
            "..",
            ".",
            "...",
            "../x",
            "a/../../b",
            "/",
            "//",
            "a/b",
            " ",
            "\u{1}",
            "\u{7f}",
            "\u{9f}",
            "\u{e000}",
            "\u{fff0}",
            "zookeeper",
            "%2E%2E",
            "%2E",
            "a%2Fb",
            "_c_x-lock-",
        ];
        for key in tricky {
            let segment = key_segment(key);
            assert!(!segment.is_empty(), "{key:?}");
            assert!(!segment.contains('/'), "{key:?} -> {segment}");
            assert!(segment.chars().any(|c| c != '.'), "{key:?} -> {segment}");
            assert!(
                segment.chars().all(|c| c.is_ascii_graphic()),
                "{key:?} -> {segment}"
            );
            let dir = ZookeeperConfig::new(["a"]).unwrap().key_dir(key);
            check_path(&dir, "key dir").unwrap_or_else(|e| panic!("{key:?}: {e}"));
        }
        assert_eq!(key_segment(".."), "%2E%2E");
        assert_eq!(key_segment("orders.v2/42"), "orders.v2%2F42");
    }

    #[test]
    fn different_keys_never_share_a_segment() {
        let long = "k".repeat(1000);
        let long2 = format!("{}j", "k".repeat(999));
        let keys = [
            "..",
            "%2E%2E",
            ".",
            "%2E",
            "a/b",
            "a%2Fb",
            "a%b",
            "a%25b",
            "\u{e9}",
            "%C3%A9",
            long.as_str(),
            long2.as_str(),
            "%%",
            "a.b",
            "a%2Eb",
        ];
        let segments: HashSet<_> = keys.iter().map(|k| key_segment(k)).collect();
        assert_eq!(segments.len(), keys.len());
        assert!(key_segment(&long).len() <= MAX_SEGMENT);
        let four_byte = "\u{1F512}".repeat(300);
        assert!(key_segment(&four_byte).len() <= MAX_SEGMENT);
    }

    #[test]
    fn the_shared_url_table_passes() {
        dlock_conformance::urls::check_parser(
            |password, host| format!("zk://app:{password}@{host}:2181/chroot"),
            |url| ZookeeperConfig::from_url(url).map(|c| format!("{c:?}")),
        );
    }
}
