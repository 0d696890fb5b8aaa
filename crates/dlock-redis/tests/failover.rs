//! A failover under connected clients, on Sentinel and on a Redis Cluster: the test runs
//! `scripts/backends failover redis-sentinel` (or `redis-cluster`), which promotes a
//! replica, while one client holds a key and another waits for it.
//!
//! Afterwards a new acquire and release must work within a bound, and the lease held across
//! the failover must either keep working or report itself lost: while it claims to hold
//! (and has not fired `lost()`), a second client's `try_acquire` of its key is refused.

mod common;

use std::time::Duration;

use common::backends;
use common::topology::{Kind, TopologyHarness};
use dlock_core::{DistributedLock, Lease, LockOptions, Wait};
use dlock_redis::server::{Names, Node};
use dlock_redis::{RedisConfig, RedisLock, Topology};
use tokio::time::Instant;

/// How long after the failover command returned a new acquire + release must succeed.
const RECOVERY: Duration = Duration::from_secs(20);

/// How long the waiter queued across the failover waits (longer than the test holds the
/// key, so it is normally granted after the release).
const WAITER_WAIT: Duration = Duration::from_secs(30);

/// Fail `group` over with `scripts/backends failover GROUP`; the new master's address.
async fn failover(group: &str) -> String {
    backends::run(&["failover", group]).await
}

