//! A held advisory lock: the connection whose session holds it. Renewal pings it (a failed
//! ping means the session, and the lock, is gone or cannot be trusted); release unlocks it,
//! which grants it to the next waiter in the server's queue.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::Held;
use dlock_core::{LockError, LostReason, Result};
use sqlx::{Connection, Row};
use tokio::time::timeout;

use crate::NAME;
use crate::backend::Inner;
use crate::error::Error;
use crate::pool::Lent;
use crate::sql::{Sql, millis};

/// A held advisory lock: the connection whose session holds it.
pub(crate) struct PostgresHeld {
    inner: Arc<Inner>,
    key: String,
    id: i32,
    /// `None` once released, or once the connection failed.
    conn: Option<Lent>,
    /// The session's `idle_session_timeout`, in milliseconds.
    idle_ms: u64,
    /// A call was in flight; if it was dropped there, the connection cannot be trusted.
    in_flight: bool,
}

impl PostgresHeld {
    pub(crate) fn new(inner: Arc<Inner>, key: String, id: i32, conn: Lent, idle_ms: u64) -> Self {
        Self {
            inner,
            key,
            id,
            conn: Some(conn),
            idle_ms,
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

impl fmt::Debug for PostgresHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresHeld")
            .field("key", &self.key)
            .field("id", &self.id)
            .field("pid", &self.conn.as_ref().map(Lent::pid))
            .field("idle_ms", &self.idle_ms)
            .finish()
    }
}

#[async_trait]
impl Held for PostgresHeld {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let idle_ms = millis(ttl);
        let same = idle_ms == self.idle_ms;
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
            inner.run(lent, &Sql::keep(idle_ms), "extend").await.err()
        };
        self.in_flight = false;
        match outcome {
            None => {
                self.idle_ms = idle_ms;
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
        let Some(mut lent) = lent else {
            return Err(self.not_held("the holding connection was closed"));
        };
        let sql = self.inner.sql.release(self.id);
        match self.inner.run(&mut lent, &sql, "release").await {
            Ok(rows) => {
                let held = rows
                    .first()
                    .and_then(|r| r.try_get::<Option<bool>, _>(0).ok().flatten())
                    .unwrap_or(false);
                lent.give_back();
                if held {
                    Ok(())
                } else {
                    Err(self.not_held("the session did not hold the lock"))
                }
            }
            // No answer: whether it went through is unknown; the closed connection frees
            // the lock when the server notices.
            Err(e @ Error::NoAnswer { .. }) => Err(e.into()),
            Err(e) => Err(self.not_held(e)),
        }
    }
}

impl Drop for PostgresHeld {
    fn drop(&mut self) {
        let Some(mut lent) = self.conn.take().filter(|_| !self.in_flight) else {
            return;
        };
        // Not released: unlock in the background if there is a runtime; otherwise the
        // closed connection makes the server free the lock.
        let (inner, sql) = (self.inner.clone(), self.inner.sql.release(self.id));
        dlock_core::raw::spawn_cleanup(async move {
            if inner.run(&mut lent, &sql, "abandon").await.is_ok() {
                lent.give_back();
            }
        });
    }
}
