//! A lock connection as a [`Session`] of [`dlock_core::raw::carrier`]: one PostgreSQL session
//! that holds many advisory locks, kept alive by one ping per renewal gap.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::Mode;
use dlock_core::raw::carrier::{Afterwards, Failure, Session};
use sqlx::{Connection, Row};
use tokio::time::timeout;

use crate::backend::Inner;
use crate::error::Error;
use crate::pool::Lent;
use crate::sql::{Advisory, Sql, Statement, millis};

/// A lock connection carrying advisory locks (named by their id in the key table).
pub(crate) struct PgSession {
    inner: Arc<Inner>,
    lent: Lent,
    /// How many shared holds of each lock id this session carries: taking one of these
    /// again needs the check for waiting writers the server skips on re-entry.
    shared: HashMap<i32, u32>,
    /// The permit slots of each lock id this session holds, one per permit hold: a new
    /// permit of the key must take another slot (the server would grant one of these again).
    slots: HashMap<i32, Vec<i32>>,
    /// Holds nothing and idle since: taken from the pool, or left open by its carrier for
    /// more takes. It may have died meanwhile (a server restart), which its next statement
    /// finds out, and then reconnects: losing it lost no hold.
    unproven: bool,
    /// The idle timeout (ms) this session's last hold statement set, as the server has it;
    /// `None`: the defaults (a connection from the pool, or unknown). A take on a session
    /// already at the hold's timeout skips setting it again.
    idle_set: Option<u64>,
}

impl PgSession {
    /// A session holding nothing. A connection reused from the pool is proven by its
    /// first statement (see `unproven`).
    pub(crate) fn new(inner: Arc<Inner>, lent: Lent) -> Self {
        Self {
            unproven: lent.reused,
            inner,
            lent,
            shared: HashMap::new(),
            slots: HashMap::new(),
            idle_set: None,
        }
    }

    /// A session that was granted `lock` after a wait, whose statement set the idle
    /// timeout `idle_ms`.
    pub(crate) fn holding(inner: Arc<Inner>, lent: Lent, lock: Advisory, idle_ms: u64) -> Self {
        let mut session = Self::new(inner, lent);
        session.unproven = false;
        session.idle_set = Some(idle_ms);
        session.count(&lock, true);
        session
    }

    /// Count one more (`taken`) or one fewer shared hold of `lock`.
    fn count(&mut self, lock: &Advisory, taken: bool) {
        if lock.mode != Mode::Shared {
            return;
        }
        if taken {
            *self.shared.entry(lock.id).or_default() += 1;
        } else if let Some(n) = self.shared.get_mut(&lock.id) {
            *n -= 1;
            if *n == 0 {
                self.shared.remove(&lock.id);
            }
        }
    }

    /// The statement that takes `lock` without waiting on this session.
    fn try_sql(&self, lock: &Advisory, idle: Duration) -> Statement {
        let sql = &self.inner.sql;
        match lock.mode {
            Mode::Shared if self.shared.contains_key(&lock.id) => {
                Statement::Simple(sql.try_share_again(lock.id, millis(idle)))
            }
            Mode::Permits(limit) => {
                let held = self.slots.get(&lock.id).map_or(&[][..], Vec::as_slice);
                Statement::Simple(sql.try_permit(lock.id, limit, held, millis(idle)))
            }
            Mode::Shared | Mode::Exclusive
                if self.idle_set == Some(millis(idle))
                    && lock.value.is_none()
                    && lock.owner.is_none() =>
            {
                sql.try_take_kept(lock)
            }
            Mode::Shared | Mode::Exclusive => sql.try_take(lock, millis(idle)),
        }
    }

    /// The statement that gives `lock` back, and for a permit the slot it frees (the
    /// highest this session holds of the key: all of them are alike, and keeping the low
    /// ones held makes smaller limits count them). `None` when the session holds no slot.
    fn unlock_sql(
        &self,
        lock: &Advisory,
        afterwards: Afterwards,
    ) -> Option<(Statement, Option<i32>)> {
        let last = afterwards == Afterwards::Retiring;
        let sql = &self.inner.sql;
        if let Mode::Permits(_) = lock.mode {
            let slot = *self.slots.get(&lock.id)?.iter().max()?;
            let statement = Statement::Simple(sql.unlock_permit(lock.id, slot, last));
            return Some((statement, Some(slot)));
        }
        let statement = if last {
            sql.release(lock)
        } else {
            sql.unlock(lock)
        };
        Some((statement, None))
    }

    fn forget_slot(&mut self, id: i32, slot: i32) {
        if let Some(slots) = self.slots.get_mut(&id) {
            slots.retain(|s| *s != slot);
            if slots.is_empty() {
                self.slots.remove(&id);
            }
        }
    }

    fn failure(e: Error) -> Failure {
        if e.is_connection_lost() {
            Failure::Session(e.into())
        } else {
            Failure::Request(e.into())
        }
    }

