//! Reentrant holds ([`Owner`]): the lock stays where it is (row mode: the first client's
//! open transaction; named mode: its holder connection), and a committed `{table}_owner`
//! row beside it keeps the owner, the hold (its fencing token) and the count of its leases
//! not released yet, written in autocommit on side connections so that every client sees
//! and changes it (see the crate docs' *Reentrant holds*).
//!
//! Every statement on the row is owner-checked by the owner, the token and the hold being
//! current: row mode, the hold's uncommitted `{table}_held` record exists (a dirty read);
//! named mode, the key's fence row names that token and the connection `IS_USED_LOCK`
//! names. A row whose hold is gone (its holder crashed) is stale: ignored, deleted by the
//! next lease that finds it so, and overwritten by the key's next owner hold.
//!
//! The client that took the hold keeps its lock in a [`Keeper`]: its own leases renew the
//! session through it; when they are all released while leases of other clients still
//! count, it keeps the session and polls the count every [`POLL_EVERY`] until it reaches
//! zero (or every other lease stopped renewing), then deletes the row and lets go.
//!
//! Every lease of the hold in that client, the first or a re-entry, carries the session's
//! loss signal ([`Keeper::session_lost`]): the lock's own signal (named mode's holder
//! connection), the hold's end, or the session's idle timeout that could have run out since
//! the last renewal of the session that succeeded, whichever lease sent it. A re-entry's
//! own timing starts at its statement on a side connection, later than the session's idle
//! clock: without the shared signal, a re-entry left alone after the first lease's release
//! would hear of a partition only after the server could give the key away. A re-entry
//! whose statement is not answered by then answers unavailable (its statement, if it counted,
//! is released).

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Grant, Held};
use dlock_core::{ErrorKind, LockError, LostReason, Owner, Result};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use sqlx::Row;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::NAME;
use crate::backend::Inner;
use crate::sql::row_name;

mod sql;
mod wait;

/// How often the client that holds the lock reads the count once its own leases are all
/// released while leases of other clients still count.
pub(crate) const POLL_EVERY: Duration = Duration::from_millis(100);

/// An owner's wait for a key someone else holds ends every this many seconds (row mode: the
/// session's `innodb_lock_wait_timeout`; named mode: `GET_LOCK`'s timeout) to look whether
/// the owner took the key meanwhile, in another client (a hold taken just after this
/// acquire last looked).
pub(crate) const OWNER_ROUND: u32 = 1;

/// The first two columns of the first row of an answer: (rows matched, value).
fn counted(rows: &[sqlx::mysql::MySqlRow]) -> Result<(i64, u64)> {
    let row = rows.first().ok_or_else(|| {
        LockError::backend(NAME, "reentry", "the count statement returned no row")
    })?;
    let matched = row
        .try_get::<i64, _>(0)
        .map_err(|e| LockError::backend(NAME, "reentry", e))?;
    let value = row
        .try_get::<u64, _>(1)
        .map_err(|e| LockError::backend(NAME, "reentry", e))?;
    Ok((matched, value))
}

/// The holds this client took first, by row name, while they last.
#[derive(Default)]
pub(crate) struct Keepers(Mutex<HashMap<String, Arc<Keeper>>>);

impl Keepers {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Keeper>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The hold of `name` this client keeps, if any.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Keeper>> {
        self.map().get(name).cloned()
    }

    fn remove(&self, keeper: &Keeper) {
        let mut map = self.map();
        if map
            .get(&keeper.name)
            .is_some_and(|k| k.token == keeper.token)
        {
            map.remove(&keeper.name);
        }
    }
}

/// An owner's hold in the client that took it: its lock (the first grant's handle), and
/// how many of its leases live in this client.
pub(crate) struct Keeper {
    key: String,
    name: String,
    pub(crate) owner: Owner,
    token: u64,
    /// The first grant's handle; `None` once the hold ended.
    held: tokio::sync::Mutex<Option<Box<dyn Held>>>,
    /// The longest ttl a lease asked for: the session is never kept for less.
    ttl: Mutex<Duration>,
    /// Leases of the hold alive in this client.
    local: AtomicUsize,
    polling: AtomicBool,
    ended: watch::Sender<bool>,
    /// When the last command on the holding session that succeeded was sent: the server
    /// keeps the session at least the longest ttl after it.
    alive: watch::Sender<Instant>,
    /// The lock's own loss signal (named mode's holder connection; never in row mode).
    lock_lost: Shared<BoxFuture<'static, LostReason>>,
}

/// How long before the session's idle timeout could end it its leases are told: the
/// watchdog's safety margin (a tenth of the ttl and 2 ms).
fn safety_margin(ttl: Duration) -> Duration {
    ttl / 10 + Duration::from_millis(2)
}

