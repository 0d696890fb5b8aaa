//! [`PostgresBackend`]: connecting (a pool of lock connections and one of side
//! connections), preparing the key table, mapping keys to lock ids, and running statements.
//!
//! An acquire tries first in the caller's task and waits in a task of its own (`acquire`);
//! a granted lock is held by a holder connection (`session`, run by
//! `dlock_core::raw::carrier`), which renews, notices a lost session and releases.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant};
use dlock_core::{
    Capabilities, Expiry, Fencing, Inspection, KeyStatus, Leader, LockError, LockOptions,
    LockStats, Mode, Observe, Reentry, Result, WaiterView, Wakeup,
};
use futures::TryFutureExt;
use futures::stream::BoxStream;
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::sync::oneshot;
use tokio::time::timeout;

use crate::NAME;
use crate::acquire::{Attempt, First};
use crate::config::PostgresConfig;
use crate::error::Error;
use crate::permits::PermitWaits;
use crate::pool::{Lent, Pool, run_raw};
use crate::session::PgSession;
use crate::sql::{Param, Sql, Statement};
use dlock_core::raw::carrier::Carriers;

/// Connections for short side statements: id look-ups, cancels.
const SIDE_CONNECTIONS: u32 = 8;
/// Holder connections of one ttl that concurrent takes may open before they queue on a
/// busy one: a holder connection runs one statement at a time.
const BUSY_CARRIERS: usize = 8;
/// Most key → id mappings kept in memory; past it the cache starts over.
const MAX_CACHED_IDS: usize = 100_000;

/// The PostgreSQL backend: a session-level advisory lock, many per holder connection.
///
/// Use it through [`PostgresLock`](crate::PostgresLock) (a
/// [`LockClient`](dlock_core::raw::LockClient) of this backend), made by
/// [`from_url`](crate::from_url) or [`PostgresBackend::connect`]. Cloning is cheap and shares
/// the connections.
#[derive(Clone)]
pub struct PostgresBackend {
    inner: Arc<Inner>,
    /// Shared by the clones: when the last one goes, so do the idle holder connections.
    _open: Arc<Open>,
}

/// The user's handle on a client's connections. `Inner` outlives it while holder
/// connections run (they point back to it), so the handle, not `Inner`, says when the
/// client is gone.
struct Open(Arc<Inner>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.carriers.close_idle();
    }
}

pub(crate) struct Inner {
    pub(crate) config: PostgresConfig,
    pub(crate) sql: Sql,
    /// Connections that hold or wait for a lock.
    pub(crate) locks: Arc<Pool>,
    /// Connections for side statements.
    pub(crate) side: Arc<Pool>,
    /// Key → lock id; a mapping never changes once made.
    ids: Mutex<HashMap<String, i32>>,
    pub(crate) wakeups: AtomicU64,
    /// Holder connections, each carrying many holds.
    pub(crate) carriers: Carriers<PgSession>,
    /// Waiters for permits and the listener that wakes them.
    pub(crate) permit_waits: PermitWaits,
    /// Election observers and the listener that wakes them.
    pub(crate) leader_waits: PermitWaits,
    /// The election table exists (made at connect when missing, if the role may).
    pub(crate) elections: AtomicBool,
    /// This client's reentrant holds whose lock it holds (see `crate::reentry`).
    pub(crate) anchors: crate::reentry::Anchors,
    /// First clients that keep a reentrant hold for other clients' leases, and the listener
    /// that tells them its count reached zero.
    pub(crate) owner_waits: PermitWaits,
    /// The owner table exists (made at connect when missing, if the role may).
    pub(crate) reentry: AtomicBool,
}

