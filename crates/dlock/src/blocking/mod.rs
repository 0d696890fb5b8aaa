//! The same locks for code that is not async: threads, CLI tools, build scripts.
//!
//! ```
//! use std::time::Duration;
//! use dlock::{LockOptions, Wait};
//!
//! # fn main() -> dlock::Result<()> {
//! let lock = dlock::blocking::connect("memory://")?; // or redis://…, zk://…, etcd://…
//! let opts = LockOptions::new().ttl(Duration::from_secs(10)).wait(Wait::For(Duration::from_secs(2)));
//! let lease = lock.acquire("invoices/2026-11", &opts)?;
//! println!("holding {} with fencing token {}", lease.key(), lease.fencing_token());
//! lease.release()?;
//! # Ok(()) }
//! ```
//!
//! [`connect`] gives a [`Client`] with every operation of the async
//! [`DistributedLock`], each of which blocks the calling thread until
//! it is done; a [`Lease`] has the async lease's operations, and a blocking
//! [`wait_lost`](Lease::wait_lost) in place of the `lost()` future; several keys at once
//! ([`acquire_all`](Client::acquire_all)), looking ([`inspect`](Client::inspect),
//! [`list`](Client::list)) and elections ([`campaign`](Client::campaign), a
//! [`Leadership`]; [`leader`](Client::leader)) are here too. Modes come through the
//! options as they do in the async API: [`LockOptions::shared`](crate::LockOptions::shared),
//! [`LockOptions::permits`](crate::LockOptions::permits).
//!
//! # How it runs
//!
//! A [`Client`] owns a small tokio runtime with one worker thread (named `dlock-blocking`),
//! as `reqwest::blocking` does. Renewal, the lost signal and the background release of a
//! dropped lease run there, so a lease stays renewed while the caller's thread is busy
//! with the work the lock protects. Clones of a client, and the leases it handed out,
//! share that runtime; so do the threads a cloned client is sent to.
//!
//! When the last clone of a client and the last of its leases are dropped, the runtime
//! first waits for the background clean-up started so far ([`settle`](crate::settle): the
//! release of dropped leases, the withdrawal of cancelled waits), at most
//! [`SHUTDOWN_SETTLE`] (5 s), then stops its thread. So a program that drops its client and
//! returns from `main` leaves nothing behind on the server. A drop that happens inside an
//! async context (where blocking is not allowed) hands that wait to a thread of its own
//! instead of waiting.
//!
//! # Inside an async context
//!
//! Blocking a thread that runs async tasks stalls them, or deadlocks. So every blocking
//! call made from a thread inside a tokio runtime (a task, a `#[tokio::main]` body, a
//! `spawn_blocking` closure, or under `Runtime::enter`) does nothing and returns
//! [`LockError::Unsupported`] (its backend is [`ORIGIN`]): use the async API
//! ([`crate::connect`]) there. The calls that only read local state (`key`,
//! `fencing_token`, `is_lost`, `capabilities`, `wait_lost(Duration::ZERO)`, …) answer
//! anywhere; dropping a lease or a client never blocks there (see above).
//!
//! # Feature
//!
//! This module is the cargo feature `blocking`, on by default: it needs no dependency that
//! the async API does not already bring (tokio, tracing). `default-features = false` drops
//! it (list the backend features you want then).
//!
//! # Backends
//!
//! Every backend of [`connect`](crate::connect) works the same way; only the URL changes.
//! A cron job that must not run twice, on Redis:
//!
//! ```no_run
//! # fn main() -> dlock::Result<()> {
//! let lock = dlock::blocking::connect("redis://127.0.0.1:6379")?;
//! match lock.try_acquire("cron/nightly-report", &dlock::LockOptions::new())? {
//!     Some(lease) => { /* run the report */ lease.release()? }
//!     None => eprintln!("another instance is running it"),
//! }
//! # Ok(()) }
//! ```
//!
//! Redlock over five independent Redis nodes, waiting up to 10 s:
//!
//! ```no_run
//! # fn main() -> dlock::Result<()> {
//! use std::time::Duration;
//! let lock = dlock::blocking::connect("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379,10.0.0.4:6379,10.0.0.5:6379")?;
//! let opts = dlock::LockOptions::new().wait(dlock::Wait::For(Duration::from_secs(10)));
//! let lease = lock.acquire("payments/settle", &opts)?;
//! lease.release()?;
//! # Ok(()) }
//! ```
//!
//! A pool of worker threads on ZooKeeper, one client shared by clones:
//!
//! ```no_run
//! # fn main() -> dlock::Result<()> {
//! let lock = dlock::blocking::connect("zk://10.0.0.1:2181,10.0.0.2:2181/app")?;
//! let workers: Vec<_> = (0..4)
//!     .map(|n| {
//!         let lock = lock.clone();
//!         std::thread::spawn(move || -> dlock::Result<()> {
//!             let lease = lock.acquire(&format!("shard/{n}"), &dlock::LockOptions::new())?;
//!             // ... work on the shard while the session keeps the lock ...
//!             lease.release()
//!         })
//!     })
//!     .collect();
//! for worker in workers {
//!     worker.join().expect("worker panicked")?;
//! }
//! # Ok(()) }
//! ```
//!
//! Readers and a writer on etcd:
//!
//! ```no_run
//! # fn main() -> dlock::Result<()> {
//! let lock = dlock::blocking::connect("etcd://127.0.0.1:2379")?;
//! let reader = lock.acquire("catalog", &dlock::LockOptions::new().shared())?;
//! reader.release()?;
//! # Ok(()) }
//! ```
//!
//! A semaphore of three permits on MySQL or MariaDB, extending a long job's lease by hand:
//!
//! ```no_run
//! # fn main() -> dlock::Result<()> {
//! use std::time::Duration;
//! let lock = dlock::blocking::connect("mysql://app:secret@db.internal:3306/app")?;
//! let opts = dlock::LockOptions::new().permits(3).auto_renew(false).ttl(Duration::from_secs(60));
//! let lease = lock.acquire("exports", &opts)?;
//! lease.extend(Duration::from_secs(120))?;
//! lease.release()?;
//! # Ok(()) }
//! ```
//!
//! Stopping the work when the lease is lost, on PostgreSQL:
//!
//! ```no_run
//! # fn main() -> dlock::Result<()> {
//! use std::time::Duration;
//! let lock = dlock::blocking::connect("postgres://app:secret@db.internal:5432/app")?;
//! let lease = lock.acquire("migrations", &dlock::LockOptions::new())?;
//! for step in 0..10 {
//!     if let Some(reason) = lease.wait_lost(Duration::ZERO)? {
//!         eprintln!("stopped at step {step}: {reason}");
//!         return Ok(());
//!     }
//!     // ... one step, passing lease.fencing_token() to storage that checks it ...
//! }
//! lease.release()
//! # }
//! ```

