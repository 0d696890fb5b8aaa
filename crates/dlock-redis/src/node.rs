//! One Redis server as the lock protocol sees it: a shared command connection that is
//! reopened on demand, the lock operations as single script calls, and a subscriber for
//! release announcements.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use dlock_core::{LockError, Result};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use redis::aio::MultiplexedConnection;
use redis::io::tcp::TcpSettings;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, FromRedisValue,
    IntoConnectionInfo, RedisConnectionInfo, ScriptInvocation,
};
use tokio::sync::mpsc;

use crate::config::{RedisConfig, Topology, named};
use crate::error::Error;

use crate::renew::Renewals;
use crate::subscriber::{Notice, Subscriber, Subscription};

mod calls;
mod endpoint;
pub(crate) use calls::queue_keys;
pub use calls::{Attempt, Queueing};
pub(crate) use endpoint::Endpoint;
pub use endpoint::{ClusterCommands, Connection};

/// A connection being opened (or open), shared by every caller that needs it meanwhile.
pub(crate) type Connecting<T> = Shared<BoxFuture<'static, Result<T, Error>>>;

/// One Redis server. Cheap to clone; clones share the connections.
///
/// Requests go over one multiplexed connection, opened on first use and reopened after it
/// broke or timed out (a black-holed connection is dropped rather than waited on). Every
/// request is bounded: opening by the connect timeout, each answer by the response timeout.
#[derive(Clone)]
pub struct Node {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    addr: Arc<str>,
    endpoint: Arc<Endpoint>,
    connect_timeout: Duration,
    connection_config: AsyncConnectionConfig,
    slot: Mutex<Slot>,
    subscriber: Subscriber,
    pub(crate) renewals: Renewals,
    /// Whether the Sentinel watch (see [`endpoint::watch_switches`]) was started.
    watching: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
struct Slot {
    id: u64,
    conn: Option<Connecting<Connection>>,
}

impl Node {
    /// A node for the server `config` names. No network I/O; with TLS, the `ca`, `cert` and
    /// `key` files are read here, and rustls's process-default crypto provider is set to
    /// `ring` unless one is installed already (see the crate docs, *TLS*).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] (naming `backend`) for options
    /// [`RedisConfig::validate`] refuses, a TLS file that cannot be read or used, or TLS when
    /// the `tls` feature is off.
    pub fn new(config: &RedisConfig, backend: &'static str) -> Result<Self> {
        config.validate().map_err(|e| named(backend, e))?;
        let endpoint = Arc::new(Endpoint::new(config, backend)?);
        let addr: Arc<str> = Arc::from(describe(config));
        let connection_config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(Some(config.response_timeout));
        Ok(Self {
            inner: Arc::new(Inner {
                subscriber: Subscriber::new(
                    endpoint.clone(),
                    addr.clone(),
                    connection_config.clone(),
                    config.connect_timeout,
                    config.response_timeout,
                ),
                addr,
                endpoint,
                connect_timeout: config.connect_timeout,
                connection_config,
                slot: Mutex::default(),
                renewals: Renewals::default(),
                watching: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// The server, `host:port`; for Sentinel `master NAME via` the sentinels, for a cluster
    /// `cluster` and its seed nodes.
    pub fn addr(&self) -> &str {
        &self.inner.addr
    }

    /// Open the command connection now (it is otherwise opened on first use): checks the
    /// address, the credentials, that the server speaks Redis, and loads the scripts.
    ///
    /// # Errors
    /// As the operations: unreachable is `Unavailable`, a refusal `Backend`.
    pub async fn connect(&self) -> Result<(), Error> {
        self.connection().await.map(|_| ())
    }

    /// Subscribe to a release channel; returns once the server confirmed the subscription,
    /// so no release announced afterwards is missed. Announcements go to `notices`, tagged
    /// with `tag` (the node's index among the caller's nodes).
    ///
    /// # Errors
    /// The subscriber connection could not be opened or did not confirm in time.
    pub async fn subscribe(
        &self,
        channel: &str,
        tag: usize,
        notices: mpsc::Sender<Notice>,
    ) -> Result<Subscription, Error> {
        self.inner.subscriber.subscribe(channel, tag, notices).await
    }

    async fn flag(&self, op: &'static str, call: &ScriptInvocation<'_>) -> Result<bool, Error> {
        match self.invoke::<i64>(op, call).await? {
            1 => Ok(true),
            0 => Ok(false),
            other => Err(self.reply(op, other)),
        }
    }

    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        op: &'static str,
        call: &ScriptInvocation<'_>,
    ) -> Result<T, Error> {
        let (id, mut conn) = self.connection().await?;
        let mut answer = call.invoke_async(&mut conn).await;
        // `invoke_async` loads a script the server lacks and runs it again; a second
        // `SCRIPT FLUSH` between the two (an operator's, a test's) answers NOSCRIPT once
        // more. The script did not run: try once more.
        if let Err(e) = &answer
            && e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        {
            answer = call.invoke_async(&mut conn).await;
        }
        answer.map_err(|e| self.failure(op, id, e))
    }

    /// The error for a failed request on connection `id`; a broken connection is dropped,
    /// so the next request opens a new one. Never a cluster's: one node's failure says
    /// nothing about the others, and redis-rs reconnects to that node by itself.
    pub(crate) fn failure(&self, op: &'static str, id: u64, e: redis::RedisError) -> Error {
        let e = Error::redis(op, &self.inner.addr, e);
        if e.breaks_connection() && !self.is_cluster() {
            self.drop_connection(id);
        }
        e
    }

    /// The command connection itself, for tools and test harnesses that need commands this
    /// crate does not wrap (`DEL`, `CLIENT KILL`, …). One server's (or the master's, with
    /// Sentinel); a cluster has none: see [`command_connection`](Self::command_connection).
    ///
    /// # Errors
    /// The connection could not be opened, or the node is a cluster.
    pub async fn raw_connection(&self) -> Result<MultiplexedConnection, Error> {
        match self.connection().await? {
            (_, Connection::Server(conn)) => Ok(conn),
            (_, Connection::Cluster(_)) => Err(Error::Reply {
                op: "connect",
                addr: self.inner.addr.clone(),
                reply: "a cluster has no single command connection (see command_connection)".into(),
            }),
        }
    }

    /// The command connection, whatever the topology: commands on a cluster's are routed
    /// by their keys.
    ///
    /// # Errors
    /// The connection could not be opened.
    pub async fn command_connection(&self) -> Result<Connection, Error> {
        self.connection().await.map(|(_, conn)| conn)
    }

    /// Whether this node is a Redis Cluster (keys of one request must share a hash slot).
    pub fn is_cluster(&self) -> bool {
        self.inner.endpoint.is_cluster()
    }

    /// The keys whose names start with `prefix` (a `SCAN`, so it does not block the server),
    /// e.g. the lock keys under a key prefix.
    ///
    /// # Errors
    /// The server could not be reached or refused.
    pub async fn keys_with_prefix(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let mut glob = String::with_capacity(prefix.len() + 1);
        for c in prefix.chars() {
            if "*?[]\\".contains(c) {
                glob.push('\\');
            }
            glob.push(c);
        }
        glob.push('*');
        self.keys_matching(&glob).await
    }

    /// The keys whose names match the `SCAN` pattern `glob` (`*`, `?`, `[…]`, `\`
    /// escapes), on every master of a cluster.
    ///
    /// # Errors
    /// The server could not be reached or refused.
    pub async fn keys_matching(&self, glob: &str) -> Result<Vec<String>, Error> {
        let (id, mut conn) = self.connection().await?;
        let masters = conn
            .masters()
            .await
            .map_err(|e| self.failure("scan", id, e))?;
        let mut keys = Vec::new();
        match masters {
            None => self.scan(id, &mut conn, glob, None, &mut keys).await?,
            Some(masters) => {
                for (host, port) in &masters {
                    self.scan(id, &mut conn, glob, Some((host, *port)), &mut keys)
                        .await?;
                }
            }
        }
        Ok(keys)
    }

    /// `SCAN` one server (on a cluster, the master at `host:port`) for the names matching
    /// `glob`, adding them to `keys`.
    async fn scan(
        &self,
        id: u64,
        conn: &mut Connection,
        glob: &str,
        node: Option<(&str, u16)>,
        keys: &mut Vec<String>,
    ) -> Result<(), Error> {
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor)
                .arg("MATCH")
                .arg(glob)
                .arg("COUNT")
                .arg(1000);
            let reply = match node {
                Some((host, port)) => conn.on_node(cmd, host, port).await,
                None => cmd.query_async(conn).await,
            };
            let (next, batch): (u64, Vec<String>) = reply
                .and_then(|v| redis::from_redis_value(v).map_err(Into::into))
                .map_err(|e| self.failure("scan", id, e))?;
            keys.extend(batch);
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// The error for a request to this node that got no answer within `after`.
    pub fn timed_out(&self, op: &'static str, after: Duration) -> Error {
        Error::timed_out(op, &self.inner.addr, after)
    }

    pub(crate) fn reply(&self, op: &'static str, reply: impl std::fmt::Debug) -> Error {
        Error::Reply {
            op,
            addr: self.inner.addr.clone(),
            reply: format!("{reply:?}"),
        }
    }

    /// The command connection, opening it if there is none or the last attempt failed.
    pub(crate) async fn connection(&self) -> Result<(u64, Connection), Error> {
        let (id, connecting) = {
            let mut slot = self.slot();
            let usable = slot
                .conn
                .as_ref()
                .is_some_and(|c| !matches!(c.peek(), Some(Err(_))));
            if !usable {
                slot.id += 1;
                slot.conn = Some(self.open().boxed().shared());
                self.watch();
            }
            (slot.id, slot.conn.clone().expect("just set"))
        };
        connecting.await.map(|conn| (id, conn))
    }

    /// With Sentinel, start (once, from a runtime) the task that hears the sentinels
    /// announce a new master and then drops this node's connections.
    fn watch(&self) {
        use std::sync::atomic::Ordering;
        if let Endpoint::Sentinel(sentinels) = &*self.inner.endpoint
            && !self.inner.watching.swap(true, Ordering::SeqCst)
        {
            tokio::spawn(endpoint::watch_switches(
                sentinels.watch(),
                self.inner.addr.clone(),
                self.inner_weak(),
            ));
        }
    }

    /// Drop the command connection and the subscriber connection (the master changed):
    /// the next request asks the sentinels again, and waiters subscribe again.
    pub(crate) fn reset_connections(&self) {
        tracing::debug!(server = %self.inner.addr, "the master changed: reconnecting");
        self.slot().conn = None;
        self.inner.subscriber.reset();
    }

    /// Forget connection `id` (if it is still the current one), so the next call reopens.
    fn drop_connection(&self, id: u64) {
        let mut slot = self.slot();
        if slot.id == id {
            tracing::debug!(server = %self.inner.addr, "dropping a broken connection");
            slot.conn = None;
        }
    }

    fn open(&self) -> impl Future<Output = Result<Connection, Error>> + Send + 'static {
        let endpoint = self.inner.endpoint.clone();
        let config = self.inner.connection_config.clone();
        let addr = self.inner.addr.clone();
        let limit = self.inner.connect_timeout;
        async move {
            match tokio::time::timeout(limit, endpoint.open(&addr, &config)).await {
                Ok(result) => result,
                Err(_) => Err(Error::timed_out("connect", &addr, limit)),
            }
        }
    }

    pub(crate) fn inner(&self) -> &Inner {
        &self.inner
    }

    pub(crate) fn inner_weak(&self) -> Weak<Inner> {
        Arc::downgrade(&self.inner)
    }

    pub(crate) fn from_inner(inner: Arc<Inner>) -> Self {
        Self { inner }
    }

    fn slot(&self) -> MutexGuard<'_, Slot> {
        self.inner
            .slot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// How errors and logs name the server(s) of `config` (never with credentials): `host:port`,
/// `master NAME via host:port,…` or `cluster host:port,…`.
fn describe(config: &RedisConfig) -> String {
    let list = |hosts: &[dlock_core::raw::url::Host]| {
        hosts
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    match &config.topology {
        Topology::Server => config.addr(),
        Topology::Sentinel(sentinel) => {
            format!(
                "master {} via {}",
                sentinel.master,
                list(&sentinel.sentinels)
            )
        }
        Topology::Cluster { seeds } => format!("cluster {}", list(seeds)),
    }
}

/// The redis-rs client of the one server `config` names (its host and port; for Sentinel
/// and a cluster, each sentinel's, seed's or master's in turn).
pub(crate) fn client_for(config: &RedisConfig, backend: &'static str) -> Result<Client> {
    let addr = if config.tls {
        if !cfg!(feature = "tls") {
            return Err(LockError::invalid_config(
                backend,
                "TLS URLs need the `tls` feature of dlock-redis",
            ));
        }
        ConnectionAddr::TcpTls {
            host: config.host.clone(),
            port: config.port,
            insecure: false,
            tls_params: None,
        }
    } else {
        ConnectionAddr::Tcp(config.host.clone(), config.port)
    };
    let mut redis_info = RedisConnectionInfo::default().set_db(config.db);
    if let Some(user) = &config.username {
        redis_info = redis_info.set_username(user);
    }
    if let Some(password) = &config.password {
        redis_info = redis_info.set_password(password.expose());
    }
    let info: ConnectionInfo = addr
        .into_connection_info()
        .map_err(|e| LockError::InvalidConfig {
            backend,
            message: "the server address is not usable".into(),
            source: Some(Box::new(e)),
        })?
        .set_redis_settings(redis_info)
        .set_tcp_settings(TcpSettings::default().set_nodelay(true));
    client(config, info, backend)
}

/// The redis-rs client for `info`; with TLS, after making sure rustls has a crypto
/// provider, and with the certificates the `ca`, `cert` and `key` options name.
fn client(config: &RedisConfig, info: ConnectionInfo, backend: &'static str) -> Result<Client> {
    let unusable = |e: redis::RedisError| LockError::InvalidConfig {
        backend,
        message: "the server address is not usable".into(),
        source: Some(Box::new(e)),
    };
    #[cfg(feature = "tls")]
    if config.tls {
        dlock_core::raw::install_crypto_provider();
        if let Some(certificates) =
            crate::tls::certificates(config).map_err(|e| named(backend, e))?
        {
            // The files were checked with the parser redis-rs uses, so this does not fail;
            // if it did, its error is not kept: a PEM error may quote a line of the key.
            return Client::build_with_tls(info, certificates).map_err(|_| {
                LockError::invalid_config(backend, "the TLS certificates are not usable")
            });
        }
    }
    #[cfg(not(feature = "tls"))]
    let _ = config;
    Client::open(info).map_err(unusable)
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}
