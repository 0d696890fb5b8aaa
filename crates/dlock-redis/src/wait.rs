//! Waiting for a busy key, on one server or on a quorum of several: in the key's queue of
//! waiters, woken only when called.
//!
//! A waiting acquire joins the key's queue on each server (its attempts do, see the
//! acquire script) and listens on the key's channel. When the key frees (a release, a
//! waiter giving up, an expired waiter dropped), the server publishes the token of
//! the first live waiter: that waiter wakes, the others hear a message that is not theirs
//! and sleep on. Every [`TOUCH_EVERY`] the waiter refreshes its entry, which also tells it
//! whether the key is free and its turn (a release nobody announced: another library's
//! lock, an operator's `DEL`). The first waiter also wakes when the holder's ttl runs out
//! (a crashed holder announces nothing). A waiter that gives up (deadline, error, dropped
//! future) leaves the queue, calling the next waiter if it was first.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::raw::Deadline;
use futures::future::join_all;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::Error;
use crate::node::{Attempt, Node, Queueing};
use crate::scripts::{Names, TOUCH_EVERY};
use crate::subscriber::{Event, NOTICE_BACKLOG, Notice, Subscription};

/// What a waiter learned about one server from its last attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum View {
    /// Ours to take: free and our turn (or taken by the attempt).
    Open,
    /// Held by `holder` (or free, and the turn of the waiter `holder`).
    Held {
        /// The holder's token, or the token of the waiter whose turn it is.
        holder: String,
        /// When the holder's ttl runs out (just after, PTTL being rounded down), where we
        /// are the first waiter and so will take the key then; `None` otherwise.
        expires: Option<Instant>,
    },
    /// No answer.
    Down,
}

impl View {
    /// The view of a server that answered `attempt` just now (a taken key counts as open:
    /// the caller releases it, or keeps it).
    pub fn of(attempt: &Attempt) -> Self {
        match attempt {
            Attempt::Taken { .. } | Attempt::Entered { .. } => View::Open,
            Attempt::Busy {
                pttl,
                holder,
                first,
            } => View::Held {
                holder: holder.clone(),
                expires: pttl
                    .filter(|_| *first)
                    .map(|p| Instant::now() + p + Duration::from_millis(1)),
            },
        }
    }
}

/// Why [`Waiter::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Enough servers were open already: re-try without sleeping.
    Ready,
    /// Enough servers called us (our turn): re-try.
    Called,
    /// Refreshing our queue entry found the key free and our turn on enough servers.
    Touched,
    /// The holders' ttls ran out where we are the first waiter.
    Timer,
    /// A subscriber connection broke: calls may be lost. Subscribe again, re-try.
    Broken,
    /// The caller's deadline came.
    Deadline,
}

/// What [`Waiter::subscribe`] did.
#[derive(Debug, Default)]
pub struct Subscribed {
    /// Nodes newly listened to: calls there may have been missed, so re-try.
    pub added: usize,
    /// Nodes (by index) that could not be subscribed to, with why.
    pub failed: Vec<(usize, Error)>,
}

/// One waiting acquire: its place in the key's queue on each of its servers and its
/// subscriptions to the key's channel there. Dropped before [`Waiter::granted`], it leaves
/// the queues in the background.
#[derive(Debug)]
pub struct Waiter {
    nodes: Vec<Node>,
    names: Names,
    token: String,
    ticket: Option<u64>,
    quorum: usize,
    node_timeout: Option<Duration>,
    notices: mpsc::Sender<Notice>,
    heard: mpsc::Receiver<Notice>,
    subscriptions: Vec<Option<Subscription>>,
    next_touch: Instant,
    queued: bool,
    /// The owner of a reentrant hold this waiter waits to take or enter.
    owner: Option<String>,
}

