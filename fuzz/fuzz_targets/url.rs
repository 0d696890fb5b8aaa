//! Every URL parser of dlock on the same input: `LockUrl::parse` (with each backend's
//! schemes and default port), `redact`, every backend config's `from_url`, and the facade's
//! `Scheme::parse`.
//!
//! The input is used twice:
//!
//! 1. as the URL itself;
//! 2. split at its first four `\n` into `scheme`, `user`, `a`, `b` and `rest`, as the URL
//!    `{scheme}://{user}:Zq9Xk{a}W7pQv{b}Zq9Xk@{rest}`, whose password carries two markers.
//!
//! Properties, for both:
//!
//! - no parser panics, and every refusal is `InvalidConfig`;
//! - an error's text has no control character (a decoded name or value is shown quoted);
//! - for the marked URL, neither marker shows in any error (`Display` or `Debug`), any
//!   config's `Debug`, any `LockUrl`'s `Debug` or `Display`, or `redact`'s output (unless the
//!   scheme, user or rest spell a marker themselves, raw or percent-encoded);
//! - a parsed `LockUrl` is in lower case scheme, one of its backend's schemes, and
//!   `expose()` parses back to an equal value; `Display` parses back to the same user, hosts,
//!   path and options, with `***` for the password;
//! - `redact` is idempotent, and adds no control character to a URL that had none;
//! - the scheme's case does not matter to any parser;
//! - a backend that takes the URL is the backend `dlock::Scheme::parse` names.

#![no_main]

use std::fmt::Debug;

use dlock::Scheme;
use dlock_core::raw::url::{self, LockUrl};
use dlock_core::{ErrorKind, LockError, Result};
use libfuzzer_sys::fuzz_target;
use percent_encoding::percent_decode_str;

/// The two markers of the password.
const MARKS: [&str; 2] = ["Zq9Xk", "W7pQv"];

/// Each backend's name, schemes and default port, as its `from_url` calls `LockUrl::parse`.
const BACKENDS: &[(&str, &[&str], u16)] = &[
    ("memory", dlock_memory::SCHEMES, 0),
    ("redis", dlock_redis::SCHEMES, 6379),
    ("redlock", dlock_redlock::SCHEMES, 6379),
    ("etcd", dlock_etcd::SCHEMES, 2379),
    ("zookeeper", dlock_zookeeper::SCHEMES, 2181),
    ("mysql", dlock_mysql::SCHEMES, 3306),
    ("dlock", &[], 0),
];

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    check(&text, false);
    let mut parts = text.splitn(5, '\n');
    let mut part = || parts.next().unwrap_or("");
    let (scheme, user, a, b, rest) = (part(), part(), part(), part(), part());
    let marked = format!(
        "{scheme}://{user}:{m0}{a}{m1}{b}{m0}@{rest}",
        m0 = MARKS[0],
        m1 = MARKS[1]
    );
    let others = format!("{scheme}\n{user}\n{rest}");
    let decoded = percent_decode_str(&others).decode_utf8_lossy();
    let spelled = MARKS
        .iter()
        .any(|m| others.contains(m) || decoded.contains(m));
    check(&marked, !spelled);
});

/// Run every parser on `url`; with `secret`, no output may show a marker.
fn check(url: &str, secret: bool) {
    let mut shown = Vec::new();
    for &(backend, schemes, port) in BACKENDS {
        match LockUrl::parse(backend, url, schemes, port) {
            Ok(parsed) => {
                check_lock_url(backend, schemes, port, &parsed);
                shown.push(format!("{parsed:?} {parsed}"));
            }
            Err(e) => shown.push(refusal(url, &e)),
        }
    }

    let redacted = url::redact(url);
    assert_eq!(
        url::redact(&redacted),
        redacted,
        "redact({url:?}) is idempotent"
    );
    if !url.contains(char::is_control) {
        assert!(
            !redacted.contains(char::is_control),
            "redact({url:?}) adds a control character: {redacted:?}"
        );
    }
    shown.push(redacted);

    let backends = backend_results(url);
    if let Some(lowered) = lower_scheme(url) {
        // Errors may quote the scheme as written, so only compare what was taken.
        let taken = |results: &[(Scheme, std::result::Result<String, String>)]| {
            results
                .iter()
                .map(|(_, r)| r.as_ref().ok().cloned())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            taken(&backends),
            taken(&backend_results(&lowered)),
            "{url:?} parses as {lowered:?} does"
        );
    }
    let scheme = Scheme::parse(url);
    if let Err(e) = &scheme {
        shown.push(refusal(url, e));
    }
    for (backend, result) in &backends {
        match result {
            Ok(debug) => {
                assert_eq!(
                    scheme.as_ref().ok(),
                    Some(backend),
                    "{url:?} parses as {backend:?}, so Scheme::parse names it"
                );
                shown.push(debug.clone());
            }
            Err(text) => shown.push(text.clone()),
        }
    }

    if secret {
        for text in &shown {
            for mark in MARKS {
                assert!(
                    !text.contains(mark),
                    "the password of {url:?} shows in: {text}"
                );
            }
        }
    }
}

