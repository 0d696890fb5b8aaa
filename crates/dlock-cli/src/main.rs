//! `dlock`: run a command under a distributed lock, or hold one, from a shell — as
//! `flock(1)`, `etcdctl lock` or `consul lock` do, on any dlock backend; and see who holds
//! a key (`dlock status`) and which keys are held (`dlock list`); run a command while leading
//! an election (`dlock elect`) and see who leads (`dlock leader`).

mod args;
mod guard;
mod hold;
mod leader;
mod list;
mod output;
mod processes;
mod run;
mod status;
mod take;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser as _;
use dlock::{ErrorKind, LockError};

use args::{Cli, Cmd};
use guard::guard;
use hold::hold;
use leader::leader;
use list::list;
use output::say;
use run::{elect, run};
use status::status;

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
        Cmd::Status(args) => status(args).await,
        Cmd::List(args) => list(args).await,
        Cmd::Elect(args) => elect(args).await,
        Cmd::Leader(args) => leader(args).await,
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
        ErrorKind::InvalidConfig | ErrorKind::InvalidKey | ErrorKind::Unsupported => exit::USAGE,
        ErrorKind::Unavailable => exit::UNAVAILABLE,
        ErrorKind::Timeout => exit::TEMPFAIL,
        _ => exit::SOFTWARE,
    }
}

/// How long dlock waits, before it exits, for server-side clean-up left to the background
/// (a wait it gave up: a queued node, a lease, a waiting statement); whatever is left
/// expires with its ttl or session.
const CLEANUP_LIMIT: Duration = Duration::from_secs(5);

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
