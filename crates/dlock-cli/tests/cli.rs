//! The real `dlock` binary: help, output format, exit codes, on the in-process backend.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

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
    for args in [&["--help"][..], &["run", "--help"], &["hold", "--help"]] {
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
