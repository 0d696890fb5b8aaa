//! The command line: the subcommands and their options, the bounds of the durations they
//! take, and the lock service URL (--url, or read from --url-file).

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use dlock::{LockError, LockOptions, Mode, Wait};

const AFTER_HELP: &str = "\
Exit codes: 64 usage or configuration error, 69 lock server unavailable, 70 lease lost or server
refused, 75 wait timed out (the lock is busy); 128 + N when signal N ended the wait (130, 143…);
`run` otherwise exits with the command's code (128 + N when it was killed by signal N). `status`
exits 0 whether the key is held or free; `list` exits 64 on a backend that cannot enumerate its
keys.

A URL with a password belongs in a file only the service user can read, named by --url-file or
DLOCK_URL_FILE, or in DLOCK_URL: every user of the host can read --url with `ps`.

Examples:
  dlock run --url redis://127.0.0.1:6379 --key nightly-backup --no-wait -- /usr/local/bin/backup
  DLOCK_URL=zk://10.0.0.5:2181 dlock hold --key maintenance --for 10m
  dlock run --url-file /etc/dlock/url --key reports --wait 5m -- /usr/local/bin/reports
  dlock run --url etcd://127.0.0.1:2379 --key exports --permits 4 --wait 10m -- /usr/local/bin/export
  dlock run --url redis://127.0.0.1:6379 --key accounts/7 --key accounts/3 --wait 30s -- ./transfer
  dlock status --url zk://10.0.0.5:2181 --key maintenance
  dlock list --url etcd://127.0.0.1:2379 --prefix deploy/
  dlock elect --url etcd://127.0.0.1:2379 --key billing/leader --value \"$(hostname):8080\" -- ./billing
  dlock leader --url etcd://127.0.0.1:2379 --key billing/leader --watch";

