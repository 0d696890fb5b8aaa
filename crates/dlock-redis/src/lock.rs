//! The [`Backend`] and [`Held`] implementations: connection, acquire (with waiting),
//! release, renewal. Loss is detected by the core's watchdog from failed renewals.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant, Held};
use dlock_core::{
    Capabilities, Expiry, Fencing, Inspection, KeyStatus, LockError, LockOptions, LockStats,
    LostReason, Observe, Reentry, Result, WaiterView, Wakeup,
};
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::NAME;
use crate::config::{RedisConfig, Topology};
use crate::node::{Attempt, Node, Queueing};
use crate::renew::HeldKey;
use crate::scripts::{self, Names};
use crate::subscriber::{Event, Notice, Subscription};
use crate::wait::{View, Waiter};

/// How long an election observer goes without reading the leader. Every change this
/// crate makes publishes on the key's channel (a campaign's grant, a proclaim, a leader's
/// release); what publishes nothing is a leader's key expiring (a crashed or cut-off
/// leader with no candidate waiting: a waiting one is granted the key and publishes) or
/// another client's plain `DEL`. Half a second bounds how stale an observer can be then,
/// at two one-round-trip reads a second per observer.
pub(crate) const ELECTION_RECHECK: Duration = Duration::from_millis(500);

/// Notices one observer keeps unread: one pending is enough to make it read the leader
/// again, so what comes beyond this is dropped without loss.
const OBSERVER_BACKLOG: usize = 16;

/// The Redis protocol for [`LockClient`](dlock_core::raw::LockClient): see the crate docs.
#[derive(Debug)]
pub struct RedisBackend {
    node: Node,
    prefix: String,
    wakeups: Arc<AtomicU64>,
    topology: Kind,
}

/// The deployment behind a backend, for its capabilities and key checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Server,
    Sentinel,
    Cluster,
}

impl RedisBackend {
    /// Connect to the server `config` names: open the command connection (checking the
    /// credentials and that the server speaks Redis) and load the scripts, bounded by the
    /// connect timeout. The subscriber connection opens when a first acquire waits.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when the server cannot be reached in time,
    /// [`LockError::Backend`] when it refuses (wrong password, not a Redis server).
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        let node = Node::new(&config, NAME)?;
        node.connect().await?;
        let topology = match config.topology {
            Topology::Server => Kind::Server,
            Topology::Sentinel(_) => Kind::Sentinel,
            Topology::Cluster { .. } => Kind::Cluster,
        };
        Ok(Self {
            node,
            prefix: config.prefix,
            wakeups: Arc::default(),
            topology,
        })
    }
}

