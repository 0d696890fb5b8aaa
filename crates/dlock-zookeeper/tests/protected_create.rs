//! Protected create: the connection drops while our lock node's create is in flight.
//!
//! A proxy in front of the standalone server cuts the client's connection at the first
//! lock-node create, either right after forwarding it (the server creates the node, the
//! answer is lost) or instead of forwarding it (nothing is created). Either way the acquire
//! must end with exactly one node of ours in the key's directory, holding the lock, with
//! the token being that node's czxid, and no lock node left after release. And an acquire that
//! times out while its create's answer is lost still deletes the node the create made.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::ZookeeperHarness;
use dlock_conformance::Harness;
use dlock_core::{LockOptions, Wait};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// ZooKeeper's `create2` opcode (the create of a node that returns its stat).
const OP_CREATE2: i32 = 15;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    /// Forward the create, then drop the connection before its answer reaches the client.
    AfterCreate,
    /// Drop the connection instead of forwarding the create.
    BeforeCreate,
    /// Forward the create, then forward nothing more either way (a black hole) until the
    /// client gives the connection up.
    AfterCreateSilent,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_was_lost_is_found_and_kept() {
    exactly_one_node_after(Cut::AfterCreate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_that_never_arrived_is_made_again() {
    exactly_one_node_after(Cut::BeforeCreate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquire_deletes_the_node_its_lost_create_made() {
    let harness = ZookeeperHarness::from_env();
    let (proxy, fired) = snipping_proxy(harness.server_addrs()[0], Cut::AfterCreateSilent).await;
    let lock = harness
        .connect(&harness.url_with_addrs(&[proxy]))
        .await
        .expect("connect through the proxy");
    let (key, zk, dir) = fresh_key(&harness).await;
    let short = LockOptions::new().wait(Wait::For(Duration::from_millis(300)));
    let err = lock
        .acquire(&key, &short)
        .await
        .expect_err("no answer in time");
    assert_eq!(err.kind(), dlock_core::ErrorKind::Timeout, "{err}");
    assert!(
        fired.load(Ordering::SeqCst),
        "the proxy never cut the create"
    );
    // The node the create made is deleted once the client is connected again.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        match zk.list_children(&dir).await {
            Ok(children) if children.is_empty() => break,
            Ok(children) => assert!(
                tokio::time::Instant::now() < deadline,
                "left behind by the timed-out acquire: {children:?}"
            ),
            Err(e) => panic!("list {dir}: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And the key is free.
    let other = harness.client().await.expect("second client");
    let lease = other.try_acquire(&key, &short).await.expect("try");
    lease
        .expect("the key is free")
        .release()
        .await
        .expect("release");
}

/// A fresh key, a raw client, and the key's directory, made beforehand as a recently used
/// key's is, so the first lock-node create the proxy sees is the one that makes the node
/// (on a missing directory it would fail with `NoNode` and make nothing).
async fn fresh_key(harness: &ZookeeperHarness) -> (String, zookeeper_client::Client, String) {
    use zookeeper_client::{Acls, CreateMode};
    let key = format!("protected-{}/k", uuid::Uuid::new_v4().simple());
    let zk = harness.raw().await.expect("raw client");
    let config = harness.config();
    let dir = config.key_dir(&key);
    let persistent = CreateMode::Persistent.with_acls(Acls::anyone_all());
    match zk.mkdir(&config.base, &persistent).await {
        Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
        Err(e) => panic!("create {}: {e}", config.base),
    }
    let container = CreateMode::Container.with_acls(Acls::anyone_all());
    zk.create(&dir, &[], &container)
        .await
        .unwrap_or_else(|e| panic!("create {dir}: {e}"));
    (key, zk, dir)
}

async fn exactly_one_node_after(cut: Cut) {
    let harness = ZookeeperHarness::from_env();
    let upstream = harness.server_addrs()[0];
    let (proxy, fired) = snipping_proxy(upstream, cut).await;
    let lock = harness
        .connect(&harness.url_with_addrs(&[proxy]))
        .await
        .unwrap_or_else(|e| {
            panic!("cannot use the zookeeper server at {upstream}: {e}\n  start it with: scripts/backends up zookeeper")
        });
    let (key, zk, dir) = fresh_key(&harness).await;
    let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(20)));
    let lease = lock
        .acquire(&key, &opts)
        .await
        .expect("the acquire survives the lost connection");
    assert!(
        fired.load(Ordering::SeqCst),
        "the proxy never cut the create"
    );

    let children = zk
        .list_children(&dir)
        .await
        .expect("list the key directory");
    assert_eq!(children.len(), 1, "{cut:?}: nodes left: {children:?}");
    let (_, stat) = zk
        .get_data(&format!("{dir}/{}", children[0]))
        .await
        .expect("stat our node");
    assert_eq!(lease.fencing_token(), stat.czxid as u64, "{cut:?}");
    assert!(children[0].starts_with("_c_") && children[0].contains("-lock-"));

    // Still exclusive, and nothing left behind.
    let other = harness.client().await.expect("second client");
    assert!(other.try_acquire(&key, &opts).await.expect("try").is_none());
    lease.release().await.expect("release");
    assert_eq!(
        zk.list_children(&dir).await,
        Ok(Vec::new()),
        "a lock node is left after release"
    );
}

/// A proxy to `upstream` that cuts the first connection carrying a lock-node create, as
/// `cut` says. Returns its address and whether it has cut.
async fn snipping_proxy(upstream: SocketAddr, cut: Cut) -> (SocketAddr, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let fired = Arc::new(AtomicBool::new(false));
    let armed = fired.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let armed = armed.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (client_rx, mut client_tx) = client.into_split();
                let (mut server_rx, server_tx) = server.into_split();
                let mute = Arc::new(AtomicBool::new(false));
                let down = {
                    let mute = mute.clone();
                    async move {
                        let mut buf = [0u8; 16 * 1024];
                        while let Ok(n @ 1..) = server_rx.read(&mut buf).await {
                            if !mute.load(Ordering::SeqCst)
                                && client_tx.write_all(&buf[..n]).await.is_err()
                            {
                                return;
                            }
                        }
                    }
                };
                let up = up_until_create(client_rx, server_tx, cut, armed, mute);
                // Whichever side ends first closes both connections.
                tokio::select! {
                    () = down => {}
                    () = up => {}
                }
            });
        }
    });
    (addr, fired)
}

