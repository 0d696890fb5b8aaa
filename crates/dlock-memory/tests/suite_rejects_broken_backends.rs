//! The suite's own proof that it can fail: deliberately broken wrappers around the memory
//! backend, each of which a scenario must reject.

mod common;
#[path = "broken/drops_renewals.rs"]
mod drops_renewals;

use std::future::Future;
use std::time::Duration;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use async_trait::async_trait;
use common::{FromMemory, InProcess, Wired};
use dlock_conformance::{Ctx, scenarios};
use dlock_core::raw::{Backend, Deadline, Grant, Held, LockClient};
use dlock_core::{Capabilities, DistributedLock, Lease, LockOptions, LockStats, Result, Wakeup};
use dlock_memory::MemoryBackend;
use drops_renewals::DropsRenewalsUnderLoad;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Lets a second holder in whenever the key is busy.
#[derive(Debug)]
struct LetsTwoIn(MemoryBackend);

/// Releases without checking who holds the key: deletes it outright.
#[derive(Debug)]
struct ReleasesAnyone(MemoryBackend);

/// Declares reentrant holds but ignores the owner: a re-entry waits for itself.
#[derive(Debug)]
struct IgnoresOwner(MemoryBackend);

/// Re-enters an owner's hold with a token of its own, higher each time.
#[derive(Debug)]
struct ReentryNewToken(MemoryBackend);

/// Hands out the same fencing token every time.
#[derive(Debug)]
struct ConstantToken(MemoryBackend);

/// Numbers its grants per client, as if each client kept its own token counter: tokens
/// increase within a client and go backwards across clients.
#[derive(Debug)]
struct PerClientTokens(MemoryBackend, AtomicU64);

/// Wakes every waiter on a key at each release, as one pub/sub message to all of them
/// would, while declaring (as the memory backend does) one wake-up per release.
#[derive(Debug)]
struct WakesAll(MemoryBackend, AtomicU64);

/// A pub/sub herd that declares one wake-up per waiter per release, but whose waiters
/// subscribe again each time they lose the key without dropping the old subscription:
/// the first release wakes each waiter once, later ones once per subscription.
#[derive(Debug)]
struct LeaksListeners(MemoryBackend, AtomicU64);

/// Takes an exclusive request as a shared one: a writer joins the readers.
#[derive(Debug)]
struct WritesAsReads(MemoryBackend);

/// Declares shared holds but takes every request exclusively: readers queue one by one.
#[derive(Debug)]
struct ReadsAsWrites(MemoryBackend);

/// Takes a permit as a shared hold: any number of holders, no limit.
#[derive(Debug)]
struct PermitsUncapped(MemoryBackend);

/// Declares permits but takes every permit exclusively: one holder at a time.
#[derive(Debug)]
struct PermitsOneAtATime(MemoryBackend);

/// Folds case and trailing spaces, as a case-insensitive, space-padding collation would.
#[derive(Debug)]
struct FoldsKeys(MemoryBackend);

/// Sends a request for the key before checking it (as a backend that leaves key checks to
/// the server would), then answers as the core does: every answer is right, but a bad key
/// costs a round trip, or hangs on a dead network.
#[derive(Debug)]
struct AsksFirst(MemoryBackend);

/// Shows no holder when asked who holds a key.
#[derive(Debug)]
struct HidesHolders(MemoryBackend);

/// Never tells the core that a grant came after waiting, so hand-offs go uncounted.
#[derive(Debug)]
struct CountsNoHandoffs(MemoryBackend);

/// Answers a release with success but leaves the key held until its ttl runs out.
#[derive(Debug)]
struct ForgetsReleases(MemoryBackend);

/// Answers every extend with success and drops the server's loss signal, so a broken
/// lease is never reported lost.
#[derive(Debug)]
struct ExtendsBlindly(MemoryBackend);

#[derive(Debug)]
struct Fake;

/// A held key whose release does nothing (`forget`) or whose extends say yes (`blind`).
#[derive(Debug)]
struct Careless {
    inner: Box<dyn Held>,
    forget: bool,
    blind: bool,
}

