//! The Redis harness: clients of the server `DLOCK_REDIS_URL` names (default
//! `redis://127.0.0.1:6379`), and the raw access the suite's fault hooks need.

#![allow(dead_code, unused_imports, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::Harness;
use dlock_core::{BoxError, DistributedLock, ErrorKind, Lease, LockOptions, Result, Wait};
use dlock_redis::server::{Names, Node};
use dlock_redis::{RedisConfig, RedisLock};
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;

pub mod backends;
pub mod topology;

pub use dlock_conformance::testkit::{unique_key, wrong_kind_of_server as not_redis_server};

pub const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// A harness of Redis: the URL under test and its settings. `K` is the topology it tests:
/// `()` for the one server of `DLOCK_REDIS_URL`, [`topology::Kind`] for a cluster or
/// Sentinel ([`topology::TopologyHarness`]); the clients below serve every topology.
pub struct RedisHarness<K = ()> {
    kind: K,
    url: String,
    config: RedisConfig,
}

impl RedisHarness {
    pub fn from_env() -> Self {
        let url = dlock_conformance::env_url("DLOCK_REDIS_URL", DEFAULT_URL);
        let config = RedisConfig::from_url(&url)
            .unwrap_or_else(|e| panic!("DLOCK_REDIS_URL={url:?} is not usable: {e}"));
        Self {
            kind: (),
            url,
            config,
        }
    }

    /// A raw connection to the server, for fault hooks and checks.
    pub async fn admin(&self) -> Result<MultiplexedConnection, BoxError> {
        admin(&self.config).await
    }
}

impl<K> RedisHarness<K>
where
    Self: Harness,
{
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// A client of the server(s) under test; an unreachable server fails the test naming
    /// it.
    pub async fn lock(&self) -> dlock_redis::RedisLock {
        self.lock_at(&self.url).await
    }

    /// A client built from `url`; an unreachable server fails the test naming it.
    pub async fn lock_at(&self, url: &str) -> dlock_redis::RedisLock {
        self.or_unreachable(url, dlock_redis::from_url(url).await)
    }

    /// The URL under test with one more query option.
    pub fn url_with_option(&self, option: &str) -> String {
        dlock_conformance::url_with_option(&self.url, option)
    }
}

/// A raw connection to the server `config` names.
pub async fn admin(config: &RedisConfig) -> Result<MultiplexedConnection, BoxError> {
    Ok(Node::new(config, "redis")?.raw_connection().await?)
}

/// Lock keys and waiters' queues under `prefix` (see [`RedisHarness::residue`]).
pub async fn keys_under(config: &RedisConfig, prefix: &str) -> Result<Vec<String>, BoxError> {
    let node = Node::new(config, "redis")?;
    let lock_prefix = format!("{}{prefix}", config.prefix);
    let mut keys = node.keys_with_prefix(&lock_prefix).await?;
    // The side keys `{<lock key>}:…`: the queue and the waiters' expiries are residue,
    // the fence counter is not.
    let side = node.keys_with_prefix(&format!("{{{lock_prefix}")).await?;
    keys.extend(side.into_iter().filter(|k| !k.ends_with("}:fence")));
    Ok(keys)
}

