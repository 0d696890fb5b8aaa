//! A small connection pool that knows each connection's backend pid.
//!
//! sqlx's pool pings a connection on every checkout and does not expose the backend pid
//! that `pg_cancel_backend` needs; a lock connection is also special: it goes back to the
//! pool only in a known clean state (no advisory lock, no idle timeout), and is closed
//! otherwise. So the backend keeps its own: a stack of idle connections, a limit, and a
//! pid for each. Dropping a [`Lent`] connection closes it (the server then frees whatever
//! its session held); only [`Lent::give_back`] returns it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::TryStreamExt;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgRow};
use sqlx::{ConnectOptions, Either, Executor, Row};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, timeout};

use crate::error::Error;
use crate::sql::Sql;

/// How long an idle connection is kept, at most: a server may close it after its own
/// idle timeout, and a connection found dead is replaced at the cost of one failed call.
const MAX_IDLE: Duration = Duration::from_secs(120);

/// One connection and its backend pid.
#[derive(Debug)]
pub(crate) struct Conn {
    raw: PgConnection,
    pid: i32,
}

#[derive(Debug)]
struct Idle {
    conn: Conn,
    since: Instant,
}

/// Connections to one server, at most `limit` open at once.
pub(crate) struct Pool {
    name: &'static str,
    options: PgConnectOptions,
    addr: String,
    connect_timeout: Duration,
    limit: u32,
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
        options: PgConnectOptions,
        addr: String,
        connect_timeout: Duration,
        limit: u32,
    ) -> Arc<Self> {
        Arc::new(Self {
            name,
            options: options.disable_statement_logging(),
            addr,
            connect_timeout,
            limit,
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
        let rows: Vec<PgRow> = raw
            .fetch_all(Sql::session_setup())
            .await
            .map_err(Error::sql("connect"))?;
        let row = rows.first().ok_or_else(|| Error::Sql {
            op: "connect",
            source: sqlx::Error::RowNotFound,
        })?;
        let pid: i32 = row.try_get(0).map_err(Error::sql("connect"))?;
        tracing::debug!(pool = self.name, pid, addr = %self.addr, "connected");
        Ok(Conn { raw, pid })
    }

    fn pop_idle(&self) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(Idle { conn, since }) = idle.pop() {
            if since.elapsed() < MAX_IDLE {
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
    pub(crate) fn raw(&mut self) -> &mut PgConnection {
        &mut self
            .conn
            .as_mut()
            .expect("a lent connection is present until given back")
            .raw
    }

    /// The server's process id for this connection (`pg_backend_pid()`), for
    /// `pg_cancel_backend`.
    pub(crate) fn pid(&self) -> i32 {
        self.conn.as_ref().map_or(0, |c| c.pid)
    }

    /// Replace the connection, found dead, by a new one (keeping this slot of the limit),
    /// within the connect timeout. The idle ones go too: the server probably restarted.
    pub(crate) async fn reconnect(&mut self) -> Result<(), Error> {
        self.conn = None;
        self.pool.clear_idle();
        let pool = &self.pool;
        let conn = timeout(pool.connect_timeout, pool.connect())
            .await
            .map_err(|_| Error::NoAnswer {
                op: "connect",
                addr: pool.addr.clone(),
                after: pool.connect_timeout,
            })??;
        self.conn = Some(conn);
        self.reused = false;
        Ok(())
    }

    /// Return the connection to the pool. Only call when the session is clean: no advisory
    /// lock, no statement in flight, no idle timeout.
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

/// Run `sql` (one or more statements, the simple query protocol) on `lent`: the rows.
pub(crate) async fn run_raw(
    lent: &mut Lent,
    sql: &str,
    op: &'static str,
) -> Result<Vec<PgRow>, Error> {
    lent.raw()
        .fetch_many(sql)
        .try_filter_map(|item| async move {
            Ok(match item {
                Either::Left(_) => None,
                Either::Right(row) => Some(row),
            })
        })
        .try_collect()
        .await
        .map_err(Error::sql(op))
}
