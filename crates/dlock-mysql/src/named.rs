//! Named-lock mode (`mode=named`): a key is a `GET_LOCK` name, held by a holder connection
//! that carries many of them ([`dlock_core::raw::carrier`]).
//!
//! A try-once acquire runs on a shared holder connection; a waiting one runs
//! `GET_LOCK(name, round)` on a connection of its own, which then carries the hold. Both
//! take the fencing token on the granting connection right after the grant, from the same
//! `{table}_fence` counters as row mode.

use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::carrier::{Afterwards, Failure, Granted, Session};
use dlock_core::raw::{Deadline, Grant};
use dlock_core::{LockOptions, Owner, Result};
use sha2::{Digest, Sha256};
use sqlx::{Connection, Row};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until, timeout};

use crate::acquire::{Reply, Why};
use crate::backend::{Batch, Inner, run_into};
use crate::election::NamedLeadership;
use crate::error::Error;
use crate::pool::Lent;
use crate::reentry::OWNER_ROUND;
use crate::sql::{self, LOCK_WAIT_ROUND, Sql, literal};
use crate::stop::sleep_until_some;

/// Longest `GET_LOCK` name MySQL 8 accepts.
const MAX_LOCK_NAME: usize = 64;
const PREFIX: &str = "dlock:";

/// The `GET_LOCK` name of a key: `dlock:` and the first 58 hex digits (232 bits) of the
/// SHA-256 of the table name, a NUL byte and the key's row name. Always 64 characters of
/// lower-case ASCII, so MySQL's length limit and case-insensitive names do not matter;
/// two keys (or one key under two tables) share a name only on a digest collision, about
/// n² / 2²³³ for n keys. Named locks are server-wide: the table in the digest keeps two
/// tables' keys apart.
pub(crate) fn lock_name(table: &str, row_name: &str) -> String {
    digest_name(PREFIX, table, row_name)
}

