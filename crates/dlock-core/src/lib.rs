//! The `DistributedLock` contract and the machinery every dlock backend shares.
//!
//! ```no_run
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, LockOptions, Wait};
//!
//! async fn nightly_report(lock: &dyn DistributedLock) -> dlock_core::Result<()> {
//!     let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
//!     let lease = lock.acquire("reports/nightly", &opts).await?;
//!     // ... work, passing lease.fencing_token() to storage that checks it ...
//!     lease.release().await
//! }
//! ```
//!
//! Backends live in their own crates (`dlock-redis`, `dlock-zookeeper`, …); the `dlock`
//! facade picks one from a URL. This crate holds what they share:
//!
//! - [`DistributedLock`]: the object-safe trait (`Arc<dyn DistributedLock>` works), and
//!   [`LockExt`] with conveniences;
//! - [`Lease`]: a held key with its [`fencing_token`](Lease::fencing_token),
//!   [`lost`](Lease::lost) signal, [`extend`](Lease::extend) and [`release`](Lease::release);
//! - [`LeaseSet`]: several keys held as one, all or none ([`LockExt::acquire_all`]);
//! - [`LockOptions`], [`LockError`], [`Capabilities`];
//! - [`Secret`]: a credential whose `Debug` and `Display` never show it.
//!
//! The promises every backend keeps are written on [`DistributedLock`], under *Contract*.
//!
//! Backend crates use [`raw`], the implementor API: a backend implements the server
//! protocol only ([`raw::Backend`]), and [`raw::LockClient`] adds key checks, the
//! process-local gate, one overall deadline per acquire, late-grant confirmation, the
//! renewal watchdog and the lost signal, once for every backend. Applications never need
//! it.

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod background;
mod capabilities;
pub mod election;
mod error;
mod inspect;
mod lease;
mod lease_set;
mod options;
mod owner;
pub mod raw;
pub mod telemetry;

use std::future::Future;

use async_trait::async_trait;

pub use background::settle;
pub use capabilities::{
    Capabilities, Expiry, FaultSafety, Faults, Fencing, Observe, Reentry, Wakeup,
};
pub use election::{Election, Leader, Leadership};
pub use error::{BoxError, ErrorKind, LockError, Result};
pub use inspect::{
    HolderStatus, Inspection, KeyStatus, MAX_HOLDER_NAME, WaiterStatus, WaiterView,
    holder_description, set_holder_name,
};
pub use lease::{Lease, LostReason, LostSignal};
pub use lease_set::LeaseSet;
pub use options::{LockOptions, Mode, Wait};
pub use owner::Owner;
pub use raw::url::Secret;

// Crate-internal short paths to the implementor items.
pub(crate) use raw::{Deadline, spawn_cleanup};

/// A lock service: take a key, exclusively, for a while.
///
/// Implemented by every backend through [`raw::LockClient`]. Object-safe, so services hold
/// an `Arc<dyn DistributedLock>` and swap backends by configuration.
///
/// # Contract
///
/// Every backend keeps these promises; the `dlock-conformance` suite checks each of them
/// against the real server, one scenario per promise. Where backends differ,
/// [`capabilities`](Self::capabilities) says how, and the suite checks the declaration.
///
/// 1. **Mutual exclusion**: no two holders of a key overlap, across clients and tasks.
/// 2. **try_acquire** answers at once: `None` while held, a lease when free.
/// 3. **acquire with a wait** returns [`LockError::Timeout`] close to the deadline while the
///    key stays held, and hands off promptly on release.
/// 4. **Owner-checked release**: a lease that expired and whose key was taken cannot
///    release, extend or disturb the new holder; it gets [`LockError::NotHeld`].
/// 5. **Crash release**: a holder killed with SIGKILL frees the key within
///    [`Capabilities::crash_release_bound`].
/// 6. **Renewal**: with auto-renew a lease held for many ttls stays exclusive; without it
///    the key frees after the ttl.
/// 7. **Loss detection**: when the lease cannot be kept, [`Lease::lost`] fires, before
///    another client can acquire the key.
/// 8. **Fencing tokens** increase across successive holders, as far as
///    [`Capabilities::fencing`] promises.
/// 9. **Independence**: different keys never block each other, however close (a key and its
///    children, case, trailing spaces, percent-encodings).
/// 10. **Fairness** where [`Capabilities::fair`]: waiters acquire in arrival order.
/// 11. **No herd** where [`Wakeup::Notification`] says one wake-up per release.
/// 12. **Cancellation safety**: dropping an acquire future leaves nothing behind.
/// 13. **Bad input** gets a typed error before any change on the server.
/// 14. **Unavailable server**: acquire returns [`LockError::Unavailable`] within the connect
///     timeout.
/// 15. **Hygiene**: nothing a finished lock created is left on the server.
/// 16. **Sharing**: one client value serves hundreds of tasks.
/// 17. **Reentry** where [`Capabilities::reentrant`] says so: an acquire under an
///     [`Owner`] that holds the key succeeds at once with the hold's token, from any client
///     or process, and the key stays held until the owner's last lease is released.
#[async_trait]
pub trait DistributedLock: Send + Sync + std::fmt::Debug {
    /// The backend's short name, e.g. `"redis"`.
    fn backend_name(&self) -> &'static str;

