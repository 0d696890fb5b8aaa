//! `dlock`: run a command under a distributed lock, or hold one, from a shell — as
//! `flock(1)`, `etcdctl lock` or `consul lock` do, on any dlock backend.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use dlock::{ErrorKind, Lease, LockError, LockOptions, Wait};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::signal::unix::{SignalKind, signal};

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

const AFTER_HELP: &str = "\
Exit codes: 64 usage or configuration error, 69 lock server unavailable, 70 lease lost or server
refused, 75 wait timed out (the lock is busy); 128 + N when signal N ended the wait (130, 143…);
`run` otherwise exits with the command's code (128 + N when it was killed by signal N).

A URL with a password belongs in a file only the service user can read, named by --url-file or
DLOCK_URL_FILE, or in DLOCK_URL: every user of the host can read --url with `ps`.

Examples:
  dlock run --url redis://127.0.0.1:6379 --key nightly-backup --no-wait -- /usr/local/bin/backup
  DLOCK_URL=zk://10.0.0.5:2181 dlock hold --key maintenance --for 10m
  dlock run --url-file /etc/dlock/url --key reports --wait 5m -- /usr/local/bin/reports";

/// Run a command under a distributed lock, or hold one.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, after_help = AFTER_HELP)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Acquire KEY, run CMD while keeping the lease renewed, release when it exits.
    ///
    /// The command sees DLOCK_KEY and DLOCK_FENCING_TOKEN in its environment, and not
    /// DLOCK_URL or DLOCK_URL_FILE (the URL may hold a password). Unless dlock
    /// is an interactive terminal's foreground job or --foreground is given, it runs in a
    /// process group of its own: SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to dlock, and the
    /// signals of --on-lost, reach every process it started, and background jobs it leaves
    /// keep the lock until they end (at most --grace, then they are stopped).
    ///
    /// Should dlock itself be killed (SIGKILL, the OOM killer), the lease is no longer
    /// renewed and expires within --ttl. A guard process dlock starts for this (`dlock
    /// guard`, in a process group of its own, holding no URL) then stops the command (its
    /// process group) as --on-lost term or kill would. With --on-lost ignore there is no
    /// guard, and a guard killed along with dlock cannot act: where that matters, run dlock
    /// under a supervisor that stops every process of the job when dlock ends (systemd's
    /// default KillMode=control-group).
    #[command(
        after_help = "Example (cron: run the backup on one host only, skip if another runs it):\n  \
        dlock run --url redis://127.0.0.1:6379 --key nightly-backup --no-wait -- /usr/local/bin/backup"
    )]
    Run(RunArgs),
    /// Acquire KEY and hold it until --for elapses or SIGINT/SIGTERM, then release.
    ///
    /// Prints exactly one line `acquired key=<key> token=<n>` once held, then `released`;
    /// `lost: <reason>` (exit 70) if the lease is lost. A key with blanks, quotes,
    /// backslashes or characters that do not print is shown quoted and escaped as a Rust
    /// string ("a\nb"); a plain key is shown as it is.
    #[command(after_help = "Example (block a deploy for ten minutes):\n  \
        dlock hold --url etcd://127.0.0.1:2379 --key deploy/prod --for 10m")]
    Hold(HoldArgs),
    /// Internal: started by `dlock run`; stops the command if that dlock ends without
    /// telling it to stand down (dlock was killed).
    #[command(hide = true)]
    Guard(GuardArgs),
}

/// How the guard of a `dlock run` stops the command. It reads the command's pid from its
/// stdin, a pipe whose only writer is the dlock that started it; then end of file means that
/// dlock is gone, whatever killed it.
#[derive(Debug, Args)]
struct GuardArgs {
    /// Stop the command's process group (whose id is its pid), not the command alone.
    #[arg(long)]
    group: bool,
    /// SIGKILL at once (--on-lost kill), not SIGTERM then SIGKILL after --grace.
    #[arg(long)]
    kill: bool,
    /// Time between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_span)]
    grace: Duration,
}

