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
use crate::auth::{Digest, Sasl, Scheme};

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
/// or field by field with [`ZookeeperConfig::with_option`],
/// [`ZookeeperConfig::with_digest`] and [`ZookeeperConfig::with_sasl`]. `Debug` never shows
/// the password.
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
    /// SASL `DIGEST-MD5` credentials (the URL's `user:password@` with `auth=sasl`), sent on
    /// every connection of every session. With them, every node the lock creates gets a
    /// `sasl:{user}`-only ACL (see [Security](crate#security)). Exclusive with
    /// [`digest`](Self::digest). Default none.
    pub sasl: Option<Sasl>,
    /// TLS (the `zks://` scheme), with the PEM files it reads when a session is opened.
    /// Default none: plain TCP.
    pub tls: Option<Tls>,
    /// Which Curator recipe this client's exclusive holds exclude on a shared path (the
    /// `curator` option), that is which name their nodes get. Default
    /// [`CuratorRecipe::Mutex`].
    pub curator: CuratorRecipe,
}

/// The Curator recipe that dlock's exclusive holds exclude (the `curator` URL option):
/// Curator orders only the nodes named for its own recipe, so one exclusive node name
/// cannot exclude both (see [Interop](crate#interop-with-curator-go-zookeeper-and-kazoo)).
/// Shared holds are Curator read-lock nodes either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CuratorRecipe {
    /// `mutex`: exclusive nodes are `_c_{uuid}-lock-{seq}`, as Curator's
    /// `InterProcessMutex`, go-zookeeper's `zk.Lock` (and kazoo with
    /// `extra_lock_patterns=["-lock-"]`) make and order them. Curator's read-write lock
    /// ignores them.
    #[default]
    Mutex,
    /// `read_write_lock`: exclusive nodes are `_c_{uuid}-__WRIT__{seq}`, as Curator's
    /// `InterProcessReadWriteLock` write lock makes them, so its readers and writers wait
    /// for ours. Curator's mutex ignores them (kazoo counts them with `"__WRIT__"` in
    /// `extra_lock_patterns`).
    ReadWriteLock,
}

impl CuratorRecipe {
    /// The option's value as spelled in a URL.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Mutex => "mutex",
            Self::ReadWriteLock => "read_write_lock",
        }
    }
}

