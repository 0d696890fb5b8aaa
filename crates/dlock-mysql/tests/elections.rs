//! Elections on MySQL / MariaDB beyond the shared suite, in both modes: values that SQL
//! would mangle arrive intact, `inspect` shows the value as the holder's `who`, a
//! proclaim of the same value goes through, and a leader whose connection was killed
//! leaves a value nobody trusts, replaced by the next leader and gone once it resigns.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::MysqlHarness;
use dlock_conformance::Harness as _;
use dlock_core::{DistributedLock, Election, ErrorKind, Leader, LockOptions, Wait};
use tokio::time::{Instant, sleep};

fn key(name: &str) -> String {
    format!("mysql-{}", dlock_conformance::testkit::unique_key(name))
}

fn election(client: Arc<dyn DistributedLock>, key: &str) -> Election {
    Election::new(client, key).options(
        LockOptions::new()
            .ttl(Duration::from_secs(2))
            .wait(Wait::For(Duration::from_secs(10))),
    )
}

/// Wait until nothing of `prefix` is left on the server.
async fn assert_clean(h: &MysqlHarness, prefix: &str) {
    let deadline = Instant::now() + Duration::from_secs(8);
    loop {
        let left = h.residue(prefix).await.expect("residue");
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "left on the server: {left:?}");
        sleep(Duration::from_millis(50)).await;
    }
}

async fn values_arrive_intact(h: MysqlHarness) {
    let key = key("values");
    let (a, b) = (h.must_client().await, h.must_client().await);
    let mine = election(a, &key);
    let theirs = election(b.clone(), &key);
    let odd = [
        "it's \"quoted\" \\ back`tick`; DROP TABLE x; --",
        "X'00' caf\u{e9} \u{1F5F3} \u{65E5}\u{672C}",
        "%41%%",
    ];
    let mut leading = mine.campaign(odd[0]).await.expect("campaign");
    let term = leading.term();
    for value in odd {
        leading.proclaim(value).await.expect("proclaim");
        // Twice: an update that changes nothing still finds the leader's row.
        leading.proclaim(value).await.expect("proclaim again");
        assert_eq!(
            theirs.leader().await.expect("leader()"),
            Some(Leader::new(value, term))
        );
        let status = b.inspect(&key).await.expect("inspect");
        assert_eq!(status.holders.len(), 1, "{status:?}");
        assert_eq!(status.holders[0].who.as_deref(), Some(value));
        assert_eq!(status.holders[0].fencing_token, Some(term));
    }
    let long = "v".repeat(dlock_core::election::MAX_VALUE_LEN);
    leading.proclaim(&long).await.expect("the longest value");
    assert_eq!(
        theirs.leader().await.expect("leader()"),
        Some(Leader::new(long, term))
    );
    leading.resign().await.expect("resign");
    assert_eq!(theirs.leader().await.expect("leader()"), None);
    assert_clean(&h, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_arrive_intact_in_row_mode() {
    values_arrive_intact(MysqlHarness::from_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_arrive_intact_in_named_mode() {
    values_arrive_intact(MysqlHarness::named()).await;
}

/// A leader whose connection the server killed: `leader()` no longer shows it, its
/// proclaim is refused, the next candidate leads with its own value, and nothing is left
/// once that one resigns.
async fn a_killed_leader_is_forgotten(h: MysqlHarness) {
    let key = key("killed");
    let (a, b) = (h.must_client().await, h.must_client().await);
    let mut doomed = election(a, &key)
        .campaign("doomed")
        .await
        .expect("campaign");
    let next = election(b, &key);
    h.break_lease(&key)
        .await
        .expect("kill the leader's session");
    assert_eq!(next.leader().await.expect("leader()"), None);
    let err = loop {
        // Row mode learns of the kill at once; named mode once its carrier notices.
        match doomed.proclaim("still here").await {
            Err(e) => break e,
            Ok(()) => sleep(Duration::from_millis(50)).await,
        }
    };
    assert!(
        matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost),
        "{err}"
    );
    let leading = next.campaign("next").await.expect("campaign");
    assert_eq!(
        next.leader().await.expect("leader()"),
        Some(Leader::new("next", leading.term()))
    );
    assert!(leading.term() > doomed.term());
    drop(doomed);
    leading.resign().await.expect("resign");
    assert_clean(&h, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_forgotten_in_row_mode() {
    a_killed_leader_is_forgotten(MysqlHarness::from_env()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_is_forgotten_in_named_mode() {
    a_killed_leader_is_forgotten(MysqlHarness::named()).await;
}
