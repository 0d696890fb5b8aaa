//! Permits: Apache Curator's `InterProcessSemaphoreV2` recipe, with its layout, so dlock
//! and Curator holders of one path count each other's permits (see [Permits](crate#permits)).
//!
//! The key directory holds two children: `locks`, a mutex (the lock recipe, Curator's
//! `InterProcessMutex` names) that acquirers hold in turn while they take a lease, and
//! `leases`, one ephemeral-sequential `_c_{uuid}-lease-{seq}` node per holder. A lease is
//! held when `leases` has at most the acquirer's limit of children, its own included.

use std::sync::atomic::Ordering;

use dlock_core::Mode;
use dlock_core::raw::Grant;
use tokio::time::Instant;
use zookeeper_client::{self as zk, EventType};

use crate::NAME;
use crate::acquire::Budget;
use crate::config::CuratorRecipe;
use crate::contender::Contender;
use crate::request::retry;
use crate::session::ZookeeperBackend;

/// The semaphore's mutex directory (Curator's `LOCK_PARENT`).
pub(crate) const LOCKS: &str = "locks";
/// The semaphore's lease directory (Curator's `LEASE_PARENT`).
pub(crate) const LEASES: &str = "leases";

/// Whether a `leases` directory of `children` children (our node among them) admits a
/// holder whose limit is `limit`: Curator's `children.size() <= maxLeases`. Every child
/// counts, whatever its name, as Curator counts them.
pub(crate) fn admits(children: usize, limit: u32) -> bool {
    u32::try_from(children).is_ok_and(|n| n <= limit)
}

impl ZookeeperBackend {
    /// One permit of `limit` on the semaphore at `dir`, on one session: hold the `locks`
    /// mutex (in turn with the other acquirers, FIFO), create our lease node and count the
    /// leases; while they are over our limit, wait for a change of `leases` (a children
    /// watch) and count again; then let the mutex go.
    pub(crate) async fn take_permit(
        &self,
        client: &zk::Client,
        key: &str,
        dir: &str,
        limit: u32,
        budget: Budget,
    ) -> Result<Option<Grant>, zk::Error> {
        let sent_at = Instant::now();
        let locks = format!("{dir}/{LOCKS}");
        let leases = format!("{dir}/{LEASES}");
        // The mutex is an exclusive lock node with Curator's mutex name, whatever the
        // `curator` setting: Curator's semaphore uses an `InterProcessMutex`.
        let mutex = Contender::new(
            client,
            self.acl(),
            key,
            &locks,
            Mode::Exclusive,
            CuratorRecipe::Mutex,
        )
        .in_semaphore();
        let Some(mut mutex) = self.queue(client, mutex, budget).await? else {
            return Ok(None);
        };
        let mut lease = Contender::new(
            client,
            self.acl(),
            key,
            &leases,
            Mode::Permits(limit),
            CuratorRecipe::Mutex,
        )
        .in_semaphore();
        // On an error from here on, both contenders' drops delete their nodes.
        let mut listed = lease.create(budget).await?;
        // The watch of the last listing, once one was made with a watch.
        let mut watcher: Option<zk::OneshotWatcher> = None;
        loop {
            if !listed.iter().any(|c| Some(c.as_str()) == lease.name()) {
                // Curator's `RETRY_DUE_TO_MISSING_NODE`: our lease node is gone (an
                // operator deleted it, or the session ended: then the create says so).
                tracing::info!(
                    backend = NAME,
                    dir = leases,
                    "our lease node vanished while counting; creating it again"
                );
                lease = lease.renewed();
                listed = lease.create(budget).await?;
                watcher = None;
                continue;
            }
            if admits(listed.len(), limit) {
                drop(watcher);
                // Only acquirers need the mutex: let the next one count.
                mutex.withdraw().await;
                if mutex.waited() {
                    lease.note_wait();
                }
                return lease.into_grant(key, sent_at).map(Some);
            }
            if !budget.deadline().may_wait() {
                // Both deletes in one round trip.
                tokio::join!(lease.withdraw(), mutex.withdraw());
                return Ok(None);
            }
            lease.note_wait();
            if let Some(watcher) = watcher.take() {
                let event = tokio::select! {
                    event = watcher.changed() => event,
                    () = budget.deadline().reached() => {
                        tokio::join!(lease.withdraw(), mutex.withdraw());
                        return Ok(None);
                    }
                };
                self.wakeups.fetch_add(1, Ordering::Relaxed);
                tracing::trace!(backend = NAME, dir = leases, event = ?event.event_type, "woken");
                if event.event_type == EventType::Session && event.session_state.is_terminated() {
                    return Err(zk::Error::SessionExpired);
                }
            }
            // Count again, and watch for the next change (a release, or a holder's session
            // ending) in the same request.
            (listed, watcher) = match retry(client, budget.until(), || {
                client.list_and_watch_children(&leases)
            })
            .await
            {
                // The directory is gone, so our node is too: the check above makes it again.
                Err(zk::Error::NoNode) => (Vec::new(), None),
                watched => {
                    let (children, watcher) = watched?;
                    (children, Some(watcher))
                }
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_admit_up_to_the_limit_counting_our_own() {
        assert!(admits(1, 1));
        assert!(!admits(2, 1));
        assert!(admits(3, 3));
        assert!(!admits(4, 3));
        assert!(!admits(usize::MAX, Mode::MAX_PERMITS));
    }
}
