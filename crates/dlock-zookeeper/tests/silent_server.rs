//! An acquire that must open a new session while the server accepts connections but never
//! answers returns by its deadline: the session mutex, held while the session opens, never
//! keeps an acquire past its deadline (the connect timeout here is far longer).

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::ZookeeperHarness;
use dlock_core::{DistributedLock, ErrorKind, LockOptions, Wait};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, watch};

/// A proxy that forwards until told to go silent; silent, it keeps every connection open
/// and answers nothing, except the one connection [`Switch::forward_next`] lets through.
struct Switch {
    /// Silent, and whom to tell when the next connection let through has ended.
    state: Mutex<(bool, Option<oneshot::Sender<()>>)>,
    /// Bumped when going silent: connections forwarded before then go mute.
    epoch: watch::Sender<u64>,
}

impl Switch {
    fn go_silent(&self) {
        self.state.lock().expect("state").0 = true;
        self.epoch.send_modify(|e| *e += 1);
    }

    /// Forward the next connection; the receiver fires when the server has closed it.
    fn forward_next(&self) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        self.state.lock().expect("state").1 = Some(tx);
        rx
    }
}

async fn switch_proxy(upstream: SocketAddr) -> (SocketAddr, Arc<Switch>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let switch = Arc::new(Switch {
        state: Mutex::new((false, None)),
        epoch: watch::Sender::new(0),
    });
    let control = switch.clone();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (silent, done) = {
                let mut state = switch.state.lock().expect("state");
                match state.1.take() {
                    Some(done) => (false, Some(done)),
                    None => (state.0, None),
                }
            };
            let mut epoch = switch.epoch.subscribe();
            tokio::spawn(async move {
                let mut client = client;
                if !silent {
                    let Ok(mut server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {
                            if let Some(done) = done {
                                let _ = done.send(());
                            }
                            return;
                        }
                        _ = epoch.changed() => {}
                    }
                }
                // Silent: read and drop whatever comes, until the client hangs up.
                let mut buf = [0u8; 4096];
                while let Ok(1..) = client.read(&mut buf).await {}
            });
        }
    });
    (addr, control)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_needing_a_new_session_end_by_their_deadline_on_a_silent_server() {
    let harness = ZookeeperHarness::from_env();
    let raw = harness.raw().await.expect("a raw client");
    let upstream = harness.config().hosts[0]
        .parse::<SocketAddr>()
        .expect("the test server's address");
    let (addr, switch) = switch_proxy(upstream).await;
    let lock = dlock_zookeeper::from_url(&format!(
        "zk://{addr}?session_timeout=8s&connect_timeout=10s"
    ))
    .await
    .expect("connect through the proxy");
    let prefix = format!("silent-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let held = format!("{prefix}/held");
    let _lease = lock
        .try_acquire(&held, &LockOptions::new())
        .await
        .expect("try_acquire")
        .expect("free");

    // The server expires the silent session: its lock node goes.
    switch.go_silent();
    let dir = lock.backend().config().key_dir(&held);
    let started = Instant::now();
    while matches!(raw.list_children(&dir).await, Ok(children) if !children.is_empty()) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the session did not expire"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One reconnection gets through and hears that the session expired; every later
    // connection (the new session's) meets silence.
    let told = switch.forward_next();
    tokio::time::timeout(Duration::from_secs(15), told)
        .await
        .expect("the client reconnects and hears of the expiry")
        .expect("the proxy");

    let wait = Duration::from_millis(300);
    let opts = LockOptions::new().wait(Wait::For(wait));
    let started = Instant::now();
    // One acquire opens the new session (holding the session mutex), the other waits for
    // it; both end by their deadline, long before the 10 s connect timeout and before the
    // client library gives up on a silent member by itself (after 2/5 of the session
    // timeout, 3.2 s: a 1 s session would hide a missing deadline behind that).
    let (key_a, key_b) = (format!("{prefix}/a"), format!("{prefix}/b"));
    let (a, b) = tokio::join!(lock.acquire(&key_a, &opts), lock.acquire(&key_b, &opts));
    let took = started.elapsed();
    for answer in [a, b] {
        let err = answer.expect_err("no session can be opened");
        assert!(
            matches!(err.kind(), ErrorKind::Timeout | ErrorKind::Unavailable),
            "{err}"
        );
    }
    assert!(took < wait + Duration::from_secs(2), "took {took:?}");
}