/// Every backend's `from_url`: the config's `Debug`, or the error's text.
fn backend_results(url: &str) -> Vec<(Scheme, std::result::Result<String, String>)> {
    vec![
        (Scheme::Memory, shown(url, dlock_memory::from_url(url))),
        (
            Scheme::Redis,
            shown(url, dlock_redis::RedisConfig::from_url(url)),
        ),
        (
            Scheme::Redlock,
            shown(url, dlock_redlock::RedlockConfig::from_url(url)),
        ),
        (
            Scheme::Etcd,
            shown(url, dlock_etcd::EtcdConfig::from_url(url)),
        ),
        (
            Scheme::ZooKeeper,
            shown(url, dlock_zookeeper::ZookeeperConfig::from_url(url)),
        ),
        (
            Scheme::MySql,
            shown(url, dlock_mysql::MysqlConfig::from_url(url)),
        ),
    ]
}

fn shown<T: Debug>(url: &str, result: Result<T>) -> std::result::Result<String, String> {
    match result {
        Ok(config) => Ok(format!("{config:?}")),
        Err(e) => Err(refusal(url, &e)),
    }
}

/// The text of a refusal, after checking it is `InvalidConfig` and its message is clean.
fn refusal(url: &str, e: &LockError) -> String {
    assert_eq!(e.kind(), ErrorKind::InvalidConfig, "{url:?}: {e}");
    let text = e.to_string();
    assert!(
        !text.contains(char::is_control),
        "the error for {url:?} holds a control character: {text:?}"
    );
    format!("{text} {e:?}")
}

/// `url` with its scheme in lower case, when it has one and it is not already.
fn lower_scheme(url: &str) -> Option<String> {
    let scheme = url::scheme(url)?;
    let (written, rest) = url.split_once("://")?;
    (written != scheme).then(|| format!("{scheme}://{rest}"))
}

fn check_lock_url(backend: &'static str, schemes: &[&str], port: u16, parsed: &LockUrl) {
    assert!(
        schemes.is_empty() || schemes.contains(&parsed.scheme()),
        "{parsed}: scheme"
    );
    assert_eq!(
        parsed.scheme(),
        parsed.scheme().to_ascii_lowercase(),
        "{parsed}: lower case"
    );
    if port != 0 {
        assert!(parsed.hosts().iter().all(|h| h.port != 0), "{parsed}: port");
    }

    let exposed = parsed.expose();
    let again = LockUrl::parse(backend, &exposed, schemes, port)
        .unwrap_or_else(|e| panic!("expose() of {parsed} does not parse: {e}"));
    assert_eq!(&again, parsed, "expose() of {parsed} parses back");
    assert_eq!(again.expose(), exposed);

    let written = parsed.to_string();
    let again = LockUrl::parse(backend, &written, schemes, port)
        .unwrap_or_else(|e| panic!("Display of {parsed:?} does not parse: {e}"));
    assert_eq!(again.username(), parsed.username(), "{written}: user");
    assert_eq!(
        again.password().map(|p| p.expose().to_owned()),
        parsed.password().map(|_| "***".to_owned()),
        "{written}: password"
    );
    assert_eq!(again.hosts(), parsed.hosts(), "{written}: hosts");
    assert_eq!(again.path(), parsed.path(), "{written}: path");
    assert_eq!(again.options(), parsed.options(), "{written}: options");
}