/// Wait (up to 10 s) until someone listens on `channel`.
pub async fn wait_for_subscriber(admin: &mut MultiplexedConnection, channel: &str) {
    let started = tokio::time::Instant::now();
    loop {
        let subscribers: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(admin)
            .await
            .expect("PUBSUB NUMSUB");
        if subscribers.first().is_some_and(|(_, n)| *n >= 1) {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "nobody subscribed to {channel}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Poll (up to 10 s) until `n` waiters are in the queue of `names`' key.
pub async fn until_queued(admin: &mut impl AsyncCommands, names: &Names, n: usize) {
    let started = tokio::time::Instant::now();
    loop {
        let queued: usize = admin.zcard(&names.queue).await.expect("ZCARD");
        if queued == n {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the queue of {} never held {n} waiters",
            names.key
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// `holder` takes the free `key` (ttl 5 s) and `waiter` waits for it (up to 10 s) in a task
/// of its own: the holder's lease, and the task that ends with the waiter's.
pub async fn take_with_a_waiter(
    holder: &RedisLock,
    waiter: RedisLock,
    key: &str,
) -> (Lease, JoinHandle<Result<Lease>>) {
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    let lease = holder
        .try_acquire(key, &opts)
        .await
        .expect("try_acquire")
        .expect("free");
    let key = key.to_owned();
    let waiting = tokio::spawn(async move {
        let opts = opts.wait(Wait::For(Duration::from_secs(10)));
        waiter.acquire(&key, &opts).await
    });
    (lease, waiting)
}

/// Release `lease` while `waiting` (see [`take_with_a_waiter`]) is queued for its key: the
/// waiter's lease, which must come within a second, so by the release's call and not by
/// the waiter's polling.
pub async fn hand_over(lease: Lease, waiting: JoinHandle<Result<Lease>>) -> Lease {
    let released = tokio::time::Instant::now();
    lease.release().await.expect("release");
    let next = waiting
        .await
        .expect("the waiter task")
        .expect("the waiter gets the key");
    assert!(
        released.elapsed() < Duration::from_secs(1),
        "the hand-off took {:?}: the call was not heard",
        released.elapsed()
    );
    next
}

/// Poll (up to 10 s) until `n` clients listen on `channel`.
pub async fn wait_for_subscribers(admin: &mut MultiplexedConnection, channel: &str, n: usize) {
    let started = tokio::time::Instant::now();
    loop {
        let listening: Vec<(String, usize)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(admin)
            .await
            .expect("PUBSUB NUMSUB");
        if listening.first().is_some_and(|(_, count)| *count >= n) {
            return;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{n} clients never listened on {channel}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// The server clock in µs.
pub async fn server_micros(admin: &mut MultiplexedConnection) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(admin).await.expect("TIME");
    secs * 1_000_000 + micros
}

/// Take `key` as another library would (`SET key token NX PX ms`); whether it was set.
pub async fn set_foreign(admin: &mut MultiplexedConnection, key: &str, px: u64) -> bool {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg("their-token")
        .arg("NX")
        .arg("PX")
        .arg(px)
        .query_async(admin)
        .await
        .expect("SET NX PX");
    set.is_some()
}

/// Delete a lock as an operator would (`break_lease`): its key, and an owner's hold with
/// its hash (which would expire with the key anyway).
pub async fn delete_lock(admin: &mut impl AsyncCommands, names: &Names) -> Result<(), BoxError> {
    let deleted: i64 = admin.del(&names.key).await?;
    assert_eq!(deleted, 1, "break_lease: {} was not held", names.key);
    let _: i64 = admin.del(&names.hold).await?;
    Ok(())
}

/// Delete the fence counter a test left (it outlives leases by design).
pub async fn forget_fence(admin: &mut MultiplexedConnection, prefix: &str, key: &str) {
    let _: () = admin
        .del(Names::new(prefix, key).fence)
        .await
        .expect("DEL fence");
}

#[async_trait]
impl Harness for RedisHarness {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(dlock_redis::from_url(url).await?))
    }

    fn bad_urls(&self) -> Vec<(String, ErrorKind)> {
        let addr = self.config.addr();
        let invalid = [
            format!("http://{addr}"),
            format!("redis://{}:notaport", self.config.host),
            format!("redis://{addr}/notadb"),
            format!("redis://{addr}?nonsense=1"),
            format!("redis://{addr}?connect_timeout=forever"),
            format!("redis://{addr},{addr}"),
            format!("redis://user:sekrit-password@{addr}?bogus=1"),
            "not a url".to_owned(),
        ];
        let mut cases: Vec<_> = invalid
            .into_iter()
            .map(|u| (u, ErrorKind::InvalidConfig))
            .collect();
        cases.push((
            format!("redis://nobody:sekrit-password@{addr}"),
            ErrorKind::Backend,
        ));
        cases.push((
            format!("redis://{}", not_redis_server()),
            ErrorKind::Backend,
        ));
        cases
    }

    async fn break_lease(&self, key: &str) -> Result<(), BoxError> {
        let names = Names::new(&self.config.prefix, key);
        delete_lock(&mut self.admin().await?, &names).await
    }

    /// Lock keys under `prefix`, the waiters' queues of those keys
    /// (`{<lock key>}:queue`, `{<lock key>}:waiters`): they go with the last waiter, or
    /// expire 3 s after the last write when waiters vanished; and the hold hashes of
    /// owners' reentrant holds (`{<lock key>}:hold`), which go with the last entry or
    /// expire with the key. Fence counters
    /// (`{<lock key>}:fence`) are not residue: they outlive holders by design (tokens must
    /// keep increasing) and expire an hour after the last grant.
    async fn residue(&self, prefix: &str) -> Result<Vec<String>, BoxError> {
        keys_under(&self.config, prefix).await
    }
}
