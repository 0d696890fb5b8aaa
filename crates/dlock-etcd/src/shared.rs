//! The client's shared leases: every auto-renewed hold (and every waiter that will become
//! one) of a given ttl puts its key on one lease per client, as Go's `concurrency.Session`
//! does, kept alive by one task and one keep-alive stream ([`SharedLeases`]). A hold joins a
//! lease with a [`SharedUse`]. A lease whose last use left lingers for [`linger`] (one
//! ttl), still kept alive and holding no key, so that the client's next acquire reuses it
//! instead of paying a grant and a revoke (two raft commits) per lock cycle; it is revoked
//! when the linger ends, or at once when the client is dropped (a revoke [`dlock_core::settle`]
//! waits for).
//!
//! A lease that recently had an attempt abandoned on it is *suspect*: that attempt's put
//! may land after its background delete, leaving a key nobody waits behind. While suspect,
//! its keeper sweeps it after each renewal ([`sweep`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use dlock_core::LostReason;
use etcd_client::LeaseTimeToLiveOptions;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::NAME;
use crate::connection::Conn;
use crate::error::Error;
use crate::lease::LeaseHandle;

/// What is known of a shared lease.
#[derive(Clone, Debug)]
pub(crate) enum State {
    /// The grant has not been answered yet.
    Granting,
    /// The last grant or keep-alive that succeeded was sent at `renewed_at`: the server
    /// keeps the lease at least its ttl from then.
    Alive { renewed_at: Instant },
    /// The grant failed; nothing was ever attached to the lease.
    GrantFailed(String),
    /// The lease is gone, or may be: every key on it is lost.
    Lost(LostReason),
}

/// One lease shared by the holds of one ttl.
#[derive(Debug)]
pub(crate) struct SharedLease {
    pub(crate) id: i64,
    /// The ttl asked for, in whole seconds.
    pub(crate) asked: i64,
    state: watch::Sender<State>,
    /// How many holds and waiters have a key on this lease (or are about to).
    users: Mutex<usize>,
    /// Told when the last user left, or the client was dropped: the keeper starts the
    /// linger, or retires the lease.
    idle: Notify,
    /// Until when the lease may hold a key of ours that nothing of ours uses (an abandoned
    /// attempt's late put, a key whose delete gave up): the keeper sweeps it meanwhile.
    suspect_until: Mutex<Option<Instant>>,
    /// A sweep is running (one at a time).
    sweeping: AtomicBool,
    /// The keeper has ended, and has started the lease's revoke if it may still exist.
    ended: watch::Sender<bool>,
}

/// How long a shared lease outlives its last key: one ttl. A client that locks again
/// within it (a loop, a periodic job, a burst) reuses the lease: the cycle costs the put
/// and the delete, not a grant and a revoke besides. Idle, the lease costs the server one
/// keep-alive and one read per ttl/3 and holds no key, so no lock; a crashed client's
/// lease expires with its ttl as before.
pub(crate) fn linger(lease: &SharedLease) -> Duration {
    lease.ttl()
}

impl SharedLease {
    pub(crate) fn ttl(&self) -> Duration {
        Duration::from_secs(self.asked.unsigned_abs())
    }

    pub(crate) fn state(&self) -> State {
        self.state.borrow().clone()
    }

    /// Resolves when the lease is lost (at once if it already is).
    pub(crate) async fn lost(&self) -> LostReason {
        let mut state = self.state.subscribe();
        let lost = state
            .wait_for(|s| matches!(s, State::Lost(_) | State::GrantFailed(_)))
            .await;
        match lost.as_deref() {
            Ok(State::Lost(reason)) => reason.clone(),
            Ok(State::GrantFailed(e)) => LostReason::Unreachable(e.clone()),
            // The sender lives as long as this lease.
            _ => LostReason::Expired,
        }
    }

    /// The server said the lease is gone (a key put on it failed): lose every key on it
    /// now, and serve a fresh lease to the next acquire.
    pub(crate) fn declare_lost(&self, conn: &Conn) {
        conn.shared.shared_leases.forget(self);
        self.state
            .send_replace(State::Lost(LostReason::SessionEnded(format!(
                "the shared lease {:x} expired or was revoked",
                self.id
            ))));
    }

    fn users(&self) -> MutexGuard<'_, usize> {
        self.users.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn is_idle(&self) -> bool {
        *self.users() == 0
    }

    fn suspect_until(&self) -> MutexGuard<'_, Option<Instant>> {
        self.suspect_until.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A key of ours may land (or stay) on this lease with nothing of ours behind it: an
    /// attempt was given up with its put unanswered, or a delete gave up. Sweep the lease
    /// for the next `2 × request timeout + ttl` (counted from when the name is let go): a
    /// put sent before the abandon is, in practice, applied within that or not at all; one
    /// that lands later still is caught by the next abandon's window, or freed with the
    /// lease.
    pub(crate) fn suspect(&self, request_timeout: Duration) {
        let until = Instant::now() + 2 * request_timeout + self.ttl();
        let mut suspect = self.suspect_until();
        *suspect = Some(suspect.map_or(until, |t| t.max(until)));
    }

