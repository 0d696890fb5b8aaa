//! A short torture run per backend, as CI runs it (`scripts/test` → `cargo test
//! --workspace`); `README.md` describes the longer run.
//!
//! Each test runs the `torture` binary against the backend's fault-test servers with every
//! fault its topology allows, and fails on any violation, any missing recovery, or a fault
//! kind that was not injected. The tests stop and start servers, so they run one at a time.
//! Beside each, a short semaphore run (`--permits`) injects only the faults that hit
//! holders, so it runs concurrently with the others (after its own backend's run, whose
//! servers it waits for). So does a short key-set run (`--key-sets`), whose holds take
//! overlapping sets of keys with `acquire_all`, and a short election run (`--election`),
//! whose holds are campaigns.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use serde_json::Value;

/// Server faults must not overlap: one torture run at a time.
static SERIAL: Mutex<()> = Mutex::new(());

struct Case {
    /// Environment variable with the URL, and its default.
    env: &'static str,
    default: &'static str,
    /// Options appended to the URL (shorter timeouts for a short run).
    options: &'static str,
    /// The command that starts the servers.
    setup: &'static str,
    duration: &'static str,
    seed: u64,
    faults: &'static [&'static str],
}

/// Run the `torture` binary on the case's servers with `extra` arguments; its JSON report,
/// once the run passed with no violation.
fn run(name: &str, case: &Case, duration: &str, extra: &[&str]) -> Value {
    let mut url = std::env::var(case.env).unwrap_or_else(|_| case.default.to_owned());
    if !case.options.is_empty() {
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(case.options);
    }
    let seed = std::env::var("DLOCK_TORTURE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(case.seed);
    let report = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("torture-{name}.json"));
    let _ = std::fs::remove_file(&report);
    let out = Command::new(env!("CARGO_BIN_EXE_torture"))
        .args(["--backend", &url, "--duration", duration])
        .args(["--seed", &seed.to_string(), "--report"])
        .arg(&report)
        .args(extra)
        .output()
        .expect("run the torture binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "torture on {name} failed ({}); if a server is down: {}\n{stdout}\n{stderr}",
        out.status,
        case.setup
    );
    let json: Value = serde_json::from_str(
        &std::fs::read_to_string(&report).expect("the torture run writes its JSON report"),
    )
    .expect("the report is JSON");
    assert_eq!(json["passed"], true, "{json:#}");
    assert_eq!(
        json["violations"].as_array().map(Vec::len),
        Some(0),
        "{json:#}"
    );
    assert_eq!(
        json["final_check"]["free_at_once"], json["final_check"]["keys"],
        "{json:#}"
    );
    json
}

fn torture(name: &str, case: &Case) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    torture_unlocked(name, case);
}

/// [`torture`], for a caller that holds [`SERIAL`] already.
fn torture_unlocked(name: &str, case: &Case) {
    let json = run(name, case, case.duration, &[]);
    assert!(
        json["holds"].as_u64().unwrap_or(0) > 50,
        "too few holds checked: {json:#}"
    );
    // Every backend declares shared holds: the default workload mixes reads and writes.
    let shared = json["shared_holds"].as_u64().unwrap_or(0);
    assert!(
        shared > 10 && shared < json["holds"].as_u64().unwrap_or(0),
        "{name}: a mixed workload needs reads and writes, {shared} of the holds were reads: {json:#}"
    );
    for kind in case.faults {
        let injected = json["by_kind"][kind]["injected"].as_u64().unwrap_or(0);
        assert!(
            injected >= 1,
            "{name}: no {kind} fault was injected ({}): {json:#}",
            json["not_injected"][kind]
                .as_str()
                .unwrap_or("the run offered it, and did not inject it")
        );
        assert!(
            json["by_kind"][kind]["recovery_ms_max"].is_number(),
            "{name}: no recovery time after {kind}: {json:#}"
        );
    }
}

/// The limit of the semaphore runs: below the tasks per key, so that it is reached.
const PERMITS: u64 = 3;