#[async_trait]
impl Backend for RedisBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // One queue per key on the server, served in order of arrival.
            fair: true,
            fencing: Fencing::BestEffort {
                why: match self.topology {
                    Kind::Server => {
                        "the token is a per-key counter in the server's memory, floored by \
                         the server clock in microseconds: it keeps increasing across a \
                         restart without persistence or a failover only while the server \
                         clock never steps back"
                    }
                    Kind::Sentinel | Kind::Cluster => {
                        "the token is a per-key counter in the master's memory, replicated \
                         asynchronously and floored by the master's clock in microseconds: \
                         across a failover it keeps increasing only while the new master's \
                         clock is not behind the old one's by more than the failover took"
                    }
                },
            },
            expiry: Expiry::Ttl,
            releases_on_disconnect: false,
            // Readers are a sorted set at the lock key, ordered with writers in one queue.
            shared: true,
            // Permit holders are members of that sorted set, counted against each
            // acquirer's own limit; the queue calls the waiters whose turn a release makes.
            permits: true,
            // A release calls the first live waiter by name (and the readers right behind
            // a reader); the others sleep on.
            wakeup: Wakeup::Notification {
                one_per_release: true,
                max_per_waiter: 1,
            },
            // A restart without persistence or a failover loses held keys (another client may
            // take one before its holder's next renewal); the clock floor keeps tokens rising.
            // With Sentinel or a cluster, a failover promotes a replica that may lack a key
            // granted just before (replication is asynchronous): the same promise, with
            // the new master's clock as the floor (see the crate docs, *Topologies*).
            faults: dlock_core::Faults {
                holder_paused: dlock_core::FaultSafety::Fenced,
                server_restart: dlock_core::FaultSafety::Fenced,
                member_down: dlock_core::FaultSafety::Fenced,
                // A slow or lossy link only slows the scripts; a server clock that jumps
                // forward expires keys early (Redis expires by its wall clock), but the
                // next grant's token is floored by that same clock.
                slow_link: dlock_core::FaultSafety::Exclusive,
                clock_jump: dlock_core::FaultSafety::Fenced,
                ..Default::default()
            },
            // Holders' tokens carry their description; the queue is one sorted set by
            // ticket; SCAN enumerates the lock keys under the key prefix.
            inspect: Inspection {
                who: true,
                waiters: WaiterView::Queue,
                list: true,
            },
            // A campaign's grant, a proclaim and a leader's release publish on the key's
            // channel; a leader whose key expired is seen at the next recheck.
            election: Observe::Woken {
                recheck: ELECTION_RECHECK,
            },
            // The hold and its entries live beside the key under its ttl, which every
            // entry's renewal keeps up (never shortening it): no connection or session
            // owns them (see the crate docs, *Reentrant holds*).
            reentrant: Reentry::AnyLease,
            ..Default::default()
        }
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
        self.take(key, opts, deadline, Some(value)).await
    }

    async fn leader_changes(&self, key: &str) -> Result<Option<BoxStream<'static, Result<()>>>> {
        let names = self.names(key);
        // On the client's one subscriber connection, beside its waiters; confirmed by the
        // server before this returns, so no change published afterwards is missed.
        let (notices, heard) = mpsc::channel(OBSERVER_BACKLOG);
        let subscription = self.node.subscribe(&names.channel, 0, notices).await?;
        Ok(Some(
            stream::unfold(
                (heard, subscription),
                |(mut heard, subscription)| async move {
                    let item = next_change(&mut heard, &subscription).await?;
                    Some((item, (heard, subscription)))
                },
            )
            .boxed(),
        ))
    }

    fn check_key(&self, key: &str) -> Result<()> {
        Names::check(&self.prefix, key)
    }

    async fn inspect(&self, key: &str) -> Result<KeyStatus> {
        let names = self.names(key);
        let (status, hold) = self.node.inspect_hold(&names).await?;
        let mut status = status.key_status(key);
        crate::reentry::show_hold(&mut status, hold);
        Ok(status)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        Ok(self.node.held_keys(&self.prefix, prefix).await?)
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.wakeups.load(Ordering::Relaxed))
    }
}

/// The next item of an election observer's stream: `Ok` once any message came on the
/// key's channel (a leader's change, or a waiter called: the key changed hands), the ones
/// queued behind it read too (one read of the leader answers them all); an error once the
/// subscriber connection broke (messages may have been lost); `None` if the subscriber is
/// gone.
async fn next_change(
    heard: &mut mpsc::Receiver<Notice>,
    subscription: &Subscription,
) -> Option<Result<()>> {
    let broken = || {
        Err(LockError::unavailable(
            NAME,
            "observe",
            "the subscriber connection broke; changes may have been missed",
        ))
    };
    let mut notice = heard.recv().await?;
    loop {
        if notice.event == Event::Broken || !subscription.is_alive() {
            return Some(broken());
        }
        match heard.try_recv() {
            Ok(next) => notice = next,
            Err(_) => return Some(Ok(())),
        }
    }
}

impl RedisBackend {
    /// The names of `key`'s lock: on a cluster, all in the lock key's hash slot (see
    /// [`Names::in_cluster`]).
    fn names(&self, key: &str) -> Names {
        match self.topology {
            Kind::Cluster => Names::in_cluster(&self.prefix, key),
            Kind::Server | Kind::Sentinel => Names::new(&self.prefix, key),
        }
    }