#[derive(Debug, Args)]
struct LockArgs {
    /// Lock service URL, e.g. redis://127.0.0.1:6379, zk://h:2181, etcd://h:2379,
    /// mysql://user:pass@h/db, postgres://user:pass@h/db,
    /// redlock://h1:7001,h2:7002,h3:7003.
    ///
    /// Every user of the host can read --url with `ps`: pass a URL with a password with
    /// --url-file or DLOCK_URL_FILE (a file only the service user can read), or DLOCK_URL.
    // Which of --url and --url-file is given is checked by `url()`, not clap: clap would
    // name --url for DLOCK_URL, an option the user did not give.
    #[arg(long, env = "DLOCK_URL", hide_env_values = true)]
    url: Option<String>,
    /// Read the lock service URL from this file: one line, the final newline and surrounding
    /// blanks ignored. For a URL with a password; make the file readable only by the user
    /// dlock runs as.
    #[arg(
        long,
        env = "DLOCK_URL_FILE",
        hide_env_values = true,
        value_name = "PATH"
    )]
    url_file: Option<PathBuf>,
    /// The lock's name.
    #[arg(long)]
    key: String,
    /// Lease time on the server without a renewal (renewed every ttl/3 while held); 100ms
    /// to 1day.
    #[arg(long, default_value = "15s", value_parser = parse_ttl)]
    ttl: Duration,
    /// How long to wait for a busy lock (default: forever); at most 1year.
    #[arg(long, value_parser = parse_span, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock is busy.
    #[arg(long)]
    no_wait: bool,
}

impl LockArgs {
    /// The lock service URL: --url or DLOCK_URL, or the content of --url-file or
    /// DLOCK_URL_FILE.
    fn url(&self) -> Result<String, LockError> {
        match (&self.url, &self.url_file) {
            (Some(url), None) => Ok(url.clone()),
            (None, Some(path)) => read_url_file(path),
            (Some(_), Some(_)) => Err(LockError::invalid_config(
                "dlock",
                "both --url (or DLOCK_URL) and --url-file (or DLOCK_URL_FILE) are given: give one",
            )),
            (None, None) => Err(LockError::invalid_config(
                "dlock",
                "no lock service URL: give --url-file (or DLOCK_URL_FILE), DLOCK_URL or --url",
            )),
        }
    }

    fn options(&self) -> LockOptions {
        let wait = match (self.no_wait, self.wait) {
            (true, _) => Wait::No,
            (false, Some(d)) => Wait::For(d),
            (false, None) => Wait::Forever,
        };
        LockOptions::new().ttl(self.ttl).wait(wait)
    }
}

#[derive(Debug, Args)]
struct RunArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// What to do to the command if the lease is lost: `term` sends SIGTERM, then SIGKILL
    /// after --grace; `kill` sends SIGKILL; `ignore` lets it run (and warns).
    #[arg(long, value_enum, default_value = "term")]
    on_lost: OnLost,
    /// Time between SIGTERM and SIGKILL with --on-lost term, and how long background jobs
    /// the command left may keep the lock after it exits; at most 1year.
    #[arg(long, default_value = "10s", value_parser = parse_span)]
    grace: Duration,
    /// Keep the command in dlock's process group (the default for an interactive terminal's
    /// foreground job), so that it can read from the terminal; the terminal's signals reach
    /// it directly, and --on-lost reaches the command alone.
    #[arg(long)]
    foreground: bool,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    command: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnLost {
    Term,
    Kill,
    Ignore,
}

#[derive(Debug, Args)]
struct HoldArgs {
    #[command(flatten)]
    lock: LockArgs,
    /// Release after this long (default: hold until SIGINT or SIGTERM); at most 1year.
    #[arg(long = "for", value_parser = parse_span)]
    hold_for: Option<Duration>,
}

/// The longest --wait, --for and --grace: a year as humantime counts it (365.25 days), and
/// far from the limits of `Instant` arithmetic.
const MAX_SPAN: Duration = Duration::from_secs(31_557_600);

/// --ttl: a duration within the bounds every backend accepts, so that a wrong value is a
/// usage error before anything is connected.
fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if !(LockOptions::MIN_TTL..=LockOptions::MAX_TTL).contains(&ttl) {
        return Err(format!(
            "the ttl must be between {} and {}",
            humantime::format_duration(LockOptions::MIN_TTL),
            humantime::format_duration(LockOptions::MAX_TTL)
        ));
    }
    Ok(ttl)
}