#[async_trait]
impl Held for Careless {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        match self.blind {
            true => Ok(()),
            false => self.inner.extend(ttl).await,
        }
    }
    async fn release(&mut self) -> Result<()> {
        match self.forget {
            true => Ok(()),
            false => self.inner.release().await,
        }
    }
}

/// `grant` with its held key made [`Careless`]; a blind one also loses the server's own
/// loss signal.
fn careless(mut grant: Grant, forget: bool, blind: bool) -> Grant {
    if blind {
        grant.lost = None;
        grant.kept_alive = false;
    }
    let inner = std::mem::replace(&mut grant.held, Box::new(Fake));
    grant.held = Box::new(Careless {
        inner,
        forget,
        blind,
    });
    grant
}

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
        // Silently, as a release that ignores the count would: the other leases of the
        // hold are not told (a lost signal racing the release would fail it first).
        self.server.forget(&self.key);
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
            async fn inspect(&self, key: &str) -> Result<dlock_core::KeyStatus> {
                self.0.inspect(key).await
            }
            async fn list(&self, prefix: &str) -> Result<Vec<String>> {
                self.0.list(prefix).await
            }
            async fn acquire(
                &self,
                $key: &str,
                $ttl: &LockOptions,
                $deadline: Deadline,
            ) -> Result<Option<Grant>> {
                let $me = self;
                $acquire
            }
        }
    };
}

wrapper!(LetsTwoIn, |me, key, opts, _deadline| {
    match me.0.acquire(key, opts, Deadline::TryOnce).await? {
        Some(grant) => Ok(Some(grant)),
        None => Ok(Some(Grant::new(0, Box::new(Fake), Instant::now()))),
    }
});

wrapper!(IgnoresOwner, |me, key, opts, deadline| {
    let opts = LockOptions {
        owner: None,
        ..*opts
    };
    me.0.acquire(key, &opts, deadline).await
});

wrapper!(ReentryNewToken, |me, key, opts, deadline| {
    static ENTRIES: AtomicU64 = AtomicU64::new(0);
    Ok(me.0.acquire(key, opts, deadline).await?.map(|mut grant| {
        grant.fencing_token += 1_000_000 * ENTRIES.fetch_add(1, Ordering::Relaxed);
        grant
    }))
});

wrapper!(ReleasesAnyone, |me, key, opts, deadline| {
    Ok(me.0.acquire(key, opts, deadline).await?.map(|mut grant| {
        let inner = std::mem::replace(&mut grant.held, Box::new(Fake));
        grant.held = Box::new(DeletesKey {
            inner,
            server: me.0.server().clone(),
            key: key.to_owned(),
        });
        grant
    }))
});

impl FromMemory for HidesHolders {
    fn from_memory(inner: MemoryBackend) -> Self {
        Self(inner)
    }
    fn memory(&self) -> &MemoryBackend {
        &self.0
    }
}

#[async_trait]
impl Backend for HidesHolders {
    const NAME: &'static str = "broken";
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    async fn inspect(&self, key: &str) -> Result<dlock_core::KeyStatus> {
        let mut status = self.0.inspect(key).await?;
        status.holders.clear();
        Ok(status)
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.0.list(prefix).await
    }
    async fn acquire(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.0.acquire(key, opts, deadline).await
    }
}

wrapper!(CountsNoHandoffs, |me, key, opts, deadline| {
    let grant = me.0.acquire(key, opts, deadline).await?;
    Ok(grant.map(|mut grant| {
        grant.waited = false;
        grant
    }))
});

wrapper!(ForgetsReleases, |me, key, opts, deadline| {
    let grant = me.0.acquire(key, opts, deadline).await?;
    Ok(grant.map(|grant| careless(grant, true, false)))
});

wrapper!(ExtendsBlindly, |me, key, opts, deadline| {
    let grant = me.0.acquire(key, opts, deadline).await?;
    Ok(grant.map(|grant| careless(grant, false, true)))
});