    /// A sweep found nothing: the lease is clean once its suspect window has passed.
    fn found_clean(&self) {
        let mut suspect = self.suspect_until();
        if suspect.is_some_and(|t| t <= Instant::now()) {
            *suspect = None;
        }
    }
}

/// The client's shared leases, one per ttl (in whole seconds).
#[derive(Debug, Default)]
pub(crate) struct SharedLeases {
    by_ttl: Mutex<HashMap<i64, Arc<SharedLease>>>,
    /// The client was dropped: idle leases are revoked without lingering.
    closed: AtomicBool,
}

impl SharedLeases {
    fn map(&self) -> MutexGuard<'_, HashMap<i64, Arc<SharedLease>>> {
        self.by_ttl.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The client is dropped: revoke every idle lease now (busy ones when their last hold
    /// goes). The revoke of an idle one is counted by [`dlock_core::settle`] from here, so a
    /// process that exits after dropping its clients and settling leaves no lease behind.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        let leases: Vec<_> = self.map().values().cloned().collect();
        for lease in leases {
            if self.retire(&lease) {
                // Its keeper retires it when told (below), and starts the revoke, itself
                // counted, before it ends: wait for that in a counted task.
                let mut ended = lease.ended.subscribe();
                dlock_core::raw::spawn_cleanup(async move {
                    let _ = ended.wait_for(|ended| *ended).await;
                });
            }
            lease.idle.notify_one();
        }
    }

    /// Ids of the leases that hold no key and linger for the next acquire.
    pub(crate) fn idle(&self) -> Vec<i64> {
        self.map()
            .values()
            .filter(|l| l.is_idle() && matches!(l.state(), State::Alive { .. }))
            .map(|l| l.id)
            .collect()
    }

    /// Stop serving `lease` if nobody uses it (checked under the map's lock, under which
    /// `join` counts its users): `true` when it is retired and may be revoked.
    fn retire(&self, lease: &SharedLease) -> bool {
        let mut map = self.map();
        if !lease.is_idle() {
            return false;
        }
        if map
            .get(&lease.asked)
            .is_some_and(|l| std::ptr::eq(l.as_ref(), lease))
        {
            map.remove(&lease.asked);
        }
        true
    }

    /// Forget `lease` if it is still the one served for its ttl.
    fn forget(&self, lease: &SharedLease) {
        let mut map = self.map();
        if map
            .get(&lease.asked)
            .is_some_and(|l| std::ptr::eq(l.as_ref(), lease))
        {
            map.remove(&lease.asked);
        }
    }
}

/// One hold's (or waiter's) place on a shared lease. Dropping it leaves the lease; the last
/// to leave starts its linger.
pub(crate) struct SharedUse {
    pub(crate) lease: Arc<SharedLease>,
}

impl SharedUse {
    /// Join the client's lease of `asked` seconds, granting one if there is none (or the
    /// last was lost), and wait until it is granted. Costs nothing on the server when a
    /// lease of that ttl is alive.
    pub(crate) async fn join(conn: &Conn, asked: i64) -> Result<Self, Error> {
        loop {
            let joined = {
                let mut map = conn.shared.shared_leases.map();
                let lease = map
                    .entry(asked)
                    .or_insert_with(|| start(conn.clone(), asked))
                    .clone();
                *lease.users() += 1;
                Self { lease }
            };
            let mut state = joined.lease.state.subscribe();
            let granted = state
                .wait_for(|s| !matches!(s, State::Granting))
                .await
                .map(|s| s.clone());
            match granted {
                Ok(State::Alive { .. }) => return Ok(joined),
                Ok(State::GrantFailed(what)) => {
                    return Err(Error::etcd(
                        "acquire",
                        etcd_client::Error::LeaseKeepAliveError(what),
                    ));
                }
                // Lost since it was served: its keeper already forgot it, so the next turn
                // gets a fresh lease.
                _ => continue,
            }
        }
    }

    /// The server-side instant before which the lease certainly lives, if it is alive.
    pub(crate) fn alive_until(&self) -> Option<Instant> {
        match self.lease.state() {
            State::Alive { renewed_at } => Some(renewed_at + self.lease.ttl()),
            _ => None,
        }
    }
}

impl Drop for SharedUse {
    fn drop(&mut self) {
        let mut users = self.lease.users();
        *users -= 1;
        if *users == 0 {
            self.lease.idle.notify_one();
        }
    }
}

