//! A held key ([`EtcdHeld`]): the fenced release; extend (on the shared lease, its state;
//! on an own lease, a keep-alive and a read of our key; with a new ttl, a move to another
//! lease); the owner-checked proclaim of an election's value; and the lost signal (our key
//! deleted, or the shared lease lost).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::Held;
use dlock_core::{LockError, LostReason, Result};
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};
use futures::future::BoxFuture;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::NAME;
use crate::connection::Conn;
use crate::error::{Error, not_held};
use crate::keywatch::HeldWatch;
use crate::lease::{KeyLease, LeaseHandle, whole_seconds};
use crate::reentry::{Hold, Keeping, Life, keep_until_freed};
use crate::shared::{SharedLease, SharedUse, State, delete_in_background};

/// A held key: our etcd key, its create revision (the fencing token) and its lease.
pub(crate) struct EtcdHeld {
    conn: Conn,
    key: String,
    my_key: String,
    rev: i64,
    /// `None` once released.
    lease: Option<KeyLease>,
    /// The shared lease our key is on, for the lost signal (it changes with the ttl).
    shared: watch::Sender<Option<Arc<SharedLease>>>,
    /// The watch on our key, canceled when dropped.
    _watch: HeldWatch,
    /// A reentrant hold's count, for a hold taken under an owner (see [`crate::reentry`]).
    pub(crate) owner: Option<Hold>,
    /// An owner hold's key in the client's registry: what keeps it alive, for the
    /// client's re-entries of the hold.
    pub(crate) keeping: Option<Keeping>,
}

impl fmt::Debug for EtcdHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdHeld")
            .field("key", &self.key)
            .field("etcd_key", &self.my_key)
            .field("create_revision", &self.rev)
            .field("lease", &format_args!("{:x}", self.lease_id()))
            .finish()
    }
}

/// Whether `my_key` still exists with create revision `rev` (one linearizable read).
async fn still_ours(conn: &Conn, my_key: &str, rev: i64) -> Result<bool, Error> {
    let get = || {
        let mut kv = conn.client.kv_client();
        async move {
            kv.get(my_key, Some(GetOptions::new().with_keys_only()))
                .await
        }
    };
    let answer = conn.call("extend", get).await?;
    Ok(answer
        .kvs()
        .first()
        .is_some_and(|kv| kv.create_revision() == rev))
}

fn shared_of(lease: &KeyLease) -> Option<Arc<SharedLease>> {
    match lease {
        KeyLease::Shared(shared) => Some(shared.lease.clone()),
        KeyLease::Own(_) => None,
    }
}

impl EtcdHeld {
    /// Hold `my_key` (create revision `rev`, known ours at revision `seen`) on `lease`, and
    /// the signal that fires when it is lost: the key deleted (seen by the client's watch
    /// on held keys), or the shared lease it is on lost.
    pub(crate) fn start(
        conn: &Conn,
        key: &str,
        my_key: String,
        rev: i64,
        seen: i64,
        lease: KeyLease,
    ) -> (Self, BoxFuture<'static, LostReason>) {
        let (watch, deleted) = conn.watch_held(&my_key, rev, seen + 1);
        let shared = watch::Sender::new(shared_of(&lease));
        let mut current = shared.subscribe();
        let lost = Box::pin(async move {
            let lease_lost = async {
                loop {
                    let Some(lease) = current.borrow_and_update().clone() else {
                        if current.changed().await.is_err() {
                            return std::future::pending().await;
                        }
                        continue;
                    };
                    tokio::select! {
                        reason = lease.lost() => return reason,
                        changed = current.changed() => if changed.is_err() {
                            return std::future::pending().await;
                        },
                    }
                }
            };
            tokio::select! {
                reason = lease_lost => reason,
                // Canceled (released) rather than deleted: nothing to signal.
                deleted = deleted => match deleted {
                    Ok(()) => LostReason::NotHeld,
                    Err(_) => std::future::pending().await,
                },
            }
        });
        let held = Self {
            conn: conn.clone(),
            key: key.to_owned(),
            my_key,
            rev,
            lease: Some(lease),
            shared,
            _watch: watch,
            owner: None,
            keeping: None,
        };
        (held, lost)
    }

