//! The backend's configuration and its URL form.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use dlock_core::raw::key;
use dlock_core::raw::parse_duration;
use dlock_core::raw::url::{Host, LockUrl};
use dlock_core::{LockError, Result, Secret};

use crate::NAME;

/// The default port when a host names none (for `zks://` too: ZooKeeper has no standard
/// secure port; `secureClientPort` is often 2281).
const DEFAULT_PORT: u16 = 2181;
/// The TLS scheme.
const TLS_SCHEME: &str = "zks";
/// Longest escaped key segment; longer ones are shortened with a digest
/// ([`key::shorten`]).
const MAX_SEGMENT: usize = 240;

/// How to reach the ensemble, as whom, and where the lock nodes live.
///
/// Built from a URL with [`ZookeeperConfig::from_url`] (see the crate docs for the grammar)
/// or field by field with [`ZookeeperConfig::with_option`] and
/// [`ZookeeperConfig::with_digest`]. `Debug` never shows the password.
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
    /// Digest credentials (the URL's `user:password@`), sent on every connection of every
    /// session. With them, every node the lock creates gets a digest-only ACL (see
    /// [Security](crate#security)). Default none: nodes are open to anyone.
    pub digest: Option<Digest>,
    /// TLS (the `zks://` scheme), with the PEM files it reads when a session is opened.
    /// Default none: plain TCP.
    pub tls: Option<Tls>,
}

/// ZooKeeper `digest` credentials: the session is identified as
/// `digest:{user}:{base64(sha1("{user}:{password}"))}`. `Debug` never shows the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    user: String,
    password: Secret,
}

impl Digest {
    /// Credentials for `user` (not empty, no `:`) with `password` (not empty).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for an empty user name or password, or a user name with
    /// a `:` (the server splits `user:password` at the first `:`). The message never shows
    /// the password.
    pub fn new(user: impl Into<String>, password: impl Into<Secret>) -> Result<Self> {
        let (user, password) = (user.into(), password.into());
        if user.is_empty() {
            return Err(LockError::invalid_config(
                NAME,
                "digest auth needs a user name: zk://user:password@host",
            ));
        }
        if user.contains(':') {
            return Err(LockError::invalid_config(
                NAME,
                "a digest user name cannot hold ':' (ZooKeeper splits user:password at the first ':')",
            ));
        }
        if password.expose().is_empty() {
            return Err(LockError::invalid_config(
                NAME,
                "digest auth needs a password: zk://user:password@host",
            ));
        }
        Ok(Self { user, password })
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The password.
    pub fn password(&self) -> &Secret {
        &self.password
    }

    /// The id ZooKeeper gives a session authenticated with these credentials,
    /// `{user}:{base64(sha1("{user}:{password}"))}` (what `getAcl` shows after `digest:`,
    /// and what an operator writes in `setAcl {path} digest:{id}:cdrwa`). It is derived
    /// from the password: keep it as private as the password itself (it can be attacked
    /// offline).
    pub fn id(&self) -> String {
        use base64::Engine as _;
        use sha1::Digest as _;
        let hash = sha1::Sha1::digest(self.auth_data());
        format!(
            "{}:{}",
            self.user,
            base64::engine::general_purpose::STANDARD.encode(hash)
        )
    }

    /// `user:password`, the auth data of ZooKeeper's `digest` scheme.
    pub(crate) fn auth_data(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password.expose()).into_bytes()
    }
}

/// TLS settings: the CA that signed the servers' certificates, and optionally a client
/// certificate with its key. The files (PEM) are read each time a session is opened.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tls {
    /// PEM file of the CA certificate(s) to trust (the `ca` option). Required.
    pub ca: Option<PathBuf>,
    /// PEM file of the client certificate chain (the `cert` option), for servers that ask
    /// for one (`ssl.clientAuth`). Goes with [`key`](Self::key).
    pub cert: Option<PathBuf>,
    /// PEM file of the client certificate's private key (the `key` option).
    pub key: Option<PathBuf>,
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
    /// `ca`: see [`Tls::ca`].
    Ca,
    /// `cert`: see [`Tls::cert`].
    Cert,
    /// `key`: see [`Tls::key`].
    Key,
}

impl ConfigKey {
    /// The key as spelled in a URL query.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Root => "root",
            Self::SessionTimeout => "session_timeout",
            Self::ConnectTimeout => "connect_timeout",
            Self::Ca => "ca",
            Self::Cert => "cert",
            Self::Key => "key",
        }
    }

    /// Every key, in the order the docs list them.
    const ALL: [Self; 6] = [
        Self::Root,
        Self::SessionTimeout,
        Self::ConnectTimeout,
        Self::Ca,
        Self::Cert,
        Self::Key,
    ];
}

