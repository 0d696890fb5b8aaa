//! One table of URLs every backend's parser must handle alike: hostile passwords never show
//! in an error or in the config's `Debug`, the scheme's case does not matter, and every
//! refusal is [`ErrorKind::InvalidConfig`].
//!
//! Each backend calls [`check_parser`] from a unit test of its `config.rs`:
//!
//! ```no_run
//! # fn from_url(_: &str) -> dlock_core::Result<()> { Ok(()) }
//! dlock_conformance::urls::check_parser(
//!     |password, host| format!("redis://app:{password}@{host}/0"),
//!     |url| from_url(url).map(|config| format!("{config:?}")),
//! );
//! ```

use dlock_core::{ErrorKind, LockError};

/// Two halves of every test password. A password that leaks, whole or cut at one of its
/// reserved characters, shows at least one of them.
const MARKS: [&str; 2] = ["Zq9Xk", "W7pQv"];

/// Characters that must be percent-encoded in a password, and others a parser may trip on.
const RESERVED: &[&str] = &[
    "/", "?", "#", "@", ":", "[", "]", "%", "&", "=", "+", ",", ";", " ", "\\", "\"", "'", "`",
    "<", ">", "{", "}", "|", "^", "$", "*", "!", "~", "é", "密", "🔒", "\u{0}", "\n", "\t",
];

/// Hosts to put after the user information: each a parser must take, or refuse cleanly.
const HOSTS: &[&str] = &[
    "127.0.0.1",
    "localhost",
    "[::1]",
    "[::1",
    "h st",
    "",
    "a,,b",
];

/// Check a backend's URL parser against the shared table.
///
/// `url(password, host)` builds a URL of the backend with `password` in its user
/// information (the text as given: sometimes percent-encoded, sometimes raw) and `host`
/// (`host` or `[v6]`, no port) as its only server, or every server. `parse(url)` parses it
/// and returns the config's `Debug` text.
///
/// # Panics
/// When a password shows in an error or a `Debug` text, a refusal is not `InvalidConfig`,
/// or a URL with an upper-case scheme is treated differently from its lower-case twin.
pub fn check_parser(
    url: impl Fn(&str, &str) -> String,
    parse: impl Fn(&str) -> Result<String, LockError>,
) {
    let mut checked = 0;
    for reserved in RESERVED {
        let password = format!("{}{reserved}{}", MARKS[0], MARKS[1]);
        let encoded = percent_encode(&password);
        for host in HOSTS {
            for written in [password.as_str(), encoded.as_str()] {
                let url = url(written, host);
                let shown = match parse(&url) {
                    Ok(debug) => debug,
                    Err(e) => {
                        assert_eq!(
                            e.kind(),
                            ErrorKind::InvalidConfig,
                            "a refused URL is InvalidConfig: {e}"
                        );
                        format!("{e} {e:?}")
                    }
                };
                for mark in MARKS {
                    assert!(
                        !shown.contains(mark),
                        "password {password:?} written {written:?} with host {host:?} shows in: {shown}"
                    );
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, RESERVED.len() * HOSTS.len() * 2);

    // The scheme's case does not matter.
    let plain = url(&format!("{}{}", MARKS[0], MARKS[1]), "127.0.0.1");
    let (scheme, rest) = plain
        .split_once("://")
        .expect("url() builds scheme://… URLs");
    let upper = format!("{}://{rest}", scheme.to_ascii_uppercase());
    match (parse(&plain), parse(&upper)) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "{upper} parses as {plain} does"),
        (Err(a), Err(b)) => assert_eq!(
            a.to_string(),
            b.to_string(),
            "{upper} fails as {plain} does"
        ),
        (a, b) => panic!("{plain} gives {a:?} but {upper} gives {b:?}"),
    }
}

/// Every byte outside `[A-Za-z0-9-._~]` as `%XX`.
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parser that echoes the URL in its errors is caught.
    #[test]
    #[should_panic(expected = "shows in")]
    fn a_parser_that_echoes_the_url_is_caught() {
        check_parser(
            |password, host| format!("x://u:{password}@{host}"),
            |url| Err(LockError::invalid_config("x", format!("bad URL {url}"))),
        );
    }

    /// A parser that treats the scheme's case as meaningful is caught.
    #[test]
    #[should_panic(expected = "gives")]
    fn a_case_sensitive_scheme_is_caught() {
        check_parser(
            |password, host| format!("x://u:{password}@{host}"),
            |url| {
                if url.starts_with("x://") {
                    Ok("config".into())
                } else {
                    Err(LockError::invalid_config("x", "unknown scheme"))
                }
            },
        );
    }

    /// The core URL layer itself passes.
    #[test]
    fn the_core_url_layer_passes() {
        check_parser(
            |password, host| format!("redis://u:{password}@{host}:6379/0?prefix=p"),
            |url| {
                dlock_core::raw::url::LockUrl::parse("redis", url, &["redis"], 6379)
                    .map(|u| format!("{u:?} {u}"))
            },
        );
    }
}
