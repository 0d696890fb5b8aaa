//! A lock holder that can be killed: by default a real child process.
//!
//! The child is the test binary itself, re-run on the same test with
//! `DLOCK_CONFORMANCE_HOLD` set: [`crate::run`] sees the variable and, instead of the
//! scenario, takes the key (with the ttl and mode it was given) with the harness's client,
//! prints one line
//! `acquired key=<key> token=<n>` and waits to be killed. So every backend gets real process
//! crashes without shipping a holder binary of its own.

use std::io::Write as _;
use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{DistributedLock, Election, Lease, LockExt as _, LockOptions, Mode, Result};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::Harness;

const HOLD_VAR: &str = "DLOCK_CONFORMANCE_HOLD";
/// Set beside [`HOLD_VAR`]: the child campaigns in the key's election with this value
/// instead of acquiring, and reports its term as the token.
const CAMPAIGN_VAR: &str = "DLOCK_CONFORMANCE_CAMPAIGN";
/// Set beside [`HOLD_VAR`]: the child takes its key as this owner, [`OWNER_ENTRIES`] times.
const OWNER_VAR: &str = "DLOCK_CONFORMANCE_OWNER";

/// How many times a holder whose options name an owner enters its key (one key only).
pub const OWNER_ENTRIES: usize = 3;

/// A holder the suite can make vanish without releasing.
#[async_trait]
pub trait Holder: Send {
    /// The fencing token the holder was granted.
    fn token(&self) -> u64;
    /// Make the holder vanish without releasing (SIGKILL for a process).
    async fn kill(&mut self);
}

/// A holder running in a child process.
#[derive(Debug)]
pub struct ChildHolder {
    child: Child,
    _stdin: Option<tokio::process::ChildStdin>,
    token: u64,
}

impl ChildHolder {
    /// Run test `test` of the current test binary as a holder of `key` taken with
    /// `opts`' ttl and mode, and wait (up to 60 s) until it reports that it holds the key.
    pub async fn spawn(test: &str, key: &str, opts: &LockOptions) -> std::io::Result<Self> {
        Self::spawn_as(test, key, opts, None).await
    }

    /// As [`spawn`](Self::spawn), a candidate that campaigns in `key`'s election with
    /// `value` and waits, leading, to be killed; its token is its term.
    pub async fn spawn_leader(
        test: &str,
        key: &str,
        value: &str,
        opts: &LockOptions,
    ) -> std::io::Result<Self> {
        Self::spawn_as(test, key, opts, Some(value)).await
    }

    async fn spawn_as(
        test: &str,
        key: &str,
        opts: &LockOptions,
        campaign: Option<&str>,
    ) -> std::io::Result<Self> {
        let exe = std::env::current_exe()?;
        let spec = format!("{} {} {key}", opts.ttl.as_millis(), opts.mode);
        let mut command = Command::new(exe);
        if let Some(value) = campaign {
            command.env(CAMPAIGN_VAR, value);
        }
        if let Some(owner) = opts.owner {
            command.env(OWNER_VAR, owner.as_str());
        }
        let mut child = command
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(HOLD_VAR, spec)
            // The child exits when this pipe closes: a killed test run leaves no holder.
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut lines = BufReader::new(stdout).lines();
        // A set reports each of its keys; the first key's token stands for the holder.
        let mut waiting: Vec<&str> = key.lines().collect();
        let mut first = None;
        let token = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                let Some(i) =
                    (0..waiting.len()).find(|&i| parse_acquired(&line, waiting[i]).is_some())
                else {
                    continue;
                };
                let token = parse_acquired(&line, waiting.remove(i));
                first = first.or(token);
                if waiting.is_empty() {
                    return Ok(first.expect("one key was reported"));
                }
            }
            Err(std::io::Error::other(
                "holder exited before it acquired the key",
            ))
        })
        .await
        .map_err(|_| std::io::Error::other("holder did not acquire the key within 60 s"))??;
        Ok(Self {
            child,
            _stdin: stdin,
            token,
        })
    }
}

