//! Stopping a statement that waits on the server (at a deadline, when the server stays
//! silent, or when the caller goes away) so that it can never take the lock later, and
//! putting its connection right afterwards.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Future;
use tokio::time::{Instant, sleep_until, timeout};

use crate::backend::{Batch, Inner};
use crate::pool::Lent;
use crate::sql::End;

/// How long a killed statement gets to answer before the next, stronger kill.
const KILL_GRACE: Duration = Duration::from_secs(1);

/// Sleep until `at`; with none, forever.
pub(crate) async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Inner {
    /// Stop the statement running on connection `id` so that it can never take the lock
    /// later, and wait (briefly) for `run` to see it end. `KILL QUERY` first, which keeps
    /// the session; then `KILL`, which ends it. Returns whether `run` finished.
    pub(crate) async fn interrupt<F>(&self, id: u64, mut run: Pin<&mut F>) -> bool
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
    /// then return the connection. A connection that was lost, or whose
    /// statement never answered, is closed: the server rolls its session back.
    pub(crate) async fn settle(self: &Arc<Self>, lent: Lent, late: Option<Batch>) {
        match late {
            Some(Batch { error: Some(e), .. }) if e.is_connection_lost() => {}
            Some(_) => {
                let _ = self.finish(lent, End::Rollback).await;
            }
            None => {}
        }
    }
}
