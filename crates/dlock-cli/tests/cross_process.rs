//! The real `dlock` binary against every backend's real server, across processes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

fn dlock(args: &[&str]) -> Output {
    Command::new(DLOCK).args(args).output().expect("run dlock")
}

/// `dlock run --url URL --key KEY FLAGS… -- true`, to completion.
fn run_true(url: &str, key: &str, flags: &[&str]) -> Output {
    Command::new(DLOCK)
        .args(["run", "--url", url, "--key", key])
        .args(flags)
        .args(["--", "true"])
        .output()
        .expect("run dlock")
}

/// Start `dlock hold` and wait for its `acquired` line; returns the child and the token.
fn hold(url: &str, key: &str, extra: &[&str]) -> (Child, u64) {
    let (child, tokens) = hold_set(url, &[key], extra);
    (child, tokens[0])
}

/// Start `dlock hold` with a `--key` for each of `keys` and wait for its `acquired` lines,
/// one per key in ascending order; returns the child and the tokens in that order.
fn hold_set(url: &str, keys: &[&str], extra: &[&str]) -> (Child, Vec<u64>) {
    let mut child = Command::new(DLOCK)
        .args(["hold", "--url", url])
        .args(keys.iter().flat_map(|key| ["--key", key]))
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn dlock hold");
    let mut ascending = keys.to_vec();
    ascending.sort_unstable();
    ascending.dedup();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let tokens = ascending
        .iter()
        .map(|key| {
            let mut line = String::new();
            stdout.read_line(&mut line).expect("read acquired line");
            line.trim()
                .strip_prefix(&format!("acquired key={} token=", shown(key)))
                .unwrap_or_else(|| panic!("unexpected line from dlock hold for {key:?}: {line:?}"))
                .parse()
                .expect("token is a number")
        })
        .collect();
    // The pipe stays open as long as the child is kept, as before the lines were read.
    child.stdout = Some(stdout.into_inner());
    (child, tokens)
}

/// How `dlock hold` prints an ASCII key: as it is if plain, else quoted and escaped.
fn shown(key: &str) -> String {
    match key
        .bytes()
        .all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
    {
        true => key.to_owned(),
        false => format!("{key:?}"),
    }
}

fn unique(name: &str) -> String {
    format!("cli-{}-{name}", std::process::id())
}

/// Two `dlock run` processes on one key never overlap: each child appends start and end
/// marks to a file, and the marks must never interleave.
fn runs_never_overlap(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let marks = dir.path().join("marks");
    let key = unique("overlap");
    let script = format!(
        "echo start $$ >> {0}; sleep 0.2; echo end $$ >> {0}",
        marks.display()
    );
    let runners: Vec<_> = (0..3)
        .map(|_| {
            Command::new(DLOCK)
                .args([
                    "run", "--url", url, "--key", &key, "--wait", "60s", "--", "sh", "-c", &script,
                ])
                .spawn()
                .expect("spawn dlock run")
        })
        .collect();
    for mut r in runners {
        assert!(r.wait().unwrap().success());
    }
    let text = std::fs::read_to_string(&marks).unwrap();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 6, "{text}");
    for pair in lines.chunks(2) {
        let (start, end) = (pair[0].strip_prefix("start "), pair[1].strip_prefix("end "));
        assert!(start.is_some() && start == end, "marks interleave:\n{text}");
    }
}

