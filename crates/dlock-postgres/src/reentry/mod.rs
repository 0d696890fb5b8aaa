//! Reentrant holds ([`LockOptions::owner`](dlock_core::LockOptions::owner)): the count lives
//! in a committed row of the owner table (see [`sql`]), the lock in the session of the first
//! client, which keeps it until the count is zero.
//!
//! In the first client the hold is an [`Anchor`]: the advisory lock on a holder connection
//! (an ordinary carried hold, whose release also deletes the row), shared by the client's
//! leases of the hold ([`Local`]), whose count changes run on that holder connection (its
//! session proves the hold live; see [`On::Holder`]). Another client's lease of the hold is
//! a [`Remote`]: a row update per renewal and release, on a side connection. When the first
//! client's own leases are all released while the count is above zero, a task keeps the
//! anchor until the count reaches zero (the release that brings it there notifies the
//! owner channel) or the other clients' leases expire (re-checked every [`RECHECK`]), then
//! gives it back.
//!
//! A session takes an advisory lock it already holds again (the locks stack): while this
//! client has an anchor of a key, no hold of the key is tried on a holder connection
//! ([`Anchors::holds`]); such an acquire waits on a connection of its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::raw::carrier::Caller;
use dlock_core::raw::{Grant, Held};
use dlock_core::{LockError, LostReason, Owner, Result};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use sqlx::Row;
use tokio::time::{Instant, sleep};

use crate::NAME;
use crate::backend::Inner;
use crate::error::Error;
use crate::session::PgSession;
use local::Local;
use sql::On;

mod local;
mod remote;
mod sql;

/// How long a first client whose own leases are gone waits without a notification before
/// it looks at the count again: the bound on noticing the other clients' leases expired,
/// or a zero count whose notification went unheard (the listener reconnecting).
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// The anchors of this client, by key id.
#[derive(Default)]
pub(crate) struct Anchors {
    map: Mutex<HashMap<i32, Arc<Anchor>>>,
}

impl Anchors {
    fn get(&self, id: i32) -> Option<Arc<Anchor>> {
        lock(&self.map).get(&id).cloned()
    }

    /// Whether this client holds key `id`'s lock for a reentrant hold (maybe only until its
    /// count reaches zero): no other hold of the key may try it on a holder connection. An
    /// anchor being given back is waited for (its unlock, then its removal, are done under
    /// its lock), so that a key just freed is not answered busy.
    pub(crate) async fn holds(&self, id: i32) -> bool {
        let Some(anchor) = self.get(id) else {
            return false;
        };
        anchor.held.lock().await.is_some()
    }

    fn remove(&self, anchor: &Arc<Anchor>) {
        let mut map = lock(&self.map);
        if map.get(&anchor.id).is_some_and(|a| Arc::ptr_eq(a, anchor)) {
            map.remove(&anchor.id);
        }
    }
}

/// What a count change sent to the holder connection came to.
enum OnHolder {
    /// Done: the statement's rows.
    Rows(Vec<sqlx::postgres::PgRow>),
    /// Nothing changed there (the hold is not that session's any more, its row was busy, or
    /// the statement failed): a side connection, which reads `pg_locks`, sends it.
    AskSide,
    /// The session is gone, with the lock, and maybe after the statement counted: sending
    /// it again could count it twice.
    Gone,
}

/// A reentrant hold in the client that took it first: its lock and its leases here.
pub(crate) struct Anchor {
    key: String,
    id: i32,
    owner: Owner,
    token: u64,
    /// The carried hold of the lock; `None` once given back.
    held: tokio::sync::Mutex<Option<Box<dyn Held>>>,
    /// Runs this client's count changes on the holder connection, which proves the hold
    /// live without the side connection's `pg_locks` read (`None`: a hold the carriers did
    /// not grant, which cannot happen; the side connection then serves).
    caller: Option<Caller<PgSession>>,
    /// The holder connection's end.
    lost: Shared<BoxFuture<'static, LostReason>>,
    kept_alive: bool,
    state: Mutex<State>,
}

