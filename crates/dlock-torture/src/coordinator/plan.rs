//! Which servers a run may stop and start (the `scripts/backends` units behind the URL),
//! and so which faults it injects.

use super::Config;
use crate::faults::{FaultKind, FaultSet};
use crate::servers::{self, SHARED_UNITS};

/// The `scripts/backends` units behind the URL's servers: `--units`, or each address's port
/// looked up in the script's port table. Empty when not every server is a unit.
pub(super) fn units_of(
    cfg: &Config,
    script: Option<&std::path::Path>,
    addrs: &[std::net::SocketAddr],
) -> Vec<String> {
    if !cfg.units.is_empty() {
        return cfg.units.clone();
    }
    let table = script
        .and_then(|s| std::fs::read_to_string(s).ok())
        .map(|s| servers::port_table(&s))
        .unwrap_or_default();
    let units: Vec<String> = addrs
        .iter()
        .filter_map(|a| {
            table
                .iter()
                .find(|(_, p)| *p == a.port())
                .map(|(u, _)| u.clone())
        })
        .collect();
    if units.len() == addrs.len() {
        units
    } else {
        Vec::new()
    }
}

/// The `scripts/backends` group of a replicated Redis topology that the URL names
/// (`redis+sentinel://`, `redis+cluster://`): its servers are shared by other tests, so the
/// run never stops them; its member fault is a failover (`scripts/backends failover GROUP`).
pub(super) fn failover_group(scheme: &str) -> Option<&'static str> {
    match scheme {
        "redis+sentinel" | "rediss+sentinel" => Some("redis-sentinel"),
        "redis+cluster" | "rediss+cluster" => Some("redis-cluster"),
        _ => None,
    }
}

/// Which faults a run injects, and why the others are not.
pub(super) struct FaultPlan {
    pub(super) selected: Vec<FaultKind>,
    pub(super) not_injected: Vec<(FaultKind, String)>,
    /// Whether the run may stop and start the servers.
    pub(super) server_control: bool,
}

impl FaultPlan {
    pub(super) fn new(
        asked: &FaultSet,
        have_script: bool,
        addrs: &[std::net::SocketAddr],
        units: &[String],
        clock_shim: bool,
    ) -> Result<Self, String> {
        let (mut available, mut not_injected, server_control) =
            Self::possible(have_script, addrs, units);
        offer_client_clock(&mut available, &mut not_injected, clock_shim);
        Self::select(asked, available, not_injected, server_control)
    }

    /// For a replicated Redis topology (`group`, see [`failover_group`]): holders are
    /// killed and paused, and the primary fails over; nothing else.
    pub(super) fn replicated(
        asked: &FaultSet,
        have_script: bool,
        group: &str,
        clock_shim: bool,
    ) -> Result<Self, String> {
        let mut available = vec![FaultKind::Kill, FaultKind::Pause];
        let mut not_injected = vec![
            (
                FaultKind::Partition,
                "a Sentinel or Cluster client connects to the addresses its servers announce, past a proxy".to_owned(),
            ),
            (
                FaultKind::Restart,
                format!("the {group} servers are shared by other tests; they are never stopped"),
            ),
            (
                FaultKind::Member,
                format!("the {group} servers are shared by other tests; a failover stands for a member down"),
            ),
            (
                FaultKind::Split,
                "a Sentinel or Cluster client connects to the addresses its servers announce, past a proxy".to_owned(),
            ),
            (
                FaultKind::Delay,
                "a Sentinel or Cluster client connects to the addresses its servers announce, past a proxy".to_owned(),
            ),
        ];
        if have_script {
            available.push(FaultKind::Failover);
        } else {
            not_injected.push((
                FaultKind::Failover,
                "scripts/backends not found (--backends-script)".to_owned(),
            ));
        }
        not_namespaced(&mut not_injected);
        offer_client_clock(&mut available, &mut not_injected, clock_shim);
        Self::select(asked, available, not_injected, false)
    }

    fn possible(
        have_script: bool,
        addrs: &[std::net::SocketAddr],
        units: &[String],
    ) -> (Vec<FaultKind>, Vec<(FaultKind, String)>, bool) {
        let server_control = if addrs.is_empty() {
            Err("no server".to_owned())
        } else if !have_script {
            Err("scripts/backends not found (--backends-script)".to_owned())
        } else if units.is_empty() {
            Err("the servers are not scripts/backends units (--units)".to_owned())
        } else if let Some(u) = units.iter().find(|u| SHARED_UNITS.contains(&u.as_str())) {
            Err(format!(
                "{u} is a shared test server that other tests use; it is never stopped"
            ))
        } else {
            Ok(())
        };
        let mut available = vec![FaultKind::Kill, FaultKind::Pause];
        let mut not_injected = Vec::new();
        if addrs.is_empty() {
            not_injected.push((FaultKind::Partition, "no server".to_owned()));
            not_injected.push((FaultKind::Delay, "no server".to_owned()));
        } else {
            available.extend([FaultKind::Partition, FaultKind::Delay]);
        }
        match &server_control {
            Ok(()) => available.push(FaultKind::Restart),
            Err(why) => not_injected.push((FaultKind::Restart, why.clone())),
        }
        match (&server_control, units.len()) {
            (Ok(()), n) if n >= 3 => available.push(FaultKind::Member),
            (Ok(()), _) => not_injected.push((
                FaultKind::Member,
                "one server: no minority of members to stop".to_owned(),
            )),
            (Err(why), _) => not_injected.push((FaultKind::Member, why.clone())),
        }
        offer_split(&mut available, &mut not_injected, addrs.len());
        not_injected.push((
            FaultKind::Failover,
            "not a replicated Redis topology (redis+sentinel://, redis+cluster://)".to_owned(),
        ));
        not_namespaced(&mut not_injected);
        (available, not_injected, server_control.is_ok())
    }

