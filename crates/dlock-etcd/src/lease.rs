//! A lease of our own ([`LeaseHandle`]): grant, keep-alive, revoke (now, in the
//! background, or on drop), and keeping it alive while waiting, on the core watchdog's
//! schedule; and the lease a key is put on ([`KeyLease`]): its own or the shared one.

use std::sync::Mutex;
use std::time::Duration;

use dlock_core::{LockOptions, Result};
use etcd_client::{LeaseGrantOptions, LeaseKeepAliveStream, LeaseKeeper};
use rand::Rng;
use tokio::time::Instant;

use crate::NAME;
use crate::connection::Conn;
use crate::error::{Error, lease_lost};
use crate::shared::{SharedUse, delete_in_background};

/// A lease ttl in etcd's whole seconds, rounded up.
pub(crate) fn whole_seconds(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis().div_ceil(1000))
        .unwrap_or(i64::MAX)
        .max(1)
}

/// One acquisition's lease, with its keep-alive stream. Revoked in the background when
/// dropped unless it was revoked (or seen gone) before: that is what makes a dropped or
/// timed-out acquire, and a dropped holder, leave nothing behind.
pub(crate) struct LeaseHandle {
    conn: Conn,
    pub(crate) id: i64,
    /// The ttl asked for, in whole seconds. The server may grant more (it has a minimum).
    pub(crate) asked: i64,
    /// When the last grant or keep-alive that succeeded was sent: the server keeps the
    /// lease at least `asked` seconds from then.
    pub(crate) renewed_at: Instant,
    /// While waiting: when to retry a keep-alive that failed.
    retry_at: Option<Instant>,
    keeper: Exclusive<Option<(LeaseKeeper, LeaseKeepAliveStream)>>,
    /// A keep-alive went out on `keeper` and its answer was not read (the call was dropped
    /// or timed out): that stale answer would come first, so the stream is not reused.
    unread: bool,
    /// Whether the lease may still exist on the server.
    live: bool,
}

impl LeaseHandle {
    /// A lease id of our own choosing, so that a grant whose answer is lost can still be
    /// revoked. Nothing is sent yet.
    pub(crate) fn new(conn: &Conn, asked: i64) -> Self {
        let id = rand::rng().random_range(1..=i64::MAX);
        conn.shared.lease_opened(id);
        Self {
            conn: conn.clone(),
            id,
            asked,
            renewed_at: Instant::now(),
            retry_at: None,
            keeper: Exclusive::default(),
            unread: false,
            live: true,
        }
    }

    fn ttl(&self) -> Duration {
        Duration::from_secs(self.asked.unsigned_abs())
    }

    /// Grant the lease on the server (one raft commit).
    pub(crate) async fn grant(&mut self, op: &'static str) -> Result<(), Error> {
        let (id, asked) = (self.id, self.asked);
        let grant = || {
            let mut lease = self.conn.client.lease_client();
            async move {
                let options = LeaseGrantOptions::new().with_id(id);
                lease.grant(asked, Some(options)).await
            }
        };
        let sent = Instant::now();
        let granted = self.conn.call(op, grant).await?;
        if granted.id() != self.id || granted.ttl() < self.asked {
            return Err(Error::Protocol {
                op,
                what: "the lease granted is not the one asked for",
            });
        }
        self.renewed_at = sent;
        Ok(())
    }

    /// Send one keep-alive and wait for its answer (not a raft commit: the leader renews
    /// leases in memory).
    pub(crate) async fn keep_alive(&mut self, op: &'static str) -> Result<(), Error> {
        let sent = Instant::now();
        let id = self.id;
        if std::mem::take(&mut self.unread) {
            *self.keeper.get() = None;
        }
        let answer = match self.keeper.get() {
            Some((keeper, stream)) => {
                self.unread = true;
                let keep_alive = async {
                    keeper.keep_alive().await?;
                    match stream.message().await? {
                        Some(answer) => Ok(answer.ttl()),
                        None => Err(etcd_client::Error::LeaseKeepAliveError(
                            "the keep-alive stream ended".into(),
                        )),
                    }
                };
                let answer = self.conn.call_once(op, keep_alive).await;
                self.unread = false;
                answer
            }
            None => {
                // Opening the stream sends a keep-alive, and fails unless the lease lives.
                let open = || {
                    let mut lease = self.conn.client.lease_client();
                    async move { lease.keep_alive(id).await }
                };
                self.conn.call(op, open).await.map(|opened| {
                    *self.keeper.get() = Some(opened);
                    i64::MAX
                })
            }
        };
        match answer {
            Ok(ttl) if ttl > 0 => {
                self.renewed_at = sent;
                self.retry_at = None;
                Ok(())
            }
            Ok(_) => {
                self.gone();
                Err(Error::LeaseGone { op })
            }
            Err(e) => {
                *self.keeper.get() = None;
                if e.is_lease_not_found() {
                    self.gone();
                }
                Err(e)
            }
        }
    }

    /// While waiting: when the next keep-alive is due, on the watchdog's schedule (a third
    /// of the ttl after the last one sent, or the retry after one failed).
    pub(crate) fn renewal_due(&self) -> Instant {
        self.retry_at
            .unwrap_or_else(|| dlock_core::raw::renewal_due(self.renewed_at, self.ttl()))
    }

