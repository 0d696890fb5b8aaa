//! Where a [`Node`](super::Node)'s connections go: one server, the master a group of
//! sentinels names (asked again on every connect), or a Redis Cluster (redis-rs's cluster
//! connection for commands, any reachable seed node for pub/sub).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection, PubSub};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{AsyncConnectionConfig, Client, Cmd, Pipeline, RedisFuture, Value};

use crate::config::{RedisConfig, Topology};
use crate::error::Error;
use crate::scripts;

mod sentinel;
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

/// The command side of a Redis Cluster: redis-rs's cluster connection (one multiplexed
/// connection per node, reconnected per node), with redis-rs's own retries off. A request
/// is sent again only after an answer that proves it did not run (`MOVED`, `TRYAGAIN`,
/// `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, no connection to send it on), after a short
/// growing pause, within the response timeout; an I/O error or a timeout is returned as it
/// is (the outcome is unknown: a script must not run twice). Two answers are followed at
/// once instead:
/// - `ASK` (the key's slot is being migrated and the key is not on the source yet): the
///   request goes to the node named, after `ASKING`, both in one write on that node's
///   connection so that nothing else can take the `ASKING`;
/// - `NOSCRIPT` (a promoted replica, a restart): a script's `EVALSHA` is sent again as
///   `EVAL` to the same node, which runs it and caches it there.
///
/// A request that gets no answer at all (a master that hangs or is cut off without a
/// reset: redis-rs would keep routing its slots to it, as no answer ever says `MOVED`)
/// has the connection replaced in the background by a fresh one, with a fresh slot map,
/// at most once a second: once the cluster has promoted the lost master's
/// replica, requests go there.
#[derive(Clone)]
pub struct ClusterCommands {
    shared: Arc<Remapped>,
    /// How long one request may take with its re-sends (the response timeout).
    budget: Duration,
}

/// The cluster connection in use, and what replaces it.
struct Remapped {
    conn: std::sync::Mutex<ClusterConnection>,
    client: ClusterClient,
    /// Bounds a replacement connection's connect.
    connect_timeout: Duration,
    /// Whether a replacement is being made (or the pause after one is running).
    remapping: AtomicBool,
}

impl std::fmt::Debug for ClusterCommands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCommands")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// The least time between two replacements of a cluster connection.
pub(crate) const REMAP_PAUSE: Duration = Duration::from_secs(1);

impl ClusterCommands {
    /// redis-rs's cluster connection in use now (no re-sends, no `ASK` or `NOSCRIPT`
    /// handling); a clone, sharing its node connections.
    pub fn inner(&self) -> ClusterConnection {
        self.shared
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replace the connection in use by a fresh one in the background, unless one is being
    /// made or was made less than [`REMAP_PAUSE`] ago.
    fn remap(&self) {
        if self.shared.remapping.swap(true, Ordering::SeqCst) {
            return;
        }
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let fresh =
                tokio::time::timeout(shared.connect_timeout, shared.client.get_async_connection())
                    .await;
            match fresh {
                Ok(Ok(conn)) => {
                    tracing::debug!(
                        "a cluster request got no answer: a fresh cluster connection (and slot map) is in use"
                    );
                    *shared.conn.lock().unwrap_or_else(PoisonError::into_inner) = conn;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "a cluster request got no answer; no fresh cluster connection either");
                }
                Err(_) => {
                    tracing::debug!(
                        "a cluster request got no answer; no fresh cluster connection within the connect timeout"
                    );
                }
            }
            tokio::time::sleep(REMAP_PAUSE).await;
            shared.remapping.store(false, Ordering::SeqCst);
        });
    }

    /// Send `cmd`, again as long as the answer proves it did not run, to the node an `ASK`
    /// names, and as `EVAL` after a `NOSCRIPT` (see the type's docs).
    async fn request(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let started = tokio::time::Instant::now();
        let mut pause = FIRST_PAUSE;
        let mut eval: Option<Cmd> = None;
        let mut asked: Option<SingleNodeRoutingInfo> = None;
        loop {
            let left = self.budget.saturating_sub(started.elapsed());
            let sending = eval.as_ref().unwrap_or(cmd);
            let mut conn = self.inner();
            let send = async {
                match asked.take() {
                    Some(node) => {
                        let mut pipe = redis::pipe();
                        pipe.cmd("ASKING").add_command(sending.clone());
                        let mut answers = conn.route_pipeline(pipe, 1, 1, node).await?;
                        answers.pop().ok_or_else(|| {
                            redis::RedisError::from((
                                redis::ErrorKind::Parse,
                                "no answer after ASKING",
                            ))
                        })
                    }
                    None => conn.req_packed_command(sending).await,
                }
            };
            let answer = match tokio::time::timeout(left, send).await {
                Ok(answer) => answer,
                Err(_) => {
                    self.remap();
                    return Err(timed_out());
                }
            };
            let error = match answer {
                Ok(Value::ServerError(e)) => redis::RedisError::from(e),
                Err(e) => e,
                ok => return ok,
            };
            match classify(&error) {
                Resend::ToAsked => match asked_node(&error) {
                    Some(node) if started.elapsed() < self.budget => {
                        tracing::debug!(error = %error, "the key's slot is being migrated: asking the node named");
                        asked = Some(node);
                    }
                    _ => return Err(still_redirected(error, self.budget)),
                },
                Resend::AsEval if eval.is_none() => match as_eval(cmd) {
                    Some(e) => {
                        tracing::debug!("a cluster node lacks a script: sending it as EVAL");
                        eval = Some(e);
                    }
                    None => return Err(error),
                },
                Resend::AfterPause if started.elapsed() + pause < self.budget => {
                    tracing::debug!(error = %error, "the cluster did not run a request: sending it again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                Resend::AfterPause => return Err(still_redirected(error, self.budget)),
                _ => {
                    if error.is_timeout() {
                        self.remap();
                    }
                    return Err(error);
                }
            }
        }
    }
}

/// The node an `ASK` answer names.
fn asked_node(error: &redis::RedisError) -> Option<SingleNodeRoutingInfo> {
    let (addr, _slot) = error.redirect_node()?;
    let (host, port) = addr.rsplit_once(':')?;
    Some(SingleNodeRoutingInfo::ByAddress {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        port: port.parse().ok()?,
    })
}

/// The error for a request that the cluster still redirected (`MOVED`, `ASK`) when its
/// budget ran out: unavailable, like a timeout (a single server that answers `MOVED` is
/// another matter: a misconfiguration, left as the server's error).
fn still_redirected(error: redis::RedisError, budget: Duration) -> redis::RedisError {
    use redis::{ErrorKind, ServerErrorKind};
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the cluster still redirected the request after {budget:?}: {error}"),
        )
        .into(),
        _ => error,
    }
}

