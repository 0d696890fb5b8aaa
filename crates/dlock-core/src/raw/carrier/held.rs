//! A hold on a carrier: what the core's lease keeps as its [`Held`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Carrier, Give, guard};
use crate::raw::Held;
use crate::{LockError, LostReason, Result};

/// A hold on a carrier.
pub(super) struct Carried<L: Clone> {
    pub(super) backend: &'static str,
    pub(super) key: String,
    pub(super) lock: L,
    pub(super) carrier: Arc<Carrier<L>>,
    /// The ttl of the hold's last renewal.
    pub(super) ttl: Duration,
    pub(super) released: bool,
}

impl<L: Clone + fmt::Debug> fmt::Debug for Carried<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Carried")
            .field("key", &self.key)
            .field("lock", &self.lock)
            .field("session", &self.carrier.id)
            .finish()
    }
}

impl<L: Clone> Carried<L> {
    fn not_held(&self) -> LockError {
        let reason = self
            .carrier
            .dead
            .borrow()
            .clone()
            .unwrap_or_else(|| "the holder connection's task ended".to_owned());
        LockError::not_held(self.backend, &self.key, LostReason::SessionEnded(reason))
    }

    /// Name the key in an error the carrier made without it.
    fn with_key(&self, e: LockError) -> LockError {
        match e {
            LockError::NotHeld { reason, .. } => {
                LockError::not_held(self.backend, &self.key, reason)
            }
            e => e,
        }
    }
}

#[async_trait]
impl<L: Clone + Send + Sync + fmt::Debug + 'static> Held for Carried<L> {
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

    async fn release(&mut self) -> Result<()> {
        self.released = true;
        let (reply, answer) = oneshot::channel();
        let give = Give {
            lock: self.lock.clone(),
            reply: Some(reply),
        };
        if self.carrier.gives.send(give).is_err() {
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

impl<L: Clone> Drop for Carried<L> {
    fn drop(&mut self) {
        if !self.released {
            // Not released (the core releases on drop; this is the last resort): the
            // carrier unlocks it, or its closing session frees it.
            let _ = self.carrier.gives.send(Give {
                lock: self.lock.clone(),
                reply: None,
            });
        }
    }
}
