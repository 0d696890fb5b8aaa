//! This client's lease of a reentrant hold whose lock it holds (an [`Anchor`]): renewals
//! are the holder connection's pings, and releases count down on that connection.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::Result;
use dlock_core::raw::Held;
use sqlx::Row;

use super::sql::On;
use super::{Anchor, OnHolder};
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

/// Release one lease of `anchor`'s hold in its own client: the count down by one (on the
/// holder connection, or when that one changed nothing a side connection), and at zero the
/// lock given back (its holder connection).
async fn release_local(inner: Arc<Inner>, anchor: Arc<Anchor>) -> Result<()> {
    let (id, token, owner) = (anchor.id, anchor.token, &anchor.owner);
    let on = On::Holder { token };
    let sql = inner.sql.release_owned(id, token, false, owner, on);
    // The count left, if the release went through; the lease leaves the anchor either way.
    let counted = match anchor.on_holder(sql, "release").await {
        OnHolder::Rows(rows) => Ok(rows),
        // Lost under the statement, which may have counted.
        OnHolder::Gone => Ok(Vec::new()),
        OnHolder::AskSide => {
            let sql = inner.sql.release_owned(id, token, false, owner, On::Side);
            inner.side_statement("release", &sql).await
        }
    };
    let left = match counted {
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
