//! What a caller asks for when it takes a lock.

use std::time::Duration;

use crate::{LockError, Owner, Result};

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
/// A key is used one way: as a lock (exclusive holds, and shared ones for a read-write
/// lock) or as a semaphore (permits). What a permit hold and a lock hold on the same key
/// make of each other is backend-specific and not checked (on ZooKeeper, as with Curator's
/// recipes, they do not see each other at all).
///
/// ```
/// use dlock_core::{LockOptions, Mode};
///
/// assert_eq!(LockOptions::new().mode, Mode::Exclusive);
/// assert_eq!(LockOptions::new().shared().mode, Mode::Shared);
/// assert_eq!(LockOptions::new().permits(5).mode, Mode::Permits(5));
/// assert_eq!("permits(5)".parse::<Mode>().unwrap(), Mode::Permits(5));
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
    /// One of this many permits (a counting semaphore): at most that many holds of the key
    /// at once, each with its own lease. Each acquire counts
    /// the holders against its own limit, as Curator's `InterProcessSemaphoreV2` does, so
    /// clients must agree on it: one asking for `Permits(3)` gets in beside two holders
    /// of `Permits(2)`. With disagreeing limits, how exactly holds of a larger limit count
    /// toward a smaller one is backend-specific (a slot-per-permit backend sees only the
    /// slots below its own limit), and on every backend but Redlock never more holders than
    /// the largest limit in use hold the key at once (Redlock's quorums, computed from each
    /// caller's own limit, do not bound mixed limits; see `dlock-redlock`). `Permits(1)`
    /// excludes like a mutex. On a backend with [strict](crate::Fencing::Strict) fencing a
    /// permit's fencing token is unique on the key and never smaller than an earlier one's;
    /// elsewhere, as for the mutex, as far as [`Capabilities::fencing`](crate::Capabilities::fencing) says. Backends
    /// that take permits say so in
    /// [`Capabilities::permits`](crate::Capabilities::permits); elsewhere the acquire
    /// fails with [`LockError::Unsupported`] before any network I/O. The limit must be
    /// between 1 and [`Mode::MAX_PERMITS`].
    Permits(u32),
}

impl Mode {
    /// The largest accepted [`Mode::Permits`] limit.
    pub const MAX_PERMITS: u32 = 10_000;

    /// `"exclusive"`, `"shared"` or `"permits"`: the kind of hold, as logs and the CLI
    /// write it (the limit is in the [`Display`](std::fmt::Display) form).
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Exclusive => "exclusive",
            Mode::Shared => "shared",
            Mode::Permits(_) => "permits",
        }
    }

    /// The permit limit of a [`Mode::Permits`] hold.
    pub fn permits(self) -> Option<u32> {
        match self {
            Mode::Permits(n) => Some(n),
            _ => None,
        }
    }

    /// Whether other holds may share the key with this one (shared holds and permits).
    pub fn is_shared(self) -> bool {
        self != Mode::Exclusive
    }
}

/// `exclusive`, `shared` or `permits(N)`; [`FromStr`](std::str::FromStr) reads the same.
impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Mode::Permits(n) => write!(f, "permits({n})"),
            other => f.write_str(other.as_str()),
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = LockError;

    fn from_str(s: &str) -> Result<Self> {
        let permits = s
            .strip_prefix("permits(")
            .and_then(|rest| rest.strip_suffix(')'))
            .map(str::parse::<u32>);
        match (s, permits) {
            ("exclusive", _) => Ok(Mode::Exclusive),
            ("shared", _) => Ok(Mode::Shared),
            (_, Some(Ok(n))) => Ok(Mode::Permits(n)),
            _ => Err(LockError::invalid_config(
                "dlock",
                format!("mode {s:?} is not one of exclusive, shared, permits(N)"),
            )),
        }
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
    /// The owner of a reentrant hold, or `None` (the default: an acquire of a key this
    /// caller already holds waits for it like any other). See [`Owner`] and
    /// [`Capabilities::reentrant`](crate::Capabilities::reentrant).
    pub owner: Option<Owner>,
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
            owner: None,
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

    /// One of `n` permits (a semaphore): [`Mode::Permits`].
    pub fn permits(self, n: u32) -> Self {
        self.mode(Mode::Permits(n))
    }

    /// A reentrant hold of owner `id`: see [`Owner`]. The id is checked by the acquire.
    pub fn owner(mut self, id: &str) -> Self {
        self.owner = Some(Owner::new(id));
        self
    }

    /// Check the values are in range. Called before any network I/O.
    pub fn validate(&self, backend: &'static str) -> Result<()> {
        check_ttl(backend, self.ttl)?;
        if let Some(owner) = &self.owner {
            owner.check(backend)?;
        }
        if let Mode::Permits(n) = self.mode
            && !(1..=Mode::MAX_PERMITS).contains(&n)
        {
            return Err(LockError::invalid_config(
                backend,
                format!(
                    "permits {n} is out of range: it must be between 1 and {}",
                    Mode::MAX_PERMITS
                ),
            ));
        }
        Ok(())
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

    #[test]
    fn out_of_range_permits_are_invalid_config() {
        for n in [0, Mode::MAX_PERMITS + 1] {
            let err = LockOptions::new()
                .permits(n)
                .validate("memory")
                .unwrap_err();
            assert_eq!(err.kind(), crate::ErrorKind::InvalidConfig, "{n}");
        }
        for n in [1, Mode::MAX_PERMITS] {
            LockOptions::new().permits(n).validate("memory").unwrap();
        }
    }

    #[test]
    fn modes_read_back_what_they_display() {
        for mode in [Mode::Exclusive, Mode::Shared, Mode::Permits(7)] {
            assert_eq!(mode.to_string().parse::<Mode>().unwrap(), mode);
        }
        for bad in ["", "permits", "permits(x)", "permits(-1)", "Shared"] {
            assert!(bad.parse::<Mode>().is_err(), "{bad:?}");
        }
    }
}
