//! `redis+sentinel://` and `redis+cluster://` URLs: what they parse to, what they refuse
//! (before any I/O), and that no credential shows in an error or in `Debug`.

use std::time::Duration;

use super::*;

fn hosts(list: &[(&str, u16)]) -> Vec<Host> {
    list.iter().map(|(h, p)| Host::new(*h, *p)).collect()
}

#[test]
fn sentinel_urls() {
    let config = RedisConfig::from_url(
        "redis+sentinel://dlock:dlock%40secret@10.0.0.1:26391,10.0.0.2,[::1]:26393/my-master\
         ?prefix=app:&sentinel_user=watcher&sentinel_password=s3ntinel-pw&response_timeout=1s",
    )
    .unwrap();
    assert_eq!(
        config,
        RedisConfig {
            username: Some("dlock".into()),
            password: Some("dlock@secret".into()),
            prefix: "app:".into(),
            response_timeout: Duration::from_secs(1),
            topology: Topology::Sentinel(SentinelConfig {
                master: "my-master".into(),
                sentinels: hosts(&[("10.0.0.1", 26391), ("10.0.0.2", 26379), ("::1", 26393)]),
                username: Some("watcher".into()),
                password: Some("s3ntinel-pw".into()),
            }),
            ..RedisConfig::new("10.0.0.1", 26391)
        }
    );
    let tls = RedisConfig::from_url("rediss+sentinel://h:26379/m/?ca=/ca.pem").unwrap();
    assert!(tls.tls);
    assert_eq!(tls.ca, Some("/ca.pem".into()));
    let Topology::Sentinel(sentinel) = tls.topology else {
        panic!("not a Sentinel config")
    };
    assert_eq!(sentinel.master, "m");
    assert_eq!((sentinel.username, sentinel.password), (None, None));
}

#[test]
fn cluster_urls() {
    let config =
        RedisConfig::from_url("REDIS+CLUSTER://u:p@127.0.0.1:7101,127.0.0.1:7102/?prefix=x:")
            .unwrap();
    assert_eq!(
        config,
        RedisConfig {
            username: Some("u".into()),
            password: Some("p".into()),
            prefix: "x:".into(),
            topology: Topology::Cluster {
                seeds: hosts(&[("127.0.0.1", 7101), ("127.0.0.1", 7102)]),
            },
            ..RedisConfig::new("127.0.0.1", 7101)
        }
    );
    let tls = RedisConfig::from_url("rediss+cluster://node-a?cert=c.pem&key=k.pem").unwrap();
    assert!(tls.tls);
    assert_eq!(
        tls.topology,
        Topology::Cluster {
            seeds: hosts(&[("node-a", 6379)])
        }
    );
}

#[test]
fn bad_topology_urls_are_invalid_config_without_any_password() {
    let cases = [
        ("redis+sentinel://u:sekrit-pw@h:26379", "names the master"),
        ("redis+sentinel://u:sekrit-pw@h:26379/", "names the master"),
        (
            "redis+sentinel://u:sekrit-pw@h:26379/a/b",
            "names the master",
        ),
        ("redis+sentinel://u:sekrit-pw@/m", "no server"),
        ("redis+sentinel://u:sekrit-pw@h:port/m", "port"),
        ("redis+sentinel://u:sekrit-pw@h:0/m", "port"),
        ("redis+sentinel://h/m?bogus=1", "unknown option \"bogus\""),
        (
            "redis+sentinel://h/m?sentinel_password=sekrit-pw&bogus=1",
            "unknown option \"bogus\"",
        ),
        ("redis+sentinel://h/m?ca=/ca.pem", "option ca is for TLS"),
        ("redis+cluster://u:sekrit-pw@", "no server"),
        ("redis+cluster://u:sekrit-pw@a:1,b:x", "port"),
        ("redis+cluster://u:sekrit-pw@a:1/3", "no path"),
        (
            "redis+cluster://a:1?sentinel_user=x",
            "option sentinel_user is for",
        ),
        (
            "redis+cluster://a:1?sentinel_password=sekrit-pw",
            "option sentinel_password is for",
        ),
        ("redis://a:1?sentinel_user=x", "option sentinel_user is for"),
        ("redis+cluster://a:1?response_timeout=0ms", "out of range"),
        ("redis+redlock://a:1", "scheme"),
        ("redis://u:sekrit-pw@a:1,b:2", "redis+cluster://"),
    ];
    crate::config::tests::assert_refused(&cases);
}

#[test]
fn debug_hides_both_passwords() {
    let config = RedisConfig::from_url(
        "redis+sentinel://u:data-sekrit@h:26379/m?sentinel_password=sentinel-sekrit",
    )
    .unwrap();
    let text = format!("{config:?}");
    assert!(!text.contains("sekrit"), "{text}");
    assert!(text.contains("redacted"), "{text}");
}

#[test]
fn a_cluster_config_built_by_hand_is_validated() {
    let config = RedisConfig {
        db: 2,
        topology: Topology::Cluster {
            seeds: hosts(&[("a", 1)]),
        },
        ..RedisConfig::new("a", 1)
    };
    let err = config.validate().unwrap_err();
    assert!(err.to_string().contains("one database"), "{err}");
    let none = RedisConfig {
        topology: Topology::Cluster { seeds: Vec::new() },
        ..RedisConfig::new("a", 1)
    };
    assert!(none.validate().is_err());
    let nameless = RedisConfig {
        topology: Topology::Sentinel(SentinelConfig {
            master: String::new(),
            sentinels: hosts(&[("a", 1)]),
            username: None,
            password: None,
        }),
        ..RedisConfig::new("a", 1)
    };
    assert!(nameless.validate().is_err());
}

#[test]
fn the_address_map_redirects_announced_addresses() {
    let config = RedisConfig {
        address_map: vec![(Host::new("10.0.0.5", 6379), Host::new("127.0.0.1", 16379))],
        ..RedisConfig::new("a", 1)
    };
    assert_eq!(config.dial("10.0.0.5", 6379), ("127.0.0.1".into(), 16379));
    assert_eq!(config.dial("10.0.0.5", 6380), ("10.0.0.5".into(), 6380));
}

#[test]
fn the_shared_url_tables_pass() {
    dlock_conformance::urls::check_parser(
        |password, host| format!("redis+sentinel://app:{password}@{host}:26379/mymaster"),
        |url| RedisConfig::from_url(url).map(|c| format!("{c:?}")),
    );
    dlock_conformance::urls::check_parser(
        |password, host| format!("redis+cluster://app:{password}@{host}:7000,{host}:7001"),
        |url| RedisConfig::from_url(url).map(|c| format!("{c:?}")),
    );
}