/// Run a command under a distributed lock, or hold one; run one while leading an election;
/// show who holds a key or leads, or list held keys.
#[derive(Debug, Parser)]
#[command(name = "dlock", version, after_help = AFTER_HELP)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Cmd,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Cmd {
    /// Acquire KEY, run CMD while keeping the lease renewed, release when it exits.
    ///
    /// The command sees DLOCK_KEY and DLOCK_FENCING_TOKEN in its environment, and not
    /// DLOCK_URL or DLOCK_URL_FILE (the URL may hold a password). With --key given more
    /// than once, all the keys are taken or none, and the command also sees DLOCK_KEYS and
    /// DLOCK_FENCING_TOKENS: the keys in ascending order and their tokens, one per line
    /// each (a key with a newline cannot be told apart there); DLOCK_KEY and
    /// DLOCK_FENCING_TOKEN are then the first of them. With --owner (or DLOCK_OWNER) it
    /// also sees DLOCK_OWNER. Losing any of the keys is losing
    /// the lease (--on-lost). Unless dlock
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
        after_help = "Examples (cron: run the backup on one host only, skip if another runs it; \
        a transfer under both accounts' keys, taken together or not at all):\n  \
        dlock run --url redis://127.0.0.1:6379 --key nightly-backup --no-wait -- /usr/local/bin/backup\n  \
        dlock run --url redis://127.0.0.1:6379 --key accounts/7 --key accounts/3 --wait 30s -- ./transfer"
    )]
    Run(RunArgs),
    /// Acquire KEY and hold it until --for elapses or SIGINT/SIGTERM, then release.
    ///
    /// Prints one line `acquired key=<key> token=<n>` per key once all are held (one key:
    /// exactly one line; several: in ascending key order), then `released`; `lost:
    /// <reason>` (exit 70) if the lease is lost, or with --key given more than once `lost:
    /// key=<key>: <reason>` naming the key lost. A key with blanks, quotes, backslashes or
    /// characters that do not print is shown quoted and escaped as a Rust string ("a\nb");
    /// a plain key is shown as it is.
    #[command(
        after_help = "Examples (block a deploy for ten minutes; hold two keys, both or neither):\n  \
        dlock hold --url etcd://127.0.0.1:2379 --key deploy/prod --for 10m\n  \
        dlock hold --url etcd://127.0.0.1:2379 --key deploy/prod --key deploy/staging --for 10m"
    )]
    Hold(HoldArgs),
    /// Show who holds KEY and who waits for it, without taking or changing anything.
    ///
    /// Prints `key: <key>`, then one `holder: <mode> [token=N] [since=<RFC 3339 time>]
    /// [ttl_left=<seconds>s] [who=<holder>]` line per hold (`holder: none` for a free key),
    /// then one `waiter <n>: <mode> [since=…] [who=…]` line per waiter, first in line
    /// first where the backend keeps an order (`waiters: none` when nobody waits, `waiters:
    /// not visible on this backend` where the server does not show them). A field the
    /// backend does not know is left out; a mode it does not show is `?`. <mode> is
    /// exclusive, shared, permits(N), or permits where N is not stored on the server. Keys
    /// and who are shown as `dlock hold` shows keys: quoted and escaped when not plain.
    ///
    /// --json prints one JSON object instead: {"key", "holders": [{"mode", "permits",
    /// "fencing_token", "since", "ttl_left_ms", "who"}], "waiters": [{"mode", "permits",
    /// "since", "who"}] or null}, unknown fields null, times in RFC 3339 (UTC, milliseconds).
    /// Exits 0 whether the key is held or free.
    #[command(
        after_help = "Examples (who holds the maintenance lock; the same as JSON, for a script):\n  \
        dlock status --url zk://10.0.0.5:2181 --key maintenance\n  \
        dlock status --url zk://10.0.0.5:2181 --key maintenance --json | jq -r '.holders[].who'"
    )]
    Status(StatusArgs),
    /// List the held keys that start with PREFIX, sorted, one per line.
    ///
    /// Keys are shown as `dlock hold` shows them: quoted and escaped when not plain. --json
    /// prints one JSON array of strings instead. Only keys held now are listed (not keys
    /// that are only waited for). A backend that cannot enumerate its keys (see the
    /// backend's capabilities) says so and exits 64.
    #[command(
        after_help = "Examples (the deploy locks held now; every held key):\n  \
        dlock list --url etcd://127.0.0.1:2379 --prefix deploy/\n  \
        DLOCK_URL=zk://10.0.0.5:2181 dlock list"
    )]
    List(ListArgs),
    /// Campaign in KEY's election publishing VALUE; once leading, run CMD, and resign when it
    /// exits.
    ///
    /// Waits (up to --wait, default forever) until this candidate leads: one leader at a
    /// time per key. The command sees DLOCK_KEY, DLOCK_FENCING_TOKEN and DLOCK_TERM (the
    /// leader's term, its fencing token, larger for every new leader) and DLOCK_VALUE, and
    /// is stopped as `dlock run` stops it if the leadership is lost (--on-lost). Exit codes
    /// as `dlock run`. VALUE (1 to 256 bytes, no control character) is what `dlock leader`
    /// and every observer see, e.g. the leader's address.
    #[command(
        after_help = "Examples (run the billing service on one host at a time, the others standing by):\n  \
        dlock elect --url etcd://127.0.0.1:2379 --key billing/leader --value \"$(hostname):8080\" -- ./billing"
    )]
    Elect(ElectArgs),
    /// Show who leads KEY's election: `leader: <value> term=<n>`, or `leader: none`.
    ///
    /// With --watch, print the leader now and then one such line at each change (a new
    /// leader, a new value, nobody leading), until SIGINT or SIGTERM; a backend that cannot
    /// wake observers is read again at the interval its capabilities state. The value is
    /// shown as `dlock hold` shows keys: quoted and escaped when not plain. --json prints
    /// one JSON object per line instead: {"key", "leader": {"value", "term"} or null}.
    #[command(
        after_help = "Examples (who leads billing; follow the leadership as JSON lines):\n  \
        dlock leader --url etcd://127.0.0.1:2379 --key billing/leader\n  \
        dlock leader --url etcd://127.0.0.1:2379 --key billing/leader --watch --json"
    )]
    Leader(LeaderArgs),
    /// Internal: started by `dlock run`; stops the command if that dlock ends without
    /// telling it to stand down (dlock was killed).
    #[command(hide = true)]
    Guard(GuardArgs),
}

/// How the guard of a `dlock run` stops the command. It reads the command's pid from its
/// stdin, a pipe whose only writer is the dlock that started it; then end of file means that
/// dlock is gone, whatever killed it.
#[derive(Debug, Args)]
pub(crate) struct GuardArgs {
    /// Stop the command's process group (whose id is its pid), not the command alone.
    #[arg(long)]
    pub(crate) group: bool,
    /// SIGKILL at once (--on-lost kill), not SIGTERM then SIGKILL after --grace.
    #[arg(long)]
    pub(crate) kill: bool,
    /// Time between SIGTERM and SIGKILL.
    #[arg(long, value_parser = parse_span)]
    pub(crate) grace: Duration,
}

