//! An owner's wait for a key held by someone else (row mode): the mutex's wait in rounds of
//! [`OWNER_ROUND`], looking between rounds whether the owner took the key meanwhile in
//! another client, to enter its hold again (see `reentry`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use dlock_core::raw::Deadline;
use tokio::time::Instant;

use super::OWNER_ROUND;
use crate::acquire::{Attempt, Guarded, Step};
use crate::pool::Lent;
use crate::sql::Sql;

impl Attempt {
    /// Wait for the row in rounds of [`OWNER_ROUND`] (the session's lock wait, so a round
    /// ends on the server, without a kill), until the deadline; between rounds, enter the
    /// owner's hold again if it holds the key now.
    pub(crate) async fn owner_wait(&mut self, lent: &mut Lent) -> Step {
        let deadline = match self.deadline {
            Deadline::At(at) => Some(at),
            Deadline::TryOnce | Deadline::Never => None,
        };
        let owner = self.owner.expect("an owner's wait");
        loop {
            let set = self.idle_to_set(lent);
            let lock_wait = (lent.lock_wait() != Some(OWNER_ROUND)).then_some(OWNER_ROUND);
            let mut sql = lock_wait.map_or_else(String::new, |s| format!("{};", Sql::lock_wait(s)));
            let take = self
                .inner
                .sql
                .wait_take(&self.name, self.mode, set, self.holder());
            sql.push_str(&take);
            self.sent_at = Instant::now();
            let silent = self.sent_at
                + Duration::from_secs(OWNER_ROUND.into())
                + self.inner.config.response_timeout;
            lent.set_lock_wait(None);
            let batch = match self
                .guarded(lent, sql.as_str(), deadline, silent, set)
                .await
            {
                Guarded::Done(batch) => batch,
                Guarded::Stopped { why, late } => return Step::Stopped { why, late },
            };
            if batch.done >= usize::from(lock_wait.is_some()) {
                lent.set_lock_wait(Some(OWNER_ROUND));
            }
            match batch.error {
                None if batch.granted() => {
                    self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                    return self.granted_after_wait(lent, &batch).await;
                }
                // An operator deleted the row while we waited on it.
                None => return Step::Restart,
                Some(e) if e.is_lock_busy() => {
                    match self.inner.reenter(&self.key, owner, self.ttl).await {
                        Ok(Some(grant)) => return Step::Reentered(Ok(grant)),
                        Ok(None) if self.deadline.may_wait() => {}
                        Ok(None) => return Step::Busy,
                        Err(e) => return Step::Reentered(Err(e)),
                    }
                }
                Some(e) if e.is_deadlock() => return Step::Restart,
                Some(e) => return Step::Failed(e),
            }
        }
    }
}
