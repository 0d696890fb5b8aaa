//! A lease of a reentrant hold in the client that took it first: it shares that client's
//! anchor (the lock on its holder connection), and its release counts down in the hold's
//! row, giving the lock back at zero.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::Result;
use dlock_core::raw::Held;
use sqlx::Row;

use super::Anchor;
use crate::backend::Inner;
use crate::error::Error;

/// A lease of a reentrant hold in the client that holds its lock.
pub(super) struct Local {
    pub(super) inner: Arc<Inner>,
    pub(super) anchor: Arc<Anchor>,
    pub(super) released: bool,
}

impl fmt::Debug for Local {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Local")
            .field("key", &self.anchor.key)
            .field("owner", &self.anchor.owner)
            .field("token", &self.anchor.token)
            .finish_non_exhaustive()
    }
}

/// Release one lease of `anchor`'s hold in its own client: the count down by one (a side
/// connection), and at zero the lock given back (its holder connection).
async fn release_local(inner: Arc<Inner>, anchor: Arc<Anchor>) -> Result<()> {
    let sql = inner.sql.release_owned(
        anchor.id,
        anchor.token,
        false,
        &anchor.owner,
        anchor.session.get().copied(),
    );
    // The count left, if the release went through; the lease leaves the anchor either way.
    let left = match inner.side_statement("release", &sql).await {
        Ok(rows) => match rows.first() {
            Some(row) => row
                .try_get::<i32, _>(0)
                .map(|left| Some(i64::from(left)))
                .map_err(Error::sql("release")),
            None => Ok(None),
        },
        Err(e) => Err(e),
    };
    let freed = anchor
        .leave(&inner, left.as_ref().ok().copied().flatten())
        .await;
    match left {
        Err(e) => Err(e.into()),
        Ok(None) => Err(anchor.not_held()),
        Ok(Some(_)) => freed,
    }
}

#[async_trait]
impl Held for Local {
    /// The holder connection's keep (a ping), with the longest ttl any lease of the hold
    /// asked.
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let ttl = {
            let mut state = self.anchor.state();
            state.ttl = state.ttl.max(ttl);
            state.ttl
        };
        let mut held = self.anchor.held.lock().await;
        match held.as_mut() {
            Some(held) => held.extend(ttl).await,
            None => Err(self.anchor.not_held()),
        }
    }

    async fn release(&mut self) -> Result<()> {
        self.released = true;
        release_local(self.inner.clone(), self.anchor.clone()).await
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        if !self.released {
            let release = release_local(self.inner.clone(), self.anchor.clone());
            dlock_core::raw::spawn_cleanup(async move {
                let _ = release.await;
            });
        }
    }
}