wrapper!(ConstantToken, |me, key, opts, deadline| {
    Ok(me.0.acquire(key, opts, deadline).await?.map(|mut grant| {
        grant.fencing_token = 7;
        grant
    }))
});

wrapper!(WritesAsReads, |me, key, opts, deadline| {
    me.0.acquire(key, &opts.shared(), deadline).await
});

wrapper!(ReadsAsWrites, |me, key, opts, deadline| {
    me.0.acquire(key, &opts.mode(dlock_core::Mode::Exclusive), deadline)
        .await
});

wrapper!(PermitsUncapped, |me, key, opts, deadline| {
    let opts = match opts.mode {
        dlock_core::Mode::Permits(_) => opts.shared(),
        _ => *opts,
    };
    me.0.acquire(key, &opts, deadline).await
});

wrapper!(PermitsOneAtATime, |me, key, opts, deadline| {
    let opts = match opts.mode {
        dlock_core::Mode::Permits(_) => opts.permits(1),
        _ => *opts,
    };
    me.0.acquire(key, &opts, deadline).await
});

wrapper!(FoldsKeys, |me, key, opts, deadline| {
    let folded = key.trim_end().to_lowercase();
    me.0.acquire(&folded, opts, deadline).await
});

impl FromMemory for PerClientTokens {
    fn from_memory(inner: MemoryBackend) -> Self {
        Self(inner, AtomicU64::new(0))
    }
    fn memory(&self) -> &MemoryBackend {
        &self.0
    }
}

#[async_trait]
impl Backend for PerClientTokens {
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
            grant.fencing_token = self.1.fetch_add(1, Ordering::SeqCst) + 1;
            grant
        }))
    }
}

/// The broadcast every waiter on `key` listens to (keys are unique per scenario).
fn released(key: &str) -> Arc<Notify> {
    static CHANNELS: OnceLock<Mutex<HashMap<String, Arc<Notify>>>> = OnceLock::new();
    CHANNELS
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key.to_owned())
        .or_default()
        .clone()
}

/// A held key whose release is broadcast to every waiter.
#[derive(Debug)]
struct Broadcasts {
    inner: Box<dyn Held>,
    channel: Arc<Notify>,
}

#[async_trait]
impl Held for Broadcasts {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.inner.extend(ttl).await
    }
    async fn release(&mut self) -> Result<()> {
        let released = self.inner.release().await;
        self.channel.notify_waiters();
        released
    }
}

/// Wait for `key` on the memory server as a pub/sub herd does: every waiter is told of
/// every release and tries again. Each release reaches a waiter once per subscription it
/// holds; with `leak`, a waiter that loses subscribes once more.
async fn herd_acquire(
    memory: &MemoryBackend,
    wakeups: &AtomicU64,
    leak: bool,
    (key, opts, deadline): (&str, &LockOptions, Deadline),
) -> Result<Option<Grant>> {
    let channel = released(key);
    let mut subscriptions = 1;
    loop {
        let notified = channel.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Some(mut grant) = memory.acquire(key, opts, Deadline::TryOnce).await? {
            let inner = std::mem::replace(&mut grant.held, Box::new(Fake));
            grant.held = Box::new(Broadcasts {
                inner,
                channel: channel.clone(),
            });
            return Ok(Some(grant));
        }
        if !deadline.may_wait() {
            return Ok(None);
        }
        let until = deadline.min(Instant::now() + Duration::from_secs(3600));
        tokio::select! {
            () = notified => {}
            () = tokio::time::sleep_until(until) => continue,
        }
        // One wake-up, and one try, per subscription the release reached.
        for _ in 0..subscriptions {
            wakeups.fetch_add(1, Ordering::SeqCst);
            if let Some(mut grant) = memory.acquire(key, opts, Deadline::TryOnce).await? {
                let inner = std::mem::replace(&mut grant.held, Box::new(Fake));
                grant.held = Box::new(Broadcasts {
                    inner,
                    channel: channel.clone(),
                });
                return Ok(Some(grant));
            }
        }
        if leak {
            subscriptions += 1;
        }
    }
}

