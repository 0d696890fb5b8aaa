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
/// `Debug` and `Display` never show the password (`Display` writes `***` in its place);
/// [`expose`](Self::expose) writes the whole URL back for a client that needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
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
        let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let hosts: Vec<String> = self.hosts.iter().map(Host::to_string).collect();
        format!(
            "{}://{userinfo}{}{}",
            self.scheme,
            hosts.join(","),
            self.raw_tail
        )
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
        f.write_str(&self.render(userinfo.as_deref()))
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
mod tests {
    use super::*;
    use crate::ErrorKind;

    const SCHEMES: &[&str] = &["redis", "rediss"];

    fn parse(url: &str) -> Result<LockUrl> {
        LockUrl::parse("test", url, SCHEMES, 6379)
    }

    #[test]
    fn good_urls_split_into_their_parts() {
        // (url, user, password, hosts, path, options)
        type Case = (
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            &'static [&'static str],
            &'static str,
            &'static [(&'static str, &'static str)],
        );
        let cases: &[Case] = &[
            ("redis://h", None, None, &["h:6379"], "", &[]),
            ("REDIS://h:1", None, None, &["h:1"], "", &[]),
            ("redis://", None, None, &[], "", &[]),
            (
                "redis://u:p%40ss@h/0",
                Some("u"),
                Some("p@ss"),
                &["h:6379"],
                "/0",
                &[],
            ),
            ("redis://:pw@h", None, Some("pw"), &["h:6379"], "", &[]),
            ("redis://u@h", Some("u"), None, &["h:6379"], "", &[]),
            ("redis://u:@h", Some("u"), Some(""), &["h:6379"], "", &[]),
            (
                "redis://u:p@ss@h",
                Some("u"),
                Some("p@ss"),
                &["h:6379"],
                "",
                &[],
            ),
            (
                "redis://u:p:s s@h",
                Some("u"),
                Some("p:s s"),
                &["h:6379"],
                "",
                &[],
            ),
            (
                "redis://u:%2F%3F%23@h",
                Some("u"),
                Some("/?#"),
                &["h:6379"],
                "",
                &[],
            ),
            (
                "redis://u:%C3%A9@h",
                Some("u"),
                Some("é"),
                &["h:6379"],
                "",
                &[],
            ),
            (
                "redis://a:1,b,[::1]:3",
                None,
                None,
                &["a:1", "b:6379", "[::1]:3"],
                "",
                &[],
            ),
            ("redis://[::1]", None, None, &["[::1]:6379"], "", &[]),
            ("redis://h/a%2Fb/c", None, None, &["h:6379"], "/a/b/c", &[]),
            (
                "redis://h?a=1&b=x+y&c&d=%26&&e=",
                None,
                None,
                &["h:6379"],
                "",
                &[("a", "1"), ("b", "x+y"), ("c", ""), ("d", "&"), ("e", "")],
            ),
            (
                "redis://h/?a=1",
                None,
                None,
                &["h:6379"],
                "/",
                &[("a", "1")],
            ),
        ];
        for (url, user, password, hosts, path, options) in cases {
            let got = parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(got.username(), *user, "{url}");
            assert_eq!(got.password().map(Secret::expose), *password, "{url}");
            let got_hosts: Vec<String> = got.hosts().iter().map(Host::to_string).collect();
            assert_eq!(got_hosts, *hosts, "{url}");
            assert_eq!(got.path(), *path, "{url}");
            let want: Vec<(String, String)> = options
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            assert_eq!(got.options(), want, "{url}");
        }
    }

    #[test]
    fn bad_urls_say_what_is_wrong_and_never_show_the_password() {
        let cases = [
            ("", "not a URL"),
            ("h:6379", "not a URL"),
            ("http://h", "\"http\" is not one of redis://, rediss://"),
            ("u:sekrit@h/x?cb=http://y", "scheme of this URL"),
            ("redis://h:0", "port"),
            ("redis://h:70000", "port"),
            ("redis://h:x", "port"),
            ("redis://h:+80", "port"),
            ("redis://h:-1", "port"),
            ("redis://h: 80", "port"),
            ("redis://u:sekrit@h:x", "port"),
            ("redis://a,,b", "no host name"),
            ("redis://h st", "host name"),
            ("redis://[::1", "closing"),
            ("redis://[nope]:1", "IPv6"),
            ("redis://[::1]x", "expected :port"),
            ("redis://h#frag", "fragment"),
            ("redis://u:sekrit/x@h", "'@' after its host list"),
            ("redis://u:sekrit?x@h", "'@' after its host list"),
            ("redis://u:sekrit#x@h", "'@' after its host list"),
            ("redis://u:1234/sekrit@h", "'@' after its host list"),
            ("redis://u:%FF@h", "password is not valid"),
            ("redis://%FF:sekrit@h", "user name is not valid"),
            ("redis://h/%FF", "path"),
            ("redis://h?%FF=1", "option name"),
            ("redis://h?a=%FF", "value of option \"a\""),
            // Found by fuzzing: the decoded name was shown as it is, control characters
            // and all.
            ("redis://h?%1F%0A=%FF", "value of option \"\\u{1f}\\n\""),
        ];
        for (url, needle) in cases {
            let err = parse(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}");
            let text = format!("{err} {err:?}");
            assert!(text.contains(needle), "{url}: {text}");
            assert!(!text.contains("sekrit"), "{url}: {text}");
            assert!(!err.to_string().contains(char::is_control), "{url}: {err}");
        }
    }

    #[test]
    fn display_and_debug_hide_the_password_and_expose_writes_it_back() {
        let url = parse("rediss://app:s%2Fekrit@a:1,[::1]:2/3?prefix=x%26y").unwrap();
        assert_eq!(
            url.to_string(),
            "rediss://app:***@a:1,[::1]:2/3?prefix=x%26y"
        );
        assert!(!format!("{url:?}").contains("ekrit"), "{url:?}");
        assert_eq!(
            url.expose(),
            "rediss://app:s%2Fekrit@a:1,[::1]:2/3?prefix=x%26y"
        );
        let moved = url.with_hosts(vec![Host::new("127.0.0.1", 9)]);
        assert_eq!(
            moved.expose(),
            "rediss://app:s%2Fekrit@127.0.0.1:9/3?prefix=x%26y"
        );
        assert_eq!(
            parse("redis://u@h").unwrap().to_string(),
            "redis://u@h:6379"
        );
    }

    /// Found by fuzzing (fuzz/fuzz_targets/url.rs): with a default port of 0 (memory://,
    /// and `redact` of an unknown scheme) `expose()` wrote `memory://n:0`, which is refused.
    #[test]
    fn a_url_without_a_default_port_writes_back_no_port() {
        for (url, written) in [
            ("y://n", "y://n"),
            ("memory://name", "memory://name"),
            ("memory://[::1]/", "memory://[::1]/"),
            ("x://a,b:1", "x://a,b:1"),
        ] {
            let parsed = LockUrl::parse("test", url, &[], 0).unwrap();
            assert_eq!(parsed.expose(), written, "{url}");
            assert_eq!(parsed.to_string(), written, "{url}");
            let again = LockUrl::parse("test", &parsed.expose(), &[], 0).unwrap();
            assert_eq!(again, parsed, "{url}");
        }
        assert_eq!(Host::new("h", 0).to_string(), "h");
        assert_eq!(Host::new("::1", 0).to_string(), "[::1]");
        assert_eq!(Host::new("::1", 1).to_string(), "[::1]:1");
    }

    /// Found by fuzzing (fuzz/fuzz_targets/url.rs): `Display` (and so `redact`) wrote the
    /// decoded user name, so `m://%3F:pw@` became `m://?:***@`, which does not parse, and
    /// `%0A` in a user name became a line break in a log line.
    #[test]
    fn display_writes_the_user_name_as_written() {
        for (url, written) in [
            ("m://%3F:pw@", "m://%3F:***@"),
            ("m://a%0Ab:pw@h:1", "m://a%0Ab:***@h:1"),
            ("m://a%2Fb@h:1", "m://a%2Fb@h:1"),
            ("m://a%40b%3Ac:p:w@h:1/x", "m://a%40b%3Ac:***@h:1/x"),
            ("m://:pw@h:1", "m://:***@h:1"),
            ("m://@h:1", "m://h:1"),
        ] {
            let parsed = LockUrl::parse("test", url, &[], 0).unwrap();
            assert_eq!(parsed.to_string(), written, "{url}");
            let again = LockUrl::parse("test", written, &[], 0).unwrap();
            assert_eq!(again.username(), parsed.username(), "{url}");
            assert_eq!(again.hosts(), parsed.hosts(), "{url}");
        }
        assert_eq!(redact("redis://a%0Ab:pw@h"), "redis://a%0Ab:***@h:6379");
    }

    /// Inputs the fuzzer found (`scripts/fuzz`, target `url`), a short one per branch of the
    /// parser, kept as written (`\u{fffd}` stands for bytes that were not UTF-8). `Zq9Xk`
    /// and `W7pQv` mark the passwords the target builds. Each must give the same answer as
    /// when it was found (the URL `expose()` writes back, or a word of the error) and keep
    /// the target's properties, with any scheme and a default port of 0 (as `redact` parses)
    /// and as a `redis://` URL: see [`check_properties`].
    #[test]
    fn the_fuzz_corpus_keeps_its_answers_and_properties() {
        let cases: &[(&str, std::result::Result<&str, &str>)] = &[
            ("memry://", Ok("memry://")),
            ("eTcd://h", Ok("etcd://h")),
            ("R1DIS://s@cra", Ok("r1dis://s@cra")),
            ("zk:///zk1", Ok("zk:///zk1")),
            ("zk://k/.", Ok("zk://k/.")),
            ("ri://jdi?%", Ok("ri://jdi?%")),
            ("Zk://zk1?sess&u", Ok("zk://zk1?sess&u")),
            ("mariadb://u,0m", Ok("mariadb://u,0m")),
            ("redlockS://pw@a,.pem", Ok("redlocks://pw@a,.pem")),
            ("etcd://e1:@3", Ok("etcd://e1:@3")),
            (
                "rEdlocks://:@wmql?ca=/ca.pem",
                Ok("redlocks://:@wmql?ca=/ca.pem"),
            ),
            ("etcds://alices%@h/y", Ok("etcds://alices%@h/y")),
            ("res://u:pw@[::1]:638", Ok("res://u:pw@[::1]:638")),
            (
                "zookeeper://[::1]/a/b?root=&/r",
                Ok("zookeeper://[::1]/a/b?root=&/r"),
            ),
            (
                "rediss://u:pw@1,zk181,zku/z&c",
                Ok("rediss://u:pw@1,zk181,zku/z&c"),
            ),
            ("Px://:Zq9XkW7pQvZq9Xk@", Ok("px://:Zq9XkW7pQvZq9Xk@")),
            ("r://ss:Zq9XkW7pQvZq9Xk@", Ok("r://ss:Zq9XkW7pQvZq9Xk@")),
            (
                "mysqL://[pe9,r2:7t@79,r2:7,836,r2:9,r2:7,8F",
                Ok("mysql://[pe9,r2:7t@79,r2:7,836,r2:9,r2:7,8F"),
            ),
            (
                "rss://u:p%@//u:p%\u{fffd}[\u{f}",
                Ok("rss://u:p%@//u:p%\u{fffd}[\u{f}"),
            ),
            (
                "etcds://ret\u{1}\0\0\0\0\0\0\u{b}@@h:1/?\u{b}a=/ca&oma",
                Ok("etcds://ret\u{1}\0\0\0\0\0\0\u{b}@@h:1/?\u{b}a=/ca&oma"),
            ),
            // The three property violations the fuzzer found, minimized.
            ("y://n", Ok("y://n")),
            ("m://%3F:Zq9XkW7pQvZq9Xk@", Ok("m://%3F:Zq9XkW7pQvZq9Xk@")),
            ("y://?%1F=%ca", Err("the value of option \"\\u{1f}\"")),
            ("?", Err("not a URL")),
            ("://", Err("the scheme of this URL")),
            ("Diss://h#fag", Err("fragment")),
            ("c://\u{14d}\u{fffd}\u{fffd}k", Err("letters, digits")),
            ("s://kz:@[:\n", Err("closing ']'")),
            ("d://u9pw@[::1]\u{1}mariadbl:", Err("expected :port")),
            ("r://:pm", Err("no host name")),
            ("iss://u:@[]y=/=re", Err("not an IPv6 address")),
            ("zk://zk1:l", Err("port")),
            ("rediss://upw@R:", Err("port")),
            ("r://h:+80", Err("port")),
            ("Zcds://?q?q@", Err("'@' after its host list")),
            (
                "REDIS://@://:Zq9XkW7pQvZq9Xk@",
                Err("'@' after its host list"),
            ),
            ("redsi://h?%FF", Err("the option name \"%FF\"")),
            (
                "ereds://aliceome:s%ca40che:tr@mr/",
                Err("the password is not"),
            ),
            ("i://aist@/%ca\u{fffd}", Err("the path")),
            ("spp://%F3%F:Zq9XkW7pQvpZq9Xk@", Err("the user name is not")),
        ];
        for (url, want) in cases {
            match (LockUrl::parse("test", url, &[], 0), want) {
                (Ok(parsed), Ok(exposed)) => assert_eq!(parsed.expose(), *exposed, "{url:?}"),
                (Err(e), Err(needle)) => assert!(e.to_string().contains(needle), "{url:?}: {e}"),
                (got, _) => panic!("{url:?}: {got:?}, expected {want:?}"),
            }
            check_properties(url, &[], 0);
            check_properties(url, SCHEMES, 6379);
        }
    }

    /// The properties the fuzz target `url` asserts of `LockUrl::parse` and `redact`.
    fn check_properties(url: &str, schemes: &[&str], default_port: u16) {
        let mut shown = vec![redact(url)];
        assert_eq!(redact(&shown[0]), shown[0], "{url:?}: redact is idempotent");
        match LockUrl::parse("test", url, schemes, default_port) {
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url:?}");
                assert!(!e.to_string().contains(char::is_control), "{url:?}: {e}");
                shown.push(format!("{e} {e:?}"));
            }
            Ok(parsed) => {
                let exposed = parsed.expose();
                let again = LockUrl::parse("test", &exposed, schemes, default_port)
                    .unwrap_or_else(|e| panic!("{url:?}: {exposed:?} does not parse: {e}"));
                assert_eq!(again, parsed, "{url:?}: expose() parses back");
                let written = parsed.to_string();
                let again = LockUrl::parse("test", &written, schemes, default_port)
                    .unwrap_or_else(|e| panic!("{url:?}: {written:?} does not parse: {e}"));
                assert_eq!(again.username(), parsed.username(), "{written:?}");
                assert_eq!(
                    again.password().map(Secret::expose),
                    parsed.password().map(|_| "***"),
                    "{written:?}"
                );
                assert_eq!(again.hosts(), parsed.hosts(), "{written:?}");
                assert_eq!(again.path(), parsed.path(), "{written:?}");
                assert_eq!(again.options(), parsed.options(), "{written:?}");
                shown.push(format!("{parsed:?} {parsed}"));
            }
        }
        if url.contains("Zq9Xk") {
            for text in shown {
                assert!(
                    !text.contains("Zq9Xk") && !text.contains("W7pQv"),
                    "{url:?}: {text}"
                );
            }
        }
    }

    #[test]
    fn redact_shows_no_password_even_of_urls_that_do_not_parse() {
        for (url, want) in [
            ("redis://u:sekrit@h", "redis://u:***@h:6379"),
            ("etcd://h", "etcd://h:2379"),
            ("redis://u:sekrit/x@h", "redis://…"),
            ("unknown://u:sekrit@h", "unknown://…"),
            ("u:sekrit@h", "<not a URL>"),
            ("u:sekrit@h/?x=a://b", "<not a URL>"),
            ("memory://name", "memory://…"),
        ] {
            assert_eq!(redact(url), want, "{url}");
        }
    }
}
