//! The trait a backend implements. [`LockClient`](crate::LockClient) turns it into a
//! [`DistributedLock`](crate::DistributedLock) by adding what every backend shares: key and
//! option checks, the local gate, the overall deadline, the watchdog and the lost signal.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use tokio::time::Instant;

use futures::stream::BoxStream;

use crate::{
    Capabilities, Deadline, KeyStatus, Leader, LockError, LockOptions, LockStats, LostReason,
    Result,
};

/// One lock service: the server protocol, nothing else.
///
/// Implementations take keys that were already validated against
/// [`Capabilities::max_key_len`] and options already range-checked, and are only called by
/// one task per key per client at a time (the local gate queues the others).
#[async_trait]
pub trait Backend: Send + Sync + fmt::Debug + 'static {
    /// Short name used in errors and logs, e.g. `"redis"`.
    const NAME: &'static str;

    /// What this backend promises.
    fn capabilities(&self) -> Capabilities;

    /// Take `key` on the server for `ttl`.
    ///
    /// With [`Deadline::TryOnce`] make one attempt and return `Ok(None)` if the key is busy.
    /// Otherwise wait for the key until the deadline, woken by the server where the protocol
    /// allows, and return `Ok(None)` once the deadline has passed.
    ///
    /// Cancel safety: if the returned future is dropped, nothing may be left on the server
    /// that could delay another client past the lease's ttl (delete a queued node, revoke a
    /// lease, kill a waiting query).
    ///
    /// `opts` are the caller's options, already checked: the lease's `ttl`, and whether
    /// the core will renew it (`auto_renew`), which lets a backend keep auto-renewed holds
    /// alive together (one shared lease or session) while a hold that must end after its
    /// ttl gets its own. `opts.wait` is already folded into `deadline`.
    ///
    /// With `opts.owner` (only where [`Capabilities::reentrant`] is declared, and only in
    /// exclusive mode) the hold is reentrant: the server keeps the owner and a hold count
    /// beside the key. If the key is free, take it with count 1; if it is held under the
    /// same owner (by any client), raise the count atomically and grant at once with the
    /// hold's own fencing token; otherwise wait as usual. The grant's [`Held`] is
    /// owner-checked against the owner *and* this hold (its token or hold id), so a lease
    /// of an earlier hold never touches a later one: `release` lowers the count and frees
    /// the key at zero, `extend` keeps the hold alive without ever shortening it. Several
    /// grants of one owner on one key may be alive in one client at once (the core still
    /// calls `acquire` for one of them at a time).
    async fn acquire(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>>;

    /// Take `key` as [`acquire`](Self::acquire) does, as an election candidate: the hold
    /// carries `value` (already checked by [`check_value`](crate::election::check_value))
    /// where others read it, in place of the [`holder_description`](crate::holder_description)
    /// a plain hold carries, so [`leader`](Self::leader) and `inspect` show it as the
    /// holder's `who`. `opts.mode` is exclusive. Called only where
    /// [`Capabilities::election`] is declared; the default refuses.
    async fn campaign(
        &self,
        key: &str,
        value: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        let _ = (key, value, opts, deadline);
        Err(LockError::Unsupported {
            backend: Self::NAME,
            what: "leader elections",
        })
    }

    /// The leader of the election on `key` (already validated): its value and term, or
    /// `None`. The default reads [`inspect`](Self::inspect)'s exclusive holder (`who`
    /// and fencing token), which fits a backend whose election is its mutex.
    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        let status = self.inspect(key).await?;
        crate::election::leader_of(Self::NAME, &status)
    }

    /// A stream that yields each time the leader of `key` (already validated) may have
    /// changed, woken by the server ([`Observe::Woken`](crate::Observe::Woken)); an item
    /// `Err` ends it. Subscribed before it returns, so no change made after is missed.
    /// `None` (the default): the server cannot wake observers, who poll.
    async fn leader_changes(&self, key: &str) -> Result<Option<BoxStream<'static, Result<()>>>> {
        let _ = key;
        Ok(None)
    }

    /// Refuse, before any I/O, a key this backend cannot hold safely beyond the checks
    /// every key gets (non-empty, [`Capabilities::max_key_len`], no NUL): for example a key
    /// whose name on the server would be one of the backend's own internal names.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`](crate::LockError::InvalidKey) saying why.
    fn check_key(&self, key: &str) -> Result<()> {
        let _ = key;
        Ok(())
    }

    /// Who holds `key` (already validated) and who waits, read without changing anything
    /// on the server. See [`DistributedLock::inspect`](crate::DistributedLock::inspect).
    async fn inspect(&self, key: &str) -> Result<KeyStatus>;

    /// The held keys starting with `prefix` (already checked), sorted. Called only where
    /// [`Capabilities::inspect`]`.list` is declared; a backend that cannot enumerate its
    /// keys answers [`LockError::Unsupported`](crate::LockError::Unsupported). See
    /// [`DistributedLock::list`](crate::DistributedLock::list).
    async fn list(&self, prefix: &str) -> Result<Vec<String>>;

    /// Counters for observability and for the conformance suite's herd check.
    fn stats(&self) -> LockStats {
        LockStats::default()
    }
}

