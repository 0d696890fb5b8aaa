//! Waiting for a permit: the waiter holds nothing on the server while it waits. Each
//! release of a permit notifies the namespace's channel (`pg_notify`, the key's id as
//! payload); one listener connection per client (`LISTEN`, opened at the client's first
//! permit wait) wakes the client's waiters of that key, and each tries the slots again on a
//! holder connection, like the first try. A session that ends (a crash) frees its slots
//! without a notification, so a waiter also tries again after [`RECHECK`] without one.
//!
//! Why not wait in the server's lock queue, as exclusive and shared holds do: a waiting
//! `pg_advisory_lock` waits for one lock, and a permit is any of N slots; a waiter queued
//! on one slot would miss the others freeing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::raw::Grant;
use dlock_core::{LockError, Result};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::{sleep, timeout};

use crate::NAME;
use crate::acquire::Attempt;
use crate::backend::Inner;
use crate::sql::Advisory;

/// How long a permit waiter waits without a notification before it tries again: the
/// bound on noticing a slot freed by a session that ended (a crashed holder sends no
/// notification), or one released while the listener was reconnecting.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// How long a listener waits before it connects again after a failure: longer than
/// [`RECHECK`], so that a lost connection ends the election observers' streams (their
/// re-reads do not make up for a listener down longer than that; they follow again) rather
/// than racing their deadline.
const RETRY: Duration = Duration::from_secs(2);

/// The waiters of one client woken by one channel (the permit waiters; the election
/// observers), by key id, and the listener that wakes them.
pub(crate) struct PermitWaits {
    /// The channel to listen on.
    channel: String,
    registry: Arc<Registry>,
    /// The running listener: whether it listens, and the end of its task when dropped.
    listener: Mutex<Option<Listener>>,
}

struct Listener {
    ready: watch::Receiver<bool>,
    _stop: oneshot::Sender<()>,
}

/// The waiters of one key: each one's number and its wake-up.
type KeyWaiters = Vec<(u64, Arc<Notify>)>;

#[derive(Default)]
struct Registry {
    /// Key id → its waiters.
    waiters: Mutex<HashMap<i32, KeyWaiters>>,
    next: AtomicU64,
}

impl Registry {
    /// Wake every waiter of `id`. Each has a `Notify` of its own, which keeps the wake-up
    /// for a waiter that is busy trying: no release goes unheard.
    fn wake(&self, id: i32) {
        let waiters = lock(&self.waiters);
        for (_, notify) in waiters.get(&id).into_iter().flatten() {
            notify.notify_one();
        }
    }

    /// Wake every waiter: releases may have gone unheard.
    fn wake_all(&self) {
        let waiters = lock(&self.waiters);
        for (_, notify) in waiters.values().flatten() {
            notify.notify_one();
        }
    }
}

/// One waiter's place in the registry, removed when dropped.
pub(crate) struct Registration {
    registry: Arc<Registry>,
    id: i32,
    number: u64,
    notify: Arc<Notify>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut waiters = lock(&self.registry.waiters);
        if let Some(list) = waiters.get_mut(&self.id) {
            list.retain(|(n, _)| *n != self.number);
            if list.is_empty() {
                waiters.remove(&self.id);
            }
        }
    }
}

impl Registration {
    /// Resolves at the next wake-up of this waiter (kept if it came meanwhile).
    pub(crate) async fn notified(&self) {
        self.notify.notified().await;
    }
}

impl PermitWaits {
    /// The waiters woken by notifications on `channel`.
    pub(crate) fn new(channel: String) -> Self {
        Self {
            channel,
            registry: Arc::default(),
            listener: Mutex::new(None),
        }
    }

    pub(crate) fn register(&self, id: i32) -> Registration {
        let number = self.registry.next.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        lock(&self.registry.waiters)
            .entry(id)
            .or_default()
            .push((number, notify.clone()));
        Registration {
            registry: self.registry.clone(),
            id,
            number,
            notify,
        }
    }

    /// Start the listener unless it runs, and wait until it listens, at most [`RECHECK`]
    /// (past it, waiters rely on trying again every [`RECHECK`]).
    pub(crate) async fn listening(&self, inner: &Inner) {
        if let Ok(mut ready) = self.start(inner) {
            let _ = timeout(RECHECK, ready.wait_for(|listens| *listens)).await;
        }
    }

    /// Start the listener unless it runs, and wait until the server has confirmed its
    /// `LISTEN` (and delivered the listener's own check notification), at most the connect
    /// timeout plus the response timeout: the listener's state (`true` while it listens),
    /// to follow. [`LockError::Unavailable`] naming the listener past the bound.
    pub(crate) async fn listens(
        &self,
        inner: &Inner,
        op: &'static str,
    ) -> Result<watch::Receiver<bool>> {
        let mut ready = self.start(inner)?;
        let bound = inner.config.connect_timeout + inner.config.response_timeout;
        let listens = timeout(bound, ready.wait_for(|listens| *listens))
            .await
            .map(|listens| listens.is_ok());
        match listens {
            Ok(true) => Ok(ready),
            Ok(false) => Err(self.down(op, "has stopped")),
            Err(_) => Err(self.down(op, &format!("is not listening after {bound:?}"))),
        }
    }

    /// The error of a listener that does not listen: `Unavailable`, naming it.
    pub(crate) fn down(&self, op: &'static str, what: &str) -> LockError {
        LockError::unavailable(
            NAME,
            op,
            format!(
                "the listener (LISTEN {}) {what}; server notifications need a session \
                 connection (not a transaction pooler)",
                self.channel
            ),
        )
    }

