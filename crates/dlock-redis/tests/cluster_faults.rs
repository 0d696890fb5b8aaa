//! A Redis Cluster with one master hung or failed over under a connected client
//! (`DLOCK_REDIS_CLUSTER_URL`, default: the cluster `scripts/backends up redis-cluster`
//! starts; the tests stop one of its masters by the pid `scripts/backends` keeps, and run
//! `scripts/backends failover redis-cluster`).
//!
//! - One master that hangs (`SIGSTOP`) must not cut the client off from the others: leases
//!   held on another master keep renewing, and acquires there keep working (also after
//!   that master lost its scripts), while requests to the hung master time out.
//! - A client whose slot map went stale (a `CLUSTER FAILOVER` after it connected) still
//!   acquires on every master at the first try: the `MOVED` answers are followed although
//!   redis-rs's own re-sends are off.
//! - A master that hangs is routed around once its replica takes over, although it never
//!   answers `MOVED`.
//! - A lease whose slot is resharded while it is held keeps renewing (following `ASK`)
//!   and releases after the hand-over.
//!
//! The tests change the cluster's roles: they run one at a time, and leave the cluster
//! formed and ok (`scripts/backends up redis-cluster`).

mod common;

use std::time::Duration;

use common::backends;
use common::topology::TopologyHarness;
use dlock_core::{DistributedLock, LockOptions};
use dlock_redis::server::Connection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use tokio::time::Instant;

/// The tests change the cluster's roles: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This test's turn, the cluster formed and ok (`scripts/backends up redis-cluster`), and
/// its masters now.
async fn formed_cluster() -> (
    tokio::sync::MutexGuard<'static, ()>,
    TopologyHarness,
    Vec<Master>,
) {
    dlock_conformance::init_tracing();
    let serial = SERIAL.lock().await;
    let harness = TopologyHarness::cluster();
    backends::run(&["up", "redis-cluster"]).await;
    let masters = masters(&harness).await;
    (serial, harness, masters)
}

/// A master of the cluster: its port and the slot ranges it serves.
#[derive(Debug, Clone)]
struct Master {
    port: u16,
    slots: Vec<(u16, u16)>,
}

impl Master {
    fn serves(&self, slot: u16) -> bool {
        self.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
    }
}

/// The masters that serve slots now (`CLUSTER NODES`), by port.
async fn masters(harness: &TopologyHarness) -> Vec<Master> {
    let mut admin = harness.admin().await.unwrap_or_else(|e| {
        panic!(
            "the cluster is not reachable: {e}\n  start it with: scripts/backends up redis-cluster"
        )
    });
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut admin)
        .await
        .expect("CLUSTER NODES");
    let mut masters: Vec<Master> = nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.contains("master") || flags.contains("fail") {
                return None;
            }
            let port = fields[1]
                .split('@')
                .next()?
                .rsplit_once(':')?
                .1
                .parse()
                .ok()?;
            let slots: Vec<(u16, u16)> = fields
                .iter()
                .skip(8)
                .filter(|range| !range.starts_with('['))
                .filter_map(|range| match range.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => range.parse().ok().map(|s| (s, s)),
                })
                .collect();
            (!slots.is_empty()).then_some(Master { port, slots })
        })
        .collect();
    masters.sort_by_key(|m| m.port);
    assert!(
        masters.len() >= 2,
        "the cluster has fewer than two masters serving slots: {masters:?}"
    );
    masters
}

/// A key (of the lock `harness` builds) whose lock key is in a slot `master` serves.
async fn key_on(harness: &TopologyHarness, master: &Master, label: &str) -> String {
    let mut admin = harness.admin().await.expect("admin connection");
    let base = common::unique_key(&format!("cluster-faults/{label}"));
    for i in 0..10_000 {
        let key = format!("{base}/{i}");
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(format!("{}{key}", harness.config().prefix))
            .query_async(&mut admin)
            .await
            .expect("CLUSTER KEYSLOT");
        if master.serves(slot) {
            return key;
        }
    }
    panic!("no key found on the master at port {}", master.port);
}

