//! Node failures against the real Redlock nodes: dead ports, and nodes stopped with
//! `scripts/backends down` and started again (always, also when a test fails). The tests
//! run one at a time.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::{RedlockHarness, must_take, unique_key};
use dlock_core::{DistributedLock, Election, ErrorKind, LockOptions, Wait};
use dlock_redis::server::Names;
use redis::AsyncCommands;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// Every test here takes this first: the ones that stop nodes would disturb the others.
static NODES: Mutex<()> = Mutex::const_new(());

/// Nodes stopped by a test; started again when dropped.
struct Stopped(Vec<&'static str>);

impl Stopped {
    fn stop(names: &[&'static str]) -> Self {
        let stopped = Self(names.to_vec());
        backends("down", names).unwrap_or_else(|e| panic!("{e}"));
        stopped
    }

    fn start(mut self) {
        let names = std::mem::take(&mut self.0);
        backends("up", &names).unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !self.0.is_empty()
            && let Err(e) = backends("up", &self.0)
        {
            eprintln!("{e}");
        }
    }
}

/// Run `scripts/backends <action> <names>`, once more after a second if it fails (another
/// run may hold its lock).
fn backends(action: &str, names: &[&str]) -> Result<(), String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/backends");
    let run = || {
        let out = std::process::Command::new(&script)
            .arg(action)
            .args(names)
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "scripts/backends {action} {names:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    };
    run().or_else(|e| {
        eprintln!("{e}; trying once more");
        std::thread::sleep(Duration::from_secs(1));
        run()
    })
}

async fn hand_off(a: &dlock_redlock::RedlockLock, b: &dlock_redlock::RedlockLock, key: &str) {
    let opts = LockOptions::new().ttl(Duration::from_secs(1));
    let lease = must_take(a, key, &opts).await;
    assert!(
        b.try_acquire(key, &opts)
            .await
            .expect("try_acquire")
            .is_none(),
        "a held key was taken"
    );
    let waiter = {
        let (b, key) = (b.clone(), key.to_owned());
        tokio::spawn(async move {
            let lease = b
                .acquire(&key, &opts.wait(Wait::For(Duration::from_secs(20))))
                .await
                .expect("the waiter acquires");
            (Instant::now(), lease)
        })
    };
    // Held through several renewals, then handed over by the release.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!lease.is_lost(), "lost with a quorum up: {lease:?}");
    assert!(!waiter.is_finished(), "the waiter took a held key");
    let released = Instant::now();
    lease.release().await.expect("release");
    let (acquired, next) = waiter.await.expect("waiter");
    let handoff = acquired.saturating_duration_since(released);
    assert!(
        handoff < Duration::from_millis(500),
        "hand-off took {handoff:?}"
    );
    next.extend(Duration::from_secs(2)).await.expect("extend");
    next.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_of_five_nodes_at_dead_ports_locks_still_work() {
    let _serial = NODES.lock().await;
    let harness = RedlockHarness::from_env();
    let url = harness.url_with_dead_nodes(&[1, 4]);
    let (a, b) = (harness.lock_at(&url).await, harness.lock_at(&url).await);
    let key = unique_key("two-dead");
    hand_off(&a, &b, &key).await;
    harness.assert_free_everywhere(&key).await;
    harness.forget_fence(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_two_of_five_nodes_stopped_locks_still_work() {
    let _serial = NODES.lock().await;
    let harness = RedlockHarness::from_env();
    let stopped = Stopped::stop(&["redlock-4", "redlock-5"]);
    let (a, b) = (harness.lock().await, harness.lock().await);
    let key = unique_key("two-stopped");
    hand_off(&a, &b, &key).await;
    stopped.start();
    harness.assert_free_everywhere(&key).await;
    harness.forget_fence(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_three_of_five_nodes_stopped_acquire_fails_within_the_deadline() {
    let _serial = NODES.lock().await;
    let harness = RedlockHarness::from_env();
    let lock = harness.lock().await;
    let key = unique_key("three-stopped");
    let stopped = Stopped::stop(&["redlock-3", "redlock-4", "redlock-5"]);
    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let err = lock
        .acquire(&key, &LockOptions::new().wait(Wait::For(wait)))
        .await
        .expect_err("no quorum with three of five nodes down");
    let took = started.elapsed();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("only 2 of 5 nodes answered, 3 needed"),
        "{text}"
    );
    assert!(
        text.contains("127.0.0.1:7005"),
        "the error should name the nodes: {text}"
    );
    assert!(
        took <= wait + Duration::from_secs(2),
        "failed after {took:?}"
    );
    // Nothing is left on the nodes that are up.
    let names = Names::new(harness.prefix(), &key);
    for node in 0..2 {
        let mut admin = harness.admin(node).await.expect("admin");
        let value: Option<String> = admin.get(&names.key).await.expect("GET");
        assert_eq!(value, None, "node {node} kept a key of the failed acquire");
    }
    stopped.start();
    // With the nodes back, the same client locks again.
    let lease = lock
        .acquire(
            &key,
            &LockOptions::new().wait(Wait::For(Duration::from_secs(10))),
        )
        .await
        .expect("acquire once the nodes are back");
    lease.release().await.expect("release");
    harness.forget_fence(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restarted_empty_gets_the_key_back_at_the_next_extension() {
    let _serial = NODES.lock().await;
    let harness = RedlockHarness::from_env();
    let lock = harness.lock().await;
    let key = unique_key("restarted");
    let names = Names::new(harness.prefix(), &key);
    let ttl = Duration::from_secs(1);
    let lease = lock
        .try_acquire(&key, &LockOptions::new().ttl(ttl))
        .await
        .expect("try_acquire")
        .expect("free");
    let token = harness.held_everywhere(&key).await;
    Stopped::stop(&["redlock-3"]).start();
    let mut node = harness.admin(2).await.expect("admin of the restarted node");
    let restarted_empty: Option<String> = node.get(&names.key).await.expect("GET");
    let started = Instant::now();
    if restarted_empty.is_some() {
        // An extension already ran since the restart; it can only have put our token back.
        assert_eq!(restarted_empty.as_deref(), Some(token.as_str()));
    }
    loop {
        let value: Option<String> = node.get(&names.key).await.expect("GET");
        if value.as_deref() == Some(token.as_str()) {
            break;
        }
        assert!(
            started.elapsed() < ttl * 3,
            "the restarted node did not get the key back: {value:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pttl: i64 = node.pttl(&names.key).await.expect("PTTL");
    assert!(pttl > 0 && pttl <= 1000, "re-created with pttl {pttl}");
    let fence: Option<u64> = node.get(&names.fence).await.expect("GET fence");
    assert!(
        fence >= Some(lease.fencing_token()),
        "the restarted node's fence {fence:?} is behind the lease's {}",
        lease.fencing_token()
    );
    assert!(!lease.is_lost(), "{lease:?}");
    lease.release().await.expect("release");
    harness.assert_free_everywhere(&key).await;
    harness.forget_fence(&key).await;
}

/// An election's proclaim whose swap ran on a node too late to count (the node paused
/// with `CLIENT PAUSE`, which runs what it received once the pause ends): the roll-back
/// goes to that node too, and the leadership stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_swap_answered_too_late_is_put_back_and_stays_held() {
    let _nodes = NODES.lock().await;
    let harness = RedlockHarness::from_env();
    let key = unique_key("election-late-swap");
    let names = Names::new(harness.prefix(), &key);
    // No renewals: they would give nodes 0 and 1 the key back. The per-node timeout is at
    // most 5 % of the ttl, 200 ms, well under the pause below.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(4))
        .auto_renew(false);
    let mut leading = Election::new(Arc::new(harness.lock().await), key.as_str())
        .options(opts)
        .campaign("old")
        .await
        .expect("campaign");
    let token = harness.held_everywhere(&key).await;
    for i in 0..2 {
        let _: i64 = harness
            .admin(i)
            .await
            .expect("admin")
            .del(&names.key)
            .await
            .expect("DEL");
    }
    // Node 2 runs what it receives only after the pause: its swap runs, too late to count.
    let pause = Duration::from_millis(1000);
    let paused_at = Instant::now();
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(pause.as_millis().to_string())
        .query_async(&mut harness.admin(2).await.expect("admin"))
        .await
        .expect("CLIENT PAUSE");
    let err = leading
        .proclaim("new")
        .await
        .expect_err("two nodes swapped");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    tokio::time::sleep_until(paused_at + pause + Duration::from_millis(200)).await;
    let values = harness.values(&key).await;
    assert_eq!(values[..2], [None, None]);
    assert_eq!(
        values[2..],
        [
            Some(token.clone()),
            Some(token.clone()),
            Some(token.clone())
        ],
        "the late node is put back too"
    );
    leading
        .lease()
        .extend(Duration::from_secs(4))
        .await
        .expect("still held on nodes 2 to 4");
    leading.resign().await.expect("resign");
    assert_eq!(harness.values(&key).await, [None, None, None, None, None]);
}
