//! Server sessions that carry many holds at once: the SQL backends' holder connections.
//!
//! A PostgreSQL session can hold any number of advisory locks, a MySQL / MariaDB session any
//! number of named locks (`GET_LOCK`). Holding one connection per key would bound a client
//! by its connection limit; a [`Carriers`] set instead runs each holder connection in a task
//! of its own (a *carrier*) that takes, keeps and releases the locks of many holds:
//!
//! - **Take**: a try-once lock request ([`Session::try_lock`]) runs on a carrier of the
//!   hold's group (auto-renewed holds of one ttl share carriers; a hold that must end after
//!   its ttl gets a carrier of its own, which nobody pings). A waiting lock request is the
//!   backend's, on a connection of its own; the connection that was granted becomes a
//!   carrier of the group ([`Carriers::adopt`]).
//! - **Keep**: a shared carrier that holds anything sends one [`Session::keep`] a third of
//!   the ttl after the last one was sent, whatever number of holds it carries, and gives the
//!   session up (firing `lost()` on its holds) if it, or any request it runs meanwhile (a
//!   take, a release, a call stuck behind a cut-off connection), is not answered by a
//!   safety margin before the server's idle timeout could end the session; its holds are granted
//!   [kept alive](crate::raw::Grant::kept_alive), so the watchdog keeps no timer for them.
//!   A manual extend (and each renewal of a hold on a carrier of its own) asks for one keep
//!   sent after it started; requests within a short gap (a thirtieth of the ttl, at most
//!   1 s) share one.
//! - **Release** ([`Session::unlock`]) goes ahead of every queued take and keep; a carrier
//!   only ever runs short requests, so a release never waits behind a lock wait.
//! - **Calls** ([`Caller`]): a backend's own request about a hold ([`Session::call`], e.g.
//!   PostgreSQL's count change of a reentrant hold) runs on the session that holds it,
//!   ahead of queued takes as a release, while the session holds anything.
//! - **Loss**: any failure of the session (a lost connection, a request that timed out)
//!   ends the carrier; the holds it carried, and only those, see `lost()` fire, and their
//!   extends and releases answer `NotHeld`.
//! - A carrier that holds nothing and has nothing queued gives its session back
//!   ([`Session::retire`]) and ends; with [`Carriers::linger`], one shared carrier per
//!   group first waits a moment for more takes, its idle timeout kept, and resets it
//!   ([`Session::rest`]) only then: a client that takes and releases keys back to back
//!   reuses one carrier, and need not set its session's timeouts on every take and
//!   release. A lingering carrier holds nothing, so a take that finds its session dead
//!   may reconnect ([`Session::lingering`]) instead of ending it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

use crate::raw::Grant;
use crate::{LockError, LostReason, Result};

pub use held::Caller;
use held::Carried;
use task::Task;

mod held;
mod task;

/// The longest a [`linger`](Carriers::linger) carrier holding nothing waits for a take.
pub const LINGER_CAP: Duration = Duration::from_secs(1);

/// Why a session request failed.
#[derive(Debug)]
pub enum Failure {
    /// The session is gone or cannot be trusted (connection lost, request unanswered): so
    /// is every lock it held.
    Session(LockError),
    /// This request failed; the session and its locks are fine.
    Request(LockError),
}

/// What a session holds after an [`unlock`](Session::unlock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Afterwards {
    /// Other locks still.
    Holding,
    /// Nothing, and it stays open a moment for more takes with its idle timeout as it is
    /// (a [`Carriers::linger`] carrier): [`Session::rest`] resets the timeout before it
    /// retires.
    Lingering,
    /// Nothing, and it retires next: reset its idle timeout so it can be pooled.
    Retiring,
}