/// The pid of the cluster node listening on `port`, from the pid files `scripts/backends`
/// keeps (`$DLOCK_BACKENDS_DIR`, default `/var/tmp/dlock-backends`).
fn pid_of(port: u16) -> u32 {
    let base = std::env::var("DLOCK_BACKENDS_DIR")
        .unwrap_or_else(|_| "/var/tmp/dlock-backends".to_owned());
    for n in 1..=6 {
        let file = format!("{base}/redis-cluster-{n}/pid");
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        let Some(pid) = text.split_whitespace().next().and_then(|p| p.parse().ok()) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(&format!(":{port}")) {
            return pid;
        }
    }
    panic!(
        "no pid of the cluster node on port {port} under {base}/redis-cluster-*/pid: this test \
         stops a master of the cluster scripts/backends starts (scripts/backends up redis-cluster)"
    );
}

fn signal(pid: u32, which: &str) {
    let status = std::process::Command::new("kill")
        .arg(format!("-{which}"))
        .arg(pid.to_string())
        .status()
        .unwrap_or_else(|e| panic!("kill -{which} {pid}: {e}"));
    assert!(status.success(), "kill -{which} {pid}: {status}");
}

/// Resumes a stopped node when dropped, even when the test failed, and waits until the
/// cluster is formed and ok again (`scripts/backends up redis-cluster`: the node rejoins
/// as a replica if its replica took over meanwhile).
struct Stopped(u32);

impl Drop for Stopped {
    fn drop(&mut self) {
        signal(self.0, "CONT");
        match std::process::Command::new(backends::script())
            .args(["up", "redis-cluster"])
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!(
                "scripts/backends up redis-cluster failed after resuming pid {}: {}",
                self.0,
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => eprintln!("cannot run scripts/backends up redis-cluster: {e}"),
        }
    }
}

/// How long the test watches the healthy master while another one hangs: past the
/// cluster's failover of the hung master (node timeout 2 s, then the replica's election).
const WATCH: Duration = Duration::from_secs(6);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_does_not_cut_the_client_off_from_the_others() {
    let (_serial, harness, masters) = formed_cluster().await;
    let hung = masters.last().expect("two masters").clone();
    let healthy = masters[0].clone();
    let held_key = key_on(&harness, &healthy, "held").await;
    let probe_key = key_on(&harness, &healthy, "probe").await;
    let hung_key = key_on(&harness, &hung, "hung").await;

    // The default response timeout (2 s): while the cluster marks the hung master failed
    // and before its replica takes over (about a second with the test cluster's 2 s node
    // timeout), every node answers CLUSTERDOWN (`cluster-require-full-coverage yes`, the
    // default), and the client sends again within the response timeout.
    let lock = harness.lock().await;
    let opts = LockOptions::new().ttl(Duration::from_secs(3));
    let held = lock
        .try_acquire(&held_key, &opts)
        .await
        .expect("acquire on the healthy master")
        .expect("the key is free");
    // The client has a connection to the master that will hang.
    backends::acquire_and_release(&lock, &hung_key, &opts, "on the master that will hang").await;

    let Connection::Cluster(admin) = harness.admin().await.expect("admin connection") else {
        panic!("the cluster harness gave a single server's connection");
    };
    let stopped = Stopped(pid_of(hung.port));
    signal(stopped.0, "STOP");
    // The healthy master forgets the scripts, as a promoted replica that never had them:
    // the next calls there must load them there only, not on every node (the hung one
    // would never answer).
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: "127.0.0.1".into(),
        port: healthy.port,
    });
    let flushed: String = redis::from_redis_value(
        admin
            .inner()
            .route_command(redis::cmd("SCRIPT").arg("FLUSH").clone(), route)
            .await
            .expect("SCRIPT FLUSH on the healthy master"),
    )
    .expect("SCRIPT FLUSH answers OK");
    assert_eq!(flushed, "OK");
    eprintln!(
        "stopped the master on port {} (pid {}); watching the master on port {}",
        hung.port, stopped.0, healthy.port
    );

    // Requests to the hung master meanwhile: they time out (or fail), which must not take
    // the other masters down with them.
    let hammer = {
        let lock = lock.clone();
        tokio::spawn(async move {
            let until = Instant::now() + WATCH;
            let (mut failed, mut answered) = (0, 0);
            while Instant::now() < until {
                match lock.try_acquire(&hung_key, &opts).await {
                    Ok(lease) => {
                        answered += 1;
                        if let Some(lease) = lease {
                            let _ = lease.release().await;
                        }
                    }
                    Err(_) => failed += 1,
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (failed, answered)
        })
    };

    let until = Instant::now() + WATCH;
    let mut rounds = 0;
    while Instant::now() < until {
        let started = Instant::now();
        let lease = lock
            .try_acquire(&probe_key, &opts)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "try_acquire on the healthy master failed while another master hangs \
                     (round {rounds}): {e}"
                )
            })
            .expect("the probe key is free");
        lease
            .release()
            .await
            .unwrap_or_else(|e| panic!("release on the healthy master failed: {e}"));
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "acquire + release on the healthy master took {:?}",
            started.elapsed()
        );
        assert!(
            !held.is_lost(),
            "the lease on the healthy master was lost while another master hangs"
        );
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (failed, answered) = hammer.await.expect("the hung master's task");
    eprintln!(
        "{rounds} acquires on the healthy master; on the hung one's slots {failed} requests \
         failed, {answered} were answered (by its replica, once promoted)"
    );
    assert!(
        failed > 0,
        "the stopped master kept answering: was it stopped?"
    );
    assert!(!held.is_lost(), "the lease on the healthy master was lost");
    held.release()
        .await
        .expect("the lease on the healthy master releases");

    tokio::task::spawn_blocking(move || drop(stopped))
        .await
        .expect("resuming the stopped master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_slot_map_still_acquires_at_the_first_try() {
    let (_serial, harness, masters) = formed_cluster().await;
    let mut keys = Vec::new();
    for (i, master) in masters.iter().enumerate() {
        keys.push(key_on(&harness, master, &format!("stale/{i}")).await);
    }
    let lock = harness.lock().await;
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    // The client learns the slot map and connects to every master.
    for key in &keys {
        backends::acquire_and_release(&lock, key, &opts, "before the failover").await;
    }

    let master = backends::run(&["failover", "redis-cluster"]).await;
    eprintln!("failed over: the new master is {master}");

    // One of the masters the client knows is a replica now, answering MOVED.
    for key in &keys {
        let lease = lock
            .try_acquire(key, &opts)
            .await
            .unwrap_or_else(|e| panic!("acquire {key} after the failover: {e}"))
            .unwrap_or_else(|| panic!("{key} is free after the failover"));
        lease
            .release()
            .await
            .unwrap_or_else(|e| panic!("release {key} after the failover: {e}"));
    }
}

