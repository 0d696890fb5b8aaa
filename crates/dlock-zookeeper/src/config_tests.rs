//! Tests of `config.rs`.

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
fn segments_decode_back_to_their_keys() {
    let long = "k".repeat(1000);
    let long_accents = "\u{e9}".repeat(200);
    for key in [
        "orders/42",
        "..",
        ".",
        "%2E%2E",
        "a%b",
        "a%25b",
        "\u{e9}t\u{e9} 2026",
        "_c_x-lock-",
        "%%",
        "\u{1F512}",
    ] {
        let segment = key_segment(key);
        assert_eq!(
            parse_segment(&segment),
            Some(Segment::Key(key.to_owned())),
            "{key:?} -> {segment}"
        );
    }
    for key in [long.as_str(), long_accents.as_str()] {
        let segment = key_segment(key);
        let Some(Segment::Shortened(head)) = parse_segment(&segment) else {
            panic!("{key:?} -> {segment}: a shortened segment");
        };
        assert!(head.len() >= 50, "a readable head: {segment}");
        assert!(key.as_bytes().starts_with(&head), "{key:?} -> {segment}");
    }
    // Names dlock never makes: not keys.
    for name in [
        "a/b",
        "%2e",
        "%2",
        "%ZZ",
        "...",
        "%C3",
        "a b",
        "abc%%0123",
        "locks%%nothex",
    ] {
        assert_eq!(parse_segment(name), None, "{name:?}");
    }
}

#[test]
fn the_shared_url_table_passes() {
    dlock_conformance::urls::check_parser(
        |password, host| format!("zk://app:{password}@{host}:2181/chroot"),
        |url| ZookeeperConfig::from_url(url).map(|c| format!("{c:?}")),
    );
}

#[test]
fn auth_sasl_moves_the_credentials_to_sasl() {
    let c = ZookeeperConfig::from_url("zk://app:pw@a?auth=sasl").unwrap();
    assert_eq!(c.digest, None);
    let sasl = c.sasl.as_ref().expect("SASL credentials");
    assert_eq!((sasl.user(), sasl.password().expose()), ("app", "pw"));
    assert_eq!(
        crate::auth::acl_identity(&c),
        Some(("sasl", "app".to_owned()))
    );
    let shown = format!("{c:?}");
    assert!(
        !shown.contains("pw") && shown.contains("<redacted>"),
        "{shown}"
    );
    assert_eq!(c.validate().is_ok(), cfg!(feature = "sasl"));

    let digest = ZookeeperConfig::from_url("zk://app:pw@a?auth=digest").unwrap();
    assert!(digest.digest.is_some() && digest.sasl.is_none());
    let back = c.clone().with_option("auth", "digest").unwrap();
    assert_eq!(back.digest.as_ref().map(Digest::user), Some("app"));
    assert_eq!(back.sasl, None);

    let coded = ZookeeperConfig::new(["a"])
        .unwrap()
        .with_digest("x", "y")
        .unwrap()
        .with_sasl("app", "pw")
        .unwrap();
    assert_eq!(
        (coded.digest.is_none(), coded.sasl.as_ref().map(Sasl::user)),
        (true, Some("app"))
    );
}

#[test]
fn bad_auth_options_are_refused_before_any_io() {
    for (url, why) in [
        ("zk://a?auth=sasl", "needs credentials"),
        ("zk://a?auth=digest", "needs credentials"),
        ("zk://app:pw@a?auth=gssapi", "not supported"),
        ("zk://app:pw@a?auth=kerberos", "not supported"),
        ("zk://app:pw@a?auth=plain", "unknown scheme"),
        ("zk://a%40realm:pw@a?auth=sasl", "'@'"),
        ("zk://svc%2Fhost:pw@a?auth=sasl", "'/'"),
    ] {
        let err = ZookeeperConfig::from_url(url).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}");
        assert!(err.to_string().contains(why), "{url}: {err}");
        assert!(!format!("{err} {err:?}").contains(":pw"), "{url}: {err:?}");
    }
    let mut both = ZookeeperConfig::new(["a"])
        .unwrap()
        .with_sasl("app", "pw")
        .unwrap();
    both.digest = Some(Digest::new("app", "pw").unwrap());
    let err = both.validate().unwrap_err();
    assert!(err.to_string().contains("exclude each other"), "{err}");
    for (user, password, why) in [
        ("", "pw", "user name"),
        ("a:b", "pw", "':'"),
        ("app", "", "password"),
    ] {
        let err = Sasl::new(user, password).unwrap_err();
        assert!(err.to_string().contains(why), "{user}: {err}");
    }
}

#[test]
fn curator_names_the_recipe_exclusive_holds_exclude() {
    let default = ZookeeperConfig::from_url("zk://a").unwrap();
    assert_eq!(default.curator, CuratorRecipe::Mutex);
    for (url, recipe) in [
        ("zk://a?curator=mutex", CuratorRecipe::Mutex),
        (
            "zk://a?curator=read_write_lock",
            CuratorRecipe::ReadWriteLock,
        ),
    ] {
        assert_eq!(
            ZookeeperConfig::from_url(url).unwrap().curator,
            recipe,
            "{url}"
        );
    }
    let from_code = ZookeeperConfig::new(["a"])
        .unwrap()
        .with_option("curator", "read_write_lock")
        .unwrap();
    assert_eq!(from_code.curator, CuratorRecipe::ReadWriteLock);
    for bad in ["", "writ", "Mutex", "read-write-lock", "rw"] {
        let err = ZookeeperConfig::from_url(&format!("zk://a?curator={bad}")).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{bad:?}");
        assert!(
            err.to_string().contains("mutex or read_write_lock"),
            "{bad:?}: {err}"
        );
    }
}