/// One server session that can hold many locks, driven by one carrier task.
///
/// Each method is bounded by the backend's response timeout: a request that does not
/// answer in time is a [`Failure::Session`]. A carrier that holds anything may also stop
/// waiting for a request part-way (the server's idle timeout could end the session before
/// an answer comes): the session is then dropped, never used again.
#[async_trait]
pub trait Session: Send + 'static {
    /// What names a lock on the server.
    type Lock: Clone + Send + Sync + fmt::Debug + 'static;

    /// Take `lock` without waiting and, when granted, its fencing token, and make the
    /// server end the session when it stays silent for `idle`. `None`: held elsewhere.
    async fn try_lock(&mut self, lock: &Self::Lock, idle: Duration)
    -> Result<Option<u64>, Failure>;

    /// Give `lock` back: `false` when the session did not hold it. `afterwards` says what
    /// the session holds then, and whether it retires at once.
    async fn unlock(&mut self, lock: &Self::Lock, afterwards: Afterwards) -> Result<bool, Failure>;

    /// The session holds nothing and waits for more takes ([`Carriers::linger`]). It may
    /// die meanwhile (a server restart, an administrator): that loses no hold, so its next
    /// take may reconnect instead of failing.
    fn lingering(&mut self);

    /// The session, holding nothing, stayed open for more takes
    /// ([`Afterwards::Lingering`]) and none came: reset its idle timeout so it can be
    /// pooled. [`retire`](Self::retire) follows when this succeeds; on an error the
    /// session is dropped instead (it holds nothing).
    async fn rest(&mut self) -> Result<(), Failure>;

    /// Prove the session is alive, restarting its idle clock; with `Some(idle)`, set the
    /// idle timeout to that first.
    async fn keep(&mut self, idle: Option<Duration>) -> Result<(), Failure>;

    /// The session's id on the server, for logs.
    fn id(&self) -> u64;

    /// The session holds nothing and has its default idle timeout: pool it.
    fn retire(self);

    /// A backend's own request about a hold on this session ([`Caller::call`]); a backend
    /// that sends none uses [`std::convert::Infallible`].
    type Call: Send + 'static;
    /// What a [`Call`](Self::Call) answers.
    type Answer: Send + 'static;

    /// Run `call`, a request about the hold of `lock`. The carrier sends it only while the
    /// session holds some lock, between its other requests and ahead of queued takes (as a
    /// release); but the hold it is about may have been given back already, so the request
    /// must check on the server what it relies on. Errors as the other requests: a
    /// [`Failure::Session`] ends the carrier and every hold it carries.
    async fn call(&mut self, lock: &Self::Lock, call: Self::Call) -> Result<Self::Answer, Failure>;

    /// The operation `call` is part of, as errors name it (a call the session did not
    /// answer in time fails with it); by default `call`.
    fn call_op(_call: &Self::Call) -> &'static str {
        "call"
    }
}

/// Which carriers a hold may share: auto-renewed holds of one ttl share; a hold that must
/// end after its ttl gets a carrier of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Group {
    idle: Duration,
}

enum Request<L> {
    Take {
        lock: L,
        reply: oneshot::Sender<Result<Option<u64>>>,
    },
}

struct Give<L> {
    lock: L,
    reply: Option<oneshot::Sender<Result<bool>>>,
}

/// What goes to a carrier ahead of its takes: a release, or a [`Caller::call`].
enum Order<S: Session> {
    Give(Give<S::Lock>),
    Call {
        lock: S::Lock,
        call: S::Call,
        reply: oneshot::Sender<Result<S::Answer>>,
    },
}

