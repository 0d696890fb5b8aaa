//! The suite's own proof that it can fail: deliberately broken wrappers around the memory
//! backend, each of which a scenario must reject.

mod common;

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use common::{FromMemory, InProcess};
use dlock_conformance::{Ctx, scenarios};
use dlock_core::raw::{Backend, Deadline, Grant, Held};
use dlock_core::{Capabilities, LockStats, Result};
use dlock_memory::MemoryBackend;
use tokio::time::Instant;

/// Lets a second holder in whenever the key is busy.
#[derive(Debug)]
struct LetsTwoIn(MemoryBackend);

/// Releases without checking who holds the key: deletes it outright.
#[derive(Debug)]
struct ReleasesAnyone(MemoryBackend);

/// Hands out the same fencing token every time.
#[derive(Debug)]
struct ConstantToken(MemoryBackend);

/// Folds case and trailing spaces, as a case-insensitive, space-padding collation would.
#[derive(Debug)]
struct FoldsKeys(MemoryBackend);

#[derive(Debug)]
struct Fake;

#[async_trait]
impl Held for Fake {
    async fn extend(&mut self, _ttl: Duration) -> Result<()> {
        Ok(())
    }
    async fn release(&mut self) -> Result<()> {
        Ok(())
    }
}

#[derive(Debug)]
struct DeletesKey {
    inner: Box<dyn Held>,
    server: dlock_memory::MemoryServer,
    key: String,
}

#[async_trait]
impl Held for DeletesKey {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.inner.extend(ttl).await
    }
    async fn release(&mut self) -> Result<()> {
        self.server.break_lease(&self.key);
        Ok(())
    }
}

macro_rules! wrapper {
    ($ty:ident, |$me:ident, $key:ident, $ttl:ident, $deadline:ident| $acquire:expr) => {
        impl FromMemory for $ty {
            fn from_memory(inner: MemoryBackend) -> Self {
                Self(inner)
            }
            fn memory(&self) -> &MemoryBackend {
                &self.0
            }
        }

        #[async_trait]
        impl Backend for $ty {
            const NAME: &'static str = "broken";
            fn capabilities(&self) -> Capabilities {
                self.0.capabilities()
            }
            fn stats(&self) -> LockStats {
                self.0.stats()
            }
            async fn acquire(
                &self,
                $key: &str,
                $ttl: Duration,
                $deadline: Deadline,
            ) -> Result<Option<Grant>> {
                let $me = self;
                $acquire
            }
        }
    };
}

wrapper!(LetsTwoIn, |me, key, ttl, _deadline| {
    match me.0.acquire(key, ttl, Deadline::TryOnce).await? {
        Some(grant) => Ok(Some(grant)),
        None => Ok(Some(Grant::new(0, Box::new(Fake), Instant::now()))),
    }
});

wrapper!(ReleasesAnyone, |me, key, ttl, deadline| {
    Ok(me.0.acquire(key, ttl, deadline).await?.map(|mut grant| {
        let inner = std::mem::replace(&mut grant.held, Box::new(Fake));
        grant.held = Box::new(DeletesKey {
            inner,
            server: me.0.server().clone(),
            key: key.to_owned(),
        });
        grant
    }))
});

wrapper!(ConstantToken, |me, key, ttl, deadline| {
    Ok(me.0.acquire(key, ttl, deadline).await?.map(|mut grant| {
        grant.fencing_token = 7;
        grant
    }))
});

wrapper!(FoldsKeys, |me, key, ttl, deadline| {
    let folded = key.trim_end().to_lowercase();
    me.0.acquire(&folded, ttl, deadline).await
});

/// Run `scenario` against `B` and return whether it failed.
async fn rejects<B, F, Fut>(scenario: F) -> bool
where
    B: FromMemory,
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let run = tokio::spawn(dlock_conformance::run(
        InProcess::<B>::new(),
        "broken::scenario",
        scenario,
    ));
    match run.await {
        Ok(()) => false,
        Err(e) => e.is_panic(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_rejects_a_backend_that_lets_two_in() {
    assert!(rejects::<LetsTwoIn, _, _>(scenarios::mutual_exclusion).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_rejects_a_backend_that_lets_two_in() {
    assert!(rejects::<LetsTwoIn, _, _>(scenarios::try_acquire_answers_at_once).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_release_rejects_a_backend_without_owner_check() {
    assert!(rejects::<ReleasesAnyone, _, _>(scenarios::stale_lease_cannot_release_or_extend).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_rejects_a_backend_with_a_constant_token() {
    assert!(rejects::<ConstantToken, _, _>(scenarios::fencing_tokens_increase).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn independent_keys_rejects_a_backend_that_folds_keys() {
    assert!(rejects::<FoldsKeys, _, _>(scenarios::independent_keys).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_scenarios_pass_on_the_real_memory_backend() {
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::mutual_exclusion).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::fencing_tokens_increase).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::independent_keys).await);
}
