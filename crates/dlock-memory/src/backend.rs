//! A client of the in-process server: the [`Backend`] the core wraps.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant, Held};
use dlock_core::{
    Capabilities, Fencing, Inspection, KeyStatus, LockError, LockOptions, LockStats, LostReason,
    Observe, Reentry, Result, WaiterView, Wakeup,
};
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::server::{ELECTION_RECHECK, Granted, MemoryServer, NAME, State, Waiter};

/// One client of a [`MemoryServer`].
#[derive(Debug)]
pub struct MemoryBackend {
    server: MemoryServer,
    partitioned: Arc<AtomicBool>,
    wakeups: Arc<AtomicU64>,
}

impl MemoryBackend {
    pub(crate) fn new(server: MemoryServer) -> Self {
        Self {
            server,
            partitioned: Arc::default(),
            wakeups: Arc::default(),
        }
    }

    /// The server this client talks to.
    pub fn server(&self) -> &MemoryServer {
        &self.server
    }

    /// Cut this client off from the server (`true`) or reconnect it (`false`): while cut
    /// off, every call fails with [`LockError::Unavailable`].
    pub fn set_partitioned(&self, cut: bool) {
        self.partitioned.store(cut, Ordering::SeqCst);
    }

    /// Make this client vanish as a killed process would: it never talks to the server
    /// again, so its leases are neither renewed nor released and expire with their ttl.
    pub fn crash(&self) {
        self.set_partitioned(true);
    }

    fn reachable(&self, op: &'static str) -> Result<()> {
        if self.partitioned.load(Ordering::SeqCst) {
            return Err(LockError::unavailable(
                NAME,
                op,
                "client is partitioned from the memory server",
            ));
        }
        Ok(())
    }

    fn held(&self, key: &str, granted: Granted) -> Grant {
        let held = MemoryHeld {
            server: self.server.clone(),
            partitioned: self.partitioned.clone(),
            key: key.to_owned(),
            id: granted.id,
        };
        let lost = granted.lost;
        Grant::new(granted.token, Box::new(held), granted.at).with_lost(Box::pin(async move {
            match lost.await {
                Ok(reason) => reason,
                // The holder was released normally; nothing to report.
                Err(_) => std::future::pending().await,
            }
        }))
    }
}

/// Removes a waiter from the queue when its acquire gives up or is dropped, and gives back
/// a grant that arrived too late to be taken.
struct QueuedWaiter<'a> {
    server: &'a MemoryServer,
    key: &'a str,
    id: u64,
    grant: oneshot::Receiver<Granted>,
}

impl Drop for QueuedWaiter<'_> {
    fn drop(&mut self) {
        self.grant.close();
        let mut state = self.server.lock();
        if let Ok(granted) = self.grant.try_recv() {
            state.release(self.key, granted.id);
        }
        if let Some(slot) = state.keys.get_mut(self.key) {
            slot.waiters.retain(|w| w.id != self.id);
        }
        state.hand_off(self.key);
    }
}

#[async_trait]
impl Backend for MemoryBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: true,
            fencing: Fencing::Strict,
            wakeup: Wakeup::Notification {
                one_per_release: true,
                max_per_waiter: 1,
            },
            shared: true,
            permits: true,
            inspect: Inspection {
                who: true,
                waiters: WaiterView::Queue,
                list: true,
            },
            election: Observe::Woken {
                recheck: ELECTION_RECHECK,
            },
            reentrant: Reentry::AnyLease,
            ..Default::default()
        }
    }

    async fn inspect(&self, key: &str) -> Result<KeyStatus> {
        self.reachable("inspect")?;
        Ok(self.server.status(key))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.reachable("list")?;
        Ok(self.server.held_keys(prefix))
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.wakeups.load(Ordering::Relaxed))
    }

    async fn acquire(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.take(key, opts, deadline, None).await
    }

    async fn campaign(
        &self,
        key: &str,
        value: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.take(key, opts, deadline, Some(value.to_owned())).await
    }

    async fn leader_changes(&self, _key: &str) -> Result<Option<BoxStream<'static, Result<()>>>> {
        self.reachable("observe")?;
        let mut changes = self.server.lock().changes.subscribe();
        changes.mark_unchanged();
        let partitioned = self.partitioned.clone();
        Ok(Some(
            stream::unfold(changes, move |mut changes| {
                let partitioned = partitioned.clone();
                async move {
                    changes.changed().await.ok()?;
                    let item = match partitioned.load(Ordering::SeqCst) {
                        true => Err(LockError::unavailable(
                            NAME,
                            "observe",
                            "client is partitioned from the memory server",
                        )),
                        false => Ok(()),
                    };
                    Some((item, changes))
                }
            })
            .boxed(),
        ))
    }
}

