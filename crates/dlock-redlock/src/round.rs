//! One acquire round over every node, and the fence write-back that completes a grant.
//! An owner's round (reentrant holds) runs the owner's take-or-re-enter script instead of
//! the plain acquire script; what its re-entries mean is in [`crate::reentry`].

use std::sync::Arc;
use std::time::Duration;

use dlock_core::raw::spawn_cleanup;
use dlock_redis::server::{Attempt, Names, NodeError, Queueing, View, is_permit_token};
use tokio::time::Instant;

use crate::cluster::{Cluster, Late};
use crate::lock::{RedlockBackend, now_micros, validity};
use crate::reentry::{self, Answer, Entry};

/// How a round ended.
pub(crate) enum Round {
    Won {
        fence: u64,
        sent_at: Instant,
        /// The owner's hold the round re-entered (its token), or `None` for a fresh grant.
        reentered: Option<String>,
        /// The acquire requests still running on nodes the round was decided without.
        late: Late,
    },
    Lost {
        views: Vec<View>,
        failures: Vec<NodeError>,
        /// Nodes that granted the key (and were given it back).
        granted: usize,
        took: Duration,
    },
}

impl RedlockBackend {
    /// One round: take the key on every node, and if a quorum granted it in time, write the
    /// highest fence back to a majority. On failure, give back what we may hold.
    /// `queueing` says whether to join the key's queue on the nodes that do not grant it;
    /// its fence floor is set here, the same for every node.
    /// `quorum` is the number of nodes that must grant the key: the majority, or a permit's
    /// [`permit_quorum`](crate::permits::permit_quorum).
    /// With an owner's `entry`, a node may re-enter the owner's hold instead: a majority of
    /// re-entries of one hold wins at once (see [`crate::reentry`]).
    pub(crate) async fn round(
        &self,
        names: &Names,
        token: &str,
        ttl: Duration,
        queueing: Queueing,
        quorum: usize,
        entry: Option<&Entry>,
    ) -> Round {
        let c = &*self.cluster;
        let limit = c.node_timeout(ttl);
        let sent_at = Instant::now();
        // The same floor on every node: nodes whose counters are behind it all issue it, so
        // no write-back is needed (see the acquire script of dlock-redis).
        let queueing = Queueing {
            fence_floor: Some(now_micros()),
            ..queueing
        };
        let queueing = &queueing;
        let mut late = Late::default();
        let answers = match entry {
            // Decided once a quorum granted with one fence (no write-back to make): the
            // round takes as long as the quorum-th fastest node (a node that grants later
            // holds the key for this lease too, renewed and released with it). Otherwise
            // it waits for every node: a losing round's waiting needs each node's view, and
            // a write-back is surer with every granting node to write to.
            None => {
                let granted = |answers: &[(usize, Result<Answer, NodeError>)]| {
                    let mut fences = answers.iter().filter_map(|(_, a)| match a {
                        Ok(Answer::Attempt(Attempt::Taken { fence })) => Some(*fence),
                        _ => None,
                    });
                    let Some(first) = fences.next() else {
                        return false;
                    };
                    let mut taken = 1;
                    for fence in fences {
                        if fence != first {
                            return false;
                        }
                        taken += 1;
                    }
                    taken >= quorum
                };
                let request = Arc::new((names.clone(), token.to_owned(), *queueing));
                let (answers, left) = c
                    .on_until(
                        &c.all(),
                        limit,
                        "acquire",
                        &Late::default(),
                        |n| {
                            let request = request.clone();
                            async move {
                                let (names, token, queueing) = &*request;
                                n.acquire(names, token, ttl, queueing)
                                    .await
                                    .map(Answer::Attempt)
                            }
                        },
                        granted,
                    )
                    .await;
                late = left;
                answers
            }
            Some(entry) => {
                c.on(&c.all(), limit, "acquire", |n| {
                    entry.acquire(n, token, ttl, queueing)
                })
                .await
            }
        };
        let mut views = vec![View::Down; c.nodes.len()];
        let mut taken = Vec::new();
        let mut reentered = Vec::new();
        let mut failures = Vec::new();
        // A node whose answer was not read (the round was decided without it) may have
        // granted: it is given back with the others if the round is lost after all.
        let mut unsure: Vec<usize> = (0..c.nodes.len())
            .filter(|i| answers.iter().all(|(j, _)| j != i))
            .collect();
        for (i, answer) in answers {
            match answer {
                Ok(Answer::Attempt(Attempt::Taken { fence })) => {
                    taken.push((i, fence));
                    views[i] = View::Open;
                }
                Ok(Answer::Attempt(busy)) => views[i] = View::of(&busy),
                Ok(Answer::Reentered { token: hold, fence }) => {
                    views[i] = View::Held {
                        holder: hold.clone(),
                        expires: None,
                    };
                    reentered.push((i, hold, fence));
                }
                Err(e) => {
                    unsure.push(i);
                    failures.push(e);
                }
            }
        }
        let taken_nodes = || taken.iter().map(|(i, _)| *i);
        if let Some(entry) = entry {
            // A majority re-entered one hold of the owner within the validity: granted at
            // once with the hold's token. Whatever else the round added (a minority's
            // re-entry of another hold, nodes taken afresh) is taken back.
            if let Some((hold, fence)) = reentry::majority(&reentered, quorum)
                && !validity(ttl, sent_at.elapsed()).is_zero()
            {
                let others: Vec<usize> = reentered
                    .iter()
                    .filter(|(_, h, _)| *h != hold)
                    .map(|(i, _, _)| *i)
                    .chain(taken_nodes())
                    .collect();
                entry.give_back(c, &others, token, limit, false).await;
                return Round::Won {
                    fence,
                    sent_at,
                    reentered: Some(hold),
                    late,
                };
            }
        }
        if taken.len() >= quorum
            && !validity(ttl, sent_at.elapsed()).is_zero()
            && let Some(fence) = self
                .write_back(names, token, ttl, limit, &taken, quorum, entry)
                .await
            && !validity(ttl, sent_at.elapsed()).is_zero()
        {
            if let Some(entry) = entry {
                // A minority re-entered an earlier hold of the owner: not ours any more.
                let stale: Vec<usize> = reentered.iter().map(|(i, _, _)| *i).collect();
                entry.give_back(c, &stale, token, limit, false).await;
            }
            return Round::Won {
                fence,
                sent_at,
                reentered: None,
                late,
            };
        }
        // Give back what we took, and what a node that did not answer may have granted.
        // Call the next waiter if we had a quorum: then others may be waiting on us. A
        // permit always calls whoever's turn it gives (a waiting round's give-back rejoins
        // the queue first, see `give_back_after`): permits call their waiters one turn at
        // a time, as each comes, so a turn nobody announces is never announced; a lock's
        // release recomputes its queue's head and calls it every time.
        let announce = taken.len() >= quorum || is_permit_token(token);
        match entry {
            None => {
                let mine: Vec<usize> = taken_nodes().chain(unsure).collect();
                let cluster = self.cluster.clone();
                let (names, token, queueing) = (names.clone(), token.to_owned(), *queueing);
                let how = (limit, announce, queueing);
                if late.is_empty() {
                    give_back_after(cluster, mine, late, names, token, how, || true).await;
                } else {
                    // After the acquires still running there (a give-back must not overtake
                    // them), in a clean-up task: it goes on if this round is dropped
                    // meanwhile, when the acquire guard's own releases may come first (and
                    // its permit then does not rejoin the queues the waiter has left).
                    let (done, finished) = tokio::sync::oneshot::channel::<()>();
                    spawn_cleanup(async move {
                        let waiting = || !done.is_closed();
                        give_back_after(cluster, mine, late, names, token, how, waiting).await;
                    });
                    let _ = finished.await;
                }
            }
            Some(entry) => {
                let mine: Vec<usize> = taken_nodes()
                    .chain(reentered.iter().map(|(i, _, _)| *i))
                    .chain(unsure)
                    .collect();
                entry.give_back(c, &mine, token, limit, announce).await;
            }
        }
        Round::Lost {
            views,
            failures,
            granted: taken.len(),
            took: sent_at.elapsed(),
        }
    }

