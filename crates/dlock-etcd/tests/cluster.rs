//! Fault tests on the 3-member cluster (`DLOCK_ETCD_CLUSTER_URL`, members `etcd-cluster-1..3`
//! on 23791–23793). One test doing its steps in order, so nothing else stops members at the
//! same time; a drop guard brings every member back up, also when an assertion fails.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::EtcdHarness;
use dlock_conformance::Harness as _;
use dlock_core::{DistributedLock, ErrorKind, LockOptions, LostReason, Wait};
use tokio::time::{Instant, sleep, timeout};

/// The members' client ports, as `scripts/backends` starts them.
const MEMBERS: &[(u16, &str)] = &[
    (23791, "etcd-cluster-1"),
    (23792, "etcd-cluster-2"),
    (23793, "etcd-cluster-3"),
];

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/backends")
}

/// Run `scripts/backends <args>`, panicking with its output on failure.
async fn backends(args: &[&str]) {
    let out = tokio::process::Command::new(script())
        .args(args)
        .output()
        .await
        .expect("run scripts/backends");
    assert!(
        out.status.success(),
        "scripts/backends {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Brings every member back when dropped, whatever happened in between.
struct RestoreCluster;

impl Drop for RestoreCluster {
    fn drop(&mut self) {
        let status = std::process::Command::new(script())
            .args(["up", "etcd-cluster"])
            .stdout(std::process::Stdio::null())
            .status();
        if !matches!(status, Ok(s) if s.success()) {
            eprintln!(
                "could not restore etcd-cluster: {status:?}; run scripts/backends up etcd-cluster"
            );
        }
    }
}

/// Each reachable member's port and the member id of the leader it follows.
async fn statuses() -> Vec<(u16, u64, u64)> {
    let endpoints: Vec<String> = MEMBERS
        .iter()
        .map(|(p, _)| format!("127.0.0.1:{p}"))
        .collect();
    let out = tokio::process::Command::new("etcdctl")
        .args([
            "--dial-timeout=1s",
            "--command-timeout=2s",
            "-w",
            "json",
            "endpoint",
            "status",
        ])
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .output()
        .await
        .expect("run etcdctl (Debian package etcd-client)");
    let text = String::from_utf8_lossy(&out.stdout);
    let Ok(serde_json::Value::Array(list)) = serde_json::from_str(text.trim()) else {
        return Vec::new();
    };
    list.iter()
        .filter_map(|entry| {
            let port = entry["Endpoint"]
                .as_str()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let member = entry["Status"]["header"]["member_id"].as_u64()?;
            let leader = entry["Status"]["leader"].as_u64()?;
            Some((port, member, leader))
        })
        .collect()
}

/// Until all three members answer and agree on a leader; returns the leader's unit and the
/// followers'.
async fn healthy() -> (&'static str, Vec<&'static str>) {
    let started = Instant::now();
    loop {
        let list = statuses().await;
        let leader = list.first().map(|s| s.2).filter(|l| *l != 0);
        if list.len() == MEMBERS.len() && list.iter().all(|s| Some(s.2) == leader) {
            let unit = |port: u16| {
                MEMBERS
                    .iter()
                    .find(|(p, _)| *p == port)
                    .map(|(_, u)| *u)
                    .expect("a known member port")
            };
            let leader_port = list
                .iter()
                .find(|s| Some(s.1) == leader)
                .expect("leader listed")
                .0;
            let followers = list.iter().filter(|s| Some(s.1) != leader);
            return (unit(leader_port), followers.map(|s| unit(s.0)).collect());
        }
        assert!(
            started.elapsed() < Duration::from_secs(90),
            "etcd-cluster is not healthy: {list:?}; run scripts/backends up etcd-cluster"
        );
        sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_survives_one_member_down_and_is_lost_without_a_majority() {
    let _restore = RestoreCluster;
    backends(&["up", "etcd-cluster"]).await;
    healthy().await;

    let harness = EtcdHarness::cluster_from_env();
    let key = format!("dlock-cluster-{}/k", uuid::Uuid::new_v4().simple());
    let ttl = Duration::from_secs(5);
    let opts = LockOptions::new().ttl(ttl);
    let (a, b) = (harness.lock().await, harness.lock().await);
    let lease = a
        .try_acquire(&key, &opts)
        .await
        .expect("try_acquire on the cluster")
        .expect("a fresh key is free");
    let token = lease.fencing_token();

    // One member down at a time (first the leader, then a follower, so the member the
    // client is talking to goes down too): the lease is kept and stays exclusive.
    let mut stopped = Vec::new();
    for round in 0..2 {
        let (leader, followers) = healthy().await;
        let victim = match round {
            0 => leader,
            _ => *followers
                .iter()
                .find(|f| !stopped.contains(*f))
                .expect("a follower not stopped yet"),
        };
        stopped.push(victim);
        backends(&["down", victim]).await;
        let until = Instant::now() + ttl * 2;
        let (mut tries, mut refused) = (0, 0);
        while Instant::now() < until {
            tries += 1;
            assert!(!lease.is_lost(), "lease lost with {victim} down: {lease:?}");
            match b.try_acquire(&key, &opts).await {
                Ok(None) => {}
                Ok(Some(other)) => panic!(
                    "another client took the key (token {}) with {victim} down",
                    other.fencing_token()
                ),
                Err(e) if e.kind() == ErrorKind::Unavailable => refused += 1,
                Err(e) => panic!("try_acquire with {victim} down: {e}"),
            }
            sleep(Duration::from_millis(250)).await;
        }
        eprintln!("{victim} down: {refused} of {tries} tries answered Unavailable");
        // Requests the balancer sends to the stopped member are sent again elsewhere.
        assert!(
            refused * 4 <= tries,
            "{refused} of {tries} tries failed with one member of three down"
        );
        backends(&["up", victim]).await;
        healthy().await;
    }
    assert!(!lease.is_lost());
    let keys = harness.lock_keys(&key).await;
    assert_eq!(keys.len(), 1, "only our key");
    assert_eq!(
        keys[0].create_revision() as u64,
        token,
        "our key, never re-created"
    );

    // A majority down: renewals cannot succeed, and lost() fires by the lease deadline (the
    // last renewal sent before the majority went down, plus the ttl).
    let (leader, followers) = healthy().await;
    let mut signal = lease.lost_signal();
    backends(&["down", leader, followers[0]]).await;
    let down = Instant::now();
    let reason = timeout(ttl + Duration::from_secs(5), signal.lost())
        .await
        .expect("lost() fires once the lease may have expired")
        .expect("lost, not released");
    let took = down.elapsed();
    eprintln!("majority down: lost() after {took:?} ({reason})");
    assert!(
        took <= ttl + Duration::from_millis(500),
        "lost() fired {took:?} after the majority went down (ttl {ttl:?})"
    );
    assert!(matches!(reason, LostReason::Unreachable(_)), "{reason}");

    // Restore; the old holder cleans up (or its lease expires) and the key is free again.
    backends(&["up", "etcd-cluster"]).await;
    healthy().await;
    let released = lease.release().await;
    eprintln!("release after the outage: {released:?}");
    let newer = b
        .acquire(&key, &opts.wait(Wait::For(ttl * 4)))
        .await
        .expect("the key frees after the outage");
    assert!(newer.fencing_token() > token);
    newer.release().await.expect("release");
    let started = Instant::now();
    loop {
        let left = harness.residue(&key).await.expect("residue");
        if left.is_empty() {
            break;
        }
        assert!(started.elapsed() < ttl * 3, "left on the cluster: {left:?}");
        sleep(Duration::from_millis(200)).await;
    }
}
