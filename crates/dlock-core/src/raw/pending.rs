//! Watchdogs that start late: a lease's watchdog has nothing to do before its first
//! renewal but listen to the backend's loss signal, so it gets its task only at a fifth of
//! its ttl, from one task per client, on the runtime the client's first such lease was
//! taken on (a lease taken on another runtime starts its own at once). Until then
//! [`Lease::is_lost`](crate::Lease::is_lost), `extend` and `release` look at the loss
//! signal themselves (within the lease's runtime, from any thread), and anyone who listens
//! ([`Lease::lost`](crate::Lease::lost), a [`LostSignal`](crate::LostSignal)) starts the
//! watchdog at once if there is a signal to listen to. Two kinds of lease start their
//! watchdog with the grant: an owner's hold, whose loss must reach the hold's other leases
//! in the client, and one whose signal must be listened to from the grant on
//! ([`Grant::listened_from_grant`](crate::raw::Grant::listened_from_grant): ZooKeeper's,
//! which times a disconnect from when it sees it).
//!
//! Most holds end long before that, and a task per lease, spawned at the grant and aborted
//! at the release, is client CPU on every cycle, on the runtime's other worker thread too:
//! with it gone, 32 clients each cycling its own key on one Redis server (lockbench's
//! spread, two shared cores) ran 24–33 k cycles/s against 13–17 k, and one PostgreSQL
//! client's take and release switched context 2.1 times a cycle against 3.8. A fifth of the
//! ttl is before anything the watchdog does: its first renewal is due no earlier than a
//! quarter of the ttl (a third, less a jitter of up to a twelfth, rounded down to a grid
//! of a hundredth), and its lost signal fires near the end of the ttl. A manual extend
//! starts the watchdog at once, since it may shorten the ttl.
//!
//! What waits: a loss nobody asks about in a hold's first fifth of its ttl is logged and
//! counted (`dlock_lost_total`) when the watchdog starts, not when the backend signalled
//! it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

use crate::lease::LeaseState;

/// Where a lease is in the queue: its start instant, and a number that tells apart leases
/// due at the same instant.
pub(crate) type Entry = (Instant, u64);

/// The leases of one client whose watchdogs have not started yet, by start instant, and
/// the task that starts them when they fall due.
#[derive(Default)]
pub(crate) struct PendingWatchdogs {
    inner: Mutex<Inner>,
    /// Wakes the starter for a lease due before the instant it sleeps until.
    wake: Arc<Notify>,
}

#[derive(Default)]
struct Inner {
    due: BTreeMap<Entry, Weak<LeaseState>>,
    next_id: u64,
    /// When the starter wakes next; `None` while it waits for a lease (none queued, and the
    /// last one queued was due by the time it looked).
    wakes_at: Option<Instant>,
    /// The start instant of the lease queued last: a starter with nothing queued sleeps
    /// until it, so that the next lease, due a little later, need not wake it. (The last,
    /// not the latest ever: one long-ttl lease must not make every shorter one wake it.)
    last_queued: Option<Instant>,
    /// How many times the starter looked at the queue.
    #[cfg(test)]
    rounds: usize,
    /// The starter, and the runtime it (and every watchdog it starts) runs on.
    starter: Option<(AbortHandle, tokio::runtime::Id)>,
}

impl PendingWatchdogs {
    /// Start `state`'s watchdog at `at`, unless [`cancel`](Self::cancel)led before. `None`
    /// when the client's starter runs on another runtime than the caller's, which must then
    /// start the watchdog itself: a lease's watchdog runs where the lease was taken.
    pub(crate) fn defer(self: &Arc<Self>, state: &Arc<LeaseState>, at: Instant) -> Option<Entry> {
        let here = tokio::runtime::Handle::current().id();
        let mut inner = self.lock();
        match &inner.starter {
            Some((starter, runtime)) if !starter.is_finished() && *runtime != here => return None,
            Some((starter, _)) if !starter.is_finished() => {}
            // The first lease, or the runtime that ran the starter is gone.
            _ => {
                let starter = tokio::spawn(start_when_due(Arc::downgrade(self), self.wake.clone()));
                inner.starter = Some((starter.abort_handle(), here));
                inner.wakes_at = None;
            }
        }
        let entry = (at, inner.next_id);
        inner.next_id += 1;
        inner.due.insert(entry, Arc::downgrade(state));
        inner.last_queued = Some(at);
        // Most leases fall due after the one the starter sleeps for: no wake-up for them.
        let earlier = inner.wakes_at.is_none_or(|wakes| at < wakes);
        drop(inner);
        if earlier {
            self.wake.notify_one();
        }
        Some(entry)
    }