impl Waiter {
    /// A waiter for `names` as `token` on `nodes`, woken when `quorum` of them call it.
    /// `ticket` is its place in the queues (`None`: each server's clock when it joins).
    /// Each subscription and refresh is bounded by `node_timeout` (beyond the nodes' own
    /// timeouts). No I/O.
    pub fn new(
        nodes: Vec<Node>,
        names: Names,
        token: String,
        ticket: Option<u64>,
        quorum: usize,
        node_timeout: Option<Duration>,
    ) -> Self {
        let (notices, heard) = mpsc::channel(NOTICE_BACKLOG);
        let subscriptions = nodes.iter().map(|_| None).collect();
        Self {
            nodes,
            names,
            token,
            ticket,
            quorum,
            node_timeout,
            notices,
            heard,
            subscriptions,
            next_touch: Instant::now() + TOUCH_EVERY,
            queued: true,
            owner: None,
        }
    }

    /// Wait as an acquire of `owner`'s reentrant hold: a refresh that finds the key held
    /// under the owner (another client of it took the key) wakes the waiter to enter the
    /// hold, and giving up drops the entry its attempt may have made.
    #[must_use]
    pub(crate) fn owner(mut self, owner: Option<&str>) -> Self {
        self.owner = owner.map(str::to_owned);
        self
    }

    /// How the waiter's attempts treat the queue: join it, with the waiter's ticket.
    pub fn queueing(&self, fence_floor: Option<u64>) -> Queueing {
        Queueing {
            wait: true,
            ticket: self.ticket,
            fence_floor,
        }
    }

    /// The attempt took the key: its script left the queue where it was granted, and the
    /// release of the key leaves it everywhere else, so dropping the waiter does nothing.
    pub fn granted(&mut self) {
        self.queued = false;
    }

    /// Subscribe, in parallel, on every node that has no live subscription.
    pub async fn subscribe(&mut self) -> Subscribed {
        let missing: Vec<usize> = (0..self.nodes.len())
            .filter(|i| {
                !self.subscriptions[*i]
                    .as_ref()
                    .is_some_and(Subscription::is_alive)
            })
            .collect();
        let attempts = missing.iter().map(|&i| {
            let node = &self.nodes[i];
            let subscribe = node.subscribe(&self.names.channel, i, self.notices.clone());
            bounded(node, "subscribe", self.node_timeout, subscribe)
        });
        let results = join_all(attempts).await;
        let mut outcome = Subscribed::default();
        for (i, result) in missing.into_iter().zip(results) {
            match result {
                Ok(subscription) => {
                    self.subscriptions[i] = Some(subscription);
                    outcome.added += 1;
                }
                Err(e) => {
                    self.subscriptions[i] = None;
                    outcome.failed.push((i, e));
                }
            }
        }
        outcome
    }

    /// How many nodes this waiter listens to (live subscriptions).
    pub fn listening(&self) -> usize {
        self.subscriptions
            .iter()
            .filter(|s| s.as_ref().is_some_and(Subscription::is_alive))
            .count()
    }

    /// Forget what was heard so far: call right before each attempt, whose answers then
    /// reflect those calls (and which refreshes the queue entries, so the next refresh is
    /// due [`TOUCH_EVERY`] from now).
    pub fn start_attempt(&mut self) {
        while self.heard.try_recv().is_ok() {}
        self.next_touch = Instant::now() + TOUCH_EVERY;
    }

    /// [`wait`](Self::wait) until `deadline`, counting in `wakeups` each time the wait ends
    /// to re-check the key. `false` when the deadline has come: give up.
    pub async fn sleep(&mut self, views: &[View], deadline: Deadline, wakeups: &AtomicU64) -> bool {
        let until = deadline.min(Instant::now() + Duration::from_secs(365 * 24 * 3600));
        match self.wait(views, until).await {
            Wake::Deadline => return false,
            Wake::Ready => {}
            Wake::Called | Wake::Touched | Wake::Timer | Wake::Broken => {
                wakeups.fetch_add(1, Ordering::Relaxed);
            }
        }
        deadline.may_wait()
    }