    /// What this backend promises.
    fn capabilities(&self) -> Capabilities;

    /// Counters since this client was created.
    fn stats(&self) -> LockStats;

    /// Check `key` and `opts` as an acquire would, without any network I/O: the key's
    /// form and length, the option ranges, and whether this backend takes the mode.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`], [`LockError::InvalidConfig`] or
    /// [`LockError::Unsupported`], as [`acquire`](Self::acquire) would return them.
    fn validate(&self, key: &str, opts: &LockOptions) -> Result<()>;

    /// Take `key` if it is free right now; `Ok(None)` if it is held (by another client, or
    /// by another task of this client). Ignores [`LockOptions::wait`].
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] and [`LockError::InvalidConfig`] before any network I/O;
    /// [`LockError::Unavailable`] when the server cannot be reached; [`LockError::Backend`]
    /// when it refuses.
    async fn try_acquire(&self, key: &str, opts: &LockOptions) -> Result<Option<Lease>>;

    /// Take `key`, waiting for it as long as [`LockOptions::wait`] allows. Waiters are woken
    /// by the server where the backend supports it ([`Capabilities::wakeup`]).
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire), plus [`LockError::Timeout`] when the wait ran
    /// out with the key still held.
    ///
    /// # Cancel safety
    /// Dropping the future while it waits removes whatever the wait had placed on the server
    /// (a queued node, a waiting query) and delays nobody.
    async fn acquire(&self, key: &str, opts: &LockOptions) -> Result<Lease>;

    /// Who holds `key` and who waits for it, read from the server without taking,
    /// queueing or changing anything. [`Capabilities::inspect`] says what a backend shows
    /// beyond the holders.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] before any network I/O; [`LockError::Unavailable`] when
    /// the server cannot be reached; [`LockError::Backend`] when it refuses (for example a
    /// user not allowed to read what shows the holders).
    async fn inspect(&self, key: &str) -> Result<KeyStatus>;

    /// The keys starting with `prefix` that are held now, sorted; an empty prefix lists
    /// every held key of this client's namespace. Read-only, as
    /// [`inspect`](Self::inspect).
    ///
    /// # Errors
    /// [`LockError::Unsupported`], before any network I/O, where the backend cannot
    /// enumerate its keys ([`Inspection::list`]); [`LockError::InvalidKey`] for a prefix
    /// with a NUL byte or longer than a key; otherwise as [`inspect`](Self::inspect).
    async fn list(&self, prefix: &str) -> Result<Vec<String>>;

    /// Take `key` as an election candidate publishing `value`: the building block of
    /// [`Election::campaign`], which applications use instead.
    ///
    /// # Errors
    /// As [`Election::campaign`].
    async fn campaign(&self, key: &str, value: &str, opts: &LockOptions) -> Result<Lease>;

    /// The leader of the election on `key`: the building block of [`Election::leader`].
    ///
    /// # Errors
    /// As [`Election::leader`].
    async fn leader(&self, key: &str) -> Result<Option<Leader>>;

    /// A stream that yields whenever the leader of `key` may have changed, woken by the
    /// server, or `None` where observers poll: the building block of
    /// [`Election::observe`].
    ///
    /// # Errors
    /// A bad key before any I/O; the subscription's failure.
    async fn leader_changes(
        &self,
        key: &str,
    ) -> Result<Option<futures::stream::BoxStream<'static, Result<()>>>>;
}

