//! Where a [`Node`](super::Node)'s connections go: one server, the master a group of
//! sentinels names (asked again on every connect), or a Redis Cluster (redis-rs's cluster
//! connection for commands, any reachable seed node for pub/sub).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection, PubSub};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, Value};

use crate::config::{RedisConfig, Topology};
use crate::error::Error;
use crate::scripts;

mod cluster;
mod sentinel;
pub use cluster::ClusterCommands;
pub(crate) use sentinel::{Sentinels, watch_switches};

/// A command connection: to one server (or the master Sentinel named), or to a cluster.
/// Cheap to clone; clones share the connection. Commands of a cluster connection are
/// routed by their keys (see [`ClusterCommands`]).
#[derive(Clone)]
pub enum Connection {
    /// One server.
    Server(MultiplexedConnection),
    /// A Redis Cluster.
    Cluster(ClusterCommands),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Server(conn) => conn.req_packed_command(cmd),
            Self::Cluster(cluster) => Box::pin(cluster.request(cmd)),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Server(conn) => conn.req_packed_commands(pipeline, offset, count),
            Self::Cluster(cluster) => Box::pin(async move {
                cluster
                    .inner()
                    .req_packed_commands(pipeline, offset, count)
                    .await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Server(conn) => conn.get_db(),
            Self::Cluster(cluster) => cluster.inner().get_db(),
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Server(_) => "Connection::Server",
            Self::Cluster(_) => "Connection::Cluster",
        })
    }
}

impl Connection {
    /// Run `cmd` on the node at `host:port` of a cluster (on one server: on it).
    pub(crate) async fn on_node(
        &mut self,
        cmd: Cmd,
        host: &str,
        port: u16,
    ) -> redis::RedisResult<Value> {
        match self {
            Self::Server(conn) => cmd.query_async(conn).await,
            Self::Cluster(cluster) => {
                let route = SingleNodeRoutingInfo::ByAddress {
                    host: host.to_owned(),
                    port,
                };
                cluster
                    .inner()
                    .route_command(cmd, RoutingInfo::SingleNode(route))
                    .await
            }
        }
    }

    /// The masters of a cluster (`CLUSTER SLOTS`), each once; `None` for one server.
    pub(crate) async fn masters(&mut self) -> redis::RedisResult<Option<Vec<(String, u16)>>> {
        self.nodes(false).await
    }

    /// The masters of a cluster (`CLUSTER SLOTS`), and their replicas when `replicas`,
    /// each once; `None` for one server.
    async fn nodes(&mut self, replicas: bool) -> redis::RedisResult<Option<Vec<(String, u16)>>> {
        let Self::Cluster(cluster) = self else {
            return Ok(None);
        };
        let slots: Vec<Value> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut cluster.inner())
            .await?;
        let mut nodes = Vec::new();
        for range in slots {
            // [start, end, [host, port, id, …], replicas…]
            let Value::Array(parts) = range else { continue };
            let last = if replicas { parts.len() } else { 3 };
            for node in parts.iter().take(last).skip(2) {
                let Value::Array(node) = node else { continue };
                let (Some(host), Some(port)) = (node.first(), node.get(1)) else {
                    continue;
                };
                let host: String = redis::from_redis_value_ref(host)?;
                let port: u16 = redis::from_redis_value_ref(port)?;
                if !nodes.contains(&(host.clone(), port)) {
                    nodes.push((host, port));
                }
            }
        }
        Ok(Some(nodes))
    }
}

/// How a node reaches its server(s).
pub(crate) enum Endpoint {
    /// One server.
    Server(Client),
    /// The master the sentinels name.
    Sentinel(Sentinels),
    /// A Redis Cluster.
    Cluster(Cluster),
}

/// A cluster: the cluster client for commands, and a client per seed node for pub/sub.
pub(crate) struct Cluster {
    client: ClusterClient,
    seeds: Vec<(Arc<str>, Client)>,
    /// The connect timeout: the bound of a whole cluster connect.
    connect_timeout: Duration,
    /// The response timeout: the budget of one request with its re-sends.
    response_timeout: Duration,
}

impl Endpoint {
    /// The endpoint `config` names. No network I/O; with TLS, the certificate files are
    /// read here.
    pub(crate) fn new(config: &RedisConfig, backend: &'static str) -> dlock_core::Result<Self> {
        let client = |config: &RedisConfig| super::client_for(config, backend);
        Ok(match &config.topology {
            Topology::Server => Self::Server(client(config)?),
            Topology::Sentinel(sentinel) => {
                Self::Sentinel(Sentinels::new(config, sentinel, backend)?)
            }
            Topology::Cluster { seeds } => {
                let seeds: Vec<(Arc<str>, Client)> = seeds
                    .iter()
                    .map(|host| {
                        let at = RedisConfig {
                            topology: Topology::Server,
                            ..config.at(host.name.clone(), host.port)
                        };
                        Ok((Arc::from(host.to_string()), client(&at)?))
                    })
                    .collect::<dlock_core::Result<_>>()?;
                let client = cluster_client(config, &seeds, backend)?;
                Self::Cluster(Cluster {
                    client,
                    seeds,
                    connect_timeout: config.connect_timeout,
                    response_timeout: config.response_timeout,
                })
            }
        })
    }