    fn lease_id(&self) -> i64 {
        self.lease.as_ref().map_or(0, KeyLease::id)
    }

    /// etcd cannot change a lease's ttl: attach our key to a lease of the new ttl (the
    /// client's shared one, or a new own one; the key, and so its create revision, stays),
    /// then leave the old lease.
    async fn move_to_new_lease(&mut self, asked: i64) -> Result<()> {
        const OP: &str = "extend";
        let mut fresh = match self.lease {
            Some(KeyLease::Shared(_)) => {
                KeyLease::Shared(SharedUse::join(&self.conn, asked).await?)
            }
            _ => KeyLease::Own(Box::new(LeaseHandle::new(&self.conn, asked))),
        };
        fresh.prepare(OP).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.my_key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            // The value (who holds it, for `inspect`) stays as the acquire put it.
            .and_then([TxnOp::put(
                self.my_key.as_str(),
                "",
                Some(PutOptions::new().with_lease(fresh.id()).with_ignore_value()),
            )]);
        if !self.conn.txn(OP, txn).await?.succeeded() {
            return Err(not_held(&self.key));
        }
        self.shared.send_replace(shared_of(&fresh));
        if let Some(keeping) = &self.keeping {
            keeping.set(Life::of(&fresh));
        }
        // The old lease holds our key no more: an own one is revoked (in the background,
        // when dropped); a shared one is left, and revoked if we were its last user.
        self.lease = Some(fresh);
        Ok(())
    }
}

/// An owner hold's first grant leaves it: lower the count; at zero (`H` deleted) or when
/// `H` is not the hold any more, leave the lease as a released key does, else keep it until
/// the last entry's release deletes `H`. `Ok(false)`: not held.
async fn leave_owner_hold(
    conn: &Conn,
    mut hold: Hold,
    lease: KeyLease,
    keeping: Option<Keeping>,
) -> Result<bool, Error> {
    let held = match hold.leave("release").await {
        Ok(Some(0)) => true,
        Ok(None) => false,
        Ok(Some(_)) => {
            keep_until_freed(conn.clone(), hold, lease, keeping);
            return Ok(true);
        }
        Err(e) => {
            // Whether the count went down is not known: keep the key's lease until the
            // key goes.
            keep_until_freed(conn.clone(), hold, lease, keeping);
            return Err(e);
        }
    };
    drop(keeping);
    match lease {
        KeyLease::Own(mut own) => own.revoke_in_background(),
        KeyLease::Shared(shared) => {
            conn.shared.unclaim_key(&hold.etcd_key);
            drop(shared);
        }
    }
    Ok(held)
}

impl Drop for EtcdHeld {
    fn drop(&mut self) {
        // An owner hold dropped unreleased leaves its entry in the background.
        if let (Some(hold), Some(lease)) = (self.owner.take(), self.lease.take()) {
            let conn = self.conn.clone();
            let keeping = self.keeping.take();
            dlock_core::raw::spawn_cleanup(async move {
                let _ = leave_owner_hold(&conn, hold, lease, keeping).await;
            });
            return;
        }
        // Dropped unreleased: a key on the shared lease would outlive the hold (the lease
        // lingers), so it is deleted in the background; an own lease is revoked on drop.
        if let Some(KeyLease::Shared(shared)) = self.lease.take() {
            let key = std::mem::take(&mut self.my_key);
            delete_in_background(self.conn.clone(), key, Some(self.rev), Some(shared));
        }
    }
}

