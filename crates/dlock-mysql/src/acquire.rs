//! Acquiring a key: lock the row without waiting (`FOR UPDATE NOWAIT`; a shared hold takes
//! InnoDB's shared row lock instead), or wait for the server to grant it (`FOR UPDATE`)
//! until the deadline, drawing the fencing token in the locking statement (or, on MySQL 8,
//! taking one from the key's counter after it).
//!
//! The first try runs in the caller's task: it never waits on the server, so a caller that
//! drops it mid-statement only closes the connection, which the server rolls back. Anything
//! that may wait runs in a task of its own that owns the lock connection; the caller's future
//! only waits for the task's answer, so dropping it (or its deadline passing) never leaves a
//! statement half-read: the task notices, kills the waiting statement from a side connection
//! (`KILL QUERY`, then `KILL` for the whole session if that is not enough), undoes a grant
//! that raced the kill, and only then returns the connection to the pool.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use dlock_core::raw::{Deadline, Grant};
use dlock_core::{LockError, LockOptions, Mode, Owner, Result};
use sqlx::{Execute, MySql};
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep_until};

use crate::NAME;
use crate::backend::{Batch, Inner, run_into};
use crate::error::Error;
use crate::grant::locked_token;
use crate::held::MysqlHeld;
use crate::permits;
use crate::pool::Lent;
use crate::sql::{self, End, Holder, LOCK_WAIT_ROUND, Sql, Tokens};
use crate::stop::sleep_until_some;

/// How often an acquire may start over (its row missing, or InnoDB picked it as a deadlock
/// victim) before it gives up as a server problem.
const MAX_RESTARTS: u32 = 100;

type Answer = Result<Option<Grant>>;

/// The way back to the caller of `acquire`, which may have gone away.
pub(crate) struct Reply(Option<oneshot::Sender<Answer>>);

impl Reply {
    pub(crate) fn new(tx: oneshot::Sender<Answer>) -> Self {
        Self(Some(tx))
    }

    /// Answer the caller (once). Returns the grant if nobody took it, so it can be released.
    pub(crate) fn send(&mut self, answer: Answer) -> Option<Grant> {
        let unclaimed = match self.0.take() {
            Some(tx) => tx.send(answer).err()?,
            None => answer,
        };
        unclaimed.ok().flatten()
    }

    /// Resolves when the caller dropped its `acquire` future.
    pub(crate) async fn gone(&mut self) {
        match &mut self.0 {
            Some(tx) => tx.closed().await,
            None => std::future::pending().await,
        }
    }
}

/// Why a running statement was stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Why {
    /// The acquire's deadline passed.
    Deadline,
    /// The server stayed silent past the response timeout (or a lock wait round).
    Silent,
    /// The caller dropped the acquire future.
    CallerGone,
}

/// Where an acquire stands after a step.
pub(crate) enum Step {
    /// The row lock is ours, with the token the locking statement drew (`0` where tokens
    /// come from counters).
    Granted(u64),
    /// The key's row does not exist yet (first use, or an operator deleted it): create it.
    Missing,
    /// Another session holds the row; the transaction holds nothing (after a create that
    /// was stopped, at most its duplicate check's shared lock on the row, and a permit
    /// creator's turn), and is ended by whatever the connection runs next: a wait's
    /// `BEGIN` (after a `ROLLBACK` that gives a turn back), or a `ROLLBACK`.
    Busy,
    /// Start over: roll back (holding nothing) and try again, creating the row.
    Restart,
    /// The idle connection taken from the pool was dead: take a new one. Nothing ran,
    /// except that a prepared take may have run just before the connection was lost; its
    /// session, closed with the connection, then holds the key until the server notices
    /// (at once when the client closed it; at the session's idle timeout when the network
    /// is gone), which the new connection's try sees as busy. No second holder either way.
    Replace,
    /// A statement was stopped on the server; see [`Inner::settle`].
    Stopped { why: Why, late: Option<Batch> },
    /// Anything else.
    Failed(Error),
    /// The owner's hold (taken meanwhile by another client) was entered again instead (or
    /// looking failed).
    Reentered(Result<Grant>),
}

pub(crate) enum Guarded {
    Done(Batch),
    /// Stopped before it answered; `late` is what it answered after the kill, if it did.
    Stopped {
        why: Why,
        late: Option<Batch>,
    },
}