    /// Open a command connection and load the scripts: to the server, to the master the
    /// sentinels name now (checked with `ROLE`), or to the cluster (scripts loaded on every
    /// node that answers, best effort: see [`load_everywhere`]).
    pub(crate) async fn open(
        &self,
        addr: &Arc<str>,
        config: &AsyncConnectionConfig,
    ) -> Result<Connection, Error> {
        match self {
            Self::Server(client) => {
                let mut conn = client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
                    .map_err(|e| Error::redis("connect", addr, e))?;
                load_scripts(&mut conn, addr).await?;
                Ok(Connection::Server(conn))
            }
            Self::Sentinel(sentinels) => {
                let (_, master, mut conn) = sentinels.master(addr, config).await?;
                load_scripts(&mut conn, &master).await?;
                Ok(Connection::Server(conn))
            }
            Self::Cluster(cluster) => {
                let started = tokio::time::Instant::now();
                let conn = cluster
                    .client
                    .get_async_connection()
                    .await
                    .map_err(|e| Error::redis("connect", addr, refusal(e)))?;
                let conn = Connection::Cluster(ClusterCommands::new(
                    conn,
                    cluster.client.clone(),
                    cluster.connect_timeout,
                    cluster.response_timeout,
                ));
                // Best effort, node by node, so that a node that is down or hangs delays
                // nothing else: a node that lacks a script answers NOSCRIPT once, and the
                // call sends it as EVAL there (see `ClusterCommands`). Loading goes on in
                // the background after half the response timeout, or half what is left of
                // the connect timeout if that is less.
                let left = cluster.connect_timeout.saturating_sub(started.elapsed());
                let loading = tokio::spawn(load_everywhere(conn.clone(), addr.clone()));
                let _ = tokio::time::timeout((cluster.response_timeout / 2).min(left / 2), loading)
                    .await;
                Ok(conn)
            }
        }
    }

    /// Open a pub/sub connection: to the server, to the master the sentinels name now, or
    /// to the first seed node of a cluster that answers (a cluster sends every `PUBLISH`
    /// to all its nodes). Each attempt is bounded by `limit` shared among the candidates.
    pub(crate) async fn pubsub(
        &self,
        addr: &Arc<str>,
        config: &AsyncConnectionConfig,
        limit: Duration,
    ) -> Result<PubSub, Error> {
        let open = |client: Client, addr: Arc<str>, limit: Duration| async move {
            match tokio::time::timeout(limit, client.get_async_pubsub()).await {
                Ok(Ok(pubsub)) => Ok(pubsub),
                Ok(Err(e)) => Err(Error::redis("subscribe", &addr, e)),
                Err(_) => Err(Error::timed_out("subscribe", &addr, limit)),
            }
        };
        match self {
            Self::Server(client) => open(client.clone(), addr.clone(), limit).await,
            Self::Sentinel(sentinels) => {
                let started = tokio::time::Instant::now();
                let (client, master, _) = sentinels.master(addr, config).await?;
                let left = limit.saturating_sub(started.elapsed()).max(MIN_ATTEMPT);
                open(client, master, left).await
            }
            Self::Cluster(cluster) => {
                let each = share(limit, cluster.seeds.len());
                let mut last = None;
                for (seed, client) in &cluster.seeds {
                    match open(client.clone(), seed.clone(), each).await {
                        Ok(pubsub) => return Ok(pubsub),
                        Err(e) => {
                            tracing::debug!(seed = %seed, error = %e, "seed node not usable for pub/sub");
                            last = Some(e);
                        }
                    }
                }
                Err(last.unwrap_or_else(|| {
                    Error::closed("subscribe", addr, "the cluster has no seed node")
                }))
            }
        }
    }

    /// Whether commands go to a cluster (keys must then be split by hash slot).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

/// A failed first connect to a cluster comes as an I/O error with the nodes' error in
/// its text only: when that says the credentials were refused, the error says so (a
/// refusal, not a server that could not be reached).
fn refusal(e: redis::RedisError) -> redis::RedisError {
    let refused = e.kind() == redis::ErrorKind::Io
        && e.detail().is_some_and(|detail| {
            ["AuthenticationFailed", "WRONGPASS", "NOPERM", "NOAUTH"]
                .iter()
                .any(|word| detail.contains(word))
        });
    if refused {
        redis::RedisError::from((
            redis::ErrorKind::AuthenticationFailed,
            "the cluster's nodes refused the credentials",
        ))
    } else {
        e
    }
}

/// The least time one of several candidates (sentinels, seed nodes) gets.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);

/// `limit` shared among `n` candidates, so that a black-holed first one leaves time for
/// the others.
fn share(limit: Duration, n: usize) -> Duration {
    let n = u32::try_from(n.max(1)).unwrap_or(u32::MAX);
    (limit / n).max(MIN_ATTEMPT)
}

/// Load every script on every node of a cluster (its masters and replicas, from
/// `CLUSTER SLOTS`), each node on its own: a node that fails or hangs only misses them.
async fn load_everywhere(mut conn: Connection, addr: Arc<str>) {
    let nodes = match conn.nodes(true).await {
        Ok(Some(nodes)) => nodes,
        Ok(None) => return,
        Err(e) => {
            tracing::debug!(cluster = %addr, error = %e, "no node list to load the scripts on");
            return;
        }
    };
    let loads = nodes.into_iter().map(|(host, port)| {
        let mut conn = conn.clone();
        let addr = addr.clone();
        async move {
            let mut load = redis::pipe();
            for source in scripts::SOURCES {
                load.cmd("SCRIPT").arg("LOAD").arg(source);
            }
            let Connection::Cluster(cluster) = &mut conn else {
                return;
            };
            let route = SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port,
            };
            let count = scripts::SOURCES.len();
            if let Err(e) = cluster
                .inner()
                .route_pipeline(load, 0, count, route)
                .await
            {
                tracing::debug!(cluster = %addr, node = %format!("{host}:{port}"), error = %e, "could not load the scripts on a node");
            }
        }
    });
    futures::future::join_all(loads).await;
}

