//! Acquiring a key: `pg_try_advisory_lock` (`_shared` for a shared hold), then, if the key
//! is busy and the deadline allows, a waiting `pg_advisory_lock` (`_shared`) under a
//! `lock_timeout` that ends at the deadline.
//!
//! The first try runs in the caller's task: it never waits on the server, and a caller that
//! drops it mid-statement only closes a connection (the server frees what it held) or leaves
//! the answer to a holder connection, which releases a grant nobody took. A wait runs in a
//! task of its own that owns its lock connection. The caller's future only waits for the
//! task's answer, so dropping it never leaves a statement half-read: the task notices,
//! cancels the waiting statement from a side connection (`pg_cancel_backend`, then
//! `pg_terminate_backend` if that is not enough), drops a grant that raced the cancel, and
//! only then returns the connection to the pool.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dlock_core::raw::carrier::Granted;
use dlock_core::raw::{Deadline, Grant};
use dlock_core::{LockOptions, Mode, Owner, Result};
use futures::Future;
use sqlx::Row;
use sqlx::postgres::PgRow;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until, timeout};

use crate::backend::Inner;
use crate::error::Error;
use crate::pool::Lent;
use crate::pool::run_raw;
use crate::session::PgSession;
use crate::sql::{Advisory, millis};

/// How long a cancelled statement gets to answer before the next, stronger step.
const CANCEL_GRACE: Duration = Duration::from_secs(1);
/// The longest one waiting statement runs (its `lock_timeout`) before the client checks
/// in again: a server that stays silent past it plus the response timeout is unreachable.
const WAIT_ROUND: Duration = Duration::from_secs(60);

type Answer = Result<Option<Grant>>;
/// What a statement answered.
type Rows = std::result::Result<Vec<PgRow>, Error>;
/// A waiting statement that was stopped: why, and what it answered after the cancel, if it
/// did.
type Stopped = (Why, Option<Rows>);

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

/// Why a waiting statement was stopped.
#[derive(Debug)]
enum Why {
    /// The server stayed silent past the lock timeout and the response timeout.
    Silent,
    /// The caller dropped the acquire future.
    CallerGone,
    /// An owner's wait: its owner took the key meanwhile (in another client), and this
    /// acquire re-entered that hold.
    Reentered(Grant),
}

/// What the first try of an acquire found.
pub(crate) enum First {
    /// Granted, busy with no time to wait, or failed: the acquire's answer.
    Answer(Answer),
    /// Busy, and the deadline allows a wait: the key's lock (id and mode).
    Busy(Advisory),
}

/// One acquire: its first try in the caller's task, its wait in a task of its own.
pub(crate) struct Attempt {
    inner: Arc<Inner>,
    key: String,
    ttl: Duration,
    /// Exclusive or shared.
    mode: Mode,
    /// Auto-renewed: the hold may share its holder connection.
    shares_carrier: bool,
    /// A candidate's value (an election campaign), published with the grant.
    value: Option<Arc<str>>,
    /// A reentrant hold's owner (see `crate::reentry`).
    owner: Option<Owner>,
    idle_ms: u64,
    deadline: Deadline,
    reply: Reply,
}