impl PostgresBackend {
    /// Connect to the server `config` names and create the key table and its sequences if
    /// missing.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad config (before any network I/O; a TLS file
    /// that cannot be read counts); [`LockError::Unavailable`] when the server cannot be
    /// reached within the connect timeout; [`LockError::Backend`] when it refuses
    /// (credentials, privileges, unknown database, a failed TLS check).
    ///
    /// Logs one warning when a password would go to a remote server that is not verified.
    pub async fn connect(config: PostgresConfig) -> Result<Self> {
        config.validate()?;
        config.check_tls_files()?;
        // sqlx builds its rustls configuration from the process-default crypto provider when
        // it verifies: make sure there is one (never a panic).
        dlock_core::raw::install_crypto_provider();
        let options = config.connect_options()?;
        let addr = config.addr();
        if config.login_exposed() {
            tracing::warn!(
                server = %addr,
                sslmode = config.ssl_mode()?.name(),
                "the PostgreSQL password goes to a remote server that is not verified (set \
                 sslmode=verify-full and sslrootcert to verify it)"
            );
        }
        let sql = Sql::new(&config.table, config.namespace);
        let inner = Inner {
            locks: Pool::new(
                "lock",
                options.clone(),
                addr.clone(),
                config.connect_timeout,
                config.max_connections,
            ),
            side: Pool::new(
                "side",
                options,
                addr,
                config.connect_timeout,
                SIDE_CONNECTIONS,
            ),
            config,
            ids: Mutex::new(HashMap::new()),
            wakeups: AtomicU64::new(0),
            carriers: Carriers::new(NAME).open_while_busy(BUSY_CARRIERS).linger(),
            permit_waits: PermitWaits::new(sql.permit_channel()),
            leader_waits: PermitWaits::new(sql.leader_channel()),
            elections: AtomicBool::new(false),
            anchors: crate::reentry::Anchors::default(),
            owner_waits: PermitWaits::new(sql.owner_channel()),
            reentry: AtomicBool::new(false),
            sql,
        };
        inner.prepare().await?;
        let elections = inner.prepare_elections().await;
        inner.elections.store(elections, Ordering::Relaxed);
        let reentry = inner.prepare_owners().await;
        inner.reentry.store(reentry, Ordering::Relaxed);
        let inner = Arc::new(inner);
        Ok(Self {
            _open: Arc::new(Open(inner.clone())),
            inner,
        })
    }

    /// The configuration this backend was made from.
    pub fn config(&self) -> &PostgresConfig {
        &self.inner.config
    }
}

impl fmt::Debug for PostgresBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresBackend")
            .field("config", &self.inner.config)
            .field("wakeups", &self.inner.wakeups.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Backend for PostgresBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // The lock manager queues waiters in order, but a wait of more than a round
            // (60 s) re-queues at the back, and nothing in the docs promises the order.
            fair: false,
            // A sequence: nextval never hands out a value twice, even after a rollback or a
            // crash (the commit is flushed before the holder hears of the token).
            fencing: Fencing::Strict,
            // The holding session's idle_session_timeout is the ttl, renewed by pings.
            expiry: Expiry::Ttl,
            releases_on_disconnect: true,
            // The lock manager grants the lock to one waiter per release (to each of the
            // readers a release admits together: every wake-up is a grant).
            wakeup: Wakeup::Notification {
                one_per_release: true,
                max_per_waiter: 1,
            },
            max_key_len: 1024,
            faults: dlock_core::Faults {
                holder_paused: dlock_core::FaultSafety::Fenced,
                server_restart: dlock_core::FaultSafety::Fenced,
                // A late (slow, lossy) link frees no key early: the server holds it while
                // the session lives, and the session's idle clock (`idle_session_timeout`)
                // restarts when a ping arrives, never before the client sent it; the
                // holder counts its lease from that sending, so it gives up first.
                slow_link: dlock_core::FaultSafety::Exclusive,
                ..Default::default()
            },
            // pg_advisory_lock_shared on the same lock: the lock manager keeps readers and
            // writers apart and queues a reader behind a waiting writer.
            shared: true,
            // N slot locks per key; a permit is the first free one (see the crate docs).
            permits: true,
            inspect: Inspection {
                // Every session's application_name (dlock's: the holder's NAME@HOST:PID),
                // which pg_stat_activity shows every role.
                who: true,
                // Waits in the server's lock queue show in pg_locks, with when each began
                // (waitstart); a semaphore's waiters wait in their clients and are not
                // shown (waiters: None).
                waiters: WaiterView::Queue,
                // Key names are in the key table: pg_locks' ids joined with it.
                list: true,
            },
            // The grant, the proclaim and the release notify the key's observers (LISTEN);
            // a leader whose session ended notified nobody: seen at the next re-read.
            // Without the election table (the role could not create it), none.
            election: if self.inner.elections.load(Ordering::Relaxed) {
                Observe::Woken {
                    recheck: crate::election::RECHECK,
                }
            } else {
                Observe::Unsupported
            },
            // The count in a committed row of the owner table, the lock in the session of
            // the first client, which keeps it until the count is zero; when that session
            // ends the key frees whatever the count (see the crate docs, Reentrant holds).
            // Without the owner table (the role could not create it), none.
            reentrant: if self.inner.reentry.load(Ordering::Relaxed) {
                Reentry::FirstSession
            } else {
                Reentry::Unsupported
            },
            // max_held: none (the default): as many keys as memory allows, many per
            // holder connection; the server's lock table bounds all sessions together.
            ..Default::default()
        }
    }

    async fn acquire(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        let attempt = Attempt::new(self.inner.clone(), key, opts, deadline);
        self.take(attempt).await
    }

    async fn campaign(
        &self,
        key: &str,
        value: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.inner.check_elections("campaign")?;
        let attempt = Attempt::new(self.inner.clone(), key, opts, deadline).campaign(value);
        let Some(grant) = self.take(attempt).await? else {
            return Ok(None);
        };
        // The id is cached: the take looked it up.
        let id = self.inner.lock_id(key).await?;
        Ok(Some(crate::election::Elected::wrap(
            self.inner.clone(),
            key,
            id,
            grant,
        )))
    }

    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        self.inner.leader(key).await
    }

    async fn leader_changes(&self, key: &str) -> Result<Option<BoxStream<'static, Result<()>>>> {
        self.inner.leader_changes(key).await
    }

    async fn inspect(&self, key: &str) -> Result<KeyStatus> {
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.list(prefix).await
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.inner.wakeups.load(Ordering::Relaxed))
    }
}

