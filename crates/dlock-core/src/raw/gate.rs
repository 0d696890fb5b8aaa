//! The process-local gate: one FIFO queue per key per client, so tasks of one process wait
//! for each other locally and only the head of the queue talks to the server.
//!
//! Shared holds and permits pass the gate together (each still asks the server, which
//! counts permits), and an exclusive
//! request queues behind the shared ones ahead of it and ahead of those that come after
//! it: tokio's `RwLock` is FIFO in both modes, so local readers cannot starve a local writer.
//!
//! A reentrant hold's turn is shared by its owner: once a task holds the key under an owner,
//! later tasks of the same owner join its turn at once (and ask the server, which raises
//! the hold's count), one at a time, while everyone else queues until the owner's last
//! lease of the key in this client is gone.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};

use futures::future::BoxFuture;
use tokio::sync::{Notify, OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock as Queue, watch};

use crate::{Deadline, LostReason, Mode, Owner};

#[derive(Debug, Default)]
pub(crate) struct Gate {
    queues: Mutex<HashMap<Arc<str>, Arc<Queue<()>>>>,
    /// The keys held under an owner in this client, with the turn the owner's leases share.
    owned: Mutex<OwnedTurns>,
    /// Woken when a key is held under an owner, for the owner's tasks queued behind it.
    owned_changed: Notify,
}

/// Per key held under an owner in this client: the owner, and the turn its leases share.
type OwnedTurns = HashMap<Arc<str>, (Owner, Weak<Turn>)>;

/// How an owner's task got its turn on a key.
pub(crate) enum OwnerTurn {
    /// The key's turn, alone: nobody in this client holds it under this owner.
    First(GatePermit),
    /// A turn the owner already holds, joined: the server re-enters the hold.
    Joined(GatePermit),
}

impl Gate {
    /// Wait for our turn on `key` until `deadline`. `None` when another task of this client
    /// holds or waits for the key and the deadline does not allow waiting.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        key: &str,
        mode: Mode,
        deadline: Deadline,
    ) -> Option<GatePermit> {
        let queue = self.queue(key);
        let handle = queue.handle();
        let at_once = match mode {
            Mode::Exclusive => handle.clone().try_write_owned().ok().map(Guard::Alone),
            _ => handle.clone().try_read_owned().ok().map(Guard::Shared),
        };
        let waited = at_once.is_none();
        let guard = match (at_once, mode, deadline) {
            (Some(turn), _, _) => Some(turn),
            (None, _, Deadline::TryOnce) => None,
            (None, Mode::Exclusive, _) => {
                deadline.run(handle.write_owned()).await.map(Guard::Alone)
            }
            (None, _, _) => deadline.run(handle.read_owned()).await.map(Guard::Shared),
        }?;
        Some(GatePermit {
            waited,
            turn: Arc::new(Turn {
                calls: tokio::sync::Mutex::new(()),
                server_wait: watch::Sender::new(false),
                hold_lost: HoldLost::default(),
                _guard: guard,
                queue,
            }),
        })
    }

    /// Wait for `owner`'s turn on `key` until `deadline`: the turn an earlier lease of the
    /// owner holds, joined at once, or else the key's own turn, alone, as
    /// [`enter`](Self::enter) gives it (left for a joined one when the owner takes the key
    /// meanwhile in another task).
    pub(crate) async fn enter_as(
        self: &Arc<Self>,
        key: &str,
        owner: Owner,
        deadline: Deadline,
    ) -> Option<OwnerTurn> {
        // One place in the key's queue for the whole wait, however often it is woken.
        let queued = self.enter(key, Mode::Exclusive, deadline);
        tokio::pin!(queued);
        loop {
            let changed = self.owned_changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(turn) = self.owned_turn(key, owner) {
                return Some(OwnerTurn::Joined(GatePermit {
                    waited: false,
                    turn,
                }));
            }
            tokio::select! {
                permit = &mut queued => {
                    return permit.map(OwnerTurn::First);
                }
                () = changed => {}
            }
        }
    }

    /// Record that `owner` holds `key` under `permit`'s turn, and wake the owner's tasks
    /// queued behind it.
    pub(crate) fn hold_as(&self, key: &str, owner: Owner, permit: &GatePermit) {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        let turn = Arc::downgrade(&permit.turn);
        let known = owned
            .get(key)
            .is_some_and(|(o, t)| *o == owner && t.ptr_eq(&turn));
        if !known {
            owned.insert(Arc::from(key), (owner, turn));
        }
        drop(owned);
        // Only a new owner's turn can let queued tasks of that owner in.
        if !known {
            self.owned_changed.notify_waiters();
        }
    }

    fn owned_turn(&self, key: &str, owner: Owner) -> Option<Arc<Turn>> {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        let (holder, turn) = owned.get(key)?;
        (*holder == owner).then(|| turn.upgrade()).flatten()
    }

    fn queue(self: &Arc<Self>, key: &str) -> QueueRef {
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        let queue = queues.entry(Arc::from(key)).or_default().clone();
        QueueRef {
            gate: self.clone(),
            key: Arc::from(key),
            queue: Some(queue),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.queues.lock().unwrap().len()
    }
}

