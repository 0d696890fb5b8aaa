//! The in-process harness: the memory backend (or a wrapper around it) on a fresh server
//! per test.

use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::{Harness, Holder, Partition};
use dlock_core::raw::{Backend, Deadline, Grant, Held, LockClient};
use dlock_core::{
    BoxError, DistributedLock, ErrorKind, LockError, LockExt as _, LockOptions, LockStats, Result,
};
use dlock_memory::{MemoryBackend, MemoryServer};

/// A backend made from a memory client: the memory backend itself, or a broken wrapper.
pub(crate) trait FromMemory: Backend {
    fn from_memory(inner: MemoryBackend) -> Self;
    fn memory(&self) -> &MemoryBackend;

    /// The client the harness hands out. By default the core's `LockClient`; a broken
    /// wrapper may put itself in front of it.
    fn client(lock: LockClient<Wired<Self>>) -> Arc<dyn DistributedLock>
    where
        Self: Sized,
    {
        Arc::new(lock)
    }
}

/// The in-process stand-in for the network between a client and the memory server: while
/// cut, the memory client is partitioned (every call fails with `Unavailable`) and every
/// call into it is counted, as a cut proxy counts the bytes a client sends.
#[derive(Debug, Clone, Default)]
pub(crate) struct Link {
    cut: Arc<AtomicBool>,
    traffic: Arc<AtomicU64>,
}

impl Link {
    fn send(&self) {
        if self.cut.load(Ordering::SeqCst) {
            self.traffic.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// A backend behind a [`Link`]: each call into it is a request to the server.
#[derive(Debug)]
pub(crate) struct Wired<B> {
    inner: B,
    link: Link,
}

#[async_trait]
impl<B: FromMemory> Backend for Wired<B> {
    const NAME: &'static str = B::NAME;

    fn capabilities(&self) -> dlock_core::Capabilities {
        self.inner.capabilities()
    }

    fn stats(&self) -> LockStats {
        self.inner.stats()
    }

    async fn inspect(&self, key: &str) -> Result<dlock_core::KeyStatus> {
        self.link.send();
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.link.send();
        self.inner.list(prefix).await
    }

    async fn acquire(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.link.send();
        let granted = self.inner.acquire(key, opts, deadline).await?;
        Ok(granted.map(|grant| self.wired(grant)))
    }

    async fn campaign(
        &self,
        key: &str,
        value: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.link.send();
        let granted = self.inner.campaign(key, value, opts, deadline).await?;
        Ok(granted.map(|grant| self.wired(grant)))
    }

    async fn leader(&self, key: &str) -> Result<Option<dlock_core::Leader>> {
        self.link.send();
        self.inner.leader(key).await
    }

    async fn leader_changes(
        &self,
        key: &str,
    ) -> Result<Option<futures::stream::BoxStream<'static, Result<()>>>> {
        self.link.send();
        self.inner.leader_changes(key).await
    }
}

impl<B> Wired<B> {
    /// `grant` with its handle behind this link.
    fn wired(&self, mut grant: Grant) -> Grant {
        let inner = std::mem::replace(&mut grant.held, Box::new(Gone));
        grant.held = Box::new(WiredHeld {
            inner,
            link: self.link.clone(),
        });
        grant
    }
}

#[derive(Debug)]
struct WiredHeld {
    inner: Box<dyn Held>,
    link: Link,
}

#[async_trait]
impl Held for WiredHeld {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.link.send();
        self.inner.extend(ttl).await
    }
    async fn release(&mut self) -> Result<()> {
        self.link.send();
        self.inner.release().await
    }
    async fn proclaim(&mut self, value: &str) -> Result<()> {
        self.link.send();
        self.inner.proclaim(value).await
    }
}

/// A placeholder while a grant's handle is swapped.
#[derive(Debug)]
struct Gone;

#[async_trait]
impl Held for Gone {
    async fn extend(&mut self, _ttl: Duration) -> Result<()> {
        unreachable!("replaced at once")
    }
    async fn release(&mut self) -> Result<()> {
        unreachable!("replaced at once")
    }
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
    /// How many more clients `connect` makes; `None`: no limit.
    admits: Option<AtomicU64>,
    _backend: PhantomData<fn() -> B>,
}

impl<B: FromMemory> InProcess<B> {
    pub(crate) fn new() -> Self {
        Self {
            server: MemoryServer::new(),
            admits: None,
            _backend: PhantomData,
        }
    }

