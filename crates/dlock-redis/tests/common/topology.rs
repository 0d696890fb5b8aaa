//! Harnesses of the replicated topologies: a Redis Cluster (`DLOCK_REDIS_CLUSTER_URL`) and
//! a master found through Sentinel (`DLOCK_REDIS_SENTINEL_URL`), with the defaults
//! `scripts/backends up redis-cluster redis-sentinel` starts.
//!
//! The fault hooks work on the keys themselves, wherever they live: a command connection of
//! the topology (a cluster's routes each command to its key's master, Sentinel's goes to
//! the master it names), and the residue check scans every master.

use std::net::SocketAddr;
use std::sync::Arc;

use async_trait::async_trait;
use dlock_conformance::{Harness, Partition, Proxy};
use dlock_core::raw::LockClient;
use dlock_core::raw::url::Host;
use dlock_core::{BoxError, DistributedLock, ErrorKind, Result};
use dlock_redis::server::{Connection, Names, Node};
use dlock_redis::{RedisBackend, RedisConfig, Topology};
use redis::AsyncCommands;

pub const DEFAULT_CLUSTER_URL: &str =
    "redis+cluster://dlock:dlock-secret@127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103";
pub const DEFAULT_SENTINEL_URL: &str =
    "redis+sentinel://dlock:dlock-secret@127.0.0.1:26391,127.0.0.1:26392,127.0.0.1:26393/dlock";

/// Which topology a [`TopologyHarness`] tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Cluster,
    Sentinel,
}

/// A harness of a replicated topology: [`super::RedisHarness`] with the [`Kind`] it tests.
pub type TopologyHarness = super::RedisHarness<Kind>;

impl TopologyHarness {
    pub fn cluster() -> Self {
        Self::new(
            Kind::Cluster,
            "DLOCK_REDIS_CLUSTER_URL",
            DEFAULT_CLUSTER_URL,
        )
    }

    pub fn sentinel() -> Self {
        Self::new(
            Kind::Sentinel,
            "DLOCK_REDIS_SENTINEL_URL",
            DEFAULT_SENTINEL_URL,
        )
    }

    fn new(kind: Kind, var: &str, default: &str) -> Self {
        let url = dlock_conformance::env_url(var, default);
        let config = RedisConfig::from_url(&url).unwrap_or_else(|e| {
            panic!(
                "{var}={} is not usable: {e}",
                dlock_core::raw::url::redact(&url)
            )
        });
        Self { kind, url, config }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The URL under test with `host` first among its sentinels or seed nodes.
    pub fn url_with_first_host(&self, host: impl std::fmt::Display) -> String {
        let at = self
            .url
            .find('@')
            .map_or(self.url.find("://").expect("a URL") + 3, |i| i + 1);
        format!("{}{host},{}", &self.url[..at], &self.url[at..])
    }

    /// A command connection of the topology (routed by key on a cluster, to the master
    /// with Sentinel), for fault hooks and checks.
    pub async fn admin(&self) -> Result<Connection, BoxError> {
        Ok(Node::new(&self.config, "redis")?
            .command_connection()
            .await?)
    }

    /// Every data node of the topology: the cluster's nodes (`CLUSTER NODES`), or the
    /// master and the replicas the sentinels know.
    pub async fn data_nodes(&self) -> Result<Vec<Host>, BoxError> {
        match self.kind {
            Kind::Cluster => {
                let mut admin = self.admin().await?;
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut admin)
                    .await?;
                Ok(nodes
                    .lines()
                    .filter(|line| !line.contains("fail") && !line.contains("noaddr"))
                    .filter_map(|line| line.split_whitespace().nth(1))
                    .filter_map(|addr| {
                        let addr = addr.split('@').next()?;
                        let (host, port) = addr.rsplit_once(':')?;
                        Some(Host::new(host, port.parse().ok()?))
                    })
                    .collect())
            }
            Kind::Sentinel => {
                let Topology::Sentinel(sentinel) = &self.config.topology else {
                    unreachable!("a Sentinel harness has a Sentinel URL")
                };
                let first = &sentinel.sentinels[0];
                let client = redis::Client::open(format!("redis://{}:{}", first.name, first.port))?;
                let mut conn = client.get_multiplexed_async_connection().await?;
                let (host, port): (String, u16) = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&sentinel.master)
                    .query_async(&mut conn)
                    .await?;
                let replicas: Vec<std::collections::HashMap<String, String>> =
                    redis::cmd("SENTINEL")
                        .arg("replicas")
                        .arg(&sentinel.master)
                        .query_async(&mut conn)
                        .await?;
                let mut nodes = vec![Host::new(host, port)];
                for replica in replicas {
                    if let (Some(ip), Some(port)) = (replica.get("ip"), replica.get("port")) {
                        nodes.push(Host::new(ip.clone(), port.parse()?));
                    }
                }
                Ok(nodes)
            }
        }
    }
}

/// `text` with the `SCAN` glob characters escaped.
fn glob_escape(text: &str) -> String {
    let mut glob = String::with_capacity(text.len());
    for c in text.chars() {
        if "*?[]\\".contains(c) {
            glob.push('\\');
        }
        glob.push(c);
    }
    glob
}