/// A reference to one key's queue; the last one out removes the queue from the map.
#[derive(Debug)]
struct QueueRef {
    gate: Arc<Gate>,
    key: Arc<str>,
    queue: Option<Arc<Queue<()>>>,
}

impl QueueRef {
    fn handle(&self) -> Arc<Queue<()>> {
        self.queue.clone().expect("queue is present until drop")
    }
}

impl Drop for QueueRef {
    fn drop(&mut self) {
        drop(self.queue.take());
        let mut queues = self.gate.queues.lock().unwrap_or_else(|e| e.into_inner());
        if queues
            .get(&self.key)
            .is_some_and(|q| Arc::strong_count(q) == 1)
        {
            queues.remove(&self.key);
        }
    }
}

/// Alone on the key (exclusive) or among other shared holds; kept for its drop.
#[derive(Debug)]
#[allow(dead_code)]
enum Guard {
    Alone(OwnedRwLockWriteGuard<()>),
    Shared(OwnedRwLockReadGuard<()>),
}

/// A turn on a key, shared by the leases of one owner.
#[derive(Debug)]
struct Turn {
    /// Joined tasks ask the server one at a time.
    calls: tokio::sync::Mutex<()>,
    /// The joined task asking now waits on the server (its hold was gone): a task that
    /// may not wait does not queue behind it.
    server_wait: watch::Sender<bool>,
    /// The last hold of the turn that was lost, by its token: every lease of a hold is
    /// lost with it.
    hold_lost: HoldLost,
    // Field order matters: the guard is released before the queue reference tidies up.
    _guard: Guard,
    queue: QueueRef,
}

impl Drop for Turn {
    fn drop(&mut self) {
        let gate = &self.queue.gate;
        let mut owned = gate.owned.lock().unwrap_or_else(|e| e.into_inner());
        if owned
            .get(&self.queue.key)
            .is_some_and(|(_, turn)| turn.strong_count() == 0)
        {
            owned.remove(&self.queue.key);
        }
    }
}

/// This task's turn on a key; the next local waiter goes when the last permit of the turn
/// (an owner's leases share one) is dropped.
#[derive(Debug)]
pub(crate) struct GatePermit {
    /// This task waited for another task of the client to let the key go.
    pub(crate) waited: bool,
    turn: Arc<Turn>,
}

impl GatePermit {
    /// Ask the server alone among the tasks that joined this turn, within `deadline`: a
    /// re-entry is quick, so even a task that may not wait queues behind one, but not
    /// behind a task that waits on the server (see [`ServerWait`]).
    pub(crate) async fn call_alone(
        &self,
        deadline: Deadline,
    ) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        let mut waiting = self.turn.server_wait.subscribe();
        let lock = self.turn.calls.lock();
        match deadline {
            Deadline::TryOnce => tokio::select! {
                biased;
                alone = lock => Some(alone),
                _ = waiting.wait_for(|w| *w) => None,
            },
            _ => deadline.run(lock).await,
        }
    }

    /// Mark, while the returned guard lives, that this task waits on the server.
    pub(crate) fn server_wait(&self) -> ServerWait<'_> {
        self.turn.server_wait.send_replace(true);
        ServerWait(&self.turn.server_wait)
    }

    /// Where the leases of this turn's holds tell each other that a hold was lost.
    pub(crate) fn hold_lost(&self) -> HoldLost {
        self.turn.hold_lost.clone()
    }
}

/// A joined task waiting on the server, for as long as it lives (also when its acquire
/// is dropped).
pub(crate) struct ServerWait<'a>(&'a watch::Sender<bool>);

impl Drop for ServerWait<'_> {
    fn drop(&mut self) {
        self.0.send_replace(false);
    }
}

/// Shared by the leases an owner holds a key with in one client: when one of them learns
/// that the hold (known by its fencing token) is lost, all of them are told at once, so a
/// lease whose own check would come later (a re-entry that is not kept alive, or one left
/// after the lease that carried the session's signal was released) hears it as soon as
/// any of them does.
///
/// Every hold of the turn that was lost is remembered (by token) for the turn's life, so
/// an announcement is never overwritten before every lease of its hold has read it.
#[derive(Debug, Clone, Default)]
pub(crate) struct HoldLost(Arc<watch::Sender<BTreeMap<u64, LostReason>>>);

impl HoldLost {
    /// Tell the other leases that the hold with `token` is lost.
    pub(crate) fn announce(&self, token: u64, reason: &LostReason) {
        self.0.send_if_modified(|lost| {
            let new = !lost.contains_key(&token);
            if new {
                lost.insert(token, reason.clone());
            }
            new
        });
    }

