//! [`MysqlBackend`]: connecting, acquiring, releasing, renewing and noticing a lost session.
//!
//! Every acquire runs in a task of its own that owns its lock connection. The caller's future
//! only waits for the task's answer, so dropping it (or its deadline passing) never leaves a
//! statement half-read: the task notices, kills the waiting statement from a side connection
//! (`KILL QUERY`, then `KILL` for the whole session if that is not enough), undoes a grant
//! that raced the kill, and only then returns the connection to the pool.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant, Held};
use dlock_core::{Capabilities, Expiry, Fencing, LockError, LockStats, LostReason, Result, Wakeup};
use futures::{Future, StreamExt};
use sqlx::mysql::MySqlRow;
use sqlx::{Connection, Either, Executor, Row};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until, timeout};

use crate::NAME;
use crate::config::MysqlConfig;
use crate::error::Error;
use crate::pool::{Lent, Pool};
use crate::sql::{self, End, LOCK_WAIT_ROUND, Sql};

/// Connections for short side statements: fence counters, kills, clean-ups.
const SIDE_CONNECTIONS: u32 = 8;
/// How long a killed statement gets to answer before the next, stronger kill.
const KILL_GRACE: Duration = Duration::from_secs(1);
/// How often an acquire may start over (the row vanished under it because a releasing
/// client deleted it, or InnoDB picked it as a deadlock victim) before it gives up as a
/// server problem.
const MAX_RESTARTS: u32 = 100;

/// The MySQL / MariaDB backend: a row lock held in an open transaction.
///
/// Use it through [`MysqlLock`](crate::MysqlLock) (a [`LockClient`](dlock_core::raw::LockClient)
/// of this backend), made by [`from_url`](crate::from_url) or
/// [`MysqlBackend::connect`]. Cloning is cheap and shares the connections.
#[derive(Clone)]
pub struct MysqlBackend {
    inner: Arc<Inner>,
}

struct Inner {
    config: MysqlConfig,
    sql: Sql,
    /// Connections that hold or wait for a row lock.
    locks: Arc<Pool>,
    /// Connections for side statements.
    side: Arc<Pool>,
    wakeups: AtomicU64,
}

impl MysqlBackend {
    /// Connect to the server `config` names, create the lock tables if missing and check
    /// that existing ones are usable (InnoDB, a binary `name` column wide enough).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a bad config (before any network I/O) or an existing
    /// table of the wrong shape; [`LockError::Unavailable`] when the server cannot be reached
    /// within the connect timeout; [`LockError::Backend`] when it refuses (credentials,
    /// privileges, unknown database).
    pub async fn connect(config: MysqlConfig) -> Result<Self> {
        config.validate()?;
        let options = config.connect_options();
        let addr = config.addr();
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
            sql: Sql::new(&config.table),
            config,
            wakeups: AtomicU64::new(0),
        };
        inner.prepare_tables().await?;
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
            // A counter committed on its own after the grant; InnoDB keeps it durable.
            fencing: Fencing::Strict,
            // The session's idle timeout (ceil of the ttl, renewed by pings) ends a silent
            // holder.
            expiry: Expiry::Ttl,
            releases_on_disconnect: true,
            // The row-lock grant wakes exactly the waiter that gets the row.
            wakeup: Wakeup::Notification {
                one_per_release: true,
                max_per_waiter: 1,
            },
            // A restart frees every lock at once; holders hear it at their next ping (ttl/3),
            // which a quick restart can beat. The durable counter keeps tokens rising.
            faults: dlock_core::Faults {
                holder_paused: dlock_core::FaultSafety::Fenced,
                server_restart: dlock_core::FaultSafety::Fenced,
                ..Default::default()
            },
            ..Default::default()
        }
    }

    async fn acquire(&self, key: &str, ttl: Duration, deadline: Deadline) -> Result<Option<Grant>> {
        let (tx, rx) = oneshot::channel();
        let attempt = Attempt {
            inner: self.inner.clone(),
            key: key.to_owned(),
            name: sql::row_name(key),
            idle: sql::idle_seconds(ttl),
            deadline,
            reply: Reply(Some(tx)),
        };
        // Counted as clean-up: once the caller gives up, the task still stops the waiting
        // statement and tidies the connection.
        if !dlock_core::raw::spawn_cleanup(attempt.run()) {
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

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.inner.wakeups.load(Ordering::Relaxed))
    }
}

