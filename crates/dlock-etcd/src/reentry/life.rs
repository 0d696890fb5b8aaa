//! What keeps an owner hold's key alive in the client that put it ([`Life`]), the client's
//! register of those keys ([`OwnerHolds`]), and the checks a re-entry of such a hold makes
//! against it.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_core::{LostReason, Result};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::NAME;
use crate::connection::Conn;
use crate::error::not_held;
use crate::lease::KeyLease;
use crate::shared::SharedLease;

/// What keeps an owner hold's key alive in the client that put it (and so every entry of
/// the hold: the key goes with that lease).
#[derive(Clone, Debug)]
pub(crate) enum Life {
    /// The key is being taken on a lease of its own, not granted yet (or kept alive while
    /// waiting): the deletion of the key is the only signal until it is held.
    Taking,
    /// On the client's shared lease: its keeper's lost signal, which fires a tenth of the
    /// ttl before the server may expire it.
    Shared(Arc<SharedLease>),
    /// On a lease of its own, last renewed by a keep-alive sent at `renewed_at`: the server
    /// keeps it at least `ttl` from then.
    Own { renewed_at: Instant, ttl: Duration },
    /// The lease is gone, or may be.
    Gone(LostReason),
}

impl Life {
    /// The lease of `lease` as it is now.
    pub(crate) fn of(lease: &KeyLease) -> Self {
        match lease {
            KeyLease::Shared(shared) => Self::Shared(shared.lease.clone()),
            KeyLease::Own(own) => Self::Own {
                renewed_at: own.renewed_at,
                ttl: Duration::from_secs(own.asked.unsigned_abs()),
            },
        }
    }
}

/// The owner holds' keys of this client, by name: what keeps each alive. A re-entry of a
/// hold whose key is here lives exactly as long as that lease, and carries its signal.
#[derive(Debug, Default)]
pub(crate) struct OwnerHolds {
    by_key: Mutex<HashMap<String, (u64, watch::Receiver<Life>)>>,
    next: AtomicU64,
}

impl OwnerHolds {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, (u64, watch::Receiver<Life>)>> {
        self.by_key.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What keeps `etcd_key` alive, if it is an owner hold's key of this client.
    pub(crate) fn life(&self, etcd_key: &str) -> Option<watch::Receiver<Life>> {
        self.map().get(etcd_key).map(|(_, life)| life.clone())
    }
}

/// An owner attempt's key, and then its hold's, registered in the client's [`OwnerHolds`]
/// from before the key is put until the client leaves the key's lease (the key then gone,
/// or going with its lease): while registered, the key (if it exists) is on the lease this
/// says. Key names are unique in a client (an own lease's id, or claimed on a shared
/// lease), so the name tells a re-entry the hold is this client's.
pub(crate) struct Keeping {
    conn: Conn,
    etcd_key: String,
    id: u64,
    life: watch::Sender<Life>,
}

impl fmt::Debug for Keeping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Keeping")
            .field("etcd_key", &self.etcd_key)
            .finish_non_exhaustive()
    }
}

impl Keeping {
    pub(crate) fn start(conn: &Conn, etcd_key: &str, life: Life) -> Self {
        let holds = &conn.shared.owner_holds;
        let id = holds.next.fetch_add(1, Ordering::Relaxed);
        let (life, seen) = watch::channel(life);
        holds.map().insert(etcd_key.to_owned(), (id, seen));
        Self {
            conn: conn.clone(),
            etcd_key: etcd_key.to_owned(),
            id,
            life,
        }
    }

    /// The key's lease is now as `life` says.
    pub(crate) fn set(&self, life: Life) {
        self.life.send_replace(life);
    }
}

impl Drop for Keeping {
    fn drop(&mut self) {
        let mut map = self.conn.shared.owner_holds.map();
        if map
            .get(&self.etcd_key)
            .is_some_and(|(id, _)| *id == self.id)
        {
            map.remove(&self.etcd_key);
        }
    }
}

/// The last safe instant of a lease of `ttl` renewed at `renewed_at`, as the shared lease's
/// keeper and the core's watchdog count it: a tenth of the ttl (and 2 ms) before it may
/// expire.
pub(super) fn last_safe(renewed_at: Instant, ttl: Duration) -> Instant {
    renewed_at + ttl - (ttl / 10 + Duration::from_millis(2))
}

/// Resolves when the lease `life` follows is lost (its keeper's signal, or an own lease's
/// last safe instant passed). Once the client leaves the key's lease (the sender
/// dropped), the key is gone or going: the last known lease still counts.
pub(super) async fn life_lost(mut life: watch::Receiver<Life>) -> LostReason {
    let mut open = true;
    loop {
        let now = life.borrow_and_update().clone();
        let changed = async {
            match open {
                true => life.changed().await.is_ok(),
                false => std::future::pending().await,
            }
        };
        tokio::select! {
            reason = async {
                match &now {
                    Life::Taking => std::future::pending().await,
                    Life::Shared(lease) => lease.lost().await,
                    Life::Own { renewed_at, ttl } => {
                        tokio::time::sleep_until(last_safe(*renewed_at, *ttl)).await;
                        LostReason::Expired
                    }
                    Life::Gone(reason) => reason.clone(),
                }
            } => return reason,
            still = changed => open = still,
        }
    }
}

/// Whether `life` is known alive now (no request), as a hold on the shared lease answers
/// a manual extend: gone is not held; unanswered keep-alives past the last safe instant,
/// unavailable.
pub(super) fn life_check(life: &Life, key: &str) -> Result<()> {
    let stale = || {
        dlock_core::LockError::unavailable(
            NAME,
            "extend",
            "the keep-alives of the holding key's lease are not answered",
        )
    };
    match life {
        Life::Taking => Ok(()),
        Life::Shared(lease) => match lease.state() {
            crate::shared::State::Alive { renewed_at } => {
                match Instant::now() < last_safe(renewed_at, lease.ttl()) {
                    true => Ok(()),
                    false => Err(stale()),
                }
            }
            crate::shared::State::Granting => Ok(()),
            _ => Err(not_held(key)),
        },
        Life::Own { renewed_at, ttl } => match Instant::now() < last_safe(*renewed_at, *ttl) {
            true => Ok(()),
            false => Err(stale()),
        },
        Life::Gone(_) => Err(not_held(key)),
    }
}