/// One acquire, running in its own task.
pub(crate) struct Attempt {
    pub(crate) inner: Arc<Inner>,
    pub(crate) key: String,
    pub(crate) name: String,
    /// Exclusive (`FOR UPDATE`), shared (InnoDB's shared row lock), or a permit (a slot
    /// row's exclusive lock, see `permits`).
    pub(crate) mode: Mode,
    /// The holding session's idle timeout, in seconds.
    pub(crate) idle: u32,
    pub(crate) deadline: Deadline,
    reply: Reply,
    /// When the statement that was granted the row was sent: the session was busy from
    /// then until the grant, so its idle clock cannot end the lease earlier than ttl after.
    pub(crate) sent_at: Instant,
    /// The key was busy at the first try and the acquire waited: a grant now is a
    /// hand-off ([`Grant::after_wait`]).
    waited: bool,
    /// An election candidate's value, recorded as the hold's `who` in place of the
    /// client's description (see the crate docs' *Elections*).
    pub(crate) value: Option<String>,
    /// A reentrant hold's owner (see `reentry`).
    pub(crate) owner: Option<Owner>,
    /// The lease's ttl.
    pub(crate) ttl: Duration,
}

impl Attempt {
    /// An acquire of `key` for a lease of `opts.ttl` in `opts.mode`, answering on `reply`;
    /// with `value`, a campaign publishing it.
    pub(crate) fn new(
        inner: Arc<Inner>,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
        reply: oneshot::Sender<Answer>,
        value: Option<&str>,
    ) -> Self {
        Self {
            inner,
            key: key.to_owned(),
            name: sql::row_name(key),
            mode: opts.mode,
            idle: sql::idle_seconds(opts.ttl),
            deadline,
            reply: Reply(Some(reply)),
            sent_at: Instant::now(),
            waited: false,
            value: value.map(str::to_owned),
            owner: opts.owner,
            ttl: opts.ttl,
        }
    }

    /// Run the acquire. The first try runs in the caller's task: it never waits on the
    /// server, so a caller that drops it only closes the connection, which the server rolls
    /// back (saving a task hop on the uncontended path). Anything more (a wait, a restart,
    /// the tidy-up after a busy answer) continues in a task of its own.
    pub(crate) async fn run(mut self) {
        // An owner whose hold this client keeps enters it again, with no lock statement.
        if let Some(owner) = self.owner
            && self
                .inner
                .keepers
                .get(&self.name)
                .is_some_and(|k| k.owner == owner)
        {
            match self.inner.reenter(&self.key, owner, self.ttl).await {
                Ok(None) => {}
                answer => return self.answer(answer).await,
            }
        }
        // The deadline covers getting a connection too; past it, the wait ran out.
        let lent = match self.deadline.run(self.inner.locks.get()).await {
            None => Ok(None),
            Some(Err(e)) => Err(e.into()),
            Some(Ok(lent)) => Ok(Some(lent)),
        };
        let mut lent = match lent {
            Ok(Some(lent)) => lent,
            answer @ (Ok(None) | Err(_)) => {
                let _ = self.reply.send(answer.map(|_| None));
                return;
            }
        };
        let step = self.try_take(&mut lent, false).await;
        if let Step::Granted(token) = step {
            let answer = self.granted(lent, token).await;
            self.answer(answer).await;
            return;
        }
        dlock_core::raw::spawn_cleanup(async move {
            let answer = self.take(lent, step).await;
            self.answer(answer).await;
        });
    }

    /// Answer the caller; release a grant nobody is left to take.
    async fn answer(&mut self, answer: Answer) {
        if let Some(grant) = self.reply.send(answer) {
            tracing::debug!(key = %self.key, "acquire abandoned after the grant; releasing");
            let mut held = grant.held;
            let _ = held.release().await;
        }
    }