/// A short semaphore run: every hold one of [`PERMITS`] permits on two keys, with the faults
/// that hit holders (kill, pause, partition) and none that stop servers, so it may run
/// beside the other backends' runs (the run waits for its own servers' unit locks). It
/// passes with no violation, and each key had exactly [`PERMITS`] holders at once.
fn semaphore(name: &str, case: &Case) {
    let permits = PERMITS.to_string();
    let faults = ["kill", "pause", "partition"];
    let json = run(
        &format!("{name}-permits"),
        case,
        "8s",
        &[
            "--permits",
            &permits,
            "--keys",
            "2",
            "--faults",
            &faults.join(","),
        ],
    );
    let permit_holds = json["permit_holds"].as_u64().unwrap_or(0);
    assert!(
        permit_holds > 20 && permit_holds == json["holds"].as_u64().unwrap_or(0),
        "{name}: every hold a permit, and enough of them: {json:#}"
    );
    let most = json["most_permit_holders"].as_object().expect("per key");
    assert_eq!(most.len(), 2, "{json:#}");
    for (key, n) in most {
        assert_eq!(
            n.as_u64(),
            Some(PERMITS),
            "{name}: {key} never had {PERMITS} holders at once (the run did not overlap): {json:#}"
        );
    }
    for kind in faults {
        assert!(
            json["by_kind"][kind]["injected"].as_u64().unwrap_or(0) >= 1,
            "{name}: no {kind} fault was injected: {json:#}"
        );
    }
}

/// A short key-set run: every hold a set of 2 or 3 of the run's three keys, named in a
/// random order and taken with `acquire_all` (half of them shared), with the faults that
/// hit holders, beside the other backends' runs as [`semaphore`] is. It passes with no
/// violation (each key of a set is checked as a hold of its own; sets kept being granted,
/// so nothing deadlocked), every hold was a key of a set, and sets of both sizes and
/// exclusive ones (which write under every key) were taken.
fn key_sets(name: &str, case: &Case) {
    let faults = ["kill", "pause", "partition"];
    let json = run(
        &format!("{name}-key-sets"),
        case,
        "8s",
        &[
            "--key-sets",
            "3",
            "--keys",
            "3",
            "--faults",
            &faults.join(","),
        ],
    );
    assert_eq!(json["workload"], "key sets of up to 3", "{json:#}");
    let sets = json["sets_taken"].as_u64().unwrap_or(0);
    let by_size = json["sets_by_size"].as_object().expect("sets by size");
    let keys_in_sets: u64 = by_size
        .iter()
        .map(|(size, n)| size.parse::<u64>().unwrap_or(0) * n.as_u64().unwrap_or(0))
        .sum();
    assert!(
        sets >= 10 && by_size.len() == 2 && by_size.values().all(|n| n.as_u64() >= Some(1)),
        "{name}: sets of 2 and of 3 keys, and enough of them: {json:#}"
    );
    assert_eq!(
        keys_in_sets,
        json["holds"].as_u64().unwrap_or(0),
        "{name}: every hold a key of a set: {json:#}"
    );
    assert!(
        json["shared_sets"].as_u64().unwrap_or(0) < sets
            && json["writes_accepted"].as_u64().unwrap_or(0) > 0,
        "{name}: exclusive sets wrote under their keys: {json:#}"
    );
    for kind in faults {
        assert!(
            json["by_kind"][kind]["injected"].as_u64().unwrap_or(0) >= 1,
            "{name}: no {kind} fault was injected: {json:#}"
        );
    }
}

/// A short election run: every hold a campaign in one of two keys' elections, with the
/// faults that hit holders, beside the other backends' runs as [`semaphore`] is. It passes
/// with no violation (never two leaders of a key at once outside a declared fenced fault,
/// terms increasing), and leaders wrote under their terms.
fn elections(name: &str, case: &Case) {
    let faults = ["kill", "pause", "partition"];
    let json = run(
        &format!("{name}-elections"),
        case,
        "8s",
        &["--election", "--keys", "2", "--faults", &faults.join(",")],
    );
    assert_eq!(json["workload"], "elections", "{json:#}");
    assert!(
        json["holds"].as_u64().unwrap_or(0) > 20
            && json["shared_holds"].as_u64() == Some(0)
            && json["writes_accepted"].as_u64().unwrap_or(0) > 0,
        "{name}: enough terms, none shared, leaders wrote under their terms: {json:#}"
    );
    for kind in faults {
        assert!(
            json["by_kind"][kind]["injected"].as_u64().unwrap_or(0) >= 1,
            "{name}: no {kind} fault was injected: {json:#}"
        );
    }
}

