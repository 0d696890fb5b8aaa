//! A small connection pool that knows each connection's server-side id.
//!
//! sqlx's pool pings a connection on every checkout and does not expose the connection id
//! that `KILL QUERY` needs; a lock connection is also special: it goes back to the pool only
//! in a known clean state (no transaction, default idle timeout), and is closed otherwise.
//! So the backend keeps its own: a stack of idle connections, a limit, and a connection id
//! for each. Dropping a [`Lent`] connection closes it (the server then rolls back whatever
//! its session held); only [`Lent::give_back`] returns it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlRow};
use sqlx::{ConnectOptions, Executor, Row};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, timeout};

use crate::error::Error;
use crate::sql::{LOCK_WAIT_ROUND, Sql};

/// How long an idle connection is kept, at most: a server may close it after its own
/// `wait_timeout`, and a connection found dead is replaced at the cost of one failed call.
const MAX_IDLE: Duration = Duration::from_secs(120);

/// One connection and its session id.
#[derive(Debug)]
pub(crate) struct Conn {
    raw: MySqlConnection,
    id: u64,
    /// The server closes the session after this much idle time, by default.
    server_idle: Duration,
    /// The `wait_timeout` row mode set on the session (whole seconds), when it is not the
    /// default: an acquire with the same one does not send it again.
    lease_idle: Option<u32>,
    /// The session's `innodb_lock_wait_timeout` (seconds); `None`: unknown (a batch that
    /// changed it stopped part-way).
    lock_wait: Option<u32>,
    /// The server refused to prepare a statement on it: it sends text batches only.
    text_only: bool,
    /// The permit creation lock (`GET_LOCK`) the session may hold: a creating batch that
    /// stopped before its release leaves it to the roll-back that ends the transaction
    /// (before a retry or a wait, or the connection's return to the pool).
    creation_lock: Option<String>,
}

impl Conn {
    /// How long the server lets the session idle now.
    fn idle_limit(&self) -> Duration {
        self.lease_idle
            .map_or(self.server_idle, |s| Duration::from_secs(s.into()))
    }
}

#[derive(Debug)]
struct Idle {
    conn: Conn,
    since: Instant,
}

/// Connections to one server, at most `limit` open at once.
pub(crate) struct Pool {
    name: &'static str,
    options: MySqlConnectOptions,
    addr: String,
    connect_timeout: Duration,
    limit: u32,
    /// Sessions run with `autocommit` on (the default) or off (see `Sql::with_prepared_take`).
    autocommit: bool,
    permits: Arc<Semaphore>,
    idle: Mutex<Vec<Idle>>,
}

/// A connection taken from the pool. Dropped, it is closed; [`give_back`](Lent::give_back)
/// returns it.
#[derive(Debug)]
pub(crate) struct Lent {
    conn: Option<Conn>,
    pool: Arc<Pool>,
    /// It had been used before (it may have died while idle).
    pub(crate) reused: bool,
    _permit: OwnedSemaphorePermit,
}

impl Pool {
    pub(crate) fn new(
        name: &'static str,
        options: MySqlConnectOptions,
        addr: String,
        connect_timeout: Duration,
        limit: u32,
        autocommit: bool,
    ) -> Arc<Self> {
        Arc::new(Self {
            name,
            options: options.disable_statement_logging(),
            addr,
            connect_timeout,
            limit,
            autocommit,
            permits: Arc::new(Semaphore::new(limit as usize)),
            idle: Mutex::new(Vec::new()),
        })
    }

    /// A connection: an idle one, or a new one. Waiting for a free slot and connecting are
    /// each bounded by the connect timeout.
    pub(crate) async fn get(self: &Arc<Self>) -> Result<Lent, Error> {
        let started = Instant::now();
        let no_answer = || Error::NoAnswer {
            op: "connect",
            addr: self.addr.clone(),
            after: self.connect_timeout,
        };
        let permit = timeout(self.connect_timeout, self.permits.clone().acquire_owned())
            .await
            .map_err(|_| Error::Exhausted {
                limit: self.limit,
                after: self.connect_timeout,
            })?
            .expect("the pool's semaphore is never closed");
        if let Some(conn) = self.pop_idle() {
            return Ok(Lent {
                conn: Some(conn),
                pool: self.clone(),
                reused: true,
                _permit: permit,
            });
        }
        let left = self.connect_timeout.saturating_sub(started.elapsed());
        let conn = timeout(left, self.connect())
            .await
            .map_err(|_| no_answer())??;
        Ok(Lent {
            conn: Some(conn),
            pool: self.clone(),
            reused: false,
            _permit: permit,
        })
    }