/// Where the lock service is: --url or DLOCK_URL, or --url-file or DLOCK_URL_FILE. Every
/// command that talks to a server takes these.
#[derive(Debug, Args)]
pub(crate) struct UrlArgs {
    /// Lock service URL, e.g. redis://127.0.0.1:6379, zk://h:2181, etcd://h:2379,
    /// mysql://user:pass@h/db, postgres://user:pass@h/db,
    /// redlock://h1:7001,h2:7002,h3:7003, redis+sentinel://s1:26379,s2:26379/mymaster,
    /// redis+cluster://n1:7000,n2:7000.
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
}

#[derive(Debug, Args)]
pub(crate) struct LockArgs {
    #[command(flatten)]
    pub(crate) source: UrlArgs,
    /// The lock's name. Give --key more than once to take several keys as one hold: all
    /// of them or none, taken one by one in ascending order (so holders of overlapping
    /// sets never deadlock); the other options apply to each key.
    #[arg(long, required = true)]
    pub(crate) key: Vec<String>,
    #[command(flatten)]
    timing: Timing,
    /// Take a shared (read) hold: any number of --read holders together, none while a
    /// --write holder has it. Backends without shared holds refuse it (exit 64).
    #[arg(long, conflicts_with_all = ["write", "permits"])]
    read: bool,
    /// Take an exclusive (write) hold, alone on the key: the default.
    #[arg(long, conflicts_with = "permits")]
    write: bool,
    /// Take one of N permits (a counting semaphore): up to N holders of the key at once,
    /// each counted against the N it asked for, so every holder of a key should give the
    /// same N; --permits 1 excludes like a mutex. N is 1 to 10000. Backends without
    /// semaphores refuse it (exit 64).
    #[arg(long, value_name = "N", value_parser = parse_permits)]
    permits: Option<u32>,
    /// Take the hold as owner ID (a job id: 1 to 64 printable ASCII characters, no
    /// spaces): a reentrant hold. While the owner holds the key, a `dlock run` or `hold`
    /// with the same owner (a nested script of the same job, here or on another machine)
    /// takes it at once, with the same fencing token, and the key frees when the owner's
    /// last hold ends. The command sees DLOCK_OWNER, so nested runs inherit it. Exclusive
    /// holds only; backends without reentrant holds refuse it (exit 64).
    #[arg(long, env = "DLOCK_OWNER", value_name = "ID")]
    pub(crate) owner: Option<String>,
}

/// The lease and the wait, for `run`, `hold` and `elect`.
#[derive(Debug, Args)]
pub(crate) struct Timing {
    /// Lease time on the server without a renewal (renewed every ttl/3 while held); 100ms
    /// to 1day.
    #[arg(long, default_value = "15s", value_parser = parse_ttl)]
    ttl: Duration,
    /// How long to wait for a busy lock (default: forever), one budget for all the keys; at
    /// most 1year.
    #[arg(long, value_parser = parse_span, conflicts_with = "no_wait")]
    wait: Option<Duration>,
    /// Do not wait: exit 75 at once if the lock (any of the keys) is busy, holding none.
    #[arg(long)]
    no_wait: bool,
}

impl Timing {
    /// Exclusive options with this ttl and wait.
    pub(crate) fn options(&self) -> LockOptions {
        let wait = match (self.no_wait, self.wait) {
            (true, _) => Wait::No,
            (false, Some(d)) => Wait::For(d),
            (false, None) => Wait::Forever,
        };
        LockOptions::new().ttl(self.ttl).wait(wait)
    }
}

impl UrlArgs {
    /// The lock service URL: --url or DLOCK_URL, or the content of --url-file or
    /// DLOCK_URL_FILE.
    pub(crate) fn url(&self) -> Result<String, LockError> {
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
}

impl LockArgs {
    /// The lock service URL, as [`UrlArgs::url`].
    pub(crate) fn url(&self) -> Result<String, LockError> {
        self.source.url()
    }

    /// Whether --key was given more than once: a set of keys, whose output and command
    /// environment name each key (even if the same key was given twice).
    pub(crate) fn several_keys(&self) -> bool {
        self.key.len() > 1
    }