macro_rules! herd {
    ($ty:ident, leak: $leak:expr, $caps:expr) => {
        impl FromMemory for $ty {
            fn from_memory(inner: MemoryBackend) -> Self {
                Self(inner, AtomicU64::new(0))
            }
            fn memory(&self) -> &MemoryBackend {
                &self.0
            }
        }

        #[async_trait]
        impl Backend for $ty {
            const NAME: &'static str = "broken";
            fn capabilities(&self) -> Capabilities {
                let caps: fn(Capabilities) -> Capabilities = $caps;
                caps(self.0.capabilities())
            }
            async fn inspect(&self, key: &str) -> Result<dlock_core::KeyStatus> {
                self.0.inspect(key).await
            }
            async fn list(&self, prefix: &str) -> Result<Vec<String>> {
                self.0.list(prefix).await
            }
            fn stats(&self) -> LockStats {
                LockStats::with_wakeups(self.1.load(Ordering::SeqCst))
            }
            async fn acquire(
                &self,
                key: &str,
                opts: &LockOptions,
                deadline: Deadline,
            ) -> Result<Option<Grant>> {
                herd_acquire(&self.0, &self.1, $leak, (key, opts, deadline)).await
            }
        }
    };
}

herd!(WakesAll, leak: false, |memory| memory);

herd!(LeaksListeners, leak: true, |memory| Capabilities {
    fair: false,
    wakeup: Wakeup::Notification {
        one_per_release: false,
        max_per_waiter: 1,
    },
    ..memory
});

impl FromMemory for AsksFirst {
    fn from_memory(inner: MemoryBackend) -> Self {
        Self(inner)
    }
    fn memory(&self) -> &MemoryBackend {
        &self.0
    }
    fn client(lock: LockClient<Wired<Self>>) -> Arc<dyn DistributedLock> {
        Arc::new(AsksFirstClient(lock))
    }
}

#[async_trait]
impl Backend for AsksFirst {
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
        self.0.acquire(key, opts, deadline).await
    }
}

#[derive(Debug)]
struct AsksFirstClient(LockClient<Wired<AsksFirst>>);

impl AsksFirstClient {
    /// One try for the key on the server, given back at once; its answer is not used.
    async fn ask(&self, key: &str, opts: &LockOptions) {
        let asked = self.0.backend().acquire(key, opts, Deadline::TryOnce);
        if let Ok(Some(mut grant)) = asked.await {
            let _ = grant.held.release().await;
        }
    }
}

#[async_trait]
impl DistributedLock for AsksFirstClient {
    fn backend_name(&self) -> &'static str {
        self.0.backend_name()
    }
    fn capabilities(&self) -> Capabilities {
        self.0.capabilities()
    }
    fn stats(&self) -> LockStats {
        self.0.stats()
    }
    fn validate(&self, key: &str, opts: &LockOptions) -> Result<()> {
        self.0.validate(key, opts)
    }
    async fn inspect(&self, key: &str) -> Result<dlock_core::KeyStatus> {
        self.0.inspect(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.0.list(prefix).await
    }
    async fn try_acquire(&self, key: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        self.ask(key, opts).await;
        self.0.try_acquire(key, opts).await
    }
    async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<Lease> {
        self.ask(key, opts).await;
        self.0.acquire(key, opts).await
    }
    async fn campaign(&self, key: &str, value: &str, opts: &LockOptions) -> Result<Lease> {
        self.0.campaign(key, value, opts).await
    }
    async fn leader(&self, key: &str) -> Result<Option<dlock_core::Leader>> {
        self.0.leader(key).await
    }
    async fn leader_changes(
        &self,
        key: &str,
    ) -> Result<Option<futures::stream::BoxStream<'static, Result<()>>>> {
        self.0.leader_changes(key).await
    }
}

