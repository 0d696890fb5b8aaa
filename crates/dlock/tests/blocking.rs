//! `dlock::blocking` against every backend's real server, from plain OS threads: each thread
//! has its own blocking client, as a thread-based worker pool would.

use std::thread;
use std::time::{Duration, Instant};

use dlock::blocking::{self, Client};
use dlock::{ErrorKind, Expiry, LockOptions, LostReason, Mode, Wait};
use dlock_conformance::testkit::unique_key;
use dlock_conformance::{History, Hold, Proxy, url_with_option};
use dlock_core::raw::url::{Host, LockUrl, default_port, redact};

/// A server of the test: its URL and the `scripts/backends up` setup that starts it.
#[derive(Debug, Clone)]
struct Server {
    url: String,
    setup: &'static str,
}

impl Server {
    fn from_env(var: &str, default: &str, setup: &'static str) -> Self {
        Self {
            url: dlock_conformance::env_url(var, default),
            setup,
        }
    }

    /// A blocking client, or a failure naming the server and how to start it.
    fn connect(&self) -> Client {
        self.connect_to(&self.url)
    }

    fn connect_to(&self, url: &str) -> Client {
        blocking::connect(url).unwrap_or_else(|e| {
            panic!(
                "cannot use the server at {}: {e}\n  start it with: scripts/backends up {}",
                redact(url),
                self.setup
            )
        })
    }
}

/// Several threads, each with its own client, take one key in turns: no two holds overlap
/// and every hold happened.
fn threads_exclude_each_other(server: &Server) {
    const THREADS: usize = 4;
    const ROUNDS: usize = 5;
    let key = unique_key("blocking-mutex");
    let history = History::new();
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Wait::For(Duration::from_secs(60)));
    let workers: Vec<_> = (0..THREADS)
        .map(|client| {
            let (server, key, history) = (server.clone(), key.clone(), history.clone());
            thread::spawn(move || {
                let lock = server.connect();
                for _ in 0..ROUNDS {
                    let lease = lock.acquire(&key, &opts).expect("acquire");
                    let start = tokio::time::Instant::now();
                    // Work under the lock, long enough for a broken lock to show an overlap.
                    thread::sleep(Duration::from_millis(5));
                    let end = tokio::time::Instant::now();
                    let token = lease.fencing_token();
                    lease.release().expect("release");
                    history.record(Hold {
                        client,
                        key: key.clone(),
                        token,
                        mode: Mode::Exclusive,
                        start,
                        end,
                        lost_at: None,
                    });
                }
                lock.capabilities().fencing.is_ordered()
            })
        })
        .collect();
    // Every thread joined before looking at the answers.
    let orders: Vec<bool> = workers
        .into_iter()
        .map(|w| w.join().expect("worker thread"))
        .collect();
    let ordered = orders.into_iter().all(|ordered| ordered);
    let violations = history.check(ordered);
    assert!(
        violations.is_empty(),
        "{} violations: {}",
        violations.len(),
        violations[0]
    );
    assert_eq!(history.holds().len(), THREADS * ROUNDS);
}

/// `wait_lost` blocks until the lease is lost and says why: by expiry where a ttl ends a
/// lease (auto-renew off), by a network cut where a session keeps it.
fn wait_lost_returns_the_reason(server: &Server) {
    let key = unique_key("blocking-lost");
    let probe = server.connect();
    match probe.capabilities().expiry {
        Expiry::Ttl => {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(1))
                .auto_renew(false);
            let lease = probe.acquire(&key, &opts).expect("acquire");
            assert_eq!(lease.wait_lost(Duration::ZERO).expect("look"), None);
            let started = Instant::now();
            let reason = lease.wait_lost(Duration::from_secs(10)).expect("wait");
            assert_eq!(reason, Some(LostReason::Expired));
            assert!(lease.is_lost());
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{:?}",
                started.elapsed()
            );
        }
        Expiry::Session { .. } => {
            // A runtime of the test's own carries the proxy, apart from the client's.
            let proxy_runtime = tokio::runtime::Runtime::new().expect("test runtime");
            let (url, proxy) = through_proxy(&proxy_runtime, &server.url);
            let url = url_with_option(&url, "session_timeout=2s");
            let lock = server.connect_to(&url);
            let lease = lock.acquire(&key, &LockOptions::new()).expect("acquire");
            assert_eq!(
                lease.wait_lost(Duration::from_millis(50)).expect("wait"),
                None
            );
            proxy.cut();
            let started = Instant::now();
            let reason = lease.wait_lost(Duration::from_secs(20)).expect("wait");
            assert!(reason.is_some(), "not lost 20 s after the cut");
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{:?}",
                started.elapsed()
            );
            drop(lease);
            drop(lock);
            proxy_runtime.shutdown_background();
        }
    }
}