/// A proxy in front of `host`, kept in `proxies`; its address.
pub async fn proxy(host: &Host, proxies: &mut Vec<Proxy>) -> Host {
    let proxy = Proxy::start(socket_addr(host))
        .await
        .expect("start a loopback proxy");
    let to = Host::new(proxy.addr().ip().to_string(), proxy.addr().port());
    proxies.push(proxy);
    to
}

fn socket_addr(host: &Host) -> SocketAddr {
    use std::net::ToSocketAddrs;
    (host.name.as_str(), host.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .unwrap_or_else(|| panic!("{host} does not resolve"))
}

#[async_trait]
impl Harness for TopologyHarness {
    fn name(&self) -> &'static str {
        match self.kind {
            Kind::Cluster => "redis_cluster",
            Kind::Sentinel => "redis_sentinel",
        }
    }

    fn setup(&self) -> &'static str {
        match self.kind {
            Kind::Cluster => "redis-cluster",
            Kind::Sentinel => "redis-sentinel",
        }
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(dlock_redis::from_url(url).await?))
    }

    /// Proxies in front of the sentinels or seed nodes of the URL and of every data node,
    /// which the client dials in their place (its `address_map`): a cut stops all of its
    /// traffic.
    async fn partitioned_client(&self) -> Result<(Arc<dyn DistributedLock>, Box<dyn Partition>)> {
        let nodes = self
            .data_nodes()
            .await
            .unwrap_or_else(|e| panic!("{}", self.unreachable(&self.url, &e)));
        let mut config = self.config.clone();
        let mut proxies = Vec::new();
        for node in &nodes {
            let to = proxy(node, &mut proxies).await;
            config.address_map.push((node.clone(), to));
        }
        match &mut config.topology {
            Topology::Sentinel(sentinel) => {
                for host in &mut sentinel.sentinels {
                    *host = proxy(host, &mut proxies).await;
                }
            }
            Topology::Cluster { seeds } => {
                for seed in seeds.iter_mut() {
                    if let Some((_, to)) = config.address_map.iter().find(|(from, _)| from == seed)
                    {
                        *seed = to.clone();
                    }
                }
            }
            _ => unreachable!("a topology harness"),
        }
        let client = LockClient::new(RedisBackend::connect(config).await?);
        Ok((Arc::new(client), Box::new(proxies)))
    }

    fn bad_urls(&self) -> Vec<(String, ErrorKind)> {
        let hosts = |scheme: &str| match &self.config.topology {
            Topology::Sentinel(s) => format!(
                "{scheme}://{}",
                s.sentinels
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Topology::Cluster { seeds } => format!(
                "{scheme}://{}",
                seeds
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            _ => unreachable!("a topology harness"),
        };
        let (scheme, tail) = match self.kind {
            Kind::Cluster => ("redis+cluster", ""),
            Kind::Sentinel => ("redis+sentinel", "/dlock"),
        };
        let base = hosts(scheme);
        let authed = base.replacen("://", "://dlock:sekrit-password@", 1);
        let mut cases = vec![
            (format!("{base}{tail}?nonsense=1"), ErrorKind::InvalidConfig),
            (
                format!("{base}{tail}?connect_timeout=forever"),
                ErrorKind::InvalidConfig,
            ),
            (format!("{authed}{tail}?bogus=1"), ErrorKind::InvalidConfig),
            (
                format!("{scheme}://127.0.0.1:notaport{tail}"),
                ErrorKind::InvalidConfig,
            ),
            (format!("{scheme}://{tail}"), ErrorKind::InvalidConfig),
            ("not a url".to_owned(), ErrorKind::InvalidConfig),
            // A wrong ACL password: refused by the data nodes.
            (format!("{authed}{tail}"), ErrorKind::Backend),
        ];
        match self.kind {
            Kind::Cluster => {
                cases.push((format!("{base}/1"), ErrorKind::InvalidConfig));
            }
            Kind::Sentinel => {
                cases.push((base.clone(), ErrorKind::InvalidConfig));
                cases.push((format!("{base}/a/b"), ErrorKind::InvalidConfig));
            }
        }
        cases
    }

    async fn break_lease(&self, key: &str) -> Result<(), BoxError> {
        let names = match self.kind {
            Kind::Cluster => Names::in_cluster(&self.config.prefix, key),
            Kind::Sentinel => Names::new(&self.config.prefix, key),
        };
        super::delete_lock(&mut self.admin().await?, &names).await
    }

    /// As the one-server harness: lock keys, queues and hold hashes under `prefix`, on
    /// every master.
    /// On a cluster also the companions of keys with a `}`, which carry a slot's hash tag
    /// in front (`{s123}{<lock key>}:queue`, see `Names::in_cluster`).
    async fn residue(&self, prefix: &str) -> Result<Vec<String>, BoxError> {
        let mut keys = super::keys_under(&self.config, prefix).await?;
        if self.kind == Kind::Cluster {
            let node = Node::new(&self.config, "redis")?;
            let glob = format!("{{s*}}{{{}{}*", self.config.prefix, glob_escape(prefix));
            let tagged = node.keys_matching(&glob).await?;
            keys.extend(tagged.into_iter().filter(|k| !k.ends_with("}:fence")));
        }
        Ok(keys)
    }
}