/// A new shared lease of `asked` seconds, and its keeper task.
fn start(conn: Conn, asked: i64) -> Arc<SharedLease> {
    let handle = LeaseHandle::new(&conn, asked);
    let lease = Arc::new(SharedLease {
        id: handle.id,
        asked,
        state: watch::Sender::new(State::Granting),
        users: Mutex::new(0),
        idle: Notify::new(),
        suspect_until: Mutex::new(None),
        sweeping: AtomicBool::new(false),
        ended: watch::Sender::new(false),
    });
    tokio::spawn(keep(conn, handle, lease.clone()));
    lease
}

/// Run the keeper ([`tend`]), then drop its handle, which revokes the lease in the
/// background (counted by [`dlock_core::settle`]) unless it is known gone, and only then
/// say the keeper ended.
async fn keep(conn: Conn, mut handle: LeaseHandle, lease: Arc<SharedLease>) {
    tend(&conn, &mut handle, &lease).await;
    drop(handle);
    lease.ended.send_replace(true);
}

/// The keeper: grant the lease, then keep it alive every third of its ttl on one
/// keep-alive stream (and sweep it after a renewal while it is suspect), until it has been
/// idle for its [`linger`] or the client is dropped while it is idle (then return, for
/// [`keep`] to revoke it), or it is lost (then tell every user, through
/// [`SharedLease::lost`]).
async fn tend(conn: &Conn, handle: &mut LeaseHandle, lease: &Arc<SharedLease>) {
    let leases = &conn.shared.shared_leases;
    // A notification sent meanwhile is kept as a permit and handled in the loop.
    if let Err(e) = handle.grant("acquire").await {
        tracing::debug!(backend = NAME, lease = handle.id, error = %e, "granting a shared lease failed");
        conn.shared.shared_leases.forget(lease);
        lease.state.send_replace(State::GrantFailed(e.to_string()));
        return;
    }
    lease.state.send_replace(State::Alive {
        renewed_at: handle.renewed_at,
    });
    let ttl = lease.ttl();
    let mut retry_at: Option<Instant> = None;
    // While idle: when the linger ends.
    let mut retire_at: Option<Instant> = lease.is_idle().then(|| Instant::now() + linger(lease));
    loop {
        let due = retry_at.unwrap_or_else(|| dlock_core::raw::renewal_due(handle.renewed_at, ttl));
        let lingering = retire_at.unwrap_or(due);
        tokio::select! {
            () = lease.idle.notified() => {
                retire_at = lease.is_idle().then(|| Instant::now() + linger(lease));
                if leases.closed.load(Ordering::Relaxed) && leases.retire(lease) {
                    return; // dropping `handle` revokes it in the background
                }
                continue;
            }
            () = tokio::time::sleep_until(lingering), if retire_at.is_some() => {
                retire_at = None;
                if leases.retire(lease) {
                    tracing::debug!(backend = NAME, lease = handle.id, "a shared lease idle for its linger is revoked");
                    return;
                }
                continue;
            }
            () = tokio::time::sleep_until(due) => {}
        }
        // Every hold's lost signal hangs on this answer: it must come before the lease
        // may have expired, less the watchdog's margin.
        let previous = handle.renewed_at;
        let last_safe = handle.renewed_at + ttl - (ttl / 10 + Duration::from_millis(2));
        let renewal = async {
            let (alive, quorum) = tokio::join!(
                handle.keep_alive("keep-alive"),
                conn.confirm_quorum("keep-alive")
            );
            match (alive, quorum) {
                (Err(e), _) => Err(e),
                (Ok(()), Ok(())) => Ok(()),
                (Ok(()), Err(e)) => {
                    // Not proof the lease lives: count it from the renewal before.
                    handle.renewed_at = previous;
                    Err(e)
                }
            }
        };
        let answer = tokio::time::timeout_at(last_safe, renewal).await;
        let answer = answer.unwrap_or_else(|_| {
            // A keep-alive a lone leader answered while the quorum read hung proves nothing
            // (etcd renews leases on the leader alone): count from the renewal before.
            handle.renewed_at = previous;
            Err(Error::TimedOut {
                op: "keep-alive",
                after: last_safe.saturating_duration_since(previous),
            })
        });
        let lost = match answer {
            Ok(()) => {
                retry_at = None;
                lease.state.send_replace(State::Alive {
                    renewed_at: handle.renewed_at,
                });
                if lease.suspect_until().is_some() && !lease.sweeping.swap(true, Ordering::AcqRel) {
                    // Beside the keeper, so that a slow sweep never delays a renewal.
                    tokio::spawn(sweep(conn.clone(), lease.clone()));
                }
                continue;
            }
            Err(e) if e.is_lease_gone() => LostReason::SessionEnded(format!(
                "the shared lease {:x} expired or was revoked",
                handle.id
            )),
            Err(e) => {
                let now = Instant::now();
                match dlock_core::raw::renewal_retry(handle.renewed_at, ttl, now) {
                    Some(retry) => {
                        tracing::debug!(backend = NAME, lease = handle.id, error = %e, "keep-alive of a shared lease failed; retrying");
                        retry_at = Some(retry);
                        continue;
                    }
                    None => LostReason::Unreachable(e.to_string()),
                }
            }
        };
        match lease.is_idle() {
            true => {
                tracing::debug!(backend = NAME, lease = handle.id, reason = %lost, "an idle shared lease is lost")
            }
            false => {
                tracing::warn!(backend = NAME, lease = handle.id, reason = %lost, "a shared lease is lost; so is every key on it")
            }
        }
        conn.shared.shared_leases.forget(lease);
        lease.state.send_replace(State::Lost(lost));
        // A lease that may still exist is revoked when `handle` drops, so its keys free now.
        return;
    }
}