/// The first of `client`'s acquires of `key` that takes it, tried again until [`RECOVERY`]
/// has passed; a failure names `who`.
async fn acquire_after_failover(
    client: &RedisLock,
    key: &str,
    opts: &LockOptions,
    who: &str,
) -> Lease {
    let started = Instant::now();
    loop {
        match client.try_acquire(key, opts).await {
            Ok(Some(lease)) => return lease,
            outcome => {
                assert!(
                    started.elapsed() < RECOVERY,
                    "{who}: no acquire within {RECOVERY:?} after the failover: last {outcome:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// The Sentinel tests of this file fail the one setup over: one at a time.
static SENTINEL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn survives_a_failover(harness: TopologyHarness, group: &'static str) {
    dlock_conformance::init_tracing();
    let _one_at_a_time = if group == "redis-sentinel" {
        Some(SENTINEL.lock().await)
    } else {
        None
    };
    let holder = harness.lock().await;
    let other = harness.lock().await;
    let key = common::unique_key(&format!("failover/{group}"));
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    let lease = holder
        .try_acquire(&key, &opts)
        .await
        .expect("acquire before the failover")
        .expect("the key is free");
    let token = lease.fencing_token();
    // Replication is asynchronous: a failover may lose a key granted just before it (the
    // declared `member_down: Fenced`). This test is about the client following the
    // failover, so it lets the grant reach a replica first: a write after it, in the same
    // slot, and `WAIT 1` for a replica to acknowledge that write (and so the grant).
    {
        let mut admin = harness.admin().await.expect("admin connection");
        let probe = format!("{{{}{key}}}:probe", harness.config().prefix);
        let _: () = redis::AsyncCommands::set_ex(&mut admin, &probe, "1", 30)
            .await
            .expect("SET probe");
        // A replica may still be (re)attaching after an earlier failover: ask again,
        // each `WAIT` shorter than the response timeout.
        let asked = Instant::now();
        loop {
            let acked: i64 = redis::cmd("WAIT")
                .arg(1)
                .arg(500)
                .query_async(&mut admin)
                .await
                .expect("WAIT");
            if acked >= 1 {
                break;
            }
            assert!(
                asked.elapsed() < RECOVERY,
                "{group}: no replica acknowledged the grant within {RECOVERY:?}"
            );
        }
    }
    // A waiter across the failover (it must end: granted, or timed out / unavailable).
    let waiter = {
        let other = harness.lock().await;
        let key = key.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait(Wait::For(WAITER_WAIT));
            let started = Instant::now();
            let result = other.acquire(&key, &opts).await;
            (
                started.elapsed(),
                Instant::now(),
                result.map(|lease| lease.fencing_token()),
            )
        })
    };

    let master = failover(group).await;
    eprintln!("{group}: failed over, the new master is {master}");
    let done = Instant::now();

    // A new acquire + release works within the bound.
    let fresh = common::unique_key(&format!("failover/{group}/after"));
    acquire_after_failover(&other, &fresh, &opts, group)
        .await
        .release()
        .await
        .expect("release after the failover");
    eprintln!(
        "{group}: acquire + release works {:?} after the failover",
        done.elapsed()
    );

    // The lease held across the failover: while it claims to hold, nobody else gets in.
    // Watch it through a few renewals (ttl 5 s: renewals every ~1.7 s).
    let watch_until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < watch_until {
        let claims = !lease.is_lost();
        match other.try_acquire(&key, &opts).await {
            Ok(Some(second)) => {
                // Another client got the key: the first lease must have said it was lost.
                assert!(
                    !claims,
                    "{group}: a second client holds {key} while the first lease still claims it"
                );
                assert!(
                    second.fencing_token() > token,
                    "{group}: the token went back across the failover ({} after {token})",
                    second.fencing_token()
                );
                second.release().await.expect("release the second hold");
                break;
            }
            Ok(None) => {}
            Err(e) => eprintln!("{group}: try_acquire during the watch: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let lost = lease.is_lost();
    eprintln!("{group}: the lease held across the failover: lost = {lost}");
    let releasing = Instant::now();
    if lost {
        let _ = lease.release().await;
    } else {
        lease
            .release()
            .await
            .expect("a lease that kept working releases");
    }
    let (waited, granted_at, outcome) = waiter.await.expect("the waiter task");
    if outcome.is_ok() && !lost {
        assert!(
            granted_at >= releasing,
            "{group}: the waiter was granted {key} while the first lease still held it"
        );
    }
    assert!(
        waited < WAITER_WAIT + RECOVERY,
        "{group}: the waiter hung for {waited:?}"
    );
    // Granted (after the release: its lease was dropped in its task), or timed out or
    // unavailable: either way it ended.
    eprintln!("{group}: the waiter ended after {waited:?}: {outcome:?}");
    drop(holder);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_keeps_exclusion_and_recovers() {
    let harness = TopologyHarness::sentinel();
    assert_eq!(harness.kind(), Kind::Sentinel);
    survives_a_failover(harness, "redis-sentinel").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_failover_keeps_exclusion_and_recovers() {
    let harness = TopologyHarness::cluster();
    assert_eq!(harness.kind(), Kind::Cluster);
    survives_a_failover(harness, "redis-cluster").await;
}

/// A sentinel that never learns of a failover: it names `master` (at configuration epoch
/// `epoch`) as master `name` for ever, answering `SENTINEL MASTER` and
/// `SENTINEL get-master-addr-by-name` as a real one does, and refuses every other command
/// (`SUBSCRIBE` included). Its address.
async fn stale_sentinel(name: String, master: (String, u16), epoch: String) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the stale sentinel");
    let addr = listener.local_addr().expect("its address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (name, master, epoch) = (name.clone(), master.clone(), epoch.clone());
            tokio::spawn(async move {
                use tokio::io::AsyncWriteExt;
                let (read, mut write) = stream.into_split();
                let mut read = tokio::io::BufReader::new(read);
                while let Some(args) = read_command(&mut read).await {
                    let upper = |i: usize| args.get(i).map(|a| a.to_ascii_uppercase());
                    let ours = args.get(2) == Some(&name);
                    let bulk = |items: &[&str]| {
                        let mut out = format!("*{}\r\n", items.len());
                        for item in items {
                            out.push_str(&format!("${}\r\n{item}\r\n", item.len()));
                        }
                        out
                    };
                    let port = master.1.to_string();
                    let reply = match (upper(0).as_deref(), upper(1).as_deref()) {
                        (Some("SENTINEL"), Some("GET-MASTER-ADDR-BY-NAME")) if ours => {
                            bulk(&[&master.0, &port])
                        }
                        (Some("SENTINEL"), Some("MASTER")) if ours => bulk(&[
                            "name",
                            &name,
                            "ip",
                            &master.0,
                            "port",
                            &port,
                            "flags",
                            "master",
                            "config-epoch",
                            &epoch,
                        ]),
                        (Some("SENTINEL"), _) => "-ERR No such master with that name\r\n".into(),
                        (Some("PING"), _) => "+PONG\r\n".into(),
                        _ => "-ERR unknown command\r\n".into(),
                    };
                    if write.write_all(reply.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr.to_string()
}

/// One RESP command (an array of bulk strings); `None` at the end of the stream.
async fn read_command(
    read: &mut tokio::io::BufReader<tokio::net::tcp::OwnedReadHalf>,
) -> Option<Vec<String>> {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut line = String::new();
    if read.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let n: usize = line.trim_end().strip_prefix('*')?.parse().ok()?;
    let mut args = Vec::with_capacity(n);
    for _ in 0..n {
        line.clear();
        read.read_line(&mut line).await.ok()?;
        let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
        let mut arg = vec![0; len + 2];
        read.read_exact(&mut arg).await.ok()?;
        arg.truncate(len);
        args.push(String::from_utf8_lossy(&arg).into_owned());
    }
    Some(args)
}

/// Whether the lock key of `key` exists on the data node at `host:port` (`host:port` as
/// `scripts/backends failover` prints it).
async fn held_on(harness: &TopologyHarness, at: &str, key: &str) -> bool {
    let (host, port) = at.rsplit_once(':').expect("host:port");
    let config = RedisConfig {
        topology: Topology::Server,
        ..harness.config().at(host, port.parse().expect("a port"))
    };
    let mut conn = Node::new(&config, "redis")
        .expect("the new master's settings")
        .raw_connection()
        .await
        .unwrap_or_else(|e| panic!("connect to the new master {at}: {e}"));
    let name = Names::new(&harness.config().prefix, key).key;
    let exists: i64 = redis::cmd("EXISTS")
        .arg(&name)
        .query_async(&mut conn)
        .await
        .expect("EXISTS on the new master");
    exists == 1
}

/// A stale sentinel first in the URL (one that still names the old master after a
/// failover, as a sentinel does until it hears of the switch from the others): a client
/// connected before the failover, and one connecting after it, both reach the new master,
/// not the old one (which still says `ROLE master` until the sentinels demote it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_is_followed_past_a_stale_first_sentinel() {
    dlock_conformance::init_tracing();
    let _one_at_a_time = SENTINEL.lock().await;
    let harness = TopologyHarness::sentinel();
    let Topology::Sentinel(sentinel) = &harness.config().topology else {
        unreachable!("a Sentinel harness has a Sentinel URL")
    };
    let first = &sentinel.sentinels[0];
    let fields: std::collections::HashMap<String, String> = async {
        let client = redis::Client::open(format!("redis://{}:{}", first.name, first.port))?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&sentinel.master)
            .query_async(&mut conn)
            .await
    }
    .await
    .unwrap_or_else(|e| {
        panic!("sentinel {first} did not answer ({e}); start it with: scripts/backends up redis-sentinel")
    });
    let old = (
        fields["ip"].clone(),
        fields["port"].parse::<u16>().expect("a port"),
    );
    let stub = stale_sentinel(
        sentinel.master.clone(),
        old.clone(),
        fields["config-epoch"].clone(),
    )
    .await;
    let url = harness.url_with_first_host(&stub);

    let before = harness.lock_at(&url).await;
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    let key = common::unique_key("failover/stale-sentinel/before");
    backends::acquire_and_release(&before, &key, &opts, "before the failover").await;

    let master = failover("redis-sentinel").await;
    eprintln!("failed over from {}:{} to {master}", old.0, old.1);
    assert_ne!(master, format!("{}:{}", old.0, old.1), "the master changed");
    // The switch is announced on the watched sentinel as the sentinels adopt it; let the
    // client hear it.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let after = harness.lock_at(&url).await;
    for (who, client) in [("connected before", &before), ("connected after", &after)] {
        let key = common::unique_key("failover/stale-sentinel/after");
        let lease =
            acquire_after_failover(client, &key, &opts, &format!("a client {who} the failover"))
                .await;
        assert!(
            held_on(&harness, &master, &key).await,
            "a client {who} the failover was granted {key} elsewhere than on the new master \
             {master} (the stale sentinel names {}:{})",
            old.0,
            old.1
        );
        lease.release().await.expect("release after the failover");
    }
}

/// A client that reaches every sentinel through a proxy of its own (the data nodes
/// directly), and the proxies, in the sentinels' order.
async fn through_proxies(harness: &TopologyHarness) -> (RedisLock, Vec<dlock_conformance::Proxy>) {
    let mut config = harness.config().clone();
    let Topology::Sentinel(sentinel) = &mut config.topology else {
        unreachable!("a Sentinel harness has a Sentinel URL")
    };
    let mut proxies = Vec::new();
    for host in &mut sentinel.sentinels {
        *host = common::topology::proxy(host, &mut proxies).await;
    }
    let client = dlock_core::raw::LockClient::new(
        dlock_redis::RedisBackend::connect(config)
            .await
            .unwrap_or_else(|e| {
                panic!("connect through the sentinels ({e}); start them with: scripts/backends up redis-sentinel")
            }),
    );
    (client, proxies)
}

/// A switch announced while the client's watch cannot hear it (every sentinel cut off from
/// the client during the failover): once the watch subscribes again, it asks its sentinel
/// which master is current and moves the client there, before the old master is demoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_switch_missed_by_the_watch_is_caught_up() {
    dlock_conformance::init_tracing();
    let _one_at_a_time = SENTINEL.lock().await;
    let harness = TopologyHarness::sentinel();
    let (client, proxies) = through_proxies(&harness).await;
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    let key = common::unique_key("failover/missed-switch/before");
    backends::acquire_and_release(&client, &key, &opts, "before the failover").await;
    // Let the watch subscribe.
    tokio::time::sleep(Duration::from_millis(500)).await;

    for proxy in &proxies {
        proxy.cut();
    }
    let master = failover("redis-sentinel").await;
    // Healing closes the connections of the cut: the watch subscribes again.
    for proxy in &proxies {
        proxy.heal();
    }
    eprintln!("failed over to {master} while the sentinels were cut off from the client");
    // The watch's retry, its subscription and its question.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let key = common::unique_key("failover/missed-switch/after");
    let lease = acquire_after_failover(&client, &key, &opts, "the client").await;
    assert!(
        held_on(&harness, &master, &key).await,
        "{key} was granted elsewhere than on the new master {master}: the missed switch was \
         not caught up"
    );
    lease.release().await.expect("release after the failover");
}

/// The sentinel the client's watch listens on hangs (it keeps the connection and never
/// answers, as one cut off without a reset) before a failover: the watch notices within
/// seconds (no answer to its `PING`), listens on another sentinel, and moves the client to
/// the new master before the old one is demoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_switch_is_followed_when_the_watched_sentinel_hangs() {
    dlock_conformance::init_tracing();
    let _one_at_a_time = SENTINEL.lock().await;
    let harness = TopologyHarness::sentinel();
    let (client, proxies) = through_proxies(&harness).await;
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    let key = common::unique_key("failover/hung-watch/before");
    backends::acquire_and_release(&client, &key, &opts, "before the failover").await;
    // Let the watch subscribe on the first sentinel, then hang that one for the client.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxies[0].cut();
    let master = failover("redis-sentinel").await;
    eprintln!("failed over to {master} while the watched sentinel hangs for the client");
    // The watch's PING goes unanswered, it subscribes on the next sentinel and asks it.
    tokio::time::sleep(Duration::from_secs(4)).await;

    let key = common::unique_key("failover/hung-watch/after");
    let lease = acquire_after_failover(&client, &key, &opts, "the client").await;
    assert!(
        held_on(&harness, &master, &key).await,
        "{key} was granted elsewhere than on the new master {master}: the watch stayed on \
         the hung sentinel"
    );
    lease.release().await.expect("release after the failover");
    proxies[0].heal();
}