impl PostgresBackend {
    /// Acquire (or campaign) as `attempt` says.
    async fn take(&self, attempt: Attempt) -> Result<Option<Grant>> {
        // The first try never waits on the server: it runs here. Only a wait gets a task.
        let id = match attempt.first().await {
            First::Answer(answer) => return answer,
            First::Busy(id) => id,
        };
        if let Mode::Permits(_) = id.mode {
            // A permit waiter holds nothing on the server: it waits here.
            return crate::permits::wait(&attempt, id).await;
        }
        let (tx, rx) = oneshot::channel();
        // Counted as clean-up: once the caller gives up, the task still cancels the waiting
        // statement and tidies the connection.
        if !dlock_core::raw::spawn_cleanup(attempt.wait(id, tx)) {
            return Err(LockError::backend(NAME, "acquire", "no tokio runtime"));
        }
        rx.await.unwrap_or_else(|_| {
            Err(LockError::backend(
                NAME,
                "acquire",
                "the acquire task ended without an answer",
            ))
        })
    }
}

impl Inner {
    pub(crate) fn no_answer(&self, op: &'static str) -> Error {
        Error::NoAnswer {
            op,
            addr: self.config.addr(),
            after: self.config.response_timeout,
        }
    }

    /// Run `sql` on `lent` within the response timeout.
    pub(crate) async fn run(
        &self,
        lent: &mut Lent,
        sql: &str,
        op: &'static str,
    ) -> Result<Vec<PgRow>, Error> {
        self.answered(run_raw(lent, sql, op), op).await
    }

    /// Run `statement` on `lent` within the response timeout.
    pub(crate) async fn run_statement(
        &self,
        lent: &mut Lent,
        statement: &Statement,
        op: &'static str,
    ) -> Result<Vec<PgRow>, Error> {
        let Statement::Prepared { text, params } = statement else {
            return self.run(lent, statement.text(), op).await;
        };
        let mut query = sqlx::query(text);
        for param in params {
            query = match param {
                Param::Int(value) => query.bind(*value),
                Param::BigInt(value) => query.bind(*value),
                Param::Text(value) => query.bind(value.as_str()),
            };
        }
        let rows = query.fetch_all(lent.raw()).map_err(Error::sql(op));
        self.answered(rows, op).await
    }

    /// `query`'s rows, or [`no_answer`](Self::no_answer) past the response timeout.
    async fn answered(
        &self,
        query: impl Future<Output = Result<Vec<PgRow>, Error>>,
        op: &'static str,
    ) -> Result<Vec<PgRow>, Error> {
        timeout(self.config.response_timeout, query)
            .await
            .unwrap_or_else(|_| Err(self.no_answer(op)))
    }

    /// Run `sql` on a side connection; with `bind`, as one statement with `$1` bound. An
    /// idle connection found dead is replaced once.
    pub(crate) async fn side(
        &self,
        op: &'static str,
        sql: &str,
        bind: Option<&str>,
    ) -> Result<Vec<PgRow>, Error> {
        self.side_query(op, SideQuery::Text(sql, bind)).await
    }

    /// [`side`](Self::side) for a [`Statement`] that changes a count (a prepared one is
    /// kept by the connection): sent again on a new connection only when the server had
    /// ended the idle one's session (it said so before reading the statement), never after
    /// a timeout or a broken connection, where it may have committed. A release counted
    /// twice would bring the count to zero while another lease of the hold is still out,
    /// and free the lock under it; a re-entry counted twice would keep the hold past its
    /// last release, until its entries' ttl.
    pub(crate) async fn side_statement(
        &self,
        op: &'static str,
        statement: &Statement,
    ) -> Result<Vec<PgRow>, Error> {
        self.side_query(op, SideQuery::Statement(statement)).await
    }