/// `url` with its (first) server behind a proxy the test can cut.
fn through_proxy(runtime: &tokio::runtime::Runtime, url: &str) -> (String, Proxy) {
    let scheme = url.split_once("://").map_or("", |(s, _)| s);
    let parsed =
        LockUrl::parse("test", url, &[], default_port(scheme).unwrap_or(0)).expect("a usable URL");
    let host = &parsed.hosts()[0];
    let upstream = std::net::ToSocketAddrs::to_socket_addrs(&(host.name.as_str(), host.port))
        .expect("the server resolves")
        .next()
        .expect("an address");
    let proxy = runtime
        .block_on(Proxy::start(upstream))
        .expect("start a proxy");
    let url = parsed
        .with_hosts(vec![Host::new("127.0.0.1", proxy.addr().port())])
        .expose();
    (url, proxy)
}

/// A dropped lease is released in the background: another client gets the key at once.
/// A dropped client waits for that release: the key is free when the drop returns.
fn drops_release(server: &Server) {
    let key = unique_key("blocking-drop");
    // A long ttl: only a release frees the key within the test's bounds.
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Wait::For(Duration::from_secs(10)));
    let first = server.connect();
    let second = server.connect();
    let lease = first.acquire(&key, &opts).expect("first acquire");
    drop(lease);
    let started = Instant::now();
    let lease = second.acquire(&key, &opts).expect("acquire after a drop");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    lease.release().expect("release");

    let lease = first.acquire(&key, &opts).expect("acquire again");
    let started = Instant::now();
    drop(lease);
    drop(first);
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "{:?}",
        started.elapsed()
    );
    let lease = second
        .try_acquire(&key, &opts)
        .expect("try_acquire")
        .expect("the key is free once the dropped client is gone");
    lease.release().expect("release");
    assert!(second.settle(Duration::from_secs(5)).expect("settle"));
}

/// Inside an async context every blocking call is refused with a typed error (no panic,
/// no deadlock); dropping there does not block either.
fn refused_inside_an_async_context(server: &Server) {
    let key = unique_key("blocking-async");
    let lock = server.connect();
    let lease = lock.acquire(&key, &LockOptions::new()).expect("acquire");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("test runtime");
    let url = server.url.clone();
    let (lock, lease) = runtime.block_on(async {
        let refused = |e: dlock::LockError| {
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
            assert!(e.to_string().contains("async API"), "{e}");
        };
        refused(blocking::connect(&url).unwrap_err());
        refused(lock.try_acquire("other", &LockOptions::new()).unwrap_err());
        refused(lock.acquire("other", &LockOptions::new()).unwrap_err());
        refused(lock.settle(Duration::from_secs(1)).unwrap_err());
        refused(lease.extend(Duration::from_secs(30)).unwrap_err());
        refused(lease.wait_lost(Duration::from_secs(1)).unwrap_err());
        // What only reads local state still answers.
        assert_eq!(lease.wait_lost(Duration::ZERO).expect("look"), None);
        assert!(!lease.is_lost());
        assert_eq!(lease.key(), key);
        (lock, lease)
    });
    // A release refused in async code falls back to the background release of a drop.
    let other = server.connect();
    runtime.block_on(async { refused_release(lease) });
    let started = Instant::now();
    let lease = other
        .acquire(
            &key,
            &LockOptions::new().wait(Wait::For(Duration::from_secs(10))),
        )
        .expect("acquire after the refused release");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    lease.release().expect("release");
    // Dropping the last client inside async code hands the settling to a thread.
    runtime.block_on(async move { drop(lock) });
}

fn refused_release(lease: blocking::Lease) {
    let e = lease.release().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
}

