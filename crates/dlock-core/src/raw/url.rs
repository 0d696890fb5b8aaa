//! The one URL grammar of every backend, and the [`Secret`] that keeps passwords out of
//! errors, logs and `Debug` output.
//!
//! ```text
//! scheme://[user[:password]@]host[:port][,host[:port]…][/path][?name=value&…]
//! ```
//!
//! - The scheme is matched without regard to case (`REDIS://` is `redis://`).
//! - The user information is found first, at the last `@` before the host list. An `@`
//!   anywhere after the host list is refused, since it most likely ends a password whose
//!   `/`, `?` or `#` was not percent-encoded: the error then says so and shows nothing of
//!   the URL. No error ever shows any part of the user information.
//! - Hosts are names (letters, digits, `-`, `.`, `_`), IPv4 addresses or `[IPv6]`
//!   addresses, each with an optional port (1 to 65535; the backend's default otherwise).
//! - The path and every query name and value are percent-decoded (UTF-8); a `+` stays a `+`
//!   (these are not HTML forms). A query pair without `=` has the empty value.
//! - A `#fragment` is refused.
//!
//! ```
//! use dlock_core::raw::url::LockUrl;
//!
//! let url = LockUrl::parse("redis", "REDIS://app:p%40ss@cache:6380/2?prefix=a+b", &["redis", "rediss"], 6379)?;
//! assert_eq!(url.scheme(), "redis");
//! assert_eq!(url.username(), Some("app"));
//! assert_eq!(url.password().map(|p| p.expose()), Some("p@ss"));
//! assert_eq!(url.hosts()[0].to_string(), "cache:6380");
//! assert_eq!(url.path(), "/2");
//! assert_eq!(url.options(), &[("prefix".to_owned(), "a+b".to_owned())]);
//! assert_eq!(url.to_string(), "redis://app:***@cache:6380/2?prefix=a+b");
//! # Ok::<(), dlock_core::LockError>(())
//! ```

use std::fmt;
use std::net::Ipv6Addr;

use percent_encoding::percent_decode_str;

use crate::{LockError, Result};

/// A password or other credential: `Debug` and `Display` show `<redacted>`, never the text.
///
/// ```
/// let password = dlock_core::Secret::new("hunter2");
/// assert_eq!(format!("{password} {password:?}"), "<redacted> <redacted>");
/// assert_eq!(password.expose(), "hunter2");
/// ```
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    /// Wrap a credential.
    pub fn new(secret: impl Into<String>) -> Self {
        Self(secret.into())
    }

    /// The credential itself, to hand to a client library. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Secret {
    fn from(secret: String) -> Self {
        Self(secret)
    }
}

impl From<&str> for Secret {
    fn from(secret: &str) -> Self {
        Self(secret.to_owned())
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// One `host:port` of a URL. An IPv6 address is kept without its brackets; `Display`
/// writes them back (`[::1]:2379`). Port 0 is no port (a backend without a default port,
/// such as `memory://NAME`): `Display` writes the name alone, so that it parses back.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Host {
    /// Host name or IP address.
    pub name: String,
    /// Port: the URL's, or the backend's default.
    pub port: u16,
}

impl Host {
    /// A host at `name:port`.
    pub fn new(name: impl Into<String>, port: u16) -> Self {
        Self {
            name: name.into(),
            port,
        }
    }

