//! The real `dlock` binary against every backend's real server, across processes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
#[path = "cross_process/leading.rs"]
mod leading;
#[path = "cross_process/looking.rs"]
mod looking;
#[path = "cross_process/owners.rs"]
mod owners;

use leading::*;
use looking::*;
use owners::*;

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
    redis_sentinel,
    "DLOCK_REDIS_SENTINEL_URL",
    "redis+sentinel://dlock:dlock-secret@127.0.0.1:26391,127.0.0.1:26392,127.0.0.1:26393/dlock",
    std::time::Duration::from_secs(2 + 5),
    tokens: true
);
backend!(
    redis_cluster,
    "DLOCK_REDIS_CLUSTER_URL",
    "redis+cluster://dlock:dlock-secret@127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103",
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
