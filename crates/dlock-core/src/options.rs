//! What a caller asks for when it takes a lock.

use std::time::Duration;

use crate::{LockError, Result};

/// How long [`acquire`](crate::DistributedLock::acquire) may wait for a busy key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Wait {
    /// Try once; a busy key is an immediate [`LockError::Timeout`].
    No,
    /// Wait up to this long, measured from the call (connecting and every retry included).
    For(Duration),
    /// Wait until the key is free, however long that takes.
    #[default]
    Forever,
}

/// How a hold shares its key with other holds.
///
/// ```
/// use dlock_core::{LockOptions, Mode};
///
/// assert_eq!(LockOptions::new().mode, Mode::Exclusive);
/// assert_eq!(LockOptions::new().shared().mode, Mode::Shared);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Mode {
    /// The only hold on the key: the mutex, a writer. Its fencing token is greater than
    /// every token handed out on the key before it, shared or exclusive.
    #[default]
    Exclusive,
    /// One of any number of shared holds (readers) that exclude exclusive ones. Backends
    /// that take shared holds say so in
    /// [`Capabilities::shared`](crate::Capabilities::shared); elsewhere a shared acquire
    /// fails with [`LockError::Unsupported`] before any network I/O.
    Shared,
}

impl Mode {
    /// `"exclusive"` or `"shared"`, as logs and the CLI write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
        }
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Options for one acquisition.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::{LockOptions, Wait};
///
/// let opts = LockOptions::new()
///     .ttl(Duration::from_secs(10))
///     .wait(Wait::For(Duration::from_secs(2)));
/// assert!(opts.auto_renew);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockOptions {
    /// How long the server keeps the lease alive without a renewal. When a holder crashes,
    /// this bounds how long the key stays taken (on session-based backends the session
    /// timeout plays this part; see [`Capabilities::expiry`](crate::Capabilities::expiry)).
    /// Default 30 s.
    pub ttl: Duration,
    /// How long `acquire` may wait. Default [`Wait::Forever`]. `try_acquire` ignores it.
    pub wait: Wait,
    /// Renew the lease every `ttl / 3` until it is released. Default on. Without it the
    /// lease ends `ttl` after it was granted (or last [extended](crate::Lease::extend)).
    pub auto_renew: bool,
    /// Exclusive (the default) or shared. See [`Mode`].
    pub mode: Mode,
}

impl LockOptions {
    /// The default time-to-live: 30 s, as Redisson's watchdog and the .NET DistributedLock.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30);
    /// The smallest accepted ttl. Shorter leases cannot be renewed reliably over a network.
    pub const MIN_TTL: Duration = Duration::from_millis(100);
    /// The largest accepted ttl (one day).
    pub const MAX_TTL: Duration = Duration::from_secs(24 * 60 * 60);

    /// The defaults: ttl 30 s, wait forever, auto-renew on, exclusive.
    pub fn new() -> Self {
        Self {
            ttl: Self::DEFAULT_TTL,
            wait: Wait::Forever,
            auto_renew: true,
            mode: Mode::Exclusive,
        }
    }

    /// Set [`ttl`](Self::ttl).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// Set [`wait`](Self::wait).
    pub fn wait(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// Set [`auto_renew`](Self::auto_renew).
    pub fn auto_renew(mut self, on: bool) -> Self {
        self.auto_renew = on;
        self
    }

    /// Set [`mode`](Self::mode).
    pub fn mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// A shared hold (a reader): [`Mode::Shared`].
    pub fn shared(self) -> Self {
        self.mode(Mode::Shared)
    }

    /// Check the values are in range. Called before any network I/O.
    pub fn validate(&self, backend: &'static str) -> Result<()> {
        check_ttl(backend, self.ttl)
    }
}

/// Check a ttl is within [`LockOptions::MIN_TTL`] and [`LockOptions::MAX_TTL`].
pub(crate) fn check_ttl(backend: &'static str, ttl: Duration) -> Result<()> {
    if ttl < LockOptions::MIN_TTL || ttl > LockOptions::MAX_TTL {
        return Err(LockError::invalid_config(
            backend,
            format!(
                "ttl {ttl:?} is out of range: it must be between {:?} and {:?}",
                LockOptions::MIN_TTL,
                LockOptions::MAX_TTL
            ),
        ));
    }
    Ok(())
}

impl Default for LockOptions {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn out_of_range_ttl_is_invalid_config() {
        for ttl in [
            Duration::ZERO,
            Duration::from_millis(99),
            Duration::from_secs(90_000),
        ] {
            let err = LockOptions::new().ttl(ttl).validate("memory").unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidConfig, "{ttl:?}");
        }
        LockOptions::new().validate("memory").unwrap();
    }
}
