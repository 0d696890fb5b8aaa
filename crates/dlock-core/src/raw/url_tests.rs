//! Tests of `url.rs`.

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

#[test]
fn secret_options_are_hidden_like_the_password() {
    let text =
        "redis+sentinel://u:pw@s1:26379/m?sentinel_user=ops&sentinel_password=sek%2Frit&prefix=a";
    let url = LockUrl::parse("redis", text, &[], 26379).unwrap();
    assert_eq!(
        url.to_string(),
        "redis+sentinel://u:***@s1:26379/m?sentinel_user=ops&sentinel_password=***&prefix=a"
    );
    let debug = format!("{url:?}");
    assert!(!debug.contains("sek") && !debug.contains("pw"), "{debug}");
    assert!(debug.contains("sentinel_user"), "{debug}");
    assert_eq!(url.expose(), text);
    assert!(
        !super::redact(text).contains("sek"),
        "{}",
        super::redact(text)
    );
    // A name written with escapes is matched decoded.
    let escaped =
        LockUrl::parse("redis", "redis://h/?SENTINEL%5FPASSWORD=sekrit", &[], 6379).unwrap();
    assert!(!escaped.to_string().contains("sekrit"), "{escaped}");
    for name in [
        "sentinel_password",
        "client_secret",
        "auth_token",
        "PASSWORD",
    ] {
        assert!(super::is_secret_option(name), "{name}");
    }
    for name in ["prefix", "sentinel_user", "ca", "ttl"] {
        assert!(!super::is_secret_option(name), "{name}");
    }
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