/// --wait, --for, --grace: a duration of at most [`MAX_SPAN`].
fn parse_span(text: &str) -> Result<Duration, String> {
    let span = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if span > MAX_SPAN {
        return Err(format!(
            "at most {} is accepted",
            humantime::format_duration(MAX_SPAN)
        ));
    }
    Ok(span)
}

/// The instant `span` from now. The options are bounded (at most [`MAX_SPAN`]), so this
/// cannot overflow; if it did, now: the soonest end, which stops the command rather than
/// letting it run on.
fn after(span: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(span).unwrap_or(now)
}

/// The longest URL file read: a URL is far shorter; this stops at a wrong file (a log, a
/// device) before reading it all.
const URL_FILE_MAX: u64 = 64 * 1024;

/// The URL a file holds: its one line, without the final newline and surrounding blanks.
/// Errors name the file and never show what it holds (a password, or a wrong file's
/// secrets).
fn read_url_file(path: &Path) -> Result<String, LockError> {
    use std::io::Read as _;
    let bad =
        |what: String| LockError::invalid_config("dlock", format!("URL file {path:?} {what}"));
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(URL_FILE_MAX + 1).read_to_end(&mut bytes))
        .map_err(|e| bad(format!("cannot be read: {e}")))?;
    if bytes.len() as u64 > URL_FILE_MAX {
        return Err(bad(format!("is larger than {} KiB", URL_FILE_MAX / 1024)));
    }
    let text = String::from_utf8(bytes).map_err(|_| bad("is not UTF-8 text".into()))?;
    let url = text.trim();
    if url.is_empty() {
        return Err(bad("is empty".into()));
    }
    if url.contains(['\n', '\r']) {
        return Err(bad("holds more than one line".into()));
    }
    Ok(url.to_owned())
}

/// Print a line to stderr, escaped by [`one_line`]. A terminal that hung up (SIGHUP) makes
/// writes fail; that must not stop the release.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!($($arg)*);
        let _ = writeln!(std::io::stderr(), "{}", one_line(&line));
    }};
}

/// Print a line to stdout, escaped by [`one_line`], and flush it, ignoring a closed
/// terminal or pipe.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!($($arg)*);
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", one_line(&line));
        let _ = out.flush();
    }};
}

/// A key as dlock prints it in `key=…`: as it is when plain (not empty; no blank, quote,
/// backslash or character that does not print), so that `acquired key=K token=N` reads as
/// it always did; otherwise quoted and escaped as a Rust string (`"a\nb"`), which no plain
/// key can be taken for. A key cannot add a line or a field to the output, or drive the
/// terminal.
fn shown_key(key: &str) -> Cow<'_, str> {
    let quoted = format!("{key:?}");
    // Debug escapes quotes, backslashes, control characters and characters that do not
    // print; blanks it leaves as they are.
    let plain = !key.is_empty()
        && quoted.len() == key.len() + 2
        && !key.chars().any(|c| c.is_whitespace() || is_unsafe(c));
    match plain {
        true => Cow::Borrowed(key),
        false => Cow::Owned(quoted),
    }
}

