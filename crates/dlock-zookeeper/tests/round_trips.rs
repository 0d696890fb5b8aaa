//! Round trips per operation, measured: every client talks to the server through a proxy
//! that delays each direction by half of `RTT`, so an operation's duration, less the time
//! the server spent answering, divided by `RTT` is the number of round trips it needs (the
//! table in the crate docs). Also the plain loopback latencies, printed for the README.

mod common;

use std::time::Duration;

use common::ZookeeperHarness;
use common::proxy::{Mark, RoundTrips, delaying_proxy};
use dlock_conformance::{Harness, Proxy};
use dlock_core::{Election, Leader, LockOptions, Wait};
use futures::StreamExt;
use tokio::time::{Instant, sleep};

/// For operations that only read: large against this machine's own latency, so the count
/// is exact (the proxy's server clock leaves the server's time out of it).
const RTT: Duration = Duration::from_millis(200);
/// For operations that write: each write waits for ZooKeeper's log, slow on a busy machine.
/// The server's time is left out of one reading of the count and a whole round trip of it
/// tolerated by the other (see `RoundTrips::check`); this long a round trip also leaves the
/// client half a second of its own delays on such a machine.
const WRITE_RTT: Duration = Duration::from_secs(1);

/// The test server's URL through `proxy`, with a session timeout long enough for a
/// handshake through it: a session's connection timeout is 2/5 of its session timeout
/// (the harness's 2 s allows 0.8 s, less than [`WRITE_RTT`]).
fn through(harness: &ZookeeperHarness, proxy: &Proxy) -> String {
    let short = format!("session_timeout={}ms", common::SESSION_TIMEOUT.as_millis());
    let url = harness.url_with_addrs(&[proxy.addr()]);
    assert!(url.contains(&short), "{url}");
    url.replace(&short, "session_timeout=10s")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_trips_per_operation() {
    let harness = ZookeeperHarness::from_env();
    let proxy = delaying_proxy(harness.server_addrs()[0], WRITE_RTT / 2).await;
    let url = through(&harness, &proxy);
    let a = harness.connect(&url).await.unwrap_or_else(|e| {
        panic!(
            "cannot use the zookeeper server: {e}\n  start it with: scripts/backends up zookeeper"
        )
    });
    let b = harness.connect(&url).await.expect("second client");
    let key = format!("rtt-{}/k", uuid::Uuid::new_v4().simple());
    let opts = LockOptions::new();
    let mut trips = RoundTrips::new(WRITE_RTT, &proxy);
    let raw = harness.raw().await.expect("raw client");
    trips.watch(raw, vec![harness.config().key_dir(&key)]);

    // The base path exists (made without the proxy), so only the key directory is missing
    // on first use: `NoNode`, then the directory is made with our node, one round trip more.
    let direct = harness.client().await.expect("direct client");
    let base_made = format!("rtt-{}/base", uuid::Uuid::new_v4().simple());
    let lease = direct.try_acquire(&base_made, &opts).await.expect("try");
    lease.expect("free").release().await.expect("release");
    let (lease, took) = trips.timed(a.try_acquire(&key, &opts)).await;
    let lease = lease.expect("try_acquire").expect("free");
    trips.check("try_acquire, new key (directory missing)", took, 2);
    let (released, took) = trips.timed(lease.release()).await;
    released.expect("release");
    trips.check("release", took, 1);
    // The directory stays after the release: one round trip from now on.
    let (lease, took) = trips.timed(a.try_acquire(&key, &opts)).await;
    let lease = lease.expect("try_acquire").expect("free");
    trips.check("try_acquire, key free", took, 1);
    let (held, took) = trips.timed(b.try_acquire(&key, &opts)).await;
    assert!(held.expect("try_acquire").is_none());
    trips.check("try_acquire, key held", took, 2);
    let (extended, took) = trips.timed(lease.extend(Duration::from_secs(30))).await;
    extended.expect("extend");
    // Answered from the session's state and the node's watch: nothing goes to the server.
    trips.check("extend", took, 0);

    // A waiter queues (create + list, then a watch on the holder), and is handed the key.
    let waiter = {
        let (b, key, clock) = (b.clone(), key.clone(), trips.clock());
        tokio::spawn(async move {
            let lease = b
                .acquire(&key, &opts.wait(Wait::For(Duration::from_secs(30))))
                .await
                .expect("the waiter acquires");
            (Mark::now(&clock), lease)
        })
    };
    sleep(WRITE_RTT * 5).await;
    let released_at = trips.mark();
    let (released, took) = trips.timed(lease.release()).await;
    released.expect("release");
    trips.check("release, a waiter queued", took, 1);
    let (acquired_at, lease) = waiter.await.expect("waiter");
    // The delete reaches the server (1/2), its notification the waiter (1/2), then the
    // waiter lists the directory (1).
    trips.check(
        "hand-off, from the release call",
        released_at.until(acquired_at),
        2,
    );
    let (released, took) = trips.timed(lease.release()).await;
    released.expect("release");
    trips.check("release, last holder", took, 1);
    let (lease, took) = trips.timed(b.try_acquire(&key, &opts)).await;
    let lease = lease.expect("try_acquire").expect("free");
    trips.check("try_acquire, key free again", took, 1);
    lease.release().await.expect("release");
    trips.print("round trips");
}

/// Permits: the `locks` mutex (create + list), the lease (create + list), the mutex's
/// delete; see the crate docs' Permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_round_trips() {
    let harness = ZookeeperHarness::from_env();
    let proxy = delaying_proxy(harness.server_addrs()[0], WRITE_RTT / 2).await;
    let url = through(&harness, &proxy);
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(
            harness
                .connect(&url)
                .await
                .expect("client through the proxy"),
        );
    }
    let (a, b, c) = (&clients[0], &clients[1], &clients[2]);
    let key = format!("rtt-{}/permits", uuid::Uuid::new_v4().simple());
    let two = LockOptions::new().permits(2);
    let mut trips = RoundTrips::new(WRITE_RTT, &proxy);
    let dir = harness.config().key_dir(&key);
    let dirs = vec![format!("{dir}/locks"), format!("{dir}/leases"), dir];
    trips.watch(harness.raw().await.expect("raw client"), dirs);
    // Make sure the base path exists, so only the key's directories are missing.
    let direct = harness.client().await.expect("direct client");
    let base_made = format!("rtt-{}/base", uuid::Uuid::new_v4().simple());
    let lease = direct.try_acquire(&base_made, &LockOptions::new()).await;
    lease
        .expect("try")
        .expect("free")
        .release()
        .await
        .expect("release");

    // `NoNode` for the mutex node, then for `locks`; the key directory; `locks`, the node
    // and the listing; `NoNode` for the lease; `leases`, the lease and the listing; the
    // mutex's delete.
    let (first, took) = trips.timed(a.try_acquire(&key, &two)).await;
    let first = first.expect("try_acquire").expect("free");
    trips.check("permit try_acquire, new key (directories missing)", took, 7);
    let (released, took) = trips.timed(first.release()).await;
    released.expect("release");
    trips.check("permit release", took, 1);
    let (first, took) = trips.timed(a.try_acquire(&key, &two)).await;
    let first = first.expect("try_acquire").expect("free");
    trips.check("permit try_acquire, a permit free", took, 3);
    let (second, took) = trips.timed(b.try_acquire(&key, &two)).await;
    let second = second.expect("try_acquire").expect("free");
    trips.check("permit try_acquire, the last permit", took, 3);
    let (held, took) = trips.timed(c.try_acquire(&key, &two)).await;
    assert!(held.expect("try_acquire").is_none());
    // The mutex, the lease and its count, then both deletes together.
    trips.check("permit try_acquire, every permit held", took, 3);

    let waiter = {
        let (c, key, clock) = (c.clone(), key.clone(), trips.clock());
        tokio::spawn(async move {
            let wait = two.wait(Wait::For(Duration::from_secs(30)));
            let lease = c.acquire(&key, &wait).await.expect("the waiter acquires");
            (Mark::now(&clock), lease)
        })
    };
    sleep(WRITE_RTT * 6).await;
    let (held, took) = trips.timed(b.try_acquire(&key, &two)).await;
    assert!(held.expect("try_acquire").is_none());
    // The waiter holds the mutex: our node is not first, and is deleted.
    trips.check("permit try_acquire, a waiter holds the mutex", took, 2);
    let released_at = trips.mark();
    let (released, took) = trips.timed(first.release()).await;
    released.expect("release");
    trips.check("permit release, a waiter counting", took, 1);
    let (acquired_at, third) = waiter.await.expect("waiter");
    // The delete (1/2), the children watch's notification (1/2), the count (1), the
    // mutex's delete (1).
    trips.check(
        "permit hand-off, from the release call",
        released_at.until(acquired_at),
        3,
    );
    for lease in [second, third] {
        lease.release().await.expect("release");
    }
    trips.print("permit round trips");
}