mod leadership;
mod runtime;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use crate::{
    Capabilities, DistributedLock, Election, KeyStatus, Leader, LockExt as _, LockOptions,
    LockStats, LostReason, Mode, Result,
};

#[cfg(doc)]
use crate::LockError;
pub use leadership::Leadership;
use runtime::Background;
pub use runtime::{ORIGIN, SHUTDOWN_SETTLE};

/// Connect to the lock service a URL names, as [`crate::connect`] does, and start the
/// client's background runtime.
///
/// # Errors
/// As [`crate::connect`]; [`LockError::Unsupported`] when called inside an async context
/// (see the [module docs](self)).
pub fn connect(url: &str) -> Result<Client> {
    let background = Background::start()?;
    let lock = background.run(crate::connect(url))??;
    Ok(Client {
        inner: Arc::new(ClientInner {
            lock: Some(lock),
            background,
        }),
    })
}

/// A blocking lock client. Cheap to clone; clones share one connection and one background
/// runtime, and can be sent to other threads.
#[derive(Clone)]
pub struct Client {
    inner: Arc<ClientInner>,
}

struct ClientInner {
    /// `None` only while dropping.
    lock: Option<Arc<dyn DistributedLock>>,
    background: Arc<Background>,
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        // Inside the runtime's context: a backend may spawn the closing of its connection.
        let _context = self.background.enter();
        drop(self.lock.take());
    }
}

impl Client {
    fn lock(&self) -> &Arc<dyn DistributedLock> {
        self.inner
            .lock
            .as_ref()
            .expect("the lock is present until the client is dropped")
    }