/// Load every script with one pipeline on a fresh connection to one server, then check
/// the server's version: before 6.2 the fence counter's `SET … GET` is a syntax error,
/// raised inside the acquire script after it took the key, so such a server is refused
/// here. A user that may not run `INFO` (an ACL without `@dangerous`) is trusted.
async fn load_scripts(conn: &mut MultiplexedConnection, addr: &Arc<str>) -> Result<(), Error> {
    let mut load = redis::pipe();
    for source in scripts::SOURCES {
        load.cmd("SCRIPT").arg("LOAD").arg(source);
    }
    load.query_async::<Vec<String>>(conn)
        .await
        .map_err(|e| Error::redis("connect", addr, e))?;
    let info = redis::cmd("INFO")
        .arg("server")
        .query_async::<String>(conn)
        .await;
    let version = match info {
        Ok(info) => redis_version(&info),
        // No permission to ask: trusted.
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => None,
        Err(e) => return Err(Error::redis("connect", addr, e)),
    };
    match version {
        Some((major, minor)) if (major, minor) < (6, 2) => Err(Error::Reply {
            op: "connect",
            addr: addr.clone(),
            reply: format!(
                "redis_version {major}.{minor}: dlock needs Redis 6.2 or later (SET … GET)"
            ),
        }),
        // No version named (a proxy, a fork): trusted.
        _ => Ok(()),
    }
}

/// `redis_version`'s major and minor number in an `INFO server` answer.
fn redis_version(info: &str) -> Option<(u32, u32)> {
    let version = info
        .lines()
        .find_map(|line| line.strip_prefix("redis_version:"))?;
    let mut parts = version.trim().split('.').map(str::parse::<u32>);
    Some((parts.next()?.ok()?, parts.next()?.ok()?))
}

/// The redis-rs cluster client for `config`'s seed nodes: the data nodes' credentials,
/// TLS settings and timeouts.
fn cluster_client(
    config: &RedisConfig,
    seeds: &[(Arc<str>, Client)],
    backend: &'static str,
) -> dlock_core::Result<ClusterClient> {
    let infos = seeds
        .iter()
        .map(|(_, client)| client.get_connection_info().clone());
    let mut builder = ClusterClientBuilder::new(infos)
        // redis-rs connects to every seed at once and waits for all of them: half the
        // connect timeout per node leaves the other half, within the whole connect's
        // bound, for the slot map and the scripts when one seed does not answer at all.
        .connection_timeout((config.connect_timeout / 2).max(MIN_ATTEMPT))
        .response_timeout(config.response_timeout)
        // No re-sends by redis-rs: it would send a request again after an I/O error, when
        // it may have run (a script must not run twice). `ClusterCommands` sends again
        // only after an answer that proves it did not run.
        .retries(0)
        .tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
    if !config.address_map.is_empty() {
        let node = |host: &dlock_core::raw::url::Host| {
            redis::cluster::NodeAddress::new(host.name.as_str(), host.port)
        };
        builder = builder.node_address_map(
            config
                .address_map
                .iter()
                .map(|(from, to)| (node(from), node(to)))
                .collect(),
        );
    }
    #[cfg(feature = "tls")]
    if config.tls
        && let Some(certificates) =
            crate::tls::certificates(config).map_err(|e| crate::config::named(backend, e))?
    {
        builder = builder.certs(certificates);
    }
    builder.build().map_err(|_| {
        dlock_core::LockError::invalid_config(backend, "the cluster's seed nodes are not usable")
    })
}

#[cfg(test)]
mod cluster_tests;

#[cfg(test)]
mod version_tests {
    use super::redis_version;

    #[test]
    fn the_version_is_read_from_info() {
        let info = "# Server\r\nredis_version:7.0.15\r\nredis_git_sha1:00000000\r\n";
        assert_eq!(redis_version(info), Some((7, 0)));
        assert_eq!(redis_version("redis_version:6.0.16\r\n"), Some((6, 0)));
        assert_eq!(redis_version("# Server\r\nvalkey_version:8.0.1\r\n"), None);
    }
}