/// Characters that must not reach the output as they are: control characters (a newline,
/// a terminal escape), line and paragraph separators, and the bidirectional overrides
/// that make text read other than it is.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{61c}'
        )
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `line` with the characters of [`is_unsafe`] escaped (`\n`, `\u{1b}`…): text from a key,
/// a server's error or a file name stays on dlock's one line.
fn one_line(line: &str) -> Cow<'_, str> {
    if !line.chars().any(is_unsafe) {
        return Cow::Borrowed(line);
    }
    let mut escaped = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        match is_unsafe(c) {
            true => escaped.extend(c.escape_debug()),
            false => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
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

/// Where signals for the command go: its process group (everything it started), or the
/// command alone (--foreground, or an interactive terminal).
#[derive(Debug, Clone, Copy)]
struct Target {
    pid: Pid,
    group: bool,
}

fn signal_command(target: Option<Target>, sig: Signal) {
    if let Some(t) = target {
        // ESRCH (nothing left to signal) is not an error here.
        let _ = match t.group {
            true => killpg(t.pid, sig),
            false => kill(t.pid, sig),
        };
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

/// The guard process of a `dlock run` (`dlock guard`): it stops the command should this
/// dlock be killed. A watcher outside dlock, since nothing inside a SIGKILLed process runs:
/// PR_SET_PDEATHSIG would need unsafe code before exec, or setpriv(1), which sets it in a
/// race with dlock's death and for the command alone, not its process group.
#[derive(Debug)]
struct Guard(tokio::process::Child);

impl Guard {
    /// Start a guard for a command (its process group with `group`); `None` (with a
    /// warning) if it cannot start. [`watch`](Self::watch) tells it the command's pid.
    fn start(group: bool, kill: bool, grace: Duration) -> Option<Self> {
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
    async fn watch(&mut self, pid: Pid) {
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
    async fn stand_down(mut self) {
        let _ = self.0.kill().await;
    }
}

/// `dlock guard`: wait until the dlock that started it is gone (end of file on stdin),
/// then stop the command as --on-lost would. A dlock that ends normally stops its guard
/// first.
fn guard(args: &GuardArgs) -> u8 {
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

/// How often a process group is checked for live members: the kernel sends no event when
/// a group empties (only a child's own exit is reported).
const GROUP_POLL: Duration = Duration::from_millis(50);

/// Wait until no process of group `pgid` is left, or `deadline`; whether the group ended.
async fn group_ends_by(pgid: Pid, deadline: tokio::time::Instant) -> bool {
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
fn process_alive(pid: Pid) -> bool {
    if kill(pid, None).is_err() {
        return false;
    }
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !matches!(stat_fields(&stat).0, Some("Z" | "X")),
        // Gone between the two checks, or no /proc: kill(0) said it is there.
        Err(_) => kill(pid, None).is_ok(),
    }
}

/// The state and process group in a /proc/<pid>/stat line ("pid (comm) state ppid pgrp
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
fn group_alive(pgid: Pid) -> bool {
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
    fn durations_are_bounded() {
        assert_eq!(parse_ttl("15s"), Ok(Duration::from_secs(15)));
        assert_eq!(parse_ttl("100ms"), Ok(LockOptions::MIN_TTL));
        assert_eq!(parse_ttl("1day"), Ok(LockOptions::MAX_TTL));
        for ttl in ["99ms", "0s", "1day 1s", "400000000000y", "soon"] {
            assert!(parse_ttl(ttl).is_err(), "{ttl}");
        }
        assert_eq!(parse_span("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_span("1year"), Ok(MAX_SPAN));
        for span in [
            "1year 1s",
            "400000000000y",
            "99999999999999999999999y",
            "-1s",
        ] {
            assert!(parse_span(span).is_err(), "{span}");
        }
        assert_eq!(
            parse_span("2years").unwrap_err(),
            "at most 1year is accepted"
        );
        assert!(after(MAX_SPAN) > tokio::time::Instant::now());
    }

    #[test]
    fn plain_keys_print_as_they_are() {
        for key in ["k", "jobs/nightly-backup:eu=1", "café/ключ", "a'b", "日本"] {
            assert_eq!(shown_key(key), key);
        }
    }

    #[test]
    fn other_keys_print_quoted_and_escaped() {
        let cases = [
            ("a\nb", r#""a\nb""#),
            ("a b", r#""a b""#),
            ("a\u{a0}b", r#""a\u{a0}b""#),
            ("x\r\x1b[2K\t\x07\x7f", r#""x\r\u{1b}[2K\t\u{7}\u{7f}""#),
            ("q\"b\\", r#""q\"b\\""#),
            ("rtl\u{202e}txt", r#""rtl\u{202e}txt""#),
            ("sep\u{2028}x", r#""sep\u{2028}x""#),
            ("zero\u{200b}width", r#""zero\u{200b}width""#),
            ("", r#""""#),
        ];
        for (key, shown) in cases {
            let out = shown_key(key);
            assert_eq!(out, shown, "{key:?}");
            assert!(!out.chars().any(is_unsafe), "{key:?}");
            assert_eq!(one_line(&out), out, "{key:?}");
        }
    }

    #[test]
    fn lines_escape_what_would_break_them() {
        assert_eq!(one_line("lost: plain reason"), "lost: plain reason");
        assert_eq!(
            one_line("lost: a\nforged: line\x1b[31m \u{202e}x"),
            r#"lost: a\nforged: line\u{1b}[31m \u{202e}x"#
        );
    }

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