    /// Make the highest fence any granting node issued the fencing token, and store it on a
    /// majority before the lease is reported: the next holder's majority shares a node
    /// with this one and issues a greater token. An owner's fresh hold writes it to the
    /// nodes' hold records too, which its re-entries read it back from.
    #[allow(clippy::too_many_arguments)]
    async fn write_back(
        &self,
        names: &Names,
        token: &str,
        ttl: Duration,
        limit: Duration,
        taken: &[(usize, u64)],
        quorum: usize,
        entry: Option<&Entry>,
    ) -> Option<u64> {
        let c = &*self.cluster;
        let top = taken.iter().map(|(_, fence)| *fence).max()?;
        let behind: Vec<usize> = taken
            .iter()
            .filter(|(_, fence)| *fence < top)
            .map(|(i, _)| *i)
            .collect();
        let at_top = taken.len() - behind.len();
        let claims = match entry {
            None => {
                c.on(&behind, limit, "claim", |n| n.claim(names, token, ttl, top))
                    .await
            }
            Some(entry) => {
                c.on(&behind, limit, "claim", |n| entry.claim(n, token, ttl, top))
                    .await
            }
        };
        let claimed = claims
            .into_iter()
            .filter(|(_, r)| matches!(r, Ok(true)))
            .count();
        (at_top + claimed >= quorum).then_some(top)
    }
}

/// Give the key back on the nodes `mine`, each after the acquire `late` left running there.
/// A waiting round's permit rejoins the queue with its ticket as it goes back, while the
/// round still `waiting()`: taking it left the queue, and its place there is its turn (see
/// the permit give-back script of `dlock-redis`), which a waiter behind must not take while
/// this round backs off.
async fn give_back_after(
    cluster: Arc<Cluster>,
    mine: Vec<usize>,
    late: Late,
    names: Names,
    token: String,
    (limit, announce, queueing): (Duration, bool, Queueing),
    waiting: impl Fn() -> bool,
) {
    for &i in &mine {
        late.on(i).await;
    }
    let rejoin = queueing.wait && is_permit_token(&token) && waiting();
    let (names, token) = (&names, &token);
    cluster
        .on(&mine, limit, "release", |n| async move {
            match rejoin {
                true => n.give_back_permit(names, token, queueing.ticket).await,
                false => n.release(names, token, announce).await,
            }
        })
        .await;
}