    /// While waiting: keep the lease alive; give up when it is gone, or when keep-alives
    /// keep failing until the watchdog would fire `lost()` (the lease may have expired).
    pub(crate) async fn renew_while_waiting(&mut self, key: &str) -> Result<()> {
        match self.keep_alive("acquire").await {
            Ok(()) => Ok(()),
            Err(e) if e.is_lease_gone() => Err(lease_lost(
                key,
                "the lease of our waiting key expired or was revoked",
            )),
            Err(e) => {
                let retry =
                    dlock_core::raw::renewal_retry(self.renewed_at, self.ttl(), Instant::now());
                let Some(retry) = retry else {
                    return Err(e.into());
                };
                tracing::debug!(backend = NAME, key, error = %e, "keep-alive while waiting failed; retrying");
                self.retry_at = Some(retry);
                Ok(())
            }
        }
    }

    /// Revoke the lease now (one raft commit; deletes the keys attached to it).
    pub(crate) async fn revoke(&mut self, op: &'static str) -> Result<(), Error> {
        if self.live {
            *self.keeper.get() = None;
            self.conn.revoke(op, self.id).await?;
            self.live = false;
        }
        Ok(())
    }

    /// Revoke the lease without waiting for the answer: a spawned request (retried on a
    /// refused connection), or nothing outside a runtime, where the lease expires with its
    /// ttl.
    pub(crate) fn revoke_in_background(&mut self) {
        if !std::mem::replace(&mut self.live, false) {
            return;
        }
        *self.keeper.get() = None;
        let (conn, id, ttl) = (self.conn.clone(), self.id, self.ttl());
        let spawned = dlock_core::raw::spawn_cleanup(async move {
            if let Err(e) = conn.revoke("release", id).await {
                tracing::debug!(backend = NAME, lease = id, error = %e, "background revoke failed; the lease expires with its ttl");
                conn.shared.lease_abandoned(id, ttl);
            }
        });
        if !spawned {
            self.conn.shared.lease_abandoned(id, ttl);
            tracing::debug!(
                backend = NAME,
                lease = id,
                "no runtime to revoke the lease; it expires with its ttl"
            );
        }
    }

    /// The server no longer has the lease.
    fn gone(&mut self) {
        self.live = false;
        *self.keeper.get() = None;
        self.conn.shared.lease_closed(self.id);
    }
}

impl Drop for LeaseHandle {
    fn drop(&mut self) {
        self.revoke_in_background();
    }
}

/// A value only ever used through `&mut`, so it can be `Sync` without being shared: the
/// gRPC streams are `Send` but not `Sync`, and a [`Held`](dlock_core::raw::Held) must be
/// both.
#[derive(Default)]
struct Exclusive<T>(Mutex<T>);

impl<T> Exclusive<T> {
    fn get(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(|e| e.into_inner())
    }
}

/// The lease a key is put on: its own (a hold whose ttl must free the key: auto-renew
/// off), or the client's shared lease of that ttl.
pub(crate) enum KeyLease {
    Own(Box<LeaseHandle>),
    Shared(SharedUse),
}

impl KeyLease {
    /// The lease for a key of `opts`: the shared one (joined, and granted if need be) when
    /// the core renews the hold, else a new one of its own, granted by [`Self::prepare`].
    pub(crate) async fn for_options(conn: &Conn, opts: &LockOptions) -> Result<Self, Error> {
        let asked = whole_seconds(opts.ttl);
        Ok(match opts.auto_renew {
            true => Self::Shared(SharedUse::join(conn, asked).await?),
            false => Self::Own(Box::new(LeaseHandle::new(conn, asked))),
        })
    }

    pub(crate) fn id(&self) -> i64 {
        match self {
            Self::Own(own) => own.id,
            Self::Shared(shared) => shared.lease.id,
        }
    }

    /// The ttl asked for, in whole seconds.
    pub(crate) fn asked(&self) -> i64 {
        match self {
            Self::Own(own) => own.asked,
            Self::Shared(shared) => shared.lease.asked,
        }
    }

    /// Make the lease exist on the server: grant an own lease (one commit); a shared one
    /// already is.
    pub(crate) async fn prepare(&mut self, op: &'static str) -> Result<(), Error> {
        match self {
            Self::Own(own) => own.grant(op).await,
            Self::Shared(_) => Ok(()),
        }
    }

    /// When the last grant or keep-alive that succeeded was sent (long ago for a shared
    /// lease that is lost).
    pub(crate) fn renewed_at(&self) -> Instant {
        match self {
            Self::Own(own) => own.renewed_at,
            Self::Shared(shared) => shared.alive_until().map_or_else(
                || Instant::now() - shared.lease.ttl(),
                |until| until - shared.lease.ttl(),
            ),
        }
    }

    /// While waiting: resolves when the lease needs tending ([`Self::tend`]): an own
    /// lease's keep-alive is due, or the shared lease is lost.
    pub(crate) async fn needs_tending(&self) {
        match self {
            Self::Own(own) => tokio::time::sleep_until(own.renewal_due()).await,
            Self::Shared(shared) => {
                shared.lease.lost().await;
            }
        }
    }

    /// While waiting: keep an own lease alive; fail with `LeaseLost` once the lease is gone.
    pub(crate) async fn tend(&mut self, key: &str) -> Result<()> {
        match self {
            Self::Own(own) => own.renew_while_waiting(key).await,
            Self::Shared(shared) => match shared.alive_until() {
                Some(_) => Ok(()),
                None => Err(lease_lost(
                    key,
                    "the shared lease of our waiting key expired or was revoked",
                )),
            },
        }
    }

    /// Give the key up after an attempt that did not hold it (or a dropped one): revoke an
    /// own lease, delete the key from a shared one; in the background.
    pub(crate) fn abandon(self, conn: &Conn, my_key: String) {
        match self {
            Self::Own(mut own) => own.revoke_in_background(),
            Self::Shared(shared) => delete_in_background(conn.clone(), my_key, None, Some(shared)),
        }
    }
}
