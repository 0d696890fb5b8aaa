//! The command's processes as dlock sees them from outside: where its signals go (the
//! command alone, or its process group) and whether any of them still runs.

use std::time::Duration;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;

/// Where signals for the command go: its process group (everything it started), or the
/// command alone (--foreground, or an interactive terminal).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Target {
    pub(crate) pid: Pid,
    pub(crate) group: bool,
}

pub(crate) fn signal_command(target: Option<Target>, sig: Signal) {
    if let Some(t) = target {
        // ESRCH (nothing left to signal) is not an error here.
        let _ = match t.group {
            true => killpg(t.pid, sig),
            false => kill(t.pid, sig),
        };
    }
}

/// How often a process group is checked for live members: the kernel sends no event when
/// a group empties (only a child's own exit is reported).
pub(crate) const GROUP_POLL: Duration = Duration::from_millis(50);

/// Wait until no process of group `pgid` is left, or `deadline`; whether the group ended.
pub(crate) async fn group_ends_by(pgid: Pid, deadline: tokio::time::Instant) -> bool {
    loop {
        if !group_alive(pgid) {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(GROUP_POLL).await;
    }
}

/// Whether process `pid` is alive (a zombie is not).
pub(crate) fn process_alive(pid: Pid) -> bool {
    if kill(pid, None).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(stat_fields(&stat).0, Some("Z" | "X")),
        // Gone between the two checks, or no /proc: kill(0) said it is there.
        Err(_) => kill(pid, None).is_ok(),
    }
}

/// The state and process group in a `/proc/PID/stat` line ("pid (comm) state ppid pgrp
/// …"; the command name may hold spaces and parentheses).
fn stat_fields(stat: &str) -> (Option<&str>, Option<i32>) {
    let mut fields = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace();
    let state = fields.next();
    let pgrp = fields.nth(1).and_then(|p| p.parse::<i32>().ok());
    (state, pgrp)
}

/// Whether a live process is in group `pgid`. Zombies nobody reaped (in a container
/// without an init) still count for `killpg`, so /proc tells them apart.
pub(crate) fn group_alive(pgid: Pid) -> bool {
    if killpg(pgid, None).is_err() {
        return false;
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return true;
    };
    entries.flatten().any(|entry| {
        let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
        let (state, pgrp) = stat_fields(&stat);
        pgrp == Some(pgid.as_raw()) && !matches!(state, Some("Z" | "X"))
    })
}