struct State {
    /// This client's leases of the hold not yet released.
    local: usize,
    /// A task keeps the lock for the other clients' leases.
    lingering: bool,
    /// The longest ttl a lease asked: a renewal never shortens the session's idle timeout.
    ttl: Duration,
}

impl Anchor {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        lock(&self.state)
    }

    fn not_held(&self) -> LockError {
        LockError::not_held(NAME, &self.key, LostReason::NotHeld)
    }

    /// Run a count change of this hold on its holder connection, whose session proves the
    /// hold live (see [`On::Holder`]).
    async fn on_holder(&self, sql: crate::sql::Statement, op: &'static str) -> OnHolder {
        let Some(caller) = &self.caller else {
            return OnHolder::AskSide;
        };
        match caller.call((sql, op)).await {
            Ok(rows) if !rows.is_empty() => OnHolder::Rows(rows),
            // Not this session's hold any more: nothing changed.
            Ok(_) => OnHolder::AskSide,
            Err(LockError::NotHeld { .. }) => OnHolder::Gone,
            // Failed on the server (its row busy, say), so rolled back; the session lives on.
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "a count change failed on the holder connection; asking a side connection");
                OnHolder::AskSide
            }
        }
    }

    /// Whether the holder connection's loss was already told (the server may still show
    /// the session holding the key for a moment, until it ends it): no lease of the hold
    /// is handed out any more.
    fn is_lost(&self) -> bool {
        self.lost.clone().now_or_never().is_some()
    }

    /// A lease of this hold, in this client (already counted).
    fn lease(self: &Arc<Self>, inner: &Arc<Inner>, sent_at: Instant) -> Grant {
        let held = Local {
            inner: inner.clone(),
            anchor: self.clone(),
            released: false,
        };
        let grant =
            Grant::new(self.token, Box::new(held), sent_at).with_lost(self.lost.clone().boxed());
        if self.kept_alive {
            grant.kept_alive()
        } else {
            grant
        }
    }

    /// Give the lock back (once) and forget the anchor.
    async fn free(self: &Arc<Self>, inner: &Inner) -> Result<()> {
        let mut slot = self.held.lock().await;
        let result = match slot.take() {
            Some(mut held) => held.release().await,
            None => Ok(()),
        };
        inner.anchors.remove(self);
        drop(slot);
        if result.is_err() {
            // The session is gone (its row could not go with the lock): delete the row if
            // nobody holds the key with it (else the key's next owner hold replaces it).
            let gone = inner.sql.forget_gone(self.id, self.token);
            if let Err(e) = inner.side("release", &gone, None).await {
                tracing::debug!(key = %self.key, error = %e, "could not delete a gone hold's row");
            }
        }
        tracing::debug!(key = %self.key, token = self.token, ?result, "reentrant hold freed");
        result
    }

    /// One of this client's leases is released, leaving `left` on the count (`None`: the
    /// hold is gone, or unknown): at zero give the lock back; when it was this client's last
    /// lease, keep the lock in a task until the count reaches zero.
    async fn leave(self: &Arc<Self>, inner: &Arc<Inner>, left: Option<i64>) -> Result<()> {
        let linger = {
            let mut state = self.state();
            state.local = state.local.saturating_sub(1);
            let linger = state.local == 0 && !state.lingering && left != Some(0);
            state.lingering |= linger;
            linger
        };
        if left == Some(0) {
            return self.free(inner).await;
        }
        if linger {
            tokio::spawn(linger_task(inner.clone(), self.clone()));
        }
        Ok(())
    }
}