/// `--no-wait` on a held key exits 75 at once.
fn no_wait_on_a_held_key_exits_75(url: &str) {
    let key = unique("busy");
    let (mut holder, _) = hold(url, &key, &[]);
    let started = Instant::now();
    let out = run_true(url, &key, &["--no-wait"]);
    let took = started.elapsed();
    let _ = holder.kill();
    let _ = holder.wait();
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

/// Killing `dlock hold` with SIGKILL frees the key within the backend's bound.
fn killed_hold_frees_the_key(url: &str, bound: Duration) {
    let key = unique("crash");
    let (mut holder, token) = hold(url, &key, &["--ttl", "2s"]);
    holder.kill().expect("SIGKILL");
    let _ = holder.wait();
    let killed = Instant::now();
    let out = dlock(&[
        "run",
        "--url",
        url,
        "--key",
        &key,
        "--wait",
        "60s",
        "--",
        "sh",
        "-c",
        "echo $DLOCK_FENCING_TOKEN",
    ]);
    let took = killed.elapsed();
    assert!(out.status.success(), "{out:?}");
    assert!(
        took <= bound,
        "the key freed {took:?} after the crash (bound {bound:?})"
    );
    let next: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    assert!(
        next > token,
        "the next holder's token {next} is not above the killed one's {token}"
    );
}

/// SIGTERM to a `dlock run` still waiting for the key gives the wait up (exit 143), and
/// leaves nothing queued: once the holder releases, the key is free at once.
fn a_signal_while_waiting_gives_up_the_wait(url: &str) {
    let key = unique("interrupted");
    let (mut holder, _) = hold(url, &key, &[]);
    let mut waiter = Command::new(DLOCK)
        .args([
            "run", "--url", url, "--key", &key, "--wait", "60s", "--", "true",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock run");
    // Long enough to be queued on the server (connect, then the first attempt).
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        waiter.try_wait().unwrap().is_none(),
        "the waiter did not wait"
    );
    let sent = Instant::now();
    common::sigterm(&waiter);
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{out:?}");
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("left to its ttl"),
        "the abandoned wait was not cleaned up: {out:?}"
    );
    assert!(
        sent.elapsed() < Duration::from_secs(10),
        "took {:?}",
        sent.elapsed()
    );
    common::sigterm(&holder);
    assert!(holder.wait().unwrap().success());
    let after = run_true(url, &key, &["--no-wait"]);
    assert_eq!(
        after.status.code(),
        Some(0),
        "the key is not free after the holder released: {after:?}"
    );
}
/// `--read` holds from two processes share the key and keep a `--write` out, on a backend
/// with shared holds; elsewhere `--read` is refused as a usage error (64) naming what is
/// not supported, and nothing is taken.
fn read_holds_share_or_are_refused(url: &str) {
    let key = unique("read");
    let probe = run_true(url, &key, &["--read", "--no-wait"]);
    if probe.status.code() == Some(64) {
        let stderr = String::from_utf8_lossy(&probe.stderr);
        assert!(stderr.contains("shared hold is not supported"), "{stderr}");
        assert!(run_true(url, &key, &["--no-wait"]).status.success());
        return;
    }
    assert!(probe.status.success(), "{probe:?}");
    let (mut reader, _) = hold(url, &key, &["--read"]);
    let second = run_true(url, &key, &["--read", "--no-wait"]);
    assert!(second.status.success(), "a second reader: {second:?}");
    let writer = run_true(url, &key, &["--write", "--no-wait"]);
    assert_eq!(
        writer.status.code(),
        Some(75),
        "a writer beside a reader: {writer:?}"
    );
    common::sigterm(&reader);
    assert!(reader.wait().unwrap().success());
    assert!(
        run_true(url, &key, &["--write", "--no-wait"])
            .status
            .success()
    );
}

/// `--permits 2` from three processes: two hold the key together, the third is kept out,
/// and a freed permit lets the next one in (a key is a lock or a semaphore: what a
/// `--write` makes of permit holders is backend-specific, so it is not asked). Every backend takes
/// permits: a refusal (exit 64) fails the test, naming the backend's answer.
fn permits_let_n_holders_in_and_no_more(url: &str) {
    let key = unique("permits");
    let probe = run_true(url, &key, &["--permits", "2", "--no-wait"]);
    assert!(
        probe.status.success(),
        "a permit hold on a free key was refused (does the backend declare permits?): {probe:?}"
    );
    let (mut first, _) = hold(url, &key, &["--permits", "2"]);
    let (mut second, _) = hold(url, &key, &["--permits", "2"]);
    let third = run_true(url, &key, &["--permits", "2", "--no-wait"]);
    assert_eq!(
        third.status.code(),
        Some(75),
        "a third permit of two: {third:?}"
    );
    common::sigterm(&first);
    assert!(first.wait().unwrap().success());
    let freed = run_true(url, &key, &["--permits", "2", "--wait", "30s"]);
    assert!(freed.status.success(), "the freed permit: {freed:?}");
    common::sigterm(&second);
    assert!(second.wait().unwrap().success());
}

/// `dlock run --url URL --key K… FLAGS… -- true`, to completion.
fn run_true_set(url: &str, keys: &[&str], flags: &[&str]) -> Output {
    Command::new(DLOCK)
        .args(["run", "--url", url])
        .args(keys.iter().flat_map(|key| ["--key", key]))
        .args(flags)
        .args(["--", "true"])
        .output()
        .expect("run dlock")
}

/// `hold --key b --key a` holds both (printed in ascending key order): another process is
/// kept out of either key, and of a set that shares one, until the holder releases.
fn a_set_is_held_whole_then_released_whole(url: &str) {
    let (a, b, c) = (unique("set-a"), unique("set-b"), unique("set-c"));
    let (a, b, c) = (a.as_str(), b.as_str(), c.as_str());
    let (mut holder, tokens) = hold_set(url, &[b, a], &[]);
    assert_eq!(tokens.len(), 2, "{tokens:?}");
    for keys in [&[b][..], &[a], &[c, b]] {
        let out = run_true_set(url, keys, &["--no-wait"]);
        assert_eq!(out.status.code(), Some(75), "{keys:?} while held: {out:?}");
    }
    common::sigterm(&holder);
    assert!(holder.wait().unwrap().success());
    for keys in [&[c, b][..], &[a]] {
        let out = run_true_set(url, keys, &["--no-wait"]);
        assert!(out.status.success(), "{keys:?} after the release: {out:?}");
    }
}

/// `run --key b --key a` gives the command both keys in ascending order, one per line in
/// DLOCK_KEYS, and each key's own token, in the same order, in DLOCK_FENCING_TOKENS; DLOCK_KEY
/// and DLOCK_FENCING_TOKEN are the first key's.
fn run_sees_every_key_and_token_of_a_set(url: &str) {
    let (a, b) = (unique("env-a"), unique("env-b"));
    let (mut holder, before) = hold_set(url, &[&a, &b], &[]);
    common::sigterm(&holder);
    assert!(holder.wait().unwrap().success());
    let out = dlock(&[
        "run",
        "--url",
        url,
        "--key",
        &b,
        "--key",
        &a,
        "--",
        "sh",
        "-c",
        r#"echo "$DLOCK_KEYS"; echo "$DLOCK_FENCING_TOKENS"; echo "$DLOCK_KEY $DLOCK_FENCING_TOKEN""#,
    ]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    assert_eq!(lines[..2], [a.as_str(), b.as_str()], "{stdout}");
    let tokens: Vec<u64> = lines[2..4].iter().map(|t| t.parse().unwrap()).collect();
    for (key, (token, earlier)) in [&a, &b].iter().zip(tokens.iter().zip(&before)) {
        assert!(
            token > earlier,
            "{key}: token {token} is not above the earlier holder's {earlier}"
        );
    }
    assert_eq!(lines[4], format!("{a} {}", tokens[0]), "{stdout}");
}

/// A set with one busy key, with `--no-wait` or a short `--wait`, exits 75 naming the busy
/// key, and leaves the free key (taken first: it sorts first) free again at once.
fn a_set_with_a_busy_key_takes_none(url: &str) {
    let (free, busy) = (unique("none-a"), unique("none-b"));
    let (mut holder, _) = hold(url, &busy, &[]);
    for flags in [&["--no-wait"][..], &["--wait", "300ms"]] {
        let started = Instant::now();
        let out = run_true_set(url, &[&busy, &free], flags);
        assert_eq!(out.status.code(), Some(75), "{flags:?}: {out:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{flags:?}: took {:?}",
            started.elapsed()
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(&format!("{busy:?}")), "{flags:?}: {stderr}");
        let after = run_true(url, &free, &["--no-wait"]);
        assert!(
            after.status.success(),
            "{flags:?}: the free key of the set is still held: {after:?}"
        );
    }
    common::sigterm(&holder);
    assert!(holder.wait().unwrap().success());
}

/// The backend's name and what it declares, read through the dlock crate.
fn declared(url: &str) -> (&'static str, dlock::Capabilities) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let lock = dlock::connect(url)
            .await
            .unwrap_or_else(|e| panic!("cannot connect (is `scripts/backends up` done?): {e}"));
        (lock.backend_name(), lock.capabilities())
    })
}

