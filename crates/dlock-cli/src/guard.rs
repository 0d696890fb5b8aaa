//! The guard of a `dlock run`: a process of its own that stops the command should dlock
//! be killed, and the handle on it that `dlock run` keeps.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;
use tokio::process::Command;

use crate::args::GuardArgs;
use crate::exit;
use crate::output::say;
use crate::processes::{GROUP_POLL, Target, group_alive, process_alive, signal_command};

/// The guard process of a `dlock run` (`dlock guard`): it stops the command should this
/// dlock be killed. A watcher outside dlock, since nothing inside a SIGKILLed process runs:
/// PR_SET_PDEATHSIG would need unsafe code before exec, or setpriv(1), which sets it in a
/// race with dlock's death and for the command alone, not its process group.
#[derive(Debug)]
pub(crate) struct Guard(tokio::process::Child);

impl Guard {
    /// Start a guard for a command (its process group with `group`); `None` (with a
    /// warning) if it cannot start. [`watch`](Self::watch) tells it the command's pid.
    pub(crate) fn start(group: bool, kill: bool, grace: Duration) -> Option<Self> {
        // /proc/self/exe runs this very binary, even if its file was replaced or removed
        // since dlock started.
        let cannot = |e: std::io::Error| {
            say!("dlock: cannot start the guard that stops the command if dlock is killed: {e}");
        };
        let exe = Path::new("/proc/self/exe");
        let exe = match exe.exists() {
            true => exe.to_owned(),
            false => std::env::current_exe().map_err(cannot).ok()?,
        };
        let mut command = Command::new(exe);
        command
            .arg0("dlock")
            .arg("guard")
            .arg("--grace")
            .arg(humantime::format_duration(grace).to_string())
            // End of file on stdin: this dlock is gone. The write end is dlock's alone: it is
            // close-on-exec, so the command does not keep it.
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .env_remove("DLOCK_URL")
            .env_remove("DLOCK_URL_FILE")
            // Not in the command's group (whose members keep the lock) nor in dlock's (a
            // signal to dlock's group, or the terminal's, must not take the guard along).
            .process_group(0);
        if group {
            command.arg("--group");
        }
        if kill {
            command.arg("--kill");
        }
        command.spawn().map(Self).map_err(cannot).ok()
    }

    /// Tell the guard the command's pid: from now on it stops the command if dlock dies.
    pub(crate) async fn watch(&mut self, pid: Pid) {
        use tokio::io::AsyncWriteExt as _;
        let line = format!("{pid}\n");
        let told = match self.0.stdin.as_mut() {
            Some(stdin) => stdin.write_all(line.as_bytes()).await.is_ok(),
            None => false,
        };
        if !told {
            say!("dlock: the guard that stops the command if dlock is killed has gone");
        }
    }

    /// The command is done: end the guard (SIGKILL; dlock is its parent, and reaps it).
    pub(crate) async fn stand_down(mut self) {
        let _ = self.0.kill().await;
    }
}

/// A guard's process name once it knows the command's pid.
pub(crate) const GUARDING: &std::ffi::CStr = c"dlock-guarding";

/// `dlock guard`: wait until the dlock that started it is gone (end of file on stdin),
/// then stop the command as --on-lost would. A dlock that ends normally stops its guard
/// first.
pub(crate) fn guard(args: &GuardArgs) -> u8 {
    use std::io::BufRead as _;
    let parent = nix::unistd::getppid();
    let mut stdin = std::io::stdin().lock();
    let mut line = String::new();
    // The command's pid; without it (dlock ended before it ran the command, or in the
    // instant between running it and writing this line), nothing to do.
    let pid = match stdin.read_line(&mut line) {
        Ok(_) if line.ends_with('\n') => match line.trim().parse::<i32>() {
            Ok(pid) if pid > 0 => Pid::from_raw(pid),
            _ => {
                say!("dlock guard: not a pid: {:?}", line.trim());
                return exit::USAGE;
            }
        },
        _ => return 0,
    };
    // Seen in `ps -o comm`: from here on the command is watched. (dlock is killed in the
    // instant between running the command and telling its pid only by bad luck; a test
    // that kills it on purpose waits for this name.)
    let _ = nix::sys::prctl::set_name(GUARDING);
    // Then only the end of the pipe: dlock is gone.
    let mut buf = [0; 64];
    loop {
        match std::io::Read::read(&mut stdin, &mut buf) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // The pipe cannot be watched: as if dlock were gone, rather than leave the
            // command unwatched.
            Err(_) => break,
        }
    }
    let target = Target {
        pid,
        group: args.group,
    };
    let alive = || match target.group {
        true => group_alive(target.pid),
        false => process_alive(target.pid),
    };
    if !alive() {
        return 0;
    }
    let how = match args.kill {
        true => {
            signal_command(Some(target), Signal::SIGKILL);
            "SIGKILL".to_owned()
        }
        false => {
            signal_command(Some(target), Signal::SIGTERM);
            let until = std::time::Instant::now().checked_add(args.grace);
            while alive() && until.is_some_and(|until| std::time::Instant::now() < until) {
                std::thread::sleep(GROUP_POLL);
            }
            match alive() {
                true => {
                    signal_command(Some(target), Signal::SIGKILL);
                    format!(
                        "SIGTERM, SIGKILL after {}",
                        humantime::format_duration(args.grace)
                    )
                }
                false => "SIGTERM".to_owned(),
            }
        }
    };
    // Last: on a terminal that stops background writers, this write could stop the guard.
    let what = match target.group {
        true => "process group",
        false => "process",
    };
    say!(
        "dlock: dlock (pid {parent}) ended while the command ran, and its lease expires: stopped the command's {what} {} ({how})",
        target.pid
    );
    exit::SOFTWARE
}