impl Keeper {
    /// Resolves once the hold has ended (released or lost).
    pub(crate) async fn ended(&self) {
        let mut ended = self.ended.subscribe();
        let _ = ended.wait_for(|e| *e).await;
    }

    fn not_held(&self, why: &str) -> LockError {
        LockError::not_held(NAME, &self.key, LostReason::SessionEnded(why.to_owned()))
    }

    /// Resolves when the session holding the lock is gone or may be: its own loss signal,
    /// or its idle timeout could have run out since the last renewal that succeeded (by
    /// any lease of this client), or (with `ended`) the hold ended. Every lease of the hold
    /// in this client carries it, so each hears the loss before the server can give the key
    /// away, whichever lease renewed last.
    pub(crate) fn session_lost(self: &Arc<Self>, ended: bool) -> BoxFuture<'static, LostReason> {
        let keeper = self.clone();
        Box::pin(async move {
            let mut alive = keeper.alive.subscribe();
            let mut end = keeper.ended.subscribe();
            let mut lock_lost = keeper.lock_lost.clone();
            loop {
                if ended && *end.borrow_and_update() {
                    return LostReason::SessionEnded("the owner's hold ended".to_owned());
                }
                let since = *alive.borrow_and_update();
                let ttl = keeper.longest_ttl();
                let at = since + ttl.saturating_sub(safety_margin(ttl));
                tokio::select! {
                    reason = &mut lock_lost => return reason,
                    () = tokio::time::sleep_until(at) => {
                        return LostReason::Unreachable(format!(
                            "the session holding the lock was not renewed for {:?}: its idle \
                             timeout could end it",
                            at.saturating_duration_since(since)
                        ));
                    }
                    _ = alive.changed() => {}
                    _ = end.changed() => {}
                }
            }
        })
    }

    /// Renew the session that holds the lock (a lease of this client renews).
    /// The session's idle timeout, once set, is the longest ttl asked (never shortened).
    async fn extend(&self, inner: &Arc<Inner>, ttl: Duration) -> Result<()> {
        let mut held = self.held.lock().await;
        let Some(lock) = held.as_mut() else {
            return Err(self.not_held("the owner's hold has ended"));
        };
        let ttl = self.longest_ttl().max(ttl);
        let sent = Instant::now();
        let result = lock.extend(ttl).await;
        if result.is_ok() {
            *self.ttl.lock().unwrap_or_else(|e| e.into_inner()) = ttl;
            self.alive.send_modify(|at| *at = (*at).max(sent));
        }
        if result
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::NotHeld)
        {
            held.take();
            drop(held);
            self.lost(inner).await;
        }
        result
    }

    /// The longest ttl the session was renewed for.
    fn longest_ttl(&self) -> Duration {
        *self.ttl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lock is gone: forget the hold, and its row (stale now).
    async fn lost(&self, inner: &Arc<Inner>) {
        inner.keepers.remove(self);
        self.ended.send_replace(true);
        let sql = inner
            .sql
            .forget(inner.config.mode, &self.name, self.token, true);
        let _ = inner.side("reentry", &sql).await;
    }

    /// The count reached zero: delete the row and let the lock go.
    async fn end(&self, inner: &Arc<Inner>) {
        let Some(mut lock) = self.held.lock().await.take() else {
            return;
        };
        let sql = inner
            .sql
            .forget(inner.config.mode, &self.name, self.token, false);
        let (forgot, released) = tokio::join!(inner.side("release", &sql), lock.release());
        if let Err(e) = forgot {
            tracing::warn!(key = %self.key, error = %e, "the owner row of an ended hold stays (stale)");
        }
        tracing::debug!(key = %self.key, token = self.token, ?released, "owner hold ended");
        inner.keepers.remove(self);
        self.ended.send_replace(true);
    }

    /// This client's last lease was released while others count: poll until they are done.
    fn poll(self: &Arc<Self>, inner: &Arc<Inner>) {
        if self.polling.swap(true, Ordering::SeqCst) {
            return;
        }
        let (keeper, inner) = (self.clone(), inner.clone());
        dlock_core::raw::spawn_cleanup(async move { keeper.polling(&inner).await });
    }

    async fn polling(&self, inner: &Arc<Inner>) {
        let mut kept = Instant::now();
        loop {
            tokio::time::sleep(POLL_EVERY).await;
            if *self.ended.borrow() {
                return;
            }
            if self.local.load(Ordering::SeqCst) > 0 {
                // A lease of this client entered again: its renewals keep the session.
                self.polling.store(false, Ordering::SeqCst);
                if self.local.load(Ordering::SeqCst) > 0
                    || self.polling.swap(true, Ordering::SeqCst)
                {
                    return;
                }
                continue;
            }
            match inner
                .side("reentry", &inner.sql.poll(&self.name, self.token))
                .await
            {
                Ok(rows) => {
                    let left = rows.first().and_then(|r| r.try_get::<u64, _>(0).ok());
                    if left.unwrap_or(0) == 0 {
                        self.end(inner).await;
                        return;
                    }
                }
                Err(e) => tracing::debug!(key = %self.key, error = %e, "polling an owner hold"),
            }
            let ttl = self.longest_ttl();
            if kept.elapsed() >= ttl / 3 {
                kept = Instant::now();
                if let Err(e) = self.extend(inner, ttl).await
                    && e.kind() == ErrorKind::NotHeld
                {
                    return;
                }
            }
        }
    }
}

