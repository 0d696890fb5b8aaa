//! The Redlock algorithm over `dlock-redis` nodes: connecting, acquiring (the rounds, with
//! the fence written back to a majority, are in `round`) and waiting. The held key's
//! extension and release are in `held` (an owner's lease: `reentry::held`); loss is
//! detected by the core's watchdog from failed extensions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant};
use dlock_core::{
    Capabilities, Expiry, Fencing, Inspection, KeyStatus, Leader, LockError, LockOptions,
    LockStats, Mode, Observe, Reentry, Result, WaiterView, Wakeup,
};
use dlock_redis::server::{
    InFlight, Names, Node, NodeError, NodeStatus, Queueing, View, Waiter, token_for,
};
use futures::future::join_all;
use futures::stream::BoxStream;
use rand::Rng;
use tokio::time::Instant;

use crate::NAME;
use crate::cluster::Cluster;
use crate::config::RedlockConfig;
use crate::election;
use crate::held::RedlockHeld;
use crate::inspect::{agreed_keys, agreed_status, unsettled_term};
use crate::permits::permit_quorum;
use crate::reentry::{self, Entry, held::OwnedHeld};
use crate::renew::Renewals;
use crate::round::Round;

/// Split votes in a row that are re-tried after a random pause, before falling back to
/// waiting for an announcement or a ttl.
const MAX_BACKOFFS: u32 = 8;
/// The longest random pause after a split vote.
const MAX_BACKOFF: Duration = Duration::from_millis(100);
/// How often a waiting owner's acquire runs a round without a call (see `take`).
const OWNER_RECHECK: Duration = Duration::from_secs(1);
/// How long `leader()` waits before it reads again a leader whose fence counters a
/// majority does not agree on yet (a grant's write-back under way: one round trip).
const UNSETTLED_REREAD: Duration = Duration::from_millis(25);

/// How long a grant stays safe after its round started: the ttl, less the time the round
/// took, less the clock drift between this client and the nodes (1 % of the ttl, plus 2 ms
/// for Redis' millisecond expiry precision). Saturates at zero.
///
/// The core's watchdog fires `lost()` `ttl / 10 + 2 ms` before `sent_at + ttl`, which is
/// never later than the end of this validity (`sent_at + ttl - ttl / 100 - 2 ms`).
pub(crate) fn validity(ttl: Duration, elapsed: Duration) -> Duration {
    ttl.saturating_sub(elapsed).saturating_sub(drift(ttl))
}

fn drift(ttl: Duration) -> Duration {
    ttl / 100 + Duration::from_millis(2)
}

/// The Redlock protocol for [`LockClient`](dlock_core::raw::LockClient): see the crate docs.
#[derive(Debug)]
pub struct RedlockBackend {
    pub(crate) cluster: Arc<Cluster>,
    prefix: String,
    wakeups: Arc<AtomicU64>,
}

impl RedlockBackend {
    /// Connect to the nodes `config` names, in parallel, each bounded by the connect
    /// timeout. Succeeds when a quorum of them answers; the others are retried by later
    /// requests.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a node list [`RedlockConfig::validate`] refuses,
    /// before any network I/O; [`LockError::Unavailable`] when fewer than a quorum can be
    /// reached, [`LockError::Backend`] when nodes refuse (wrong password, not a Redis
    /// server).
    ///
    /// [`LockError::InvalidConfig`]: dlock_core::LockError::InvalidConfig
    /// [`LockError::Unavailable`]: dlock_core::LockError::Unavailable
    /// [`LockError::Backend`]: dlock_core::LockError::Backend
    pub async fn connect(config: RedlockConfig) -> Result<Self> {
        config.validate()?;
        let nodes = config
            .nodes
            .iter()
            .map(|node| Node::new(node, NAME))
            .collect::<Result<Vec<_>>>()?;
        let failures: Vec<_> = join_all(nodes.iter().map(Node::connect))
            .await
            .into_iter()
            .filter_map(Result::err)
            .collect();
        let cluster = Cluster {
            quorum: config.quorum(),
            response_timeout: config.nodes[0].response_timeout,
            nodes,
            renewals: Renewals::default(),
        };
        if cluster.nodes.len() - failures.len() < cluster.quorum {
            return Err(cluster.no_quorum("connect", failures));
        }
        for e in &failures {
            tracing::warn!(error = %e, "a Redlock node cannot be reached; going on with a quorum");
        }
        Ok(Self {
            cluster: Arc::new(cluster),
            prefix: config.prefix().to_owned(),
            wakeups: Arc::default(),
        })
    }