    async fn connect(&self) -> Result<Conn, Error> {
        let mut raw = self.options.connect().await.map_err(Error::connect)?;
        let rows: Vec<MySqlRow> = raw
            .fetch_all(Sql::session_setup(self.autocommit).as_str())
            .await
            .map_err(Error::sql("connect"))?;
        let row = rows.first().ok_or_else(|| Error::Sql {
            op: "connect",
            source: sqlx::Error::RowNotFound,
        })?;
        let id: u64 = row.try_get(0).map_err(Error::sql("connect"))?;
        let server_idle: u64 = row.try_get(1).map_err(Error::sql("connect"))?;
        tracing::debug!(pool = self.name, id, addr = %self.addr, "connected");
        Ok(Conn {
            raw,
            id,
            server_idle: Duration::from_secs(server_idle),
            lease_idle: None,
            lock_wait: Some(LOCK_WAIT_ROUND),
            text_only: false,
            creation_lock: None,
        })
    }

    fn pop_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(Idle { conn, since }) = idle.pop() {
            let keep = MAX_IDLE.min(conn.idle_limit().saturating_sub(Duration::from_secs(1)));
            if since.elapsed() < keep {
                return Some(conn);
            }
        }
        None
    }

    /// Close every idle connection: one was found dead, so the server probably restarted.
    pub(crate) fn clear_idle(&self) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }
}

impl std::fmt::Debug for Pool {
    // sqlx's connect options would show the password.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("name", &self.name)
            .field("addr", &self.addr)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Lent {
    /// The connection, for sqlx calls.
    pub(crate) fn raw(&mut self) -> &mut MySqlConnection {
        &mut self
            .conn
            .as_mut()
            .expect("a lent connection is present until given back")
            .raw
    }

    /// The server's id for this connection (`CONNECTION_ID()`), for `KILL`.
    pub(crate) fn id(&self) -> u64 {
        self.conn.as_ref().map_or(0, |c| c.id)
    }

    /// The session's `wait_timeout` as row mode last set it; `None`: the default (or
    /// unknown).
    pub(crate) fn lease_idle(&self) -> Option<u32> {
        self.conn.as_ref().and_then(|c| c.lease_idle)
    }

    /// Record the session's `wait_timeout` after a statement set it (`None`: restored to
    /// the default).
    pub(crate) fn set_lease_idle(&mut self, idle: Option<u32>) {
        if let Some(conn) = self.conn.as_mut() {
            conn.lease_idle = idle;
        }
    }

    /// The session's `innodb_lock_wait_timeout` as last set; `None`: unknown.
    pub(crate) fn lock_wait(&self) -> Option<u32> {
        self.conn.as_ref().and_then(|c| c.lock_wait)
    }

    /// Record the session's `innodb_lock_wait_timeout` (`None`: unknown).
    pub(crate) fn set_lock_wait(&mut self, seconds: Option<u32>) {
        if let Some(conn) = self.conn.as_mut() {
            conn.lock_wait = seconds;
        }
    }

    /// The permit creation lock the session may hold (see `Sql::permit_try`).
    pub(crate) fn creation_lock(&self) -> Option<&str> {
        self.conn.as_ref().and_then(|c| c.creation_lock.as_deref())
    }

    /// Record that the session may hold creation lock `name` (`None`: it holds none).
    pub(crate) fn set_creation_lock(&mut self, name: Option<String>) {
        if let Some(conn) = self.conn.as_mut() {
            conn.creation_lock = name;
        }
    }

    /// Whether the connection may prepare statements (the server has not refused one).
    pub(crate) fn prepares(&self) -> bool {
        self.conn.as_ref().is_some_and(|c| !c.text_only)
    }

    /// The server refused to prepare a statement on this connection: send text from now on.
    pub(crate) fn stop_preparing(&mut self) {
        if let Some(conn) = self.conn.as_mut() {
            conn.text_only = true;
        }
    }

    /// Return the connection to the pool. Only call when the session is clean: no open
    /// transaction, no statement in flight, and an idle timeout that is the default or the
    /// one [`Self::lease_idle`] records (the pool drops a connection idle for longer).
    pub(crate) fn give_back(mut self) {
        if let Some(conn) = self.conn.take() {
            let mut idle = self.pool.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.push(Idle {
                conn,
                since: Instant::now(),
            });
        }
    }
}