    async fn side_query(
        &self,
        op: &'static str,
        query: SideQuery<'_>,
    ) -> Result<Vec<PgRow>, Error> {
        let mut replaced = false;
        loop {
            let mut lent = self.side.get().await?;
            let reused = lent.reused;
            let result = match query {
                SideQuery::Text(sql, None) => self.run(&mut lent, sql, op).await,
                SideQuery::Text(sql, Some(value)) => {
                    // Not kept: some of these texts name a key's id or term.
                    let query = sqlx::query(sql).bind(value).persistent(false);
                    let rows = query.fetch_all(lent.raw()).map_err(Error::sql(op));
                    self.answered(rows, op).await
                }
                SideQuery::Statement(statement) => {
                    self.run_statement(&mut lent, statement, op).await
                }
            };
            match result {
                Ok(rows) => {
                    lent.give_back();
                    return Ok(rows);
                }
                Err(e) if reused && !replaced && query.may_resend(&e) => {
                    self.side.clear_idle();
                    replaced = true;
                }
                // The connection is dropped (closed): its state is unknown.
                Err(e) => return Err(e),
            }
        }
    }

    /// The lock id of `key`: from the cache, the table, or a new row (insert-if-missing).
    pub(crate) async fn lock_id(&self, key: &str) -> Result<i32, Error> {
        if let Some(id) = self.cached(key) {
            return Ok(id);
        }
        let lookup = self.sql.lookup();
        let mut rows = self.side("key id", &lookup, Some(key)).await?;
        if rows.is_empty() {
            match self.side("key id", &self.sql.insert(), Some(key)).await {
                Ok(inserted) => rows = inserted,
                Err(e) if e.is_duplicate() => {}
                Err(e) => return Err(e),
            }
            if rows.is_empty() {
                // Another client inserted it at the same moment: it exists now.
                rows = self.side("key id", &lookup, Some(key)).await?;
            }
        }
        let id: i32 = rows
            .first()
            .ok_or_else(|| Error::Unexpected {
                op: "key id",
                what: "the key's row is missing after its insert".into(),
            })?
            .try_get(0)
            .map_err(Error::sql("key id"))?;
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        if ids.len() >= MAX_CACHED_IDS {
            ids.clear();
        }
        ids.insert(key.to_owned(), id);
        Ok(id)
    }

    fn cached(&self, key: &str) -> Option<i32> {
        let ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        ids.get(key).copied()
    }

    /// Run `sql` (which leaves the session holding nothing) and return the connection to
    /// the pool if it went through; close it otherwise (the server then frees its locks).
    pub(crate) async fn give_back_clean(&self, mut lent: Lent, sql: &str) {
        match self.run(&mut lent, sql, "clean up").await {
            Ok(_) => lent.give_back(),
            Err(e) => tracing::debug!(error = %e, "closing a connection that could not be cleaned"),
        }
    }

    /// Create the key table and its sequences if missing.
    async fn prepare(&self) -> Result<()> {
        let exists = |rows: &[PgRow]| -> bool {
            rows.first()
                .and_then(|r| r.try_get::<Option<bool>, _>(0).ok().flatten())
                .unwrap_or(false)
        };
        if exists(&self.side("connect", &self.sql.exists(), None).await?) {
            return Ok(());
        }
        self.side("create table", &self.sql.create(), None).await?;
        if !exists(&self.side("connect", &self.sql.exists(), None).await?) {
            return Err(LockError::backend(
                NAME,
                "create table",
                format!(
                    "`{}` or its sequences are not visible after CREATE (check search_path)",
                    self.config.table
                ),
            ));
        }
        Ok(())
    }
}

/// What a side connection runs: text, with at most one text value bound to `$1`, or a
/// [`Statement`] that changes a count.
#[derive(Clone, Copy)]
enum SideQuery<'a> {
    Text(&'a str, Option<&'a str>),
    Statement(&'a Statement),
}

impl SideQuery<'_> {
    /// Whether, failed with `e` on a reused connection, it is sent again on a new one. A
    /// text is safe to repeat (a look-up, an insert-if-missing, a deadline set again); a
    /// count change only when it cannot have run.
    fn may_resend(&self, e: &Error) -> bool {
        match self {
            Self::Text(..) => e.is_connection_lost(),
            Self::Statement(_) => e.is_session_ended(),
        }
    }
}

#[cfg(test)]
#[path = "backend_tests.rs"]
mod tests;