    /// Take `key` with `token` (a plain hold's, or a `candidate`'s carrying its value):
    /// rounds, waiting and the grant, as the crate docs describe.
    async fn take(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
        token: String,
        candidate: bool,
    ) -> Result<Option<Grant>> {
        let ttl = opts.ttl;
        let c = &*self.cluster;
        let names = Names::new(&self.prefix, key);
        // A permit needs enough nodes that no N + 1 holders fit (see `permits`).
        let quorum = match opts.mode {
            Mode::Permits(limit) => permit_quorum(c.nodes.len(), limit),
            Mode::Exclusive | Mode::Shared => c.quorum,
        };
        // A caller that may wait joins the key's queue on every node from its first round
        // on, with one ticket for all of them: the nodes order their waiters alike, so the
        // first live waiter is first on every node that has its entry. Its waiter (a
        // channel for calls, its subscriptions) is made only once it has to wait, so a
        // round that wins at once pays for none of it.
        let may_wait = deadline.may_wait();
        let ticket = may_wait.then(now_micros);
        let mut waiter: Option<Waiter> = None;
        let mut first_round = true;
        let mut retried = false;
        let mut backoffs = 0;
        // A round was lost (the key busy somewhere): a grant after that is a hand-off.
        let mut found_busy = false;
        // An owner's acquire: this grant's lease of the owner's hold.
        let entry = opts.owner.map(|owner| Entry::new(&names, owner));
        loop {
            let queueing = match &mut waiter {
                Some(w) => {
                    w.start_attempt();
                    w.queueing(None)
                }
                None => Queueing {
                    wait: may_wait,
                    ticket,
                    fence_floor: None,
                },
            };
            let round = self.round(&names, &token, ttl, queueing, quorum, entry.as_ref());
            let request = async {
                match &entry {
                    None => InFlight::new(&c.nodes, &names, &token).run(round).await,
                    Some(entry) => entry.guard(&c.nodes, &token).run(round).await,
                }
            };
            // The first round may run its node timeouts out; later ones, made while
            // waiting, end at the deadline.
            let round = if std::mem::take(&mut first_round) {
                request.await
            } else {
                match deadline.run(request).await {
                    Some(round) => round,
                    None => return Ok(None),
                }
            };
            if may_wait && waiter.is_none() && !matches!(round, Round::Won { .. }) {
                // The round may have queued us: from here on, giving up leaves the queues.
                waiter = Some(Waiter::new(
                    c.nodes.clone(),
                    names.clone(),
                    token.clone(),
                    ticket,
                    quorum,
                    Some(c.node_timeout(ttl)),
                ));
            }
            let (views, failures, granted, took) = match round {
                Round::Won {
                    fence,
                    sent_at,
                    reentered,
                    late,
                } => {
                    if let Some(w) = &mut waiter {
                        w.granted();
                    }
                    if let Some(entry) = entry {
                        let held = OwnedHeld {
                            cluster: self.cluster.clone(),
                            key: key.to_owned(),
                            entry,
                            hold: reentered.unwrap_or_else(|| token.clone()),
                            queued: token,
                            fence,
                            ttl,
                        };
                        let grant = Grant::new(fence, Box::new(held), sent_at);
                        return Ok(Some(match found_busy {
                            true => grant.after_wait(),
                            false => grant,
                        }));
                    }
                    let leader_channel = candidate.then(|| election::channel(&names));
                    let held = RedlockHeld {
                        cluster: self.cluster.clone(),
                        key: key.to_owned(),
                        renewal: None,
                        names,
                        token,
                        fence,
                        ttl,
                        quorum,
                        leader_channel,
                        late,
                    };
                    let grant = Grant::new(fence, Box::new(held), sent_at);
                    return Ok(Some(match found_busy {
                        true => grant.after_wait(),
                        false => grant,
                    }));
                }
                Round::Lost {
                    views,
                    failures,
                    granted,
                    took,
                } => (views, failures, granted, took),
            };
            found_busy |= views.iter().any(|v| matches!(v, View::Held { .. }));
            if c.nodes.len() - failures.len() < quorum {
                // Too few nodes answered: once more (broken connections reopen), then give up.
                if retried || !deadline.may_wait() {
                    return Err(c.no_quorum_of("acquire", quorum, failures));
                }
                retried = true;
                continue;
            }
            retried = false;
            let Some(w) = waiter.as_mut().filter(|_| deadline.may_wait()) else {
                return Ok(None);
            };
            // Listen on every node before the next round, so no call in between is missed.
            if w.listening() < c.nodes.len() {
                let Some(subscribed) = deadline.run(w.subscribe()).await else {
                    return Ok(None);
                };
                for (i, e) in &subscribed.failed {
                    tracing::debug!(node = i, error = %e, "cannot listen for calls on a node");
                }
                if subscribed.added > 0 {
                    continue;
                }
            }
            // Permit holders differ per node, so no one holder names the state: a permit
            // round is split when some nodes granted it and too few did.
            let split = match opts.mode {
                Mode::Permits(_) => granted > 0,
                Mode::Exclusive | Mode::Shared => !majority_holder(&views, quorum),
            };
            if split && backoffs < MAX_BACKOFFS {
                // A split vote: nobody got a majority (contenders that joined the queues at
                // once, or waiters whose entries are on too few nodes yet). They gave their
                // nodes back; try again after a random pause, which also re-joins the queues.
                backoffs += 1;
                tokio::time::sleep_until(deadline.min(Instant::now() + backoff(took))).await;
                if !deadline.may_wait() {
                    return Ok(None);
                }
                continue;
            }
            backoffs = 0;
            let sleep = w.sleep(&views, deadline, &self.wakeups);
            let woken = match entry {
                None => sleep.await,
                // No call announces that the owner took the key meanwhile (another process
                // of it): an owner's waiter runs its round at least every second, which
                // re-enters the owner's hold if there is one.
                Some(_) => tokio::time::timeout(OWNER_RECHECK, sleep)
                    .await
                    .unwrap_or(true),
            };
            if !woken {
                return Ok(None);
            }
        }
    }
}