/// Run `scenario` on `harness`; its failure message, if it failed.
async fn failure<B, F, Fut>(harness: InProcess<B>, scenario: F) -> Option<String>
where
    B: FromMemory,
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let run = tokio::spawn(dlock_conformance::run(
        harness,
        "broken::scenario",
        scenario,
    ));
    match run.await {
        Ok(()) => None,
        Err(e) if e.is_panic() => {
            let panic = e.into_panic();
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "(a panic without a message)".to_owned());
            eprintln!("rejected as expected: {message}");
            Some(message)
        }
        Err(e) => panic!("the scenario's task ended without finishing: {e}"),
    }
}

/// Run `scenario` against `B` and return whether it failed.
async fn rejects<B, F, Fut>(scenario: F) -> bool
where
    B: FromMemory,
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    failure(InProcess::<B>::new(), scenario).await.is_some()
}

/// Assert that `scenario` fails on `B` for the reason `expected` names.
async fn rejects_for<B, F, Fut>(scenario: F, expected: &str)
where
    B: FromMemory,
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    rejects_on(InProcess::<B>::new(), scenario, expected).await;
}

/// Assert that `scenario` fails on `harness` for the reason `expected` names.
async fn rejects_on<B, F, Fut>(harness: InProcess<B>, scenario: F, expected: &str)
where
    B: FromMemory,
    F: FnOnce(Ctx) -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let message = failure(harness, scenario)
        .await
        .expect("the scenario passed a broken backend");
    assert!(
        message.contains(expected),
        "rejected, but not for {expected:?}: {message}"
    );
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

/// The old check asked a client of a dead server for a bad key and looked only at the
/// answer, which `AsksFirst` gets right; every real backend failed to connect to the dead
/// server first, so even that did not run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_keys_rejects_a_backend_that_asks_the_server_first() {
    rejects_for::<AsksFirst, _, _>(
        scenarios::bad_keys_are_rejected_before_io,
        "the client tried to reach the server for bad keys",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_rejects_tokens_that_go_backwards_across_clients() {
    rejects_for::<PerClientTokens, _, _>(scenarios::mutual_exclusion, "token regression").await;
}

/// The old check opened one more client after the run to read the capabilities, and turned
/// the token order off when that failed: on a server with no connection to spare,
/// `PerClientTokens` passed. The capabilities now come from a client in use.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_exclusion_checks_tokens_when_no_connection_is_left() {
    let full = InProcess::<PerClientTokens>::admitting(4);
    rejects_on(full, scenarios::mutual_exclusion, "token regression").await;
    let full = InProcess::<MemoryBackend>::admitting(4);
    assert!(failure(full, scenarios::mutual_exclusion).await.is_none());
}

/// `WakesAll` declares one wake-up per release: its first release already wakes all
/// eight waiters (the old check, which looked at that release only, caught it too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_herd_rejects_a_backend_that_wakes_every_waiter() {
    rejects_for::<WakesAll, _, _>(scenarios::no_herd, "wake-ups per release [8]").await;
}

/// `LeaksListeners` declares a herd of one wake-up per waiter, and its first release keeps
/// to it (the old check looked at that release only); the second costs about twice as much.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_herd_rejects_a_herd_that_costs_more_than_declared() {
    rejects_for::<LeaksListeners, _, _>(scenarios::no_herd, "wake-ups per release [8, ").await;
}

