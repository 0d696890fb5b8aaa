//! Another client's lease of a reentrant hold: the first client keeps the lock, this one
//! counts in the hold's row.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::Held;
use dlock_core::{LockError, LostReason, Owner, Result};

use super::sql::On;
use crate::NAME;
use crate::backend::Inner;

/// A lease of a reentrant hold whose lock another client holds: renewals and releases are
/// row updates on a side connection.
pub(super) struct Remote {
    pub(super) inner: Arc<Inner>,
    pub(super) key: String,
    pub(super) id: i32,
    pub(super) owner: Owner,
    pub(super) token: u64,
    pub(super) released: bool,
}

impl fmt::Debug for Remote {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remote")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

/// Release one lease of another client's hold: the count down by one, a zero notified.
async fn release_remote(
    inner: Arc<Inner>,
    key: String,
    id: i32,
    owner: Owner,
    token: u64,
) -> Result<()> {
    let sql = inner.sql.release_owned(id, token, true, &owner, On::Side);
    let rows = inner.side_statement("release", &sql).await?;
    if rows.is_empty() {
        return Err(LockError::not_held(NAME, &key, LostReason::NotHeld));
    }
    Ok(())
}

#[async_trait]
impl Held for Remote {
    /// Checks the hold is live and keeps it `ttl` more for when the first client's leases
    /// are gone (the first client keeps the lock's session alive).
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let sql = self.inner.sql.extend_owned(self.id, self.token, ttl);
        let rows = self
            .inner
            .side("extend", &sql, Some(self.owner.as_str()))
            .await?;
        if rows.is_empty() {
            return Err(LockError::not_held(NAME, &self.key, LostReason::NotHeld));
        }
        Ok(())
    }

    async fn release(&mut self) -> Result<()> {
        self.released = true;
        release_remote(
            self.inner.clone(),
            self.key.clone(),
            self.id,
            self.owner,
            self.token,
        )
        .await
    }
}

impl Drop for Remote {
    fn drop(&mut self) {
        if !self.released {
            let release = release_remote(
                self.inner.clone(),
                self.key.clone(),
                self.id,
                self.owner,
                self.token,
            );
            dlock_core::raw::spawn_cleanup(async move {
                let _ = release.await;
            });
        }
    }
}
