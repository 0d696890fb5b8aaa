//! `dlock`: run a command under a distributed lock, or hold one, from a shell — as
//! `flock(1)`, `etcdctl lock` or `consul lock` do, on any dlock backend.

mod args;
mod guard;
mod output;
mod processes;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser as _;
use dlock::{ErrorKind, Lease, LockError};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

use args::{Cli, Cmd, HoldArgs, LockArgs, OnLost, RunArgs, after};
use guard::{Guard, guard};
use output::{out, say, shown_key};
use processes::{GROUP_POLL, Target, group_alive, group_ends_by, signal_command};

/// Exit codes (sysexits.h).
mod exit {
    /// Bad usage or configuration (EX_USAGE).
    pub(crate) const USAGE: u8 = 64;
    /// The lock server could not be reached (EX_UNAVAILABLE).
    pub(crate) const UNAVAILABLE: u8 = 69;
    /// Something else went wrong: a server refusal, or the lease was lost (EX_SOFTWARE).
    pub(crate) const SOFTWARE: u8 = 70;
    /// The wait ran out with the lock still held elsewhere (EX_TEMPFAIL).
    pub(crate) const TEMPFAIL: u8 = 75;
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout and succeed; every other parse error is
            // a usage error: 64 (EX_USAGE), as --help says, not clap's own 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE } else { 0 });
        }
    };
    // The guard only waits and signals: no runtime, no threads.
    if let Cmd::Guard(args) = &cli.command {
        return ExitCode::from(guard(args));
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("DLOCK_LOG"))
        .with_writer(std::io::stderr)
        .init();
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(lock_main(cli.command)),
        Err(e) => {
            say!("dlock: cannot start the async runtime: {e}");
            ExitCode::from(exit::SOFTWARE)
        }
    }
}

async fn lock_main(command: Cmd) -> ExitCode {
    let outcome = match command {
        Cmd::Run(args) => run(args).await,
        Cmd::Hold(args) => hold(args).await,
        Cmd::Guard(_) => unreachable!("the guard runs without a runtime"),
    };
    // Whatever was left to background clean-up (a cancelled wait's node or lease, a lease
    // dropped on an error path) finishes before the runtime goes.
    if !dlock::settle(CLEANUP_LIMIT).await {
        say!("dlock: some clean-up on the server is left to its ttl or session");
    }
    match outcome {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            say!("dlock: {}", message(&e));
            ExitCode::from(exit_code(&e))
        }
    }
}

/// An error's message for a `dlock: …` line. Errors of the dlock crate itself (an unknown
/// URL scheme) name "dlock" as their backend, and would read `dlock: dlock: …`.
fn message(e: &LockError) -> String {
    let text = e.to_string();
    match text.strip_prefix("dlock: ") {
        Some(rest) => rest.to_owned(),
        None => text,
    }
}

fn exit_code(e: &LockError) -> u8 {
    match e.kind() {
        ErrorKind::InvalidConfig | ErrorKind::InvalidKey => exit::USAGE,
        ErrorKind::Unavailable => exit::UNAVAILABLE,
        ErrorKind::Timeout => exit::TEMPFAIL,
        _ => exit::SOFTWARE,
    }
}

/// How long dlock waits, before it exits, for server-side clean-up left to the background
/// (a wait it gave up: a queued node, a lease, a waiting statement); whatever is left
/// expires with its ttl or session.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);

/// Acquire the lock, unless SIGINT, SIGTERM, SIGHUP or SIGQUIT comes first: then give the
/// wait up and answer `Err(exit code)` (128 + the signal's number).
async fn take(
    args: &LockArgs,
    url: &str,
    signals: &mut Signals,
) -> Result<Result<Lease, u8>, LockError> {
    let acquire = async {
        let lock = dlock::connect(url).await?;
        lock.acquire(&args.key, &args.options()).await
    };
    let sig = tokio::select! {
        lease = acquire => return Ok(Ok(lease?)),
        sig = signals.next() => sig,
    };
    say!(
        "dlock: {sig} while waiting for {:?}: gave up the wait",
        args.key
    );
    Ok(Err(128 + sig as u8))
}