impl Attempt {
    /// An acquire of `key` with `opts` until `deadline`.
    pub(crate) fn new(
        inner: Arc<Inner>,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Self {
        let ttl = opts.ttl;
        Self {
            inner,
            key: key.to_owned(),
            ttl,
            mode: opts.mode,
            shares_carrier: opts.auto_renew,
            value: None,
            owner: opts.owner,
            idle_ms: millis(ttl),
            deadline,
            reply: Reply(None),
        }
    }

    /// The same acquire as a candidate's in an election: the grant publishes `value`.
    pub(crate) fn campaign(mut self, value: &str) -> Self {
        self.value = Some(value.into());
        self
    }

    /// Wait for `lock` (found busy by [`first`](Self::first)), answering on `reply`;
    /// runs in a task of its own.
    pub(crate) async fn wait(mut self, lock: Advisory, reply: oneshot::Sender<Answer>) {
        self.reply = Reply(Some(reply));
        let answer = self.wait_take(lock).await;
        if let Some(grant) = self.reply.send(answer) {
            tracing::debug!(key = %self.key, "acquire abandoned after the grant; releasing");
            let mut held = grant.held;
            let _ = held.release().await;
        }
    }

    /// The first try: the key's id, then the lock without waiting, on a holder connection
    /// shared with other holds.
    pub(crate) async fn first(&self) -> First {
        // The deadline covers the id look-up and getting a connection too.
        let id = match self.deadline.run(self.inner.lock_id(&self.key)).await {
            None => return First::Answer(Ok(None)),
            Some(Err(e)) => return First::Answer(Err(e.into())),
            Some(Ok(id)) => id,
        };
        let lock = Advisory {
            id,
            mode: self.mode,
            value: self.value.clone(),
            owner: self.owner,
        };
        if let Some(owner) = self.owner
            && self.inner.anchors.holds(id).await
        {
            // This client holds the key's lock for a reentrant hold: re-enter it (if it is
            // this owner's and its count is above zero), else wait on a connection of its
            // own, never stacking the lock on the holder connection.
            return match self.reenter(id, owner).await {
                Some(Ok(None)) if self.deadline.may_wait() => First::Busy(lock),
                Some(answer) => First::Answer(answer),
                None => First::Answer(Ok(None)),
            };
        }
        match self.take_now(lock.clone()).await {
            Some(Ok(Some(grant))) => First::Answer(Ok(Some(self.owned(id, grant)))),
            Some(Ok(None)) => {
                // Busy: held by this owner in another client? Re-enter.
                let answer = match self.owner {
                    Some(owner) => self.reenter(id, owner).await,
                    None => Some(Ok(None)),
                };
                match answer {
                    Some(Ok(None)) if self.deadline.may_wait() => First::Busy(lock),
                    Some(answer) => First::Answer(answer),
                    None => First::Answer(Ok(None)),
                }
            }
            Some(answer) => First::Answer(answer),
            None => First::Answer(Ok(None)),
        }
    }

    /// Re-enter `owner`'s hold of lock `id` within the deadline (`None`: it passed first).
    async fn reenter(&self, id: i32, owner: Owner) -> Option<Answer> {
        let reenter = self.inner.reenter(&self.key, id, owner, self.ttl, None);
        self.deadline.run(reenter).await
    }

    /// A grant of a new hold: for an owner, the first of a reentrant hold.
    fn owned(&self, id: i32, grant: Grant) -> Grant {
        match self.owner {
            Some(owner) => self.inner.anchor(&self.key, id, owner, self.ttl, grant),
            None => grant,
        }
    }

    /// Take `lock` without waiting on a holder connection shared with other holds, within
    /// the deadline (`None`: it passed first).
    pub(crate) async fn take_now(&self, lock: Advisory) -> Option<Answer> {
        if self.inner.anchors.holds(lock.id).await {
            // A holder connection of this client holds the key for a reentrant hold, and
            // would take it again (the server stacks a session's advisory locks): busy.
            return Some(Ok(None));
        }
        let inner = self.inner.clone();
        let open = || open_session(inner.clone());
        let tried =
            self.inner
                .carriers
                .try_take(&self.key, lock, self.ttl, self.shares_carrier, open);
        self.deadline.run(tried).await
    }

    /// The backend's state.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }

    /// The acquire's deadline.
    pub(crate) fn deadline(&self) -> Deadline {
        self.deadline
    }

    /// The key's name.
    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    /// Busy: wait on a connection of its own, which then carries the hold.
    async fn wait_take(&mut self, lock: Advisory) -> Answer {
        let Some(lent) = self.deadline.run(self.inner.locks.get()).await else {
            return Ok(None);
        };
        let mut lent = lent?;
        while self.deadline.may_wait() {
            let wait = match self.deadline {
                Deadline::At(at) => at.saturating_duration_since(Instant::now()).min(WAIT_ROUND),
                Deadline::TryOnce | Deadline::Never => WAIT_ROUND,
            };
            if wait < Duration::from_millis(1) {
                break;
            }
            let sql = self.inner.sql.wait_take(&lock, self.idle_ms, millis(wait));
            let sent_at = Instant::now();
            let silent = sent_at + wait + self.inner.config.response_timeout;
            match self.guarded(&mut lent, &sql, silent, lock.id).await {
                Ok(Ok(rows)) => {
                    self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                    return match token(&rows)? {
                        Some(token) => self.granted(lent, lock, token, sent_at),
                        None => Err(Error::Unexpected {
                            op: "acquire",
                            what: "the granted lock returned no token".into(),
                        }
                        .into()),
                    };
                }
                // The lock timeout ran out: the deadline (or a round) passed, nothing left
                // behind on the server.
                Ok(Err(e)) if e.is_lock_timeout() => continue,
                Ok(Err(e)) => return Err(e.into()),
                Err((why, late)) => {
                    let answer = match why {
                        Why::CallerGone => Ok(None),
                        Why::Silent => Err(self.inner.no_answer("acquire").into()),
                        Why::Reentered(grant) => Ok(Some(grant.after_wait())),
                    };
                    // Answer at once, then put the connection right.
                    if let Some(grant) = self.reply.send(answer) {
                        let mut held = grant.held;
                        let _ = held.release().await;
                    }
                    self.settle(lent, &lock, late).await;
                    return Ok(None);
                }
            }
        }
        // Busy past the deadline: the session holds nothing; answer, then give it back.
        lent.give_back();
        Ok(None)
    }

    /// Run the waiting `sql` (for lock `id`) on `lent` until it answers, the server stays
    /// silent until `silent`, the caller goes away, or (an owner's wait) the owner's hold
    /// taken meanwhile elsewhere is re-entered; in the last three cases cancel it on the
    /// server and return what it answered after the cancel, if it did.
    async fn guarded(
        &mut self,
        lent: &mut Lent,
        sql: &str,
        silent: Instant,
        id: i32,
    ) -> std::result::Result<Rows, Stopped> {
        let pid = lent.pid();
        let inner = &self.inner;
        let (owner, key, ttl) = (self.owner, &self.key, self.ttl);
        let reply = &mut self.reply;
        let run = run_raw(lent, sql, "acquire");
        tokio::pin!(run);
        let reentered = async {
            match owner {
                Some(owner) => inner.reentered(key, id, owner, ttl, pid).await,
                None => std::future::pending().await,
            }
        };
        let why = tokio::select! {
            biased;
            out = &mut run => return Ok(out),
            () = sleep_until(silent) => Why::Silent,
            () = reply.gone() => Why::CallerGone,
            grant = reentered => Why::Reentered(grant),
        };
        let late = inner.interrupt(pid, run.as_mut()).await;
        tracing::debug!(pid, ?why, finished = late.is_some(), "wait stopped");
        Err((why, late))
    }

    /// The connection of a stopped wait: if the statement answered (cancelled, or granted
    /// just before the cancel), drop whatever the session holds and return it to the pool;
    /// if it did not, or the connection is lost, close it (the server frees its locks).
    async fn settle(&self, lent: Lent, lock: &Advisory, late: Option<Rows>) {
        match late {
            Some(Err(e)) if e.is_connection_lost() => {}
            Some(_) => {
                let clean = self.inner.sql.unlock_all(lock);
                self.inner.give_back_clean(lent, &clean).await;
            }
            None => {}
        }
    }

    /// The wait was granted: the connection becomes a holder connection carrying the hold,
    /// a hand-off ([`Grant::after_wait`]).
    fn granted(&self, lent: Lent, lock: Advisory, token: u64, sent_at: Instant) -> Answer {
        let id = lock.id;
        let session = PgSession::holding(self.inner.clone(), lent, lock.clone(), self.idle_ms);
        let carriers = &self.inner.carriers;
        let granted = Granted {
            key: &self.key,
            lock,
            token,
            ttl: self.ttl,
            shared: self.shares_carrier,
            sent_at,
        };
        // Granted by the server's queue after the first try found the key busy.
        Ok(Some(
            self.owned(id, carriers.adopt(session, granted).after_wait()),
        ))
    }
}

/// A lock connection for a new holder connection: an idle one (not pinged: its first
/// statement proves it, see [`PgSession::try_lock`]), or a new one.
async fn open_session(inner: Arc<Inner>) -> Result<PgSession> {
    let lent = inner.locks.get().await?;
    Ok(PgSession::new(inner, lent))
}

/// The fencing token in the first column of the last row: `None` when NULL (busy).
pub(crate) fn token(rows: &[PgRow]) -> Result<Option<u64>> {
    let Some(row) = rows.last() else {
        return Err(Error::Unexpected {
            op: "acquire",
            what: "no row".into(),
        }
        .into());
    };
    let token: Option<i64> = row.try_get(0).map_err(Error::sql("acquire"))?;
    Ok(token.map(|t| u64::try_from(t).unwrap_or(0)))
}

/// The slot a granted permit took: the third column of the last row.
pub(crate) fn slot(rows: &[PgRow]) -> Result<i32> {
    let slot: Option<i32> = rows
        .last()
        .map(|row| row.try_get(2))
        .transpose()
        .map_err(Error::sql("acquire"))?
        .flatten();
    slot.ok_or_else(|| {
        Error::Unexpected {
            op: "acquire",
            what: "a granted permit returned no slot".into(),
        }
        .into()
    })
}

impl Inner {
    /// Stop the statement running on backend `pid` so that it can never take the lock
    /// later, and wait (briefly) for `run` to see it end. `pg_cancel_backend` first, which
    /// keeps the session; then `pg_terminate_backend`, which ends it. Returns what `run`
    /// answered, if it finished.
    async fn interrupt<F, T>(&self, pid: i32, mut run: Pin<&mut F>) -> Option<T>
    where
        F: Future<Output = T>,
    {
        let grace = CANCEL_GRACE.min(self.config.response_timeout);
        let cancel = format!("SELECT pg_cancel_backend({pid})");
        match self.side("cancel", &cancel, None).await {
            Ok(_) => {
                if let Ok(out) = timeout(grace, run.as_mut()).await {
                    return Some(out);
                }
            }
            Err(e) => tracing::warn!(pid, error = %e, "pg_cancel_backend failed"),
        }
        tracing::warn!(
            pid,
            "the waiting statement did not stop; ending its session"
        );
        let terminate = format!("SELECT pg_terminate_backend({pid})");
        if let Err(e) = self.side("cancel", &terminate, None).await {
            tracing::warn!(pid, error = %e, "pg_terminate_backend failed; closing the connection");
            return None;
        }
        timeout(grace, run.as_mut()).await.ok()
    }
}
