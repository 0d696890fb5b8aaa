//! A hold on a carrier: what the core's lease keeps as its [`Held`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Carrier, Give, Order, Session, guard};
use crate::raw::Held;
use crate::{LockError, LostReason, Result};

/// A hold on a carrier.
pub(super) struct Carried<S: Session> {
    pub(super) backend: &'static str,
    pub(super) key: String,
    pub(super) lock: S::Lock,
    pub(super) carrier: Arc<Carrier<S>>,
    /// The ttl of the hold's last renewal.
    pub(super) ttl: Duration,
    pub(super) released: bool,
}

impl<S: Session> fmt::Debug for Carried<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Carried")
            .field("key", &self.key)
            .field("lock", &self.lock)
            .field("session", &self.carrier.id)
            .finish()
    }
}

impl<S: Session> Carried<S> {
    fn not_held(&self) -> LockError {
        not_held(self.backend, &self.key, &self.carrier)
    }

    /// Name the key in an error the carrier made without it.
    fn with_key(&self, e: LockError) -> LockError {
        with_key(self.backend, &self.key, e)
    }
}

fn not_held<S: Session>(backend: &'static str, key: &str, carrier: &Carrier<S>) -> LockError {
    let reason = carrier
        .dead
        .borrow()
        .clone()
        .unwrap_or_else(|| "the holder connection's task ended".to_owned());
    LockError::not_held(backend, key, LostReason::SessionEnded(reason))
}

fn with_key(backend: &'static str, key: &str, e: LockError) -> LockError {
    match e {
        LockError::NotHeld { reason, .. } => LockError::not_held(backend, key, reason),
        e => e,
    }
}

/// Sends a backend's own requests ([`Session::call`]) to the carrier of one hold, to run on
/// the session that holds its lock: a request there needs no other proof that the session
/// still holds what it took.
pub struct Caller<S: Session> {
    backend: &'static str,
    key: String,
    lock: S::Lock,
    carrier: Arc<Carrier<S>>,
}

impl<S: Session> fmt::Debug for Caller<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Caller")
            .field("key", &self.key)
            .field("lock", &self.lock)
            .field("session", &self.carrier.id)
            .finish()
    }
}

impl<S: Session> Caller<S> {
    /// The caller of `held`, when it is a hold these carriers granted (the
    /// [`Grant::held`](crate::raw::Grant::held) of [`Carriers::try_take`](super::Carriers::try_take)
    /// or [`Carriers::adopt`](super::Carriers::adopt)); `None` for any other handle.
    pub fn of(held: &dyn Held) -> Option<Self> {
        let carried = held.as_any()?.downcast_ref::<Carried<S>>()?;
        Some(Self {
            backend: carried.backend,
            key: carried.key.clone(),
            lock: carried.lock.clone(),
            carrier: carried.carrier.clone(),
        })
    }

    /// Run `call` on the session that holds the lock, ahead of the carrier's queued takes.
    /// The session may have given the lock back meanwhile (the hold was released): the
    /// call's request must check what it relies on.
    ///
    /// # Errors
    /// [`NotHeld`](LockError::NotHeld) when the call did not run, or may have run but its
    /// answer was lost: the session is gone (its locks with it, and its holds told lost
    /// before this answers), it holds nothing any more, or its carrier retired. The call's
    /// own error otherwise (it failed on the server; the session lives on).
    pub async fn call(&self, call: S::Call) -> Result<S::Answer> {
        let (reply, answer) = oneshot::channel();
        let order = Order::Call {
            lock: self.lock.clone(),
            call,
            reply,
        };
        if self.carrier.orders.send(order).is_err() {
            return Err(not_held(self.backend, &self.key, &self.carrier));
        }
        match answer.await {
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(e)) => Err(with_key(self.backend, &self.key, e)),
            Err(_) => Err(not_held(self.backend, &self.key, &self.carrier)),
        }
    }
}

#[async_trait]
impl<S: Session> Held for Carried<S> {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let began = Instant::now();
        let carrier = &self.carrier;
        let mut dead = carrier.dead.subscribe();
        let mut kept = carrier.kept.subscribe();
        if dead.borrow().is_some() {
            return Err(self.not_held());
        }
        if ttl != self.ttl {
            self.ttl = ttl;
            *guard(&carrier.wanted_idle) = Some(ttl);
        }
        if !carrier.keep_wanted.swap(true, Ordering::SeqCst) {
            carrier.keep_asked.notify_one();
        }
        tokio::select! {
            biased;
            _ = dead.wait_for(Option::is_some) => Err(self.not_held()),
            kept = kept.wait_for(|at| at.is_some_and(|at| at >= began)) => match kept {
                Ok(_) => Ok(()),
                Err(_) => Err(self.not_held()),
            },
        }
    }

    fn as_any(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        Some(self)
    }

    async fn release(&mut self) -> Result<()> {
        self.released = true;
        let (reply, answer) = oneshot::channel();
        let give = Give {
            lock: self.lock.clone(),
            reply: Some(reply),
        };
        if self.carrier.orders.send(Order::Give(give)).is_err() {
            return Err(self.not_held());
        }
        match answer.await {
            Ok(Ok(true)) => Ok(()),
            Ok(Ok(false)) => Err(LockError::not_held(
                self.backend,
                &self.key,
                LostReason::NotHeld,
            )),
            Ok(Err(e)) => Err(self.with_key(e)),
            Err(_) => Err(self.not_held()),
        }
    }
}

impl<S: Session> Drop for Carried<S> {
    fn drop(&mut self) {
        if !self.released {
            // Not released (the core releases on drop; this is the last resort): the
            // carrier unlocks it, or its closing session frees it.
            let _ = self.carrier.orders.send(Order::Give(Give {
                lock: self.lock.clone(),
                reply: None,
            }));
        }
    }
}