    /// Forget a lease that was released, or whose watchdog started otherwise.
    pub(crate) fn cancel(&self, entry: Entry) {
        self.lock().due.remove(&entry);
    }

    /// Start the watchdogs due by now; when to look again: when the next one is due or,
    /// with none queued, when the one queued last was due (a client that takes
    /// and releases keys back to back queues each lease for a little later than the one
    /// before, and released it before it was due: waking the starter for each would cost
    /// a task wake-up, often on the other worker thread, per cycle); `None` after that.
    fn start_due(&self) -> Option<Instant> {
        let now = Instant::now();
        let (ready, next) = {
            let mut inner = self.lock();
            #[cfg(test)]
            {
                inner.rounds += 1;
            }
            let later = inner.due.split_off(&(now, u64::MAX));
            let ready = std::mem::replace(&mut inner.due, later);
            let next = inner
                .due
                .keys()
                .next()
                .map(|(at, _)| *at)
                .or(inner.last_queued.filter(|last| *last > now));
            inner.wakes_at = next;
            (ready, next)
        };
        for state in ready.into_values().filter_map(|s| s.upgrade()) {
            state.start_watchdog();
        }
        next
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Nothing panics while holding it; a poisoned lock still holds consistent data.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().due.len()
    }

    #[cfg(test)]
    fn rounds(&self) -> usize {
        self.lock().rounds
    }
}

impl Drop for PendingWatchdogs {
    fn drop(&mut self) {
        if let Some((starter, _)) = &self.lock().starter {
            starter.abort();
        }
    }
}

