//! What completes a grant besides the row lock: the hold's record in `{table}_held` (see
//! *Inspecting* in the crate docs), in the locking statement where the server can, else a
//! statement of its own; and on MySQL 8 the token, from the key's counter after the grant.

use dlock_core::Result;
use sqlx::Row;
use tokio::time::Instant;

use crate::acquire::{Attempt, Step};
use crate::backend::{Batch, Inner};
use crate::error::Error;
use crate::pool::Lent;
use crate::sql::{Holder, Sql};

impl Attempt {
    /// The grant of a [`Sql::wait_take`] batch: recorded in its locking statement where
    /// [`Sql::records_in_lock`], else by [`Self::record_after_wait`].
    pub(crate) async fn granted_after_wait(&self, lent: &mut Lent, batch: &Batch) -> Step {
        match self.inner.sql.records_in_lock() {
            true => locked_token(batch),
            false => self.record_after_wait(lent, batch).await,
        }
    }

    /// The grant of a waiting batch, recorded in `{table}_held` by a statement of its own.
    /// A waiting batch ends with its locking read: a kill sent as the caller gives up may
    /// land just after the grant, and must find the session idle, not between two
    /// statements of a batch (MariaDB then leaves the batch unanswered, and only `KILL`
    /// of the whole session, a second later, frees the key). One more round trip, paid
    /// only after a wait whose locking statement could not record the hold.
    pub(crate) async fn record_after_wait(&self, lent: &mut Lent, batch: &Batch) -> Step {
        let step = locked_token(batch);
        if !matches!(step, Step::Granted(_)) {
            return step;
        }
        // Alone, the statement still sees the locking read's row count and token.
        let recorded = self.inner.run(lent, &self.record_holder(), "acquire").await;
        recorded.error.map_or(step, Step::Failed)
    }

    /// The hold as its granting statement records it: this key, and the client's
    /// description or a candidate's value.
    pub(crate) fn holder(&self) -> Holder<'_> {
        Holder {
            key: &self.key,
            who: self
                .value
                .as_deref()
                .unwrap_or(dlock_core::holder_description()),
        }
    }

    /// The statement that records the hold in `{table}_held` right after a locking read
    /// that did not (see `inspect`): a permit's slot, or MySQL 8's `SELECT`.
    pub(crate) fn record_holder(&self) -> String {
        let Holder { key, who } = self.holder();
        self.inner
            .sql
            .record_holder(&self.name, key, self.mode, who)
    }

    /// A token from the key's counter (side connection), then the keep on the holder.
    pub(crate) async fn fence_and_keep(&self, lent: &mut Lent) -> Result<(u64, Instant)> {
        let token = self.inner.next_fence(&self.name, lent.id()).await?;
        let sent_at = Instant::now();
        let sql = format!(
            "{};{}",
            Sql::keep(self.idle),
            self.inner.sql.record_token(&self.name, token)
        );
        let batch = self.inner.run(lent, &sql, "acquire").await;
        if batch.error.is_none() {
            lent.set_lease_idle(Some(self.idle));
        }
        // Failed: the session ended (or went silent) since the grant; the lock is gone, or
        // will be when the server ends the session.
        batch.error.map_or(Ok((token, sent_at)), |e| Err(e.into()))
    }
}

/// The granted step of a batch whose last statement locked the row and drew its token.
pub(crate) fn locked_token(batch: &Batch) -> Step {
    let token = batch.rows.last().map(|row| row.try_get::<u64, _>(0));
    match token {
        Some(Ok(token)) => Step::Granted(token),
        Some(Err(e)) => Step::Failed(Error::sql("acquire")(e)),
        None => Step::Failed(Error::Sql {
            op: "acquire",
            source: sqlx::Error::RowNotFound,
        }),
    }
}

impl Inner {
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
}
