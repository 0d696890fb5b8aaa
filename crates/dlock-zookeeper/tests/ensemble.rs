//! Failover on the 3-member ensemble (2182..2184), one test doing the steps in order:
//!
//! 1. stop the member the holder's session is connected to: the session moves to another
//!    member, and the lease stays valid and exclusive;
//! 2. stop a majority: `lost()` fires within the session timeout;
//! 3. bring every member back (also when the test fails: a drop guard), wait until each
//!    answers `srvr` with a mode, and check the key can be taken again.
//!
//! It stops and starts the members dedicated to fault tests only (`zk-ensemble-1..3`).

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::ZookeeperHarness;
use dlock_conformance::Harness;
use dlock_core::{DistributedLock, LockOptions, LostReason, Wait};
use tokio::time::{Instant, sleep, timeout};

/// Long enough that a leader election (when the stopped member led) ends well within the
/// 1/4 of it the client may stay disconnected before the lease is reported lost.
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);
const MEMBERS: [(&str, u16); 3] = [
    ("zk-ensemble-1", 2182),
    ("zk-ensemble-2", 2183),
    ("zk-ensemble-3", 2184),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_moves_on_member_loss_and_majority_loss_is_reported() {
    let _restore = Restore;
    backends(&["up", "zk-ensemble"]);
    wait_all_serving().await;

    let harness = ZookeeperHarness::ensemble_from_env(SESSION_TIMEOUT);
    let url = harness.url();
    let holder = dlock_zookeeper::from_url(&url)
        .await
        .unwrap_or_else(|e| panic!("cannot use the ensemble at {url}: {e}\n  start it with: scripts/backends up zk-ensemble"));
    let other = harness.client().await.expect("a second client");
    let key = format!("ensemble-{}/k", uuid::Uuid::new_v4().simple());
    let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(30)));
    let lease = holder.acquire(&key, &opts).await.expect("acquire");
    let session = holder.backend().session_id();

    // 1. Stop the member carrying the session.
    let (name, _) = MEMBERS[member_of(session)
        .await
        .expect("the session is on a member")];
    backends(&["down", name]);
    let stopped = Instant::now();
    let moved = loop {
        if let Some(m) = member_of(session).await {
            break m;
        }
        assert!(
            stopped.elapsed() < SESSION_TIMEOUT,
            "the session did not move to another member within {SESSION_TIMEOUT:?}"
        );
        sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(MEMBERS[moved].0, name);
    assert!(
        !lease.is_lost(),
        "lease lost after one member stopped: {lease:?}"
    );
    lease
        .extend(SESSION_TIMEOUT)
        .await
        .expect("the node is still ours, seen through the new member");
    let stolen = other.try_acquire(&key, &opts).await.expect("try_acquire");
    assert!(
        stolen.is_none(),
        "another client took a key whose holder moved members"
    );
    backends(&["up", name]);
    wait_all_serving().await;
    assert!(
        !lease.is_lost(),
        "lease lost while the member came back: {lease:?}"
    );
    eprintln!(
        "session {session:#x} moved from {name} to {} in {:?}",
        MEMBERS[moved].0,
        stopped.elapsed()
    );

    // 2. Stop a majority: the member carrying the session and one more.
    let carrier = member_of(session)
        .await
        .expect("the session is on a member");
    let second = (carrier + 1) % MEMBERS.len();
    let stopped = Instant::now();
    backends(&["down", MEMBERS[carrier].0, MEMBERS[second].0]);
    let reason = timeout(SESSION_TIMEOUT + Duration::from_secs(20), lease.lost())
        .await
        .expect("lost() fires once the ensemble has no majority");
    let after = stopped.elapsed();
    assert!(
        matches!(reason, LostReason::SessionEnded(_)),
        "lost for {reason}"
    );
    // Before the server could expire the session and hand the key on.
    assert!(
        after < SESSION_TIMEOUT,
        "lost() fired {after:?} after the majority stopped, not within the session timeout"
    );
    eprintln!("lost() fired {after:?} after a majority was stopped: {reason}");

    // 3. Everything back; the key can be taken once the old session is gone.
    backends(&["up", "zk-ensemble"]);
    wait_all_serving().await;
    drop(lease);
    let fresh = harness.client().await.expect("a client after recovery");
    let again = fresh
        .acquire(
            &key,
            &opts.wait(Wait::For(SESSION_TIMEOUT * 2 + Duration::from_secs(10))),
        )
        .await
        .expect("the key is free again after recovery");
    again.release().await.expect("release");
    assert!(
        harness.residue(&key).await.expect("residue").is_empty(),
        "left on the ensemble"
    );
}

/// Brings every ensemble member back up, even when the test fails.
struct Restore;

impl Drop for Restore {
    fn drop(&mut self) {
        let out = Command::new(script()).args(["up", "zk-ensemble"]).output();
        if !matches!(&out, Ok(o) if o.status.success()) {
            eprintln!(
                "could not restore the ensemble ({out:?}): run scripts/backends up zk-ensemble"
            );
        }
    }
}

fn script() -> String {
    format!("{}/../../scripts/backends", env!("CARGO_MANIFEST_DIR"))
}

fn backends(args: &[&str]) {
    let out = Command::new(script())
        .args(args)
        .output()
        .expect("run scripts/backends");
    assert!(
        out.status.success(),
        "scripts/backends {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A four-letter-word command's answer, or empty when the member does not answer.
fn four_letters(port: u16, word: &str) -> String {
    let ask = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(3)))?;
        stream.write_all(word.as_bytes())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    };
    ask().unwrap_or_default()
}

/// The member whose `cons` lists the session.
async fn member_of(session: i64) -> Option<usize> {
    let needle = format!("sid={session:#x}");
    tokio::task::spawn_blocking(move || {
        MEMBERS
            .iter()
            .position(|(_, port)| four_letters(*port, "cons").contains(&needle))
    })
    .await
    .expect("cons")
}

/// Until every member answers `srvr` with a mode (leader or follower).
async fn wait_all_serving() {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let modes = tokio::task::spawn_blocking(|| {
            MEMBERS
                .iter()
                .map(|(_, port)| four_letters(*port, "srvr").contains("Mode: "))
                .collect::<Vec<_>>()
        })
        .await
        .expect("srvr");
        if modes.iter().all(|&m| m) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "ensemble not serving after 60 s: {modes:?}"
        );
        sleep(Duration::from_millis(200)).await;
    }
}