impl RedlockBackend {
    /// Each node's snapshot of `key`, from a quorum of the nodes at least.
    async fn views(&self, key: &str) -> Result<Vec<NodeStatus>> {
        let c = &*self.cluster;
        let names = Names::new(&self.prefix, key);
        let answers = c
            .on(&c.all(), c.read_timeout(), "inspect", |n| n.inspect(&names))
            .await;
        let (views, failures) = split(answers);
        if views.len() < c.quorum {
            return Err(c.no_quorum("inspect", failures));
        }
        Ok(views)
    }
}

/// Microseconds since the Unix epoch by this client's clock: the queue ticket (the same on
/// every node, so every node orders the waiters alike) and the fence floor.
pub(crate) fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// The nodes' answers, and the errors of those that failed.
fn split<T>(answers: Vec<(usize, Result<T, NodeError>)>) -> (Vec<T>, Vec<NodeError>) {
    let mut ok = Vec::new();
    let mut failures = Vec::new();
    for (_, answer) in answers {
        match answer {
            Ok(value) => ok.push(value),
            Err(e) => failures.push(e),
        }
    }
    (ok, failures)
}

/// Whether one holder has a majority of the nodes (a lease, not a split vote). Tokens are
/// one holder when their owner parts match (a leader's value may differ between nodes).
fn majority_holder(views: &[View], quorum: usize) -> bool {
    views.iter().any(|v| match v {
        View::Held { holder, .. } => {
            let holder = election::owner(holder);
            views
                .iter()
                .filter(
                    |w| matches!(w, View::Held { holder: h, .. } if election::owner(h) == holder),
                )
                .count()
                >= quorum
        }
        _ => false,
    })
}

/// A random pause after a split vote, so the contenders do not collide again: up to four
/// rounds' time (plus 5 ms), at most [`MAX_BACKOFF`].
fn backoff(round: Duration) -> Duration {
    let max = (round * 4 + Duration::from_millis(5)).min(MAX_BACKOFF);
    rand::rng().random_range(Duration::ZERO..=max)
}