impl MemoryBackend {
    async fn take(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
        value: Option<String>,
    ) -> Result<Option<Grant>> {
        let (ttl, mode, owner) = (opts.ttl, opts.mode, opts.owner);
        self.reachable("acquire")?;
        let mut waiter = {
            let mut state = self.server.lock();
            state.hand_off(key);
            let reentered = owner
                .zip(state.keys.get_mut(key))
                .and_then(|(owner, slot)| State::reenter(slot, owner, ttl));
            if let Some(granted) = reentered {
                return Ok(Some(self.held(key, granted)));
            }
            let queued = state.keys.get(key).is_some_and(|s| !s.waiters.is_empty());
            if state.admits(key, mode) && !queued {
                let granted = state.grant(key, mode, ttl, value, owner);
                return Ok(Some(self.held(key, granted)));
            }
            if !deadline.may_wait() {
                return Ok(None);
            }
            state.next_id += 1;
            let id = state.next_id;
            let (tx, rx) = oneshot::channel();
            state
                .keys
                .entry(key.to_owned())
                .or_default()
                .waiters
                .push_back(Waiter {
                    id,
                    mode,
                    ttl,
                    value,
                    owner,
                    grant: tx,
                });
            QueuedWaiter {
                server: &self.server,
                key,
                id,
                grant: rx,
            }
        };
        loop {
            // Wake on hand-off, or when a holder's ttl runs out (a crashed holder).
            let expiry = {
                let state = self.server.lock();
                state
                    .keys
                    .get(key)
                    .and_then(|s| s.live().map(|h| h.expires_at).min())
            };
            let wake_at =
                deadline.min(expiry.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)));
            tokio::select! {
                granted = &mut waiter.grant => {
                    self.wakeups.fetch_add(1, Ordering::Relaxed);
                    let granted = granted.map_err(|_| LockError::backend(NAME, "acquire", "server dropped the waiter"))?;
                    let grant = self.held(key, granted).after_wait();
                    // The grant is ours now; the guard must not give it back.
                    waiter.grant = oneshot::channel().1;
                    return Ok(Some(grant));
                }
                _ = tokio::time::sleep_until(wake_at) => {
                    if !deadline.may_wait() {
                        return Ok(None);
                    }
                    self.wakeups.fetch_add(1, Ordering::Relaxed);
                    self.server.lock().hand_off(key);
                }
            }
        }
    }
}

#[derive(Debug)]
struct MemoryHeld {
    server: MemoryServer,
    partitioned: Arc<AtomicBool>,
    key: String,
    id: u64,
}

impl MemoryHeld {
    fn not_held(&self) -> LockError {
        LockError::not_held(NAME, &self.key, LostReason::NotHeld)
    }

    fn reachable(&self, op: &'static str) -> Result<()> {
        if self.partitioned.load(Ordering::SeqCst) {
            return Err(LockError::unavailable(
                NAME,
                op,
                "client is partitioned from the memory server",
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Held for MemoryHeld {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.reachable("extend")?;
        let mut state = self.server.lock();
        let holder = state
            .holder_mut(&self.key, self.id)
            .ok_or_else(|| self.not_held())?;
        let until = Instant::now() + ttl;
        // The leases of an owner's hold never shorten each other's time.
        holder.expires_at = match holder.owner {
            Some(_) => holder.expires_at.max(until),
            None => until,
        };
        Ok(())
    }

    async fn proclaim(&mut self, value: &str) -> Result<()> {
        self.reachable("proclaim")?;
        let mut state = self.server.lock();
        let holder = state
            .holder_mut(&self.key, self.id)
            .ok_or_else(|| self.not_held())?;
        holder.value = Some(value.to_owned());
        state.changed();
        Ok(())
    }

    async fn release(&mut self) -> Result<()> {
        self.reachable("release")?;
        if self.server.lock().release(&self.key, self.id) {
            Ok(())
        } else {
            Err(self.not_held())
        }
    }
}
