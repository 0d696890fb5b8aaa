//! The real `dlock` binary: help, output format, exit codes, on the in-process backend.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

fn dlock(args: &[&str]) -> Output {
    Command::new(DLOCK).args(args).output().expect("run dlock")
}

/// `dlock run` on the in-process backend, key `k`, with stdin not a terminal (so the
/// command gets a process group of its own whatever runs the tests).
fn run_in_memory(command: &[&str]) -> std::process::Command {
    let mut run = Command::new(DLOCK);
    run.args(["run", "--url", "memory://", "--key", "k", "--"])
        .args(command)
        .stdin(Stdio::null());
    run
}

#[test]
fn help_explains_each_command_with_an_example() {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["hold", "--help"],
        &["status", "--help"],
        &["list", "--help"],
    ] {
        let out = dlock(args);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Example"), "{args:?}: {text}");
        assert!(
            text.contains("--url") || args == ["--help"],
            "{args:?}: {text}"
        );
    }
}

#[test]
fn hold_prints_acquired_then_released() {
    let out = dlock(&["hold", "--url", "memory://", "--key", "k", "--for", "100ms"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout, "acquired key=k token=1\nreleased\n");
}

#[test]
fn read_and_write_choose_the_mode_and_exclude_each_other() {
    let out = dlock(&[
        "run",
        "--url",
        "memory://",
        "--key",
        "k",
        "--read",
        "--",
        "true",
    ]);
    assert!(out.status.success(), "{out:?}");
    let out = dlock(&[
        "run",
        "--url",
        "memory://",
        "--key",
        "k",
        "--read",
        "--write",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

/// `--permits N` takes one of N permits; it excludes `--read` and `--write`, and N outside
/// 1..=10000 is a usage error, before anything is connected.
#[test]
fn permits_take_one_of_n_and_exclude_read_and_write() {
    let out = dlock(&[
        "hold",
        "--url",
        "memory://",
        "--key",
        "k",
        "--permits",
        "3",
        "--for",
        "10ms",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "acquired key=k token=1\nreleased\n"
    );
    for flags in [
        &["--permits", "2", "--read"][..],
        &["--permits", "2", "--write"],
        &["--permits", "0"],
        &["--permits", "10001"],
        &["--permits", "many"],
    ] {
        // A URL nothing listens on: a usage error must come before any connect.
        let out = Command::new(DLOCK)
            .args(["run", "--url", "redis://127.0.0.1:1", "--key", "k"])
            .args(flags)
            .args(["--", "true"])
            .output()
            .expect("run dlock");
        assert_eq!(out.status.code(), Some(64), "{flags:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{flags:?}: no message");
    }
    let help = dlock(&["run", "--help"]);
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("--permits <N>"),
        "{help:?}"
    );
}

#[test]
fn run_passes_key_and_token_and_exit_code() {
    let out = dlock(&[
        "run",
        "--url",
        "memory://",
        "--key",
        "jobs/a",
        "--",
        "sh",
        "-c",
        "echo $DLOCK_KEY $DLOCK_FENCING_TOKEN; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "jobs/a 1\n");
}

#[test]
fn bad_urls_exit_64_without_showing_the_password() {
    for url in ["nope://user:hunter22@host", "memory://user:hunter22@host:1"] {
        let out = dlock(&["run", "--url", url, "--key", "k", "--", "true"]);
        assert_eq!(out.status.code(), Some(64), "{url}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("hunter22"), "{url}: {stderr}");
    }
    let out = dlock(&["run", "--url", "memory://", "--key", "", "--", "true"]);
    assert_eq!(out.status.code(), Some(64), "empty key: {out:?}");
}

#[test]
fn an_unreachable_server_exits_69_within_the_connect_timeout() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let url = format!("redis://{dead}");
    let started = std::time::Instant::now();
    let out = dlock(&[
        "run", "--url", &url, "--key", "k", "--wait", "1s", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
}

#[test]
fn a_command_that_cannot_run_exits_127() {
    let out = run_in_memory(&["/nonexistent/cmd"]).output().unwrap();
    assert_eq!(out.status.code(), Some(127), "{out:?}");
}

#[test]
fn a_command_killed_by_signal_n_exits_128_plus_n() {
    let out = run_in_memory(&["sh", "-c", "kill -KILL $$"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(128 + 9), "{out:?}");
}

/// SIGTERM to `dlock run` reaches the command's whole process group, background jobs too.
#[test]
fn sigterm_reaches_everything_the_command_started() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
    let runner = run_in_memory(&["sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dlock run");
    let grandchild = common::wait_for_pid(&pidfile);
    common::sigterm(&runner);
    let out = runner.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(128 + 15), "{out:?}");
    assert!(
        common::gone_within(grandchild, Duration::from_secs(5)),
        "the background job {grandchild} did not get the SIGTERM"
    );
}

/// A background job the command leaves behind still works under the lock: `dlock run`
/// waits for it (up to --grace) before releasing; with --foreground it cannot see it.
#[test]
fn the_lock_is_held_until_the_commands_background_jobs_end() {
    // The job's output goes elsewhere, so only dlock's own exit ends `output()`.
    let job = "sleep 1 >/dev/null 2>&1 &";
    let started = std::time::Instant::now();
    let out = run_in_memory(&["sh", "-c", job]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "released after {:?}, before the background job ended",
        started.elapsed()
    );
    let job = "sleep 5 >/dev/null 2>&1 &";
    let started = std::time::Instant::now();
    let out = dlock(&[
        "run",
        "--url",
        "memory://",
        "--key",
        "k",
        "--foreground",
        "--",
        "sh",
        "-c",
        job,
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "--foreground waited {:?} for a job outside its reach",
        started.elapsed()
    );
}

/// Usage errors exit 64 (EX_USAGE) as `--help` says, not clap's own 2; `--help` and
/// `--version` exit 0.
#[test]
fn usage_errors_exit_64() {
    for args in [
        &[][..],
        &["frobnicate"],
        &[
            "run",
            "--url",
            "memory://",
            "--key",
            "k",
            "--ttl",
            "soon",
            "--",
            "true",
        ],
        &["run", "--url", "memory://", "--key", "k"],
        &["hold", "--url", "memory://"],
        &[
            "hold",
            "--url",
            "memory://",
            "--key",
            "k",
            "--wait",
            "1s",
            "--no-wait",
        ],
    ] {
        let out = dlock(args);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        assert!(!out.stderr.is_empty(), "{args:?}: no message");
    }
    for args in [
        &["--help"][..],
        &["--version"],
        &["run", "--help"],
        &["help"],
    ] {
        let out = dlock(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
    }
}

/// `dlock` with `args`, the environment without DLOCK_URL / DLOCK_URL_FILE plus `env`.
fn dlock_env(args: &[&str], env: &[(&str, &std::path::Path)]) -> Output {
    let mut cmd = Command::new(DLOCK);
    cmd.env_remove("DLOCK_URL").env_remove("DLOCK_URL_FILE");
    for (var, value) in env {
        cmd.env(var, value);
    }
    cmd.args(args).output().expect("run dlock")
}

/// The URL can come from a file, named by --url-file or DLOCK_URL_FILE; its final newline
/// and surrounding blanks do not count.
#[test]
fn the_url_comes_from_a_url_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("url");
    for content in ["memory://", "memory://\n", "  memory://\r\n\n"] {
        std::fs::write(&file, content).unwrap();
        let hold = ["hold", "--key", "k", "--for", "10ms"];
        let path = file.to_str().unwrap();
        let flag = dlock_env(&[&hold[..], &["--url-file", path]].concat(), &[]);
        let env = dlock_env(&hold, &[("DLOCK_URL_FILE", &file)]);
        for out in [flag, env] {
            assert!(out.status.success(), "{content:?}: {out:?}");
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                "acquired key=k token=1\nreleased\n"
            );
        }
    }
}

/// A URL file that cannot be used is a usage error (64) that names the file and never
/// shows what it holds.
#[test]
fn a_bad_url_file_exits_64_naming_the_file_not_its_contents() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, content: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path
    };
    let cases = [
        (dir.path().join("missing"), "missing"),
        (dir.path().to_owned(), "directory"),
        (write("empty", b""), "empty"),
        (write("blank", b" \n\n"), "empty"),
        (
            write("lines", b"memory://\nhunter22\n"),
            "more than one line",
        ),
        (write("binary", b"redis://:hunter22@h\xff\xfe"), "UTF-8"),
        (write("huge", &[b'a'; 100_000]), "larger than"),
        (
            write("scheme", b"nope://user:hunter22@host\n"),
            "unknown scheme",
        ),
        (
            write("memory", b"memory://user:hunter22@host:1\n"),
            "memory",
        ),
    ];
    for (path, what) in cases {
        let path_arg = path.to_str().unwrap();
        let run = ["run", "--key", "k", "--", "true"];
        let flag = dlock_env(
            &[&run[..1], &["--url-file", path_arg], &run[1..]].concat(),
            &[],
        );
        let env = dlock_env(&run, &[("DLOCK_URL_FILE", &path)]);
        for out in [flag, env] {
            assert_eq!(out.status.code(), Some(64), "{what}: {out:?}");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(stderr.contains(what), "{what}: {stderr}");
            assert!(!stderr.contains("hunter22"), "{what}: {stderr}");
            if what != "unknown scheme" && what != "memory" {
                assert!(
                    stderr.contains(&format!("{:?}", path.display().to_string())),
                    "{what}: the message does not name the file: {stderr}"
                );
            }
        }
    }
}

/// --url and --url-file (or DLOCK_URL_FILE) together are a usage error; one of them, or
/// DLOCK_URL, is required.
#[test]
fn url_and_url_file_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("url");
    std::fs::write(&file, "memory://\n").unwrap();
    let path = file.to_str().unwrap();
    let hold = ["hold", "--key", "k", "--for", "10ms"];
    let both = dlock_env(
        &[&hold[..], &["--url", "memory://", "--url-file", path]].concat(),
        &[],
    );
    assert_eq!(both.status.code(), Some(64), "{both:?}");
    let stderr = String::from_utf8_lossy(&both.stderr);
    assert!(
        stderr.contains("--url-file") && stderr.contains("--url"),
        "{stderr}"
    );
    // A variable against an option: the message names the variable too.
    let mut mixed = Command::new(DLOCK);
    mixed
        .env_remove("DLOCK_URL_FILE")
        .env("DLOCK_URL", "memory://");
    let mixed = mixed
        .args(hold)
        .args(["--url-file", path])
        .output()
        .unwrap();
    assert_eq!(mixed.status.code(), Some(64), "{mixed:?}");
    assert!(
        String::from_utf8_lossy(&mixed.stderr).contains("DLOCK_URL"),
        "{mixed:?}"
    );
    let env = dlock_env(
        &[&hold[..], &["--url", "memory://"]].concat(),
        &[("DLOCK_URL_FILE", &file)],
    );
    assert_eq!(env.status.code(), Some(64), "{env:?}");
    let neither = dlock_env(&hold, &[]);
    assert_eq!(neither.status.code(), Some(64), "{neither:?}");
    let stderr = String::from_utf8_lossy(&neither.stderr);
    assert!(
        stderr.contains("--url-file") && stderr.contains("DLOCK_URL"),
        "{stderr}"
    );
}

/// --help says where a URL with a password belongs, and why not in --url.
#[test]
fn help_says_where_a_secret_url_belongs() {
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["hold", "--help"],
        &["status", "--help"],
        &["list", "--help"],
    ] {
        let out = dlock(args);
        let text = String::from_utf8_lossy(&out.stdout);
        for needle in ["--url-file", "DLOCK_URL_FILE", "DLOCK_URL", "ps"] {
            assert!(text.contains(needle), "{args:?} lacks {needle}: {text}");
        }
    }
}

/// Every error line starts `dlock: ` once: errors of the dlock crate itself (an unknown
/// scheme, a bad URL file) already name "dlock" as their backend.
#[test]
fn error_lines_are_prefixed_once() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let dead = format!("redis://{dead}");
    let cases: [&[&str]; 5] = [
        &["run", "--url", "nope://host", "--key", "k", "--", "true"],
        &[
            "run",
            "--url-file",
            "/nonexistent/url",
            "--key",
            "k",
            "--",
            "true",
        ],
        &["run", "--url", "memory://", "--key", "", "--", "true"],
        &[
            "hold",
            "--url",
            "memory://",
            "--url-file",
            "/x",
            "--key",
            "k",
        ],
        &["hold", "--url", &dead, "--key", "k", "--no-wait"],
    ];
    for args in cases {
        let out = dlock_env(args, &[]);
        assert!(!out.status.success(), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.is_empty(), "{args:?}: no message");
        assert!(!stderr.contains("dlock: dlock:"), "{args:?}: {stderr}");
    }
    let out = dlock(&["run", "--url", "nope://host", "--key", "k", "--", "true"]);
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .starts_with("dlock: invalid configuration: unknown scheme \"nope\""),
        "{out:?}"
    );
}

/// Durations beyond their bounds are usage errors (64) naming the option, checked before
/// anything runs; `--grace 400000000000y` made `dlock run` panic on an `Instant` overflow.
#[test]
fn absurd_durations_are_usage_errors() {
    // A background job makes `dlock run` wait up to --grace for it after the command exits.
    let job = ["--", "sh", "-c", "sleep 0.2 >/dev/null 2>&1 &"];
    let run = ["run", "--url", "memory://", "--key", "k"];
    let hold = ["hold", "--url", "memory://", "--key", "k"];
    let cases: [(&[&str], &[&str]); 9] = [
        (&run, &["--grace", "400000000000y"]),
        (&run, &["--grace", "2years"]),
        (&run, &["--ttl", "400000000000y"]),
        (&run, &["--ttl", "25h"]),
        (&run, &["--ttl", "10ms"]),
        (&run, &["--wait", "400000000000y"]),
        (&run, &["--wait", "2years"]),
        (&hold, &["--for", "400000000000y"]),
        (&hold, &["--wait", "99999999999999999999999y"]),
    ];
    for (base, flags) in cases {
        let tail: &[&str] = if base[0] == "run" { &job } else { &[] };
        let mut cmd = Command::new(DLOCK);
        let out = cmd
            .args(base)
            .args(flags)
            .args(tail)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flags:?}: {stderr}");
        assert!(stderr.contains(flags[0]), "{flags:?}: {stderr}");
    }
    // The bounds themselves are accepted.
    let bounds = ["--ttl", "1day", "--wait", "1year", "--grace", "1year"];
    let out = dlock(&[&run[..], &bounds, &["--", "true"]].concat());
    assert!(out.status.success(), "{out:?}");
}

/// A key with a newline cannot forge a line of `dlock hold`'s output, nor drive the
/// terminal: anything but a plain key is printed quoted and escaped. Plain keys print as
/// they are.
#[test]
fn hold_escapes_keys_that_are_not_plain() {
    let cases = [
        (
            "evil\nacquired key=other token=999\r\x1b[2K\tend",
            r#""evil\nacquired key=other token=999\r\u{1b}[2K\tend""#,
        ),
        ("a token=5", r#""a token=5""#),
        ("quote\"back\\slash", r#""quote\"back\\slash""#),
        ("bell\x07del\x7f", r#""bell\u{7}del\u{7f}""#),
        ("jobs/nightly-backup:eu=1", "jobs/nightly-backup:eu=1"),
        ("café/ключ", "café/ключ"),
    ];
    for (key, shown) in cases {
        let out = dlock(&["hold", "--url", "memory://", "--key", key, "--for", "10ms"]);
        assert!(out.status.success(), "{key:?}: {out:?}");
        assert_eq!(
            String::from_utf8(out.stdout).unwrap(),
            format!("acquired key={shown} token=1\nreleased\n"),
            "{key:?}"
        );
    }
}

/// SIGKILL `runner`, then whether process `pid` ended within `limit`; SIGKILL it if not, so
/// that a failing test leaves nothing behind.
fn killed_runner_stops(mut runner: std::process::Child, pid: i32, limit: Duration) -> bool {
    // Killed before it told its guard the command's pid, dlock would leave the command
    // unwatched: wait until the guard knows it (it renames itself then).
    let until = Instant::now() + Duration::from_secs(20);
    while !guards_of(runner.id()).into_iter().any(|guard| {
        std::fs::read_to_string(format!("/proc/{guard}/comm"))
            .is_ok_and(|comm| comm.trim_end() == "dlock-guarding")
    }) {
        assert!(
            Instant::now() < until,
            "the guard never learned the command's pid"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    runner.kill().expect("SIGKILL dlock run");
    let _ = runner.wait();
    let gone = common::gone_within(pid, limit);
    if !gone {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    gone
}

/// If `dlock run` itself is SIGKILLed, the command does not run on without the lock: its
/// process group (here a background job of it) is stopped, as --on-lost would.
#[test]
fn a_killed_dlock_run_stops_everything_the_command_started() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
    let runner = run_in_memory(&["sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dlock run");
    let job = common::wait_for_pid(&pidfile);
    assert!(
        killed_runner_stops(runner, job, Duration::from_secs(5)),
        "the command's background job {job} ran on after dlock was killed"
    );
}

/// The same with --foreground, where only the command itself is dlock's to stop.
#[test]
fn a_killed_dlock_run_stops_a_foreground_command() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 300", pidfile.display());
    let runner = Command::new(DLOCK)
        .args(["run", "--url", "memory://", "--key", "k", "--foreground"])
        .args(["--on-lost", "kill", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dlock run");
    let command = common::wait_for_pid(&pidfile);
    assert!(
        killed_runner_stops(runner, command, Duration::from_secs(5)),
        "the command {command} ran on after dlock was killed"
    );
}

/// The `dlock guard` children of process `parent`.
fn guards_of(parent: u32) -> Vec<i32> {
    let mut guards = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        if ppid == Some(parent) && args.get(1) == Some(&&b"guard"[..]) {
            guards.push(pid);
        }
    }
    guards
}

/// While the command runs, one guard watches it (none with --on-lost ignore); it ends with
/// the run.
#[test]
fn the_guard_lives_as_long_as_the_run() {
    for (on_lost, expected) in [("term", 1), ("kill", 1), ("ignore", 0)] {
        let mut runner = Command::new(DLOCK)
            .args([
                "run",
                "--url",
                "memory://",
                "--key",
                "k",
                "--on-lost",
                on_lost,
            ])
            .args(["--", "sleep", "1"])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn dlock run");
        std::thread::sleep(Duration::from_millis(400));
        let guards = guards_of(runner.id());
        assert!(runner.wait().unwrap().success());
        assert_eq!(guards.len(), expected, "--on-lost {on_lost}: {guards:?}");
        for guard in guards {
            assert!(
                common::gone_within(guard, Duration::from_millis(100)),
                "--on-lost {on_lost}: the guard {guard} outlived the run"
            );
        }
    }
}

/// `hold` with several keys prints one `acquired` line per key, in ascending key order
/// whatever the order given (a key given twice is held once), then `released` once.
#[test]
fn hold_prints_each_key_of_a_set_in_ascending_order() {
    let out = dlock(&[
        "hold",
        "--url",
        "memory://",
        "--key",
        "b",
        "--key",
        "a",
        "--key",
        "b",
        "--for",
        "100ms",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "acquired key=a token=1\nacquired key=b token=2\nreleased\n"
    );
}

/// `run` with several keys gives the command DLOCK_KEYS and DLOCK_FENCING_TOKENS (one line
/// per key, ascending), and DLOCK_KEY / DLOCK_FENCING_TOKEN for the first key; with one
/// key, only the latter two, as always.
#[test]
fn run_passes_every_key_and_token_of_a_set() {
    let script = r#"echo "$DLOCK_KEY $DLOCK_FENCING_TOKEN"; echo "${DLOCK_KEYS-none}"; echo "${DLOCK_FENCING_TOKENS-none}""#;
    let out = dlock(&[
        "run",
        "--url",
        "memory://",
        "--key",
        "jobs/b",
        "--key",
        "jobs/a",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "jobs/a 1\njobs/a\njobs/b\n1\n2\n"
    );
    let out = dlock(&[
        "run",
        "--url",
        "memory://",
        "--key",
        "jobs/a",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "jobs/a 1\nnone\nnone\n"
    );
}

/// A bad key anywhere in a set is a usage error (64), and nothing runs.
#[test]
fn a_bad_key_in_a_set_exits_64() {
    let out = dlock(&[
        "run",
        "--url",
        "memory://",
        "--key",
        "a",
        "--key",
        "",
        "--",
        "sh",
        "-c",
        "echo ran",
    ]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
}

/// The help shows a set of keys taken together.
#[test]
fn help_shows_several_keys() {
    for args in [&["--help"][..], &["run", "--help"], &["hold", "--help"]] {
        let out = dlock(args);
        let text = String::from_utf8_lossy(&out.stdout);
        let example = text
            .lines()
            .any(|l| l.trim_start().starts_with("dlock ") && l.matches("--key ").count() == 2);
        assert!(example, "{args:?}: no example with two keys: {text}");
    }
}

/// `dlock status` of a free key on the in-process backend (a holder in another process
/// would be on another server: the holder tests are in cross_process.rs): the documented
/// lines, exit 0.
#[test]
fn status_of_a_free_key_says_so() {
    let out = dlock(&["status", "--url", "memory://", "--key", "invoices/2026-11"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "key: invoices/2026-11\nholder: none\nwaiters: none\n"
    );
    assert!(out.stderr.is_empty(), "{out:?}");
}

/// `dlock status --json` prints one JSON object: the key as given (JSON-escaped, whatever
/// it holds), no holder, and an empty queue where the backend shows waiters.
#[test]
fn status_json_is_one_object() {
    let key = "a b\n\u{1b}[2K\u{2028}\"q";
    let out = dlock(&["status", "--url", "memory://", "--key", key, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "{stdout:?}");
    assert!(
        !stdout.contains(['\u{1b}', '\u{2028}']),
        "unescaped: {stdout:?}"
    );
    let value: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON object");
    assert_eq!(
        value,
        serde_json::json!({ "key": key, "holders": [], "waiters": [] })
    );
}

/// A key that is not plain is shown quoted and escaped, as `dlock hold` shows it.
#[test]
fn status_escapes_keys_that_are_not_plain() {
    let out = dlock(&["status", "--url", "memory://", "--key", "a b\nc"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().next(), Some(r#"key: "a b\nc""#), "{stdout}");
}

/// `dlock status` fails as the other commands do: a bad key or URL is a usage error (64),
/// an unreachable server 69; the URL may come from DLOCK_URL.
#[test]
fn status_errors_exit_by_kind() {
    for args in [
        &["status", "--url", "memory://", "--key", ""][..],
        &["status", "--url", "memory://"],
        &["status", "--url", "nope://user:hunter22@h", "--key", "k"],
        &["status", "--key", "k"],
    ] {
        let out = dlock_env(args, &[]);
        assert_eq!(out.status.code(), Some(64), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.is_empty(), "{args:?}: no message");
        assert!(!stderr.contains("hunter22"), "{args:?}: {stderr}");
    }
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let out = dlock(&["status", "--url", &format!("redis://{dead}"), "--key", "k"]);
    assert_eq!(out.status.code(), Some(69), "{out:?}");
    let out = Command::new(DLOCK)
        .env("DLOCK_URL", "memory://")
        .env_remove("DLOCK_URL_FILE")
        .args(["status", "--key", "k"])
        .output()
        .expect("run dlock");
    assert!(out.status.success(), "{out:?}");
}

/// `dlock list` on the in-process backend, where nothing is held by another process:
/// nothing printed, or `[]` with --json; exit 0.
#[test]
fn list_with_nothing_held_prints_nothing() {
    let out = dlock(&["list", "--url", "memory://", "--prefix", "jobs/"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
    let out = dlock(&["list", "--url", "memory://", "--json"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "[]\n");
}

/// A `list --prefix` longer than any key is a bad key: 64.
#[test]
fn list_with_a_bad_prefix_exits_64() {
    let out = dlock(&[
        "list",
        "--url",
        "memory://",
        "--prefix",
        &"x".repeat(100_000),
    ]);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
}

/// `dlock elect` runs the command as the leader, with the key, the term and the value in
/// its environment; a bad value is a usage error; `dlock leader` shows nobody leading a
/// fresh election (the in-process server is this process's own).
#[test]
fn elect_passes_the_term_and_value_and_leader_shows_none() {
    let out = dlock(&[
        "elect",
        "--url",
        "memory://",
        "--key",
        "k",
        "--value",
        "me:1",
        "--",
        "sh",
        "-c",
        "echo \"$DLOCK_KEY $DLOCK_VALUE $DLOCK_TERM $DLOCK_FENCING_TOKEN\"",
    ]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "k me:1 1 1");
    let bad = dlock(&[
        "elect",
        "--url",
        "memory://",
        "--key",
        "k",
        "--value",
        "",
        "--",
        "true",
    ]);
    assert_eq!(bad.status.code(), Some(64), "{bad:?}");
    let shown = dlock(&["leader", "--url", "memory://", "--key", "k"]);
    assert_eq!(
        String::from_utf8_lossy(&shown.stdout).trim(),
        "leader: none"
    );
    let json = dlock(&["leader", "--url", "memory://", "--key", "k", "--json"]);
    assert_eq!(
        String::from_utf8_lossy(&json.stdout).trim(),
        r#"{"key":"k","leader":null}"#
    );
}