impl FromStr for CuratorRecipe {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self> {
        [Self::Mutex, Self::ReadWriteLock]
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| {
                LockError::invalid_config(
                    NAME,
                    format!("option curator={s:?}: expected mutex or read_write_lock"),
                )
            })
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
    /// `auth`: how the URL's credentials authenticate, `digest` (the default) or `sasl`
    /// (SASL `DIGEST-MD5`): see [`ZookeeperConfig::digest`] and [`ZookeeperConfig::sasl`].
    Auth,
    /// `curator`: see [`ZookeeperConfig::curator`].
    Curator,
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
            Self::Auth => "auth",
            Self::Curator => "curator",
        }
    }

    /// Every key, in the order the docs list them.
    const ALL: [Self; 8] = [
        Self::Root,
        Self::SessionTimeout,
        Self::ConnectTimeout,
        Self::Ca,
        Self::Cert,
        Self::Key,
        Self::Auth,
        Self::Curator,
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
                         ca, cert, key, auth, curator)"
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
            sasl: None,
            tls: None,
            curator: CuratorRecipe::default(),
        })
    }

    /// Parse `zk://[user:password@]host1:port,host2:port[/chroot][?root=/dlock&session_timeout=10s&connect_timeout=5s&auth=sasl&curator=mutex]`,
    /// or `zks://…?ca=PATH[&cert=PATH&key=PATH]` for TLS. Nothing is contacted and no file
    /// is read.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is wrong: another scheme, no host, a bad port,
    /// a user without a password (or the reverse), a bad path, an unknown option, a bad
    /// value (`curator` other than `mutex` or `read_write_lock`), TLS options without
    /// `zks://`, `zks://` without `ca`, `auth=` without credentials or with Kerberos (not
    /// supported). The message never shows the password.
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
    /// `session_timeout`, `connect_timeout`, `ca`, `cert`, `key`, `auth`, `curator`). `root` replaces
    /// the whole [`base`](Self::base) path; `ca`, `cert` and `key` turn TLS on; `auth`
    /// moves the credentials already set to the scheme it names.
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
        self.sasl = None;
        Ok(self)
    }

    /// Authenticate every session with SASL `DIGEST-MD5` as `user` (checked by the server
    /// against its JAAS `Server` section), and create every node with an ACL for
    /// `sasl:{user}` only (see [Security](crate#security)). Needs the `sasl` feature (on by
    /// default) when connecting.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] as [`Sasl::new`].
    pub fn with_sasl(mut self, user: &str, password: impl Into<Secret>) -> Result<Self> {
        self.sasl = Some(Sasl::new(user, password)?);
        self.digest = None;
        Ok(self)
    }

    /// Check that the settings fit together: TLS needs `ca`; `cert` and `key` go together;
    /// digest and SASL credentials exclude each other; SASL needs the `sasl` feature.
    /// [`from_url`](Self::from_url) and [`ZookeeperBackend::connect`](crate::ZookeeperBackend::connect)
    /// call it.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming the conflict.
    pub fn validate(&self) -> Result<()> {
        if self.digest.is_some() && self.sasl.is_some() {
            return Err(LockError::invalid_config(
                NAME,
                "digest and SASL credentials exclude each other: set one",
            ));
        }
        if self.sasl.is_some() && !cfg!(feature = "sasl") {
            return Err(LockError::invalid_config(
                NAME,
                "auth=sasl needs the `sasl` feature of dlock-zookeeper, which is not enabled in this build",
            ));
        }
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
            ConfigKey::Auth => {
                let scheme = Scheme::parse(value)?;
                match (scheme, self.digest.take(), self.sasl.take()) {
                    (Scheme::Sasl, Some(digest), None) => {
                        self.sasl = Some(Sasl::new(digest.user(), digest.password().clone())?)
                    }
                    (Scheme::Digest, None, Some(sasl)) => {
                        self.digest = Some(Digest::new(sasl.user(), sasl.password().clone())?);
                    }
                    (_, digest, sasl) if digest.is_some() || sasl.is_some() => {
                        (self.digest, self.sasl) = (digest, sasl);
                    }
                    _ => {
                        return Err(LockError::invalid_config(
                            NAME,
                            format!(
                                "option auth={value} needs credentials: \
                                 zk://user:password@host?auth={value}"
                            ),
                        ));
                    }
                }
            }
            ConfigKey::Curator => self.curator = value.parse()?,
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

/// What a child name of the base path says of its key: the key itself when the name is
/// [`key_segment`]'s for it ([`Segment::Key`]); for a name shortened with a digest, only
/// the key's first bytes, decoded from its readable prefix ([`Segment::Shortened`]; dlock
/// writes the whole key as the data of a key directory it creates); `None` for any other
/// name.
pub(crate) fn parse_segment(name: &str) -> Option<Segment> {
    if let Some((readable, digest)) = name.split_once("%%") {
        let hex = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit());
        return (hex && name.len() <= MAX_SEGMENT)
            .then(|| unescape(readable).map(Segment::Shortened))
            .flatten();
    }
    let key = String::from_utf8(unescape(name)?).ok()?;
    (key_segment(&key) == name).then_some(Segment::Key(key))
}

/// A child name of the base path, decoded ([`parse_segment`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Segment {
    /// The key, whole.
    Key(String),
    /// The first bytes of a long key (perhaps ending inside a character).
    Shortened(Vec<u8>),
}

/// The bytes [`key::escape`] encoded: `%XX` (upper-case hex) decoded, anything else as it
/// is; `None` for a `%` not followed by two upper-case hex digits.
fn unescape(escaped: &str) -> Option<Vec<u8>> {
    let bytes = escaped.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = bytes.get(at + 1..at + 3)?;
            let digit = |b: u8| match b {
                b'0'..=b'9' => Some(b - b'0'),
                b'A'..=b'F' => Some(b - b'A' + 10),
                _ => None,
            };
            out.push(digit(hex[0])? << 4 | digit(hex[1])?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    Some(out)
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
#[path = "config_tests.rs"]
mod tests;