    /// Parse `host[:port]` or `[IPv6][:port]` with `default_port`, as in a URL.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] of `backend` naming the host when it is malformed.
    pub fn parse(backend: &'static str, text: &str, default_port: u16) -> Result<Self> {
        let bad = |why: &str| LockError::invalid_config(backend, format!("host {text:?}: {why}"));
        let (name, port) = if let Some(rest) = text.strip_prefix('[') {
            let (name, after) = rest
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 address needs its closing ']'"))?;
            if name.parse::<Ipv6Addr>().is_err() {
                return Err(bad("not an IPv6 address"));
            }
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("expected :port after ']'"))?,
                ),
            };
            (name, port)
        } else {
            let (name, port) = match text.split_once(':') {
                Some((n, p)) => (n, Some(p)),
                None => (text, None),
            };
            if name.is_empty() {
                return Err(bad("no host name"));
            }
            if !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
            {
                return Err(bad(
                    "a host name has letters, digits, '-', '.' and '_' only \
                     (write an IPv6 address in brackets)",
                ));
            }
            (name, port)
        };
        let port = match port {
            None => default_port,
            // Digits only: u16's FromStr also takes a leading '+'.
            Some(p) => Some(p)
                .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u16>().ok())
                .filter(|p| *p != 0)
                .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?,
        };
        Ok(Self::new(name, port))
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.name.contains(':') {
            write!(f, "[{}]", self.name)?;
        } else {
            f.write_str(&self.name)?;
        }
        // Port 0 comes only from a default of 0: "h:0" would not parse back.
        match self.port {
            0 => Ok(()),
            port => write!(f, ":{port}"),
        }
    }
}

/// A lock URL taken apart: scheme, credentials, hosts, path and query options.
///
/// `Debug` and `Display` never show the password, nor the value of an option whose name
/// says it is a secret (see [`is_secret_option`], e.g. Redis Sentinel's
/// `sentinel_password`): `Display` writes `***` in their place. [`expose`](Self::expose)
/// writes the whole URL back for a client that needs it.
#[derive(Clone, PartialEq, Eq)]
pub struct LockUrl {
    scheme: String,
    username: Option<String>,
    password: Option<Secret>,
    /// The user information as written (still percent-encoded), for [`expose`](Self::expose).
    raw_userinfo: Option<Secret>,
    hosts: Vec<Host>,
    path: String,
    options: Vec<(String, String)>,
    /// Path and query as written, for rendering.
    raw_tail: String,
}

