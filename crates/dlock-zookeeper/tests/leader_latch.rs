//! Elections beside Apache Curator's `LeaderLatch` on the same path: a dlock candidate
//! waits while a Curator participant leads and `leader()` names that participant, and a
//! Curator participant waits while a dlock candidate leads. Also what a campaign node is on
//! the wire (`_c_{uuid}-latch-{seq}`, the value as data, the czxid as term) and that a
//! plain lock on the key waits for a leader. There is no JVM here: [`CuratorLatch`] makes
//! the node Curator makes and follows Curator's rule on a raw session.

mod common;

use std::time::Duration;

use common::ZookeeperHarness;
use dlock_core::{DistributedLock, Election, Leader, LockOptions, Wait};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::time::{sleep, timeout};
use zookeeper_client::{self as zk, CreateMode};

/// How long a hand-over may take here.
const PROMPTLY: Duration = Duration::from_secs(5);

fn key(name: &str) -> String {
    format!("latch-{}/{name}", uuid::Uuid::new_v4().simple())
}

/// Curator's `LeaderLatch(client, path, id)`, step by step as its `reset` and
/// `checkLeadership` run: an ephemeral-sequential protected node
/// `{path}/_c_{uuid}-latch-{seq}` whose data is the participant id (parents made as
/// containers); the children sorted by the text after their last `latch-` (the whole name
/// when there is none); leader at index 0, otherwise a data watch on the child just before.
/// `close` deletes the node.
struct CuratorLatch {
    raw: zk::Client,
    path: String,
    ours: String,
    czxid: i64,
}

impl CuratorLatch {
    async fn start(raw: zk::Client, path: &str, id: &str) -> Self {
        let node = format!("{path}/_c_{}-latch-", uuid::Uuid::new_v4());
        let ephemeral = CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let container = CreateMode::Container.with_acls(zk::Acls::anyone_all());
        loop {
            match raw.create(&node, id.as_bytes(), &ephemeral).await {
                Ok((stat, sequence)) => {
                    return Self {
                        raw,
                        path: path.to_owned(),
                        ours: format!("{node}{sequence}"),
                        czxid: stat.czxid,
                    };
                }
                Err(zk::Error::NoNode) => {
                    let parent = path.rsplit_once('/').expect("a parent").0;
                    for dir in [parent, path] {
                        match raw.create(dir, &[], &container).await {
                            Ok(_) | Err(zk::Error::NodeExists) => {}
                            Err(e) => panic!("create {dir}: {e}"),
                        }
                    }
                }
                Err(e) => panic!("create {node}: {e}"),
            }
        }
    }

    /// The children in Curator's order (`LockInternals.getSortedChildren("latch-", ..)`).
    async fn sorted(&self) -> Vec<String> {
        let mut children = self.raw.list_children(&self.path).await.expect("list");
        let fix = |name: &str| match name.rfind("latch-") {
            Some(at) => name[at + "latch-".len()..].to_owned(),
            None => name.to_owned(),
        };
        children.sort_by_key(|name| fix(name));
        children
    }

    /// Our index in Curator's order: 0 means Curator's latch leads.
    async fn index(&self) -> usize {
        self.sorted()
            .await
            .iter()
            .position(|name| self.ours.ends_with(name.as_str()))
            .expect("our latch node is listed")
    }

    /// Wait until Curator's latch leads (`await()`), as its watches wake it.
    async fn await_leadership(&self) {
        loop {
            let order = self.sorted().await;
            let at = order
                .iter()
                .position(|name| self.ours.ends_with(name.as_str()))
                .expect("our latch node is listed");
            if at == 0 {
                return;
            }
            let before = format!("{}/{}", self.path, order[at - 1]);
            match self.raw.get_and_watch_data(&before).await {
                Ok((_, _, watcher)) => {
                    watcher.changed().await;
                }
                Err(zk::Error::NoNode) => {}
                Err(e) => panic!("watch {before}: {e}"),
            }
        }
    }

    async fn close(&self) {
        self.raw.delete(&self.ours, None).await.expect("close");
    }
}

fn election(lock: std::sync::Arc<dyn DistributedLock>, key: &str) -> Election {
    Election::new(lock, key).options(LockOptions::new().wait(Wait::For(Duration::from_secs(60))))
}

/// The observer's next change, within [`PROMPTLY`].
async fn next(
    changes: &mut BoxStream<'static, dlock_core::Result<Option<Leader>>>,
) -> Option<Leader> {
    let item = timeout(PROMPTLY, changes.next())
        .await
        .expect("a change within the bound");
    item.expect("the stream goes on").expect("observe")
}

