//! The in-process server: keys, their holders and their queues.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use dlock_core::{
    HolderStatus, KeyStatus, LostReason, Mode, Owner, WaiterStatus, holder_description,
};
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::MemoryBackend;

pub(crate) const NAME: &str = "memory";
/// How long an election observer goes without reading the leader: a holder whose ttl ran
/// out (a crashed client) changes nothing that wakes it.
pub(crate) const ELECTION_RECHECK: Duration = Duration::from_millis(250);

/// A lock server living in this process. Cheap to clone; clones are the same server.
#[derive(Debug, Clone, Default)]
pub struct MemoryServer {
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) keys: HashMap<String, Slot>,
    /// The last grant's id, which is also its fencing token: one counter for every key (as
    /// etcd's revision), so tokens increase per key without remembering keys nobody holds.
    pub(crate) next_id: u64,
    /// `keys.len()` after the last sweep of expired slots; the next sweep comes when the
    /// map has doubled, so sweeping costs O(1) per grant, amortized.
    pub(crate) swept_at: usize,
    /// Bumped on every grant, release and proclaim, for election observers (who read the
    /// leader of their key again).
    pub(crate) changes: watch::Sender<u64>,
}

/// A key's holders (one exclusive, any number of shared ones, or up to N permits; expired
/// ones linger until the next change) and its FIFO queue.
#[derive(Debug, Default)]
pub(crate) struct Slot {
    pub(crate) holders: Vec<Holder>,
    pub(crate) waiters: VecDeque<Waiter>,
}

impl Slot {
    pub(crate) fn live(&self) -> impl Iterator<Item = &Holder> {
        let now = Instant::now();
        self.holders.iter().filter(move |h| h.expires_at > now)
    }

    /// Whether a hold in `mode` may join the live holders.
    pub(crate) fn admits(&self, mode: Mode) -> bool {
        match mode {
            Mode::Exclusive => self.live().next().is_none(),
            Mode::Shared => self.live().all(|h| h.mode == Mode::Shared),
            // Counted against the asker's own limit (Curator's rule).
            Mode::Permits(n) => {
                self.live().all(|h| h.mode.permits().is_some()) && self.live().count() < n as usize
            }
        }
    }

    pub(crate) fn in_use(&self) -> bool {
        self.live().next().is_some() || !self.waiters.is_empty()
    }
}

#[derive(Debug)]
pub(crate) struct Holder {
    pub(crate) id: u64,
    pub(crate) mode: Mode,
    pub(crate) granted_at: Instant,
    pub(crate) expires_at: Instant,
    /// One loss signal per lease of the hold (a reentrant hold has one per entry).
    pub(crate) lost: Vec<oneshot::Sender<LostReason>>,
    /// What an election candidate publishes; `None` for a plain hold.
    pub(crate) value: Option<String>,
    /// The owner of a reentrant hold, and how many of its leases count.
    pub(crate) owner: Option<(Owner, u32)>,
}

#[derive(Debug)]
pub(crate) struct Waiter {
    pub(crate) id: u64,
    pub(crate) mode: Mode,
    pub(crate) ttl: Duration,
    pub(crate) value: Option<String>,
    pub(crate) owner: Option<Owner>,
    pub(crate) grant: oneshot::Sender<Granted>,
}

#[derive(Debug)]
pub(crate) struct Granted {
    pub(crate) id: u64,
    pub(crate) token: u64,
    pub(crate) at: Instant,
    pub(crate) lost: oneshot::Receiver<LostReason>,
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

    /// A new independent client of this server, as a bare [`Backend`](dlock_core::raw::Backend) (to wrap it).
    pub fn backend(&self) -> MemoryBackend {
        MemoryBackend::new(self.clone())
    }

    /// Delete `key` as an operator would: the holder loses it (and is told at once), and
    /// the next waiter gets it.
    pub fn break_lease(&self, key: &str) {
        self.free(key, true);
    }

    /// Delete `key` without telling its holders, as a faulty backend that frees a key
    /// behind its holders' backs would: each finds out at its next renewal. The next
    /// waiter gets the key. For tests of the conformance suite.
    pub fn forget(&self, key: &str) {
        self.free(key, false);
    }

    fn free(&self, key: &str, tell: bool) {
        let mut state = self.lock();
        if let Some(slot) = state.keys.get_mut(key) {
            for holder in slot.holders.drain(..) {
                // A lost signal dropped unsent is never heard (see `MemoryBackend::held`).
                for lost in holder.lost.into_iter().filter(|_| tell) {
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

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
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
    pub(crate) fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub(crate) fn admits(&self, key: &str, mode: Mode) -> bool {
        self.keys.get(key).is_none_or(|s| s.admits(mode))
    }

    pub(crate) fn grant(
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
    pub(crate) fn hand_off(&mut self, key: &str) {
        while let Some(slot) = self.keys.get_mut(key) {
            slot.waiters.retain(|w| !w.grant.is_closed());
            // Waiters of the owner holding the key re-enter at once, wherever they queue.
            while let Some(at) = slot.waiters.iter().position(|w| {
                w.owner
                    .is_some_and(|o| slot.live().any(|h| h.owner.is_some_and(|(ho, _)| ho == o)))
            }) {
                let (owner, ttl) = (slot.waiters[at].owner, slot.waiters[at].ttl);
                // The hold may have run out since it was looked at: then it is not entered.
                let Some(granted) = owner.and_then(|o| Self::reenter(slot, o, ttl)) else {
                    break;
                };
                let waiter = slot
                    .waiters
                    .remove(at)
                    .expect("a waiter at a found position");
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
    pub(crate) fn sweep_if_due(&mut self) {
        if self.keys.len() < (2 * self.swept_at).max(64) {
            return;
        }
        self.keys.retain(|_, slot| slot.in_use());
        self.swept_at = self.keys.len();
    }

    pub(crate) fn release(&mut self, key: &str, id: u64) -> bool {
        let ours = self.holds(key, id);
        if ours {
            let freed = self
                .keys
                .get_mut(key)
                .is_some_and(|slot| Self::leave(slot, id));
            if freed {
                self.changed();
                self.hand_off(key);
            }
        }
        ours
    }

    /// One lease of hold `id` leaves it: the hold ends unless it is an owner's with other
    /// leases still counting. Whether it ended.
    pub(crate) fn leave(slot: &mut Slot, id: u64) -> bool {
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
    pub(crate) fn reenter(slot: &mut Slot, owner: Owner, ttl: Duration) -> Option<Granted> {
        let at = Instant::now();
        let holder = slot
            .holders
            .iter_mut()
            .find(|h| h.expires_at > at && h.owner.is_some_and(|(o, _)| o == owner))?;
        let (_, count) = holder.owner.as_mut().expect("found by its owner");
        *count += 1;
        // The signals of leases already released (their receivers gone) are dropped here,
        // so a long-lived hold keeps one per live lease.
        holder.lost.retain(|lost| !lost.is_closed());
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

    pub(crate) fn holder_mut(&mut self, key: &str, id: u64) -> Option<&mut Holder> {
        let now = Instant::now();
        self.keys
            .get_mut(key)?
            .holders
            .iter_mut()
            .find(|h| h.id == id && h.expires_at > now)
    }

    pub(crate) fn holds(&self, key: &str, id: u64) -> bool {
        self.keys
            .get(key)
            .is_some_and(|s| s.live().any(|h| h.id == id))
    }
}

#[cfg(test)]
#[path = "server_tests.rs"]
mod tests;