/// An acquire whose first send ran but whose answer was lost (an I/O error, a timeout) and
/// that is tried again with the same token finds the key held by its own token: that key
/// must not stay locked for a full ttl with nobody knowing its fencing token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_held_with_our_own_token_is_not_left_locked() {
    dlock_conformance::init_tracing();
    let _serial = SERIAL.lock().await;
    let harness = TopologyHarness::cluster();
    let node = dlock_redis::server::Node::new(harness.config(), "redis").expect("a cluster node");
    node.connect().await.unwrap_or_else(|e| {
        panic!(
            "the cluster is not reachable: {e}\n  start it with: scripts/backends up redis-cluster"
        )
    });
    let key = common::unique_key("cluster-faults/own-token");
    let names = dlock_redis::server::Names::in_cluster(&harness.config().prefix, &key);
    let token = dlock_redis::server::new_token();
    let mut admin = harness.admin().await.expect("admin connection");
    // What a first send that ran leaves behind.
    let _: () = redis::cmd("SET")
        .arg(&names.key)
        .arg(&token)
        .arg("PX")
        .arg(60_000)
        .query_async(&mut admin)
        .await
        .expect("SET the lock key");
    let attempt = node
        .acquire(
            &names,
            &token,
            Duration::from_secs(5),
            &dlock_redis::server::Queueing::default(),
        )
        .await
        .expect("acquire with our own token");
    let dlock_redis::server::Attempt::Taken { fence } = attempt else {
        panic!("the key held with our own token was answered {attempt:?}");
    };
    assert!(fence > 0);
    let pttl: i64 = redis::cmd("PTTL")
        .arg(&names.key)
        .query_async(&mut admin)
        .await
        .expect("PTTL");
    assert!(
        (0..=5_000).contains(&pttl),
        "the key keeps the stale grant's ttl: {pttl} ms"
    );
    assert!(node.release(&names, &token, true).await.expect("release"));
}