/// The handle on one carrier task.
struct Carrier<S: Session> {
    id: u64,
    /// The ttl of the group: the holds' ttl when taken.
    ttl: Duration,
    /// Carries auto-renewed holds: the task keeps the session alive on its own schedule
    /// and the holds are granted kept alive.
    shared: bool,
    requests: mpsc::UnboundedSender<Request<S::Lock>>,
    orders: mpsc::UnboundedSender<Order<S>>,
    /// Requests sent and not answered yet; only changed under the registry's lock when
    /// routing, so a carrier that sees 0 there knows nothing more is coming.
    in_flight: AtomicUsize,
    /// Set (once) to why the session ended.
    dead: watch::Sender<Option<String>>,
    /// Holds nothing and waits for a take ([`Carriers::linger`]); at most one carrier of a
    /// group at a time, changed under the registry's lock.
    lingering: AtomicBool,
    /// When the last successful keep was sent: a renewal that began before it is done.
    kept: watch::Sender<Option<Instant>>,
    /// A renewal is waiting for the next keep; set by the first one, cleared when the keep
    /// is sent, so one wake-up of the carrier serves every renewal of a gap.
    keep_wanted: AtomicBool,
    keep_asked: Notify,
    /// A longer idle timeout a renewal asked for (a manual extend with another ttl).
    wanted_idle: Mutex<Option<Duration>>,
}

type Registry<S> = Mutex<HashMap<Group, Vec<Arc<Carrier<S>>>>>;

/// A lock a session was granted after a wait, for [`Carriers::adopt`].
#[derive(Debug)]
pub struct Granted<'a, L> {
    /// The key, for errors.
    pub key: &'a str,
    /// The lock the session holds.
    pub lock: L,
    /// Its fencing token.
    pub token: u64,
    /// The hold's ttl.
    pub ttl: Duration,
    /// Auto-renewed: it may share its carrier with later holds.
    pub shared: bool,
    /// When the request that was granted was sent.
    pub sent_at: Instant,
}

/// The carriers of one client.
pub struct Carriers<S: Session> {
    backend: &'static str,
    groups: Arc<Registry<S>>,
    /// Held while a shared carrier is being opened, so that a burst of first takes opens
    /// one connection, not one each.
    opening: tokio::sync::Mutex<()>,
    /// A take that finds every carrier of its group busy opens another while the group has
    /// fewer than this many (see [`open_while_busy`](Self::open_while_busy)).
    busy_limit: usize,
    /// Shared carriers that hold nothing wait a moment for more takes (see
    /// [`linger`](Self::linger)).
    linger: bool,
    /// Set by [`close_idle`](Self::close_idle): no carrier lingers from then on.
    closing: watch::Sender<bool>,
}

impl<S: Session> fmt::Debug for Carriers<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Carriers")
            .field("backend", &self.backend)
            .field("carriers", &self.count())
            .finish()
    }
}

impl<S: Session> Carriers<S> {
    /// An empty set for `backend` (its name in errors and logs).
    pub fn new(backend: &'static str) -> Self {
        Self {
            backend,
            groups: Arc::default(),
            opening: tokio::sync::Mutex::new(()),
            busy_limit: 1,
            linger: false,
            closing: watch::Sender::new(false),
        }
    }

    /// Let a take that finds every carrier of its group busy (a take in flight) open
    /// another, until the group has `limit` carriers; past it takes queue on the least busy
    /// one. The default, 1, queues every take of a group on one session. More lets
    /// concurrent takes run in parallel, at the cost of up to `limit` connections per group
    /// (a carrier retires as soon as it holds nothing, or with [`linger`](Self::linger) a
    /// moment later).
    #[must_use]
    pub fn open_while_busy(mut self, limit: usize) -> Self {
        self.busy_limit = limit.max(1);
        self
    }

    /// Let a shared carrier that holds nothing wait a moment for more takes before it gives
    /// its session back: a tenth of its ttl, at most [`LINGER_CAP`], from its last request;
    /// one carrier per group at a time (the others retire at once, as without this), so a
    /// client keeps at most one idle connection per ttl out of its pool.
    /// A client that takes and releases keys back to back then keeps one session, whose
    /// idle timeout is set once (the session's [`unlock`](Session::unlock) is told
    /// [`Afterwards::Lingering`], and [`rest`](Session::rest) resets the timeout when no take
    /// came), instead of a carrier opened, its timeout set and reset, and closed per hold.
    /// The session's idle timeout is its ttl, so it cannot end the session meanwhile unless
    /// the client stalls for nine tenths of it; the session must then reconnect at its next
    /// take (it holds nothing). Off by default.
    #[must_use]
    pub fn linger(mut self) -> Self {
        self.linger = true;
        self
    }

