//! [`MysqlBackend`]: connecting (a pool of lock connections and one of side connections),
//! preparing the tables, and running statement batches on those connections.
//!
//! An acquire runs in a task of its own (`acquire`); the granted lock is a connection with an
//! open transaction (`held`), which renews, notices a lost session and releases.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant};
use dlock_core::{
    Capabilities, Expiry, Fencing, Inspection, KeyStatus, Leader, LockError, LockOptions,
    LockStats, Mode, Observe, Reentry, Result, WaiterView, Wakeup,
};
use futures::StreamExt;
use sqlx::mysql::MySqlRow;
use sqlx::{Either, Execute, Executor, MySql, Row};
use tokio::sync::oneshot;
use tokio::time::timeout;

use crate::NAME;
use crate::acquire::Attempt;
use crate::config::{LockMode, MysqlConfig};
use crate::election::OBSERVE_EVERY;
use crate::error::Error;
use crate::named::{NamedAttempt, NamedSession};
use crate::pool::{Lent, Pool};
use crate::reentry::Keepers;
use crate::sql::{self, Server, Sql, Tokens};
use dlock_core::raw::carrier::Carriers;

/// Connections for short side statements: fence counters, kills, clean-ups.
const SIDE_CONNECTIONS: u32 = 8;

/// The MySQL / MariaDB backend: a row lock held in an open transaction.
///
/// Use it through [`MysqlLock`](crate::MysqlLock) (a [`LockClient`](dlock_core::raw::LockClient)
/// of this backend), made by [`from_url`](crate::from_url) or
/// [`MysqlBackend::connect`]. Cloning is cheap and shares the connections.
#[derive(Clone)]
pub struct MysqlBackend {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: MysqlConfig,
    pub(crate) sql: Sql,
    /// Connections that hold or wait for a row lock.
    pub(crate) locks: Arc<Pool>,
    /// Connections for side statements.
    pub(crate) side: Arc<Pool>,
    pub(crate) wakeups: AtomicU64,
    /// Named mode's holder connections, each carrying many holds.
    pub(crate) carriers: Carriers<NamedSession>,
    /// The owners' holds this client took first (see `reentry`).
    pub(crate) keepers: Keepers,
}