/// How long after a master hangs its slots must be served again through its promoted
/// replica: the test cluster's node timeout (2 s), the replica's election, and the
/// client's fresh slot map.
const ROUTED_AROUND: Duration = Duration::from_secs(20);

/// A master that hangs (no reset, no answer: as one cut off from the network) is routed
/// around once the cluster promotes its replica, although no answer of the hung master
/// ever says `MOVED`: its keys can be taken again through the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_master_is_routed_around_once_its_replica_takes_over() {
    let (_serial, harness, masters) = formed_cluster().await;
    let hung = masters.last().expect("two masters").clone();
    let key = key_on(&harness, &hung, "routed-around").await;
    let lock = harness.lock().await;
    let opts = LockOptions::new().ttl(Duration::from_secs(3));
    // The client's slot map sends the key to the master that will hang.
    backends::acquire_and_release(&lock, &key, &opts, "on the master that will hang").await;

    let stopped = Stopped(pid_of(hung.port));
    signal(stopped.0, "STOP");
    let started = Instant::now();
    let mut failed = 0;
    let lease = loop {
        match lock.try_acquire(&key, &opts).await {
            Ok(Some(lease)) => break lease,
            outcome => {
                assert!(
                    started.elapsed() < ROUTED_AROUND,
                    "{key}, on the master on port {} that hangs, was not taken through its \
                     promoted replica within {ROUTED_AROUND:?} ({failed} tries failed; last \
                     {outcome:?})",
                    hung.port
                );
                failed += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    eprintln!(
        "{key} taken through the promoted replica {:?} after the master on port {} hung \
         ({failed} tries failed meanwhile)",
        started.elapsed(),
        hung.port
    );
    lease
        .release()
        .await
        .expect("release through the promoted replica");
    tokio::task::spawn_blocking(move || drop(stopped))
        .await
        .expect("resuming the stopped master");
}

/// A connection to the master on `port` alone (not through the cluster's routing).
async fn on_port(harness: &TopologyHarness, port: u16) -> redis::aio::MultiplexedConnection {
    let config = dlock_redis::RedisConfig {
        topology: dlock_redis::Topology::Server,
        ..harness.config().at("127.0.0.1", port)
    };
    dlock_redis::server::Node::new(&config, "redis")
        .expect("a node's settings")
        .raw_connection()
        .await
        .unwrap_or_else(|e| panic!("connect to the cluster node on port {port}: {e}"))
}

/// A cluster node and its id.
struct ClusterNode {
    port: u16,
    id: String,
    conn: redis::aio::MultiplexedConnection,
}

impl ClusterNode {
    async fn at(harness: &TopologyHarness, port: u16) -> Self {
        let mut conn = on_port(harness, port).await;
        let id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query_async(&mut conn)
            .await
            .expect("CLUSTER MYID");
        Self { port, id, conn }
    }

    async fn setslot(&mut self, slot: u16, state: &str, id: &str) {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(state);
        if !id.is_empty() {
            cmd.arg(id);
        }
        let _: () = cmd.query_async(&mut self.conn).await.unwrap_or_else(|e| {
            panic!("CLUSTER SETSLOT {slot} {state} on port {}: {e}", self.port)
        });
    }
}

/// One slot moved from one master to another, step by step as `redis-cli --cluster
/// reshard` moves it: the target imports it and the source migrates it, the keys move one
/// batch at a time (`MIGRATE`), and the slot is handed over to the target. Set back to
/// stable on both nodes when dropped unfinished (a failed test).
struct Migration {
    slot: u16,
    from: ClusterNode,
    to: ClusterNode,
    /// `AUTH2 user password` for `MIGRATE`, the data nodes' credentials.
    auth: Vec<String>,
    finished: bool,
}

impl Migration {
    async fn begin(harness: &TopologyHarness, slot: u16, from: u16, to: u16) -> Self {
        let mut from = ClusterNode::at(harness, from).await;
        let mut to = ClusterNode::at(harness, to).await;
        to.setslot(slot, "IMPORTING", &from.id.clone()).await;
        from.setslot(slot, "MIGRATING", &to.id.clone()).await;
        let config = harness.config();
        let auth = match (&config.username, &config.password) {
            (Some(user), Some(password)) => {
                vec!["AUTH2".into(), user.clone(), password.expose().to_owned()]
            }
            (None, Some(password)) => vec!["AUTH".into(), password.expose().to_owned()],
            _ => Vec::new(),
        };
        Self {
            slot,
            from,
            to,
            auth,
            finished: false,
        }
    }

    /// Move every key of the slot to the target; how many moved.
    async fn move_keys(&mut self) -> usize {
        let mut moved = 0;
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(self.slot)
                .arg(100)
                .query_async(&mut self.from.conn)
                .await
                .expect("CLUSTER GETKEYSINSLOT");
            if keys.is_empty() {
                return moved;
            }
            let _: () = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.to.port)
                .arg("")
                .arg(0)
                .arg(5_000)
                .arg(&self.auth)
                .arg("KEYS")
                .arg(&keys)
                .query_async(&mut self.from.conn)
                .await
                .unwrap_or_else(|e| {
                    panic!("MIGRATE {} keys of slot {}: {e}", keys.len(), self.slot)
                });
            moved += keys.len();
        }
    }

    /// Hand the slot over to the target: on the target, the source, then every other
    /// master.
    async fn finish(mut self, harness: &TopologyHarness, masters: &[Master]) {
        let (slot, to) = (self.slot, self.to.id.clone());
        self.to.setslot(slot, "NODE", &to).await;
        self.from.setslot(slot, "NODE", &to).await;
        for master in masters {
            if master.port != self.from.port && master.port != self.to.port {
                ClusterNode::at(harness, master.port)
                    .await
                    .setslot(slot, "NODE", &to)
                    .await;
            }
        }
        self.finished = true;
    }
}

