//! `dlock run`: acquire the lock (its keys, all or none), run the command under it (in a
//! process group of its own unless it is a terminal's foreground job), pass signals on,
//! stop it if the lease (any key) is lost, and release once it and what it started are
//! done. `dlock elect` does the same while leading an election.

use std::time::Duration;

use dlock::{Election, ErrorKind, Leadership, Lease, LeaseSet, LockError, LostReason};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Command;

use crate::args::{CommandArgs, ElectArgs, OnLost, RunArgs, after};
use crate::exit;
use crate::guard::Guard;
use crate::message;
use crate::output::say;
use crate::processes::{GROUP_POLL, Target, group_alive, group_ends_by, signal_command};
use crate::take::{Signals, take};

pub(crate) async fn run(args: RunArgs) -> Result<u8, LockError> {
    let url = args.lock.url()?;
    let mut signals = Signals::install();
    let set = match take(&args.lock, &url, &mut signals).await? {
        Ok(set) => set,
        Err(code) => return Ok(code),
    };
    let held = Held::Keys {
        set,
        several: args.lock.several_keys(),
        owner: args.lock.owner.clone(),
    };
    run_under(held, &args.command, signals).await
}

pub(crate) async fn elect(args: ElectArgs) -> Result<u8, LockError> {
    let url = args.source.url()?;
    let mut signals = Signals::install();
    let campaign = async {
        let lock = dlock::connect(&url).await?;
        let election = Election::new(lock, args.key.clone()).options(args.timing.options());
        election.campaign(&args.value).await
    };
    let leading = tokio::select! {
        leading = campaign => leading?,
        sig = signals.next() => {
            say!("dlock: {sig} while campaigning for {:?}: gave up the campaign", args.key);
            return Ok(128 + sig as u8);
        }
    };
    let held = Held::Leader {
        key: args.key,
        leading,
    };
    run_under(held, &args.command, signals).await
}

/// What the command runs under: the keys of `dlock run`, or the leadership of `dlock
/// elect`.
enum Held {
    Keys {
        set: LeaseSet,
        several: bool,
        owner: Option<String>,
    },
    Leader {
        key: String,
        leading: Leadership,
    },
}

impl Held {
    /// Resolves with the key and the reason once any hold is lost.
    async fn lost(&self) -> (&str, LostReason) {
        match self {
            Self::Keys { set, .. } => set.lost().await,
            Self::Leader { key, leading } => (key, leading.lost().await),
        }
    }

    /// A key whose hold is known to be lost.
    fn lost_key(&self) -> Option<&str> {
        match self {
            Self::Keys { set, .. } => set.leases().iter().find(|l| l.is_lost()).map(Lease::key),
            Self::Leader { key, leading } => leading.is_lost().then_some(key),
        }
    }

    async fn release(self) -> Result<(), LockError> {
        match self {
            Self::Keys { set, .. } => set.release().await,
            Self::Leader { leading, .. } => leading.resign().await,
        }
    }

    /// What the command learns of its hold (see [`environment`]); a leader also sees
    /// DLOCK_TERM and DLOCK_VALUE.
    fn environment(&self) -> Vec<(&'static str, String)> {
        match self {
            Self::Keys {
                set,
                several,
                owner,
            } => {
                let mut env = environment(set.leases(), *several);
                env.extend(owner.iter().map(|id| ("DLOCK_OWNER", id.clone())));
                env
            }
            Self::Leader { key, leading } => vec![
                ("DLOCK_KEY", key.clone()),
                ("DLOCK_FENCING_TOKEN", leading.term().to_string()),
                ("DLOCK_TERM", leading.term().to_string()),
                ("DLOCK_VALUE", leading.value().to_owned()),
            ],
        }
    }
}