/// A lease of an owner's hold: the first one or a re-entry, in the client that holds the
/// lock (`keeper`) or in another.
pub(crate) struct OwnerHeld {
    inner: Arc<Inner>,
    key: String,
    name: String,
    owner: Owner,
    token: u64,
    keeper: Option<Arc<Keeper>>,
    released: bool,
}

impl fmt::Debug for OwnerHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnerHeld")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("token", &self.token)
            .field("holds_the_lock", &self.keeper.is_some())
            .finish()
    }
}

impl OwnerHeld {
    fn not_held(&self) -> LockError {
        LockError::not_held(NAME, &self.key, LostReason::NotHeld)
    }

    /// Delete the hold's row if the hold is gone (best effort).
    async fn forget_stale(&self) {
        let sql = self
            .inner
            .sql
            .forget(self.inner.config.mode, &self.name, self.token, true);
        let _ = self.inner.side("reentry", &sql).await;
    }
}

#[async_trait]
impl Held for OwnerHeld {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        if let Some(keeper) = &self.keeper {
            return keeper.extend(&self.inner, ttl).await;
        }
        let sql = self.inner.sql.touch(
            self.inner.config.mode,
            &self.name,
            self.owner,
            self.token,
            ttl,
        );
        if self.inner.side_affected("extend", &sql).await? > 0 {
            return Ok(());
        }
        self.forget_stale().await;
        Err(self.not_held())
    }

    async fn release(&mut self) -> Result<()> {
        self.released = true;
        self.leave().await
    }
}

impl OwnerHeld {
    /// One entry less (see [`Held::release`]).
    async fn leave(&mut self) -> Result<()> {
        let inner = self.inner.clone();
        let sql = inner
            .sql
            .leave(inner.config.mode, &self.name, self.owner, self.token);
        let answer = match inner.side("release", &sql).await {
            Ok(rows) => counted(&rows),
            Err(e) => Err(e.into()),
        };
        let last_here = self
            .keeper
            .as_ref()
            .is_some_and(|k| k.local.fetch_sub(1, Ordering::SeqCst) == 1);
        match (answer, &self.keeper) {
            (Ok((1.., 0)), Some(keeper)) => keeper.end(&inner).await,
            (Ok((1.., _)), Some(keeper)) if last_here => keeper.poll(&inner),
            (Ok((1.., _)), _) => {}
            (Ok(_), keeper) => {
                if let Some(keeper) = keeper
                    && last_here
                {
                    keeper.end(&inner).await;
                }
                self.forget_stale().await;
                return Err(self.not_held());
            }
            (Err(e), keeper) => {
                // Unknown whether it counted: the holder's poll decides (the count, or the
                // expiry of the other clients' leases).
                if let Some(keeper) = keeper
                    && last_here
                {
                    keeper.poll(&inner);
                }
                return Err(e);
            }
        }
        Ok(())
    }
}

impl Drop for OwnerHeld {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        let mut orphan = OwnerHeld {
            inner: self.inner.clone(),
            key: std::mem::take(&mut self.key),
            name: std::mem::take(&mut self.name),
            owner: self.owner,
            token: self.token,
            keeper: self.keeper.take(),
            // Its own drop must not spawn again: a runtime shutting down drops the task
            // unrun, which would spawn another, without end.
            released: true,
        };
        dlock_core::raw::spawn_cleanup(async move {
            let _ = orphan.leave().await;
        });
    }
}