impl FromStr for ConfigKey {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                LockError::invalid_config(
                    NAME,
                    format!(
                        "unknown option {s:?} (known: root, session_timeout, connect_timeout, \
                         ca, cert, key)"
                    ),
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
            digest: None,
            tls: None,
        })
    }

    /// Parse `zk://[user:password@]host1:port,host2:port[/chroot][?root=/dlock&session_timeout=10s&connect_timeout=5s]`,
    /// or `zks://…?ca=PATH[&cert=PATH&key=PATH]` for TLS. Nothing is contacted and no file
    /// is read.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is wrong: another scheme, no host, a bad port,
    /// a user without a password (or the reverse), a bad path, an unknown option, a bad
    /// value, TLS options without `zks://`, `zks://` without `ca`. The message never shows
    /// the password.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = LockUrl::parse(NAME, url, crate::SCHEMES, DEFAULT_PORT)?;
        let hosts: Vec<String> = url.hosts().iter().map(Host::to_string).collect();
        let mut config = Self::new(hosts)?;
        match (url.username(), url.password()) {
            (None, None) => {}
            (Some(user), Some(password)) => {
                config.digest = Some(Digest::new(user, password.clone())?);
            }
            (Some(_), None) => {
                return Err(LockError::invalid_config(
                    NAME,
                    "digest auth needs a password: zk://user:password@host",
                ));
            }
            (None, Some(_)) => {
                return Err(LockError::invalid_config(
                    NAME,
                    "digest auth needs a user name: zk://user:password@host",
                ));
            }
        }
        if url.scheme() == TLS_SCHEME {
            config.tls = Some(Tls::default());
        }
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
        config.validate()?;
        if config.tls.is_some() && !cfg!(feature = "tls") {
            return Err(LockError::invalid_config(
                NAME,
                "zks:// needs the `tls` feature of dlock-zookeeper, which is not enabled in this build",
            ));
        }
        Ok(config)
    }

    /// Set one option from its string form, with its URL query spelling (`root`,
    /// `session_timeout`, `connect_timeout`, `ca`, `cert`, `key`). `root` replaces the whole
    /// [`base`](Self::base) path; `ca`, `cert` and `key` turn TLS on.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the option when it is unknown or its value is bad.
    pub fn with_option(mut self, key: &str, value: &str) -> Result<Self> {
        let key = key.parse()?;
        if matches!(key, ConfigKey::Ca | ConfigKey::Cert | ConfigKey::Key) {
            self.tls.get_or_insert_with(Tls::default);
        }
        self.set(key, value)
    }

    /// Authenticate every session with ZooKeeper's `digest` scheme as `user:password`, and
    /// create every node with an ACL for that identity only (see [Security](crate#security)).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] as [`Digest::new`].
    pub fn with_digest(mut self, user: &str, password: impl Into<Secret>) -> Result<Self> {
        self.digest = Some(Digest::new(user, password)?);
        Ok(self)
    }

    /// Check that the settings fit together: TLS needs `ca`; `cert` and `key` go together.
    /// [`from_url`](Self::from_url) and [`ZookeeperBackend::connect`](crate::ZookeeperBackend::connect)
    /// call it.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the conflict.
    pub fn validate(&self) -> Result<()> {
        let Some(tls) = &self.tls else {
            return Ok(());
        };
        if tls.ca.is_none() {
            return Err(LockError::invalid_config(
                NAME,
                "zks:// needs ca=PATH (the PEM file of the CA that signed the servers' certificates)",
            ));
        }
        if tls.cert.is_some() != tls.key.is_some() {
            return Err(LockError::invalid_config(
                NAME,
                "cert and key go together: give both or neither",
            ));
        }
        Ok(())
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
            ConfigKey::Ca | ConfigKey::Cert | ConfigKey::Key => {
                let Some(tls) = self.tls.as_mut() else {
                    return Err(LockError::invalid_config(
                        NAME,
                        format!("option {key} is for TLS: use the zks:// scheme"),
                    ));
                };
                if value.is_empty() {
                    return Err(LockError::invalid_config(
                        NAME,
                        format!("option {key} needs a file path"),
                    ));
                }
                let path = Some(PathBuf::from(value));
                match key {
                    ConfigKey::Ca => tls.ca = path,
                    ConfigKey::Cert => tls.cert = path,
                    _ => tls.key = path,
                }
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
            ("redis://a:1", "is not one of zk://, zookeeper://, zks://"),
            ("zk:/a", "not a URL"),
            ("zk://", "no host given"),
            ("zk://a:1,", "no host name"),
            ("zk://a:0", "port"),
            ("zk://a:99999", "port"),
            ("zk://a:x", "port"),
            ("zk://a b:1", "host name"),
            ("zk://[zz]:1", "IPv6"),
            ("zk://user@a:1", "needs a password"),
            ("zk://user:@a:1", "needs a password"),
            ("zk://:sekrit-password@a:1", "needs a user name"),
            ("zk://us%3Aer:sekrit-password@a:1", "cannot hold ':'"),
            (
                "zk://a:1?ca=/ca.pem",
                "option ca is for TLS: use the zks:// scheme",
            ),
            ("zk://a:1?cert=/c.pem&key=/k.pem", "option cert is for TLS"),
            ("zks://a:1", "needs ca=PATH"),
            ("zks://a:1?cert=/c.pem&key=/k.pem", "needs ca=PATH"),
            (
                "zks://a:1?ca=/ca.pem&cert=/c.pem",
                "cert and key go together",
            ),
            (
                "zks://a:1?ca=/ca.pem&key=/k.pem",
                "cert and key go together",
            ),
            ("zks://a:1?ca=", "option ca needs a file path"),
            (
                "zks://user:sekrit-password@a:1?domain=x",
                "unknown option \"domain\"",
            ),
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
    fn credentials_and_tls() {
        // (url, digest user name, auth data, TLS (ca, cert, key))
        type Case<'a> = (
            &'a str,
            Option<&'a str>,
            &'a str,
            Option<(&'a str, Option<&'a str>, Option<&'a str>)>,
        );
        let cases: &[Case<'_>] = &[
            ("zk://a:1", None, "", None),
            ("zk://app:pw@a:1", Some("app"), "app:pw", None),
            ("ZK://app:s%40cret@a,b/c", Some("app"), "app:s@cret", None),
            // The server splits the auth data at the first ':', so a password may hold one.
            ("zk://app:p:w%3A@a", Some("app"), "app:p:w:", None),
            ("zookeeper://%C3%A9:pw@a", Some("\u{e9}"), "\u{e9}:pw", None),
            (
                "zks://a:2281?ca=/etc/zk/ca.pem",
                None,
                "",
                Some(("/etc/zk/ca.pem", None, None)),
            ),
            (
                "ZKS://app:pw@a:2281,b:2281/chroot?ca=%2Fca.pem&cert=/c.pem&key=/k.pem&session_timeout=2s",
                Some("app"),
                "app:pw",
                Some(("/ca.pem", Some("/c.pem"), Some("/k.pem"))),
            ),
        ];
        for (url, user, auth, tls) in cases {
            if tls.is_some() && !cfg!(feature = "tls") {
                let err = ZookeeperConfig::from_url(url).unwrap_err();
                assert!(err.to_string().contains("`tls` feature"), "{url}: {err}");
                continue;
            }
            let c = ZookeeperConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(c.digest.as_ref().map(Digest::user), *user, "{url}");
            let data = c.digest.as_ref().map(Digest::auth_data).unwrap_or_default();
            assert_eq!(String::from_utf8(data).unwrap(), *auth, "{url}");
            let want = tls.map(|(ca, cert, key)| Tls {
                ca: Some(ca.into()),
                cert: cert.map(Into::into),
                key: key.map(Into::into),
            });
            assert_eq!(c.tls, want, "{url}");
            if let Some(digest) = &c.digest {
                let shown = format!("{c:?} {digest:?}");
                assert!(!shown.contains("pw") && !shown.contains("cret"), "{shown}");
                assert!(shown.contains("<redacted>"), "{shown}");
            }
        }
        assert_eq!(
            ZookeeperConfig::from_url("zk://a:1,b:2?root=/x")
                .unwrap()
                .connect_string(),
            "a:1,b:2"
        );
    }

    #[test]
    fn digest_ids_are_zookeepers() {
        // DigestAuthenticationProvider.generateDigest("super:test"), as in ZooKeeper's
        // administrator's guide.
        let digest = Digest::new("super", "test").unwrap();
        assert_eq!(digest.id(), "super:D/InIHSb7yEEbrWz8b9l71RjZJU=");
        // zkCli.sh: addauth digest dlock:s3cret-zk-pw; create /x x auth::cdrwa; getAcl /x
        let digest = Digest::new("dlock", "s3cret-zk-pw").unwrap();
        assert_eq!(digest.id(), "dlock:3LmojupLhafNzmAubdbpp/hEODg=");
        assert!(!format!("{digest:?}").contains("s3cret"));
    }

    #[test]
    fn credentials_and_tls_from_code() {
        let config = ZookeeperConfig::new(["a:2281"])
            .unwrap()
            .with_digest("app", "pw")
            .unwrap()
            .with_option("ca", "/ca.pem")
            .unwrap();
        assert_eq!(config.digest.as_ref().map(Digest::user), Some("app"));
        assert_eq!(
            config.tls.as_ref().and_then(|t| t.ca.as_deref()),
            Some(std::path::Path::new("/ca.pem"))
        );
        config.validate().unwrap();
        let half = config.with_option("cert", "/c.pem").unwrap();
        let err = half.validate().unwrap_err();
        assert!(err.to_string().contains("cert and key"), "{err}");
        let no_ca = ZookeeperConfig::new(["a"])
            .unwrap()
            .with_option("key", "/k.pem")
            .unwrap();
        assert!(no_ca.validate().unwrap_err().to_string().contains("ca="));
        for (user, password, why) in [
            ("", "pw", "user name"),
            ("a:b", "pw", "':'"),
            ("app", "", "password"),
        ] {
            let err = Digest::new(user, password).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidConfig);
            assert!(err.to_string().contains(why), "{user}: {err}");
        }
    }

    #[test]
    fn config_keys_have_one_spelling() {
        for key in ConfigKey::ALL {
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