impl LockUrl {
    /// Take `url` apart for `backend`, whose schemes are `schemes` (any scheme when empty)
    /// and whose hosts default to `default_port`. No network I/O.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] of `backend` naming the part that is wrong. The message
    /// never contains any part of the user information; when an `@` follows the host list,
    /// it contains nothing of the URL at all.
    pub fn parse(
        backend: &'static str,
        url: &str,
        schemes: &[&str],
        default_port: u16,
    ) -> Result<Self> {
        let bad = |message: String| LockError::invalid_config(backend, message);
        let expected = match schemes.first() {
            Some(s) => format!("{s}://…"),
            None => "scheme://…".to_owned(),
        };
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad(format!("not a URL (expected {expected})")))?;
        let scheme = checked_scheme(backend, scheme, schemes)?;
        let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(end);
        if tail.contains('@') {
            return Err(bad(
                "the URL has an '@' after its host list; if it ends a user:password, \
                 percent-encode the password's reserved characters ('/' as %2F, '?' as %3F, \
                 '#' as %23, '@' as %40); elsewhere write '@' as %40"
                    .into(),
            ));
        }
        if tail.contains('#') {
            return Err(bad("a URL fragment (#…) is not allowed".into()));
        }
        let (userinfo, hostlist) = match authority.rsplit_once('@') {
            Some((info, hosts)) => (Some(info), hosts),
            None => (None, authority),
        };
        let (username, password) = match userinfo {
            None => (None, None),
            Some(info) => {
                let (user, pass) = match info.split_once(':') {
                    Some((u, p)) => (u, Some(p)),
                    None => (info, None),
                };
                let user = decode(backend, "the user name", user)?;
                let pass = pass
                    .map(|p| decode(backend, "the password", p))
                    .transpose()?;
                (Some(user).filter(|u| !u.is_empty()), pass.map(Secret))
            }
        };
        let hosts = match hostlist {
            "" => Vec::new(),
            list => list
                .split(',')
                .map(|h| Host::parse(backend, h, default_port))
                .collect::<Result<_>>()?,
        };
        let (raw_path, query) = match tail.split_once('?') {
            Some((p, q)) => (p, q),
            None => (tail, ""),
        };
        let path = decode(backend, &format!("the path {raw_path:?}"), raw_path)?;
        let mut options = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let name = decode(backend, &format!("the option name {name:?}"), name)?;
            let value = decode(backend, &format!("the value of option {name:?}"), value)?;
            options.push((name, value));
        }
        Ok(Self {
            scheme,
            username,
            password,
            raw_userinfo: userinfo.map(Secret::new),
            hosts,
            path,
            options,
            raw_tail: tail.to_owned(),
        })
    }

    /// The scheme, in lower case.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The percent-decoded user name, if the URL has a non-empty one.
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The percent-decoded password, if the URL has one (possibly empty).
    pub fn password(&self) -> Option<&Secret> {
        self.password.as_ref()
    }

    /// The hosts, in URL order; empty when the URL names none.
    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The percent-decoded path, with its leading `/`; empty when the URL has none.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The percent-decoded query options, in URL order.
    pub fn options(&self) -> &[(String, String)] {
        &self.options
    }

    /// The same URL naming `hosts` instead.
    pub fn with_hosts(&self, hosts: Vec<Host>) -> Self {
        Self {
            hosts,
            ..self.clone()
        }
    }

    /// The whole URL, password included, for a client that takes a URL. Never log it.
    pub fn expose(&self) -> String {
        self.render(self.raw_userinfo.as_ref().map(Secret::expose))
    }

    fn render(&self, userinfo: Option<&str>) -> String {
        self.render_with_tail(userinfo, &self.raw_tail)
    }

    fn render_with_tail(&self, userinfo: Option<&str>, tail: &str) -> String {
        let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let hosts: Vec<String> = self.hosts.iter().map(Host::to_string).collect();
        format!("{}://{userinfo}{}{tail}", self.scheme, hosts.join(","))
    }

    /// Path and query as written, with `***` for the value of every secret option.
    fn redacted_tail(&self) -> String {
        let Some((path, query)) = self.raw_tail.split_once('?') else {
            return self.raw_tail.clone();
        };
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) if is_secret_option(&percent_decoded_lossy(name)) => {
                    format!("{name}=***")
                }
                _ => pair.to_owned(),
            })
            .collect();
        format!("{path}?{}", pairs.join("&"))
    }
}

/// Whether a query option's value is a secret that no log line, error or `Debug` output may
/// show: its name (any case) contains `password`, `secret` or `token` (`sentinel_password`).
pub fn is_secret_option(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["password", "secret", "token"]
        .iter()
        .any(|word| name.contains(word))
}

/// `text` percent-decoded, with invalid escapes and bytes kept as they are (for matching an
/// option's name only).
fn percent_decoded_lossy(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied(),
            bytes.get(i + 2).copied(),
        ) {
            (b'%', Some(h), Some(l)) if hex(h).is_some() && hex(l).is_some() => {
                let value = hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0);
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl fmt::Debug for LockUrl {
    /// As `Display`, plus the parsed parts, with the password and secret options hidden.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let options: Vec<(&str, &str)> = self
            .options
            .iter()
            .map(|(name, value)| {
                let shown = if is_secret_option(name) {
                    "***"
                } else {
                    value.as_str()
                };
                (name.as_str(), shown)
            })
            .collect();
        f.debug_struct("LockUrl")
            .field("url", &self.to_string())
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("hosts", &self.hosts)
            .field("path", &self.path)
            .field("options", &options)
            .finish()
    }
}

impl fmt::Display for LockUrl {
    /// The URL with `***` for the password. The user name is written as in the URL (still
    /// percent-encoded), so the text parses back and a decoded `%0A` cannot break a log line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The user part is what precedes the first ':' of the user information.
        let user = self
            .raw_userinfo
            .as_ref()
            .and_then(|info| info.expose().split(':').next())
            .unwrap_or("");
        let userinfo = match (&self.username, &self.password) {
            (_, Some(_)) => Some(format!("{user}:***")),
            (Some(_), None) => Some(user.to_owned()),
            (None, None) => None,
        };
        f.write_str(&self.render_with_tail(userinfo.as_deref(), &self.redacted_tail()))
    }
}