/// `inspect` and `list`: listings first (pipelined), then the nodes' data (pipelined); see
/// the crate docs' Inspecting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_round_trips() {
    let harness = ZookeeperHarness::from_env();
    let proxy = delaying_proxy(harness.server_addrs()[0], RTT / 2).await;
    let url = harness.url_with_addrs(&[proxy.addr()]);
    let d = harness
        .connect(&url)
        .await
        .expect("client through the proxy");
    let direct = harness.client().await.expect("direct client");
    let waiter = harness.client().await.expect("direct client");
    let prefix = format!("rtt-{}/", uuid::Uuid::new_v4().simple());
    let (lock, sem, unused) = (
        format!("{prefix}lock"),
        format!("{prefix}permits"),
        format!("{prefix}unused"),
    );
    let mut trips = RoundTrips::new(RTT, &proxy);
    let (status, took) = trips.timed(d.inspect(&unused)).await;
    assert!(!status.expect("inspect").is_held());
    trips.check("inspect, key unused", took, 1);
    let opts = LockOptions::new();
    let held = direct.try_acquire(&lock, &opts).await.expect("try");
    let held = held.expect("free");
    let queued = {
        let (waiter, lock) = (waiter.clone(), lock.clone());
        tokio::spawn(async move {
            let wait = opts.wait(Wait::For(Duration::from_secs(30)));
            waiter
                .acquire(&lock, &wait)
                .await
                .expect("the waiter acquires")
        })
    };
    wait_for_contenders(&harness, &lock, 2).await;
    let (status, took) = trips.timed(d.inspect(&lock)).await;
    let status = status.expect("inspect");
    assert_eq!(
        (status.holders.len(), status.waiters.map(|w| w.len())),
        (1, Some(1))
    );
    trips.check("inspect, a holder and a waiter", took, 2);
    let (listed, took) = trips.timed(d.list(&prefix)).await;
    assert_eq!(listed.expect("list"), [lock.as_str()]);
    trips.check("list, one lock held", took, 2);
    let permit = direct.try_acquire(&sem, &opts.permits(2)).await;
    let permit = permit.expect("try").expect("free");
    let (status, took) = trips.timed(d.inspect(&sem)).await;
    assert_eq!(status.expect("inspect").holders.len(), 1);
    trips.check("inspect, a permit held", took, 2);
    let (listed, took) = trips.timed(d.list(&prefix)).await;
    assert_eq!(listed.expect("list"), [lock.clone(), sem.clone()]);
    // The semaphore's directory has no lock node: its `leases` are listed too.
    trips.check("list, a lock and a semaphore held", took, 3);
    held.release().await.expect("release");
    queued
        .await
        .expect("waiter")
        .release()
        .await
        .expect("release");
    permit.release().await.expect("release");
    trips.print("inspect round trips");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loopback_latency() {
    const ROUNDS: usize = 100;
    let harness = ZookeeperHarness::from_env();
    let a = harness.client().await.unwrap_or_else(|e| {
        panic!(
            "cannot use the zookeeper server: {e}\n  start it with: scripts/backends up zookeeper"
        )
    });
    let b = harness.client().await.expect("second client");
    let key = format!("latency-{}/k", uuid::Uuid::new_v4().simple());
    let opts = LockOptions::new();
    let mut cycle = Vec::new();
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let lease = a
            .try_acquire(&key, &opts)
            .await
            .expect("try")
            .expect("free");
        lease.release().await.expect("release");
        cycle.push(started.elapsed());
    }
    let mut handoff = Vec::new();
    let mut lease = a
        .try_acquire(&key, &opts)
        .await
        .expect("try")
        .expect("free");
    for i in 0..ROUNDS / 2 {
        let next = if i % 2 == 0 { b.clone() } else { a.clone() };
        let key2 = key.clone();
        let waiter = tokio::spawn(async move {
            let lease = next
                .acquire(&key2, &opts.wait(Wait::For(Duration::from_secs(30))))
                .await
                .expect("waiter");
            (Instant::now(), lease)
        });
        // Until the waiter is queued on the server (its node exists).
        wait_for_contenders(&harness, &key, 2).await;
        let released = Instant::now();
        lease.release().await.expect("release");
        let (acquired, next_lease) = waiter.await.expect("waiter task");
        handoff.push(acquired - released);
        lease = next_lease;
    }
    lease.release().await.expect("release");
    let mut permit_cycle = Vec::new();
    let permits = LockOptions::new().permits(2);
    for _ in 0..ROUNDS {
        let started = Instant::now();
        let lease = a.try_acquire(&key, &permits).await.expect("try");
        lease.expect("free").release().await.expect("release");
        permit_cycle.push(started.elapsed());
    }
    let (cycle, handoff) = (percentiles(cycle), percentiles(handoff));
    let permit_cycle = percentiles(permit_cycle);
    eprintln!("loopback: try_acquire+release p50/p99 {cycle:?}; hand-off p50/p99 {handoff:?}");
    eprintln!("loopback: permit try_acquire+release p50/p99 {permit_cycle:?}");
    // Generous: these are single-digit milliseconds on loopback; a polling sleep would not be.
    assert!(cycle.0 < Duration::from_millis(100), "{cycle:?}");
    assert!(handoff.0 < Duration::from_millis(100), "{handoff:?}");
}