/// What a batch of statements did before it stopped.
#[derive(Debug, Default)]
struct Batch {
    /// Statements that completed.
    done: usize,
    rows: Vec<MySqlRow>,
    error: Option<Error>,
}

impl Batch {
    /// The batch ran to the end and its last statement returned a row (the lock).
    fn granted(&self) -> bool {
        self.error.is_none() && !self.rows.is_empty()
    }
}

/// Run `sql` (one or more statements) on `lent`, recording progress in `out` as it goes, so
/// a caller that stops waiting still knows which statements completed.
async fn run_into(lent: &mut Lent, sql: &str, op: &'static str, out: &mut Batch) {
    // A text query: several statements in one round trip.
    let mut results = lent.raw().fetch_many(sql);
    while let Some(item) = results.next().await {
        match item {
            Ok(Either::Left(_)) => out.done += 1,
            Ok(Either::Right(row)) => out.rows.push(row),
            Err(e) => {
                out.error = Some(Error::Sql { op, source: e });
                return;
            }
        }
    }
}

/// How an ending transaction went.
enum Finished {
    /// The `COMMIT` / `ROLLBACK` went through.
    Ended,
    /// It failed: the session is gone, or refused it.
    Failed(Error),
    /// No answer: whether it went through is unknown.
    Unknown(Error),
}

impl Inner {
    fn no_answer(&self, op: &'static str) -> Error {
        Error::NoAnswer {
            op,
            addr: self.config.addr(),
            after: self.config.response_timeout,
        }
    }

