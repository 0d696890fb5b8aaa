//! Which cluster answers prove that a request did not run (and may be sent again), and
//! how a script's `EVALSHA` becomes an `EVAL`.

use super::cluster::{Resend, as_eval, asked_node, classify};
use crate::scripts;

/// The error a node's answer `line` (a RESP error, without `-` and CRLF) makes.
fn answer(line: &str) -> redis::RedisError {
    let value = redis::parse_redis_value(format!("-{line}\r\n").as_bytes()).expect("a RESP error");
    value.extract_error().expect_err("an error answer")
}

#[test]
fn only_answers_that_prove_nothing_ran_are_sent_again() {
    for line in [
        "MOVED 3999 127.0.0.1:7102",
        "TRYAGAIN Multiple keys request during rehashing of slot",
        "CLUSTERDOWN The cluster is down",
        "CLUSTERDOWN Hash slot not served",
        "MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'.",
        "LOADING Redis is loading the dataset in memory",
    ] {
        assert_eq!(classify(&answer(line)), Resend::AfterPause, "{line}");
    }
    let none = redis::RedisError::from((
        redis::ErrorKind::ClusterConnectionNotFound,
        "No connections found",
    ));
    assert_eq!(classify(&none), Resend::AfterPause);
    assert_eq!(
        classify(&answer("ASK 3999 127.0.0.1:7103")),
        Resend::ToAsked
    );
    assert_eq!(
        classify(&answer("NOSCRIPT No matching script. Please use EVAL.")),
        Resend::AsEval
    );
    // The request may have run: an I/O error after sending, a timeout. Or it failed for
    // good. Never sent again.
    for kind in [
        std::io::ErrorKind::ConnectionReset,
        std::io::ErrorKind::BrokenPipe,
        std::io::ErrorKind::TimedOut,
        std::io::ErrorKind::UnexpectedEof,
    ] {
        let e = redis::RedisError::from(std::io::Error::from(kind));
        assert_eq!(classify(&e), Resend::Never, "{kind:?}");
    }
    for line in [
        "ERR Error running script",
        "READONLY You can't write against a read only replica.",
        "BUSY Redis is busy running a script",
        "NOPERM this user has no permissions",
        "CROSSSLOT Keys in request don't hash to the same slot",
    ] {
        assert_eq!(classify(&answer(line)), Resend::Never, "{line}");
    }
}

#[test]
fn an_evalsha_of_our_script_becomes_its_eval_with_the_same_arguments() {
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha
        .arg(scripts::RELEASE.get_hash())
        .arg(2)
        .arg("dlock:k")
        .arg("{dlock:k}:fence")
        .arg("token")
        .arg("1");
    let eval = as_eval(&evalsha).expect("our script");
    let args: Vec<Vec<u8>> = eval
        .args_iter()
        .map(|arg| match arg {
            redis::Arg::Simple(arg) => arg.to_vec(),
            _ => panic!("a cursor argument"),
        })
        .collect();
    assert_eq!(args[0], b"EVAL");
    assert_eq!(
        args[1],
        scripts::source_of(scripts::RELEASE.get_hash())
            .expect("known")
            .as_bytes()
    );
    let rest: Vec<&[u8]> = args[2..].iter().map(Vec::as_slice).collect();
    assert_eq!(
        rest,
        [&b"2"[..], b"dlock:k", b"{dlock:k}:fence", b"token", b"1"]
    );
    // Another script, or another command: left alone.
    let mut unknown = redis::cmd("EVALSHA");
    unknown.arg("0".repeat(40)).arg(1).arg("k");
    assert!(as_eval(&unknown).is_none());
    assert!(as_eval(redis::cmd("GET").arg("k")).is_none());
}

#[test]
fn every_script_is_known_by_its_hash() {
    for source in scripts::SOURCES {
        let hash = redis::Script::new(source).get_hash().to_owned();
        assert_eq!(scripts::source_of(&hash), Some(source));
        assert_eq!(scripts::source_of(&hash.to_ascii_uppercase()), Some(source));
    }
}

#[test]
fn a_redirection_left_after_the_resends_is_unavailable() {
    use std::time::Duration;
    let addr: std::sync::Arc<str> = std::sync::Arc::from("cluster 127.0.0.1:7101");
    for line in ["MOVED 3999 127.0.0.1:7102", "ASK 3999 127.0.0.1:7103"] {
        let left = super::cluster::still_redirected(answer(line), Duration::from_secs(2));
        let e = crate::error::Error::redis("acquire", &addr, left);
        assert!(e.is_unavailable(), "{e}");
        assert!(e.to_string().contains("still redirected"), "{e}");
    }
    // Other answers stay as they are (they map to unavailable themselves).
    let down = super::cluster::still_redirected(
        answer("CLUSTERDOWN The cluster is down"),
        Duration::from_secs(2),
    );
    assert_eq!(classify(&down), Resend::AfterPause);
    assert!(crate::error::Error::redis("acquire", &addr, down).is_unavailable());
    let none = redis::RedisError::from((
        redis::ErrorKind::ClusterConnectionNotFound,
        "No connections found",
    ));
    assert!(crate::error::Error::redis("acquire", &addr, none).is_unavailable());
}

#[test]
fn an_ask_answer_names_the_node_to_ask() {
    use redis::cluster_routing::SingleNodeRoutingInfo;
    let node = asked_node(&answer("ASK 3999 127.0.0.1:7103")).expect("a node");
    assert!(
        matches!(&node, SingleNodeRoutingInfo::ByAddress { host, port: 7103 } if host == "127.0.0.1"),
        "{node:?}"
    );
    let node = asked_node(&answer("ASK 3999 [::1]:7103")).expect("a node");
    assert!(
        matches!(&node, SingleNodeRoutingInfo::ByAddress { host, port: 7103 } if host == "::1"),
        "{node:?}"
    );
    assert!(asked_node(&answer("MOVED 3999 127.0.0.1:7103")).is_some());
    assert!(asked_node(&answer("TRYAGAIN Multiple keys")).is_none());
}