/// `url` fit for a log line or a report: the password replaced by `***` when the URL parses,
/// otherwise only its scheme (or nothing), since the rest may hold a password.
///
/// ```
/// use dlock_core::raw::url::redact;
/// assert_eq!(redact("mysql://dlock:pw@127.0.0.1/dlock"), "mysql://dlock:***@127.0.0.1:3306/dlock");
/// assert_eq!(redact("redis://u:pa/ss@h"), "redis://…");
/// ```
pub fn redact(url: &str) -> String {
    let default_port = scheme(url).and_then(|s| default_port(&s)).unwrap_or(0);
    match LockUrl::parse("dlock", url, &[], default_port) {
        Ok(parsed) if default_port != 0 || parsed.hosts.iter().all(|h| h.port != 0) => {
            parsed.to_string()
        }
        _ => match url.split_once("://") {
            Some((scheme, _)) if looks_like_a_scheme(scheme) => format!("{scheme}://…"),
            _ => "<not a URL>".to_owned(),
        },
    }
}

/// The default port of each networked scheme dlock knows, for [`redact`] and tools that
/// handle URLs of every backend.
pub fn default_port(scheme: &str) -> Option<u16> {
    Some(match scheme {
        "redis" | "rediss" | "redlock" | "redlocks" => 6379,
        "redis+cluster" | "rediss+cluster" => 6379,
        "redis+sentinel" | "rediss+sentinel" => 26379,
        "zk" | "zookeeper" | "zks" => 2181,
        "etcd" | "etcds" => 2379,
        "mysql" | "mariadb" => 3306,
        "postgres" | "postgresql" => 5432,
        _ => return None,
    })
}

/// The scheme of `url` in lower case, if it has one (`scheme://…`, the scheme made of a
/// letter then letters, digits, `+`, `-` or `.`). Safe to show: a scheme holds no password.
///
/// ```
/// use dlock_core::raw::url::scheme;
/// assert_eq!(scheme("ZK://h").as_deref(), Some("zk"));
/// assert_eq!(scheme("u:pw@h/?next=a://b"), None);
/// ```
pub fn scheme(url: &str) -> Option<String> {
    let (scheme, _) = url.split_once("://")?;
    looks_like_a_scheme(scheme).then(|| scheme.to_ascii_lowercase())
}

/// Whether `text` (the part before `://`) may be shown: a scheme cannot hold a password.
fn looks_like_a_scheme(text: &str) -> bool {
    text.len() <= 32
        && text.starts_with(|c: char| c.is_ascii_alphabetic())
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
}

/// The scheme in lower case when `schemes` allows it (any scheme when empty).
fn checked_scheme(backend: &'static str, scheme: &str, schemes: &[&str]) -> Result<String> {
    let lower = scheme.to_ascii_lowercase();
    if looks_like_a_scheme(scheme) && (schemes.is_empty() || schemes.contains(&lower.as_str())) {
        return Ok(lower);
    }
    let shown = if looks_like_a_scheme(scheme) {
        format!("{scheme:?}")
    } else {
        // Text before a later "://" may be credentials: show none of it.
        "of this URL".to_owned()
    };
    let known = schemes
        .iter()
        .map(|s| format!("{s}://"))
        .collect::<Vec<_>>()
        .join(", ");
    Err(LockError::invalid_config(
        backend,
        if known.is_empty() {
            format!("the scheme {shown} is not a scheme")
        } else {
            format!("the scheme {shown} is not one of {known}")
        },
    ))
}

fn decode(backend: &'static str, what: &str, text: &str) -> Result<String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| {
            LockError::invalid_config(
                backend,
                format!("{what} is not valid percent-encoded UTF-8"),
            )
        })
}

#[cfg(test)]
#[path = "url_tests.rs"]
mod tests;