    /// The backend's short name, e.g. `"redis"`.
    pub fn backend_name(&self) -> &'static str {
        self.lock().backend_name()
    }

    /// What this backend promises.
    pub fn capabilities(&self) -> Capabilities {
        self.lock().capabilities()
    }

    /// Counters since this client was created.
    pub fn stats(&self) -> LockStats {
        self.lock().stats()
    }

    /// Take `key` if it is free right now; `Ok(None)` if it is held (by another client, or
    /// by another thread using this client). Ignores [`LockOptions::wait`].
    ///
    /// # Errors
    /// As [`DistributedLock::try_acquire`]; [`LockError::Unsupported`] inside an async
    /// context.
    pub fn try_acquire(&self, key: &str, opts: &LockOptions) -> Result<Option<Lease>> {
        let lease = self
            .inner
            .background
            .run(self.lock().try_acquire(key, opts))??;
        Ok(lease.map(|lease| self.wrap(lease)))
    }

    /// Take `key`, blocking as long as [`LockOptions::wait`] allows. Waiters are woken by
    /// the server where the backend supports it.
    ///
    /// # Errors
    /// As [`DistributedLock::acquire`] ([`LockError::Timeout`] when the wait ran out);
    /// [`LockError::Unsupported`] inside an async context.
    pub fn acquire(&self, key: &str, opts: &LockOptions) -> Result<Lease> {
        let lease = self
            .inner
            .background
            .run(self.lock().acquire(key, opts))??;
        Ok(self.wrap(lease))
    }

    /// Take every key of `keys` as one hold, all or none, within one
    /// [`LockOptions::wait`]: one lease per key, in the (ascending) order they were taken.
    /// See [`LockExt::acquire_all`](crate::LockExt::acquire_all) for the order and the
    /// all-or-none rules; release each lease (or drop them) when done.
    ///
    /// # Errors
    /// As [`LockExt::acquire_all`](crate::LockExt::acquire_all); [`LockError::Unsupported`]
    /// inside an async context.
    pub fn acquire_all<K: AsRef<str> + Sync>(
        &self,
        keys: &[K],
        opts: &LockOptions,
    ) -> Result<Vec<Lease>> {
        let lock = self.lock();
        let set = self
            .inner
            .background
            .run(lock.as_ref().acquire_all(keys, opts))??;
        Ok(set
            .into_leases()
            .into_iter()
            .map(|l| self.wrap(l))
            .collect())
    }

    /// Who holds `key` and who waits for it, read without changing anything; see
    /// [`DistributedLock::inspect`].
    ///
    /// # Errors
    /// As [`DistributedLock::inspect`]; [`LockError::Unsupported`] inside an async context.
    pub fn inspect(&self, key: &str) -> Result<KeyStatus> {
        self.inner.background.run(self.lock().inspect(key))?
    }

    /// The held keys starting with `prefix`, sorted; see [`DistributedLock::list`].
    ///
    /// # Errors
    /// As [`DistributedLock::list`]; [`LockError::Unsupported`] inside an async context.
    pub fn list(&self, prefix: &str) -> Result<Vec<String>> {
        self.inner.background.run(self.lock().list(prefix))?
    }

    /// Campaign in `key`'s election publishing `value`, blocking until this candidate
    /// leads (within `opts.wait`, which must be exclusive); see
    /// [`Election::campaign`](crate::Election::campaign).
    ///
    /// # Errors
    /// As [`Election::campaign`](crate::Election::campaign); [`LockError::Unsupported`]
    /// inside an async context.
    pub fn campaign(&self, key: &str, value: &str, opts: &LockOptions) -> Result<Leadership> {
        let election = Election::new(self.lock().clone(), key).options(*opts);
        let leading = self
            .inner
            .background
            .run(async move { election.campaign(value).await })??;
        Ok(Leadership::new(leading, self.inner.background.clone()))
    }

    /// Who leads `key`'s election now, or `None`; see
    /// [`Election::leader`](crate::Election::leader).
    ///
    /// # Errors
    /// As [`Election::leader`](crate::Election::leader); [`LockError::Unsupported`] inside
    /// an async context.
    pub fn leader(&self, key: &str) -> Result<Option<Leader>> {
        self.inner.background.run(self.lock().leader(key))?
    }

    /// Wait until the background clean-up started so far (releases of dropped leases,
    /// withdrawn waits) has finished, at most `limit`; `true` when nothing is left. See
    /// [`crate::settle`]. Dropping the last client does this on its own, for at most
    /// [`SHUTDOWN_SETTLE`].
    ///
    /// # Errors
    /// [`LockError::Unsupported`] inside an async context.
    pub fn settle(&self, limit: Duration) -> Result<bool> {
        self.inner.background.run(crate::settle(limit))
    }

    fn wrap(&self, lease: crate::Lease) -> Lease {
        Lease {
            inner: Some(lease),
            background: self.inner.background.clone(),
        }
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").field("lock", self.lock()).finish()
    }
}

