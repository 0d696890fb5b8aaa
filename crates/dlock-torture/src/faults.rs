//! The faults a run injects, and the record of each.

use std::fmt;
use std::str::FromStr;

use dlock_core::{FaultSafety, Faults};
use serde::Serialize;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FaultKind {
    /// SIGKILL a worker (a holder crash), then spawn a new one.
    Kill,
    /// SIGSTOP a worker for longer than a lease, then SIGCONT (a GC pause).
    Pause,
    /// Black-hole one worker's connections for longer than a lease.
    Partition,
    /// Stop the server (every member) and start it again.
    Restart,
    /// Stop a minority of the members for longer than a lease, then start them again.
    Member,
    /// Promote a replica of the Redis primary (`scripts/backends failover`: a Sentinel
    /// failover, or `CLUSTER FAILOVER` on a replica) while holders run.
    Failover,
    /// Black-hole one server's connections from half of the worker processes (their
    /// proxies to it), for longer than a lease, while the other half still reach it.
    Split,
    /// Cut one member (the leader) off from the other members for longer than a lease,
    /// while the clients still reach it, then heal (`scripts/netns isolate`).
    Cut,
    /// Rate-limit one member's link for longer than a lease (`scripts/netns slow`).
    Slow,
    /// Drop a share of one member's packets for longer than a lease (`scripts/netns loss`).
    Loss,
    /// Deliver every byte between half of the worker processes and one server late, by a
    /// base delay plus a random jitter each way (in order), for longer than a lease: the
    /// workers' proxies add application-level latency where `tc netem delay … jitter …`
    /// is missing, on any topology with proxies.
    Delay,
    /// Jump one Redis node's wall clock forward by more than the ttl for longer than a
    /// lease, then back (`scripts/netns clock`).
    Clock,
    /// Jump a holding worker's wall clock forward or back by more than the ttl for longer
    /// than a lease, then back (the workers run under `scripts/netns shim`'s preload): a
    /// lease's deadlines must not follow the wall clock.
    ClientClock,
}

impl FaultKind {
    pub(crate) const ALL: [FaultKind; 13] = [
        FaultKind::Kill,
        FaultKind::Pause,
        FaultKind::Partition,
        FaultKind::Restart,
        FaultKind::Member,
        FaultKind::Failover,
        FaultKind::Split,
        FaultKind::Cut,
        FaultKind::Slow,
        FaultKind::Loss,
        FaultKind::Delay,
        FaultKind::Clock,
        FaultKind::ClientClock,
    ];

    /// The kinds that need the namespaced topology (`scripts/netns`).
    pub(crate) const NETNS: [FaultKind; 4] = [
        FaultKind::Cut,
        FaultKind::Slow,
        FaultKind::Loss,
        FaultKind::Clock,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::Partition => "partition",
            FaultKind::Restart => "restart",
            FaultKind::Member => "member",
            FaultKind::Failover => "failover",
            FaultKind::Split => "split",
            FaultKind::Cut => "cut",
            FaultKind::Slow => "slow",
            FaultKind::Loss => "loss",
            FaultKind::Delay => "delay",
            FaultKind::Clock => "clock",
            FaultKind::ClientClock => "client-clock",
        }
    }

    /// What the backend declares about exclusion through this fault. A crash, a partition
    /// and a client's wall clock that jumps are part of the core contract: always
    /// exclusive. A failover is a member
    /// down as [`Faults::member_down`] describes it (a Redis primary that fails over); a
    /// slow, a lossy and a late link are all [`Faults::slow_link`].
    pub(crate) fn declared(self, faults: &Faults) -> FaultSafety {
        match self {
            FaultKind::Kill | FaultKind::Partition | FaultKind::ClientClock => {
                FaultSafety::Exclusive
            }
            FaultKind::Pause => faults.holder_paused,
            FaultKind::Restart => faults.server_restart,
            FaultKind::Member | FaultKind::Failover => faults.member_down,
            FaultKind::Split => faults.member_unreachable,
            FaultKind::Cut => faults.member_cut,
            FaultKind::Slow | FaultKind::Loss | FaultKind::Delay => faults.slow_link,
            FaultKind::Clock => faults.clock_jump,
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The `--faults` option: `all`, `none`, or a comma-separated list of kinds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FaultSet {
    /// Every kind the backend's topology allows; the others are reported as not injected.
    All,
    /// Exactly these (an impossible one is an error).
    Only(Vec<FaultKind>),
}

impl FromStr for FaultSet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "all" => return Ok(FaultSet::All),
            "none" | "" => return Ok(FaultSet::Only(Vec::new())),
            _ => {}
        }
        let mut kinds = Vec::new();
        for name in s.split(',').map(str::trim) {
            let kind = FaultKind::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .ok_or_else(|| {
                    format!("unknown fault {name:?} (all, none, or a list of kill, pause, partition, restart, member, failover, split, cut, slow, loss, delay, clock, client-clock)")
                })?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        Ok(FaultSet::Only(kinds))
    }
}

pub(crate) fn safety_name(s: FaultSafety) -> &'static str {
    match s {
        FaultSafety::Unspecified => "unspecified",
        FaultSafety::Fenced => "fenced",
        FaultSafety::Exclusive => "exclusive",
    }
}

/// One injected fault. Times are [`now_ns`](crate::clock::now_ns) readings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FaultRec {
    pub(crate) kind: FaultKind,
    /// The worker slot, process and keys it held, for a fault that hits a worker.
    pub(crate) victim: Option<Victim>,
    /// The units stopped, for a server fault; the member cut off, slowed, made lossy or
    /// whose clock jumped, for a fault of the namespaced topology.
    pub(crate) units: Vec<String>,
    /// When the fault began (the signal sent, the network cut, the first unit stopping).
    pub(crate) start: u64,
    /// When it ended (the process reaped, SIGCONT, the network healed, the units answering
    /// again).
    pub(crate) end: u64,
    /// When every key had been acquired again after `end`.
    pub(crate) recovered: Option<u64>,
    /// The first acquisition of any key after `end`.
    pub(crate) first_acquire: Option<u64>,
    /// For a fault on a holder: when each key it held was first acquired by another
    /// process after `start`.
    pub(crate) takeovers: Vec<(String, Option<u64>)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Victim {
    pub(crate) slot: usize,
    pub(crate) process: u32,
    pub(crate) held: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_lists_parse() {
        assert_eq!("all".parse::<FaultSet>().unwrap(), FaultSet::All);
        assert_eq!("none".parse::<FaultSet>().unwrap(), FaultSet::Only(vec![]));
        assert_eq!(
            "kill, pause,kill".parse::<FaultSet>().unwrap(),
            FaultSet::Only(vec![FaultKind::Kill, FaultKind::Pause])
        );
        let err = "kill,reboot".parse::<FaultSet>().unwrap_err();
        assert!(err.contains("reboot"), "{err}");
    }

    #[test]
    fn crash_and_partition_are_always_checked_as_exclusive() {
        let nothing = Faults::default();
        assert_eq!(FaultKind::Kill.declared(&nothing), FaultSafety::Exclusive);
        assert_eq!(
            FaultKind::Partition.declared(&nothing),
            FaultSafety::Exclusive
        );
        assert_eq!(
            FaultKind::Pause.declared(&nothing),
            FaultSafety::Unspecified
        );
    }
}