/// Each lease's renewals look fine to its watchdog, so no `lost()` fires: another client
/// finding the keys free is what gives it away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_holds_rejects_a_backend_that_drops_renewals_under_load() {
    rejects_for::<DropsRenewalsUnderLoad, _, _>(
        scenarios::many_holds_at_once,
        "but another client took it",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_scenarios_reject_a_backend_that_ignores_the_owner() {
    rejects_for::<IgnoresOwner, _, _>(
        scenarios::reentry_succeeds_at_once_with_the_same_token,
        "the owner re-enters",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_scenarios_reject_a_new_token_per_entry() {
    rejects_for::<ReentryNewToken, _, _>(
        scenarios::reentry_succeeds_at_once_with_the_same_token,
        "keeps its fencing token",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reentry_scenarios_reject_a_release_that_ignores_the_count() {
    rejects_for::<ReleasesAnyone, _, _>(
        scenarios::reentry_keeps_the_key_until_the_last_release,
        "the owner still counts",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_scenarios_reject_a_writer_among_readers() {
    rejects_for::<WritesAsReads, _, _>(scenarios::writer_excludes_readers_and_writers, "overlap")
        .await;
    assert!(rejects::<WritesAsReads, _, _>(scenarios::readers_share).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_share_rejects_readers_taken_one_at_a_time() {
    rejects_for::<ReadsAsWrites, _, _>(scenarios::readers_share, "should be free").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_scenarios_reject_holders_past_the_limit() {
    rejects_for::<PermitsUncapped, _, _>(
        scenarios::permits_cap_holders_under_contention,
        "too many holders",
    )
    .await;
    rejects_for::<PermitsUncapped, _, _>(
        scenarios::permits_admit_up_to_the_limit,
        "should be held",
    )
    .await;
    assert!(rejects::<PermitsUncapped, _, _>(scenarios::freed_permit_lets_one_waiter_in).await);
    assert!(rejects::<PermitsUncapped, _, _>(scenarios::one_permit_is_a_mutex).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_scenarios_reject_permits_taken_one_at_a_time() {
    rejects_for::<PermitsOneAtATime, _, _>(
        scenarios::permits_admit_up_to_the_limit,
        "should be free",
    )
    .await;
    rejects_for::<PermitsOneAtATime, _, _>(
        scenarios::permits_cap_holders_under_contention,
        "should hold all",
    )
    .await;
    assert!(
        rejects::<PermitsOneAtATime, _, _>(scenarios::disagreeing_limits_count_against_their_own)
            .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_set_scenarios_reject_overlapping_holders() {
    rejects_for::<LetsTwoIn, _, _>(scenarios::key_sets_never_deadlock_or_overlap, "overlap").await;
}

/// A set that gave up must give back the keys it took: a release that frees nothing
/// leaves them held, which another client finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_set_scenarios_reject_keys_that_are_not_given_back() {
    rejects_for::<ForgetsReleases, _, _>(
        scenarios::key_set_with_a_busy_key_leaves_the_others_free,
        "should be free",
    )
    .await;
    rejects_for::<ForgetsReleases, _, _>(
        scenarios::cancelled_key_set_leaves_nothing,
        "should be free",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_set_lost_rejects_a_backend_that_never_reports_a_loss() {
    rejects_for::<ExtendsBlindly, _, _>(
        scenarios::key_set_lost_fires_when_any_key_is_lost,
        "lost() did not fire",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_rejects_a_backend_that_hides_its_holders() {
    rejects_for::<HidesHolders, _, _>(
        scenarios::inspect_shows_the_holder_and_the_queue,
        "one holder",
    )
    .await;
    rejects_for::<HidesHolders, _, _>(
        scenarios::inspect_shows_every_shared_holder_and_permit,
        "both holders",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures_reject_a_backend_whose_hand_offs_go_uncounted() {
    rejects_for::<CountsNoHandoffs, _, _>(scenarios::figures_are_recorded, "dlock_handoffs_total")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_scenarios_pass_on_the_real_memory_backend() {
    assert!(
        !rejects::<MemoryBackend, _, _>(scenarios::inspect_shows_the_holder_and_the_queue).await
    );
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::figures_are_recorded).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::key_sets_never_deadlock_or_overlap).await);
    assert!(
        !rejects::<MemoryBackend, _, _>(scenarios::key_set_with_a_busy_key_leaves_the_others_free)
            .await
    );
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::cancelled_key_set_leaves_nothing).await);
    assert!(
        !rejects::<MemoryBackend, _, _>(scenarios::key_set_lost_fires_when_any_key_is_lost).await
    );
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::permits_cap_holders_under_contention).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::permits_admit_up_to_the_limit).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::freed_permit_lets_one_waiter_in).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::readers_share).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::writer_excludes_readers_and_writers).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::mutual_exclusion).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::fencing_tokens_increase).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::independent_keys).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::bad_keys_are_rejected_before_io).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::no_herd).await);
    assert!(!rejects::<MemoryBackend, _, _>(scenarios::many_holds_at_once).await);
}