    /// The client is gone: every carrier that lingers gives its session up now (closing
    /// it: it holds nothing), and none lingers from then on, so a dropped client leaves no
    /// connection open behind it for the linger. Carriers that hold anything go on until
    /// their holds are released or lost.
    pub fn close_idle(&self) {
        self.closing.send_replace(true);
    }

    /// How many shared carriers are running.
    pub fn count(&self) -> usize {
        guard(&self.groups).values().map(Vec::len).sum()
    }

    /// Take `lock` for `key` without waiting, on a carrier of the hold's group: a running
    /// one, or one on a session `open` makes. `Ok(None)`: held elsewhere. `shared` is the
    /// caller's `auto_renew`: a hold that is not renewed gets a carrier of its own (whose
    /// session the server ends ttl after its last request).
    ///
    /// # Errors
    /// `open`'s error (the connection limit, an unreachable server), or the request's.
    pub async fn try_take<F, Fut>(
        &self,
        key: &str,
        lock: S::Lock,
        ttl: Duration,
        shared: bool,
        open: F,
    ) -> Result<Option<Grant>>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<S>>,
    {
        let group = Group { idle: ttl };
        // A carrier may retire or die between routing and its answer: try another.
        for _ in 0..3 {
            let carrier = match shared.then(|| self.route(group)).flatten() {
                Some(carrier) => carrier,
                None => {
                    let opening = if shared {
                        let opening = self.opening.lock().await;
                        // Another take may have opened one meanwhile.
                        if let Some(carrier) = self.route(group) {
                            drop(opening);
                            return self.take_on(key, lock, carrier).await;
                        }
                        Some(opening)
                    } else {
                        None
                    };
                    // The server's idle clock restarts no earlier than this.
                    let opened_at = Instant::now();
                    let session = open().await?;
                    let carrier = self.spawn(session, group, shared, 0, opened_at);
                    carrier.in_flight.fetch_add(1, Ordering::SeqCst);
                    if shared {
                        guard(&self.groups)
                            .entry(group)
                            .or_default()
                            .push(carrier.clone());
                    }
                    drop(opening);
                    carrier
                }
            };
            if let Some(answer) = self.send_take(key, lock.clone(), carrier).await {
                return answer;
            }
        }
        Err(LockError::unavailable(
            self.backend,
            "acquire",
            "holder connections kept ending under the request",
        ))
    }

    /// [`send_take`](Self::send_take), retried once on a carrier that ended under it.
    async fn take_on(
        &self,
        key: &str,
        lock: S::Lock,
        carrier: Arc<Carrier<S>>,
    ) -> Result<Option<Grant>> {
        match self.send_take(key, lock, carrier).await {
            Some(answer) => answer,
            None => Err(LockError::unavailable(
                self.backend,
                "acquire",
                "the holder connection ended under the request",
            )),
        }
    }