/// Start `dlock hold --url URL --key KEY EXTRA…` without waiting for it to acquire.
fn spawn_hold(url: &str, key: &str, extra: &[&str]) -> Child {
    Command::new(DLOCK)
        .args(["hold", "--url", url, "--key", key])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn dlock hold")
}

/// The token of the `acquired key=KEY token=N` line a `dlock hold` of one key prints next.
fn acquired_token(child: &mut Child, key: &str) -> u64 {
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout piped"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("read acquired line");
    child.stdout = Some(stdout.into_inner());
    line.trim()
        .strip_prefix(&format!("acquired key={} token=", shown(key)))
        .unwrap_or_else(|| panic!("unexpected line from dlock hold for {key:?}: {line:?}"))
        .parse()
        .expect("token is a number")
}

/// `dlock status --url URL --key KEY FLAGS…`: its stdout, after checking it exited 0.
fn status(url: &str, key: &str, flags: &[&str]) -> String {
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
fn status_until(url: &str, key: &str, done: impl Fn(&[&str]) -> bool) -> String {
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
fn list(url: &str, prefix: &str, flags: &[&str]) -> Output {
    Command::new(DLOCK)
        .args(["list", "--url", url, "--prefix", prefix])
        .args(flags)
        .output()
        .expect("run dlock list")
}

/// `dlock list --prefix` shows exactly `keys` (as text and as JSON) where the backend
/// declares listing; elsewhere it exits 64 saying the backend cannot enumerate its keys.
fn list_shows(url: &str, prefix: &str, keys: &[&str]) {
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
fn status_shows_the_holder_and_the_queue(url: &str, shows_tokens: bool) {
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

/// Two `dlock hold --permits 2` of one key show as two holder lines, each a permit hold.
fn status_shows_each_permit_holder(url: &str) {
    let key = unique("status-permits");
    let (mut first, _) = hold(url, &key, &["--permits", "2"]);
    let (mut second, _) = hold(url, &key, &["--permits", "2"]);
    let text = status(url, &key, &[]);
    let holders: Vec<&str> = text.lines().filter(|l| l.starts_with("holder: ")).collect();
    assert_eq!(holders.len(), 2, "{text}");
    for holder in holders {
        // `permits(2)`, or `permits` where the server does not store the limit.
        assert!(holder.starts_with("holder: permits"), "{text}");
    }
    for child in [&mut first, &mut second] {
        common::sigterm(child);
        assert!(child.wait().unwrap().success());
    }
}

/// The lines a child prints on stdout, as they come, read by a thread of their own.
fn lines_of(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// `dlock elect` with `value`, its command printing `$DLOCK_VALUE $DLOCK_TERM`, then
/// sleeping until it is stopped.
fn spawn_elect(url: &str, key: &str, value: &str) -> Child {
    Command::new(DLOCK)
        .args([
            "elect", "--url", url, "--key", key, "--value", value, "--ttl", "2s",
        ])
        .args([
            "--",
            "sh",
            "-c",
            "echo \"$DLOCK_VALUE $DLOCK_TERM\"; exec sleep 60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn dlock elect")
}

/// The term in a `VALUE TERM` line of [`spawn_elect`]'s command, checking the value.
fn term_of(line: &str, value: &str) -> u64 {
    line.strip_prefix(&format!("{value} "))
        .and_then(|term| term.parse().ok())
        .unwrap_or_else(|| panic!("expected \"{value} <term>\", got {line:?}"))
}

/// `dlock elect` runs its command only while leading, one leader at a time, and hands
/// over when the leader stops; `dlock leader` shows the leader, and `--watch` follows it.
fn elect_runs_one_leader_and_leader_follows_it(url: &str) {
    let key = unique("elect");
    let wait = Duration::from_secs(30);
    let mut first = spawn_elect(url, &key, "first");
    let first_lines = lines_of(&mut first);
    let term = term_of(
        &first_lines.recv_timeout(wait).expect("first leads"),
        "first",
    );
    let shown = dlock(&["leader", "--url", url, "--key", &key]);
    assert_eq!(
        String::from_utf8_lossy(&shown.stdout).trim(),
        format!("leader: first term={term}"),
        "{shown:?}"
    );
    let mut watcher = Command::new(DLOCK)
        .args(["leader", "--url", url, "--key", &key, "--watch", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn dlock leader --watch");
    let watched = lines_of(&mut watcher);
    assert_eq!(
        watched
            .recv_timeout(wait)
            .expect("the watcher prints the leader"),
        format!(r#"{{"key":"{key}","leader":{{"value":"first","term":{term}}}}}"#)
    );
    let mut second = spawn_elect(url, &key, "second");
    let second_lines = lines_of(&mut second);
    assert!(
        second_lines.recv_timeout(Duration::from_secs(1)).is_err(),
        "the second candidate ran its command while the first led"
    );
    common::sigterm(&first);
    assert_eq!(first.wait().unwrap().code(), Some(128 + 15));
    let next = term_of(
        &second_lines.recv_timeout(wait).expect("second leads"),
        "second",
    );
    assert!(next != term, "a new leader has a new term");
    let expected = format!(r#"{{"key":"{key}","leader":{{"value":"second","term":{next}}}}}"#);
    let mut seen = Vec::new();
    while seen.last() != Some(&expected) {
        match watched.recv_timeout(wait) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("the watcher never showed the second leader: {seen:?}"),
        }
    }
    common::sigterm(&second);
    assert_eq!(second.wait().unwrap().code(), Some(128 + 15));
    common::sigterm(&watcher);
    assert!(watcher.wait().unwrap().success());
}

/// `dlock run --owner` is reentrant: a nested `dlock run` of the command (which inherits
/// DLOCK_OWNER) takes the key at once with the same token, where a plain nested run is
/// refused with 75; a `dlock hold --owner` in another process lets a run of the same owner
/// in and keeps every other owner out.
fn nested_runs_of_one_owner_reenter(url: &str) {
    let key = unique("owner");
    let nested = |flags: &str| {
        format!(
            "'{DLOCK}' run --url '{url}' --key '{key}' --no-wait {flags} -- \
             sh -c 'echo \"inner=$DLOCK_FENCING_TOKEN $DLOCK_OWNER\"'; \
             echo \"nested=$?\"; echo \"outer=$DLOCK_FENCING_TOKEN\""
        )
    };
    let outer = |owner: Option<&str>| {
        let mut command = Command::new(DLOCK);
        command.args(["run", "--url", url, "--key", &key, "--no-wait"]);
        if let Some(id) = owner {
            command.args(["--owner", id]);
        }
        let script = nested("");
        let out = command
            .args(["--", "sh", "-c", &script])
            .env_remove("DLOCK_OWNER")
            .output()
            .expect("run dlock");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let owned = outer(Some("job-7"));
    let value = |text: &str, name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} line in {text:?}"))
            .to_owned()
    };
    assert_eq!(value(&owned, "nested="), "0", "{owned}");
    let outer_token = value(&owned, "outer=");
    assert_eq!(value(&owned, "inner="), format!("{outer_token} job-7"), "{owned}");
    let plain = outer(None);
    assert_eq!(value(&plain, "nested="), "75", "a plain nested run waits for its parent: {plain}");

    let (mut holder, token) = hold(url, &key, &["--owner", "job-8"]);
    let same = Command::new(DLOCK)
        .args(["run", "--url", url, "--key", &key, "--no-wait", "--", "sh", "-c"])
        .arg("echo $DLOCK_FENCING_TOKEN")
        .env("DLOCK_OWNER", "job-8")
        .output()
        .expect("run dlock");
    assert!(same.status.success(), "the holder's owner re-enters: {same:?}");
    assert_eq!(String::from_utf8_lossy(&same.stdout).trim(), token.to_string());
    for other in [&["--owner", "job-9"][..], &[]] {
        let out = run_true(url, &key, &[&["--no-wait"][..], other].concat());
        assert_eq!(out.status.code(), Some(75), "{other:?} while job-8 holds: {out:?}");
    }
    common::sigterm(&holder);
    assert!(holder.wait().unwrap().success());
    let bad = run_true(url, &key, &["--owner", "job 8", "--no-wait"]);
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
}

/// Stamp the cross-process tests for one backend.
macro_rules! backend {
    ($name:ident, $var:literal, $default:literal, $crash_bound:expr, tokens: $tokens:literal) => {
        mod $name {
            fn url() -> String {
                std::env::var($var).unwrap_or_else(|_| $default.to_owned())
            }
            #[test]
            fn runs_never_overlap() {
                super::runs_never_overlap(&url());
            }
            #[test]
            fn no_wait_on_a_held_key_exits_75() {
                super::no_wait_on_a_held_key_exits_75(&url());
            }
            #[test]
            fn killed_hold_frees_the_key() {
                super::killed_hold_frees_the_key(&url(), $crash_bound);
            }
            #[test]
            fn a_signal_while_waiting_gives_up_the_wait() {
                super::a_signal_while_waiting_gives_up_the_wait(&url());
            }
            #[test]
            fn read_holds_share_or_are_refused() {
                super::read_holds_share_or_are_refused(&url());
            }
            #[test]
            fn permits_let_n_holders_in_and_no_more() {
                super::permits_let_n_holders_in_and_no_more(&url());
            }
            #[test]
            fn a_set_is_held_whole_then_released_whole() {
                super::a_set_is_held_whole_then_released_whole(&url());
            }
            #[test]
            fn run_sees_every_key_and_token_of_a_set() {
                super::run_sees_every_key_and_token_of_a_set(&url());
            }
            #[test]
            fn a_set_with_a_busy_key_takes_none() {
                super::a_set_with_a_busy_key_takes_none(&url());
            }
            #[test]
            fn status_shows_the_holder_and_the_queue() {
                super::status_shows_the_holder_and_the_queue(&url(), $tokens);
            }
            #[test]
            fn status_shows_each_permit_holder() {
                super::status_shows_each_permit_holder(&url());
            }
            #[test]
            fn nested_runs_of_one_owner_reenter() {
                super::nested_runs_of_one_owner_reenter(&url());
            }
            #[test]
            fn elect_runs_one_leader_and_leader_follows_it() {
                super::elect_runs_one_leader_and_leader_follows_it(&url());
            }
        }
    };
}

// Crash bounds: the ttl `killed_hold_frees_the_key` uses (2 s) or the session timeout, plus
// slack for a loaded machine. `tokens`: `dlock status` shows each holder's fencing token
// (PostgreSQL's inspect reads pg_locks, which carries no token).
backend!(
    redis,
    "DLOCK_REDIS_URL",
    "redis://127.0.0.1:6379",
    std::time::Duration::from_secs(2 + 5),
    tokens: true
);
backend!(
    redlock,
    "DLOCK_REDLOCK_URL",
    "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005",
    std::time::Duration::from_secs(2 + 5),
    tokens: true
);
backend!(
    zookeeper,
    "DLOCK_ZK_CLI_URL",
    "zk://127.0.0.1:2181?session_timeout=2s",
    std::time::Duration::from_secs(2 + 5),
    tokens: true
);
backend!(
    etcd,
    "DLOCK_ETCD_URL",
    "etcd://127.0.0.1:2379",
    std::time::Duration::from_secs(2 + 5),
    tokens: true
);
backend!(
    mysql,
    "DLOCK_MYSQL_URL",
    "mysql://dlock:dlock@127.0.0.1:3306/dlock",
    std::time::Duration::from_secs(5),
    tokens: true
);
backend!(
    postgres,
    "DLOCK_POSTGRES_URL",
    "postgres://dlock:dlock@127.0.0.1:5432/dlock",
    std::time::Duration::from_secs(5),
    tokens: false
);

/// A lost lease stops the command and everything it started (its process group): here the
/// key is deleted behind the holder's back on the Redis server.
#[test]
fn a_lost_lease_stops_everything_the_command_started() {
    // Without options: redis-cli takes the same URL, and the key prefix is the default.
    let url = std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let url = url.split('?').next().unwrap_or_default().to_owned();
    let key = unique("lost");
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
    let runner = Command::new(DLOCK)
        .args([
            "run", "--url", &url, "--key", &key, "--ttl", "1s", "--grace", "2s",
        ])
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock run");
    let grandchild = common::wait_for_pid(&pidfile);
    let deleted = Command::new("redis-cli")
        .args(["-u", &url, "DEL", &format!("dlock:{key}")])
        .output()
        .expect(
            "run redis-cli (Debian package redis-tools; scripts/backends up redis installs it)",
        );
    assert_eq!(
        String::from_utf8_lossy(&deleted.stdout).trim(),
        "1",
        "{deleted:?}"
    );
    let out = runner.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(70), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("lost"),
        "{out:?}"
    );
    assert!(
        common::gone_within(grandchild, Duration::from_secs(5)),
        "the command's background process {grandchild} survived the loss"
    );
}

/// The Redis test server's URL with a password for its `default` user, which has none set
/// (`nopass`): Redis accepts `AUTH default <anything>`, so the URL works and carries a secret.
fn redis_url_with_password(password: &str) -> String {
    let url = std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let rest = url
        .strip_prefix("redis://")
        .expect("DLOCK_REDIS_URL is a redis:// URL");
    assert!(
        !rest.contains('@'),
        "DLOCK_REDIS_URL already has credentials"
    );
    format!("redis://default:{password}@{rest}")
}

/// The command `dlock run` starts does not see the lock service URL, given in DLOCK_URL or
/// in a file named by DLOCK_URL_FILE: only DLOCK_KEY and DLOCK_FENCING_TOKEN.
#[test]
fn the_command_does_not_see_the_url_or_its_password() {
    let password = "hunter22-env-secret";
    let url = redis_url_with_password(password);
    let dir = tempfile::tempdir().unwrap();
    let url_file = dir.path().join("url");
    std::fs::write(&url_file, format!("{url}\n")).unwrap();
    let key = unique("env");
    for (var, value) in [
        ("DLOCK_URL", url.as_str()),
        ("DLOCK_URL_FILE", url_file.to_str().unwrap()),
    ] {
        let mut run = Command::new(DLOCK);
        run.env_remove("DLOCK_URL")
            .env_remove("DLOCK_URL_FILE")
            .env(var, value)
            .args(["run", "--key", &key, "--", "env"]);
        let out = run.output().expect("run dlock");
        assert!(out.status.success(), "{var}: {out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout);
        // Only dlock's own variables, so that a failure does not print the whole environment.
        let env = stdout
            .lines()
            .filter(|l| l.starts_with("DLOCK_") || l.contains(password))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(
            !env.contains(password),
            "{var}: the command saw the password:\n{env}"
        );
        for line in env.lines() {
            assert!(
                !line.starts_with("DLOCK_URL=") && !line.starts_with("DLOCK_URL_FILE="),
                "{var}: the command saw {line:?}"
            );
        }
        assert!(
            env.lines().any(|l| l == format!("DLOCK_KEY={key}")),
            "{var}:\n{env}"
        );
        assert!(
            env.lines().any(|l| l.starts_with("DLOCK_FENCING_TOKEN=")),
            "{var}:\n{env}"
        );
    }
}

/// dlock's messages about a key show it escaped: a key with a newline and a terminal escape
/// stays on its line on stderr (here the `--no-wait` message about a key held elsewhere).
#[test]
fn messages_about_a_key_stay_on_one_line() {
    let url = std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let key = format!("{}\ndlock: forged line\x1b[2K", unique("newline"));
    let (mut holder, _) = hold(&url, &key, &[]);
    let out = run_true(&url, &key, &["--no-wait"]);
    common::sigterm(&holder);
    assert!(holder.wait().unwrap().success());
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(!stderr.contains('\x1b'), "{stderr:?}");
}

/// Losing one key of a set is losing the hold: `dlock hold` names the key it lost and exits
/// 70 (here the key is deleted behind the holder's back on the Redis server).
#[test]
fn losing_one_key_of_a_set_names_it() {
    let url = std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let url = url.split('?').next().unwrap_or_default().to_owned();
    let (a, b) = (unique("lost-a"), unique("lost-b"));
    let (holder, _) = hold_set(&url, &[&a, &b], &["--ttl", "1s"]);
    let deleted = Command::new("redis-cli")
        .args(["-u", &url, "DEL", &format!("dlock:{b}")])
        .output()
        .expect("run redis-cli");
    assert_eq!(
        String::from_utf8_lossy(&deleted.stdout).trim(),
        "1",
        "{deleted:?}"
    );
    let out = holder.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(70), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with(&format!("lost: key={b}: ")),
        "{stdout:?}"
    );
    assert!(run_true(&url, &a, &["--no-wait"]).status.success());
}

/// A signal while a set waits gives the wait up and names the keys, in the order they are
/// taken.
#[test]
fn a_signal_while_a_set_waits_names_its_keys() {
    let url = std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let (a, b) = (unique("signal-a"), unique("signal-b"));
    let (mut holder, _) = hold(&url, &b, &[]);
    let waiter = Command::new(DLOCK)
        .args(["run", "--url", &url, "--key", &b, "--key", &a, "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock run");
    std::thread::sleep(Duration::from_secs(1));
    common::sigterm(&waiter);
    let out = waiter.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(143), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("while waiting for {a:?}, {b:?}: gave up the wait")),
        "{stderr}"
    );
    common::sigterm(&holder);
    assert!(holder.wait().unwrap().success());
    assert!(run_true(&url, &a, &["--no-wait"]).status.success());
}