#[async_trait]
impl Held for EtcdHeld {
    async fn release(&mut self) -> Result<()> {
        let Some(lease) = self.lease.take() else {
            return Err(not_held(&self.key));
        };
        if let Some(hold) = self.owner.take() {
            let keeping = self.keeping.take();
            return match leave_owner_hold(&self.conn, hold, lease, keeping).await? {
                true => Ok(()),
                false => Err(not_held(&self.key)),
            };
        }
        let deleted = self
            .conn
            .delete_key("release", &self.my_key, Some(self.rev))
            .await;
        match lease {
            // Our key is gone (or was not ours): the lease only holds server memory now, so
            // its revoke need not delay the caller. It is this acquisition's alone.
            KeyLease::Own(mut own) => own.revoke_in_background(),
            // The shared lease outlives us: a key whose delete was not answered would stay
            // on it, so the delete is sent again in the background.
            KeyLease::Shared(shared) if deleted.is_err() => delete_in_background(
                self.conn.clone(),
                self.my_key.clone(),
                Some(self.rev),
                Some(shared),
            ),
            KeyLease::Shared(shared) => {
                self.conn.shared.unclaim_key(&self.my_key);
                drop(shared);
            }
        }
        match deleted? {
            true => Ok(()),
            false => Err(not_held(&self.key)),
        }
    }

    /// Go's `Election::Proclaim`: put `value` on our key, with the lease it is on, if its
    /// create revision is still `rev` (one transaction); the term stays.
    async fn proclaim(&mut self, value: &str) -> Result<()> {
        let Some(lease) = &self.lease else {
            return Err(not_held(&self.key));
        };
        crate::election::proclaim(
            &self.conn,
            &self.key,
            &self.my_key,
            self.rev,
            lease.id(),
            value,
        )
        .await
    }

    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let Some(lease) = &mut self.lease else {
            return Err(not_held(&self.key));
        };
        let asked = whole_seconds(ttl);
        // An owner hold's key is never moved to a shorter lease: other entries count on it.
        if asked != lease.asked() && (self.owner.is_none() || asked > lease.asked()) {
            return self.move_to_new_lease(asked).await;
        }
        match lease {
            // The shared lease's keeper renews it for every hold on it: its last answer is
            // the check (no request of our own).
            KeyLease::Shared(shared) => match shared.lease.state() {
                State::Alive { renewed_at } => {
                    let ttl = shared.lease.ttl();
                    match Instant::now() < renewed_at + ttl - ttl / 10 {
                        true => Ok(()),
                        false => Err(LockError::unavailable(
                            NAME,
                            "extend",
                            "the shared lease's keep-alives are not answered",
                        )),
                    }
                }
                State::Lost(_) | State::GrantFailed(_) => Err(not_held(&self.key)),
                State::Granting => Err(LockError::unavailable(
                    NAME,
                    "extend",
                    "the shared lease is not granted yet",
                )),
            },
            KeyLease::Own(own) => {
                let (alive, ours) = tokio::join!(
                    own.keep_alive("extend"),
                    still_ours(&self.conn, &self.my_key, self.rev)
                );
                // This client's re-entries of an owner hold follow its lease's renewals.
                if let Some(keeping) = &self.keeping {
                    match &alive {
                        Ok(()) => keeping.set(Life::Own {
                            renewed_at: own.renewed_at,
                            ttl: Duration::from_secs(own.asked.unsigned_abs()),
                        }),
                        Err(e) if e.is_lease_gone() => {
                            keeping.set(Life::Gone(LostReason::SessionEnded(format!(
                                "the lease {:x} expired or was revoked",
                                own.id
                            ))));
                        }
                        Err(_) => {}
                    }
                }
                match alive {
                    Err(e) if e.is_lease_gone() => return Err(not_held(&self.key)),
                    Err(e) => return Err(e.into()),
                    Ok(()) => {}
                }
                match ours? {
                    true => Ok(()),
                    false => Err(not_held(&self.key)),
                }
            }
        }
    }
}
