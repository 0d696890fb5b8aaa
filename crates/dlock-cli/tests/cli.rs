//! The real `dlock` binary: help, output format, exit codes, on the in-process backend.

use std::process::{Command, Output};

const DLOCK: &str = env!("CARGO_BIN_EXE_dlock");

fn dlock(args: &[&str]) -> Output {
    Command::new(DLOCK).args(args).output().expect("run dlock")
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
