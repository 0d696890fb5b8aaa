//! What a backend promises, declared once and checked by the conformance suite.

use std::time::Duration;

use crate::Inspection;

/// The promises a backend makes.
///
/// A backend states them in one literal ending in `..Default::default()`; the default
/// promises nothing beyond the core contract. The conformance suite reads these and checks
/// the declared behaviour (for example FIFO order when `fair`, plain exclusion otherwise).
///
/// ```
/// use dlock_core::{Capabilities, Fencing, Wakeup};
///
/// let caps = Capabilities {
///     fencing: Fencing::Strict,
///     wakeup: Wakeup::Notification { one_per_release: true, max_per_waiter: 1 },
///     ..Default::default()
/// };
/// assert!(!caps.fair);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Waiters from different clients acquire in the order they started waiting.
    pub fair: bool,
    /// How far fencing tokens can be trusted.
    pub fencing: Fencing,
    /// How a holder that stops talking to the server loses the key.
    pub expiry: Expiry,
    /// The server frees the key as soon as the holder's connection closes (a killed process
    /// frees its locks at once).
    pub releases_on_disconnect: bool,
    /// How waiters learn that a key was released.
    pub wakeup: Wakeup,
    /// Longest accepted key, in bytes. Longer keys are rejected with
    /// [`InvalidKey`](crate::LockError::InvalidKey) before any network I/O.
    pub max_key_len: usize,
    /// What exclusion survives of a paused holder and of server failures. The torture run
    /// (`crates/dlock-torture`) injects each fault and checks what is declared here.
    pub faults: Faults,
    /// How many keys one client can hold at once, when something smaller than memory bounds
    /// it (for example one server connection per held key); `None` when only memory does.
    /// Taking one more fails with a clear error that names the limit and the option that
    /// raises it. The conformance suite's many-holds scenario scales down to this.
    pub max_held: Option<usize>,
    /// The backend takes [shared](crate::Mode::Shared) holds beside exclusive ones (a
    /// read-write lock): any number of shared holders together, an exclusive holder alone,
    /// and shared requests that arrive while an exclusive one waits queue behind it, so a
    /// stream of readers cannot starve a writer. Without it a shared acquire fails with
    /// [`Unsupported`](crate::LockError::Unsupported) before any network I/O.
    pub shared: bool,
    /// The backend takes [permits](crate::Mode::Permits) (a counting semaphore): never more
    /// holders of a key at once than the limit each of them asked for, a crashed holder's
    /// permit back within [`crash_release_bound`](Self::crash_release_bound), and a waiter
    /// let in when a permit frees. Without it a permit acquire fails with
    /// [`Unsupported`](crate::LockError::Unsupported) before any network I/O.
    pub permits: bool,
    /// What [`inspect`](crate::DistributedLock::inspect) shows (every backend shows the
    /// holders of a key) and whether [`list`](crate::DistributedLock::list) works.
    pub inspect: Inspection,
    /// Whether the backend runs [elections](crate::Election), and how observers learn of
    /// a new leader.
    pub election: Observe,
    /// Whether the backend takes reentrant holds ([`LockOptions::owner`](crate::LockOptions::owner)),
    /// and what keeps such a hold alive.
    pub reentrant: Reentry,
}

impl Capabilities {
    /// Longest key accepted unless a backend says otherwise.
    pub const DEFAULT_MAX_KEY_LEN: usize = 1024;

    /// How long after a holder's process dies the key is free again at the latest, for a
    /// lease taken with `ttl`.
    pub fn crash_release_bound(&self, ttl: Duration) -> Duration {
        if self.releases_on_disconnect {
            return Duration::ZERO;
        }
        match self.expiry {
            Expiry::Ttl => ttl,
            Expiry::Session { timeout } => timeout,
        }
    }
}

impl Default for Capabilities {
    fn default() -> Self {
        Self {
            fair: false,
            fencing: Fencing::None,
            expiry: Expiry::Ttl,
            releases_on_disconnect: false,
            wakeup: Wakeup::Polling,
            max_key_len: Self::DEFAULT_MAX_KEY_LEN,
            faults: Faults::default(),
            max_held: None,
            shared: false,
            permits: false,
            inspect: Inspection::default(),
            election: Observe::Unsupported,
            reentrant: Reentry::Unsupported,
        }
    }
}