    /// A candidate's (or an owner's) try failed on the server after it may have taken the
    /// lock (its row could not be written: the statement rolled back, but a session-level advisory lock
    /// stays taken). The session held no lock of the key before (a client takes a key once
    /// at a time), so unlock it; if even that fails, the session cannot be trusted.
    async fn campaign_failed(&mut self, lock: &Advisory, e: Error) -> Failure {
        let plain = Advisory::new(lock.id, lock.mode);
        let undo = self.inner.sql.unlock(&plain);
        match self.run(&undo, "acquire").await {
            Ok(_) => Failure::Request(e.into()),
            Err(Failure::Request(undo) | Failure::Session(undo)) => {
                tracing::debug!(error = %undo, "a failed campaign's lock could not be undone");
                Failure::Session(e.into())
            }
        }
    }

    async fn run(
        &mut self,
        statement: &Statement,
        op: &'static str,
    ) -> Result<Vec<sqlx::postgres::PgRow>, Failure> {
        self.inner
            .run_statement(&mut self.lent, statement, op)
            .await
            .map_err(Self::failure)
    }
}

#[async_trait]
impl Session for PgSession {
    type Lock = Advisory;

    async fn try_lock(&mut self, lock: &Advisory, idle: Duration) -> Result<Option<u64>, Failure> {
        let sql = self.try_sql(lock, idle);
        let mut rows = self
            .inner
            .run_statement(&mut self.lent, &sql, "acquire")
            .await;
        if std::mem::take(&mut self.unproven)
            && let Err(e) = &rows
            && e.is_connection_lost()
        {
            // The idle connection had died (the lock was not taken, or its session ended
            // with it): once more on a new one, instead of a ping before every first use.
            tracing::debug!(error = %e, "an idle lock connection was dead; reconnecting");
            rows = match self.lent.reconnect().await {
                Ok(()) => {
                    // A new session: nothing held, the defaults.
                    self.idle_set = None;
                    self.shared.clear();
                    self.slots.clear();
                    let sql = self.try_sql(lock, idle);
                    self.inner
                        .run_statement(&mut self.lent, &sql, "acquire")
                        .await
                }
                // No connection left to carry anything: the session is gone.
                Err(e) => return Err(Failure::Session(e.into())),
            };
        }
        let rows = match rows {
            Ok(rows) => rows,
            Err(e) if (lock.value.is_some() || lock.owner.is_some()) && !e.is_connection_lost() => {
                return Err(self.campaign_failed(lock, e).await);
            }
            Err(e) => return Err(Self::failure(e.lock_table_full())),
        };
        let token = crate::acquire::token(&rows).map_err(Failure::Request)?;
        if token.is_some() {
            // Every granted take sets the hold's timeouts (the kept take: they were already).
            self.idle_set = Some(millis(idle));
            self.count(lock, true);
            if let Mode::Permits(_) = lock.mode {
                let slot = crate::acquire::slot(&rows).map_err(Failure::Request)?;
                self.slots.entry(lock.id).or_default().push(slot);
            }
        }
        Ok(token)
    }

    async fn unlock(&mut self, lock: &Advisory, afterwards: Afterwards) -> Result<bool, Failure> {
        let Some((sql, slot)) = self.unlock_sql(lock, afterwards) else {
            return Ok(false);
        };
        let rows = self.run(&sql, "release").await?;
        if afterwards == Afterwards::Retiring {
            self.idle_set = None;
        }
        self.count(lock, false);
        if let Some(slot) = slot {
            self.forget_slot(lock.id, slot);
        }
        Ok(rows
            .first()
            .and_then(|r| r.try_get::<Option<bool>, _>(0).ok().flatten())
            .unwrap_or(false))
    }

    async fn keep(&mut self, idle: Option<Duration>) -> Result<(), Failure> {
        if let Some(idle) = idle {
            let keep = Statement::Simple(Sql::keep(millis(idle)));
            self.run(&keep, "extend").await?;
            self.idle_set = Some(millis(idle));
            return Ok(());
        }
        match timeout(self.inner.config.response_timeout, self.lent.raw().ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Failure::Session(
                Error::Sql {
                    op: "extend",
                    source: e,
                }
                .into(),
            )),
            Err(_) => Err(Failure::Session(self.inner.no_answer("extend").into())),
        }
    }

    fn lingering(&mut self) {
        self.unproven = true;
    }

    async fn rest(&mut self) -> Result<(), Failure> {
        if self.idle_set.is_some() {
            self.run(&Sql::rest(), "release").await?;
            self.idle_set = None;
        }
        Ok(())
    }

    fn id(&self) -> u64 {
        u64::try_from(self.lent.pid()).unwrap_or(0)
    }

    fn retire(self) {
        self.lent.give_back();
    }

    /// A statement about a lock this session holds (a reentrant hold's count change), and
    /// its operation's name for errors.
    type Call = (Statement, &'static str);
    type Answer = Vec<sqlx::postgres::PgRow>;

    async fn call(
        &mut self,
        _: &Advisory,
        (statement, op): Self::Call,
    ) -> Result<Self::Answer, Failure> {
        self.run(&statement, op).await
    }

    fn call_op((_, op): &Self::Call) -> &'static str {
        op
    }
}