    /// A server that admits `clients` connections, then refuses more with `Unavailable`
    /// (as a server at its connection limit does).
    #[allow(dead_code)] // only the broken-backend tests use it
    pub(crate) fn admitting(clients: u64) -> Self {
        Self {
            admits: Some(AtomicU64::new(clients)),
            ..Self::new()
        }
    }

    fn lock(&self) -> LockClient<Wired<B>> {
        LockClient::new(Wired {
            inner: B::from_memory(self.server.backend()),
            link: Link::default(),
        })
    }
}

struct Cut<B: FromMemory>(LockClient<Wired<B>>);

impl<B: FromMemory> Partition for Cut<B> {
    fn cut(&self) {
        let wired = self.0.backend();
        wired.link.traffic.store(0, Ordering::SeqCst);
        wired.link.cut.store(true, Ordering::SeqCst);
        wired.inner.memory().set_partitioned(true);
    }
    fn heal(&self) {
        let wired = self.0.backend();
        wired.inner.memory().set_partitioned(false);
        wired.link.cut.store(false, Ordering::SeqCst);
    }
    fn traffic_while_cut(&self) -> u64 {
        self.0.backend().link.traffic.load(Ordering::SeqCst)
    }
}

struct InProcessHolder<B: FromMemory> {
    lock: LockClient<Wired<B>>,
    token: u64,
    _held: Box<dyn std::any::Any + Send>,
}

#[async_trait]
impl<B: FromMemory> Holder for InProcessHolder<B> {
    fn token(&self) -> u64 {
        self.token
    }
    async fn kill(&mut self) {
        self.lock.backend().inner.memory().crash();
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
            let admitted = self.admits.as_ref().is_none_or(|left| {
                left.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            });
            if !admitted {
                return Err(LockError::unavailable(
                    "memory",
                    "connect",
                    "the server admits no more connections",
                ));
            }
            return Ok(B::client(self.lock()));
        }
        Ok(Arc::new(dlock_memory::from_url(url)?))
    }

    async fn partitioned_client(&self) -> Result<(Arc<dyn DistributedLock>, Box<dyn Partition>)> {
        let lock = self.lock();
        Ok((B::client(lock.clone()), Box::new(Cut(lock))))
    }

    async fn unreachable_client(&self) -> Result<Arc<dyn DistributedLock>> {
        let lock = self.lock();
        lock.backend().inner.memory().set_partitioned(true);
        Ok(B::client(lock))
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
        opts: &LockOptions,
    ) -> Result<Box<dyn Holder>, BoxError> {
        let lock = self.lock();
        if opts.owner.is_some() {
            let entries = dlock_conformance::take_entries(&lock, key, opts).await?;
            return Ok(Box::new(InProcessHolder {
                lock,
                token: entries[0].fencing_token(),
                _held: Box::new(entries),
            }));
        }
        // A key of several lines is a set (see `Harness::spawn_holder`).
        let keys: Vec<&str> = key.lines().collect();
        let set = lock.acquire_all(&keys, opts).await?;
        Ok(Box::new(InProcessHolder {
            lock,
            token: set.leases()[0].fencing_token(),
            _held: Box::new(set),
        }))
    }

    async fn spawn_leader(
        &self,
        _test: &str,
        key: &str,
        value: &str,
        opts: &LockOptions,
    ) -> Result<Box<dyn Holder>, BoxError> {
        let lock = self.lock();
        let election = dlock_core::Election::new(Arc::new(lock.clone()), key).options(*opts);
        let leading = election.campaign(value).await?;
        Ok(Box::new(InProcessHolder {
            lock,
            token: leading.term(),
            _held: Box::new(leading),
        }))
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(1)
    }
}
