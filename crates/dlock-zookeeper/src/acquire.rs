//! The [`Backend`] implementation and its acquire: the lock recipe on one session, queueing
//! a node and, until it holds the key, watching the one node whose deletion may admit it
//! (see [`nodes::waits_for`]). Permits take such a node as their semaphore's mutex (see
//! [`crate::semaphore`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant};
use dlock_core::{
    Capabilities, Expiry, Fencing, Inspection, KeyStatus, Leader, LockStats, Mode, Observe, Result,
    WaiterView, Wakeup,
};
use futures::stream::BoxStream;
use tokio::time::Instant;
use zookeeper_client::{self as zk, EventType};

use crate::NAME;
use crate::contender::Contender;
use crate::error::{Error, is_session_over};
use crate::nodes;
use crate::request::retry;
use crate::session::ZookeeperBackend;

/// How many sessions one acquire may go through (a session that expires while it waits is
/// replaced and the acquire starts over).
const MAX_SESSIONS: usize = 3;

#[async_trait]
impl Backend for ZookeeperBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: true,
            shared: true,
            fencing: Fencing::Strict,
            expiry: Expiry::Session {
                timeout: self.session_timeout(),
            },
            wakeup: Wakeup::Notification {
                one_per_release: true,
                max_per_waiter: 1,
            },
            // Nodes and sessions are replicated and persisted: a restart or a lost member
            // ends no session early.
            faults: dlock_core::Faults {
                holder_paused: dlock_core::FaultSafety::Fenced,
                server_restart: dlock_core::FaultSafety::Exclusive,
                member_down: dlock_core::FaultSafety::Exclusive,
            },
            // Curator's `InterProcessSemaphoreV2` (see the crate docs' Permits).
            permits: true,
            // Lock and lease nodes carry their holder's description; contenders queue by
            // sequence number; the base path's children are the keys (see the crate docs'
            // Inspecting).
            inspect: Inspection {
                who: true,
                waiters: WaiterView::Queue,
                list: true,
            },
            // A persistent recursive watch on the key directory wakes observers (see the
            // crate docs' Elections). ZooKeeper 3.5 has no `addWatch` and its observers
            // poll every `RECHECK`, but the server's version is not known here.
            election: Observe::Woken {
                recheck: crate::election::RECHECK,
            },
            ..Default::default()
        }
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.wakeups.load(Ordering::Relaxed))
    }

    async fn inspect(&self, key: &str) -> Result<KeyStatus> {
        self.status(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.held_keys(prefix).await
    }

    async fn acquire(
        &self,
        key: &str,
        opts: &dlock_core::LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.acquire_as(key, opts, deadline, None).await
    }

    async fn campaign(
        &self,
        key: &str,
        value: &str,
        opts: &dlock_core::LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.acquire_as(key, opts, deadline, Some(value)).await
    }

    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        self.read_leader(key).await
    }

    async fn leader_changes(&self, key: &str) -> Result<Option<BoxStream<'static, Result<()>>>> {
        self.watch_leader(key).await
    }
}

impl ZookeeperBackend {
    /// Acquire `key`, or campaign for it publishing `value`: the lock recipe (or, for
    /// permits, the semaphore's) on the current session, started over on a new session if
    /// that one ends while we wait.
    async fn acquire_as(
        &self,
        key: &str,
        opts: &dlock_core::LockOptions,
        deadline: Deadline,
        value: Option<&str>,
    ) -> Result<Option<Grant>> {
        let dir = self.config.key_dir(key);
        for _ in 0..MAX_SESSIONS {
            let client = self.client(deadline).await?;
            let budget = Budget {
                deadline,
                bound: client.session_timeout(),
            };
            let taken = match opts.mode {
                Mode::Permits(limit) => self.take_permit(&client, key, &dir, limit, budget).await,
                mode => self.take(&client, key, &dir, mode, value, budget).await,
            };
            match taken {
                Ok(grant) => return Ok(grant),
                Err(e) if is_session_over(&e) => {
                    tracing::info!(backend = NAME, key, error = %e, "session ended during acquire; starting over");
                }
                Err(zk::Error::Timeout)
                    if !deadline.may_wait() && deadline != Deadline::TryOnce =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(Error::zk("acquire", e).into()),
            }
        }
        Err(Error::zk("acquire", zk::Error::SessionExpired).into())
    }
}

