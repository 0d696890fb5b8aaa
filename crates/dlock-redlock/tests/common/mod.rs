//! The Redlock harness: clients of the nodes `DLOCK_REDLOCK_URL` names (default the five
//! nodes on 127.0.0.1:7001-7005), and the raw access the suite's fault hooks need.

#![allow(dead_code, unused_imports, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::Harness;
use dlock_core::{BoxError, DistributedLock, ErrorKind, Result};
use dlock_redis::RedisConfig;
use dlock_redis::server::{Names, Node};
use dlock_redlock::RedlockConfig;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;

pub use dlock_conformance::testkit::{
    must_take, unique_key, wrong_kind_of_server as not_redis_server,
};

pub const DEFAULT_URL: &str =
    "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005";

pub struct RedlockHarness {
    url: String,
    config: RedlockConfig,
}

impl RedlockHarness {
    pub fn from_env() -> Self {
        let url = dlock_conformance::env_url("DLOCK_REDLOCK_URL", DEFAULT_URL);
        let config = RedlockConfig::from_url(&url)
            .unwrap_or_else(|e| panic!("DLOCK_REDLOCK_URL={url:?} is not usable: {e}"));
        Self { url, config }
    }

    pub fn config(&self) -> &RedlockConfig {
        &self.config
    }

    pub fn prefix(&self) -> &str {
        self.config.prefix()
    }

    /// A client of the nodes under test; unreachable nodes fail the test naming them.
    pub async fn lock(&self) -> dlock_redlock::RedlockLock {
        self.lock_at(&self.url).await
    }

    /// A client built from `url`; unreachable nodes fail the test naming them.
    pub async fn lock_at(&self, url: &str) -> dlock_redlock::RedlockLock {
        self.or_unreachable(url, dlock_redlock::from_url(url).await)
    }

    /// The URL with the nodes `dead` replaced by loopback ports with nothing behind them.
    pub fn url_with_dead_nodes(&self, dead: &[usize]) -> String {
        let mut addrs = self.server_addrs();
        for &i in dead {
            addrs[i] = dlock_conformance::dead_addr();
        }
        self.url_with_addrs(&addrs)
    }

    /// A raw connection to node `i`.
    pub async fn admin(&self, i: usize) -> Result<MultiplexedConnection, BoxError> {
        Ok(Node::new(&self.config.nodes[i], "redlock")?
            .raw_connection()
            .await?)
    }

    /// The value of `key`'s lock on every node (`None` where it is not held or the node is
    /// down).
    pub async fn values(&self, key: &str) -> Vec<Option<String>> {
        let names = Names::new(self.prefix(), key);
        let mut values = Vec::new();
        for i in 0..self.config.nodes.len() {
            let value = match self.admin(i).await {
                Ok(mut conn) => conn.get(&names.key).await.unwrap_or(None),
                Err(_) => None,
            };
            values.push(value);
        }
        values
    }

    /// The value of `key`'s lock on every node once the requests that acquires and
    /// releases left running have ended: each is decided once a majority of the nodes
    /// answered, and the others' requests go on in the background (`dlock_core::settle`
    /// waits for them).
    pub async fn settled_values(&self, key: &str) -> Vec<Option<String>> {
        assert!(
            dlock_core::settle(Duration::from_secs(10)).await,
            "background requests still running after 10 s"
        );
        self.values(key).await
    }

    /// Assert that no node holds `key` once the background requests have ended.
    pub async fn assert_free_everywhere(&self, key: &str) {
        let values = self.settled_values(key).await;
        assert!(
            values.iter().all(Option::is_none),
            "the key is left on a node: {values:?}"
        );
    }

    /// The token every node holds `key` with, once the background requests have ended.
    pub async fn held_everywhere(&self, key: &str) -> String {
        let values = self.settled_values(key).await;
        assert!(
            values[0].is_some() && values.iter().all(|v| *v == values[0]),
            "not held alike on every node: {values:?}"
        );
        values[0].clone().expect("held")
    }