impl MysqlBackend {
    /// Connect to the server `config` names, create the lock tables if missing and check
    /// that existing ones are usable (InnoDB, a binary `name` column wide enough).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad config (before any network I/O; TLS options
    /// that do not go together, or a TLS file that cannot be read, count) or an existing
    /// table of the wrong shape; [`LockError::Unavailable`] when the server cannot be reached
    /// within the connect timeout; [`LockError::Backend`] when it refuses (credentials,
    /// privileges, unknown database) or fails the TLS check the config asks for.
    ///
    /// Logs one warning when a password would go to a remote server that is not verified
    /// (see the crate docs' *Security*).
    pub async fn connect(config: MysqlConfig) -> Result<Self> {
        config.validate()?;
        config.check_tls_files()?;
        // sqlx builds its rustls configuration from the process-default crypto provider when
        // it verifies with a CA file: make sure there is one (never a panic).
        dlock_core::raw::install_crypto_provider();
        let options = config.connect_options()?;
        let addr = config.addr();
        if config.login_exposed() {
            // Once per client; the server's address only, never the user or the password.
            tracing::warn!(
                server = %addr,
                ssl_mode = config.ssl_mode()?.name(),
                "the MySQL password goes to a remote server that is not verified: whoever \
                 answers for it can obtain the password in clear (set \
                 ssl-mode=verify_identity and ssl-ca to verify it)"
            );
        }
        let (connect_timeout, max_connections) = (config.connect_timeout, config.max_connections);
        let locks = |autocommit| {
            let (options, addr) = (options.clone(), addr.clone());
            Pool::new(
                "lock",
                options,
                addr,
                connect_timeout,
                max_connections,
                autocommit,
            )
        };
        let mut inner = Inner {
            locks: locks(true),
            side: Pool::new(
                "side",
                options.clone(),
                addr.clone(),
                connect_timeout,
                SIDE_CONNECTIONS,
                true,
            ),
            sql: Sql::new(&config.table, Tokens::Counter, Server::MySql),
            config,
            wakeups: AtomicU64::new(0),
            carriers: Carriers::new(NAME),
            keepers: Keepers::default(),
        };
        let (tokens, server, returning) = inner.prepare_tables().await?;
        let mut sql = Sql::new(&inner.config.table, tokens, server).with_returning(returning);
        if inner.config.mode == LockMode::Row {
            sql = sql.with_prepared_take();
        }
        // No lock connection was opened yet (the tables are prepared on side connections):
        // they all start with the autocommit their statements expect.
        inner.locks = locks(!sql.autocommit_off());
        inner.sql = sql;
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// The configuration this backend was made from.
    pub fn config(&self) -> &MysqlConfig {
        &self.inner.config
    }
}

impl fmt::Debug for MysqlBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlBackend")
            .field("config", &self.inner.config)
            .field("wakeups", &self.inner.wakeups.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Backend for MysqlBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // InnoDB does not promise FIFO grants (MySQL 8 schedules by contention weight).
            fair: false,
            // Taken after the grant from a source that never goes back (MariaDB's sequence,
            // or a per-key counter committed on its own); InnoDB keeps it durable.
            fencing: Fencing::Strict,
            // The session's idle timeout (ceil of the ttl, renewed by pings) ends a silent
            // holder.
            expiry: Expiry::Ttl,
            releases_on_disconnect: true,
            // Row mode: InnoDB's shared row lock beside its exclusive one. Named locks
            // (`GET_LOCK`) have no shared form.
            shared: self.inner.config.mode == LockMode::Row,
            // Row mode: one exclusive row lock on a free slot row of the key. `GET_LOCK`
            // cannot wait for any one of N names.
            permits: self.inner.config.mode == LockMode::Row,
            // The row-lock grant wakes exactly the waiters that get the row: one writer, or
            // the readers one release admits together (each woken once, granted).
            wakeup: Wakeup::Notification {
                one_per_release: true,
                max_per_waiter: 1,
            },
            // A restart frees every lock at once; holders hear it at their next ping (ttl/3),
            // which a quick restart can beat. The durable counter keeps tokens rising.
            faults: dlock_core::Faults {
                holder_paused: dlock_core::FaultSafety::Fenced,
                server_restart: dlock_core::FaultSafety::Fenced,
                // A late (slow, lossy) link frees no key early: the server holds it while
                // the session lives, and the session's idle clock (`wait_timeout`)
                // restarts when a ping arrives, never before the client sent it; the
                // holder counts its lease from that sending, so it gives up first.
                slow_link: dlock_core::FaultSafety::Exclusive,
                ..Default::default()
            },
            // Row mode pins a connection per held key; named mode's holder connections
            // carry any number.
            max_held: match self.inner.config.mode {
                LockMode::Row => Some(self.inner.config.max_connections as usize),
                LockMode::Named => None,
            },
            // Row mode: each holding transaction's own uncommitted row in `{table}_held`
            // (read `READ UNCOMMITTED`) names it with its `holder_description`; named mode:
            // `IS_USED_LOCK` and the process list name the holding connection. Waiters in
            // both: the sessions whose running statement waits for the key (process
            // list), in no promised order. Held keys: the `{table}_held` rows (row mode),
            // the fence rows whose named lock is in use (named mode).
            inspect: Inspection {
                who: true,
                waiters: WaiterView::Listed,
                list: true,
            },
            // Both modes: the leader's value beside its hold (row mode: the hold's own
            // row; named mode: a row trusted while its connection holds the lock). No
            // server push, so observers read the leader every `OBSERVE_EVERY`.
            election: Observe::Polled {
                every: OBSERVE_EVERY,
            },
            // Both modes: the lock stays in the session of the client that took it first
            // (only that session can let it go), the owner and count in a committed row
            // beside it; that client keeps the session while other clients' leases count,
            // and its end frees the key whatever the count (see *Reentrant holds*).
            reentrant: Reentry::FirstSession,
            ..Default::default()
        }
    }

    async fn inspect(&self, key: &str) -> Result<KeyStatus> {
        Ok(self.inner.inspect(key).await?)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self.inner.list(prefix).await?)
    }

    async fn acquire(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.take(key, opts, deadline, None).await
    }

    async fn campaign(
        &self,
        key: &str,
        value: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.take(key, opts, deadline, Some(value)).await
    }

    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        Ok(self.inner.leader(key).await?)
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.inner.wakeups.load(Ordering::Relaxed))
    }
}