/// A short reentrant run: every hold taken under its task's owner, entered again and left
/// lease by lease, with the faults that hit holders. It passes with no violation (a key
/// freed before its owner's last lease shows as two holders), re-entries kept their
/// hold's token, and holders wrote between their releases.
fn reentry(name: &str, case: &Case) {
    let faults = ["kill", "pause", "partition"];
    let json = run(
        &format!("{name}-reentry"),
        case,
        "8s",
        &["--reentry", "--keys", "2", "--faults", &faults.join(",")],
    );
    assert_eq!(json["workload"], "reentrant holds", "{json:#}");
    assert!(
        json["holds"].as_u64().unwrap_or(0) > 20
            && json["reentries"].as_u64().unwrap_or(0) > 20
            && json["writes_accepted"].as_u64().unwrap_or(0) > 0,
        "{name}: enough holds and re-entries, holders wrote: {json:#}"
    );
    for kind in faults {
        assert!(
            json["by_kind"][kind]["injected"].as_u64().unwrap_or(0) >= 1,
            "{name}: no {kind} fault was injected: {json:#}"
        );
    }
}

const ONE_SERVER_FAULTS: &[&str] = &[
    "kill",
    "pause",
    "partition",
    "restart",
    "delay",
    "client_clock",
];
const ALL_FAULTS: &[&str] = &[
    "kill",
    "pause",
    "partition",
    "restart",
    "member",
    "split",
    "delay",
    "client_clock",
];

const REDIS: Case = Case {
    env: "DLOCK_TORTURE_REDIS_URL",
    default: "redis://127.0.0.1:6380",
    options: "",
    setup: "scripts/backends up torture-redis",
    duration: "25s",
    seed: 11,
    faults: ONE_SERVER_FAULTS,
};

#[test]
fn redis() {
    torture("redis", &REDIS);
}

#[test]
fn redis_semaphore() {
    semaphore("redis", &REDIS);
}

#[test]
fn redis_elections() {
    elections("redis", &REDIS);
}

#[test]
fn redis_reentry() {
    reentry("redis", &REDIS);
}

#[test]
fn redis_key_sets() {
    key_sets("redis", &REDIS);
}

/// A replicated Redis topology: holders killed and paused, and the primary failed over (its
/// servers are shared with other tests, so they are never stopped).
const FAILOVER_FAULTS: &[&str] = &["kill", "pause", "failover", "client_clock"];

const REDIS_SENTINEL: Case = Case {
    env: "DLOCK_REDIS_SENTINEL_URL",
    default: "redis+sentinel://dlock:dlock-secret@127.0.0.1:26391,127.0.0.1:26392,127.0.0.1:26393/dlock",
    options: "",
    setup: "scripts/backends up redis-sentinel",
    duration: "20s",
    seed: 17,
    faults: FAILOVER_FAULTS,
};

#[test]
fn redis_sentinel() {
    torture("redis_sentinel", &REDIS_SENTINEL);
}

const REDIS_CLUSTER: Case = Case {
    env: "DLOCK_REDIS_CLUSTER_URL",
    default: "redis+cluster://dlock:dlock-secret@127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103",
    options: "",
    setup: "scripts/backends up redis-cluster",
    duration: "20s",
    seed: 18,
    faults: FAILOVER_FAULTS,
};

#[test]
fn redis_cluster() {
    torture("redis_cluster", &REDIS_CLUSTER);
}

const REDLOCK: Case = Case {
    env: "DLOCK_REDLOCK_URL",
    default: "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005",
    options: "",
    setup: "scripts/backends up redlock",
    duration: "30s",
    seed: 12,
    faults: ALL_FAULTS,
};