/// A key taken on the server, as a backend hands it to the core.
pub struct Grant {
    /// The fencing token of this grant.
    pub fencing_token: u64,
    /// The backend's handle on the held key.
    pub held: Box<dyn Held>,
    /// When the request that took the key (or the last renewal before the grant) was sent.
    /// The server-side lease cannot end before `sent_at + ttl`, so the watchdog measures
    /// from here. A ttl grant that arrives later than `sent_at + ttl / 3` is confirmed with
    /// one [`Held::extend`] before it is handed out (see [`LockClient`](crate::raw::LockClient)).
    pub sent_at: Instant,
    /// Resolves when the backend learns the lease is gone (session expired, connection
    /// killed). Optional: backends whose only evidence is a failed renewal leave it `None`.
    pub lost: Option<BoxFuture<'static, LostReason>>,
    /// The backend keeps this hold alive together with the client's other holds (a
    /// session, a lease they share, the connection they share) and reports its loss
    /// through [`lost`](Self::lost): the watchdog sends no renewals for it and sets no
    /// expiry timer of its own, so holding many keys costs nothing per key. See
    /// [`Grant::kept_alive`].
    pub kept_alive: bool,
    /// The loss signal keeps time itself once polled (a clock started when it sees a
    /// disconnect), so it must be listened to from the grant on: the watchdog starts with
    /// the lease instead of at a fifth of its ttl. See [`Grant::listened_from_grant`].
    pub lost_needs_listener: bool,
    /// The key was busy when the acquire first tried it, and this grant came after
    /// waiting for its holder to let go (a hand-off, counted in
    /// [`telemetry`](crate::telemetry)). See [`Grant::after_wait`].
    pub waited: bool,
}

impl Grant {
    /// A grant of `held` with `fencing_token`, whose request was sent at `sent_at`.
    pub fn new(fencing_token: u64, held: Box<dyn Held>, sent_at: Instant) -> Self {
        Self {
            fencing_token,
            held,
            sent_at,
            lost: None,
            kept_alive: false,
            lost_needs_listener: false,
            waited: false,
        }
    }

    /// Listen to the loss signal from the grant on (see [`lost_needs_listener`]). Without
    /// it, the watchdog (and with it the signal's listener) starts at a fifth of the ttl,
    /// and until then the signal is polled only when someone asks (`is_lost`, `extend`,
    /// `release`): fine for a signal that only reports what the client was told (a watch
    /// event, a closed connection), not for one that must notice time passing.
    ///
    /// [`lost_needs_listener`]: Self::lost_needs_listener
    pub fn listened_from_grant(mut self) -> Self {
        self.lost_needs_listener = true;
        self
    }

    /// Mark the grant as given after waiting: the key was busy at the first try.
    pub fn after_wait(mut self) -> Self {
        self.waited = true;
        self
    }

    /// Attach the backend's own loss signal.
    pub fn with_lost(mut self, lost: BoxFuture<'static, LostReason>) -> Self {
        self.lost = Some(lost);
        self
    }

    /// Mark the hold as kept alive by the backend, whose `lost` signal (required) fires,
    /// before the server can give the key to another client, when what keeps it alive is
    /// gone. [`Held::extend`] is then only called for a manual
    /// [`Lease::extend`](crate::Lease::extend), and should answer from what the backend
    /// already knows rather than with a request per hold.
    pub fn kept_alive(mut self) -> Self {
        debug_assert!(
            self.lost.is_some(),
            "a kept-alive grant needs its lost signal"
        );
        self.kept_alive = true;
        self
    }
}

impl fmt::Debug for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grant")
            .field("fencing_token", &self.fencing_token)
            .field("held", &self.held)
            .field("sent_at", &self.sent_at)
            .field("kept_alive", &self.kept_alive)
            .field("lost_needs_listener", &self.lost_needs_listener)
            .field("waited", &self.waited)
            .finish_non_exhaustive()
    }
}

/// A backend's handle on a key it holds. The core serialises calls (one at a time) and
/// never calls `extend` after `release`.
#[async_trait]
pub trait Held: Send + Sync + fmt::Debug {
    /// Keep the key for `ttl` from now. [`LockError::NotHeld`](crate::LockError::NotHeld)
    /// when the server says the key is not ours any more; any other error is treated as
    /// "could not reach the server" and retried until the lease's last safe instant.
    async fn extend(&mut self, ttl: Duration) -> Result<()>;

    /// Give the key back, only if it is still ours.
    /// [`LockError::NotHeld`](crate::LockError::NotHeld) when it was not.
    async fn release(&mut self) -> Result<()>;

    /// Publish `value` (already checked) as this hold's value, in place of the one it was
    /// granted with ([`Backend::campaign`]), owner-checked on the server. Errors as
    /// [`extend`](Self::extend): [`NotHeld`](crate::LockError::NotHeld) once the hold is
    /// gone. The default refuses: a backend with elections overrides it.
    async fn proclaim(&mut self, value: &str) -> Result<()> {
        let _ = value;
        Err(LockError::Unsupported {
            backend: "dlock",
            what: "proclaiming a value on this hold",
        })
    }

    /// This handle as [`Any`](std::any::Any), for a backend that needs its concrete type
    /// back (the carriers' [`Caller::of`](crate::raw::carrier::Caller::of)). `None` by
    /// default.
    fn as_any(&self) -> Option<&(dyn std::any::Any + Send + Sync)> {
        None
    }
}