/// The first pause before a request the cluster did not run is sent again; each next
/// pause doubles, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between re-sends.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// What to do after a cluster answered a request with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// The answer proves the request did not run (a `MOVED`, a slot being migrated or
    /// without a master, a node loading its data, no connection to send it on): send it
    /// again after a pause.
    AfterPause,
    /// `ASK`: the request did not run; send it to the node named, after `ASKING`.
    ToAsked,
    /// `NOSCRIPT`: the script did not run; send it as `EVAL`.
    AsEval,
    /// It may have run (an I/O error, a timeout) or failed for good: return the error.
    Never,
}

/// How a cluster's error answer is handled (see [`Resend`]).
pub(crate) fn classify(error: &redis::RedisError) -> Resend {
    use redis::{ErrorKind, ServerErrorKind};
    match error.kind() {
        ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading,
        )
        | ErrorKind::ClusterConnectionNotFound => Resend::AfterPause,
        ErrorKind::Server(ServerErrorKind::Ask) => Resend::ToAsked,
        ErrorKind::Server(ServerErrorKind::NoScript) => Resend::AsEval,
        _ => Resend::Never,
    }
}

/// The error of a cluster request that got no answer within its budget.
fn timed_out() -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer from the cluster within the response timeout",
    )
    .into()
}

/// `EVALSHA sha n keys… args…` as `EVAL source n keys… args…`, for a script of this
/// crate; `None` for any other command.
fn as_eval(cmd: &Cmd) -> Option<Cmd> {
    let mut args = cmd.args_iter();
    let (Some(redis::Arg::Simple(name)), Some(redis::Arg::Simple(sha))) =
        (args.next(), args.next())
    else {
        return None;
    };
    if !name.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    let source = scripts::source_of(std::str::from_utf8(sha).ok()?)?;
    let mut eval = redis::cmd("EVAL");
    eval.arg(source);
    for arg in args {
        match arg {
            redis::Arg::Simple(arg) => eval.arg(arg),
            _ => return None,
        };
    }
    Some(eval)
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
                let conn = Connection::Cluster(ClusterCommands {
                    shared: Arc::new(Remapped {
                        conn: std::sync::Mutex::new(conn),
                        client: cluster.client.clone(),
                        connect_timeout: cluster.connect_timeout,
                        remapping: AtomicBool::new(false),
                    }),
                    budget: cluster.response_timeout,
                });
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

/// Load every script with one pipeline on a fresh connection to one server.
async fn load_scripts(conn: &mut MultiplexedConnection, addr: &Arc<str>) -> Result<(), Error> {
    let mut load = redis::pipe();
    for source in scripts::SOURCES {
        load.cmd("SCRIPT").arg("LOAD").arg(source);
    }
    load.query_async::<Vec<String>>(conn)
        .await
        .map_err(|e| Error::redis("connect", addr, e))?;
    Ok(())
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