/// The lock nodes left in the key's directory (none once everyone left).
async fn left(raw: &zk::Client, dir: &str) -> Vec<String> {
    match raw.list_children(dir).await {
        Ok(children) => children,
        Err(zk::Error::NoNode) => Vec::new(),
        Err(e) => panic!("list {dir}: {e}"),
    }
}

/// A Curator participant leads: `leader()` names it (its id, its node's czxid), a plain
/// lock and a dlock candidate wait, and Curator's order puts the candidate's node behind
/// its own; once it closes, the dlock candidate leads in a later term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dlock_candidate_waits_for_a_curator_leader() {
    let harness = ZookeeperHarness::from_env();
    let (a, b) = (harness.must_client().await, harness.must_client().await);
    let key = key("curator-first");
    let dir = harness.config().key_dir(&key);
    let curator = CuratorLatch::start(harness.raw().await.expect("raw"), &dir, "curator-7").await;
    assert_eq!(curator.index().await, 0, "Curator's participant leads");
    let term = u64::try_from(curator.czxid).expect("a czxid");
    let ours = election(a, &key);
    assert_eq!(
        ours.leader().await.expect("leader()"),
        Some(Leader::new("curator-7", term))
    );
    let plain = b.try_acquire(&key, &LockOptions::new()).await.expect("try");
    assert!(plain.is_none(), "a plain lock waits for Curator's leader");

    let waiting = tokio::spawn({
        let ours = ours.clone();
        async move { ours.campaign("dlock-1").await }
    });
    sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "dlock led beside Curator's leader");
    let order = curator.sorted().await;
    assert_eq!(order.len(), 2, "{order:?}");
    assert!(
        order[1].contains("-latch-"),
        "Curator orders our candidate's latch node behind its own: {order:?}"
    );
    let ours_node = format!("{dir}/{}", order[1]);
    let (data, _) = curator.raw.get_data(&ours_node).await.expect("our node");
    assert_eq!(data, b"dlock-1", "a candidate's node carries its value");

    curator.close().await;
    let leading = timeout(PROMPTLY, waiting)
        .await
        .expect("the dlock candidate leads once Curator's participant closed")
        .expect("task")
        .expect("campaign");
    assert!(leading.term() > term, "{} after {term}", leading.term());
    assert_eq!(
        ours.leader().await.expect("leader()"),
        Some(Leader::new("dlock-1", leading.term()))
    );
    leading.resign().await.expect("resign");
    assert_eq!(ours.leader().await.expect("leader()"), None);
    assert_eq!(left(&curator.raw, &dir).await, Vec::<String>::new());
}

/// A dlock candidate leads: a Curator participant that starts after it sees itself second
/// and waits; an observer sees the dlock leader, its proclaimed value, then Curator's
/// participant once the dlock leader resigned, and nobody once it closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_curator_participant_waits_for_a_dlock_leader() {
    let harness = ZookeeperHarness::from_env();
    let (a, watcher) = (harness.must_client().await, harness.must_client().await);
    let key = key("dlock-first");
    let dir = harness.config().key_dir(&key);
    let ours = election(a, &key);
    let observed = election(watcher, &key);
    let mut changes = observed.observe();
    assert_eq!(next(&mut changes).await, None);

    let mut leading = ours.campaign("dlock-leader").await.expect("campaign");
    let term = leading.term();
    assert_eq!(
        next(&mut changes).await,
        Some(Leader::new("dlock-leader", term))
    );
    let curator = std::sync::Arc::new(
        CuratorLatch::start(harness.raw().await.expect("raw"), &dir, "curator-9").await,
    );
    assert_eq!(
        curator.index().await,
        1,
        "Curator sees dlock's leader first"
    );
    let waiting = tokio::spawn({
        let curator = curator.clone();
        async move { curator.await_leadership().await }
    });
    leading
        .proclaim("dlock-leader, draining")
        .await
        .expect("proclaim");
    assert_eq!(
        next(&mut changes).await,
        Some(Leader::new("dlock-leader, draining", term))
    );
    sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "Curator led beside dlock's leader");

    leading.resign().await.expect("resign");
    timeout(PROMPTLY, waiting)
        .await
        .expect("Curator's participant leads once dlock's leader resigned")
        .expect("task");
    let curator_term = u64::try_from(curator.czxid).expect("a czxid");
    assert!(curator_term > term);
    assert_eq!(
        next(&mut changes).await,
        Some(Leader::new("curator-9", curator_term))
    );
    curator.close().await;
    assert_eq!(next(&mut changes).await, None);
    drop(changes);
    assert_eq!(left(&curator.raw, &dir).await, Vec::<String>::new());
}
