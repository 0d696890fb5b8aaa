//! The in-process server and the backend that talks to it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant, Held};
use dlock_core::{
    Capabilities, Fencing, LockError, LockOptions, LockStats, LostReason, Result, Wakeup,
};
use tokio::sync::oneshot;
use tokio::time::Instant;

const NAME: &str = "memory";

/// A lock server living in this process. Cheap to clone; clones are the same server.
#[derive(Debug, Clone, Default)]
pub struct MemoryServer {
    state: Arc<Mutex<State>>,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<String, Slot>,
    /// The last grant's id, which is also its fencing token: one counter for every key (as
    /// etcd's revision), so tokens increase per key without remembering keys nobody holds.
    next_id: u64,
    /// `keys.len()` after the last sweep of expired slots; the next sweep comes when the
    /// map has doubled, so sweeping costs O(1) per grant, amortized.
    swept_at: usize,
}

#[derive(Debug, Default)]
struct Slot {
    holder: Option<Holder>,
    waiters: VecDeque<Waiter>,
}

#[derive(Debug)]
struct Holder {
    id: u64,
    expires_at: Instant,
    lost: oneshot::Sender<LostReason>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    ttl: Duration,
    grant: oneshot::Sender<Granted>,
}

#[derive(Debug)]
struct Granted {
    id: u64,
    token: u64,
    at: Instant,
    lost: oneshot::Receiver<LostReason>,
}

impl MemoryServer {
    /// A new, empty server.
    pub fn new() -> Self {
        Self::default()
    }

    /// A new independent client of this server.
    pub fn client(&self) -> crate::MemoryLock {
        dlock_core::raw::LockClient::new(self.backend())
    }

    /// A new independent client of this server, as a bare [`Backend`] (to wrap it).
    pub fn backend(&self) -> MemoryBackend {
        MemoryBackend {
            server: self.clone(),
            partitioned: Arc::default(),
            wakeups: Arc::default(),
        }
    }

    /// Delete `key` as an operator would: the holder loses it (and is told at once), and
    /// the next waiter gets it.
    pub fn break_lease(&self, key: &str) {
        let mut state = self.lock();
        if let Some(holder) = state.keys.get_mut(key).and_then(|slot| slot.holder.take()) {
            let _ = holder.lost.send(LostReason::NotHeld);
        }
        state.hand_off(key);
    }

    /// Keys that are held or waited for, in no particular order.
    pub fn keys(&self) -> Vec<String> {
        let now = Instant::now();
        self.lock()
            .keys
            .iter()
            .filter(|(_, s)| {
                s.holder.as_ref().is_some_and(|h| h.expires_at > now) || !s.waiters.is_empty()
            })
            .map(|(k, _)| k.clone())
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl State {
    fn free(&self, key: &str) -> bool {
        self.keys
            .get(key)
            .and_then(|s| s.holder.as_ref())
            .is_none_or(|h| h.expires_at <= Instant::now())
    }

    fn grant(&mut self, key: &str, ttl: Duration) -> Granted {
        self.sweep_if_due();
        self.next_id += 1;
        let id = self.next_id;
        let token = id;
        let (lost_tx, lost) = oneshot::channel();
        let at = Instant::now();
        self.keys.entry(key.to_owned()).or_default().holder = Some(Holder {
            id,
            expires_at: at + ttl,
            lost: lost_tx,
        });
        Granted {
            id,
            token,
            at,
            lost,
        }
    }

    /// While the key is free, give it to the first waiter still waiting (FIFO); drop the
    /// slot when nobody holds or waits.
    fn hand_off(&mut self, key: &str) {
        while self.free(key) {
            let Some(waiter) = self.keys.get_mut(key).and_then(|s| s.waiters.pop_front()) else {
                break;
            };
            if waiter.grant.is_closed() {
                continue;
            }
            let granted = self.grant(key, waiter.ttl);
            if let Err(granted) = waiter.grant.send(granted) {
                // The waiter went away between the check and the send.
                self.release(key, granted.id);
            }
        }
        if self.free(key) && self.keys.get(key).is_some_and(|s| s.waiters.is_empty()) {
            self.keys.remove(key);
        }
    }

    /// Forget the slots of keys whose holder expired without a release (a crashed holder,
    /// auto-renew off) and that nobody waits for: nothing else would ever remove them.
    fn sweep_if_due(&mut self) {
        if self.keys.len() < (2 * self.swept_at).max(64) {
            return;
        }
        let now = Instant::now();
        self.keys.retain(|_, slot| {
            slot.holder.as_ref().is_some_and(|h| h.expires_at > now) || !slot.waiters.is_empty()
        });
        self.swept_at = self.keys.len();
    }

    fn release(&mut self, key: &str, id: u64) -> bool {
        let ours = self.holds(key, id);
        if ours {
            if let Some(slot) = self.keys.get_mut(key) {
                slot.holder = None;
            }
            self.hand_off(key);
        }
        ours
    }

    fn holds(&self, key: &str, id: u64) -> bool {
        self.keys
            .get(key)
            .and_then(|s| s.holder.as_ref())
            .is_some_and(|h| h.id == id && h.expires_at > Instant::now())
    }
}

/// One client of a [`MemoryServer`].
#[derive(Debug)]
pub struct MemoryBackend {
    server: MemoryServer,
    partitioned: Arc<AtomicBool>,
    wakeups: Arc<AtomicU64>,
}

impl MemoryBackend {
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
            ..Default::default()
        }
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
        let ttl = opts.ttl;
        self.reachable("acquire")?;
        let mut waiter = {
            let mut state = self.server.lock();
            state.hand_off(key);
            let queued = state.keys.get(key).is_some_and(|s| !s.waiters.is_empty());
            if state.free(key) && !queued {
                let granted = state.grant(key, ttl);
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
                .push_back(Waiter { id, ttl, grant: tx });
            QueuedWaiter {
                server: &self.server,
                key,
                id,
                grant: rx,
            }
        };
        loop {
            // Wake on hand-off, or when the holder's ttl runs out (a crashed holder).
            let expiry = {
                let state = self.server.lock();
                state
                    .keys
                    .get(key)
                    .and_then(|s| s.holder.as_ref())
                    .map(|h| h.expires_at)
            };
            let wake_at =
                deadline.min(expiry.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600)));
            tokio::select! {
                granted = &mut waiter.grant => {
                    self.wakeups.fetch_add(1, Ordering::Relaxed);
                    let granted = granted.map_err(|_| LockError::backend(NAME, "acquire", "server dropped the waiter"))?;
                    let grant = self.held(key, granted);
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
        if !state.holds(&self.key, self.id) {
            return Err(self.not_held());
        }
        if let Some(holder) = state
            .keys
            .get_mut(&self.key)
            .and_then(|s| s.holder.as_mut())
        {
            holder.expires_at = Instant::now() + ttl;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_unreleased_keys_do_not_pile_up() {
        let mut state = State::default();
        for i in 0..10_000 {
            // Held for no time and never released, as by a crashed holder.
            state.grant(&format!("k{i}"), Duration::ZERO);
        }
        assert!(state.keys.len() <= 128, "{} slots kept", state.keys.len());
        let live = state.grant("live", Duration::from_secs(60));
        for i in 0..1_000 {
            state.grant(&format!("j{i}"), Duration::ZERO);
        }
        assert!(state.holds("live", live.id), "a live holder is never swept");
    }
}