/// The starter: holds its queue weakly, so it ends with the client and its last lease.
async fn start_when_due(queue: Weak<PendingWatchdogs>, wake: Arc<Notify>) {
    loop {
        let Some(next) = queue.upgrade().map(|q| q.start_due()) else {
            return;
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = wake.notified() => {}
                }
            }
            None => wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::raw::{Grant, Held};
    use crate::{LockOptions, Result};

    /// A handle that counts its renewals, each answered at once.
    #[derive(Debug, Default)]
    struct Counted(Arc<AtomicUsize>);

    #[async_trait::async_trait]
    impl Held for Counted {
        async fn extend(&mut self, _ttl: Duration) -> Result<()> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        async fn release(&mut self) -> Result<()> {
            Ok(())
        }
    }

    async fn lease(
        queue: &Arc<PendingWatchdogs>,
        ttl: Duration,
    ) -> (crate::Lease, Arc<AtomicUsize>) {
        let renewals = Arc::new(AtomicUsize::new(0));
        let grant = Grant::new(1, Box::new(Counted(renewals.clone())), Instant::now());
        let opts = LockOptions::new().ttl(ttl);
        let lease = crate::Lease::for_test(grant, &opts, crate::Expiry::Ttl, Some(queue)).await;
        (lease, renewals)
    }

    #[tokio::test(start_paused = true)]
    async fn a_pending_watchdog_starts_by_a_fifth_of_the_ttl_and_renews() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (lease, renewals) = lease(&queue, Duration::from_secs(3)).await;
        assert_eq!(queue.len(), 1, "waits to start");
        tokio::time::sleep(Duration::from_millis(650)).await;
        assert_eq!(queue.len(), 0, "started at a fifth of the ttl");
        assert_eq!(
            renewals.load(Ordering::SeqCst),
            0,
            "nothing renewed before due"
        );
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(!lease.is_lost(), "renewed throughout three ttls");
        assert!(renewals.load(Ordering::SeqCst) >= 6);
        lease.release().await.expect("release");
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_leaves_nothing_pending_and_never_renews() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (lease, renewals) = lease(&queue, Duration::from_secs(3)).await;
        lease.release().await.expect("release");
        assert_eq!(queue.len(), 0);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(renewals.load(Ordering::SeqCst), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn back_to_back_holds_do_not_wake_the_starter_each() {
        let queue = Arc::new(PendingWatchdogs::default());
        // 200 holds in 0.2 s, each queued for 0.6 s after its grant: the starter looked
        // when the first came and sleeps past the last.
        let rounds = back_to_back(&queue, 200, Duration::from_secs(3)).await;
        assert!(rounds <= 3, "{rounds} rounds");
        // A lease due earlier than that (a shorter ttl) still wakes it, and starts on time.
        let (lease, renewals) = lease(&queue, Duration::from_millis(100)).await;
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(queue.len(), 0, "started at a fifth of its ttl");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(renewals.load(Ordering::SeqCst) >= 1);
        lease.release().await.expect("release");
    }

    #[tokio::test(start_paused = true)]
    async fn one_long_ttl_hold_does_not_make_shorter_ones_wake_the_starter_each() {
        let queue = Arc::new(PendingWatchdogs::default());
        back_to_back(&queue, 1, Duration::from_secs(3600)).await;
        let rounds = back_to_back(&queue, 200, Duration::from_secs(3)).await;
        assert!(rounds <= 3, "{rounds} rounds");
    }

    /// Take and release `count` leases of `ttl`, 1 ms apart: how many times the starter
    /// looked at the queue meanwhile.
    async fn back_to_back(queue: &Arc<PendingWatchdogs>, count: usize, ttl: Duration) -> usize {
        let before = queue.rounds();
        for _ in 0..count {
            let (held, _) = lease(queue, ttl).await;
            held.release().await.expect("release");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        queue.rounds() - before
    }

    #[tokio::test(start_paused = true)]
    async fn an_extend_to_a_shorter_ttl_starts_the_watchdog_at_once() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (lease, renewals) = lease(&queue, Duration::from_secs(30)).await;
        lease
            .extend(Duration::from_millis(300))
            .await
            .expect("extend");
        assert_eq!(queue.len(), 0, "started by the extend");
        let before = renewals.load(Ordering::SeqCst);
        // Long before the 6 s a fifth of the first ttl would have waited.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!lease.is_lost(), "the 300 ms ttl was renewed");
        assert!(renewals.load(Ordering::SeqCst) >= before + 5);
        lease.release().await.expect("release");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lease_taken_on_another_runtime_starts_its_watchdog_there() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (_here, _) = lease(&queue, Duration::from_secs(3)).await;
        assert_eq!(queue.len(), 1, "the starter runs on this runtime");
        let other = queue.clone();
        let pending_there = std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a second runtime");
            runtime.block_on(async {
                let (there, _) = lease(&other, Duration::from_secs(3)).await;
                let pending = other.len();
                there.release().await.expect("release");
                pending
            })
        })
        .join()
        .expect("the other runtime's thread");
        assert_eq!(pending_there, 1, "not queued behind this runtime's starter");
    }

    /// A kept-alive lease whose backend signals its loss when `lose` is sent.
    async fn signalled(
        queue: &Arc<PendingWatchdogs>,
    ) -> (crate::Lease, tokio::sync::oneshot::Sender<()>) {
        signalled_with(queue, |grant| grant).await
    }

    async fn signalled_with(
        queue: &Arc<PendingWatchdogs>,
        then: impl FnOnce(Grant) -> Grant,
    ) -> (crate::Lease, tokio::sync::oneshot::Sender<()>) {
        let (lose, lost) = tokio::sync::oneshot::channel::<()>();
        let grant = Grant::new(1, Box::new(Counted::default()), Instant::now())
            .with_lost(Box::pin(async move {
                let _ = lost.await;
                crate::LostReason::NotHeld
            }))
            .kept_alive();
        let grant = then(grant);
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let lease = crate::Lease::for_test(grant, &opts, crate::Expiry::Ttl, Some(queue)).await;
        (lease, lose)
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_signalled_before_the_watchdog_starts_shows_in_is_lost() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (lease, lose) = signalled(&queue).await;
        assert_eq!(
            queue.len(),
            1,
            "a hold with a loss signal waits to start too"
        );
        assert!(!lease.is_lost());
        lose.send(()).expect("the signal listens");
        assert!(lease.is_lost(), "is_lost looks at the signal itself");
        assert_eq!(queue.len(), 0, "a lost lease has no watchdog to start");
        assert_eq!(lease.lost().await, crate::LostReason::NotHeld);
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_alive_hold_waits_from_its_grant_however_old_its_keep_alive() {
        let queue = Arc::new(PendingWatchdogs::default());
        tokio::time::advance(Duration::from_secs(60)).await;
        // Its backend last kept the shared lease alive 9 s ago (of a 30 s ttl).
        let kept_at = Instant::now() - Duration::from_secs(9);
        let (lease, _lose) = signalled_with(&queue, |mut grant| {
            grant.sent_at = kept_at;
            grant
        })
        .await;
        assert_eq!(queue.len(), 1, "no watchdog task with the grant");
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert_eq!(queue.len(), 0, "started a fifth of the ttl after the grant");
        lease.release().await.expect("release");
    }

    #[tokio::test(start_paused = true)]
    async fn listening_for_the_loss_starts_the_watchdog_at_once() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (lease, lose) = signalled(&queue).await;
        let mut signal = lease.lost_signal();
        assert_eq!(queue.len(), 0, "started for its listener");
        lose.send(()).expect("the signal listens");
        let reason = tokio::time::timeout(Duration::from_secs(1), signal.lost())
            .await
            .expect("the watchdog passed the loss on");
        assert_eq!(reason, Some(crate::LostReason::NotHeld));
        assert!(signal.is_lost() && lease.is_lost());
    }

    #[tokio::test(start_paused = true)]
    async fn a_loss_signalled_before_listening_shows_in_the_new_signal() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (lease, lose) = signalled(&queue).await;
        lose.send(()).expect("the signal listens");
        assert!(
            lease.lost_signal().is_lost(),
            "no wait for the watchdog to run"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn listening_to_a_lease_without_a_signal_starts_no_task() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (lease, _) = lease(&queue, Duration::from_secs(30)).await;
        let _signal = lease.lost_signal();
        assert_eq!(
            queue.len(),
            1,
            "nothing to listen to before a fifth of the ttl"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn is_lost_outside_the_runtime_sees_the_signal() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (lease, lose) = signalled(&queue).await;
        lose.send(()).expect("the signal listens");
        let lost =
            std::thread::scope(|s| s.spawn(|| lease.is_lost()).join()).expect("the plain thread");
        assert!(lost, "looked at within the lease's runtime");
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_that_needs_a_listener_starts_the_watchdog_with_the_grant() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (lease, lose) = signalled_with(&queue, Grant::listened_from_grant).await;
        assert_eq!(queue.len(), 0, "started with the lease");
        lose.send(()).expect("the signal listens");
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(lease.lost_signal().is_lost(), "the watchdog heard it");
    }

    /// A handle whose release makes the backend signal a loss, as a deletion watch would
    /// see its own release.
    #[derive(Debug)]
    struct SeenDeleted(Option<tokio::sync::oneshot::Sender<()>>);

    #[async_trait::async_trait]
    impl Held for SeenDeleted {
        async fn extend(&mut self, _ttl: Duration) -> Result<()> {
            Ok(())
        }
        async fn release(&mut self) -> Result<()> {
            if let Some(deleted) = self.0.take() {
                let _ = deleted.send(());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_after_an_extend_stops_a_running_watchdog() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (deleted, seen) = tokio::sync::oneshot::channel();
        let grant = Grant::new(1, Box::new(SeenDeleted(Some(deleted))), Instant::now()).with_lost(
            Box::pin(async move {
                let _ = seen.await;
                crate::LostReason::NotHeld
            }),
        );
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        let lease = crate::Lease::for_test(grant, &opts, crate::Expiry::Ttl, Some(&queue)).await;
        tokio::time::sleep(Duration::from_secs(7)).await;
        assert_eq!(queue.len(), 0, "running");
        lease.extend(Duration::from_secs(30)).await.expect("extend");
        lease
            .release()
            .await
            .expect("the watchdog was stopped before the release went out");
    }

    #[tokio::test(start_paused = true)]
    async fn the_starter_ends_with_its_queue() {
        let queue = Arc::new(PendingWatchdogs::default());
        let (lease, _) = lease(&queue, Duration::from_secs(3)).await;
        let (starter, _) = queue.lock().starter.clone().expect("a starter");
        drop(lease);
        drop(queue);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(starter.is_finished());
    }
}
