//! A lock connection as a [`Session`] of [`dlock_core::raw::carrier`]: one PostgreSQL session
//! that holds many advisory locks, kept alive by one ping per renewal gap.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::carrier::{Failure, Session};
use sqlx::{Connection, Row};
use tokio::time::timeout;

use crate::backend::Inner;
use crate::error::Error;
use crate::pool::Lent;
use crate::sql::{Sql, millis};

/// A lock connection carrying advisory locks (named by their id in the key table).
pub(crate) struct PgSession {
    pub(crate) inner: Arc<Inner>,
    pub(crate) lent: Lent,
    /// Taken idle from the pool and not used since: it may have died while idle (a server
    /// restart), which its first statement finds out.
    pub(crate) unproven: bool,
}

impl PgSession {
    fn failure(e: Error) -> Failure {
        if e.is_connection_lost() {
            Failure::Session(e.into())
        } else {
            Failure::Request(e.into())
        }
    }

    async fn run(
        &mut self,
        sql: &str,
        op: &'static str,
    ) -> Result<Vec<sqlx::postgres::PgRow>, Failure> {
        self.inner
            .run(&mut self.lent, sql, op)
            .await
            .map_err(Self::failure)
    }
}

#[async_trait]
impl Session for PgSession {
    type Lock = i32;

    async fn try_lock(&mut self, id: &i32, idle: Duration) -> Result<Option<u64>, Failure> {
        let sql = self.inner.sql.try_take(*id, millis(idle));
        let mut rows = self.inner.run(&mut self.lent, &sql, "acquire").await;
        if std::mem::take(&mut self.unproven)
            && let Err(e) = &rows
            && e.is_connection_lost()
        {
            // The idle connection had died (the lock was not taken, or its session ended
            // with it): once more on a new one, instead of a ping before every first use.
            tracing::debug!(error = %e, "an idle lock connection was dead; reconnecting");
            rows = match self.lent.reconnect().await {
                Ok(()) => self.inner.run(&mut self.lent, &sql, "acquire").await,
                Err(e) => Err(e),
            };
        }
        let rows = rows.map_err(|e| Self::failure(e.lock_table_full()))?;
        crate::acquire::token(&rows).map_err(Failure::Request)
    }

    async fn unlock(&mut self, id: &i32, last: bool) -> Result<bool, Failure> {
        let sql = if last {
            self.inner.sql.release(*id)
        } else {
            self.inner.sql.unlock(*id)
        };
        let rows = self.run(&sql, "release").await?;
        Ok(rows
            .first()
            .and_then(|r| r.try_get::<Option<bool>, _>(0).ok().flatten())
            .unwrap_or(false))
    }

    async fn keep(&mut self, idle: Option<Duration>) -> Result<(), Failure> {
        if let Some(idle) = idle {
            return self.run(&Sql::keep(millis(idle)), "extend").await.map(drop);
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

    fn id(&self) -> u64 {
        u64::try_from(self.lent.pid()).unwrap_or(0)
    }

    fn retire(self) {
        self.lent.give_back();
    }
}
