//! [`LockClient`]: a [`Backend`] plus the machinery every backend shares.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use tokio::time::Instant;

use crate::Capabilities;
use crate::backend::Backend;
use crate::gate::Gate;
use crate::{Deadline, DistributedLock, Lease, LockError, LockOptions, LockStats, Result, key};

/// A [`DistributedLock`] made from a [`Backend`].
///
/// Every backend crate exports its lock as a `LockClient` of its backend (for example
/// `dlock_redis::RedisLock`). Before any network I/O it checks the key and the options; it
/// queues the tasks of this client per key (the local gate), so only one of them talks to
/// the server at a time and they are served in arrival order; it gives every acquire one
/// deadline; and it runs each lease's watchdog.
///
/// Cloning is cheap and shares the connection(s) and the local gate.
pub struct LockClient<B: Backend> {
    backend: Arc<B>,
    gate: Arc<Gate>,
}

impl<B: Backend> LockClient<B> {
    /// Wrap a connected backend.
    pub fn new(backend: B) -> Self {
        Self {
            backend: Arc::new(backend),
            gate: Arc::default(),
        }
    }

    /// The backend, for backend-specific calls.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    async fn take(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Lease>> {
        let caps = self.backend.capabilities();
        key::validate(key, caps.max_key_len)?;
        opts.validate(B::NAME)?;
        let Some(permit) = self.gate.enter(key, deadline).await else {
            return Ok(None);
        };
        let Some(grant) = self.backend.acquire(key, opts.ttl, deadline).await? else {
            return Ok(None);
        };
        tracing::debug!(
            backend = B::NAME,
            key,
            token = grant.fencing_token,
            "acquired"
        );
        Ok(Some(Lease::start(
            B::NAME,
            key,
            grant,
            opts,
            caps.expiry,
            permit,
        )))
    }
}

impl<B: Backend> Clone for LockClient<B> {
    fn clone(&self) -> Self {
        Self {
            backend: self.backend.clone(),
            gate: self.gate.clone(),
        }
    }
}

impl<B: Backend> fmt::Debug for LockClient<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.backend)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl<B: Backend> DistributedLock for LockClient<B> {
    fn backend_name(&self) -> &'static str {
        B::NAME
    }

    fn capabilities(&self) -> Capabilities {
        self.backend.capabilities()
    }

    fn stats(&self) -> LockStats {
        self.backend.stats()
    }

    async fn try_acquire(&self, key: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        self.take(key, opts, Deadline::TryOnce).await
    }

    async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<Lease> {
        let started = Instant::now();
        let deadline = Deadline::after(opts.wait);
        match self.take(key, opts, deadline).await? {
            Some(lease) => Ok(lease),
            None => Err(LockError::Timeout {
                backend: B::NAME,
                key: key.to_owned(),
                waited: started.elapsed(),
            }),
        }
    }
}