    /// Run `sql` on `lent` within the response timeout.
    async fn run(&self, lent: &mut Lent, sql: &str, op: &'static str) -> Batch {
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
    async fn side(&self, op: &'static str, sql: &str) -> Result<Vec<MySqlRow>, Error> {
        let mut replaced = false;
        loop {
            let mut lent = self.side.get().await?;
            let batch = self.run(&mut lent, sql, op).await;
            match batch.error {
                None => {
                    lent.give_back();
                    return Ok(batch.rows);
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

    /// Run `sql` (which ends any transaction) and return the connection to the pool if it
    /// went through; close it otherwise.
    async fn give_back_clean(&self, mut lent: Lent, sql: &str) {
        let batch = self.run(&mut lent, sql, "clean up").await;
        match batch.error {
            None => lent.give_back(),
            Some(e) => {
                tracing::debug!(error = %e, "closing a connection that could not be cleaned")
            }
        }
    }

    /// Create the tables if missing; refuse existing ones that cannot hold locks safely.
    async fn prepare_tables(&self) -> Result<()> {
        let mut tables = self.side("connect", &self.sql.describe_tables()).await?;
        if tables.len() < 2 {
            self.side("create tables", &self.sql.create_tables())
                .await?;
            tables = self.side("connect", &self.sql.describe_tables()).await?;
        }
        if tables.len() < 2 {
            return Err(LockError::backend(
                NAME,
                "create tables",
                format!(
                    "tables `{}` and `{}` are not visible after CREATE TABLE",
                    self.config.table,
                    self.config.fence_table()
                ),
            ));
        }
        for row in &tables {
            check_table(row).map_err(|problem| LockError::invalid_config(NAME, problem))?;
        }
        Ok(())
    }

    /// Take the next fencing token of `name`, recording `holder` as its holder. Autocommit:
    /// the token stays taken whatever happens to the holder.
    async fn next_fence(&self, name: &str, holder: u64) -> Result<u64, Error> {
        let rows = self
            .side("fence", &self.sql.next_fence(name, holder))
            .await?;
        let row = rows.first().ok_or(Error::Sql {
            op: "fence",
            source: sqlx::Error::RowNotFound,
        })?;
        row.try_get::<u64, _>(0).map_err(Error::sql("fence"))
    }

    /// End the lock transaction on `lent` and tidy up: restore the session, delete the row
    /// unless a waiter has it now, and return the connection to the pool.
    async fn finish(self: &Arc<Self>, mut lent: Lent, end: End, name: &str) -> Finished {
        let op = match end {
            End::Commit => "release",
            End::Rollback => "abandon",
        };
        let batch = self.run(&mut lent, &self.sql.finish(end, name), op).await;
        let ended = batch.done >= 1;
        tracing::debug!(id = lent.id(), name, ?end, done = batch.done, error = ?batch.error, "finish");
        match batch.error {
            None => {
                lent.give_back();
                Finished::Ended
            }
            // A waiter got the row at our COMMIT: end the clean-up's own transaction, in the
            // background (the caller's answer does not depend on it).
            Some(e) if ended && e.is_lock_busy() => {
                let inner = self.clone();
                dlock_core::raw::spawn_cleanup(async move {
                    inner.give_back_clean(lent, "ROLLBACK").await;
                });
                Finished::Ended
            }
            Some(e) if ended => {
                tracing::warn!(error = %e, "the key was released but its row was not cleaned up");
                Finished::Ended
            }
            Some(e @ Error::NoAnswer { .. }) => Finished::Unknown(e),
            Some(e) => Finished::Failed(e),
        }
    }

    /// Delete `name`'s row from a side connection unless someone holds it: after the session
    /// that held it ended without a release.
    async fn clean(&self, name: &str) {
        match self.side("clean up", &self.sql.clean(name)).await {
            Ok(_) => {}
            Err(e) if e.is_lock_busy() => {}
            Err(e) => tracing::debug!(error = %e, "could not clean up a lock row"),
        }
    }

    /// Stop the statement running on connection `id` so that it can never take the lock
    /// later, and wait (briefly) for `run` to see it end. `KILL QUERY` first, which keeps
    /// the session; then `KILL`, which ends it. Returns whether `run` finished.
    async fn interrupt<F>(&self, id: u64, mut run: Pin<&mut F>) -> bool
    where
        F: Future<Output = ()>,
    {
        let grace = KILL_GRACE.min(self.config.response_timeout);
        match self.side("kill", &format!("KILL QUERY {id}")).await {
            Ok(_) => {
                if timeout(grace, run.as_mut()).await.is_ok() {
                    return true;
                }
            }
            Err(e) => tracing::warn!(id, error = %e, "KILL QUERY failed"),
        }
        tracing::warn!(id, "the waiting statement did not stop; ending its session");
        if let Err(e) = self.side("kill", &format!("KILL {id}")).await {
            tracing::warn!(id, error = %e, "KILL failed; closing the connection instead");
            return false;
        }
        timeout(grace, run.as_mut()).await.is_ok()
    }

    /// The connection of a stopped statement: roll back, since the transaction may hold the
    /// row even when the statement reports the kill (InnoDB grants the row to the waiting
    /// transaction, then the statement sees the kill; statement rollback keeps the lock);
    /// then clean up the row and return the connection. A connection that was lost, or whose
    /// statement never answered, is closed: the server rolls its session back.
    async fn settle(self: &Arc<Self>, lent: Lent, late: Option<Batch>, name: &str) {
        match late {
            Some(Batch { error: Some(e), .. }) if e.is_connection_lost() => {}
            Some(_) => {
                let _ = self.finish(lent, End::Rollback, name).await;
            }
            None => {}
        }
    }
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

type Answer = Result<Option<Grant>>;

/// The way back to the caller of `acquire`, which may have gone away.
struct Reply(Option<oneshot::Sender<Answer>>);

impl Reply {
    /// Answer the caller (once). Returns the grant if nobody took it, so it can be released.
    fn send(&mut self, answer: Answer) -> Option<Grant> {
        let unclaimed = match self.0.take() {
            Some(tx) => tx.send(answer).err()?,
            None => answer,
        };
        unclaimed.ok().flatten()
    }

    /// Resolves when the caller dropped its `acquire` future.
    async fn gone(&mut self) {
        match &mut self.0 {
            Some(tx) => tx.closed().await,
            None => std::future::pending().await,
        }
    }
}

/// Why a running statement was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    /// The acquire's deadline passed.
    Deadline,
    /// The server stayed silent past the response timeout (or a lock wait round).
    Silent,
    /// The caller dropped the acquire future.
    CallerGone,
}

/// Where an acquire stands after a step.
enum Step {
    /// The row lock is ours.
    Granted,
    /// Another session holds the row; the transaction holds nothing.
    Busy,
    /// Start over: roll back (holding nothing) and try again.
    Restart,
    /// The idle connection taken from the pool was dead (nothing ran): take a new one.
    Replace,
    /// A statement was stopped on the server; see [`Inner::settle`].
    Stopped { why: Why, late: Option<Batch> },
    /// Anything else.
    Failed(Error),
}

enum Guarded {
    Done(Batch),
    /// Stopped before it answered; `late` is what it answered after the kill, if it did.
    Stopped {
        why: Why,
        late: Option<Batch>,
    },
}

/// One acquire, running in its own task.
struct Attempt {
    inner: Arc<Inner>,
    key: String,
    name: String,
    /// The holding session's idle timeout, in seconds.
    idle: u32,
    deadline: Deadline,
    reply: Reply,
}

impl Attempt {
    async fn run(mut self) {
        let answer = self.take().await;
        if let Some(grant) = self.reply.send(answer) {
            tracing::debug!(key = %self.key, "acquire abandoned after the grant; releasing");
            let mut held = grant.held;
            let _ = held.release().await;
        }
    }

    /// Take the key: step 1, then step 2 if it is busy and the deadline allows, starting
    /// over when the row vanished under us.
    async fn take(&mut self) -> Answer {
        // The deadline covers getting a connection too; past it, the wait ran out.
        let Some(lent) = self.deadline.run(self.inner.locks.get()).await else {
            return Ok(None);
        };
        let mut lent = lent?;
        for _ in 0..MAX_RESTARTS {
            let step = match self.try_take(&mut lent).await {
                Step::Busy if self.deadline.may_wait() => self.wait_take(&mut lent).await,
                step => step,
            };
            match step {
                Step::Granted => return self.granted(lent).await,
                Step::Busy => {
                    // Answer first; the roll-back only tidies the connection.
                    let _ = self.reply.send(Ok(None));
                    self.inner.give_back_clean(lent, Sql::rollback()).await;
                    return Ok(None);
                }
                Step::Restart => self.rollback(&mut lent).await?,
                Step::Replace => {
                    // An idle connection had died (server restart, idle timeout); the new
                    // one is fresh, so this happens once per acquire at most.
                    self.inner.locks.clear_idle();
                    lent = self.inner.locks.get().await?;
                }
                Step::Stopped { why, late } => {
                    let answer = match why {
                        Why::Deadline | Why::CallerGone => Ok(None),
                        Why::Silent => Err(self.inner.no_answer("acquire").into()),
                    };
                    // Answer at once, then put the connection right.
                    let _ = self.reply.send(answer);
                    self.inner.settle(lent, late, &self.name).await;
                    return Ok(None);
                }
                Step::Failed(e) => return Err(e.into()),
            }
        }
        Err(LockError::backend(
            NAME,
            "acquire",
            "the lock row kept vanishing under the acquire",
        ))
    }

    /// Step 1: create the row if missing, and lock it without waiting.
    async fn try_take(&mut self, lent: &mut Lent) -> Step {
        let sql = self.inner.sql.try_take(&self.name, self.idle);
        let silent = Instant::now() + self.inner.config.response_timeout;
        let batch = match self.guarded(lent, &sql, None, silent).await {
            Guarded::Done(batch) => batch,
            // The insert waited behind a holder (it raced the row's creation and locking):
            // stopped, it leaves no transaction behind, and the key is busy.
            Guarded::Stopped {
                why: Why::Silent,
                late: Some(late),
            } if late.error.as_ref().is_some_and(Error::is_interrupted) => return Step::Busy,
            Guarded::Stopped { why, late } => return Step::Stopped { why, late },
        };
        match batch.error {
            None if batch.granted() => Step::Granted,
            // A releasing client deleted the row between our insert and our lock.
            None => Step::Restart,
            Some(e) if e.is_lock_busy() => Step::Busy,
            // Another client created the row at the same moment: it exists now.
            Some(e) if e.is_duplicate() || e.is_deadlock() => Step::Restart,
            Some(e) if e.is_connection_lost() && lent.reused && batch.done == 0 => Step::Replace,
            Some(e) => Step::Failed(e),
        }
    }

    /// Step 2: wait for the row, woken by the server's grant, until the deadline.
    async fn wait_take(&mut self, lent: &mut Lent) -> Step {
        let deadline = match self.deadline {
            Deadline::At(at) => Some(at),
            Deadline::TryOnce | Deadline::Never => None,
        };
        loop {
            let sql = self.inner.sql.wait_take(&self.name, self.idle);
            let silent = Instant::now()
                + Duration::from_secs(LOCK_WAIT_ROUND.into())
                + self.inner.config.response_timeout;
            let batch = match self.guarded(lent, &sql, deadline, silent).await {
                Guarded::Done(batch) => batch,
                Guarded::Stopped { why, late } => return Step::Stopped { why, late },
            };
            // The locking read ran (after `SET` and `BEGIN`) and the server woke it.
            if batch.done >= 2 && batch.error.as_ref().is_none_or(Error::is_lock_busy) {
                self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
            }
            match batch.error {
                None if batch.granted() => return Step::Granted,
                // A releasing client deleted the row while we waited on it.
                None => return Step::Restart,
                // A lock wait round ran out: wait again, if the deadline allows.
                Some(e) if e.is_lock_busy() && self.deadline.may_wait() => {}
                Some(e) if e.is_lock_busy() => return Step::Busy,
                Some(e) if e.is_deadlock() => return Step::Restart,
                Some(e) => return Step::Failed(e),
            }
        }
    }

    /// Run `sql` on `lent` until it answers, the deadline passes, the server stays silent
    /// until `silent`, or the caller goes away; in the last three cases stop it on the
    /// server before returning.
    async fn guarded(
        &mut self,
        lent: &mut Lent,
        sql: &str,
        deadline: Option<Instant>,
        silent: Instant,
    ) -> Guarded {
        let id = lent.id();
        let inner = &self.inner;
        let reply = &mut self.reply;
        let mut batch = Batch::default();
        let (why, finished) = {
            let run = run_into(lent, sql, "acquire", &mut batch);
            tokio::pin!(run);
            let why = tokio::select! {
                biased;
                () = &mut run => None,
                () = sleep_until_some(deadline) => Some(Why::Deadline),
                () = sleep_until(silent) => Some(Why::Silent),
                () = reply.gone() => Some(Why::CallerGone),
            };
            match why {
                None => (None, true),
                Some(why) => (Some(why), inner.interrupt(id, run.as_mut()).await),
            }
        };
        tracing::debug!(id, ?why, finished, done = batch.done, rows = batch.rows.len(), error = ?batch.error, "guarded");
        match why {
            None => Guarded::Done(batch),
            Some(why) => Guarded::Stopped {
                why,
                late: finished.then_some(batch),
            },
        }
    }

    /// Roll back a transaction that holds nothing, keeping the connection.
    async fn rollback(&self, lent: &mut Lent) -> Result<()> {
        let batch = self.inner.run(lent, "ROLLBACK", "acquire").await;
        batch.error.map_or(Ok(()), |e| Err(e.into()))
    }

    /// The row is ours: take a fencing token, then prove the session still holds the row
    /// after the token was committed (so a later holder's token is larger), which also
    /// restarts the session's idle clock from a known instant.
    async fn granted(&mut self, mut lent: Lent) -> Answer {
        let token = match self.inner.next_fence(&self.name, lent.id()).await {
            Ok(token) => token,
            Err(e) => {
                let _ = self.inner.finish(lent, End::Rollback, &self.name).await;
                return Err(e.into());
            }
        };
        let sent_at = Instant::now();
        let batch = self
            .inner
            .run(&mut lent, &Sql::keep(self.idle), "acquire")
            .await;
        if let Some(e) = batch.error {
            // The session ended (or went silent) since the grant: the lock is gone, or will
            // be when the server ends the session.
            self.inner.clean(&self.name).await;
            return Err(e.into());
        }
        let held = MysqlHeld {
            inner: self.inner.clone(),
            key: self.key.clone(),
            name: self.name.clone(),
            conn: Some(lent),
            idle: self.idle,
            in_flight: false,
        };
        Ok(Some(Grant::new(token, Box::new(held), sent_at)))
    }
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// A held row lock: the connection whose open transaction holds it.
struct MysqlHeld {
    inner: Arc<Inner>,
    key: String,
    name: String,
    /// `None` once released, or once the connection failed.
    conn: Option<Lent>,
    /// The session's idle timeout, in seconds.
    idle: u32,
    /// A call was in flight; if it was dropped there, the connection cannot be trusted.
    in_flight: bool,
}

impl MysqlHeld {
    fn not_held(&self, why: impl fmt::Display) -> LockError {
        LockError::NotHeld {
            backend: NAME,
            key: self.key.clone(),
            reason: LostReason::SessionEnded(why.to_string()),
        }
    }

    /// The holding connection, unless it failed or a call on it was interrupted.
    fn conn(&mut self) -> Option<&mut Lent> {
        if self.in_flight {
            self.in_flight = false;
            self.conn = None;
        }
        self.conn.as_mut()
    }
}

impl fmt::Debug for MysqlHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MysqlHeld")
            .field("key", &self.key)
            .field("connection_id", &self.conn.as_ref().map(Lent::id))
            .field("idle", &self.idle)
            .finish()
    }
}

#[async_trait]
impl Held for MysqlHeld {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let idle = sql::idle_seconds(ttl);
        let same = idle == self.idle;
        let response_timeout = self.inner.config.response_timeout;
        if self.conn().is_none() {
            return Err(self.not_held("the holding connection is closed"));
        }
        self.in_flight = true;
        let inner = &self.inner;
        let lent = self.conn.as_mut().expect("checked above");
        let outcome = if same {
            match timeout(response_timeout, lent.raw().ping()).await {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(Error::Sql {
                    op: "extend",
                    source: e,
                }),
                Err(_) => Some(inner.no_answer("extend")),
            }
        } else {
            inner.run(lent, &Sql::keep(idle), "extend").await.error
        };
        self.in_flight = false;
        match outcome {
            None => {
                self.idle = idle;
                Ok(())
            }
            Some(e) => {
                // The connection is gone or cannot be trusted: so is the lock.
                self.conn = None;
                Err(self.not_held(e))
            }
        }
    }

    async fn release(&mut self) -> Result<()> {
        let lent = self.conn().is_some().then(|| self.conn.take()).flatten();
        let Some(lent) = lent else {
            self.inner.clean(&self.name).await;
            return Err(self.not_held("the holding connection was closed"));
        };
        match self.inner.finish(lent, End::Commit, &self.name).await {
            Finished::Ended => Ok(()),
            Finished::Failed(e) => {
                self.inner.clean(&self.name).await;
                Err(self.not_held(e))
            }
            Finished::Unknown(e) => Err(e.into()),
        }
    }
}

impl Drop for MysqlHeld {
    fn drop(&mut self) {
        let Some(lent) = self.conn.take().filter(|_| !self.in_flight) else {
            return;
        };
        // Not released: roll back in the background if there is a runtime; otherwise the
        // closed connection makes the server roll back.
        let (inner, name) = (self.inner.clone(), std::mem::take(&mut self.name));
        dlock_core::raw::spawn_cleanup(async move {
            let _ = inner.finish(lent, End::Rollback, &name).await;
        });
    }
}
