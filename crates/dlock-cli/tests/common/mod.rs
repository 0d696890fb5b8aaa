//! Process helpers shared by the CLI tests.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// Send SIGTERM to `child`.
pub(crate) fn sigterm(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("send SIGTERM");
}

/// The pid a test command wrote to `path`.
pub(crate) fn wait_for_pid(path: &Path) -> i32 {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(pid) = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            return pid;
        }
        assert!(
            Instant::now() < until,
            "the command never wrote {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` ended (or is a zombie nobody reaped) within `limit`. Reads /proc
/// (these tests run on Linux).
pub(crate) fn gone_within(pid: i32, limit: Duration) -> bool {
    assert!(
        Path::new("/proc/self/stat").exists(),
        "these tests need /proc (Linux)"
    );
    let until = Instant::now() + limit;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The state follows the command name, which is in parentheses.
        let state = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next());
        if matches!(state, None | Some("Z" | "X")) {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
