//! The in-process server and the backend that talks to it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant, Held};
use dlock_core::{
    Capabilities, Fencing, HolderStatus, Inspection, KeyStatus, LockError, LockOptions, LockStats,
    LostReason, Mode, Observe, Owner, Reentry, Result, WaiterStatus, WaiterView, Wakeup,
    holder_description,
};
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

const NAME: &str = "memory";
/// How long an election observer goes without reading the leader: a holder whose ttl ran
/// out (a crashed client) changes nothing that wakes it.
const ELECTION_RECHECK: Duration = Duration::from_millis(250);

/// A lock server living in this process. Cheap to clone; clones are the same server.
#[derive(Debug, Clone, Default)]
pub struct MemoryServer {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    keys: HashMap<String, Slot>,
    /// The last grant's id, which is also its fencing token: one counter for every key (as
    /// etcd's revision), so tokens increase per key without remembering keys nobody holds.
    next_id: u64,
    /// `keys.len()` after the last sweep of expired slots; the next sweep comes when the
    /// map has doubled, so sweeping costs O(1) per grant, amortized.
    swept_at: usize,
    /// Bumped on every grant, release and proclaim, for election observers (who read the
    /// leader of their key again).
    changes: watch::Sender<u64>,
}

/// A key's holders (one exclusive, any number of shared ones, or up to N permits; expired
/// ones linger until the next change) and its FIFO queue.
#[derive(Debug, Default)]
struct Slot {
    holders: Vec<Holder>,
    waiters: VecDeque<Waiter>,
}

impl Slot {
    fn live(&self) -> impl Iterator<Item = &Holder> {
        let now = Instant::now();
        self.holders.iter().filter(move |h| h.expires_at > now)
    }

    /// Whether a hold in `mode` may join the live holders.
    fn admits(&self, mode: Mode) -> bool {
        match mode {
            Mode::Exclusive => self.live().next().is_none(),
            Mode::Shared => self.live().all(|h| h.mode == Mode::Shared),
            // Counted against the asker's own limit (Curator's rule).
            Mode::Permits(n) => {
                self.live().all(|h| h.mode.permits().is_some()) && self.live().count() < n as usize
            }
        }
    }

    fn in_use(&self) -> bool {
        self.live().next().is_some() || !self.waiters.is_empty()
    }
}