/// The token in the child's `acquired key=<key> token=<n>` line. The line may follow
/// libtest's `test <name> ... ` on the same line (the child runs with `--nocapture`).
fn parse_acquired(line: &str, key: &str) -> Option<u64> {
    const MARK: &str = "acquired key=";
    let rest = &line[line.find(MARK)? + MARK.len()..];
    let (k, token) = rest.rsplit_once(" token=")?;
    (k == key).then(|| token.trim().parse().ok()).flatten()
}

#[async_trait]
impl Holder for ChildHolder {
    fn token(&self) -> u64 {
        self.token
    }

    async fn kill(&mut self) {
        // tokio's kill sends SIGKILL on Unix.
        let _ = self.child.kill().await;
    }
}

/// In a holder child: take the key, report it, and wait to be killed. Returns `false` when
/// this process is not a holder child.
pub(crate) async fn serve_if_child(harness: &dyn Harness) -> bool {
    let Ok(spec) = std::env::var(HOLD_VAR) else {
        return false;
    };
    // The key part may hold several keys, one a line (a set).
    let mut parts = spec.splitn(3, ' ');
    let (Some(ttl_ms), Some(mode), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
        panic!("DLOCK_CONFORMANCE_HOLD is '<ttl ms> <mode> <key>', not {spec:?}");
    };
    let ttl = Duration::from_millis(ttl_ms.parse().expect("ttl in ms"));
    let mode: Mode = mode.parse().expect("a mode as Mode displays it");
    let result: Result<()> = async {
        let client = harness.client().await?;
        if let Ok(value) = std::env::var(CAMPAIGN_VAR) {
            let election = Election::new(client, key).options(LockOptions::new().ttl(ttl));
            let leading = election.campaign(&value).await?;
            {
                let mut out = std::io::stdout().lock();
                writeln!(out, "acquired key={key} token={}", leading.term()).expect("stdout");
                out.flush().expect("stdout");
            }
            let reason = leading.lost().await;
            panic!("leader lost its leadership of {key} before it was killed: {reason}");
        }
        if let Ok(owner) = std::env::var(OWNER_VAR) {
            let opts = LockOptions::new().ttl(ttl).owner(&owner);
            let entries = take_entries(&*client, key, &opts).await?;
            {
                let mut out = std::io::stdout().lock();
                let token = entries[0].fencing_token();
                writeln!(out, "acquired key={key} token={token}").expect("stdout");
                out.flush().expect("stdout");
            }
            let reason = entries[0].lost().await;
            panic!("owner {owner} lost its hold of {key} before it was killed: {reason}");
        }
        let keys: Vec<&str> = key.lines().collect();
        let set = client
            .acquire_all(&keys, &LockOptions::new().ttl(ttl).mode(mode))
            .await?;
        {
            let mut out = std::io::stdout().lock();
            for lease in set.leases() {
                let (key, token) = (lease.key(), lease.fencing_token());
                writeln!(out, "acquired key={key} token={token}").expect("stdout");
            }
            out.flush().expect("stdout");
        }
        let (key, reason) = set.lost().await;
        panic!("holder lost its lease on {key} before it was killed: {reason}");
    }
    .await;
    panic!("holder could not acquire {key}: {result:?}");
}

/// Take `key` [`OWNER_ENTRIES`] times under `opts`' owner: the leases of one reentrant
/// hold, the first one first.
pub async fn take_entries(
    client: &dyn DistributedLock,
    key: &str,
    opts: &LockOptions,
) -> Result<Vec<Lease>> {
    let mut entries = Vec::with_capacity(OWNER_ENTRIES);
    for _ in 0..OWNER_ENTRIES {
        entries.push(client.acquire(key, opts).await?);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::parse_acquired;

    #[test]
    fn the_acquired_line_is_found_after_libtest_output() {
        let line = "test redis::crash_release ... acquired key=conf-1/k token=42";
        assert_eq!(parse_acquired(line, "conf-1/k"), Some(42));
        assert_eq!(parse_acquired("acquired key=a token=7", "a"), Some(7));
        assert_eq!(parse_acquired("acquired key=a token=7", "b"), None);
        assert_eq!(parse_acquired("running 1 test", "a"), None);
    }
}