/// `prefix`, then hex digits of the SHA-256 of `table`, a NUL byte and `row_name`, up to
/// [`MAX_LOCK_NAME`] characters: a `GET_LOCK` name for one key of one table.
pub(crate) fn digest_name(prefix: &str, table: &str, row_name: &str) -> String {
    let mut hash = Sha256::new();
    hash.update(table.as_bytes());
    hash.update([0]);
    hash.update(row_name.as_bytes());
    let mut out = String::with_capacity(MAX_LOCK_NAME);
    out.push_str(prefix);
    for b in hash.finalize() {
        if out.len() + 2 > MAX_LOCK_NAME {
            break;
        }
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// A key in named mode: its lock name and its row name (for the fence counter), and an
/// election candidate's value.
#[derive(Debug, Clone)]
pub(crate) struct NamedLock {
    name: Arc<str>,
    row: Arc<str>,
    /// A campaign's value: its grant writes it in `{table}_value`, its release deletes it
    /// (see `election`).
    value: Option<Arc<str>>,
}

impl NamedLock {
    pub(crate) fn new(table: &str, key: &str, value: Option<&str>) -> Self {
        let row = sql::row_name(key);
        Self {
            name: lock_name(table, &row).into(),
            row: row.into(),
            value: value.map(Arc::from),
        }
    }

    /// The `GET_LOCK` name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The row name, in `{table}_fence` and `{table}_value`.
    pub(crate) fn row(&self) -> &str {
        &self.row
    }
}

/// A lock connection carrying named locks.
pub(crate) struct NamedSession {
    inner: Arc<Inner>,
    lent: Lent,
}

fn failure(e: Error) -> Failure {
    if e.is_connection_lost() {
        Failure::Session(e.into())
    } else {
        Failure::Request(e.into())
    }
}

/// The first column of the first row, as an integer (`None` for NULL).
fn first_int(batch: &Batch) -> Option<i64> {
    batch
        .rows
        .first()
        .and_then(|r| r.try_get::<Option<i64>, _>(0).ok().flatten())
}

impl NamedSession {
    async fn batch(&mut self, sql: &str, op: &'static str) -> Result<Batch, Failure> {
        let mut batch = self.inner.run(&mut self.lent, sql, op).await;
        match batch.error.take() {
            Some(e) => Err(failure(e)),
            None => Ok(batch),
        }
    }
}

impl Inner {
    /// On the connection that was just granted `lock`: its fencing token (autocommit: it
    /// stays taken whatever happens later), and the session's idle timeout. The grant came
    /// first, so a later holder's token is larger. A campaign's value row follows, with
    /// the token.
    async fn named_fence(
        &self,
        lent: &mut Lent,
        lock: &NamedLock,
        idle: u32,
    ) -> Result<u64, Error> {
        let mut sql = format!(
            "{};{}",
            Sql::keep(idle),
            self.sql.next_fence(&lock.row, lent.id())
        );
        if let Some(value) = &lock.value {
            sql.push(';');
            sql.push_str(&self.sql.record_value(&lock.row, value));
        }
        let mut batch = self.run(lent, &sql, "fence").await;
        if let Some(e) = batch.error.take() {
            return Err(e);
        }
        let row = batch.rows.first().ok_or(Error::Sql {
            op: "fence",
            source: sqlx::Error::RowNotFound,
        })?;
        row.try_get::<u64, _>(0).map_err(Error::sql("fence"))
    }
}

/// A session that holds nothing back to the server's idle timeout.
const REST: &str = "SET SESSION wait_timeout = DEFAULT";

#[async_trait]
impl Session for NamedSession {
    type Lock = NamedLock;

    async fn try_lock(&mut self, lock: &NamedLock, idle: Duration) -> Result<Option<u64>, Failure> {
        let sql = format!("SELECT GET_LOCK({}, 0)", literal(&lock.name));
        let batch = self.batch(&sql, "acquire").await?;
        if first_int(&batch) != Some(1) {
            return Ok(None);
        }
        let idle = sql::idle_seconds(idle);
        match self.inner.named_fence(&mut self.lent, lock, idle).await {
            Ok(token) => Ok(Some(token)),
            Err(e) => {
                // No token, no hold: give the lock back before answering.
                let sql = format!("DO RELEASE_LOCK({})", literal(&lock.name));
                let undo = self.batch(&sql, "acquire").await;
                match (failure(e), undo) {
                    (Failure::Session(e), _) | (Failure::Request(e), Err(Failure::Session(_))) => {
                        Err(Failure::Session(e))
                    }
                    (Failure::Request(e), _) => Err(Failure::Request(e)),
                }
            }
        }
    }

    async fn unlock(&mut self, lock: &NamedLock, afterwards: Afterwards) -> Result<bool, Failure> {
        let mut sql = String::new();
        if lock.value.is_some() {
            // The value row goes while the lock is still this session's.
            sql.push_str(&self.inner.sql.forget_value(&lock.row));
            sql.push(';');
        }
        let _ = write!(sql, "SELECT RELEASE_LOCK({})", literal(&lock.name));
        if afterwards == Afterwards::Retiring {
            let _ = write!(sql, ";{REST}");
        }
        let batch = self.batch(&sql, "release").await?;
        Ok(first_int(&batch) == Some(1))
    }

    async fn keep(&mut self, idle: Option<Duration>) -> Result<(), Failure> {
        if let Some(idle) = idle {
            let sql = Sql::keep(sql::idle_seconds(idle));
            return self.batch(&sql, "extend").await.map(drop);
        }
        match timeout(self.inner.config.response_timeout, self.lent.raw().ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(Failure::Session(
                Error::Sql {
                    op: "extend",
                    source,
                }
                .into(),
            )),
            Err(_) => Err(Failure::Session(self.inner.no_answer("extend").into())),
        }
    }

    /// Never called: named-lock carriers do not linger.
    fn lingering(&mut self) {}

    async fn rest(&mut self) -> Result<(), Failure> {
        self.batch(REST, "release").await.map(drop)
    }

    fn id(&self) -> u64 {
        self.lent.id()
    }

    fn retire(self) {
        self.lent.give_back();
    }

    // Named mode sends no requests of its own on a holder connection.
    type Call = std::convert::Infallible;
    type Answer = ();

    async fn call(&mut self, _: &NamedLock, call: Self::Call) -> Result<(), Failure> {
        match call {}
    }
}

/// A lock connection for a new holder connection: an idle one that still answers, or a
/// new one.
async fn open(inner: Arc<Inner>) -> Result<NamedSession> {
    let mut lent = inner.locks.get().await?;
    if lent.reused {
        let alive = timeout(inner.config.response_timeout, lent.raw().ping()).await;
        if !matches!(alive, Ok(Ok(()))) {
            inner.locks.clear_idle();
            lent = inner.locks.get().await?;
        }
    }
    Ok(NamedSession { inner, lent })
}

type Answer = Result<Option<Grant>>;

/// One named-mode acquire, running in its own task.
pub(crate) struct NamedAttempt {
    inner: Arc<Inner>,
    key: String,
    lock: NamedLock,
    ttl: Duration,
    shared: bool,
    deadline: Deadline,
    reply: Reply,
    /// A reentrant hold's owner (see `reentry`).
    owner: Option<Owner>,
    /// The grant entered the owner's hold again (it is not a new hold).
    reentered: bool,
}

impl NamedAttempt {
    /// An acquire of `key` (with `value`, a campaign publishing it), answering on `reply`.
    pub(crate) fn new(
        inner: Arc<Inner>,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
        reply: oneshot::Sender<Answer>,
        value: Option<&str>,
    ) -> Self {
        Self {
            lock: NamedLock::new(&inner.config.table, key, value),
            inner,
            key: key.to_owned(),
            ttl: opts.ttl,
            shared: opts.auto_renew,
            deadline,
            reply: Reply::new(reply),
            owner: opts.owner,
            reentered: false,
        }
    }

    pub(crate) async fn run(mut self) {
        let mut answer = self.take().await;
        if let Some(owner) = self.owner
            && !self.reentered
            && let Ok(Some(grant)) = answer
        {
            answer = self
                .inner
                .own(&self.key, owner, self.ttl, grant)
                .await
                .map(Some);
        }
        if self.lock.value.is_some() {
            // A leadership proclaims on a side connection (see `election`).
            answer = answer.map(|granted| {
                granted.map(|grant| {
                    NamedLeadership::wrap(self.inner.clone(), &self.key, self.lock.clone(), grant)
                })
            });
        }
        if let Some(grant) = self.reply.send(answer) {
            tracing::debug!(key = %self.key, "acquire abandoned after the grant; releasing");
            let mut held = grant.held;
            let _ = held.release().await;
        }
    }

    /// Enter the owner's hold again, if the owner holds the key now (in any client).
    async fn reenter(&mut self) -> Result<Option<Grant>> {
        let Some(owner) = self.owner else {
            return Ok(None);
        };
        let grant = self.inner.reenter(&self.key, owner, self.ttl).await?;
        self.reentered = grant.is_some();
        Ok(grant)
    }

    async fn take(&mut self) -> Answer {
        // A hold this client keeps for an owner: its session may carry this take too, and
        // `GET_LOCK` on the session that holds a lock takes it again. The owner enters its
        // hold again; anyone else waits for the hold to end.
        if let Some(keeper) = self.inner.keepers.get(self.lock.row()) {
            if Some(keeper.owner) == self.owner
                && let Some(grant) = self.reenter().await?
            {
                return Ok(Some(grant));
            }
            if !self.deadline.may_wait() || self.deadline.run(keeper.ended()).await.is_none() {
                return Ok(None);
            }
        }
        let inner = self.inner.clone();
        let tried = self.inner.carriers.try_take(
            &self.key,
            self.lock.clone(),
            self.ttl,
            self.shared,
            || open(inner.clone()),
        );
        let Some(tried) = self.deadline.run(tried).await else {
            return Ok(None);
        };
        if let Some(grant) = tried? {
            return Ok(Some(grant));
        }
        if let Some(grant) = self.reenter().await? {
            return Ok(Some(grant));
        }
        if !self.deadline.may_wait() {
            return Ok(None);
        }
        let Some(lent) = self.deadline.run(self.inner.locks.get()).await else {
            return Ok(None);
        };
        self.wait(lent?).await
    }

    /// Wait on a connection of its own, in rounds of at most [`LOCK_WAIT_ROUND`] seconds;
    /// at the deadline (or when the caller goes away) the waiting statement is killed and
    /// the connection closed, which frees a grant that raced the kill.
    async fn wait(&mut self, mut lent: Lent) -> Answer {
        let deadline = match self.deadline {
            Deadline::At(at) => Some(at),
            Deadline::TryOnce | Deadline::Never => None,
        };
        loop {
            let longest = match self.owner {
                Some(_) => OWNER_ROUND,
                None => LOCK_WAIT_ROUND,
            };
            let round = deadline.map_or(longest, |at| {
                sql::idle_seconds(at.saturating_duration_since(Instant::now())).min(longest)
            });
            let sql = format!("SELECT GET_LOCK({}, {round})", literal(&self.lock.name));
            let sent_at = Instant::now();
            let silent =
                sent_at + Duration::from_secs(round.into()) + self.inner.config.response_timeout;
            let mut batch = Batch::default();
            let id = lent.id();
            let why = {
                let run = run_into(&mut lent, sql.as_str(), "acquire", &mut batch);
                tokio::pin!(run);
                let why = tokio::select! {
                    biased;
                    () = &mut run => None,
                    () = sleep_until_some(deadline) => Some(Why::Deadline),
                    () = sleep_until(silent) => Some(Why::Silent),
                    () = self.reply.gone() => Some(Why::CallerGone),
                };
                if why.is_some() {
                    self.inner.interrupt(id, run.as_mut()).await;
                }
                why
            };
            if let Some(why) = why {
                // Closing the connection frees whatever it may have been granted.
                drop(lent);
                return match why {
                    Why::Silent => Err(self.inner.no_answer("acquire").into()),
                    Why::Deadline | Why::CallerGone => Ok(None),
                };
            }
            if let Some(e) = batch.error.take() {
                return Err(e.into());
            }
            match first_int(&batch) {
                Some(1) => {
                    self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                    let idle = sql::idle_seconds(self.ttl);
                    let token = self.inner.named_fence(&mut lent, &self.lock, idle).await?;
                    let session = NamedSession {
                        inner: self.inner.clone(),
                        lent,
                    };
                    let carriers = &self.inner.carriers;
                    // Granted after waiting for the holder: a hand-off.
                    return Ok(Some(
                        carriers
                            .adopt(
                                session,
                                Granted {
                                    key: &self.key,
                                    lock: self.lock.clone(),
                                    token,
                                    ttl: self.ttl,
                                    shared: self.shared,
                                    sent_at,
                                },
                            )
                            .after_wait(),
                    ));
                }
                // The round ran out: the owner may hold the key now, in another client.
                Some(0) if self.owner.is_some() => match self.reenter().await {
                    Ok(Some(grant)) => {
                        lent.give_back();
                        return Ok(Some(grant));
                    }
                    Ok(None) if self.deadline.may_wait() => {}
                    Ok(None) => {
                        lent.give_back();
                        return Ok(None);
                    }
                    Err(e) => return Err(e),
                },
                Some(0) if self.deadline.may_wait() => {}
                Some(0) => {
                    lent.give_back();
                    return Ok(None);
                }
                _ => {
                    return Err(Error::Sql {
                        op: "acquire",
                        source: sqlx::Error::Protocol("GET_LOCK returned NULL".into()),
                    }
                    .into());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_names_fit_mysql_and_depend_on_table_and_key() {
        let a = lock_name("dlock_locks", &sql::row_name("a"));
        assert_eq!(a.len(), MAX_LOCK_NAME);
        assert!(a.starts_with(PREFIX));
        assert!(
            a[PREFIX.len()..]
                .bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        );
        assert_ne!(a, lock_name("dlock_locks", &sql::row_name("A")));
        assert_ne!(a, lock_name("other", &sql::row_name("a")));
        let long = "x".repeat(1024);
        assert_eq!(lock_name("t", &sql::row_name(&long)).len(), MAX_LOCK_NAME);
    }
}