/// Run the command of `args` under `held`, and let go of it once the command and what it
/// started are done.
async fn run_under(
    held: Held,
    args: &CommandArgs,
    mut signals: crate::take::Signals,
) -> Result<u8, LockError> {
    let (program, rest) = args.argv.split_first().expect("clap requires a command");
    // An interactive foreground job keeps the command in the terminal's foreground group,
    // where it may prompt and gets the terminal's signals itself.
    let group = !args.foreground && !in_terminal_foreground();
    let mut command = Command::new(program);
    command
        .args(rest)
        // The lock service URL may carry a password: the command does not need it.
        .env_remove("DLOCK_URL")
        .env_remove("DLOCK_URL_FILE")
        .envs(held.environment());
    if group {
        command.process_group(0);
    }
    // The guard starts first, so that the command is watched the moment it runs.
    let mut guard = match args.on_lost {
        OnLost::Ignore => None,
        on_lost => Guard::start(group, on_lost == OnLost::Kill, args.grace),
    };
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            say!("dlock: cannot run {program:?}: {e}");
            if let Some(guard) = guard {
                guard.stand_down().await;
            }
            let _ = held.release().await;
            return Ok(127);
        }
    };
    let target = child.id().map(|id| Target {
        pid: Pid::from_raw(id as i32),
        group,
    });
    if let (Some(guard), Some(target)) = (guard.as_mut(), target) {
        guard.watch(target.pid).await;
    }
    let mut lost_reported = false;
    let mut exited = None;
    // Once the command exited: when the background jobs it left must be done.
    let mut jobs_until = None;
    let status = loop {
        tokio::select! {
            // Loss first: a loss that comes with the child's exit must not be missed.
            biased;
            (key, reason) = held.lost(), if !lost_reported => {
                lost_reported = true;
                say!("dlock: lease on {key:?} lost: {reason}");
                match args.on_lost {
                    OnLost::Ignore => say!("dlock: --on-lost ignore: the command keeps running without the lock"),
                    OnLost::Kill => signal_command(target, Signal::SIGKILL),
                    OnLost::Term => break terminate(target, &mut child, args.grace).await,
                }
            }
            status = child.wait(), if exited.is_none() => {
                match target.filter(|t| t.group && group_alive(t.pid)) {
                    // What the command started in the background still works under the
                    // lock: it keeps the lock (as flock(1)'s does while it has the file
                    // open) for up to --grace.
                    Some(_) => {
                        exited = Some(status);
                        jobs_until = Some(after(args.grace));
                    }
                    None => break status,
                }
            }
            () = tokio::time::sleep(GROUP_POLL), if exited.is_some() => {
                let t = target.expect("a group was waited for");
                if !group_alive(t.pid) {
                    break exited.take().expect("the command exited");
                }
                if jobs_until.is_some_and(|until| tokio::time::Instant::now() >= until) {
                    say!(
                        "dlock: processes the command started still run {:?} after it exited; stopping them before the release",
                        args.grace
                    );
                    let _ = terminate(target, &mut child, args.grace).await;
                    break exited.take().expect("the command exited");
                }
            }
            sig = signals.next() => match group {
                true => signal_command(target, sig),
                // The terminal already signalled its whole foreground group, command
                // included; passing INT, QUIT or HUP on again would make it twice.
                false if sig == Signal::SIGTERM => signal_command(target, sig),
                false => {}
            },
        }
    };
    // The command and what it started are done: nothing is left for the guard to stop.
    if let Some(guard) = guard {
        guard.stand_down().await;
    }
    if !lost_reported && let Some(key) = held.lost_key() {
        lost_reported = true;
        say!("dlock: lease on {key:?} was lost while the command ran");
    }
    let code = match status {
        Ok(status) => status
            .code()
            .map(|c| c as u8)
            .or_else(|| {
                std::os::unix::process::ExitStatusExt::signal(&status).map(|s| 128 + s as u8)
            })
            .unwrap_or(exit::SOFTWARE),
        Err(e) => {
            say!("dlock: waiting for the command failed: {e}");
            exit::SOFTWARE
        }
    };
    let released = held.release().await;
    let lost = lost_reported
        || matches!(
            released.as_ref().map_err(LockError::kind),
            Err(ErrorKind::NotHeld | ErrorKind::LeaseLost)
        );
    if lost && args.on_lost != OnLost::Ignore {
        return Ok(exit::SOFTWARE);
    }
    if let Err(e) = released {
        say!("dlock: release: {}", message(&e));
    }
    Ok(code)
}

/// What the command learns of its hold: DLOCK_KEY and DLOCK_FENCING_TOKEN (the first key
/// of the set), and for several keys DLOCK_KEYS and DLOCK_FENCING_TOKENS, one line per key
/// in the set's (ascending) order.
fn environment(leases: &[Lease], several: bool) -> Vec<(&'static str, String)> {
    let first = leases.first().expect("a set holds at least one key");
    let mut env = vec![
        ("DLOCK_KEY", first.key().to_owned()),
        ("DLOCK_FENCING_TOKEN", first.fencing_token().to_string()),
    ];
    if several {
        let lines = |each: fn(&Lease) -> String| leases.iter().map(each).collect::<Vec<_>>();
        env.push(("DLOCK_KEYS", lines(|l| l.key().to_owned()).join("\n")));
        env.push((
            "DLOCK_FENCING_TOKENS",
            lines(|l| l.fencing_token().to_string()).join("\n"),
        ));
    }
    env
}

/// Whether dlock runs as the foreground job of a terminal (an interactive shell): it has a
/// controlling terminal whose foreground group is dlock's own. Not under cron, systemd or a
/// background job.
fn in_terminal_foreground() -> bool {
    std::fs::File::open("/dev/tty")
        .ok()
        .and_then(|tty| nix::unistd::tcgetpgrp(&tty).ok())
        .is_some_and(|foreground| foreground == nix::unistd::getpgrp())
}

/// SIGTERM the command, then SIGKILL whatever of it is still running after `grace`: the
/// command itself, or with a process group anything it started, even once it has exited.
async fn terminate(
    target: Option<Target>,
    child: &mut tokio::process::Child,
    grace: Duration,
) -> std::io::Result<std::process::ExitStatus> {
    signal_command(target, Signal::SIGTERM);
    let deadline = after(grace);
    let status = match tokio::time::timeout_at(deadline, child.wait()).await {
        Ok(status) => status,
        Err(_) => {
            signal_command(target, Signal::SIGKILL);
            return child.wait().await;
        }
    };
    if let Some(t) = target.filter(|t| t.group)
        && !group_ends_by(t.pid, deadline).await
    {
        let _ = killpg(t.pid, Signal::SIGKILL);
    }
    status
}