/// Keep `anchor`'s lock while other clients' leases count: until the count is zero (woken
/// by the notification of the release that made it so), their leases expired, the hold's
/// session ended, or this client leases the hold again (its release takes over).
async fn linger_task(inner: Arc<Inner>, anchor: Arc<Anchor>) {
    let registration = inner.owner_waits.register(anchor.id);
    inner.owner_waits.listening(&inner).await;
    let mut lost = anchor.lost.clone();
    let over = inner.sql.owned_over(anchor.id, anchor.token);
    // A hold on a holder connection nobody pings (its first lease was not auto-renewed):
    // this task keeps the session alive, every third of the longest ttl asked.
    let mut kept: Option<Instant> = None;
    loop {
        let ttl = {
            let mut state = anchor.state();
            if state.local > 0 {
                state.lingering = false;
                return;
            }
            state.ttl
        };
        let every = match anchor.kept_alive {
            true => RECHECK,
            false => RECHECK.min(ttl / 3),
        };
        {
            let mut held = anchor.held.lock().await;
            let Some(held) = held.as_mut() else {
                return;
            };
            if !anchor.kept_alive && kept.is_none_or(|at| at.elapsed() >= every) {
                kept = Some(Instant::now());
                if let Err(e) = held.extend(ttl).await {
                    tracing::debug!(key = %anchor.key, error = %e, "could not keep a hold's session");
                }
            }
        }
        match inner.side("release", &over, None).await {
            Ok(rows) if first_bool(&rows) => {
                let _ = anchor.free(&inner).await;
                return;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!(key = %anchor.key, error = %e, "could not read a hold's count")
            }
        }
        tokio::select! {
            () = registration.notified() => {}
            () = sleep(every) => {}
            _ = &mut lost => {
                let _ = anchor.free(&inner).await;
                return;
            }
        }
    }
}

impl Inner {
    /// Whether the owner table exists (made when missing, if the role may); rows of holds
    /// that are gone are deleted. `false`: reentrant holds are refused.
    pub(crate) async fn prepare_owners(&self) -> bool {
        let exists = match self.side("connect", &self.sql.owners_exist(), None).await {
            Ok(rows) => first_bool(&rows),
            Err(e) => {
                tracing::warn!(error = %e, "could not look for the owner table");
                return false;
            }
        };
        if !exists
            && let Err(e) = self
                .side("create table", &self.sql.create_owners(), None)
                .await
        {
            tracing::warn!(
                error = %e,
                table = %self.sql.owners,
                "the owner table is missing and could not be created: reentrant holds are off"
            );
            return false;
        }
        if let Err(e) = self.side("connect", &self.sql.sweep_owners(), None).await {
            tracing::debug!(error = %e, "could not delete the rows of gone reentrant holds");
        }
        true
    }

    /// A new reentrant hold of `key` (lock `id`) for `owner`: `grant` is the carried hold
    /// of its lock, whose row the granting statement wrote. The lease handed out shares it.
    pub(crate) fn anchor(
        self: &Arc<Self>,
        key: &str,
        id: i32,
        owner: Owner,
        ttl: Duration,
        grant: Grant,
    ) -> Grant {
        let lost = grant
            .lost
            .unwrap_or_else(|| std::future::pending().boxed())
            .shared();
        let caller = Caller::of(grant.held.as_ref());
        let anchor = Arc::new(Anchor {
            key: key.to_owned(),
            id,
            owner,
            token: grant.fencing_token,
            caller,
            held: tokio::sync::Mutex::new(Some(grant.held)),
            lost,
            kept_alive: grant.kept_alive,
            state: Mutex::new(State {
                local: 1,
                lingering: false,
                ttl,
            }),
        });
        // An anchor of an earlier hold that is being given back goes.
        lock(&self.anchors.map).insert(id, anchor.clone());
        let lease = anchor.lease(self, grant.sent_at);
        if grant.waited {
            lease.after_wait()
        } else {
            lease
        }
    }

