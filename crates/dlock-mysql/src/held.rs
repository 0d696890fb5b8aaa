//! A held row lock: the connection whose open transaction holds it. Renewal pings it (a
//! failed ping means the session, and the lock, is gone); release commits, which hands the
//! row to the next waiter. The row stays for the key's next use.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::Held;
use dlock_core::{LockError, LostReason, Result};
use sqlx::Connection;
use tokio::time::timeout;

use crate::NAME;
use crate::backend::Inner;
use crate::error::Error;
use crate::pool::Lent;
use crate::sql::{self, End, LOCK_WAIT_ROUND, Sql};

/// The shortest lease idle timeout (seconds) a released connection keeps in the pool;
/// shorter ones are restored to the server's default at release.
const KEEP_IDLE_FROM: u32 = 10;

/// A held row lock: the connection whose open transaction holds it.
pub(crate) struct MysqlHeld {
    inner: Arc<Inner>,
    key: String,
    /// `None` once released, or once the connection failed.
    conn: Option<Lent>,
    /// The session's idle timeout, in seconds.
    idle: u32,
    /// A call was in flight; if it was dropped there, the connection cannot be trusted.
    in_flight: bool,
}

impl MysqlHeld {
    /// The lock held by the open transaction on `conn`, whose session idle timeout is
    /// `idle` seconds.
    pub(crate) fn new(inner: Arc<Inner>, key: String, conn: Lent, idle: u32) -> Self {
        Self {
            inner,
            key,
            conn: Some(conn),
            idle,
            in_flight: false,
        }
    }

    fn not_held(&self, why: impl fmt::Display) -> LockError {
        LockError::not_held(NAME, &self.key, LostReason::SessionEnded(why.to_string()))
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
            let error = inner.run(lent, &Sql::keep(idle), "extend").await.error;
            if error.is_none() {
                lent.set_lease_idle(Some(idle));
            }
            error
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

    /// Update the hold's own `{table}_held` row on the holding connection, inside the
    /// holding transaction: undone with the hold, and owner-checked by `conn =
    /// CONNECTION_ID()`. No row, or a failed connection: the hold is gone.
    async fn proclaim(&mut self, value: &str) -> Result<()> {
        if self.conn().is_none() {
            return Err(self.not_held("the holding connection is closed"));
        }
        let sql = self
            .inner
            .sql
            .proclaim_row(&sql::row_name(&self.key), value);
        self.in_flight = true;
        let lent = self.conn.as_mut().expect("checked above");
        let batch = self.inner.run(lent, &sql, "proclaim").await;
        self.in_flight = false;
        match batch.error {
            // sqlx asks for found rows: a value proclaimed twice still matches the row.
            None if batch.affected > 0 => Ok(()),
            None => {
                // The transaction no longer holds the row (it was rolled back): neither
                // the key nor the connection can be trusted.
                self.conn = None;
                Err(self.not_held("the hold's record is gone"))
            }
            Some(e) if e.is_connection_lost() || matches!(e, Error::NoAnswer { .. }) => {
                self.conn = None;
                Err(self.not_held(e))
            }
            // The statement failed; the transaction, and the hold, go on.
            Some(e) => Err(e.into()),
        }
    }

    async fn release(&mut self) -> Result<()> {
        let lent = self.conn().is_some().then(|| self.conn.take()).flatten();
        let Some(lent) = lent else {
            return Err(self.not_held("the holding connection was closed"));
        };
        match self.inner.finish(lent, End::Release).await {
            Finished::Ended => Ok(()),
            Finished::Failed(e) => Err(self.not_held(e)),
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
        let inner = self.inner.clone();
        dlock_core::raw::spawn_cleanup(async move {
            let _ = inner.finish(lent, End::Rollback).await;
        });
    }
}

/// How an ending transaction went.
pub(crate) enum Finished {
    /// The `COMMIT` / `ROLLBACK` went through.
    Ended,
    /// It failed: the session is gone, or refused it.
    Failed(Error),
    /// No answer: whether it went through is unknown.
    Unknown(Error),
}

impl Inner {
    /// End the lock transaction on `lent`, restore the session and return the connection
    /// to the pool.
    pub(crate) async fn finish(&self, mut lent: Lent, end: End) -> Finished {
        let op = match end {
            End::Release => "release",
            End::Rollback => "abandon",
        };
        // A released connection keeps a long idle timeout (the next acquire of that ttl
        // sends no `SET`); a short one is restored, or the pool would drop it too soon.
        let restore = lent.lease_idle().is_some_and(|idle| idle < KEEP_IDLE_FROM);
        // A permit wait shortens the lock wait; the next user of the connection expects
        // the usual round.
        let lock_wait = lent.lock_wait() != Some(LOCK_WAIT_ROUND);
        let mut sql = Sql::finish(end, restore);
        if lock_wait {
            sql.push(';');
            sql.push_str(&Sql::lock_wait(LOCK_WAIT_ROUND));
        }
        let sql = Sql::release_creation_lock(&sql, lent.creation_lock());
        let batch = self.run(&mut lent, &sql, op).await;
        tracing::debug!(id = lent.id(), ?end, done = batch.done, error = ?batch.error, "finish");
        match batch.error {
            None => {
                if restore {
                    lent.set_lease_idle(None);
                }
                lent.set_lock_wait(Some(LOCK_WAIT_ROUND));
                lent.set_creation_lock(None);
                lent.give_back();
                Finished::Ended
            }
            // The transaction ended; only restoring the session failed: close it.
            Some(e) if batch.done >= 1 => {
                tracing::debug!(error = %e, "closing a connection that could not be reset");
                Finished::Ended
            }
            Some(e @ Error::NoAnswer { .. }) => Finished::Unknown(e),
            Some(e) => Finished::Failed(e),
        }
    }
}