    /// Take `key` as `acquire` does; with a `value`, as an election candidate: the value
    /// rides in the token in place of the holder description, and the grant and the
    /// hold's release and proclaims wake the election's observers.
    async fn take(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
        value: Option<&str>,
    ) -> Result<Option<Grant>> {
        let ttl = opts.ttl;
        let leader = value.is_some();
        // An owner's hold (exclusive: the core refuses owners with other modes).
        let owner = opts.owner.as_ref().map(dlock_core::Owner::as_str);
        let names = self.names(key);
        let token = match value {
            Some(value) => scripts::new_campaign_token(value),
            None => scripts::token_for(opts.mode),
        };
        let nodes = std::slice::from_ref(&self.node);
        // A caller that may wait joins the key's queue from its first attempt on; its
        // waiter (a channel for calls, its place in line) is made only once it has to wait,
        // so an acquire that finds the key free pays for none of it.
        let may_wait = deadline.may_wait();
        let mut waiter: Option<Waiter> = None;
        let mut first_attempt = true;
        let mut retried = false;
        // The key was found busy: a grant after that is a hand-off.
        let mut found_busy = false;
        loop {
            let queueing = match &mut waiter {
                Some(w) => {
                    w.start_attempt();
                    w.queueing(None)
                }
                None => Queueing {
                    wait: may_wait,
                    ..Queueing::default()
                },
            };
            let sent_at = Instant::now();
            let request = InFlight::new(nodes, &names, &token)
                .leader(leader)
                .owner(owner)
                .run(
                    self.node
                        .acquire_with(&names, &token, ttl, &queueing, leader, owner),
                );
            // The first attempt may run its timeouts out (a dead server is `Unavailable`);
            // later ones, made while waiting, end at the deadline.
            let answer = if std::mem::take(&mut first_attempt) {
                request.await
            } else {
                match deadline.run(request).await {
                    Some(answer) => answer,
                    None => return Ok(None),
                }
            };
            let granted = matches!(answer, Ok(Attempt::Taken { .. } | Attempt::Entered { .. }));
            if may_wait && waiter.is_none() && !granted {
                // The attempt may have queued us: from here on, giving up leaves the queue.
                waiter = Some(
                    Waiter::new(nodes.to_vec(), names.clone(), token.clone(), None, 1, None)
                        .owner(owner),
                );
            }
            let attempt = match answer {
                Ok(attempt) => attempt,
                // A waiter whose connection broke (a reset, a server restart) tries once more
                // on a new connection; a second failure in a row ends the wait.
                Err(e) if waiter.is_some() && !retried && e.is_unavailable() => {
                    tracing::debug!(key, error = %e, "acquire failed while waiting; retrying");
                    retried = true;
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            retried = false;
            let view = match attempt {
                Attempt::Taken { fence } | Attempt::Entered { fence, .. } => {
                    if let Some(w) = &mut waiter {
                        w.granted();
                    }
                    // An owner's entry is named by the token this acquire sent, whether
                    // it took the key or entered the owner's hold.
                    let held = RedisHeld {
                        node: self.node.clone(),
                        key: key.to_owned(),
                        renewal: None,
                        names,
                        token,
                        leader,
                        owner: owner.map(str::to_owned),
                    };
                    let grant = Grant::new(fence, Box::new(held), sent_at);
                    return Ok(Some(match found_busy {
                        true => grant.after_wait(),
                        false => grant,
                    }));
                }
                busy => {
                    found_busy = true;
                    View::of(&busy)
                }
            };
            let Some(waiter) = waiter.as_mut().filter(|_| deadline.may_wait()) else {
                return Ok(None);
            };
            // Listen before the next attempt, so a call in between is not missed.
            if waiter.listening() < 1 {
                let Some(mut subscribed) = deadline.run(waiter.subscribe()).await else {
                    return Ok(None);
                };
                if let Some((_, e)) = subscribed.failed.pop() {
                    return Err(e.into());
                }
                continue;
            }
            if !waiter.sleep(&[view], deadline, &self.wakeups).await {
                return Ok(None);
            }
        }
    }
}

/// An acquire request on its way: if the caller drops the acquire future before the
/// answers arrive, the key may be ours on the servers, so release it there in the
/// background (announcing it, in case others wait on it).
#[derive(Debug)]
pub struct InFlight<'a> {
    nodes: &'a [Node],
    names: &'a Names,
    token: &'a str,
    armed: bool,
    leader: bool,
    owner: Option<&'a str>,
}

impl<'a> InFlight<'a> {
    /// A guard for an acquire of `names` with `token` on `nodes`.
    pub fn new(nodes: &'a [Node], names: &'a Names, token: &'a str) -> Self {
        Self {
            nodes,
            names,
            token,
            armed: true,
            leader: false,
            owner: None,
        }
    }

