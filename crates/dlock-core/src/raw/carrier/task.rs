//! The carrier task: one session, the locks it holds, its keeps and releases.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{Instant, sleep_until};

use super::{Afterwards, Carrier, Failure, Give, Group, Order, Registry, Request, Session, guard};
use crate::{LockError, LostReason};

/// One carrier task: the session and what it holds.
pub(super) struct Task<S: Session> {
    pub(super) backend: &'static str,
    pub(super) session: Option<S>,
    pub(super) carrier: Arc<Carrier<S>>,
    /// Where the carrier is registered, when it is shared.
    pub(super) registry: Option<(Arc<Registry<S>>, Group)>,
    /// The session's idle timeout.
    pub(super) idle: Duration,
    /// Locks the session holds.
    pub(super) held: usize,
    /// When the keep renewals wait for goes out.
    pub(super) keep_due: Option<Instant>,
    pub(super) last_keep: Option<Instant>,
    pub(super) gap: Duration,
    /// When the last request the server is known to have answered was sent: its idle
    /// clock cannot have started earlier.
    pub(super) alive_as_of: Instant,
    /// How long a shared carrier holding nothing waits for a take before it rests and
    /// retires (`None`: it retires at once; see [`Carriers::linger`](super::Carriers::linger)).
    pub(super) linger: Option<Duration>,
    /// When this carrier, holding nothing, rests and retires unless a take comes first.
    pub(super) rest_at: Option<Instant>,
    /// `true` once the client is gone ([`Carriers::close_idle`](super::Carriers::close_idle)).
    pub(super) closing: watch::Receiver<bool>,
}