/// A key held on a lock server: the blocking face of [`crate::Lease`].
///
/// While it lives (and auto-renew is on) the client's background runtime renews it every
/// `ttl / 3`, whatever the caller's thread is doing. Give it back with
/// [`release`](Lease::release). Dropping it without `release` releases it in the background
/// and never blocks; the last client (or lease) dropped waits for that release, bounded by
/// [`SHUTDOWN_SETTLE`].
#[must_use = "a Lease dropped at once releases the key at once: bind it (`let lease = …`) for as long as the work needs the key"]
pub struct Lease {
    /// `None` only once released or while dropping.
    inner: Option<crate::Lease>,
    background: Arc<Background>,
}

impl Lease {
    fn lease(&self) -> &crate::Lease {
        self.inner
            .as_ref()
            .expect("the lease is present until released or dropped")
    }

    /// The key this lease holds.
    pub fn key(&self) -> &str {
        self.lease().key()
    }

    /// Exclusive, shared or one of N permits, as asked for in [`LockOptions::mode`].
    pub fn mode(&self) -> Mode {
        self.lease().mode()
    }

    /// The fencing token of this grant; see [`crate::Lease::fencing_token`].
    pub fn fencing_token(&self) -> u64 {
        self.lease().fencing_token()
    }

    /// Whether the lease is known to be lost. Never blocks.
    pub fn is_lost(&self) -> bool {
        self.lease().is_lost()
    }

    /// Block until the lease is lost, at most `timeout`: `Some(reason)` once it is lost,
    /// `None` if it was still kept when `timeout` ran out. `Duration::ZERO` only looks, and
    /// answers anywhere, an async context included.
    ///
    /// The loss is known before the server can give the key to another client: when
    /// renewals keep failing, at the last instant the server may still consider the lease
    /// alive, less a safety margin (see [`crate::Lease::lost`]).
    ///
    /// # Errors
    /// [`LockError::Unsupported`] inside an async context, unless `timeout` is zero.
    pub fn wait_lost(&self, timeout: Duration) -> Result<Option<LostReason>> {
        wait_lost(&self.background, self.lease(), timeout)
    }

    /// Keep the key for `ttl` from now, and use `ttl` for later renewals.
    ///
    /// # Errors
    /// As [`crate::Lease::extend`] ([`LockError::NotHeld`] once the lease is lost);
    /// [`LockError::Unsupported`] inside an async context.
    pub fn extend(&self, ttl: Duration) -> Result<()> {
        self.background.run(self.lease().extend(ttl))?
    }

    /// Give the key back. Renewal stops before the release goes out; the release is
    /// owner-checked on the server.
    ///
    /// # Errors
    /// As [`crate::Lease::release`]; [`LockError::Unsupported`] inside an async context
    /// (the lease is then released in the background, as when dropped).
    pub fn release(mut self) -> Result<()> {
        // Refused before the lease is taken out, so a refused release falls back to Drop.
        self.background.check_blocking_allowed()?;
        let lease = self.inner.take().expect("present until released");
        self.background.run(lease.release())?
    }
}

/// Block until `lease` is lost, at most `timeout` (see [`Lease::wait_lost`]).
fn wait_lost(
    background: &Background,
    lease: &crate::Lease,
    timeout: Duration,
) -> Result<Option<LostReason>> {
    let mut signal = lease.lost_signal();
    if timeout.is_zero() {
        // The status is read before the first await: one poll answers.
        let looked = std::pin::pin!(signal.lost()).poll(&mut Context::from_waker(Waker::noop()));
        return Ok(match looked {
            Poll::Ready(reason) => reason,
            Poll::Pending => None,
        });
    }
    background.run(async move {
        tokio::time::timeout(timeout, signal.lost())
            .await
            .ok()
            .flatten()
    })
}

impl Drop for Lease {
    fn drop(&mut self) {
        // The async lease spawns its release on the current runtime: make it ours.
        let _context = self.background.enter();
        drop(self.inner.take());
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Some(lease) => fmt::Debug::fmt(lease, f),
            None => f.write_str("Lease(released)"),
        }
    }
}