#[test]
fn redlock() {
    torture("redlock", &REDLOCK);
}

#[test]
fn redlock_semaphore() {
    semaphore("redlock", &REDLOCK);
}

#[test]
fn redlock_elections() {
    elections("redlock", &REDLOCK);
}

#[test]
fn redlock_reentry() {
    reentry("redlock", &REDLOCK);
}

#[test]
fn redlock_key_sets() {
    key_sets("redlock", &REDLOCK);
}

const ZOOKEEPER: Case = Case {
    env: "DLOCK_ZK_ENSEMBLE_URL",
    default: "zk://127.0.0.1:2182,127.0.0.1:2183,127.0.0.1:2184",
    options: "session_timeout=3s",
    setup: "scripts/backends up zk-ensemble",
    duration: "40s",
    seed: 13,
    faults: ALL_FAULTS,
};

#[test]
fn zookeeper() {
    torture("zookeeper", &ZOOKEEPER);
}

#[test]
fn zookeeper_semaphore() {
    semaphore("zookeeper", &ZOOKEEPER);
}

#[test]
fn zookeeper_elections() {
    elections("zookeeper", &ZOOKEEPER);
}

#[test]
fn zookeeper_reentry() {
    reentry("zookeeper", &ZOOKEEPER);
}

#[test]
fn zookeeper_key_sets() {
    key_sets("zookeeper", &ZOOKEEPER);
}

const ETCD: Case = Case {
    env: "DLOCK_ETCD_CLUSTER_URL",
    default: "etcd://127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793",
    options: "",
    setup: "scripts/backends up etcd-cluster",
    duration: "40s",
    seed: 14,
    faults: ALL_FAULTS,
};

#[test]
fn etcd() {
    torture("etcd", &ETCD);
}

#[test]
fn etcd_semaphore() {
    semaphore("etcd", &ETCD);
}

#[test]
fn etcd_elections() {
    elections("etcd", &ETCD);
}

#[test]
fn etcd_reentry() {
    reentry("etcd", &ETCD);
}

#[test]
fn etcd_key_sets() {
    key_sets("etcd", &ETCD);
}

const MYSQL: Case = Case {
    env: "DLOCK_TORTURE_MYSQL_URL",
    default: "mysql://dlock:dlock@127.0.0.1:3307/dlock",
    options: "",
    setup: "scripts/backends up torture-mariadb",
    duration: "25s",
    seed: 15,
    faults: ONE_SERVER_FAULTS,
};

#[test]
fn mysql() {
    torture("mysql", &MYSQL);
}

#[test]
fn mysql_semaphore() {
    semaphore("mysql", &MYSQL);
}

#[test]
fn mysql_elections() {
    elections("mysql", &MYSQL);
}

#[test]
fn mysql_reentry() {
    reentry("mysql", &MYSQL);
}

#[test]
fn mysql_key_sets() {
    key_sets("mysql", &MYSQL);
}

const POSTGRES: Case = Case {
    env: "DLOCK_TORTURE_POSTGRES_URL",
    default: "postgres://dlock:dlock@127.0.0.1:5433/dlock",
    options: "",
    setup: "scripts/backends up torture-postgres",
    duration: "25s",
    seed: 16,
    faults: ONE_SERVER_FAULTS,
};

#[test]
fn postgres() {
    torture("postgres", &POSTGRES);
}

#[test]
fn postgres_semaphore() {
    semaphore("postgres", &POSTGRES);
}

#[test]
fn postgres_elections() {
    elections("postgres", &POSTGRES);
}

#[test]
fn postgres_reentry() {
    reentry("postgres", &POSTGRES);
}

#[test]
fn postgres_key_sets() {
    key_sets("postgres", &POSTGRES);
}

