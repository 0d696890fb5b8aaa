//! The [`Backend`] implementation and its acquire: the lock recipe on one session, queueing
//! a node and, until it holds the key, watching the one node whose deletion may admit it
//! (see [`nodes::waits_for`]). Permits take such a node as their semaphore's mutex (see
//! [`crate::semaphore`]).

use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant};
use dlock_core::{
    Capabilities, Expiry, Fencing, Inspection, KeyStatus, Leader, LockStats, Mode, Observe, Owner,
    Reentry, Result, WaiterView, Wakeup,
};
use futures::stream::BoxStream;
use tokio::time::Instant;
use zookeeper_client::{self as zk, EventType};

use crate::NAME;
use crate::contender::Contender;
use crate::error::{Error, is_session_over};
use crate::nodes;
use crate::reentry;
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
                member_cut: dlock_core::FaultSafety::Exclusive,
                member_unreachable: dlock_core::FaultSafety::Exclusive,
                slow_link: dlock_core::FaultSafety::Exclusive,
                clock_jump: dlock_core::FaultSafety::Unspecified,
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
            // The owner and count live in the holding node's data; the node is ephemeral
            // on the session that created it (see the crate docs' Reentrant holds).
            reentrant: Reentry::FirstSession,
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
                _ => self.take(&client, key, &dir, opts, value, budget).await,
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
        opts: &dlock_core::LockOptions,
        value: Option<&str>,
        budget: Budget,
    ) -> Result<Option<Grant>, zk::Error> {
        let (mode, owner) = (opts.mode, opts.owner);
        let sent_at = Instant::now();
        if let Some(owner) = owner
            && let Some(grant) = self
                .reenter_known(client, key, owner, budget, sent_at)
                .await?
        {
            return Ok(Some(grant));
        }
        let mut contender =
            Contender::new(client, self.acl(), key, dir, mode, self.config.curator).owned(owner);
        if let Some(value) = value {
            contender = contender.campaigning(value);
        }
        let (node, waited) = match (self.queue_for(client, contender, budget).await?, owner) {
            (Some(Queued::Holds(held)), None) => return held.into_grant(key, sent_at).map(Some),
            (Some(Queued::Holds(held)), Some(_)) => {
                let waited = held.waited();
                (held.into_hold(), waited)
            }
            (Some(Queued::Reentered(node, waited)), _) => (node, waited),
            (None, _) => return Ok(None),
        };
        let owner = owner.expect("only an owner's node is a reentrant hold");
        let grant = reentry::grant(client, &self.hints, key, node, owner, sent_at)?;
        Ok(Some(match waited {
            true => grant.after_wait(),
            false => grant,
        }))
    }

    /// Re-enter `owner`'s hold of `key` through the node this client last saw hold it, if
    /// any and if it still does: `setData` at the version this client last wrote there, one
    /// round trip, or `getData` first when it wrote none or another client wrote since (see
    /// [`reentry::raise`]); no node of our own.
    async fn reenter_known(
        &self,
        client: &zk::Client,
        key: &str,
        owner: Owner,
        budget: Budget,
        sent_at: Instant,
    ) -> Result<Option<Grant>, zk::Error> {
        let Some((path, czxid)) = self.hints.get(key, owner) else {
            return Ok(None);
        };
        let written = self.hints.written(key, &path);
        let until = budget.until();
        let Some((stat, data)) =
            reentry::raise(client, &path, czxid, owner, written, until).await?
        else {
            self.hints.forget(key, &path);
            return Ok(None);
        };
        self.hints.wrote(key, &path, data, stat.version);
        let node = reentry::HoldNode {
            path,
            czxid,
            kept: stat.ephemeral_owner == client.session_id().0,
        };
        reentry::grant(client, &self.hints, key, node, owner, sent_at).map(Some)
    }

    /// [`queue_for`](Self::queue_for) for a contender without an owner (a semaphore's
    /// mutex): it holds or gives up.
    pub(crate) async fn queue(
        &self,
        client: &zk::Client,
        me: Contender,
        budget: Budget,
    ) -> Result<Option<Contender>, zk::Error> {
        match self.queue_for(client, me, budget).await? {
            Some(Queued::Holds(me)) => Ok(Some(*me)),
            Some(Queued::Reentered { .. }) => Err(zk::Error::UnexpectedError(
                "a contender without an owner re-entered a hold".to_owned(),
            )),
            None => Ok(None),
        }
    }

    /// Queue `me` in its directory until its node holds it in its mode, and return it then
    /// (`None`: the deadline came, or `try_acquire` found it held; our node is deleted).
    /// Create our node, then until it holds, watch the node it waits for (exclusive: the
    /// one just before it; shared: the last exclusive one before it). An owner's node
    /// re-enters the holder instead when the holder's data names its owner, and may watch
    /// the holder too (see [`owner_turn`](Self::owner_turn) and
    /// [Reentrant holds](crate#reentrant-holds)). A change of the watched node's data only
    /// sets the watch again.
    pub(crate) async fn queue_for(
        &self,
        client: &zk::Client,
        mut me: Contender,
        budget: Budget,
    ) -> Result<Option<Queued>, zk::Error> {
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
                return Ok(Some(Queued::Holds(Box::new(me))));
            };
            let may_wait = budget.deadline.may_wait();
            let predecessor = format!("{dir}/{}", order[blocker].name);
            let (mut watcher, also) = match me.owner() {
                Some(owner) if order[0].mode == Mode::Exclusive => {
                    let turn = self.owner_turn(client, &mut me, owner, &order, blocker, budget);
                    match turn.await? {
                        OwnerTurn::Relist => continue,
                        OwnerTurn::Reentered(queued) => return Ok(Some(queued)),
                        OwnerTurn::GiveUp => {
                            me.withdraw().await;
                            return Ok(None);
                        }
                        OwnerTurn::Wait(watcher, also) => (watcher, also),
                    }
                }
                _ if !may_wait => {
                    me.withdraw().await;
                    return Ok(None);
                }
                _ => match retry(client, budget.until(), || {
                    client.get_and_watch_data(&predecessor)
                })
                .await
                {
                    // Gone already: look again at once. The key was busy when we listed
                    // it, so a grant from here on is still a hand-off.
                    Err(zk::Error::NoNode) => {
                        me.note_wait();
                        continue;
                    }
                    watched => (watched?.2, None),
                },
            };
            me.note_wait();
            // The holder's watch, for an owner behind a node of its own owner: any event
            // means look again.
            let also = async move {
                match also {
                    Some(also) => also.changed().await,
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(also);
            let event = loop {
                let event = tokio::select! {
                    event = watcher.changed() => event,
                    event = &mut also => break event,
                    () = budget.deadline.reached() => {
                        me.withdraw().await;
                        return Ok(None);
                    }
                };
                if event.event_type != EventType::NodeDataChanged {
                    break event;
                }
                // Only the data changed (an owner's count, a proclaim): the node still
                // holds or waits; watch it again without looking at the queue.
                match retry(client, budget.until(), || {
                    client.get_and_watch_data(&predecessor)
                })
                .await
                {
                    Err(zk::Error::NoNode) => break event,
                    watched => watcher = watched?.2,
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

impl ZookeeperBackend {
    /// An owner's node that does not hold, behind `order[blocker]`, with an exclusive
    /// holder `order[0]`: read the holder's data and re-enter it if it is our owner's hold.
    /// Otherwise wait on the node just before ours (its data read with the holder's, in
    /// the same round trip), and also on the holder when that node is our owner's: when
    /// the key passes to it, we re-enter at once.
    async fn owner_turn(
        &self,
        client: &zk::Client,
        me: &mut Contender,
        owner: Owner,
        order: &[nodes::Node],
        blocker: usize,
        budget: Budget,
    ) -> Result<OwnerTurn, zk::Error> {
        let dir = me.dir().to_owned();
        let holder = format!("{dir}/{}", order[0].name);
        let predecessor = format!("{dir}/{}", order[blocker].name);
        let (may_wait, until) = (budget.deadline.may_wait(), budget.until());
        let behind = blocker != 0 && may_wait;
        let read_holder = async {
            match blocker == 0 && may_wait {
                true => retry(client, until, || client.get_and_watch_data(&holder))
                    .await
                    .map(|(data, stat, watcher)| (data, stat, Some(watcher))),
                false => retry(client, until, || client.get_data(&holder))
                    .await
                    .map(|(data, stat)| (data, stat, None)),
            }
        };
        let read_predecessor = async {
            match behind {
                true => {
                    Some(retry(client, until, || client.get_and_watch_data(&predecessor)).await)
                }
                false => None,
            }
        };
        let (read, ahead) = tokio::join!(read_holder, read_predecessor);
        let (data, stat, holder_watch) = match read {
            Err(zk::Error::NoNode) => return Ok(OwnerTurn::Relist),
            read => read?,
        };
        if reentry::is_owners(&data, owner) {
            let ours = me.path().expect("a queued contender has its node");
            if !reentry::reenter(client, &holder, &data, &stat, &ours, until).await? {
                return Ok(OwnerTurn::Relist);
            }
            me.forget();
            let node = reentry::HoldNode {
                path: holder,
                czxid: stat.czxid,
                kept: stat.ephemeral_owner == client.session_id().0,
            };
            return Ok(OwnerTurn::Reentered(Queued::Reentered(node, me.waited())));
        }
        if !may_wait {
            return Ok(OwnerTurn::GiveUp);
        }
        let Some(ahead) = ahead else {
            // The holder is just before us: its watch is the one to wait on.
            let watcher = holder_watch.expect("watched when it is our predecessor");
            return Ok(OwnerTurn::Wait(watcher, None));
        };
        let (ahead_data, _, watcher) = match ahead {
            Err(zk::Error::NoNode) => return Ok(OwnerTurn::Relist),
            ahead => ahead?,
        };
        if !reentry::is_owners(&ahead_data, owner) {
            return Ok(OwnerTurn::Wait(watcher, None));
        }
        match retry(client, until, || client.get_and_watch_data(&holder)).await {
            Err(zk::Error::NoNode) => Ok(OwnerTurn::Relist),
            watched => Ok(OwnerTurn::Wait(watcher, Some(watched?.2))),
        }
    }
}

/// What an owner's waiting node does next (see [`ZookeeperBackend::owner_turn`]).
enum OwnerTurn {
    /// Something changed meanwhile: list the directory again.
    Relist,
    /// The holder was our owner's: re-entered.
    Reentered(Queued),
    /// `try_acquire`, and the key is another's.
    GiveUp,
    /// Wait on the node before ours, and on the holder too when that node is our owner's.
    Wait(zk::OneshotWatcher, Option<zk::OneshotWatcher>),
}

/// What queueing a contender ends with.
pub(crate) enum Queued {
    /// Our node holds the key.
    Holds(Box<Contender>),
    /// Our owner's hold on another node was re-entered (and our node deleted); whether we
    /// waited first.
    Reentered(reentry::HoldNode, bool),
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