    /// Ask `carrier` (already counted as having the request in flight) to take `lock`;
    /// `None` when it ended before answering.
    async fn send_take(
        &self,
        key: &str,
        lock: S::Lock,
        carrier: Arc<Carrier<S>>,
    ) -> Option<Result<Option<Grant>>> {
        let sent_at = Instant::now();
        let (reply, answer) = oneshot::channel();
        let request = Request::Take {
            lock: lock.clone(),
            reply,
        };
        if carrier.requests.send(request).is_err() {
            carrier.in_flight.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        match answer.await {
            Ok(Ok(Some(token))) => Some(Ok(Some(self.grant(key, lock, carrier, token, sent_at)))),
            Ok(Ok(None)) => Some(Ok(None)),
            Ok(Err(e)) => Some(Err(e)),
            Err(_) => None,
        }
    }

    /// A session that was granted a lock after a wait becomes a carrier: of the group
    /// when the hold is shared, else of this hold alone.
    pub fn adopt(&self, session: S, granted: Granted<'_, S::Lock>) -> Grant {
        let group = Group { idle: granted.ttl };
        let carrier = self.spawn(session, group, granted.shared, 1, granted.sent_at);
        if granted.shared {
            guard(&self.groups)
                .entry(group)
                .or_default()
                .push(carrier.clone());
        }
        self.grant(
            granted.key,
            granted.lock,
            carrier,
            granted.token,
            granted.sent_at,
        )
    }

    /// The group's least busy carrier, counted as having one more request in flight; `None`
    /// when there is none, or when it is busy and the group may open another.
    fn route(&self, group: Group) -> Option<Arc<Carrier<S>>> {
        let groups = guard(&self.groups);
        let carriers = groups.get(&group)?;
        let carrier = carriers
            .iter()
            .filter(|c| c.dead.borrow().is_none())
            .min_by_key(|c| c.in_flight.load(Ordering::SeqCst))?
            .clone();
        if carrier.in_flight.load(Ordering::SeqCst) > 0 && carriers.len() < self.busy_limit {
            return None;
        }
        carrier.in_flight.fetch_add(1, Ordering::SeqCst);
        Some(carrier)
    }

    fn spawn(
        &self,
        session: S,
        group: Group,
        shared: bool,
        held: usize,
        sent_at: Instant,
    ) -> Arc<Carrier<S>> {
        let (requests, requests_rx) = mpsc::unbounded_channel();
        let (orders, orders_rx) = mpsc::unbounded_channel();
        let carrier = Arc::new(Carrier {
            id: session.id(),
            ttl: group.idle,
            shared,
            requests,
            orders,
            in_flight: AtomicUsize::new(0),
            dead: watch::Sender::new(None),
            lingering: AtomicBool::new(false),
            kept: watch::Sender::new(None),
            keep_wanted: AtomicBool::new(false),
            keep_asked: Notify::new(),
            wanted_idle: Mutex::new(None),
        });
        let task = Task {
            backend: self.backend,
            linger: (shared && self.linger).then(|| (group.idle / 10).min(LINGER_CAP)),
            rest_at: None,
            closing: self.closing.subscribe(),
            session: Some(session),
            carrier: carrier.clone(),
            registry: shared.then(|| (self.groups.clone(), group)),
            idle: group.idle,
            held,
            keep_due: None,
            last_keep: None,
            alive_as_of: sent_at,
            gap: if shared {
                (group.idle / 30).min(Duration::from_secs(1))
            } else {
                Duration::ZERO
            },
        };
        tokio::spawn(task.run(requests_rx, orders_rx));
        carrier
    }

    fn grant(
        &self,
        key: &str,
        lock: S::Lock,
        carrier: Arc<Carrier<S>>,
        token: u64,
        sent_at: Instant,
    ) -> Grant {
        let shared = carrier.shared;
        let mut dead = carrier.dead.subscribe();
        let lost = async move {
            let reason = match dead.wait_for(Option::is_some).await {
                Ok(reason) => reason.clone().unwrap_or_default(),
                Err(_) => "the holder connection's task ended".to_owned(),
            };
            LostReason::SessionEnded(reason)
        };
        let held = Carried {
            backend: self.backend,
            key: key.to_owned(),
            lock,
            ttl: carrier.ttl,
            carrier,
            released: false,
        };
        let grant = Grant::new(token, Box::new(held), sent_at).with_lost(lost.boxed());
        // A shared carrier keeps its session alive itself (a keep every ttl/3, the session
        // given up before its idle timeout could end it): no renewal timer per hold.
        if shared { grant.kept_alive() } else { grant }
    }
}

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