/// A run on memory://, where each worker process has a lock of its own: it must fail.
/// The violations it found, by kind.
fn broken_run(name: &str, extra: &[&str]) -> Vec<String> {
    let report = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("torture-{name}.json"));
    let _ = std::fs::remove_file(&report);
    let out = Command::new(env!("CARGO_BIN_EXE_torture"))
        .args(["--backend", "memory://torture-self-test", "--allow-memory"])
        .args([
            "--duration",
            "3s",
            "--faults",
            "kill,pause",
            "--seed",
            "1",
            "--report",
        ])
        .arg(&report)
        .args(extra)
        .output()
        .expect("run the torture binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("**FAILED**"), "{stdout}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("a report")).expect("JSON");
    json["violations"]
        .as_array()
        .expect("violations")
        .iter()
        .filter_map(|v| v["what"].as_str().map(str::to_owned))
        .collect()
}

/// The checks catch a lock that does not exclude: with memory://, each worker process has
/// a lock of its own, so holds overlap across processes and stale writes reach the store.
#[test]
fn a_lock_that_does_not_exclude_across_processes_fails_the_run() {
    let whats = broken_run("memory", &[]);
    assert!(whats.iter().any(|w| w == "overlap"), "{whats:?}");
    assert!(
        whats.iter().any(|w| w == "unexpected rejection"),
        "{whats:?}"
    );
}

/// The checks catch a semaphore that does not count across processes: with memory://,
/// each of the three worker processes lets its own two holders in.
#[test]
fn a_semaphore_that_does_not_count_across_processes_fails_the_run() {
    let whats = broken_run("memory-permits", &["--permits", "2"]);
    assert!(whats.iter().any(|w| w == "over limit"), "{whats:?}");
    assert!(
        whats.iter().all(|w| w == "over limit"),
        "only the count is broken: {whats:?}"
    );
}

/// The checks catch key sets that do not exclude across processes: with memory://, each
/// worker process takes its sets on a lock of its own, so the keys' holds overlap.
#[test]
fn key_sets_that_do_not_exclude_across_processes_fail_the_run() {
    let whats = broken_run("memory-key-sets", &["--key-sets", "3"]);
    assert!(whats.iter().any(|w| w == "overlap"), "{whats:?}");
}

/// The checks catch an election with two leaders: with memory://, each worker process
/// runs its own election, so leaderships overlap across processes.
#[test]
fn elections_that_do_not_exclude_across_processes_fail_the_run() {
    let whats = broken_run("memory-elections", &["--election"]);
    assert!(whats.iter().any(|w| w == "overlap"), "{whats:?}");
}