/// Elections: a campaign is an acquire (a `latch-` node), a proclaim one `setData`,
/// `leader()` a listing and a `getData`, an observer's subscription one `addWatch`; an
/// observer sees a proclaim half a round trip after it commits, then reads the leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_round_trips() {
    let harness = ZookeeperHarness::from_env();
    let proxy = delaying_proxy(harness.server_addrs()[0], WRITE_RTT / 2).await;
    let url = through(&harness, &proxy);
    let a = harness
        .connect(&url)
        .await
        .expect("client through the proxy");
    let w = harness
        .connect(&url)
        .await
        .expect("client through the proxy");
    let direct = harness.client().await.expect("direct client");
    let key = format!("rtt-{}/leader", uuid::Uuid::new_v4().simple());
    // Make the key's directory (and the base path) without the proxy.
    let made = direct.try_acquire(&key, &LockOptions::new()).await;
    made.expect("try")
        .expect("free")
        .release()
        .await
        .expect("release");
    let mut trips = RoundTrips::new(WRITE_RTT, &proxy);
    let raw = harness.raw().await.expect("raw client");
    trips.watch(raw, vec![harness.config().key_dir(&key)]);
    let ours = Election::new(a, key.clone());
    let observed = Election::new(w, key.clone());
    let (leader, took) = trips.timed(observed.leader()).await;
    assert_eq!(leader.expect("leader()"), None);
    trips.check("leader(), nobody leads", took, 1);
    let mut changes = observed.observe();
    let (first, took) = trips.timed(changes.next()).await;
    assert_eq!(first.expect("an item").expect("observe"), None);
    trips.check("observe: subscribe, then leader()", took, 2);
    let (leading, took) = trips.timed(ours.campaign("v1")).await;
    let mut leading = leading.expect("campaign");
    trips.check("campaign, nobody leads", took, 1);
    let (leader, took) = trips.timed(observed.leader()).await;
    assert_eq!(
        leader.expect("leader()"),
        Some(Leader::new("v1", leading.term()))
    );
    trips.check("leader(), a leader", took, 2);
    // Drain the campaign's notification, then time a proclaim end to end.
    let seen = changes.next().await.expect("an item").expect("observe");
    assert_eq!(seen, Some(Leader::new("v1", leading.term())));
    let started = trips.mark();
    let (proclaimed, took) = trips.timed(leading.proclaim("v2")).await;
    proclaimed.expect("proclaim");
    trips.check("proclaim", took, 1);
    let seen = changes.next().await.expect("an item").expect("observe");
    assert_eq!(seen, Some(Leader::new("v2", leading.term())));
    // The write reaches the server (1/2), its notification the observer (1/2), then the
    // observer reads the leader (2).
    trips.check(
        "proclaim, until an observer shows it",
        started.until(trips.mark()),
        3,
    );
    let (resigned, took) = trips.timed(leading.resign()).await;
    resigned.expect("resign");
    trips.check("resign", took, 1);
    drop(changes);
    trips.print("election round trips");
}

fn percentiles(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize];
    (at(0.5), at(0.99))
}

async fn wait_for_contenders(harness: &ZookeeperHarness, key: &str, n: usize) {
    let zk = harness.raw().await.expect("raw client");
    let dir = harness.config().key_dir(key);
    let deadline = Instant::now() + Duration::from_secs(10);
    while zk.list_children(&dir).await.map(|c| c.len()).unwrap_or(0) < n {
        assert!(Instant::now() < deadline, "the waiter never queued");
        sleep(Duration::from_millis(2)).await;
    }
}