impl<S: Session> Task<S> {
    pub(super) async fn run(
        mut self,
        mut requests: mpsc::UnboundedReceiver<Request<S::Lock>>,
        mut orders: mpsc::UnboundedReceiver<Order<S>>,
    ) {
        let mut closing = self.closing.clone();
        loop {
            let keep_due = match (self.keep_due, self.renewal_due()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let carrier = self.carrier.clone();
            let outcome = tokio::select! {
                biased;
                Some(order) = orders.recv() => match order {
                    Order::Give(give) => self.give(give).await,
                    Order::Call { lock, call, reply } => self.call(&lock, call, reply).await,
                },
                // Due renewals go before queued takes, so a burst of acquires never
                // starves the holds already taken.
                () = sleep_until_some(keep_due), if keep_due.is_some() => self.keep().await,
                () = carrier.keep_asked.notified(), if self.keep_due.is_none() => {
                    let now = Instant::now();
                    self.keep_due = Some(self.last_keep.map_or(now, |t| (t + self.gap).max(now)));
                    Ok(())
                }
                Some(request) = requests.recv() => self.request(request).await,
                () = sleep_until_some(self.rest_at), if self.rest_at.is_some() => {
                    if self.unregister() {
                        return self.rest().await;
                    }
                    // A take was routed here meanwhile: it is on its way.
                    self.rest_at = None;
                    Ok(())
                }
                () = client_gone(&mut closing), if self.rest_at.is_some() => {
                    if self.unregister() {
                        // Holding nothing, for a client that is gone: close it.
                        self.session = None;
                        return;
                    }
                    // A take was routed here just before: serve it (waiting for it here,
                    // not looping on the closed client).
                    match requests.recv().await {
                        Some(request) => self.request(request).await,
                        None => return,
                    }
                }
                else => return,
            };
            if let Err(reason) = outcome {
                self.die(reason, &mut requests, &mut orders);
                return;
            }
            if self.held > 0 || self.keep_due.is_some() {
                self.rest_at = None;
                if self.held > 0 {
                    // Not idle (an unlock that failed leaves its hold counted): another
                    // carrier of the group may linger.
                    self.carrier.lingering.store(false, Ordering::SeqCst);
                }
            } else if let Some(linger) = self.linger
                && self.carrier.lingering.load(Ordering::SeqCst)
            {
                // From the last event: no request is older (the server's idle clock
                // restarted with it).
                self.rest_at = Some(Instant::now() + linger);
                self.session().lingering();
            } else if self.unregister() {
                if let Some(session) = self.session.take() {
                    session.retire();
                }
                return;
            }
        }
    }

    /// A lingering carrier that no take came to: reset the session's idle timeout and give
    /// it back; on an error drop it (it holds nothing).
    async fn rest(&mut self) {
        let Some(mut session) = self.session.take() else {
            return;
        };
        match session.rest().await {
            Ok(()) => session.retire(),
            Err(Failure::Session(e) | Failure::Request(e)) => {
                tracing::debug!(backend = self.backend, session = self.carrier.id, error = %e, "an idle holder connection could not be reset; closed");
            }
        }
    }

    fn session(&mut self) -> &mut S {
        self.session
            .as_mut()
            .expect("the session is present while the task runs")
    }

    async fn give(&mut self, give: Give<S::Lock>) -> Result<(), String> {
        let afterwards = if self.held > 1 {
            Afterwards::Holding
        } else if self.claim_linger() {
            Afterwards::Lingering
        } else {
            Afterwards::Retiring
        };
        let sent_at = Instant::now();
        let (until, backend) = (self.safe_until(), self.backend);
        let unlock = self.session().unlock(&give.lock, afterwards);
        let outcome = within(until, backend, "release", unlock).await;
        let (answer, result) = self.answered(outcome, sent_at);
        if let Ok(true) = answer {
            self.held = self.held.saturating_sub(1);
        }
        if let Some(reply) = give.reply {
            let _ = reply.send(answer);
        }
        result
    }

    /// What a give's or a call's caller is told, and whether the session lives on. A failed
    /// session is marked dead before its caller hears of it, so that the caller finds its
    /// holds lost from then on.
    fn answered<T>(
        &mut self,
        outcome: Result<T, Failure>,
        sent_at: Instant,
    ) -> (crate::Result<T>, Result<(), String>) {
        match outcome {
            Ok(answer) => {
                // Answered, so the server's idle clock restarted after this.
                self.alive_as_of = self.alive_as_of.max(sent_at);
                (Ok(answer), Ok(()))
            }
            // The server answered (with an error): as alive as an answer proves.
            Err(Failure::Request(e)) => {
                self.alive_as_of = self.alive_as_of.max(sent_at);
                (Err(e), Ok(()))
            }
            // The session, and with it the lock, is gone.
            Err(Failure::Session(e)) => {
                let reason = e.to_string();
                self.carrier.dead.send_replace(Some(reason.clone()));
                (Err(self.not_held(&reason)), Err(reason))
            }
        }
    }

    /// A backend's request on the session (see [`Caller`](super::Caller)), only while it
    /// holds a lock: a session that holds nothing (lingering for takes, or its lock given
    /// back) has nothing to be asked about.
    async fn call(
        &mut self,
        lock: &S::Lock,
        call: S::Call,
        reply: oneshot::Sender<crate::Result<S::Answer>>,
    ) -> Result<(), String> {
        if self.held == 0 {
            let _ = reply.send(Err(self.not_held("the holder connection holds nothing")));
            return Ok(());
        }
        let sent_at = Instant::now();
        let (until, backend, op) = (self.safe_until(), self.backend, S::call_op(&call));
        let outcome = within(until, backend, op, self.session().call(lock, call)).await;
        let (answer, result) = self.answered(outcome, sent_at);
        let _ = reply.send(answer);
        result
    }

    async fn request(&mut self, request: Request<S::Lock>) -> Result<(), String> {
        {
            let Request::Take { lock, reply } = request;
            {
                let idle = self.idle;
                let sent_at = Instant::now();
                let (until, backend) = (self.safe_until(), self.backend);
                let take = self.session().try_lock(&lock, idle);
                let outcome = within(until, backend, "acquire", take).await;
                let (answer, result) = match outcome {
                    Ok(token) => {
                        // Answered, so the server's idle clock restarted after this.
                        self.alive_as_of = self.alive_as_of.max(sent_at);
                        if token.is_some() {
                            self.held += 1;
                            // Another carrier of the group may linger now.
                            self.carrier.lingering.store(false, Ordering::SeqCst);
                        }
                        (Ok(token), Ok(()))
                    }
                    Err(Failure::Request(e)) => {
                        self.alive_as_of = self.alive_as_of.max(sent_at);
                        (Err(e), Ok(()))
                    }
                    Err(Failure::Session(e)) => {
                        let reason = e.to_string();
                        (Err(e), Err(reason))
                    }
                };
                // Counted down before the answer, so the caller's next request sees it.
                self.carrier.in_flight.fetch_sub(1, Ordering::SeqCst);
                if let Err(Ok(Some(_))) = reply.send(answer) {
                    // The caller gave up while its take ran: nobody will release it.
                    result?;
                    return self.give(Give { lock, reply: None }).await;
                }
                result
            }
        }
    }

    /// The instant by which a shared carrier that holds anything must hear from its session:
    /// the holds are kept alive by this task alone, so an answer later than the server's
    /// idle timeout, less the watchdog's margin, is a loss. Every request is bounded by it,
    /// not only the keeps: one that hangs (a connection cut off) would otherwise keep the
    /// task from noticing while the server ends the session and hands its locks on.
    fn safe_until(&self) -> Option<Instant> {
        (self.carrier.shared && self.held > 0).then(|| {
            self.alive_as_of
                + self
                    .idle
                    .saturating_sub(crate::raw::watchdog::safety_margin(self.idle))
        })
    }

    /// When a shared carrier that holds anything keeps its session alive next: a third of
    /// the idle timeout after the last answered request was sent.
    fn renewal_due(&self) -> Option<Instant> {
        (self.carrier.shared && self.held > 0).then(|| self.alive_as_of + self.idle / 3)
    }

    /// One keep for every renewal waiting: each began before it was sent.
    async fn keep(&mut self) -> Result<(), String> {
        self.keep_due = None;
        // Cleared first: a renewal that sets it again from here on waits for the next keep.
        self.carrier.keep_wanted.store(false, Ordering::SeqCst);
        let asked = guard(&self.carrier.wanted_idle).take();
        // A shared session keeps the largest idle timeout asked of it; a hold of its own
        // follows its ttl. A session that holds nothing (the hold asking was released
        // meanwhile) keeps its timeout as it is: it is reset, or left, with its last hold.
        let wanted = asked
            .filter(|_| self.held > 0)
            .map(|ttl| {
                if self.registry.is_some() {
                    ttl.max(self.idle)
                } else {
                    ttl
                }
            })
            .filter(|idle| *idle != self.idle);
        let sent_at = Instant::now();
        self.last_keep = Some(sent_at);
        let (until, backend) = (self.safe_until(), self.backend);
        let answer = within(until, backend, "keep", self.session().keep(wanted)).await;
        match answer {
            Ok(()) => {
                self.alive_as_of = sent_at;
                if let Some(idle) = wanted {
                    self.idle = idle;
                }
                self.carrier.kept.send_replace(Some(sent_at));
                Ok(())
            }
            Err(Failure::Session(e) | Failure::Request(e)) => Err(e.to_string()),
        }
    }

    fn not_held(&self, reason: &str) -> LockError {
        LockError::not_held(
            self.backend,
            "",
            LostReason::SessionEnded(reason.to_owned()),
        )
    }

    /// Whether this carrier, about to hold nothing, may wait for more takes: it lingers
    /// already, or no other carrier of its group does.
    fn claim_linger(&self) -> bool {
        let (Some(_), Some((registry, group))) = (self.linger, &self.registry) else {
            return false;
        };
        if *self.closing.borrow() {
            return false;
        }
        let groups = guard(registry);
        let others = groups.get(group).into_iter().flatten();
        let taken = others
            .filter(|c| !Arc::ptr_eq(c, &self.carrier))
            .any(|c| c.lingering.load(Ordering::SeqCst));
        if !taken {
            self.carrier.lingering.store(true, Ordering::SeqCst);
        }
        !taken
    }

    /// Leave the registry if nothing more can be routed here. A carrier of its own hold
    /// always may.
    fn unregister(&self) -> bool {
        let Some((registry, group)) = &self.registry else {
            return true;
        };
        let mut groups = guard(registry);
        if self.carrier.in_flight.load(Ordering::SeqCst) > 0 {
            return false;
        }
        if let Some(list) = groups.get_mut(group) {
            list.retain(|c| !Arc::ptr_eq(c, &self.carrier));
            if list.is_empty() {
                groups.remove(group);
            }
        }
        true
    }

    /// The session failed: close it (the server frees its locks), fire `lost()` on the
    /// holds it carried, and answer whatever is queued.
    fn die(
        &mut self,
        reason: String,
        requests: &mut mpsc::UnboundedReceiver<Request<S::Lock>>,
        orders: &mut mpsc::UnboundedReceiver<Order<S>>,
    ) {
        if self.held > 0 {
            tracing::warn!(backend = self.backend, session = self.carrier.id, held = self.held, %reason, "holder connection lost");
        } else {
            tracing::debug!(backend = self.backend, session = self.carrier.id, %reason, "idle holder connection lost");
        }
        self.session = None;
        self.carrier.dead.send_replace(Some(reason.clone()));
        if let Some((registry, group)) = &self.registry
            && let Some(list) = guard(registry).get_mut(group)
        {
            list.retain(|c| !Arc::ptr_eq(c, &self.carrier));
        }
        requests.close();
        orders.close();
        // A take's caller retries elsewhere when its reply is dropped.
        while requests.try_recv().is_ok() {}
        while let Ok(order) = orders.try_recv() {
            match order {
                Order::Give(Give {
                    reply: Some(reply), ..
                }) => {
                    let _ = reply.send(Err(self.not_held(&reason)));
                }
                Order::Give(_) => {}
                Order::Call { reply, .. } => {
                    let _ = reply.send(Err(self.not_held(&reason)));
                }
            }
        }
    }
}

/// `request`, bounded by `until` (see [`Task::safe_until`]): an answer too late fails the
/// session.
async fn within<T>(
    until: Option<Instant>,
    backend: &'static str,
    op: &'static str,
    request: impl Future<Output = Result<T, Failure>>,
) -> Result<T, Failure> {
    let Some(until) = until else {
        return request.await;
    };
    tokio::time::timeout_at(until, request)
        .await
        .unwrap_or_else(|_| {
            Err(Failure::Session(LockError::unavailable(
                backend,
                op,
                "the holder connection did not answer before its idle timeout could end it",
            )))
        })
}

/// Resolves once [`Carriers::close_idle`](super::Carriers::close_idle) was called (or the
/// carriers were dropped).
async fn client_gone(closing: &mut watch::Receiver<bool>) {
    let _ = closing.wait_for(|closing| *closing).await;
}

async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => sleep_until(at).await,
        None => std::future::pending().await,
    }
}
