//! `dlock status` and `dlock list` against a real backend, across processes.

use super::*;

/// `dlock status --url URL --key KEY FLAGS…`: its stdout, after checking it exited 0.
pub(super) fn status(url: &str, key: &str, flags: &[&str]) -> String {
    let out = Command::new(DLOCK)
        .args(["status", "--url", url, "--key", key])
        .args(flags)
        .output()
        .expect("run dlock status");
    assert!(out.status.success(), "dlock status: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// `dlock status` lines until `done` accepts them (at most 20 s): a waiter takes a moment
/// to connect and queue.
pub(super) fn status_until(url: &str, key: &str, done: impl Fn(&[&str]) -> bool) -> String {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let text = status(url, key, &[]);
        if done(&text.lines().collect::<Vec<_>>()) || Instant::now() >= until {
            return text;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `dlock list --url URL --prefix PREFIX FLAGS…`, to completion.
pub(super) fn list(url: &str, prefix: &str, flags: &[&str]) -> Output {
    Command::new(DLOCK)
        .args(["list", "--url", url, "--prefix", prefix])
        .args(flags)
        .output()
        .expect("run dlock list")
}

/// `dlock list --prefix` shows exactly `keys` (as text and as JSON) where the backend
/// declares listing; elsewhere it exits 64 saying the backend cannot enumerate its keys.
pub(super) fn list_shows(url: &str, prefix: &str, keys: &[&str]) {
    let (backend, caps) = declared(url);
    let text = list(url, prefix, &[]);
    let json = list(url, prefix, &["--json"]);
    if !caps.inspect.list {
        for out in [text, json] {
            assert_eq!(out.status.code(), Some(64), "{out:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(&format!("{backend} cannot enumerate its keys")),
                "{stderr}"
            );
            assert!(out.stdout.is_empty(), "{out:?}");
        }
        return;
    }
    assert!(text.status.success(), "{text:?}");
    let expected: String = keys.iter().map(|k| format!("{k}\n")).collect();
    assert_eq!(String::from_utf8_lossy(&text.stdout), expected);
    assert!(json.status.success(), "{json:?}");
    let listed: Vec<String> = serde_json::from_slice(&json.stdout).expect("a JSON array");
    assert_eq!(listed, keys);
}

/// `dlock status` of a key held by a `dlock hold` shows that holder (its token, as the hold
/// printed it, where the backend shows tokens; its description where the backend shows
/// who) and, where the backend shows waiters, a second `dlock hold` queued behind it; the
/// JSON says the same, and `dlock list` lists the key where the backend can enumerate
/// keys. Once the first releases, the second is the holder; once both are gone, the key is
/// free and unlisted.
pub(super) fn status_shows_the_holder_and_the_queue(url: &str, shows_tokens: bool) {
    let (_, caps) = declared(url);
    let waiters_visible = caps.inspect.waiters != dlock::WaiterView::Hidden;
    let no_waiter = match waiters_visible {
        true => "waiters: none",
        false => "waiters: not visible on this backend",
    };
    let prefix = format!("{}/", unique("status"));
    let key = format!("{prefix}job");
    assert_eq!(
        status(url, &key, &[]),
        format!("key: {key}\nholder: none\n{no_waiter}\n")
    );
    list_shows(url, &prefix, &[]);

    let (mut first, token) = hold(url, &key, &[]);
    let mut second = spawn_hold(url, &key, &[]);
    let text = status_until(url, &key, |lines| {
        !waiters_visible || lines.iter().any(|l| l.starts_with("waiter 1: "))
    });
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], format!("key: {key}"), "{text}");
    let holder = lines[1];
    assert!(holder.starts_with("holder: exclusive"), "{text}");
    let shown_token = holder
        .split(' ')
        .find_map(|field| field.strip_prefix("token="));
    match shows_tokens {
        true => assert_eq!(shown_token, Some(token.to_string().as_str()), "{text}"),
        false => assert!(shown_token.is_none_or(|t| t == token.to_string()), "{text}"),
    }
    if caps.inspect.who {
        assert!(holder.contains(" who="), "{text}");
    }
    if holder.contains(" who=dlock@") {
        assert!(holder.ends_with(&format!(":{}", first.id())), "{text}");
    }
    match waiters_visible {
        true => assert!(
            ["waiter 1: exclusive", "waiter 1: ?"]
                .iter()
                .any(|w| lines[2] == *w || lines[2].starts_with(&format!("{w} "))),
            "{text}"
        ),
        false => assert_eq!(lines[2], no_waiter, "{text}"),
    }

    let json: serde_json::Value =
        serde_json::from_str(&status(url, &key, &["--json"])).expect("one JSON object");
    assert_eq!(json["key"], key.as_str(), "{json}");
    let holders = json["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 1, "{json}");
    assert_eq!(holders[0]["mode"], "exclusive", "{json}");
    if shows_tokens {
        assert_eq!(holders[0]["fencing_token"], token, "{json}");
    }
    match waiters_visible {
        true => assert_eq!(json["waiters"].as_array().map(Vec::len), Some(1), "{json}"),
        false => assert!(json["waiters"].is_null(), "{json}"),
    }
    list_shows(url, &prefix, &[&key]);

    common::sigterm(&first);
    assert!(first.wait().unwrap().success());
    let next = acquired_token(&mut second, &key);
    let text = status_until(url, &key, |lines| {
        lines
            .get(1)
            .is_some_and(|l| l.starts_with("holder: exclusive"))
            && lines.get(2) == Some(&no_waiter)
    });
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[2], no_waiter, "{text}");
    if shows_tokens {
        assert!(
            lines[1].contains(&format!(" token={next}")),
            "the second holder's token {next}: {text}"
        );
    }
    if lines[1].contains(" who=dlock@") {
        assert!(lines[1].ends_with(&format!(":{}", second.id())), "{text}");
    }

    common::sigterm(&second);
    assert!(second.wait().unwrap().success());
    assert_eq!(
        status(url, &key, &[]),
        format!("key: {key}\nholder: none\n{no_waiter}\n")
    );
    list_shows(url, &prefix, &[]);
}