    /// The running listener's state, started unless it runs.
    fn start(&self, inner: &Inner) -> Result<watch::Receiver<bool>> {
        let mut listener = lock(&self.listener);
        if let Some(running) = &*listener {
            return Ok(running.ready.clone());
        }
        let options = inner.config.connect_options()?;
        let (ready_tx, ready) = watch::channel(false);
        let (stop, stopped) = oneshot::channel();
        let task = listen(
            self.registry.clone(),
            options.disable_statement_logging(),
            (inner.config.connect_timeout, inner.config.response_timeout),
            self.channel.clone(),
            ready_tx,
            stopped,
        );
        tokio::spawn(task);
        *listener = Some(Listener {
            ready: ready.clone(),
            _stop: stop,
        });
        Ok(ready)
    }
}

/// Wait for a permit of `lock` (busy at the first try) until the attempt's deadline; in the
/// caller's task: dropping it leaves nothing on the server (a try in flight is released by
/// its holder connection if nobody takes the grant).
pub(crate) async fn wait(attempt: &Attempt, lock: Advisory) -> Result<Option<Grant>> {
    let inner = attempt.inner();
    let deadline = attempt.deadline();
    // Registered before the listener is asked, and the slots tried again after it
    // listens: a release after this try is heard.
    let registration = inner.permit_waits.register(lock.id);
    if deadline
        .run(inner.permit_waits.listening(inner))
        .await
        .is_none()
    {
        return Ok(None);
    }
    loop {
        match attempt.take_now(lock.clone()).await {
            None => return Ok(None),
            Some(Ok(Some(grant))) => {
                inner.wakeups.fetch_add(1, Ordering::Relaxed);
                // The first try found every slot busy: this grant is a hand-off.
                return Ok(Some(grant.after_wait()));
            }
            Some(Ok(None)) if !deadline.may_wait() => return Ok(None),
            Some(Ok(None)) => {}
            Some(Err(e)) => return Err(e),
        }
        let woken = timeout(RECHECK, registration.notify.notified());
        if deadline.run(woken).await.is_none() {
            return Ok(None);
        }
        tracing::trace!(key = attempt.key(), "permit waiter tries again");
    }
}

/// The listener task: listen on `channel`, wake the waiters of each key a notification
/// names, reconnect after a failure, end when `stop`'s sender is dropped (the client is).
async fn listen(
    registry: Arc<Registry>,
    options: PgConnectOptions,
    (connect_timeout, response_timeout): (Duration, Duration),
    channel: String,
    ready: watch::Sender<bool>,
    mut stop: oneshot::Receiver<()>,
) {
    // sqlx's listener takes its connection from a pool, and reconnects through it.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .acquire_timeout(connect_timeout)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(options);
    let mut first = true;
    loop {
        let run = listen_once(&registry, &pool, &channel, &ready, response_timeout, first);
        let error = tokio::select! {
            _ = &mut stop => return,
            error = run => error,
        };
        ready.send_replace(false);
        first = false;
        tracing::debug!(%error, %channel, "a listener failed; listening again shortly");
        tokio::select! {
            _ = &mut stop => return,
            () = sleep(RETRY) => {}
        }
    }
}

/// The payload prefix of a listener's check of its own `LISTEN`, ignored by every listener.
const CHECK: &str = "listen-check:";

/// Listen until the connection fails or is lost: the error. Listening means the server
/// confirmed the `LISTEN` and delivered the listener's own check notification (which a
/// transaction pooler, for one, does not).
async fn listen_once(
    registry: &Registry,
    pool: &sqlx::PgPool,
    channel: &str,
    ready: &watch::Sender<bool>,
    response_timeout: Duration,
    first: bool,
) -> sqlx::Error {
    let mut listener = match PgListener::connect_with(pool).await {
        Ok(listener) => listener,
        Err(e) => return e,
    };
    // A lost connection is a failure (observers count how long nothing listens), not a
    // silent reconnect inside `try_recv`.
    listener.eager_reconnect(false);
    let confirmed = async {
        listener.listen(channel).await?;
        // Unique on the server: the listener's own session's pid.
        let check: String = sqlx::query_scalar(
            "SELECT $2 || pg_backend_pid()::text FROM (SELECT pg_notify($1, $2 || \
             pg_backend_pid()::text)) n",
        )
        .bind(channel)
        .bind(CHECK)
        .fetch_one(&mut listener)
        .await?;
        loop {
            match listener.try_recv().await? {
                Some(n) if n.payload() == check => return Ok(()),
                Some(n) => wake(registry, n.payload()),
                None => return Err(lost()),
            }
        }
    };
    match timeout(response_timeout, confirmed).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return e,
        Err(_) => return sqlx::Error::PoolTimedOut,
    }
    ready.send_replace(true);
    // After a failure, releases while nothing listened went unheard: every waiter tries
    // again. (The first time, observers have waited for this; permit waiters try again
    // within their re-check.)
    if !first {
        registry.wake_all();
    }
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => wake(registry, notification.payload()),
            Ok(None) => return lost(),
            Err(e) => return e,
        }
    }
}

/// Wake the waiters of the key a notification names.
fn wake(registry: &Registry, payload: &str) {
    match payload.parse() {
        Ok(id) => registry.wake(id),
        Err(_) if payload.starts_with(CHECK) => {}
        Err(_) => tracing::debug!(payload, "a notification that names no key id"),
    }
}

fn lost() -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::UnexpectedEof,
        "the listener's connection was lost",
    ))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