    /// Take the key from the `first` step of step 1: step 2 if it is busy and the deadline
    /// allows, starting over when the row is missing.
    async fn take(&mut self, mut lent: Lent, first: Step) -> Answer {
        let mut create = false;
        let mut first = Some(first);
        for _ in 0..MAX_RESTARTS {
            let step = match first.take() {
                Some(step) => step,
                None => self.try_take(&mut lent, create).await,
            };
            let step = match (step, self.owner) {
                // Held: by the owner (in another client), which enters its hold again?
                (Step::Busy, Some(owner)) => {
                    match self.inner.reenter(&self.key, owner, self.ttl).await {
                        Ok(None) => Step::Busy,
                        answer => Step::Reentered(answer.map(|g| g.expect("matched above"))),
                    }
                }
                (step, _) => step,
            };
            let step = match step {
                Step::Busy if self.deadline.may_wait() => {
                    self.waited = true;
                    // A creating try stopped before giving its turn back (the key busy):
                    // give it back now, or creators would pass over it while we wait.
                    if lent.creation_lock().is_some() {
                        self.rollback(&mut lent).await?;
                    }
                    self.wait_take(&mut lent).await
                }
                step => step,
            };
            match step {
                Step::Granted(token) => return self.granted(lent, token).await,
                // The row's transaction is ended by the creating batch.
                Step::Missing if !create => create = true,
                Step::Busy => {
                    // Answer first; the roll-back only tidies the connection.
                    let _ = self.reply.send(Ok(None));
                    let _ = self.inner.finish(lent, End::Rollback).await;
                    return Ok(None);
                }
                Step::Missing | Step::Restart => {
                    create = true;
                    self.rollback(&mut lent).await?;
                }
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
                    self.inner.settle(lent, late).await;
                    return Ok(None);
                }
                Step::Failed(e) => return Err(e.into()),
                Step::Reentered(answer) => {
                    // Answer first; the roll-back only tidies the connection.
                    self.answer(answer.map(Some)).await;
                    let _ = self.inner.finish(lent, End::Rollback).await;
                    return Ok(None);
                }
            }
        }
        Err(LockError::backend(
            NAME,
            "acquire",
            "the lock row kept vanishing under the acquire",
        ))
    }

    /// Step 1: lock the row (a permit: a free slot row) without waiting (with `create`,
    /// create it, or the slots, first if missing).
    pub(crate) async fn try_take(&mut self, lent: &mut Lent, create: bool) -> Step {
        let set = self.idle_to_set(lent);
        let batch = loop {
            match self.send_try(lent, set, create).await {
                // The server is at its limit of prepared statements: the same statement as
                // a text batch, on this connection from now on.
                Guarded::Done(batch)
                    if batch.error.as_ref().is_some_and(Error::is_prepare_refused) =>
                {
                    tracing::debug!(id = lent.id(), "the server refused to prepare; text");
                    lent.stop_preparing();
                }
                Guarded::Done(batch) => break batch,
                // The create's insert waited behind a holder (it raced the row's creation
                // and locking): stopped, the key is busy (the transaction it may leave,
                // with autocommit off, is ended next, see `Step::Busy`).
                Guarded::Stopped {
                    why: Why::Silent,
                    late: Some(late),
                } if late.error.as_ref().is_some_and(Error::is_interrupted) => return Step::Busy,
                Guarded::Stopped { why, late } => return Step::Stopped { why, late },
            }
        };
        if let Mode::Permits(limit) = self.mode {
            return permits::tried(batch, lent, limit, set.is_some(), create);
        }
        match batch.error {
            None if batch.granted() => locked_token(&batch),
            None if create => Step::Restart,
            None => Step::Missing,
            Some(e) if e.is_lock_busy() => Step::Busy,
            // Another client created the row at the same moment: it exists now.
            Some(e) if e.is_duplicate() || e.is_deadlock() => Step::Restart,
            Some(e) if e.is_connection_lost() && lent.reused && batch.done == 0 => Step::Replace,
            Some(e) => Step::Failed(e),
        }
    }

    /// Send step 1's statement: the prepared take where lock connections run with
    /// `autocommit` off and the session needs nothing set first (see
    /// `Sql::with_prepared_take`), else the text batch.
    async fn send_try(&mut self, lent: &mut Lent, set: Option<u32>, create: bool) -> Guarded {
        self.sent_at = Instant::now();
        let mut silent = self.sent_at + self.inner.config.response_timeout;
        if create && matches!(self.mode, Mode::Permits(_)) {
            silent += permits::CREATE_WAITS;
        }
        let inner = self.inner.clone();
        let prepared = inner.sql.prepared_take(self.mode);
        if let Some(take) = prepared.filter(|_| set.is_none() && !create && lent.prepares()) {
            let Holder { key, who } = self.holder();
            let query = sqlx::query(take)
                .bind(key.as_bytes().to_vec())
                .bind(who.as_bytes().to_vec())
                .bind(self.name.as_bytes().to_vec());
            return self.guarded(lent, query, None, silent, set).await;
        }
        let sql = match self.mode {
            Mode::Permits(limit) => self.permit_try_sql(lent, limit, set, create),
            Mode::Exclusive | Mode::Shared => {
                let holder = self.holder();
                let sql = &inner.sql;
                sql.try_take(&self.name, self.mode, set, create, holder)
            }
        };
        self.guarded(lent, sql.as_str(), None, silent, set).await
    }

    /// Step 2: wait for the row, woken by the server's grant, until the deadline.
    async fn wait_take(&mut self, lent: &mut Lent) -> Step {
        if let Mode::Permits(limit) = self.mode {
            return self.permit_wait(lent, limit).await;
        }
        if self.owner.is_some() {
            return self.owner_wait(lent).await;
        }
        let deadline = match self.deadline {
            Deadline::At(at) => Some(at),
            Deadline::TryOnce | Deadline::Never => None,
        };
        loop {
            let set = self.idle_to_set(lent);
            let sql = self
                .inner
                .sql
                .wait_take(&self.name, self.mode, set, self.holder());
            self.sent_at = Instant::now();
            let silent = self.sent_at
                + Duration::from_secs(LOCK_WAIT_ROUND.into())
                + self.inner.config.response_timeout;
            let batch = match self
                .guarded(lent, sql.as_str(), deadline, silent, set)
                .await
            {
                Guarded::Done(batch) => batch,
                Guarded::Stopped { why, late } => return Step::Stopped { why, late },
            };
            // The locking read ran (after any `SET`, and `BEGIN`) and the server woke it.
            let before_read = 1 + usize::from(set.is_some());
            if batch.done >= before_read && batch.error.as_ref().is_none_or(Error::is_lock_busy) {
                self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
            }
            match batch.error {
                None if batch.granted() => return self.granted_after_wait(lent, &batch).await,
                // An operator deleted the row while we waited on it.
                None => return Step::Restart,
                // A lock wait round ran out: wait again, if the deadline allows.
                Some(e) if e.is_lock_busy() && self.deadline.may_wait() => {}
                Some(e) if e.is_lock_busy() => return Step::Busy,
                Some(e) if e.is_deadlock() => return Step::Restart,
                Some(e) => return Step::Failed(e),
            }
        }
    }

    /// The idle timeout a lock batch must set first: `None` when the session has it.
    pub(crate) fn idle_to_set(&self, lent: &Lent) -> Option<u32> {
        (lent.lease_idle() != Some(self.idle)).then_some(self.idle)
    }

    /// Run `sql` on `lent` until it answers, the deadline passes, the server stays silent
    /// until `silent`, or the caller goes away; in the last three cases stop it on the
    /// server before returning. `set`: the idle timeout `sql` sets first, if any.
    pub(crate) async fn guarded<'q, E>(
        &mut self,
        lent: &mut Lent,
        sql: E,
        deadline: Option<Instant>,
        silent: Instant,
        set: Option<u32>,
    ) -> Guarded
    where
        E: Execute<'q, MySql> + 'q,
    {
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
        if set.is_some() && batch.done >= 1 {
            lent.set_lease_idle(set);
        }
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
        let sql = Sql::release_creation_lock("ROLLBACK", lent.creation_lock());
        let batch = self.inner.run(lent, &sql, "acquire").await;
        match batch.error {
            None => {
                lent.set_creation_lock(None);
                Ok(())
            }
            Some(e) => Err(e.into()),
        }
    }

    /// The row is ours. With a token drawn by the locking statement, the lease is ready:
    /// the token was drawn while this session held the row, so a later holder's is larger.
    /// Otherwise (counters) take a token, then prove the session still holds the row after
    /// the token was committed (so a later holder's token is larger), which also restarts
    /// the session's idle clock from a known instant.
    async fn granted(&mut self, mut lent: Lent, drawn: u64) -> Answer {
        let (token, sent_at) = match self.inner.sql.tokens {
            Tokens::Sequence => (drawn, self.sent_at),
            Tokens::Counter => match self.fence_and_keep(&mut lent).await {
                Ok(taken) => taken,
                Err(e) => {
                    let _ = self.inner.finish(lent, End::Rollback).await;
                    return Err(e);
                }
            },
        };
        let held = MysqlHeld::new(self.inner.clone(), self.key.clone(), lent, self.idle);
        let mut grant = Grant::new(token, Box::new(held), sent_at);
        grant.waited = self.waited;
        match self.owner {
            Some(owner) => self
                .inner
                .own(&self.key, owner, self.ttl, grant)
                .await
                .map(Some),
            None => Ok(Some(grant)),
        }
    }
}