    /// Resolves when a lease announces that the hold with `token` is lost.
    pub(crate) fn wait(&self, token: u64) -> BoxFuture<'static, LostReason> {
        let mut lost = self.0.subscribe();
        Box::pin(async move {
            loop {
                if let Some(reason) = lost.borrow_and_update().get(&token) {
                    return reason.clone();
                }
                if lost.changed().await.is_err() {
                    return std::future::pending().await;
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Wait;
    use std::time::Duration;

    #[tokio::test]
    async fn second_task_waits_and_map_is_tidied() {
        let gate = Arc::new(Gate::default());
        let first = gate
            .enter("k", Mode::Exclusive, Deadline::TryOnce)
            .await
            .unwrap();
        assert!(
            gate.enter("k", Mode::Exclusive, Deadline::TryOnce)
                .await
                .is_none()
        );
        assert!(
            gate.enter("other", Mode::Exclusive, Deadline::TryOnce)
                .await
                .is_some()
        );
        let waiting = {
            let gate = gate.clone();
            tokio::spawn(async move {
                gate.enter("k", Mode::Exclusive, Deadline::Never)
                    .await
                    .is_some()
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        assert!(waiting.await.unwrap());
        assert_eq!(gate.len(), 0);
    }

    #[tokio::test]
    async fn a_waiter_that_gives_up_leaves_nothing() {
        let gate = Arc::new(Gate::default());
        let first = gate
            .enter("k", Mode::Exclusive, Deadline::TryOnce)
            .await
            .unwrap();
        let late = gate
            .enter(
                "k",
                Mode::Exclusive,
                Deadline::after(Wait::For(Duration::from_millis(10))),
            )
            .await;
        assert!(late.is_none());
        drop(first);
        assert_eq!(gate.len(), 0);
    }

    #[tokio::test]
    async fn shared_turns_overlap_and_a_queued_exclusive_one_goes_before_later_shared_ones() {
        let gate = Arc::new(Gate::default());
        let first = gate
            .enter("k", Mode::Shared, Deadline::TryOnce)
            .await
            .unwrap();
        let second = gate
            .enter("k", Mode::Shared, Deadline::TryOnce)
            .await
            .unwrap();
        assert!(
            gate.enter("k", Mode::Exclusive, Deadline::TryOnce)
                .await
                .is_none()
        );
        let writer = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter("k", Mode::Exclusive, Deadline::Never).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A writer waits: a new reader may not pass it.
        assert!(
            gate.enter("k", Mode::Shared, Deadline::TryOnce)
                .await
                .is_none()
        );
        drop((first, second));
        let writing = writer.await.unwrap().unwrap();
        assert!(
            gate.enter("k", Mode::Shared, Deadline::TryOnce)
                .await
                .is_none()
        );
        drop(writing);
        assert!(
            gate.enter("k", Mode::Shared, Deadline::TryOnce)
                .await
                .is_some()
        );
        assert_eq!(gate.len(), 0);
    }

    #[tokio::test]
    async fn an_owner_joins_its_own_turn_and_everyone_else_waits_for_its_last_lease() {
        let gate = Arc::new(Gate::default());
        let (job, other) = (Owner::new("job"), Owner::new("other"));
        let Some(OwnerTurn::First(first)) = gate.enter_as("k", job, Deadline::TryOnce).await else {
            panic!("a free key's turn is the owner's own");
        };
        // A task of the owner queued before the hold is recorded joins once it is.
        let queued = {
            let gate = gate.clone();
            tokio::spawn(async move { gate.enter_as("k", job, Deadline::Never).await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!queued.is_finished());
        gate.hold_as("k", job, &first);
        let Some(OwnerTurn::Joined(second)) = queued.await.unwrap() else {
            panic!("the owner's queued task joins its turn");
        };
        assert!(matches!(
            gate.enter_as("k", job, Deadline::TryOnce).await,
            Some(OwnerTurn::Joined(_))
        ));
        for (owner, mode) in [(Some(other), Mode::Exclusive), (None, Mode::Shared)] {
            let turn = match owner {
                Some(o) => gate.enter_as("k", o, Deadline::TryOnce).await.map(drop),
                None => gate.enter("k", mode, Deadline::TryOnce).await.map(drop),
            };
            assert!(turn.is_none(), "{owner:?} waits for the owner's leases");
        }
        drop(first);
        assert!(
            gate.enter("k", Mode::Exclusive, Deadline::TryOnce)
                .await
                .is_none()
        );
        drop(second);
        assert!(matches!(
            gate.enter_as("k", other, Deadline::TryOnce).await,
            Some(OwnerTurn::First(_))
        ));
        assert_eq!(gate.len(), 0);
        assert!(gate.owned.lock().unwrap().is_empty());
    }
}