/// Whether a backend takes reentrant holds ([`Owner`](crate::Owner)), and what keeps one
/// alive.
///
/// Where it does, an acquire under an owner that already holds the key (from this client,
/// another client or another process) succeeds at once with the hold's fencing token and
/// raises the hold's count, kept atomically on the server; each release lowers it, and the
/// key frees when the count reaches zero. Every owner-checked step compares the owner and
/// the hold itself, so a lease of an earlier hold of the same owner can never lower the
/// count of a later one ([`NotHeld`](crate::LockError::NotHeld)). The owner's leases of
/// one hold in one client are lost together: the first of them to learn of the loss tells
/// the others. An owner's release is sent once: one whose future is dropped after it was
/// sent is not repeated (a repeat could lower the count twice), so if it did not reach the
/// server its entry keeps the key until the hold ends. Reentrant holds are
/// exclusive: an owner with a shared or permit mode, or on a campaign, is refused before
/// any I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reentry {
    /// No reentrant holds: an acquire with an owner fails with
    /// [`Unsupported`](crate::LockError::Unsupported) before any I/O.
    #[default]
    Unsupported,
    /// The hold and its count live on the server under a ttl that every lease of the owner
    /// renews: the key stays held while any of them lives, in whichever client or
    /// process, and frees a ttl after the last renewal when the count never reaches zero
    /// (a crashed process's entries are never released). A restarted process with the
    /// same owner id can re-enter a hold its previous run left, within the ttl, and carry
    /// on under it; it cannot release the previous run's entries.
    AnyLease,
    /// The hold lives in the session (or connection) of the client that took it first:
    /// the count lives on the server beside it, but when that client closes or crashes,
    /// the key frees whatever the count, within
    /// [`crash_release_bound`](Capabilities::crash_release_bound). The owner's leases in
    /// other clients learn it at their next check, a third of their ttl at the latest,
    /// which may be after another owner took the key: fence what they write. The first
    /// client keeps the hold (and its session) after its own leases are released, while
    /// other clients' leases still count.
    FirstSession,
}

impl Reentry {
    /// Whether the backend takes reentrant holds at all.
    pub fn is_supported(self) -> bool {
        self != Reentry::Unsupported
    }
}

/// Whether a backend runs [elections](crate::Election), and how an observer
/// ([`Election::observe`](crate::Election::observe)) learns that the leader changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Observe {
    /// No elections: a campaign fails [`Unsupported`](crate::LockError::Unsupported)
    /// before any I/O.
    #[default]
    Unsupported,
    /// The server wakes observers on each change it makes (a new leader, a proclaim, a
    /// resignation); a leader whose hold ended without one (an expiry, a crash the server
    /// noticed late) is seen within `recheck`, when observers read the leader again.
    Woken {
        /// How long an observer goes without reading the leader.
        recheck: Duration,
    },
    /// The server cannot wake observers: they read the leader every `every`, so a change
    /// is seen within `every` and a leader that leads for less may be missed.
    Polled {
        /// How often an observer reads the leader.
        every: Duration,
    },
}

/// How far a backend's fencing tokens can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fencing {
    /// Tokens carry no order; do not use them to fence writes.
    None,
    /// Tokens increase across successive holders while the backend's state survives, but a
    /// named failure can reset them (the reason says which).
    BestEffort {
        /// Which failure breaks the order, e.g. "a Redis restart without persistence".
        why: &'static str,
    },
    /// Tokens strictly increase across successive holders of a key, including after a
    /// holder crashed and after a server restart.
    Strict,
}

impl Fencing {
    /// Whether successive holders see increasing tokens in normal operation.
    pub fn is_ordered(&self) -> bool {
        !matches!(self, Fencing::None)
    }
}

/// How a holder that goes silent loses its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    /// The server frees the key `ttl` after the last grant or renewal.
    Ttl,
    /// The key lives as long as the client's session; `ttl` is not used. A silent holder is
    /// cut off when its session times out.
    Session {
        /// The session timeout the client negotiated.
        timeout: Duration,
    },
}

