//! A broken backend for the many-holds scenario: it drops renewals once one client holds
//! many keys.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant, Held};
use dlock_core::{Capabilities, LockOptions, LockStats, Result};
use dlock_memory::MemoryBackend;

use crate::common::FromMemory;

/// Renews as it should while it holds a few keys, but once one client holds more than
/// [`DropsRenewalsUnderLoad::BUSY`], answers every renewal "done" without sending it, as a
/// client whose renewal queue overflows silently would: the server lets the keys expire
/// while the holder believes it has them.
#[derive(Debug)]
pub(crate) struct DropsRenewalsUnderLoad(MemoryBackend, Arc<AtomicU64>);

impl DropsRenewalsUnderLoad {
    const BUSY: u64 = 100;
}

impl FromMemory for DropsRenewalsUnderLoad {
    fn from_memory(inner: MemoryBackend) -> Self {
        Self(inner, Arc::default())
    }
    fn memory(&self) -> &MemoryBackend {
        &self.0
    }
}

#[async_trait]
impl Backend for DropsRenewalsUnderLoad {
    const NAME: &'static str = "broken";
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn inspect(&self, key: &str) -> Result<dlock_core::KeyStatus> {
        self.0.inspect(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.0.list(prefix).await
    }
    fn stats(&self) -> LockStats {
        self.0.stats()
    }
    async fn acquire(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        Ok(self.0.acquire(key, opts, deadline).await?.map(|mut grant| {
            self.1.fetch_add(1, Ordering::SeqCst);
            let inner = std::mem::replace(&mut grant.held, Box::new(Released));
            grant.held = Box::new(SkipsRenewals {
                inner,
                held: self.1.clone(),
            });
            grant
        }))
    }
}

/// A held key of [`DropsRenewalsUnderLoad`]; `held` counts its client's held keys.
#[derive(Debug)]
struct SkipsRenewals {
    inner: Box<dyn Held>,
    held: Arc<AtomicU64>,
}

#[async_trait]
impl Held for SkipsRenewals {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        if self.held.load(Ordering::SeqCst) > DropsRenewalsUnderLoad::BUSY {
            return Ok(());
        }
        self.inner.extend(ttl).await
    }
    async fn release(&mut self) -> Result<()> {
        self.held.fetch_sub(1, Ordering::SeqCst);
        self.inner.release().await
    }
}

/// A placeholder while a grant's handle is swapped.
#[derive(Debug)]
struct Released;

#[async_trait]
impl Held for Released {
    async fn extend(&mut self, _ttl: Duration) -> Result<()> {
        unreachable!("replaced at once")
    }
    async fn release(&mut self) -> Result<()> {
        unreachable!("replaced at once")
    }
}