    /// Delete the fence counters of `key` on every node that is up.
    pub async fn forget_fence(&self, key: &str) {
        let names = Names::new(self.prefix(), key);
        for i in 0..self.config.nodes.len() {
            if let Ok(mut conn) = self.admin(i).await {
                let _: Result<(), _> = conn.del(&names.fence).await;
            }
        }
    }

    fn node_addrs(&self) -> Vec<String> {
        self.config.nodes.iter().map(RedisConfig::addr).collect()
    }
}

/// Wait (up to 10 s) until someone listens on `channel` on every node that is up.
pub async fn wait_for_subscribers(harness: &RedlockHarness, channel: &str, nodes: &[usize]) {
    let started = tokio::time::Instant::now();
    for &i in nodes {
        let mut admin = harness.admin(i).await.expect("admin connection");
        loop {
            let subscribers: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(channel)
                .query_async(&mut admin)
                .await
                .expect("PUBSUB NUMSUB");
            if subscribers.first().is_some_and(|(_, n)| *n >= 1) {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "nobody subscribed to {channel} on node {i}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[async_trait]
impl Harness for RedlockHarness {
    fn name(&self) -> &'static str {
        "redlock"
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(dlock_redlock::from_url(url).await?))
    }

    fn bad_urls(&self) -> Vec<(String, ErrorKind)> {
        let nodes = self.node_addrs();
        let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
        let invalid = [
            format!("redis://{a}"),
            format!("redlock://{a}"),
            format!("redlock://{a},{b}"),
            format!("redlock://{a},{b},{c},127.0.0.1:1"),
            format!("redlock://{a},{b},{a}"),
            format!("redlock://{a},{b},{c}?nonsense=1"),
            format!("redlock://user:sekrit-password@{a},{b},{c}?bogus=1"),
            format!("redlock://{a},{b},{c}/notadb"),
            "not a url".to_owned(),
        ];
        let mut cases: Vec<_> = invalid
            .into_iter()
            .map(|u| (u, ErrorKind::InvalidConfig))
            .collect();
        cases.push((
            format!("redlock://nobody:sekrit-password@{a},{b},{c}"),
            ErrorKind::Backend,
        ));
        let wrong: Vec<String> = (0..3).map(|_| not_redis_server().to_string()).collect();
        cases.push((format!("redlock://{}", wrong.join(",")), ErrorKind::Backend));
        cases
    }

    async fn break_lease(&self, key: &str) -> Result<(), BoxError> {
        let names = Names::new(self.prefix(), key);
        let mut deleted = 0;
        for i in 0..self.config.nodes.len() {
            let n: i64 = self.admin(i).await?.del(&names.key).await?;
            deleted += n;
        }
        assert!(
            deleted >= 3,
            "break_lease: {} was held on {deleted} nodes",
            names.key
        );
        Ok(())
    }

    /// Lock keys under `prefix` on any node; the waiters' queues of those keys
    /// (`{<lock key>}:queue`, `{<lock key>}:waiters`: they go with the last waiter, or
    /// expire 3 s after the last write when waiters vanished); and owners' hold records
    /// (`{<lock key>}:reentry`: they go with the hold's last lease, or expire with the
    /// hold; a stale one is deleted by the next owner script on the key). Fence counters
    /// (`{<lock key>}:fence`) are not residue: they outlive holders by design (tokens must
    /// keep increasing) and expire an hour after the last grant.
    async fn residue(&self, prefix: &str) -> Result<Vec<String>, BoxError> {
        let mut left = Vec::new();
        for node in &self.config.nodes {
            let server = Node::new(node, "redlock")?;
            let lock_prefix = format!("{}{prefix}", node.prefix);
            let mut keys = server.keys_with_prefix(&lock_prefix).await?;
            let side = server.keys_with_prefix(&format!("{{{lock_prefix}")).await?;
            keys.extend(side.into_iter().filter(|k| !k.ends_with("}:fence")));
            left.extend(keys.into_iter().map(|k| format!("{}: {k}", node.addr())));
        }
        Ok(left)
    }
}