    pub(crate) fn options(&self) -> LockOptions {
        let opts = self.timing.options();
        let opts = match (self.read, self.permits) {
            (true, _) => opts.shared(),
            (false, Some(n)) => opts.permits(n),
            (false, None) => opts,
        };
        match &self.owner {
            Some(id) => opts.owner(id),
            None => opts,
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    pub(crate) lock: LockArgs,
    #[command(flatten)]
    pub(crate) command: CommandArgs,
}

#[derive(Debug, Args)]
pub(crate) struct ElectArgs {
    #[command(flatten)]
    pub(crate) source: UrlArgs,
    /// The election's name.
    #[arg(long)]
    pub(crate) key: String,
    /// What this candidate publishes while it leads (1 to 256 bytes, no control
    /// character), e.g. its address.
    #[arg(long)]
    pub(crate) value: String,
    #[command(flatten)]
    pub(crate) timing: Timing,
    #[command(flatten)]
    pub(crate) command: CommandArgs,
}

#[derive(Debug, Args)]
pub(crate) struct LeaderArgs {
    #[command(flatten)]
    pub(crate) source: UrlArgs,
    /// The election's name.
    #[arg(long)]
    pub(crate) key: String,
    /// Print each change of leadership as it happens, until SIGINT or SIGTERM.
    #[arg(long)]
    pub(crate) watch: bool,
    /// Print one JSON object per line, not text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The command `run` and `elect` run under the hold, and how it is stopped.
#[derive(Debug, Args)]
pub(crate) struct CommandArgs {
    /// What to do to the command if the lease is lost: `term` sends SIGTERM, then SIGKILL
    /// after --grace; `kill` sends SIGKILL; `ignore` lets it run (and warns).
    #[arg(long, value_enum, default_value = "term")]
    pub(crate) on_lost: OnLost,
    /// Time between SIGTERM and SIGKILL with --on-lost term, and how long background jobs
    /// the command left may keep the lock after it exits; at most 1year.
    #[arg(long, default_value = "10s", value_parser = parse_span)]
    pub(crate) grace: Duration,
    /// Keep the command in dlock's process group (the default for an interactive terminal's
    /// foreground job), so that it can read from the terminal; the terminal's signals reach
    /// it directly, and --on-lost reaches the command alone.
    #[arg(long)]
    pub(crate) foreground: bool,
    /// The command and its arguments.
    #[arg(required = true, last = true)]
    pub(crate) argv: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnLost {
    Term,
    Kill,
    Ignore,
}

#[derive(Debug, Args)]
pub(crate) struct HoldArgs {
    #[command(flatten)]
    pub(crate) lock: LockArgs,
    /// Release after this long (default: hold until SIGINT or SIGTERM); at most 1year.
    #[arg(long = "for", value_parser = parse_span)]
    pub(crate) hold_for: Option<Duration>,
}

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    pub(crate) source: UrlArgs,
    /// The key to show.
    #[arg(long)]
    pub(crate) key: String,
    /// Print one JSON object, not lines of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Args)]
pub(crate) struct ListArgs {
    #[command(flatten)]
    pub(crate) source: UrlArgs,
    /// List the held keys that start with this (default: every held key).
    #[arg(long, default_value = "", hide_default_value = true)]
    pub(crate) prefix: String,
    /// Print one JSON array of strings, not one key per line.
    #[arg(long)]
    pub(crate) json: bool,
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

/// --permits: a limit every backend accepts (1 to [`Mode::MAX_PERMITS`]), checked before
/// anything is connected.
fn parse_permits(text: &str) -> Result<u32, String> {
    let n: u32 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a whole number"))?;
    if !(1..=Mode::MAX_PERMITS).contains(&n) {
        return Err(format!(
            "the number of permits must be between 1 and {}",
            Mode::MAX_PERMITS
        ));
    }
    Ok(n)
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
pub(crate) fn after(span: Duration) -> tokio::time::Instant {
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
    fn permits_are_bounded() {
        assert_eq!(parse_permits("1"), Ok(1));
        assert_eq!(parse_permits("10000"), Ok(Mode::MAX_PERMITS));
        for n in ["0", "10001", "-1", "two", "1.5", ""] {
            assert!(parse_permits(n).is_err(), "{n}");
        }
    }
}