/// The semaphore checks do not cry wolf: one worker process shares one memory:// lock, so
/// the count holds, and the report shows each key at its limit.
#[test]
fn a_semaphore_within_one_process_passes_at_its_limit() {
    let report = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("torture-memory-one.json");
    let _ = std::fs::remove_file(&report);
    let out = Command::new(env!("CARGO_BIN_EXE_torture"))
        .args(["--backend", "memory://torture-self-test", "--allow-memory"])
        .args([
            "--workers",
            "1",
            "--tasks",
            "12",
            "--keys",
            "2",
            "--permits",
            "3",
        ])
        .args(["--duration", "3s", "--faults", "kill,pause", "--seed", "3"])
        .arg("--report")
        .arg(&report)
        .output()
        .expect("run the torture binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(&report).expect("a report")).expect("JSON");
    assert!(json["permit_holds"].as_u64().unwrap_or(0) > 20, "{json:#}");
    let most = json["most_permit_holders"].as_object().expect("per key");
    assert!(
        most.len() == 2 && most.values().all(|n| n.as_u64() == Some(3)),
        "{json:#}"
    );
}

/// The checks catch reentrant holds that do not exclude across processes: with memory://,
/// each worker process enters and leaves its holds on a lock of its own.
#[test]
fn reentrant_holds_that_do_not_exclude_across_processes_fail_the_run() {
    let whats = broken_run("memory-reentry", &["--reentry"]);
    assert!(whats.iter().any(|w| w == "overlap"), "{whats:?}");
}

/// The faults of the namespaced topology's etcd and ZooKeeper groups: holders killed, paused
/// and cut off, and the leader cut off from its majority, its link slowed and made lossy.
const MEMBER_LINK_FAULTS: &[&str] = &[
    "kill",
    "pause",
    "partition",
    "split",
    "cut",
    "slow",
    "loss",
    "delay",
    "client_clock",
];

/// A group of the namespaced topology (`scripts/netns up GROUP`), up for one test and
/// removed after it, even when the test fails.
struct Namespaced(&'static str);

impl Namespaced {
    fn netns() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/netns")
    }

    fn up(group: &'static str) -> Self {
        let out = Command::new(Self::netns())
            .args(["up", group])
            .output()
            .expect("run scripts/netns");
        assert!(
            out.status.success(),
            "scripts/netns up {group} failed ({}): it needs root, iproute2 and nftables \
             (scripts/test runs it as root; DLOCK_SKIP_NETNS=1 leaves these runs out)\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Self(group)
    }
}

impl Drop for Namespaced {
    fn drop(&mut self) {
        let _ = Command::new(Self::netns()).args(["down", self.0]).output();
    }
}

/// [`torture`] on a group of the namespaced topology, brought up for the run.
fn namespaced(group: &'static str, name: &str, case: &Case) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let _up = Namespaced::up(group);
    torture_unlocked(name, case);
}

const ETCD_NETNS: Case = Case {
    env: "DLOCK_NETNS_ETCD_URL",
    default: "etcd://10.77.0.11:2379,10.77.0.12:2379,10.77.0.13:2379",
    options: "",
    setup: "scripts/netns up etcd",
    duration: "40s",
    seed: 24,
    faults: MEMBER_LINK_FAULTS,
};

/// etcd in network namespaces: its leader cut off from the other two members while the
/// clients still reach it, its link slowed and lossy, besides the holder faults.
#[test]
fn etcd_netns() {
    namespaced("etcd", "etcd-netns", &ETCD_NETNS);
}

const ZOOKEEPER_NETNS: Case = Case {
    env: "DLOCK_NETNS_ZK_URL",
    default: "zk://10.77.0.21:2181,10.77.0.22:2181,10.77.0.23:2181",
    options: "session_timeout=3s",
    setup: "scripts/netns up zk",
    duration: "40s",
    seed: 25,
    faults: MEMBER_LINK_FAULTS,
};

/// ZooKeeper in network namespaces: its leader cut off from the other two members while
/// the clients still reach it, its link slowed and lossy, besides the holder faults.
#[test]
fn zookeeper_netns() {
    namespaced("zk", "zookeeper-netns", &ZOOKEEPER_NETNS);
}

const REDLOCK_NETNS: Case = Case {
    env: "DLOCK_NETNS_REDLOCK_URL",
    default: "redlock://10.77.0.31:6379,10.77.0.32:6379,10.77.0.33:6379,10.77.0.34:6379,10.77.0.35:6379",
    options: "",
    setup: "scripts/netns up redlock",
    duration: "40s",
    seed: 26,
    faults: &[
        "kill",
        "pause",
        "partition",
        "split",
        "slow",
        "loss",
        "delay",
        "clock",
        "client_clock",
    ],
};

/// Redlock over five Redis nodes in network namespaces: a node's wall clock jumps forward
/// by more than the ttl (its keys expire early: two holders may overlap, which fencing must
/// catch), a node's link slowed and lossy, besides the holder faults.
#[test]
fn redlock_netns() {
    namespaced("redlock", "redlock-netns", &REDLOCK_NETNS);
}

const REDIS_NETNS: Case = Case {
    env: "DLOCK_NETNS_REDIS_URL",
    default: "redis://10.77.0.31:6379",
    options: "",
    setup: "scripts/netns up redlock",
    duration: "30s",
    seed: 27,
    faults: &[
        "kill",
        "pause",
        "partition",
        "slow",
        "loss",
        "delay",
        "clock",
        "client_clock",
    ],
};

/// One Redis server in a network namespace (the first node of the `redlock` group): its
/// wall clock jumps forward by more than the ttl (its keys expire early: a second holder
/// may overlap the first, which fencing must catch), its link slowed and lossy.
#[test]
fn redis_netns() {
    namespaced("redlock", "redis-netns", &REDIS_NETNS);
}