    /// Mark the request as an owner's acquire, whose release in the background drops the
    /// entry it may have added to the owner's hold (or the hold it may have taken).
    #[must_use]
    pub(crate) fn owner(mut self, owner: Option<&'a str>) -> Self {
        self.owner = owner;
        self
    }

    /// Mark the request as an election candidate's, whose release in the background
    /// also wakes the election's observers.
    #[must_use]
    pub(crate) fn leader(mut self, leader: bool) -> Self {
        self.leader = leader;
        self
    }

    /// Run `request` under the guard.
    pub async fn run<T>(mut self, request: impl Future<Output = T>) -> T {
        let out = request.await;
        self.armed = false;
        out
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        for node in self.nodes {
            let (node, names, token) = (node.clone(), self.names.clone(), self.token.to_owned());
            let leader = self.leader;
            let owner = self.owner.map(str::to_owned);
            dlock_core::raw::spawn_cleanup(async move {
                let result = node
                    .release_with(&names, &token, true, leader, owner.as_deref())
                    .await;
                tracing::debug!(key = %names.key, ?result, "released after a cancelled acquire");
            });
        }
    }
}

/// The handle on a key this client holds.
#[derive(Debug)]
pub(crate) struct RedisHeld {
    node: Node,
    key: String,
    names: Names,
    token: String,
    /// Made on the first renewal: most holds end before one is due.
    renewal: Option<HeldKey>,
    /// An election's leader: its renewals keep the fence counter (its term) alive, and its
    /// release and proclaims wake the election's observers.
    leader: bool,
    /// An entry of this owner's reentrant hold, named by `token` (the token its acquire
    /// sent): renewed and released as that entry of the key's current hold.
    owner: Option<String>,
}

impl RedisHeld {
    fn not_held(&self) -> LockError {
        LockError::not_held(NAME, &self.key, LostReason::NotHeld)
    }

    async fn extend_once(&mut self, ttl: Duration) -> Result<bool> {
        if self.leader {
            // One leader per election per process: not worth the batch, and the batch
            // script does not touch the fence counter.
            return Ok(self
                .node
                .extend_leader(&self.names, &self.token, ttl)
                .await?);
        }
        let renewal = self.renewal.get_or_insert_with(|| match self.owner {
            Some(_) => HeldKey::entry(&self.names, &self.token),
            None => HeldKey::new(&self.names, &self.token),
        });
        Ok(self.node.renew(renewal, ttl).await?)
    }

    async fn release_once(&mut self) -> Result<bool> {
        Ok(self
            .node
            .release_with(
                &self.names,
                &self.token,
                true,
                self.leader,
                self.owner.as_deref(),
            )
            .await?)
    }
}

#[async_trait]
impl Held for RedisHeld {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        match self.extend_once(ttl).await? {
            true => Ok(()),
            false => Err(self.not_held()),
        }
    }

    async fn release(&mut self) -> Result<()> {
        match self.release_once().await? {
            true => Ok(()),
            false => Err(self.not_held()),
        }
    }

    async fn proclaim(&mut self, value: &str) -> Result<()> {
        self.leader = true;
        // Same random bits, new value: the owner identity does not change. Every owner
        // check compares only those bits (see `scripts`), so whether or not this script
        // runs, and whether or not its answer comes back (a lost answer, a dropped
        // future), the server holds a token this handle's owner checks match: the hold
        // is renewed and released as before, with either value.
        let token = scripts::with_value(&self.token, value);
        if !self.node.proclaim(&self.names, &self.token, &token).await? {
            return Err(self.not_held());
        }
        self.token = token;
        // The renewal's key and token were made for the old token.
        self.renewal = None;
        Ok(())
    }
}
