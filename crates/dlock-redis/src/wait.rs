//! Waiting for a busy key, on one server or on a quorum of several.
//!
//! After a failed attempt the waiter knows, per server, who held the key and for how long
//! ([`View`]). It then sleeps until enough servers are known to be open again: a server
//! opens when the holder it saw there announces its release (the message carries the
//! holder's token, so an older release that arrives late, or the same release heard on
//! another server, wakes nobody), or when that holder's ttl runs out (a crashed holder
//! announces nothing). A key without expiry is re-checked after [`NO_EXPIRY_RECHECK`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::raw::Deadline;
use futures::future::join_all;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::error::Error;
use crate::node::{Attempt, Node};
use crate::subscriber::{Event, NOTICE_BACKLOG, Notice, Subscription};

/// How long a waiter sleeps before re-checking a key that has no expiry (held by another
/// library's lock taken without a timeout, whose release announces nothing).
pub(crate) const NO_EXPIRY_RECHECK: Duration = Duration::from_secs(1);

/// What a waiter learned about one server from its last attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum View {
    /// Nothing of someone else's stands in the way (free, or ours and released since).
    Open,
    /// Held by `holder` until `expires` (`None`: no expiry).
    Held {
        /// The holder's token, as its release will announce it.
        holder: String,
        /// When the holder's ttl runs out (just after, PTTL being rounded down).
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
            Attempt::Taken { .. } => View::Open,
            Attempt::Busy { pttl, holder } => View::Held {
                holder: holder.clone(),
                expires: pttl.map(|p| Instant::now() + p + Duration::from_millis(1)),
            },
        }
    }
}

/// Why [`Waiter::wait`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Enough servers were open already: re-try without sleeping.
    Ready,
    /// Holders announced their release: enough servers are open now.
    Released,
    /// The fallback timer ran out: a holder's ttl, or the re-check interval of a key with
    /// no expiry (1 s).
    Timer,
    /// A subscriber connection broke: announcements may be lost. Subscribe again, re-try.
    Broken,
    /// The caller's deadline came.
    Deadline,
}

/// What [`Waiter::subscribe`] did.
#[derive(Debug, Default)]
pub struct Subscribed {
    /// Nodes newly listened to: releases there may have been missed, so re-try.
    pub added: usize,
    /// Nodes (by index) that could not be subscribed to, with why.
    pub failed: Vec<(usize, Error)>,
}

/// One waiting acquire's subscriptions to a key's release channel on each of its servers.
#[derive(Debug)]
pub struct Waiter {
    nodes: Vec<Node>,
    channel: String,
    quorum: usize,
    subscribe_timeout: Option<Duration>,
    notices: mpsc::Sender<Notice>,
    heard: mpsc::Receiver<Notice>,
    subscriptions: Vec<Option<Subscription>>,
}