/// Forward client-to-server frames; at the first lock-node create (while `armed`), mute the
/// answers and end the connection as `cut` says.
async fn up_until_create(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    cut: Cut,
    armed: Arc<AtomicBool>,
    mute: Arc<AtomicBool>,
) {
    let mut first = true;
    loop {
        let mut len = [0u8; 4];
        if from.read_exact(&mut len).await.is_err() {
            return;
        }
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        if from.read_exact(&mut body).await.is_err() {
            return;
        }
        // Request frames: xid, opcode, then the body (the first frame is the connect request).
        let lock_create = !first
            && body.len() >= 8
            && i32::from_be_bytes([body[4], body[5], body[6], body[7]]) == OP_CREATE2
            && body.windows(6).any(|w| w == b"-lock-");
        first = false;
        if lock_create && !armed.swap(true, Ordering::SeqCst) {
            mute.store(true, Ordering::SeqCst);
            match cut {
                Cut::BeforeCreate => {}
                Cut::AfterCreate => {
                    let _ = to.write_all(&len).await;
                    let _ = to.write_all(&body).await;
                    // Let the server apply it; its answer is dropped.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Cut::AfterCreateSilent => {
                    let _ = to.write_all(&len).await;
                    let _ = to.write_all(&body).await;
                    // Swallow everything until the client hangs up.
                    let mut sink = [0u8; 4096];
                    while let Ok(1..) = from.read(&mut sink).await {}
                }
            }
            return;
        }
        if to.write_all(&len).await.is_err() || to.write_all(&body).await.is_err() {
            return;
        }
    }
}
