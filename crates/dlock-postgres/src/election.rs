//! Elections: a candidate's hold is an exclusive hold whose grant also writes the key's row
//! in the election table (`{table}_elect`: the holding session's pid, the term, the value),
//! in the granting statement; its release deletes the row in the releasing one. A row is
//! trusted only while `pg_locks` shows its session holding the key's lock (and it was
//! written in this run of the server: a pid may be reused after a restart), so the row a
//! crashed leader left behind is ignored (and overwritten by the next leader's grant).
//! Grants, proclaims and releases notify the namespace's leader channel; observers
//! `LISTEN` on it through one listener connection per client.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Grant, Held};
use dlock_core::{Leader, LockError, LostReason, Result};
use futures::stream::{self, BoxStream, StreamExt};
use sqlx::Row;
use tokio::sync::watch;
use tokio::time::timeout;

use crate::NAME;
use crate::backend::Inner;
use crate::error::Error;
use crate::permits::Registration;

/// How long an observer goes without reading the leader: the bound on seeing a leader
/// whose session ended without a release (a crash, `pg_terminate_backend`, its idle
/// timeout), which notifies nobody. One read (`pg_locks`) per observer per second; the
/// permit waiters' re-check is the same. A listener that has not listened for longer ends
/// the observers' streams (see [`Inner::leader_changes`]).
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// A candidate's hold: the holder connection's hold, and what a proclaim needs.
pub(crate) struct Elected {
    held: Box<dyn Held>,
    inner: Arc<Inner>,
    key: String,
    id: i32,
    term: u64,
}

impl Elected {
    /// `grant` (of a campaign for `key`, lock id `id`) with a hold that can proclaim.
    pub(crate) fn wrap(inner: Arc<Inner>, key: &str, id: i32, mut grant: Grant) -> Grant {
        grant.held = Box::new(Self {
            held: grant.held,
            inner,
            key: key.to_owned(),
            id,
            term: grant.fencing_token,
        });
        grant
    }
}

impl std::fmt::Debug for Elected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elected")
            .field("held", &self.held)
            .field("term", &self.term)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Held for Elected {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.held.extend(ttl).await
    }

    async fn release(&mut self) -> Result<()> {
        self.held.release().await
    }

    /// On a side connection, one statement: the row's value, only while the row is this
    /// term's and its session holds the key (owner-checked by `pg_locks`).
    async fn proclaim(&mut self, value: &str) -> Result<()> {
        let sql = self.inner.sql.proclaim(self.id, self.term);
        let rows = self.inner.side("proclaim", &sql, Some(value)).await?;
        if rows.is_empty() {
            return Err(LockError::not_held(NAME, &self.key, LostReason::NotHeld));
        }
        Ok(())
    }
}

impl Inner {
    /// Refuse an election when the election table is missing (it could not be created).
    pub(crate) fn check_elections(&self, op: &'static str) -> Result<()> {
        if self.elections.load(Ordering::Relaxed) {
            return Ok(());
        }
        Err(LockError::backend(
            NAME,
            op,
            format!(
                "the election table `{}_elect` is missing and could not be created (see the \
                 crate docs, Elections)",
                self.config.table
            ),
        ))
    }

    /// The leader of `key`: one statement on a side connection.
    pub(crate) async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        self.check_elections("leader")?;
        let rows = self.side("leader", &self.sql.leader(), Some(key)).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let value: String = row.try_get(0).map_err(Error::sql("leader"))?;
        let term: i64 = row.try_get(1).map_err(Error::sql("leader"))?;
        Ok(Some(Leader::new(value, u64::try_from(term).unwrap_or(0))))
    }

    /// Wake-ups for the observers of `key`: registered with the client's leader listener,
    /// and returned once the server has confirmed the listener's `LISTEN` (at most the
    /// connect timeout plus the response timeout, else [`LockError::Unavailable`]), so
    /// that no change made after it returns goes unheard. The stream ends with
    /// `Unavailable` once the listener has not listened for longer than [`RECHECK`] (its
    /// connection lost or refused): the observer's re-reads no longer make up for it.
    pub(crate) async fn leader_changes(
        &self,
        key: &str,
    ) -> Result<Option<BoxStream<'static, Result<()>>>> {
        self.check_elections("observe")?;
        let id = self.lock_id(key).await?;
        let registration = self.leader_waits.register(id);
        let ready = self.leader_waits.listens(self, "observe").await?;
        let down = self.leader_waits.down(
            "observe",
            &format!("has not listened for more than {RECHECK:?}"),
        );
        let observing = Observing {
            registration,
            ready,
            down: Some(down),
        };
        let changes = stream::unfold(observing, |mut observing| async move {
            let change = observing.next().await?;
            Some((change, observing))
        });
        Ok(Some(changes.boxed()))
    }

    /// Create the election table if missing; `false` when it is missing and cannot be
    /// created (elections are then refused, everything else works).
    pub(crate) async fn prepare_elections(&self) -> bool {
        let exists = |rows: &[sqlx::postgres::PgRow]| -> bool {
            rows.first()
                .and_then(|r| r.try_get::<Option<bool>, _>(0).ok().flatten())
                .unwrap_or(false)
        };
        match self.side("connect", &self.sql.elect_exists(), None).await {
            Ok(rows) if exists(&rows) => return true,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(error = %e, "could not look for the election table");
                return false;
            }
        }
        match self
            .side("create table", &self.sql.create_elect(), None)
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    table = %format!("{}_elect", self.config.table),
                    "the election table is missing and could not be created: elections are off"
                );
                false
            }
        }
    }
}

/// One observer's wake-ups: its registration, and the listener's state to follow.
struct Observing {
    registration: Registration,
    ready: watch::Receiver<bool>,
    /// The error that ends the stream (`None` once yielded).
    down: Option<LockError>,
}

impl Observing {
    /// The next wake-up, an error once the listener has not listened for longer than
    /// [`RECHECK`] (or has stopped), then the end.
    async fn next(&mut self) -> Option<Result<()>> {
        loop {
            self.down.as_ref()?;
            let listens = *self.ready.borrow_and_update();
            if !listens {
                return match timeout(RECHECK, self.ready.wait_for(|listens| *listens)).await {
                    // Listening again: changes meanwhile were not notified, read again.
                    Ok(Ok(_)) => Some(Ok(())),
                    Ok(Err(_)) | Err(_) => self.down.take().map(Err),
                };
            }
            tokio::select! {
                () = self.registration.notified() => return Some(Ok(())),
                changed = self.ready.changed() => {
                    if changed.is_err() {
                        // The listener stopped (the client is gone).
                        return self.down.take().map(Err);
                    }
                }
            }
        }
    }
}