impl MysqlBackend {
    /// Acquire `key` (with `value`, as an election candidate publishing it).
    async fn take(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
        value: Option<&str>,
    ) -> Result<Option<Grant>> {
        let (tx, rx) = oneshot::channel();
        // Counted as clean-up: once the caller gives up, the task still stops the waiting
        // statement and tidies the connection. Row mode's first try runs here (see
        // `Attempt::run`), and only what may wait goes to a task.
        let spawned = match self.inner.config.mode {
            LockMode::Row => {
                Attempt::new(self.inner.clone(), key, opts, deadline, tx, value)
                    .run()
                    .await;
                true
            }
            // The core refuses shared and permit acquires where the capabilities say no;
            // never hand one to `GET_LOCK`, which would make it exclusive.
            LockMode::Named if opts.mode == Mode::Shared => {
                return Err(LockError::Unsupported {
                    backend: NAME,
                    what: "a shared hold in mode=named",
                });
            }
            LockMode::Named if opts.mode.permits().is_some() => {
                return Err(LockError::Unsupported {
                    backend: NAME,
                    what: "a permit (semaphore) hold in mode=named",
                });
            }
            LockMode::Named => {
                let attempt = NamedAttempt::new(self.inner.clone(), key, opts, deadline, tx, value);
                dlock_core::raw::spawn_cleanup(attempt.run())
            }
        };
        if !spawned {
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

/// What a batch of statements did before it stopped.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    /// Statements that completed.
    pub(crate) done: usize,
    pub(crate) rows: Vec<MySqlRow>,
    /// Rows the completed statements matched (sqlx asks for `CLIENT_FOUND_ROWS`, so an
    /// `UPDATE` that changes nothing still counts the rows it found).
    pub(crate) affected: u64,
    pub(crate) error: Option<Error>,
}

impl Batch {
    /// The batch ran to the end and its last statement returned a row (the lock).
    pub(crate) fn granted(&self) -> bool {
        self.error.is_none() && !self.rows.is_empty()
    }
}

/// Run `sql` (one or more statements) on `lent`, recording progress in `out` as it goes, so
/// a caller that stops waiting still knows which statements completed.
pub(crate) async fn run_into<'q, E>(lent: &mut Lent, sql: E, op: &'static str, out: &mut Batch)
where
    E: Execute<'q, MySql> + 'q,
{
    // A text query (several statements in one round trip), or a prepared statement.
    let mut results = lent.raw().fetch_many(sql);
    while let Some(item) = results.next().await {
        match item {
            Ok(Either::Left(done)) => {
                out.done += 1;
                out.affected += done.rows_affected();
            }
            Ok(Either::Right(row)) => out.rows.push(row),
            Err(e) => {
                out.error = Some(Error::Sql { op, source: e });
                return;
            }
        }
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
    pub(crate) async fn run(&self, lent: &mut Lent, sql: &str, op: &'static str) -> Batch {
        let mut batch = Batch::default();
        if timeout(
            self.config.response_timeout,
            run_into(lent, sql, op, &mut batch),
        )
        .await
        .is_err()
        {
            batch.error = Some(self.no_answer(op));
        }
        batch
    }

    /// Run a short batch on a side connection. An idle connection found dead is replaced
    /// once; a failed batch is rolled back before its connection goes back to the pool.
    pub(crate) async fn side(&self, op: &'static str, sql: &str) -> Result<Vec<MySqlRow>, Error> {
        Ok(self.side_batch(op, sql).await?.rows)
    }

    /// [`side`](Self::side), answering how many rows the batch's statements matched.
    pub(crate) async fn side_affected(&self, op: &'static str, sql: &str) -> Result<u64, Error> {
        Ok(self.side_batch(op, sql).await?.affected)
    }

    async fn side_batch(&self, op: &'static str, sql: &str) -> Result<Batch, Error> {
        let mut replaced = false;
        loop {
            let mut lent = self.side.get().await?;
            let mut batch = self.run(&mut lent, sql, op).await;
            match batch.error.take() {
                None => {
                    lent.give_back();
                    return Ok(batch);
                }
                Some(e) if e.is_connection_lost() => {
                    if lent.reused && batch.done == 0 && !replaced {
                        self.side.clear_idle();
                        replaced = true;
                        continue;
                    }
                    return Err(e);
                }
                Some(e) => {
                    self.give_back_clean(lent, Sql::rollback()).await;
                    return Err(e);
                }
            }
        }
    }

    /// Run `sql` (which ends any transaction and restores the default idle timeout) and
    /// return the connection to the pool if it went through; close it otherwise.
    pub(crate) async fn give_back_clean(&self, mut lent: Lent, sql: &str) {
        let batch = self.run(&mut lent, sql, "clean up").await;
        match batch.error {
            None => {
                lent.set_lease_idle(None);
                lent.give_back();
            }
            Some(e) => {
                tracing::debug!(error = %e, "closing a connection that could not be cleaned")
            }
        }
    }

    /// Create the tables (and on MariaDB the token sequence) if missing; refuse existing
    /// ones that cannot hold locks safely. Returns where tokens come from, and which server
    /// this is.
    /// The tables, ready; where tokens come from, which server it is, and whether it has
    /// `INSERT … RETURNING`.
    async fn prepare_tables(&self) -> Result<(Tokens, Server, bool)> {
        let mut tables = self.side("connect", &self.sql.describe_tables()).await?;
        // Tables of an older version may lack the permit slots, the holds or the
        // leaders' values: created here too.
        if tables.len() < 6 {
            self.side("create tables", &self.sql.create_tables())
                .await?;
            tables = self.side("connect", &self.sql.describe_tables()).await?;
        }
        if tables.len() < 6 {
            return Err(LockError::backend(
                NAME,
                "create tables",
                format!(
                    "tables `{}`, `{}`, `{}`, `{}`, `{}` and `{}` are not visible after CREATE TABLE",
                    self.config.table,
                    self.config.fence_table(),
                    self.config.slots_table(),
                    self.sql.held,
                    self.sql.value,
                    self.sql.owner
                ),
            ));
        }
        for row in &tables {
            check_table(row).map_err(|problem| LockError::invalid_config(NAME, problem))?;
        }
        let version = self
            .side("connect", "SELECT CAST(VERSION() AS CHAR)")
            .await?;
        let version: String = version
            .first()
            .and_then(|row| row.try_get(0).ok())
            .unwrap_or_default();
        let server = Server::of_version(&version);
        if !has_sequences(&version) {
            return Ok((Tokens::Counter, server, false));
        }
        if self
            .side("connect", &self.sql.find_sequence())
            .await?
            .is_empty()
        {
            let first = self
                .side("create sequence", &self.sql.first_token())
                .await?;
            let start: u64 = first
                .first()
                .and_then(|row| row.try_get(0).ok())
                .unwrap_or(1);
            self.side("create sequence", &self.sql.create_sequence(start))
                .await?;
            tracing::info!(
                sequence = self.sql.sequence(),
                start,
                "created the token sequence"
            );
        }
        Ok((Tokens::Sequence, server, has_returning(&version)))
    }
}

/// Whether the server `VERSION()` names has sequences: MariaDB from 10.3 (MySQL has none).
fn has_sequences(version: &str) -> bool {
    mariadb_from(version, (10, 3))
}

/// Whether the server `VERSION()` names has `INSERT … RETURNING`: MariaDB from 10.5.
fn has_returning(version: &str) -> bool {
    mariadb_from(version, (10, 5))
}

/// Whether `version` is MariaDB's, `major.minor` or later.
fn mariadb_from(version: &str, least: (u32, u32)) -> bool {
    if !version.contains("MariaDB") {
        return false;
    }
    let mut parts = version
        .split(['.', '-'])
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    (major, minor) >= least
}

/// Check one row of [`Sql::describe_tables`]: InnoDB, and a `name` column that compares
/// bytes (binary type or `_bin` collation) and is wide enough.
fn check_table(row: &MySqlRow) -> std::result::Result<(), String> {
    let text = |i: usize| -> String {
        row.try_get::<Option<String>, _>(i)
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    let (table, engine, data_type, collation) = (text(0), text(1), text(2), text(4));
    let width: Option<u64> = row.try_get(3).ok().flatten();
    if !engine.eq_ignore_ascii_case("InnoDB") {
        return Err(format!(
            "table `{table}` uses engine {engine:?}; row locks need InnoDB"
        ));
    }
    let binary = matches!(
        data_type.to_ascii_lowercase().as_str(),
        "varbinary" | "binary"
    ) || collation.to_ascii_lowercase().ends_with("_bin");
    if !binary || width.unwrap_or(0) < sql::NAME_WIDTH as u64 {
        return Err(format!(
            "table `{table}` has a `name` column of type {data_type}({}) collation {collation:?}; \
             lock names need VARBINARY({}) (a case-insensitive or narrower column would merge \
             different keys)",
            width.unwrap_or(0),
            sql::NAME_WIDTH
        ));
    }
    Ok(())
}

#[cfg(test)]
#[path = "backend_tests.rs"]
mod tests;