/// Counters a client keeps, for metrics and the conformance suite's herd check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockStats {
    /// Times a waiting acquire was woken to re-check the key (by a notification or a timer).
    pub wakeups: u64,
}

impl LockStats {
    /// Counters with the given wake-up count.
    pub fn with_wakeups(wakeups: u64) -> Self {
        Self { wakeups }
    }
}

/// Conveniences on every [`DistributedLock`].
pub trait LockExt: DistributedLock {
    /// Run `work` under `key`: acquire, run it with the fencing token, release.
    ///
    /// If the lease is lost before `work` finishes, `work` is dropped (cancelled at its next
    /// `.await`) and the result is [`LockError::LeaseLost`].
    fn with_lock<T, F, Fut>(
        &self,
        key: &str,
        opts: &LockOptions,
        work: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(u64) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let lease = self.acquire(key, opts).await?;
            let out = tokio::select! {
                reason = lease.lost() => {
                    return Err(LockError::LeaseLost {
                        backend: self.backend_name(),
                        key: key.to_owned(),
                        reason,
                    });
                }
                out = work(lease.fencing_token()) => out,
            };
            lease.release().await?;
            Ok(out)
        }
    }

    /// Take every key of `keys` as one hold: all of them, or none, within one
    /// [`LockOptions::wait`] for the whole set. `opts` applies to each key (ttl, mode,
    /// auto-renew); a key named twice is taken once.
    ///
    /// The keys are taken one by one in ascending byte order, whatever the order given, so
    /// callers whose sets overlap never deadlock; while the set is being taken, its keys
    /// taken so far are held. When a key stays busy past the wait, or fails, the keys
    /// taken before it are released before the call returns. A set whose earlier key was
    /// lost while a later one was waited for is not handed out: it is given back and taken
    /// again, after a short pause, while the wait allows (not with [`Wait::No`]; and not
    /// without auto-renew, where the key ran out its ttl: [`LockError::LeaseLost`]). Each key keeps its backend's promises (fencing token,
    /// lost signal, crash bound) as a lease of its own.
    ///
    /// # Errors
    /// Every key and the options are checked first, as [`DistributedLock::validate`] does:
    /// a bad key anywhere, or an empty set ([`LockError::InvalidKey`]), is refused before
    /// any key is taken. [`LockError::Timeout`] names the key that stayed busy (or was lost
    /// before the set was complete) and counts the whole wait. Otherwise the first error of [`DistributedLock::acquire`].
    ///
    /// # Cancel safety
    /// Dropping the future releases the keys taken so far in the background (as dropped
    /// leases are; [`settle`] waits for them), and the key being waited for as
    /// [`DistributedLock::acquire`] says.
    fn acquire_all<K>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> impl Future<Output = Result<LeaseSet>> + Send
    where
        K: AsRef<str> + Sync,
    {
        async move {
            let started = tokio::time::Instant::now();
            match lease_set::take_all(self, keys, opts, false).await? {
                Ok(set) => Ok(set),
                Err(key) => Err(LockError::Timeout {
                    backend: self.backend_name(),
                    key,
                    waited: started.elapsed(),
                }),
            }
        }
    }

    /// Take every key of `keys` if all are free right now: `Ok(None)`, with nothing held,
    /// if any of them is held. Ignores [`LockOptions::wait`]. See
    /// [`acquire_all`](Self::acquire_all).
    ///
    /// # Errors
    /// As [`acquire_all`](Self::acquire_all), without `Timeout`.
    fn try_acquire_all<K>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> impl Future<Output = Result<Option<LeaseSet>>> + Send
    where
        K: AsRef<str> + Sync,
    {
        async move { Ok(lease_set::take_all(self, keys, opts, true).await?.ok()) }
    }
}

impl<L: DistributedLock + ?Sized> LockExt for L {}