    /// For the namespaced topology of `scripts/netns` (`members`, see
    /// [`crate::netns::members_of`]): holders are killed, paused and cut off; a member is cut
    /// off from the others (etcd, ZooKeeper), its link slowed and made lossy, a Redis
    /// node's clock jumps (Redlock). The servers are never stopped.
    pub(super) fn namespaced(
        asked: &FaultSet,
        have_netns: bool,
        members: &[String],
        clock_shim: bool,
    ) -> Result<Self, String> {
        let group = members.first().map_or("", |m| crate::netns::group_of(m));
        let mut available = vec![
            FaultKind::Kill,
            FaultKind::Pause,
            FaultKind::Partition,
            FaultKind::Delay,
        ];
        let mut not_injected = Vec::new();
        offer_split(&mut available, &mut not_injected, members.len());
        let stopped = "the namespaced topology's servers are not stopped by the run";
        not_injected.push((FaultKind::Restart, stopped.to_owned()));
        not_injected.push((FaultKind::Member, stopped.to_owned()));
        not_injected.push((
            FaultKind::Failover,
            "not a replicated Redis topology (redis+sentinel://, redis+cluster://)".to_owned(),
        ));
        if !have_netns {
            for kind in FaultKind::NETNS {
                not_injected.push((
                    kind,
                    "scripts/netns not found beside scripts/backends".to_owned(),
                ));
            }
            offer_client_clock(&mut available, &mut not_injected, clock_shim);
            return Self::select(asked, available, not_injected, false);
        }
        match group {
            "etcd" | "zk" if members.len() >= 3 => available.push(FaultKind::Cut),
            "etcd" | "zk" => not_injected.push((
                FaultKind::Cut,
                "fewer than three members: no majority to cut one off from".to_owned(),
            )),
            _ => not_injected.push((
                FaultKind::Cut,
                "Redlock nodes do not talk to each other: no member to cut off from the others"
                    .to_owned(),
            )),
        }
        available.extend([FaultKind::Slow, FaultKind::Loss]);
        match group {
            "redlock" => available.push(FaultKind::Clock),
            _ => not_injected.push((
                FaultKind::Clock,
                "only the Redis nodes of scripts/netns run under its clock shim".to_owned(),
            )),
        }
        offer_client_clock(&mut available, &mut not_injected, clock_shim);
        Self::select(asked, available, not_injected, false)
    }

    fn select(
        asked: &FaultSet,
        available: Vec<FaultKind>,
        mut not_injected: Vec<(FaultKind, String)>,
        server_control: bool,
    ) -> Result<Self, String> {
        let selected = match asked {
            FaultSet::All => available,
            FaultSet::Only(kinds) => {
                if let Some(kind) = kinds.iter().find(|k| !available.contains(k)) {
                    let why = not_injected
                        .iter()
                        .find(|(k, _)| k == kind)
                        .map_or("", |(_, w)| w.as_str());
                    return Err(format!("cannot inject {kind} here: {why}"));
                }
                not_injected.clear();
                kinds.clone()
            }
        };
        Ok(Self {
            selected,
            not_injected,
            server_control,
        })
    }
}

/// One server unreachable from half of the workers, where there are several servers.
fn offer_split(
    available: &mut Vec<FaultKind>,
    not_injected: &mut Vec<(FaultKind, String)>,
    servers: usize,
) {
    match servers {
        0 => not_injected.push((FaultKind::Split, "no server".to_owned())),
        1 => not_injected.push((
            FaultKind::Split,
            "one server: cutting it off from some workers is a partition of those".to_owned(),
        )),
        _ => available.push(FaultKind::Split),
    }
}

/// A worker's clock jump, where the workers run under the clock preload.
fn offer_client_clock(
    available: &mut Vec<FaultKind>,
    not_injected: &mut Vec<(FaultKind, String)>,
    clock_shim: bool,
) {
    match clock_shim {
        true => available.push(FaultKind::ClientClock),
        false => not_injected.push((
            FaultKind::ClientClock,
            "no clock preload for the workers (scripts/netns shim: needs scripts/netns and cc)"
                .to_owned(),
        )),
    }
}