    /// Sleep until a quorum of `views` is open (see the module docs), or `until`.
    pub async fn wait(&mut self, views: &[View], until: Instant) -> Wake {
        let mut open: Vec<bool> = views.iter().map(|v| *v == View::Open).collect();
        let count = |open: &[bool]| open.iter().filter(|o| **o).count();
        if count(&open) >= self.quorum {
            return Wake::Ready;
        }
        loop {
            let expiry = self.fallback(views, &open);
            let timer = expiry.unwrap_or(until).min(self.next_touch).min(until);
            tokio::select! {
                notice = self.heard.recv() => {
                    // The waiter holds a sender itself: the channel never closes.
                    let Some(Notice { node, event }) = notice else { continue };
                    match event {
                        Event::Broken => return Wake::Broken,
                        Event::Called(token) if token == self.token && node < open.len() => {
                            open[node] = true;
                            if count(&open) >= self.quorum {
                                return Wake::Called;
                            }
                        }
                        // Another waiter's turn.
                        Event::Called(_) => {}
                    }
                }
                _ = tokio::time::sleep_until(timer) => {
                    let now = Instant::now();
                    if expiry.is_some_and(|at| at <= now) {
                        return Wake::Timer;
                    }
                    if now >= until {
                        return Wake::Deadline;
                    }
                    let Some(turns) = self.touch(until).await else {
                        return Wake::Deadline;
                    };
                    for i in turns {
                        open[i] = true;
                    }
                    if count(&open) >= self.quorum {
                        return Wake::Touched;
                    }
                }
            }
        }
    }

    /// Refresh our queue entry on every node; the nodes where the key is free and our
    /// turn. `None` when `until` came first.
    async fn touch(&mut self, until: Instant) -> Option<Vec<usize>> {
        self.next_touch = Instant::now() + TOUCH_EVERY;
        let this = &*self;
        let calls = this.nodes.iter().enumerate().map(|(i, node)| {
            let touch =
                node.touch_with(&this.names, &this.token, this.ticket, this.owner.as_deref());
            async move { (i, bounded(node, "touch", this.node_timeout, touch).await) }
        });
        let answers = tokio::time::timeout_at(until, join_all(calls)).await.ok()?;
        let mut turns = Vec::new();
        for (i, answer) in answers {
            match answer {
                Ok(true) => turns.push(i),
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(server = %self.nodes[i].addr(), error = %e, "cannot refresh a waiter's queue entry")
                }
            }
        }
        Some(turns)
    }

    /// When enough holders' ttls will have run out (where we are the first waiter) for a
    /// quorum to be open; `None` when that is not known.
    fn fallback(&self, views: &[View], open: &[bool]) -> Option<Instant> {
        let mut expiries: Vec<Instant> = views
            .iter()
            .zip(open)
            .filter_map(|(view, open)| match view {
                View::Held {
                    expires: Some(at), ..
                } if !open => Some(*at),
                _ => None,
            })
            .collect();
        expiries.sort();
        let missing = self
            .quorum
            .saturating_sub(open.iter().filter(|o| **o).count());
        missing
            .checked_sub(1)
            .and_then(|i| expiries.get(i))
            .copied()
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        if !self.queued {
            return;
        }
        // Gave up (deadline, error, dropped future): leave the queues, calling the next
        // waiter where we were first, so nobody waits for our entry to expire.
        for node in &self.nodes {
            let (node, names, token) = (node.clone(), self.names.clone(), self.token.clone());
            let owner = self.owner.clone();
            dlock_core::raw::spawn_cleanup(async move {
                let result = node
                    .release_with(&names, &token, true, false, owner.as_deref())
                    .await;
                tracing::debug!(key = %names.key, ?result, "a waiter that gave up left the queue");
            });
        }
    }
}