#[derive(Debug)]
struct Holder {
    id: u64,
    mode: Mode,
    granted_at: Instant,
    expires_at: Instant,
    /// One loss signal per lease of the hold (a reentrant hold has one per entry).
    lost: Vec<oneshot::Sender<LostReason>>,
    /// What an election candidate publishes; `None` for a plain hold.
    value: Option<String>,
    /// The owner of a reentrant hold, and how many of its leases count.
    owner: Option<(Owner, u32)>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    mode: Mode,
    ttl: Duration,
    value: Option<String>,
    owner: Option<Owner>,
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
        if let Some(slot) = state.keys.get_mut(key) {
            for holder in slot.holders.drain(..) {
                for lost in holder.lost {
                    let _ = lost.send(LostReason::NotHeld);
                }
            }
        }
        state.changed();
        state.hand_off(key);
    }

    /// Keys that are held or waited for, in no particular order.
    pub fn keys(&self) -> Vec<String> {
        self.lock()
            .keys
            .iter()
            .filter(|(_, s)| s.in_use())
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Who holds `key` and who waits for it, first in line first. Every client of this
    /// server is in this process, so each is named by [`holder_description`].
    pub fn status(&self, key: &str) -> KeyStatus {
        let state = self.lock();
        let mut status = KeyStatus::new(key, true);
        let Some(slot) = state.keys.get(key) else {
            return status;
        };
        let (now, wall) = (Instant::now(), SystemTime::now());
        for holder in slot.live() {
            let mut shown = HolderStatus::new(holder.mode);
            shown.fencing_token = Some(holder.id);
            shown.since = wall.checked_sub(now - holder.granted_at);
            shown.ttl_left = Some(holder.expires_at - now);
            let who = holder.value.as_deref().unwrap_or(holder_description());
            shown.who = Some(match holder.owner {
                Some((owner, count)) => format!("{who} (owner {owner}, held {count} times)"),
                None => who.to_owned(),
            });
            status.holders.push(shown);
        }
        let waiters = slot.waiters.iter().filter(|w| !w.grant.is_closed());
        status.waiters = Some(
            waiters
                .map(|w| {
                    let mut shown = WaiterStatus::new();
                    shown.mode = Some(w.mode);
                    shown.who = Some(holder_description().to_owned());
                    shown
                })
                .collect(),
        );
        status
    }

    /// The held keys starting with `prefix`, sorted.
    pub fn held_keys(&self, prefix: &str) -> Vec<String> {
        let state = self.lock();
        let mut keys: Vec<String> = state
            .keys
            .iter()
            .filter(|(k, s)| k.starts_with(prefix) && s.live().next().is_some())
            .map(|(k, _)| k.clone())
            .collect();
        keys.sort_unstable();
        keys
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for State {
    fn default() -> Self {
        Self {
            keys: HashMap::new(),
            next_id: 0,
            swept_at: 0,
            changes: watch::Sender::new(0),
        }
    }
}

impl State {
    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn admits(&self, key: &str, mode: Mode) -> bool {
        self.keys.get(key).is_none_or(|s| s.admits(mode))
    }

    fn grant(
        &mut self,
        key: &str,
        mode: Mode,
        ttl: Duration,
        value: Option<String>,
        owner: Option<Owner>,
    ) -> Granted {
        self.sweep_if_due();
        self.next_id += 1;
        let id = self.next_id;
        let token = id;
        let (lost_tx, lost) = oneshot::channel();
        let at = Instant::now();
        let slot = self.keys.entry(key.to_owned()).or_default();
        slot.holders.retain(|h| h.expires_at > at);
        slot.holders.push(Holder {
            id,
            mode,
            granted_at: at,
            expires_at: at + ttl,
            lost: vec![lost_tx],
            value,
            owner: owner.map(|o| (o, 1)),
        });
        self.changed();
        Granted {
            id,
            token,
            at,
            lost,
        }
    }

    /// While the first waiter still waiting may join the holders, grant it (FIFO: a run
    /// of shared waiters goes together, permits while they last, an exclusive one alone);
    /// drop the slot when nobody
    /// holds or waits.
    fn hand_off(&mut self, key: &str) {
        while let Some(slot) = self.keys.get_mut(key) {
            slot.waiters.retain(|w| !w.grant.is_closed());
            // Waiters of the owner holding the key re-enter at once, wherever they queue.
            while let Some(at) = slot.waiters.iter().position(|w| {
                w.owner
                    .is_some_and(|o| slot.live().any(|h| h.owner.is_some_and(|(ho, _)| ho == o)))
            }) {
                let waiter = slot.waiters.remove(at).expect("a waiter at a found position");
                let owner = waiter.owner.expect("an owner's waiter");
                let granted = Self::reenter(slot, owner, waiter.ttl).expect("the owner holds");
                if let Err(granted) = waiter.grant.send(granted) {
                    Self::leave(slot, granted.id);
                }
            }
            let Some(mode) = slot.waiters.front().map(|w| w.mode) else {
                break;
            };
            if !slot.admits(mode) {
                break;
            }
            let waiter = slot.waiters.pop_front().expect("a front waiter");
            let granted = self.grant(key, mode, waiter.ttl, waiter.value, waiter.owner);
            if let Err(granted) = waiter.grant.send(granted) {
                // The waiter went away between the check and the send.
                self.release(key, granted.id);
            }
        }
        if self.keys.get(key).is_some_and(|s| !s.in_use()) {
            self.keys.remove(key);
        }
    }

    /// Forget the slots of keys whose holder expired without a release (a crashed holder,
    /// auto-renew off) and that nobody waits for: nothing else would ever remove them.
    fn sweep_if_due(&mut self) {
        if self.keys.len() < (2 * self.swept_at).max(64) {
            return;
        }
        self.keys.retain(|_, slot| slot.in_use());
        self.swept_at = self.keys.len();
    }

    fn release(&mut self, key: &str, id: u64) -> bool {
        let ours = self.holds(key, id);
        if ours {
            let freed = self.keys.get_mut(key).is_some_and(|slot| Self::leave(slot, id));
            if freed {
                self.changed();
                self.hand_off(key);
            }
        }
        ours
    }

    /// One lease of hold `id` leaves it: the hold ends unless it is an owner's with other
    /// leases still counting. Whether it ended.
    fn leave(slot: &mut Slot, id: u64) -> bool {
        let Some(at) = slot.holders.iter().position(|h| h.id == id) else {
            return false;
        };
        if let Some((_, count)) = &mut slot.holders[at].owner
            && *count > 1
        {
            *count -= 1;
            return false;
        }
        slot.holders.remove(at);
        true
    }

    /// Enter `owner`'s live hold of the slot once more: its count goes up, it lives at
    /// least `ttl` from now, and the new lease gets the hold's token.
    fn reenter(slot: &mut Slot, owner: Owner, ttl: Duration) -> Option<Granted> {
        let at = Instant::now();
        let holder = slot
            .holders
            .iter_mut()
            .find(|h| h.expires_at > at && h.owner.is_some_and(|(o, _)| o == owner))?;
        let (_, count) = holder.owner.as_mut().expect("found by its owner");
        *count += 1;
        holder.expires_at = holder.expires_at.max(at + ttl);
        let (lost_tx, lost) = oneshot::channel();
        holder.lost.push(lost_tx);
        Some(Granted {
            id: holder.id,
            token: holder.id,
            at,
            lost,
        })
    }

    fn holder_mut(&mut self, key: &str, id: u64) -> Option<&mut Holder> {
        let now = Instant::now();
        self.keys
            .get_mut(key)?
            .holders
            .iter_mut()
            .find(|h| h.id == id && h.expires_at > now)
    }

    fn holds(&self, key: &str, id: u64) -> bool {
        self.keys
            .get(key)
            .is_some_and(|s| s.live().any(|h| h.id == id))
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

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