impl Waiter {
    /// A waiter on `channel` of every node in `nodes`, that needs `quorum` of them open.
    /// Each subscription is bounded by `subscribe_timeout` (beyond the nodes' own timeouts).
    pub fn new(
        nodes: Vec<Node>,
        channel: String,
        quorum: usize,
        subscribe_timeout: Option<Duration>,
    ) -> Self {
        let (notices, heard) = mpsc::channel(NOTICE_BACKLOG);
        let subscriptions = nodes.iter().map(|_| None).collect();
        Self {
            nodes,
            channel,
            quorum,
            subscribe_timeout,
            notices,
            heard,
            subscriptions,
        }
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
            let subscribe = node.subscribe(&self.channel, i, self.notices.clone());
            let limit = self.subscribe_timeout;
            async move {
                match limit {
                    None => subscribe.await,
                    Some(limit) => tokio::time::timeout(limit, subscribe)
                        .await
                        .unwrap_or_else(|_| Err(node.timed_out("subscribe", limit))),
                }
            }
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
    /// reflect those releases.
    pub fn start_attempt(&mut self) {
        while self.heard.try_recv().is_ok() {}
    }

    /// [`wait`](Self::wait) until `deadline`, counting in `wakeups` each time the wait ends
    /// to re-check the key. `false` when the deadline has come: give up.
    pub async fn sleep(&mut self, views: &[View], deadline: Deadline, wakeups: &AtomicU64) -> bool {
        let until = deadline.min(Instant::now() + Duration::from_secs(365 * 24 * 3600));
        match self.wait(views, until).await {
            Wake::Deadline => return false,
            Wake::Ready => {}
            Wake::Released | Wake::Timer | Wake::Broken => {
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
        let fallback = self.fallback(views, &open);
        let timer = fallback.min(until);
        loop {
            tokio::select! {
                notice = self.heard.recv() => {
                    // The waiter holds a sender itself: the channel never closes.
                    let Some(Notice { node, event }) = notice else { continue };
                    match event {
                        Event::Broken => return Wake::Broken,
                        Event::Released(token) => {
                            let opens = matches!(
                                views.get(node),
                                Some(View::Held { holder, .. }) if *holder == token
                            );
                            if opens && !open[node] {
                                open[node] = true;
                                if count(&open) >= self.quorum {
                                    return Wake::Released;
                                }
                            }
                        }
                    }
                }
                _ = tokio::time::sleep_until(timer) => {
                    return if fallback <= until { Wake::Timer } else { Wake::Deadline };
                }
            }
        }
    }

    /// When enough holders' ttls will have run out for a quorum to be open, or after
    /// [`NO_EXPIRY_RECHECK`] when that is not known.
    fn fallback(&self, views: &[View], open: &[bool]) -> Instant {
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
        match missing.checked_sub(1).and_then(|i| expiries.get(i)) {
            Some(at) => *at,
            None => Instant::now() + NO_EXPIRY_RECHECK,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RedisConfig;

    fn held(holder: &str, ms: u64) -> View {
        View::Held {
            holder: holder.into(),
            expires: Some(Instant::now() + Duration::from_millis(ms)),
        }
    }

    fn waiter(n: usize, quorum: usize) -> Waiter {
        let node = Node::new(&RedisConfig::new("127.0.0.1", 1), "redis").unwrap();
        Waiter::new(vec![node; n], "ch".into(), quorum, None)
    }

    fn release(w: &Waiter, node: usize, token: &str) {
        w.notices
            .try_send(Notice {
                node,
                event: Event::Released(token.into()),
            })
            .unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_of_the_holder_seen_wakes_and_others_do_not() {
        let mut w = waiter(1, 1);
        let views = [held("h", 60_000)];
        release(&w, 0, "older-holder");
        release(&w, 0, "h");
        assert_eq!(
            w.wait(&views, Instant::now() + Duration::from_secs(600))
                .await,
            Wake::Released
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_quorum_of_releases_is_needed_and_duplicates_do_not_count() {
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
        release(&w, 0, "w");
        release(&w, 0, "w");
        let started = Instant::now();
        let until = started + Duration::from_secs(600);
        // Two open (node 3, node 0): not enough; the timer is the holder's ttl.
        assert_eq!(w.wait(&views(), until).await, Wake::Timer);
        assert!(started.elapsed() >= Duration::from_secs(60));
        w.start_attempt();
        release(&w, 1, "w");
        release(&w, 2, "w");
        release(&w, 0, "w");
        assert_eq!(w.wait(&views(), until).await, Wake::Released);
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
        let no_expiry = [View::Held {
            holder: "x".into(),
            expires: None,
        }];
        let mut w = waiter(1, 1);
        let started = Instant::now();
        assert_eq!(
            w.wait(&no_expiry, started + Duration::from_secs(10)).await,
            Wake::Timer
        );
        assert_eq!(started.elapsed(), NO_EXPIRY_RECHECK);
        assert_eq!(w.wait(&[View::Open], started).await, Wake::Ready);
    }
}