/// `request` to `node`, bounded by `limit` when there is one.
async fn bounded<T>(
    node: &Node,
    op: &'static str,
    limit: Option<Duration>,
    request: impl Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match limit {
        None => request.await,
        Some(limit) => tokio::time::timeout(limit, request)
            .await
            .unwrap_or_else(|_| Err(node.timed_out(op, limit))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RedisConfig;

    /// A view where we are first in line behind `holder`, whose ttl runs `ms` more.
    fn held(holder: &str, ms: u64) -> View {
        View::Held {
            holder: holder.into(),
            expires: Some(Instant::now() + Duration::from_millis(ms)),
        }
    }

    fn waiter(n: usize, quorum: usize) -> Waiter {
        // A server that refuses connections: refreshes fail at once and are ignored.
        let node = Node::new(&RedisConfig::new("127.0.0.1", 1), "redis").unwrap();
        let mut w = Waiter::new(
            vec![node; n],
            Names::new("", "k"),
            "me".into(),
            None,
            quorum,
            None,
        );
        w.granted();
        w
    }

    fn call(w: &Waiter, node: usize, token: &str) {
        w.notices
            .try_send(Notice {
                node,
                event: Event::Called(token.into()),
            })
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_for_us_wakes_and_calls_for_others_do_not() {
        let mut w = waiter(1, 1);
        let views = [held("h", 5_000)];
        call(&w, 0, "another-waiter");
        let started = Instant::now();
        // Another waiter's call does not wake us: the holder's ttl does.
        assert_eq!(
            w.wait(&views, started + Duration::from_secs(10)).await,
            Wake::Timer
        );
        assert!(started.elapsed() >= Duration::from_secs(5));
        w.start_attempt();
        call(&w, 0, "another-waiter");
        call(&w, 0, "me");
        let views = [held("h", 60_000)];
        assert_eq!(
            w.wait(&views, Instant::now() + Duration::from_secs(600))
                .await,
            Wake::Called
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_quorum_of_calls_is_needed_and_duplicates_do_not_count() {
        let mut w = waiter(5, 3);
        let views = || {
            [
                held("w", 60_000),
                held("w", 60_000),
                held("w", 60_000),
                View::Open,
                View::Down,
            ]
        };
        call(&w, 0, "me");
        call(&w, 0, "me");
        let started = Instant::now();
        let until = started + Duration::from_secs(600);
        // Two open (node 3, node 0): not enough; the timer is the holder's ttl.
        assert_eq!(w.wait(&views(), until).await, Wake::Timer);
        assert!(started.elapsed() >= Duration::from_secs(60));
        w.start_attempt();
        call(&w, 1, "me");
        call(&w, 2, "me");
        call(&w, 0, "me");
        assert_eq!(w.wait(&views(), until).await, Wake::Called);
    }

    #[tokio::test(start_paused = true)]
    async fn timers_follow_the_expiries_and_the_deadline() {
        let mut w = waiter(3, 2);
        let views = [held("a", 100), held("b", 300), held("c", 200)];
        let started = Instant::now();
        assert_eq!(
            w.wait(&views, started + Duration::from_secs(10)).await,
            Wake::Timer
        );
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(200) && waited < Duration::from_millis(250),
            "{waited:?}"
        );
        let views = [held("a", 100), held("b", 300), held("c", 200)];
        let started = Instant::now();
        assert_eq!(
            w.wait(&views, started + Duration::from_millis(50)).await,
            Wake::Deadline
        );
        // Not first in line: no timer of the holder's, only refreshes, until the deadline.
        let behind = [View::Held {
            holder: "x".into(),
            expires: None,
        }];
        let mut w = waiter(1, 1);
        let started = Instant::now();
        assert_eq!(
            w.wait(&behind, started + Duration::from_secs(10)).await,
            Wake::Deadline
        );
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert_eq!(w.wait(&[View::Open], started).await, Wake::Ready);
    }

    #[test]
    fn only_the_first_waiter_keeps_the_holders_expiry() {
        let busy = |first| Attempt::Busy {
            pttl: Some(Duration::from_secs(5)),
            holder: "h".into(),
            first,
        };
        assert!(matches!(
            View::of(&busy(true)),
            View::Held {
                expires: Some(_),
                ..
            }
        ));
        assert!(matches!(
            View::of(&busy(false)),
            View::Held { expires: None, .. }
        ));
    }
}