/// How waiters learn that a key was released.
///
/// ```
/// use dlock_core::Wakeup;
///
/// // Pub/sub: a release wakes every waiter on the key once; all but one go back to sleep.
/// let herd = Wakeup::Notification { one_per_release: false, max_per_waiter: 1 };
/// assert_eq!(herd.max_per_release(8), Some(8));
/// let queue = Wakeup::Notification { one_per_release: true, max_per_waiter: 1 };
/// assert_eq!(queue.max_per_release(8), Some(1));
/// assert_eq!(Wakeup::Polling.max_per_release(8), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeup {
    /// Waiters re-try on a timer.
    Polling,
    /// The server notifies waiters (watch, pub/sub, row-lock grant).
    Notification {
        /// One release wakes one waiter (no thundering herd). When false, every waiter on
        /// the key is woken and all but one go back to sleep.
        one_per_release: bool,
        /// The most times one release wakes any one waiter (at least 1): with `n` waiters,
        /// one release costs at most `n * max_per_waiter` wake-ups, or one in all where
        /// `one_per_release`. See [`max_per_release`](Wakeup::max_per_release).
        max_per_waiter: u32,
    },
}

impl Wakeup {
    /// The most wake-ups ([`LockStats::wakeups`](crate::LockStats), summed over every
    /// waiting client) one release may cause while `waiters` wait for the key: 1 where one
    /// release wakes one waiter, `waiters * max_per_waiter` for a herd, and `None` when
    /// polling, whose wake-ups follow its timer rather than releases. The conformance
    /// suite measures it.
    pub fn max_per_release(&self, waiters: u64) -> Option<u64> {
        match *self {
            Wakeup::Polling => None,
            Wakeup::Notification {
                one_per_release: true,
                ..
            } => Some(1),
            Wakeup::Notification {
                one_per_release: false,
                max_per_waiter,
            } => Some(waiters.saturating_mul(u64::from(max_per_waiter))),
        }
    }
}

/// How held keys fare through faults beyond the core contract.
///
/// The contract already covers a crashed holder (the key frees within
/// [`Capabilities::crash_release_bound`]) and a partitioned holder (`lost()` fires before
/// another client can take the key). These are the faults where a backend may keep less.
/// The default promises nothing.
///
/// ```
/// use dlock_core::{FaultSafety, Faults};
///
/// // A lease-based lock on a replicated, persistent store (ZooKeeper, etcd).
/// let faults = Faults {
///     holder_paused: FaultSafety::Fenced,
///     server_restart: FaultSafety::Exclusive,
///     member_down: FaultSafety::Exclusive,
///     member_cut: FaultSafety::Exclusive,
///     member_unreachable: FaultSafety::Exclusive,
///     slow_link: FaultSafety::Exclusive,
///     clock_jump: FaultSafety::Unspecified,
/// };
/// assert_eq!(Faults::default().server_restart, FaultSafety::Unspecified);
/// # let _ = faults;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Faults {
    /// The holder's process is paused (a GC pause, `SIGSTOP`, a suspended VM) for longer
    /// than its lease. While paused it cannot hear `lost()`, so no lease-based lock can do
    /// better than [`FaultSafety::Fenced`] here.
    pub holder_paused: FaultSafety,
    /// The server (every member of it) stops and starts again.
    pub server_restart: FaultSafety,
    /// A minority of the members stops for longer than the ttl and starts again: a
    /// ZooKeeper or etcd member, 2 of 5 Redlock nodes, a Redis primary that fails over.
    pub member_down: FaultSafety,
    /// One member is cut off from the other members (a network partition between the
    /// servers, no reset, no error) for longer than the ttl while clients still reach it,
    /// then healed: a ZooKeeper or etcd leader cut off from its majority.
    pub member_cut: FaultSafety,
    /// One member is unreachable from some of the clients only (a partition between them
    /// and that server, no reset) for longer than the ttl, while the other clients still
    /// reach it: a Redlock node that half the clients cannot reach, an etcd or ZooKeeper
    /// member cut off from some clients.
    pub member_unreachable: FaultSafety,
    /// One member's link is slow (rate-limited, or every byte late by a delay with jitter)
    /// or drops packets at random for longer than the ttl: a ZooKeeper or etcd leader, a
    /// Redlock node, the one server of Redis, MySQL or PostgreSQL.
    pub slow_link: FaultSafety,
    /// One server's wall clock jumps forward by more than the ttl, its monotonic clock
    /// untouched (an NTP step): a Redlock node, whose keys then expire early.
    pub clock_jump: FaultSafety,
}

/// What a fault does to exclusion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FaultSafety {
    /// No promise.
    #[default]
    Unspecified,
    /// Another client may take a held key before its holder hears that the lease is lost,
    /// but fencing tokens keep increasing through the fault: a storage that rejects a
    /// token lower than one it has seen rejects the old holder's late writes.
    Fenced,
    /// No other client takes a held key before its holder was told it was lost.
    Exclusive,
}