impl Inner {
    /// Enter `owner`'s current hold of `key` again, if it holds it (in any client): the
    /// grant, with the hold's token. Cancel safe: it runs in a task of its own, which
    /// releases the entry if the caller went away.
    pub(crate) async fn reenter(
        self: &Arc<Self>,
        key: &str,
        owner: Owner,
        ttl: Duration,
    ) -> Result<Option<Grant>> {
        let keeper = self
            .keepers
            .get(&row_name(key))
            .filter(|k| k.owner == owner);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (inner, key) = (self.clone(), key.to_owned());
        let spawned = dlock_core::raw::spawn_cleanup(async move {
            let answer = inner.reenter_now(&key, owner, ttl).await;
            if let Err(Ok(Some(grant))) = tx.send(answer) {
                let mut held = grant.held;
                let _ = held.release().await;
            }
        });
        if !spawned {
            return Err(LockError::backend(NAME, "acquire", "no tokio runtime"));
        }
        let no_answer = |_| {
            Err(LockError::backend(
                NAME,
                "acquire",
                "the re-entry task ended without an answer",
            ))
        };
        // In the client that holds the lock, the answer is not awaited past the instant
        // the session may have ended (its leases are told then): the task releases the
        // entry if it counted.
        let Some(keeper) = keeper else {
            return rx.await.unwrap_or_else(no_answer);
        };
        tokio::select! {
            biased;
            answer = rx => answer.unwrap_or_else(no_answer),
            reason = keeper.session_lost(false) => Err(LockError::unavailable(
                NAME,
                "acquire",
                format!("re-entering a hold whose session may have ended: {reason}"),
            )),
        }
    }

    async fn reenter_now(
        self: &Arc<Self>,
        key: &str,
        owner: Owner,
        ttl: Duration,
    ) -> Result<Option<Grant>> {
        let name = row_name(key);
        let sent_at = Instant::now();
        let sql = self.sql.reenter(self.config.mode, &name, owner, ttl);
        let (matched, token) = counted(&self.side("acquire", &sql).await?)?;
        if matched < 1 {
            return Ok(None);
        }
        let keeper = self
            .keepers
            .get(&name)
            .filter(|k| k.token == token && k.owner == owner);
        if let Some(keeper) = &keeper {
            keeper.local.fetch_add(1, Ordering::SeqCst);
            // A lease of this client renews the session every third of its own ttl: the
            // session must not idle out sooner.
            if ttl > keeper.longest_ttl()
                && let Err(e) = keeper.extend(self, ttl).await
            {
                tracing::debug!(key, error = %e, "keeping the session for a longer ttl");
            }
        }
        tracing::debug!(key, token, owner = owner.as_str(), "re-entered");
        let lost = keeper.as_ref().map(|k| k.session_lost(true));
        let held = OwnerHeld {
            inner: self.clone(),
            key: key.to_owned(),
            name,
            owner,
            token,
            keeper,
            released: false,
        };
        let mut grant = Grant::new(token, Box::new(held), sent_at);
        grant.lost = lost;
        Ok(Some(grant))
    }

    /// `grant` is a new hold of `key` by `owner`: record it (one entry), keep its lock in
    /// this client, and hand out its first lease.
    pub(crate) async fn own(
        self: &Arc<Self>,
        key: &str,
        owner: Owner,
        ttl: Duration,
        grant: Grant,
    ) -> Result<Grant> {
        Box::pin(self.own_now(key, owner, ttl, grant)).await
    }

    async fn own_now(
        self: &Arc<Self>,
        key: &str,
        owner: Owner,
        ttl: Duration,
        grant: Grant,
    ) -> Result<Grant> {
        let name = row_name(key);
        let token = grant.fencing_token;
        let Grant {
            mut held,
            sent_at,
            lost,
            waited,
            ..
        } = grant;
        if let Err(e) = self
            .side("acquire", &self.sql.own(&name, owner, token))
            .await
        {
            let _ = held.release().await;
            return Err(e.into());
        }
        let keeper = Arc::new(Keeper {
            key: key.to_owned(),
            name: name.clone(),
            owner,
            token,
            held: tokio::sync::Mutex::new(Some(held)),
            ttl: Mutex::new(ttl),
            local: AtomicUsize::new(1),
            polling: AtomicBool::new(false),
            ended: watch::Sender::new(false),
            alive: watch::Sender::new(sent_at),
            lock_lost: lost
                .unwrap_or_else(|| std::future::pending().boxed())
                .shared(),
        });
        self.keepers.map().insert(name.clone(), keeper.clone());
        let session_lost = keeper.session_lost(true);
        let lease = OwnerHeld {
            inner: self.clone(),
            key: key.to_owned(),
            name,
            owner,
            token,
            keeper: Some(keeper),
            released: false,
        };
        // Not kept alive: every lease renews (its renewal is the owner check).
        let mut grant = Grant::new(token, Box::new(lease), sent_at);
        grant.lost = Some(session_lost);
        grant.waited = waited;
        Ok(grant)
    }
}