/// Several keys at once, looking at them, and an election, from a plain thread.
fn sets_inspect_and_elections(server: &Server) {
    let lock = server.connect();
    let prefix = unique_key("blocking-more");
    let (a, b) = (format!("{prefix}/a"), format!("{prefix}/b"));
    let leases = lock
        .acquire_all(&[&b, &a], &LockOptions::new())
        .expect("acquire_all");
    let keys: Vec<&str> = leases.iter().map(blocking::Lease::key).collect();
    assert_eq!(
        keys,
        [a.as_str(), b.as_str()],
        "one lease per key, ascending"
    );
    assert!(lock.inspect(&a).expect("inspect").is_held());
    if lock.capabilities().inspect.list {
        assert_eq!(lock.list(&prefix).expect("list"), [a.clone(), b.clone()]);
    }
    for lease in leases {
        lease.release().expect("release");
    }
    assert!(!lock.inspect(&a).expect("inspect").is_held());
    let key = format!("{prefix}/leader");
    let mut leading = lock
        .campaign(&key, "me:1", &LockOptions::new())
        .expect("campaign");
    let term = leading.term();
    let shown = lock.leader(&key).expect("leader").expect("a leader");
    assert_eq!((shown.value.as_str(), shown.term), ("me:1", term));
    leading.proclaim("me:2").expect("proclaim");
    assert_eq!(leading.value(), "me:2");
    assert_eq!(
        lock.leader(&key).expect("leader").map(|l| l.value),
        Some("me:2".into())
    );
    assert_eq!(leading.wait_lost(Duration::ZERO).expect("look"), None);
    leading.resign().expect("resign");
    assert_eq!(lock.leader(&key).expect("leader"), None);
}

/// Threads of one owner re-enter its hold at once, with its token, and the key frees with
/// the last release.
fn threads_of_one_owner_reenter(server: &Server) {
    let (lock, other) = (server.connect(), server.connect());
    let key = unique_key("blocking-owner");
    let opts = LockOptions::new().owner("blocking-job").wait(Wait::No);
    let first = lock.acquire(&key, &opts).expect("the owner takes the key");
    let token = first.fencing_token();
    let entries: Vec<blocking::Lease> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|_| {
                s.spawn(|| {
                    lock.acquire(&key, &opts)
                        .expect("a thread of the owner re-enters")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    assert!(entries.iter().all(|l| l.fencing_token() == token));
    first.release().expect("release");
    assert!(
        other
            .try_acquire(&key, &LockOptions::new())
            .expect("try")
            .is_none()
    );
    for lease in entries {
        lease.release().expect("release");
    }
    let next = other
        .acquire(
            &key,
            &LockOptions::new().wait(Wait::For(Duration::from_secs(5))),
        )
        .expect("the key frees with the owner's last release");
    next.release().expect("release");
}

/// Stamp the tests for one backend.
macro_rules! backend {
    ($name:ident, $var:literal, $default:literal, $setup:literal) => {
        mod $name {
            fn server() -> super::Server {
                super::Server::from_env($var, $default, $setup)
            }
            #[test]
            fn threads_exclude_each_other() {
                super::threads_exclude_each_other(&server());
            }
            #[test]
            fn wait_lost_returns_the_reason() {
                super::wait_lost_returns_the_reason(&server());
            }
            #[test]
            fn drops_release() {
                super::drops_release(&server());
            }
            #[test]
            fn refused_inside_an_async_context() {
                super::refused_inside_an_async_context(&server());
            }
            #[test]
            fn sets_inspect_and_elections() {
                super::sets_inspect_and_elections(&server());
            }
            #[test]
            fn threads_of_one_owner_reenter() {
                super::threads_of_one_owner_reenter(&server());
            }
        }
    };
}

backend!(
    memory,
    "DLOCK_BLOCKING_MEMORY_URL",
    "memory://",
    "(none: in-process)"
);
backend!(redis, "DLOCK_REDIS_URL", "redis://127.0.0.1:6379", "redis");
backend!(
    redis_sentinel,
    "DLOCK_REDIS_SENTINEL_URL",
    "redis+sentinel://dlock:dlock-secret@127.0.0.1:26391,127.0.0.1:26392,127.0.0.1:26393/dlock",
    "redis-sentinel"
);
backend!(
    redis_cluster,
    "DLOCK_REDIS_CLUSTER_URL",
    "redis+cluster://dlock:dlock-secret@127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103",
    "redis-cluster"
);
backend!(
    redlock,
    "DLOCK_REDLOCK_URL",
    "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005",
    "redlock"
);
backend!(
    zookeeper,
    "DLOCK_ZK_URL",
    "zk://127.0.0.1:2181",
    "zookeeper"
);
backend!(etcd, "DLOCK_ETCD_URL", "etcd://127.0.0.1:2379", "etcd");
backend!(
    mysql,
    "DLOCK_MYSQL_URL",
    "mysql://dlock:dlock@127.0.0.1:3306/dlock",
    "mysql"
);
backend!(
    postgres,
    "DLOCK_POSTGRES_URL",
    "postgres://dlock:dlock@127.0.0.1:5432/dlock",
    "postgres"
);