    /// Re-enter `owner`'s hold of `key` (lock `id`), if it has a live one, in any client:
    /// one statement, on the holder connection when this client holds the lock, else (or
    /// when that one changed nothing) on a side connection. `None`: the owner holds nothing.
    /// `waiting`: the session of this acquire's own wait, whose hold (a grant racing this re-entry) is
    /// never re-entered: it is this acquire's.
    ///
    /// The statement and the lease run in a task of their own: a caller that stops waiting
    /// (its deadline, a granted wait, a dropped acquire) never leaves an entry counted
    /// without a lease (the lease nobody took is released).
    pub(crate) async fn reenter(
        self: &Arc<Self>,
        key: &str,
        id: i32,
        owner: Owner,
        ttl: Duration,
        waiting: Option<i32>,
    ) -> Result<Option<Grant>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (inner, key) = (self.clone(), key.to_owned());
        tokio::spawn(async move {
            let answer = inner.reenter_now(&key, id, owner, ttl, waiting).await;
            if let Err(Ok(Some(grant))) = tx.send(answer) {
                // Nobody took it: its lease's drop releases the entry.
                drop(grant);
            }
        });
        rx.await.unwrap_or_else(|_| {
            Err(Error::Unexpected {
                op: "acquire",
                what: "the re-entry task ended without an answer".into(),
            }
            .into())
        })
    }

    async fn reenter_now(
        self: &Arc<Self>,
        key: &str,
        id: i32,
        owner: Owner,
        ttl: Duration,
        waiting: Option<i32>,
    ) -> Result<Option<Grant>> {
        let sent_at = Instant::now();
        let ours = self.anchors.get(id).filter(|a| a.owner == owner);
        let on_holder = match &ours {
            // This client's hold of the owner was told lost: no more leases of it, though
            // the server may still show it for a moment (a plain acquire would find the
            // key busy, as this one does, and wait for it).
            Some(anchor) if anchor.is_lost() => return Ok(None),
            Some(anchor) => {
                let on = On::Holder {
                    token: anchor.token,
                };
                let sql = self.sql.reenter(id, ttl, waiting, &owner, on);
                match anchor.on_holder(sql, "acquire").await {
                    // Lost under the statement, which may have counted: not re-entered.
                    OnHolder::Gone => return Ok(None),
                    answer => answer,
                }
            }
            None => OnHolder::AskSide,
        };
        let rows = match on_holder {
            OnHolder::Rows(rows) => rows,
            _ => {
                let sql = self.sql.reenter(id, ttl, waiting, &owner, On::Side);
                self.side_statement("acquire", &sql).await?
            }
        };
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let token: i64 = row.try_get(0).map_err(Error::sql("acquire"))?;
        let token = u64::try_from(token).unwrap_or(0);
        if let Some(anchor) = ours.filter(|a| a.token == token) {
            {
                let mut state = anchor.state();
                state.local += 1;
                state.ttl = state.ttl.max(ttl);
            }
            let lease = anchor.lease(self, sent_at);
            if anchor.is_lost() {
                // Told lost meanwhile: the entry goes back with the lease (its drop).
                drop(lease);
                return Ok(None);
            }
            return Ok(Some(lease));
        }
        let held = remote::Remote {
            inner: self.clone(),
            key: key.to_owned(),
            id,
            owner,
            token,
            released: false,
        };
        Ok(Some(Grant::new(token, Box::new(held), sent_at)))
    }
}

impl Inner {
    /// An owner's wait for a key held by someone else: resolves once `owner` takes the key
    /// meanwhile (another client's first grant of an owner hold notifies the owner
    /// channel; re-checked every [`RECHECK`]) and this acquire re-entered its hold. The hold
    /// of the waiting session (`waiting`) is never re-entered: granted, it is this wait's
    /// own (its notification wakes this loop as another's would), and the wait stopped for
    /// a re-entry gives it back.
    pub(crate) async fn reentered(
        self: &Arc<Self>,
        key: &str,
        id: i32,
        owner: Owner,
        ttl: Duration,
        waiting: i32,
    ) -> Grant {
        let registration = self.owner_waits.register(id);
        self.owner_waits.listening(self).await;
        loop {
            match self.reenter(key, id, owner, ttl, Some(waiting)).await {
                Ok(Some(grant)) => return grant,
                Ok(None) => {}
                Err(e) => tracing::debug!(key, error = %e, "a waiting owner could not re-enter"),
            }
            let _ = tokio::time::timeout(RECHECK, registration.notified()).await;
        }
    }
}

/// The first column of the first row as a boolean (`false` when missing or NULL).
fn first_bool(rows: &[sqlx::postgres::PgRow]) -> bool {
    rows.first()
        .and_then(|r| r.try_get::<Option<bool>, _>(0).ok().flatten())
        .unwrap_or(false)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