/// How long the phases of one acquire may take: each request at most a session timeout
/// (a request unanswered that long means the session is as good as gone), and never past
/// the caller's deadline.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    deadline: Deadline,
    bound: Duration,
}

impl Budget {
    /// The caller's deadline.
    pub(crate) fn deadline(&self) -> Deadline {
        self.deadline
    }

    pub(crate) fn until(&self) -> Instant {
        let bounded = Instant::now() + self.bound;
        match self.deadline {
            Deadline::At(at) => at.min(bounded),
            Deadline::TryOnce | Deadline::Never => bounded,
        }
    }
}

impl ZookeeperBackend {
    /// The lock recipe on one session, for an exclusive or shared hold, or an election
    /// candidate's exclusive hold publishing `value` (a `latch-` node).
    async fn take(
        &self,
        client: &zk::Client,
        key: &str,
        dir: &str,
        mode: Mode,
        value: Option<&str>,
        budget: Budget,
    ) -> Result<Option<Grant>, zk::Error> {
        let sent_at = Instant::now();
        let mut contender = Contender::new(client, self.acl(), key, dir, mode, self.config.curator);
        if let Some(value) = value {
            contender = contender.campaigning(value);
        }
        match self.queue(client, contender, budget).await? {
            Some(held) => held.into_grant(key, sent_at).map(Some),
            None => Ok(None),
        }
    }

    /// Queue `me` in its directory until its node holds it in its mode, and return it then
    /// (`None`: the deadline came, or `try_acquire` found it held; our node is deleted).
    /// Create our node, then until it holds, watch the node it waits for (exclusive: the
    /// one just before it; shared: the last exclusive one before it).
    pub(crate) async fn queue(
        &self,
        client: &zk::Client,
        mut me: Contender,
        budget: Budget,
    ) -> Result<Option<Contender>, zk::Error> {
        let dir = me.dir().to_owned();
        let dir = dir.as_str();
        let mut listed = Some(me.create(budget).await?);
        loop {
            let children = match listed.take() {
                Some(children) => children,
                None => match retry(client, budget.until(), || client.list_children(dir)).await {
                    Err(zk::Error::NoNode) => Vec::new(),
                    children => children?,
                },
            };
            let order = nodes::contenders(children);
            let Some(position) = order
                .iter()
                .position(|n| Some(n.name.as_str()) == me.name())
            else {
                // Our node is gone: an operator deleted it, or the session ended (then the
                // next request says so). Queue again at the back.
                tracing::info!(
                    backend = NAME,
                    dir,
                    "our lock node vanished while waiting; queueing again"
                );
                me = me.renewed();
                listed = Some(me.create(budget).await?);
                continue;
            };
            let Some(blocker) = nodes::waits_for(&order, position) else {
                return Ok(Some(me));
            };
            if !budget.deadline.may_wait() {
                me.withdraw().await;
                return Ok(None);
            }
            me.note_wait();
            let blocker = format!("{dir}/{}", order[blocker].name);
            let watcher = match retry(client, budget.until(), || {
                client.get_and_watch_data(&blocker)
            })
            .await
            {
                // Gone already: look again at once.
                Err(zk::Error::NoNode) => continue,
                watched => watched?.2,
            };
            let event = tokio::select! {
                event = watcher.changed() => event,
                () = budget.deadline.reached() => {
                    me.withdraw().await;
                    return Ok(None);
                }
            };
            self.wakeups.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(backend = NAME, dir, event = ?event.event_type, "woken");
            if event.event_type == EventType::Session && event.session_state.is_terminated() {
                return Err(zk::Error::SessionExpired);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_never_passes_the_deadline() {
        let at = Instant::now() + Duration::from_millis(50);
        let budget = Budget {
            deadline: Deadline::At(at),
            bound: Duration::from_secs(10),
        };
        assert_eq!(budget.until(), at);
        let open = Budget {
            deadline: Deadline::TryOnce,
            bound: Duration::from_secs(1),
        };
        assert!(open.until() > Instant::now());
    }
}