async fn run(args: RunArgs) -> Result<u8, LockError> {
    let url = args.lock.url()?;
    let mut signals = Signals::install();
    let lease = match take(&args.lock, &url, &mut signals).await? {
        Ok(lease) => lease,
        Err(code) => return Ok(code),
    };
    let (program, rest) = args.command.split_first().expect("clap requires a command");
    // An interactive foreground job keeps the command in the terminal's foreground group,
    // where it may prompt and gets the terminal's signals itself.
    let group = !args.foreground && !in_terminal_foreground();
    let mut command = Command::new(program);
    command
        .args(rest)
        // The lock service URL may carry a password: the command does not need it.
        .env_remove("DLOCK_URL")
        .env_remove("DLOCK_URL_FILE")
        .env("DLOCK_KEY", lease.key())
        .env("DLOCK_FENCING_TOKEN", lease.fencing_token().to_string());
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
            let _ = lease.release().await;
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
            reason = lease.lost(), if !lost_reported => {
                lost_reported = true;
                say!("dlock: lease on {:?} lost: {reason}", lease.key());
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
    if !lost_reported && lease.is_lost() {
        lost_reported = true;
        say!(
            "dlock: lease on {:?} was lost while the command ran",
            lease.key()
        );
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
    let released = lease.release().await;
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

/// Whether dlock runs as the foreground job of a terminal (an interactive shell): it has a
/// controlling terminal whose foreground group is dlock's own. Not under cron, systemd or a
/// background job.
fn in_terminal_foreground() -> bool {
    std::fs::File::open("/dev/tty")
        .ok()
        .and_then(|tty| nix::unistd::tcgetpgrp(&tty).ok())
        .is_some_and(|foreground| foreground == nix::unistd::getpgrp())
}

/// The signals dlock catches from before the acquire to the end: SIGINT, SIGTERM, SIGHUP
/// (the terminal went away) and SIGQUIT.
struct Signals([(Signal, Option<tokio::signal::unix::Signal>); 4]);

impl Signals {
    fn install() -> Self {
        let catch = |sig, kind| (sig, signal(kind).ok());
        Self([
            catch(Signal::SIGINT, SignalKind::interrupt()),
            catch(Signal::SIGTERM, SignalKind::terminate()),
            catch(Signal::SIGHUP, SignalKind::hangup()),
            catch(Signal::SIGQUIT, SignalKind::quit()),
        ])
    }

    /// The next of these signals.
    async fn next(&mut self) -> Signal {
        async fn recv(caught: &mut (Signal, Option<tokio::signal::unix::Signal>)) -> Signal {
            let received = match &mut caught.1 {
                Some(stream) => stream.recv().await.is_some(),
                None => false,
            };
            if !received {
                std::future::pending::<()>().await;
            }
            caught.0
        }
        let [int, term, hup, quit] = &mut self.0;
        tokio::select! {
            sig = recv(int) => sig,
            sig = recv(term) => sig,
            sig = recv(hup) => sig,
            sig = recv(quit) => sig,
        }
    }
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

async fn hold(args: HoldArgs) -> Result<u8, LockError> {
    let url = args.lock.url()?;
    let mut signals = Signals::install();
    let lease = match take(&args.lock, &url, &mut signals).await? {
        Ok(lease) => lease,
        Err(code) => return Ok(code),
    };
    out!(
        "acquired key={} token={}",
        shown_key(lease.key()),
        lease.fencing_token()
    );
    let elapsed = async {
        match args.hold_for {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        reason = lease.lost() => {
            out!("lost: {reason}");
            let _ = lease.release().await;
            return Ok(exit::SOFTWARE);
        }
        _ = elapsed => {}
        _ = signals.next() => {}
    }
    lease.release().await?;
    out!("released");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_drop_the_dlock_backend_prefix_only() {
        let own = LockError::invalid_config("dlock", "unknown scheme \"nope\"");
        assert_eq!(
            message(&own),
            "invalid configuration: unknown scheme \"nope\""
        );
        let backend = LockError::invalid_config("redis", "bad option");
        assert_eq!(
            message(&backend),
            "redis: invalid configuration: bad option"
        );
        let key = LockError::invalid_key("", "a key must not be empty");
        assert_eq!(message(&key), "invalid key \"\": a key must not be empty");
    }
}