impl Drop for Migration {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        for port in [self.from.port, self.to.port] {
            let _ = std::process::Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &port.to_string()])
                .args(["CLUSTER", "SETSLOT", &self.slot.to_string(), "STABLE"])
                .output();
        }
    }
}

/// A lease whose slot is migrated to another master while it is held, as `redis-cli
/// --cluster reshard` does it. Once its keys are on the target but the slot is not handed
/// over yet (the source answers `ASK` for them), for longer than two ttls: the lease keeps
/// renewing where its key is now, and another client is not granted its key. After the
/// hand-over (the source answers `MOVED`), it releases, and the key is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_kept_while_its_slot_migrates() {
    let (_serial, harness, masters) = formed_cluster().await;
    let (source, target) = (masters[0].clone(), masters[1].clone());
    let key = key_on(&harness, &source, "migrated").await;
    let mut admin = harness.admin().await.expect("admin connection");
    let names = dlock_redis::server::Names::in_cluster(&harness.config().prefix, &key);
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&names.key)
        .query_async(&mut admin)
        .await
        .expect("CLUSTER KEYSLOT");
    let lock = harness.lock().await;
    let other = harness.lock().await;
    let ttl = Duration::from_secs(2);
    let opts = LockOptions::new().ttl(ttl);
    let lease = lock
        .try_acquire(&key, &opts)
        .await
        .expect("acquire before the migration")
        .expect("the key is free");

    let mut migration = Migration::begin(&harness, slot, source.port, target.port).await;
    let moved = migration.move_keys().await;
    assert!(
        moved >= 2,
        "the lock key and its fence counter moved: {moved} keys"
    );
    eprintln!(
        "slot {slot}: {moved} keys moved from port {} to port {}; not handed over yet",
        source.port, target.port
    );
    let until = Instant::now() + 3 * ttl;
    let mut refused = 0;
    while Instant::now() < until {
        assert!(
            !lease.is_lost(),
            "the lease was lost while its slot was being migrated"
        );
        if let Ok(Some(stolen)) = other.try_acquire(&key, &opts).await {
            let _ = stolen.release().await;
            panic!("another client was granted {key} while its slot was being migrated");
        }
        refused += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    migration.finish(&harness, &masters).await;
    assert!(
        !lease.is_lost(),
        "the lease was lost when its slot was handed over"
    );
    lease
        .release()
        .await
        .expect("release after the slot was handed over");
    eprintln!("{refused} tries of another client refused meanwhile");
    let again = other
        .try_acquire(&key, &opts)
        .await
        .expect("acquire after the release")
        .expect("the key is free after the release");
    again.release().await.expect("release");

    // The slot goes back where it was.
    let mut back = Migration::begin(&harness, slot, target.port, source.port).await;
    back.move_keys().await;
    back.finish(&harness, &masters).await;
}