/// How many times a key on a shared lease is deleted again after a delete failed: the
/// lease outlives the hold, so the key would otherwise stay until the client stops.
const DELETE_ATTEMPTS: u32 = 8;

/// Delete `key` (only if its create revision is `rev`, when known), retrying with backoff;
/// `false` when every attempt failed.
async fn delete_with_retries(conn: &Conn, key: &str, rev: Option<i64>) -> bool {
    let mut pause = Duration::from_millis(100);
    for attempt in 1..=DELETE_ATTEMPTS {
        match conn.delete_key("release", key, rev).await {
            Ok(_) => return true,
            Err(e) if attempt == DELETE_ATTEMPTS => {
                tracing::warn!(backend = NAME, key, error = %e, "cannot delete a key on a shared lease; the lease's sweep tries again while the lease lives");
            }
            Err(e) => {
                tracing::debug!(backend = NAME, key, error = %e, "deleting a key failed; retrying");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(5));
            }
        }
    }
    false
}

/// Delete `key` in the background (only if its create revision is `rev`, when known),
/// retrying with backoff, and leave the shared lease (`lease`) once that is done.
///
/// Without `rev` (an attempt given up before or during its put), the put may still land
/// after the delete; and a delete that gave up leaves the key. Either way the lease is
/// marked suspect ([`SharedLease::suspect`]) once the name is let go, so that its keeper
/// sweeps whatever key nothing of ours uses.
pub(crate) fn delete_in_background(
    conn: Conn,
    key: String,
    rev: Option<i64>,
    lease: Option<SharedUse>,
) {
    let spawned = dlock_core::raw::spawn_cleanup(async move {
        let deleted = delete_with_retries(&conn, &key, rev).await;
        conn.shared.unclaim_key(&key);
        if let Some(shared) = &lease
            && (rev.is_none() || !deleted)
        {
            shared.lease.suspect(conn.timeout);
        }
        drop(lease);
    });
    if !spawned {
        tracing::debug!(
            backend = NAME,
            "no runtime to delete a key; it stays until its lease ends"
        );
    }
}

/// Sweep a suspect lease: list the keys on it (one `LeaseTimeToLive` with keys, a leader
/// read, no raft commit) and delete each that nothing of ours claims. The lease's id is in
/// every name on it, so only this client puts keys there: such a key is a late put of an
/// abandoned attempt (or a key whose delete gave up), and nobody waits behind it. Each is
/// claimed ([`Shared::claim_exact`](crate::connection::Shared::claim_exact)) while it is
/// deleted, so no attempt of ours can take its name meanwhile; then let go.
async fn sweep(conn: Conn, lease: Arc<SharedLease>) {
    let id = lease.id;
    let list = || {
        let mut client = conn.client.lease_client();
        async move {
            let options = LeaseTimeToLiveOptions::new().with_keys();
            client.time_to_live(id, Some(options)).await
        }
    };
    let mut clean = true;
    match conn.call("sweep", list).await {
        Ok(listed) => {
            for key in listed.keys() {
                // Our names are UTF-8 (lock names are percent-encoded).
                let Ok(name) = std::str::from_utf8(key) else {
                    continue;
                };
                if !conn.shared.claim_exact(name) {
                    continue;
                }
                clean = false;
                tracing::info!(
                    backend = NAME,
                    lease = id,
                    key = name,
                    "deleting a key of ours that no attempt or hold uses (an abandoned attempt's late put)"
                );
                if !delete_with_retries(&conn, name, None).await {
                    lease.suspect(conn.timeout);
                }
                conn.shared.unclaim_key(name);
            }
        }
        Err(e) => {
            clean = false;
            tracing::debug!(backend = NAME, lease = id, error = %e, "listing the keys of a suspect shared lease failed; trying again after the next renewal");
        }
    }
    if clean {
        lease.found_clean();
    }
    lease.sweeping.store(false, Ordering::Release);
}