/// The faults of the namespaced topology, not injected on other servers.
fn not_namespaced(not_injected: &mut Vec<(FaultKind, String)>) {
    for kind in FaultKind::NETNS {
        not_injected.push((
            kind,
            "the servers are not in the namespaced topology (scripts/netns up GROUP, and its URL)"
                .to_owned(),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(n: u16) -> Vec<std::net::SocketAddr> {
        (0..n).map(|i| ([127, 0, 0, 1], 7001 + i).into()).collect()
    }

    fn units(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_topology_decides_which_faults_are_possible() {
        let one = FaultPlan::new(
            &FaultSet::All,
            true,
            &addrs(1),
            &units(&["torture-redis"]),
            false,
        )
        .unwrap();
        assert_eq!(
            one.selected,
            [
                FaultKind::Kill,
                FaultKind::Pause,
                FaultKind::Partition,
                FaultKind::Delay,
                FaultKind::Restart
            ]
        );
        assert_eq!(one.not_injected[0].0, FaultKind::Member);
        assert!(one.server_control);

        let five = units(&[
            "redlock-1",
            "redlock-2",
            "redlock-3",
            "redlock-4",
            "redlock-5",
        ]);
        let many = FaultPlan::new(&FaultSet::All, true, &addrs(5), &five, false).unwrap();
        assert_eq!(many.selected.len(), 7);
        assert!(many.selected.contains(&FaultKind::Split));
        let mut not_here = vec![FaultKind::Failover];
        not_here.extend(FaultKind::NETNS);
        not_here.push(FaultKind::ClientClock);
        assert_eq!(
            many.not_injected
                .iter()
                .map(|(k, _)| *k)
                .collect::<Vec<_>>(),
            not_here
        );

        let shared =
            FaultPlan::new(&FaultSet::All, true, &addrs(1), &units(&["redis"]), false).unwrap();
        assert!(
            !shared.server_control,
            "the shared servers are never stopped"
        );
        assert!(!shared.selected.contains(&FaultKind::Restart));

        let memory = FaultPlan::new(&FaultSet::All, true, &[], &[], false).unwrap();
        assert_eq!(memory.selected, [FaultKind::Kill, FaultKind::Pause]);
        let shimmed = FaultPlan::new(&FaultSet::All, true, &[], &[], true).unwrap();
        assert_eq!(
            shimmed.selected,
            [FaultKind::Kill, FaultKind::Pause, FaultKind::ClientClock],
            "with the clock preload, a worker's clock jumps on every backend"
        );

        let unknown = FaultPlan::new(&FaultSet::All, true, &addrs(1), &[], false).unwrap();
        assert!(!unknown.server_control);

        let asked = "member".parse().unwrap();
        let err = FaultPlan::new(&asked, true, &addrs(1), &units(&["torture-redis"]), false)
            .err()
            .unwrap();
        assert!(err.contains("no minority"), "{err}");
    }

    #[test]
    fn a_replicated_redis_topology_fails_over_and_is_never_stopped() {
        assert_eq!(failover_group("redis+sentinel"), Some("redis-sentinel"));
        assert_eq!(failover_group("rediss+cluster"), Some("redis-cluster"));
        assert_eq!(failover_group("redis"), None);
        let plan = FaultPlan::replicated(&FaultSet::All, true, "redis-sentinel", false).unwrap();
        assert_eq!(
            plan.selected,
            [FaultKind::Kill, FaultKind::Pause, FaultKind::Failover]
        );
        assert!(!plan.server_control);
        let asked = "restart".parse().unwrap();
        let err = FaultPlan::replicated(&asked, true, "redis-cluster", false)
            .err()
            .unwrap();
        assert!(err.contains("never stopped"), "{err}");
        let asked = "failover".parse().unwrap();
        let err = FaultPlan::new(&asked, true, &addrs(1), &units(&["torture-redis"]), false)
            .err()
            .unwrap();
        assert!(err.contains("not a replicated Redis topology"), "{err}");
    }

    #[test]
    fn the_namespaced_topology_cuts_members_off_and_jumps_redis_clocks() {
        let etcd = units(&["etcd-1", "etcd-2", "etcd-3"]);
        let plan = FaultPlan::namespaced(&FaultSet::All, true, &etcd, false).unwrap();
        assert_eq!(
            plan.selected,
            [
                FaultKind::Kill,
                FaultKind::Pause,
                FaultKind::Partition,
                FaultKind::Delay,
                FaultKind::Split,
                FaultKind::Cut,
                FaultKind::Slow,
                FaultKind::Loss
            ]
        );
        assert!(!plan.server_control, "the run never stops these servers");
        let redlock = units(&["redlock-1", "redlock-2", "redlock-3"]);
        let plan = FaultPlan::namespaced(&FaultSet::All, true, &redlock, false).unwrap();
        assert!(plan.selected.contains(&FaultKind::Clock));
        assert!(!plan.selected.contains(&FaultKind::Cut));
        let asked = "clock".parse().unwrap();
        let err = FaultPlan::namespaced(&asked, true, &etcd, false)
            .err()
            .unwrap();
        assert!(err.contains("clock shim"), "{err}");
        let err = FaultPlan::new(&asked, true, &addrs(1), &units(&["torture-redis"]), false)
            .err()
            .unwrap();
        assert!(err.contains("namespaced topology"), "{err}");
    }
}