#[async_trait]
impl Backend for RedlockBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            // One queue per key on every node, ordered alike by the waiters' tickets.
            fair: true,
            fencing: Fencing::BestEffort {
                why: "each grant's token is written back to a majority before the lease is \
                      reported, so successive holders' majorities share a node and tokens \
                      increase while the nodes keep their memory; a node restarted without \
                      persistence can break the order (each node floors its counter by the \
                      acquiring client's clock and its own clock less 1 s, which keeps it \
                      unless clocks step back or disagree)",
            },
            expiry: Expiry::Ttl,
            releases_on_disconnect: false,
            // Every node runs dlock-redis's reader set; any reader quorum and writer quorum
            // share a node, whose script refuses the second (proof in the crate docs).
            shared: true,
            // Each node counts a key's permit holders; a permit needs
            // floor(M N / (N + 1)) + 1 nodes, so N + 1 holders cannot all have theirs.
            permits: true,
            // A release calls the first live waiter by name on every node; it wakes once a
            // majority called it, the others sleep on.
            wakeup: Wakeup::Notification {
                one_per_release: true,
                max_per_waiter: 1,
            },
            // A minority down keeps a majority of each holder's keys; every node restarted
            // empty at once frees them all (the per-node clock floor keeps tokens rising).
            faults: dlock_core::Faults {
                holder_paused: dlock_core::FaultSafety::Fenced,
                server_restart: dlock_core::FaultSafety::Fenced,
                member_down: dlock_core::FaultSafety::Exclusive,
                member_cut: dlock_core::FaultSafety::Unspecified,
                member_unreachable: dlock_core::FaultSafety::Exclusive,
                slow_link: dlock_core::FaultSafety::Exclusive,
                clock_jump: dlock_core::FaultSafety::Fenced,
            },
            // What a quorum of nodes agrees on: holders (their tokens carry who), waiters in
            // ticket order (one ticket on every node), keys held on a quorum.
            inspect: Inspection {
                who: true,
                waiters: WaiterView::Queue,
                list: true,
            },
            // A candidate's grant, a proclaim and a leader's release are announced on the
            // key's channel on every node; expiries are not, hence the recheck.
            election: Observe::Woken {
                recheck: election::RECHECK,
            },
            // The owner and the hold's leases live in a record beside the key on every
            // node, under the key's ttl, which every lease's renewal refreshes: the hold
            // belongs to no client's connection (see `reentry`).
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
        self.take(key, opts, deadline, token_for(opts.mode), false)
            .await
    }

    async fn campaign(
        &self,
        key: &str,
        value: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        // A writer's acquire whose token carries the value; the grant is announced to the
        // key's observers once it is complete on the nodes (see `election`).
        let token = election::candidate_token(value);
        let granted = self.take(key, opts, deadline, token, true).await?;
        if granted.is_some() {
            let names = Names::new(&self.prefix, key);
            election::announce(&self.cluster, self.cluster.all(), election::channel(&names));
        }
        Ok(granted)
    }

    async fn leader_changes(&self, key: &str) -> Result<Option<BoxStream<'static, Result<()>>>> {
        let names = Names::new(&self.prefix, key);
        let changes = election::changes(self.cluster.clone(), election::channel(&names)).await?;
        Ok(Some(changes))
    }

    fn check_key(&self, key: &str) -> Result<()> {
        Names::check(&self.prefix, key)?;
        reentry::check_key(&self.prefix, key)
    }

    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        let c = &*self.cluster;
        let mut again = true;
        loop {
            let views = self.views(key).await?;
            let status = agreed_status(key, c.nodes.len(), c.quorum, &views);
            let Some(holder) = status.holders.iter().find(|h| h.mode == Mode::Exclusive) else {
                return Ok(None);
            };
            let term = match holder.fencing_token {
                Some(term) => Some(term),
                // Right after a grant, before its fence write-back reached a majority, the
                // counters may disagree: read once more, then answer the highest fence a
                // majority of the leader's nodes reached rather than fail (which would end
                // every observer).
                None if std::mem::take(&mut again) => {
                    tokio::time::sleep(UNSETTLED_REREAD).await;
                    continue;
                }
                None => unsettled_term(c.quorum, &views),
            };
            return match (&holder.who, term) {
                (Some(value), Some(term)) => Ok(Some(Leader::new(value.clone(), term))),
                _ => Err(LockError::backend(
                    NAME,
                    "leader",
                    "the nodes show the holder without its value or token",
                )),
            };
        }
    }

    async fn inspect(&self, key: &str) -> Result<KeyStatus> {
        let c = &*self.cluster;
        let views = self.views(key).await?;
        Ok(agreed_status(key, c.nodes.len(), c.quorum, &views))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let c = &*self.cluster;
        // A SCAN takes a request per page, each bounded by the response timeout: no
        // overall limit per node.
        let answers = join_all(c.nodes.iter().map(|n| n.held_keys(&self.prefix, prefix))).await;
        let (lists, failures) = split(answers.into_iter().enumerate().collect());
        if lists.len() < c.quorum {
            return Err(c.no_quorum("list", failures));
        }
        Ok(agreed_keys(c.quorum, lists))
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.wakeups.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
#[path = "lock_tests.rs"]
mod tests;
