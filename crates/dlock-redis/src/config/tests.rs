//! `redis://` and `rediss://` URLs and hand-built configs: what they parse to, what they
//! refuse (before any I/O), and that no password shows in an error or in `Debug`.

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
    assert_refused(&cases);
}

/// Each URL is refused as invalid config, the error naming its needle and never a password
/// (every password in these tables contains `sekrit`).
pub(super) fn assert_refused(cases: &[(&str, &str)]) {
    for &(url, needle) in cases {
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
