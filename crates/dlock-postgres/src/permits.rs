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

use dlock_core::Result;
use dlock_core::raw::Grant;
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use tokio::sync::{Notify, oneshot, watch};
use tokio::time::{sleep, timeout};

use crate::acquire::Attempt;
use crate::backend::Inner;
use crate::sql::Advisory;

/// How long a permit waiter waits without a notification before it tries again: the
/// bound on noticing a slot freed by a session that ended (a crashed holder sends no
/// notification), or one released while the listener was reconnecting.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

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
        let mut ready = {
            let mut listener = lock(&self.listener);
            match &*listener {
                Some(running) => running.ready.clone(),
                None => {
                    let Ok(options) = inner.config.connect_options() else {
                        return;
                    };
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
                    ready
                }
            }
        };
        let _ = timeout(RECHECK, ready.wait_for(|listens| *listens)).await;
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
    loop {
        let run = listen_once(&registry, &pool, &channel, &ready, response_timeout);
        let error = tokio::select! {
            _ = &mut stop => return,
            error = run => error,
        };
        ready.send_replace(false);
        tracing::debug!(%error, %channel, "a listener failed; listening again shortly");
        tokio::select! {
            _ = &mut stop => return,
            () = sleep(RECHECK) => {}
        }
    }
}

/// Listen until the connection fails: the error.
async fn listen_once(
    registry: &Registry,
    pool: &sqlx::PgPool,
    channel: &str,
    ready: &watch::Sender<bool>,
    response_timeout: Duration,
) -> sqlx::Error {
    let mut listener = match PgListener::connect_with(pool).await {
        Ok(listener) => listener,
        Err(e) => return e,
    };
    match timeout(response_timeout, listener.listen(channel)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return e,
        Err(_) => return sqlx::Error::PoolTimedOut,
    }
    ready.send_replace(true);
    // Releases while nothing listened went unheard: every waiter tries again.
    registry.wake_all();
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => match notification.payload().parse() {
                Ok(id) => registry.wake(id),
                Err(_) => tracing::debug!(
                    payload = notification.payload(),
                    "a permit notification that names no key id"
                ),
            },
            // The connection was lost and made again (listening again): releases in
            // between went unheard.
            Ok(None) => registry.wake_all(),
            Err(e) => return e,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
