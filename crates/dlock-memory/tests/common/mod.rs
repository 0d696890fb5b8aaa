//! The in-process harness: the memory backend (or a wrapper around it) on a fresh server
//! per test.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::{Harness, Holder, Partition};
use dlock_core::raw::{Backend, LockClient};
use dlock_core::{BoxError, DistributedLock, ErrorKind, LockOptions, Result};
use dlock_memory::{MemoryBackend, MemoryServer};

/// A backend made from a memory client: the memory backend itself, or a broken wrapper.
pub(crate) trait FromMemory: Backend {
    fn from_memory(inner: MemoryBackend) -> Self;
    fn memory(&self) -> &MemoryBackend;
}

impl FromMemory for MemoryBackend {
    fn from_memory(inner: MemoryBackend) -> Self {
        inner
    }
    fn memory(&self) -> &MemoryBackend {
        self
    }
}

pub(crate) struct InProcess<B> {
    server: MemoryServer,
    _backend: PhantomData<fn() -> B>,
}

impl<B: FromMemory> InProcess<B> {
    pub(crate) fn new() -> Self {
        Self {
            server: MemoryServer::new(),
            _backend: PhantomData,
        }
    }

    fn lock(&self) -> LockClient<B> {
        LockClient::new(B::from_memory(self.server.backend()))
    }
}

struct Cut<B: FromMemory>(LockClient<B>);

impl<B: FromMemory> Partition for Cut<B> {
    fn cut(&self) {
        self.0.backend().memory().set_partitioned(true);
    }
    fn heal(&self) {
        self.0.backend().memory().set_partitioned(false);
    }
}

struct InProcessHolder<B: FromMemory> {
    lock: LockClient<B>,
    token: u64,
    _lease: dlock_core::Lease,
}

#[async_trait]
impl<B: FromMemory> Holder for InProcessHolder<B> {
    fn token(&self) -> u64 {
        self.token
    }
    async fn kill(&mut self) {
        self.lock.backend().memory().crash();
    }
}

#[async_trait]
impl<B: FromMemory> Harness for InProcess<B> {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn url(&self) -> String {
        "memory://conformance-under-test".into()
    }

    async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        if url == self.url() {
            return Ok(Arc::new(self.lock()));
        }
        Ok(Arc::new(dlock_memory::from_url(url)?))
    }

    async fn partitioned_client(&self) -> Result<(Arc<dyn DistributedLock>, Box<dyn Partition>)> {
        let lock = self.lock();
        Ok((Arc::new(lock.clone()), Box::new(Cut(lock))))
    }

    async fn unreachable_client(&self) -> Result<Arc<dyn DistributedLock>> {
        let lock = self.lock();
        lock.backend().memory().set_partitioned(true);
        Ok(Arc::new(lock))
    }

    fn bad_urls(&self) -> Vec<(String, ErrorKind)> {
        [
            "memory://name:1234",
            "memory://user:sekrit-password@name",
            "memory://name/path",
            "redis://127.0.0.1:6379",
            "not a url",
        ]
        .into_iter()
        .map(|u| (u.to_owned(), ErrorKind::InvalidConfig))
        .collect()
    }

    async fn break_lease(&self, key: &str) -> Result<(), BoxError> {
        self.server.break_lease(key);
        Ok(())
    }

    async fn residue(&self, prefix: &str) -> Result<Vec<String>, BoxError> {
        Ok(self
            .server
            .keys()
            .into_iter()
            .filter(|k| k.starts_with(prefix))
            .collect())
    }

    async fn spawn_holder(
        &self,
        _test: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<Box<dyn Holder>, BoxError> {
        let lock = self.lock();
        let lease = lock.acquire(key, &LockOptions::new().ttl(ttl)).await?;
        Ok(Box::new(InProcessHolder {
            lock,
            token: lease.fencing_token(),
            _lease: lease,
        }))
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(1)
    }
}
