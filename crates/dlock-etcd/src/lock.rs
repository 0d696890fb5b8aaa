//! [`EtcdBackend`]: connecting, and the [`Backend`] implementation, whose acquire puts each
//! acquisition's key on the shared lease of its ttl (or on its own lease), runs its
//! [`Attempt`], and turns a won attempt into a [`Grant`] of an [`EtcdHeld`]. The protocol
//! is described in the crate docs.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant};
use dlock_core::{
    Capabilities, Expiry, Fencing, Inspection, KeyStatus, Leader, LockOptions, LockStats, Mode,
    Observe, Reentry, Result, WaiterView, Wakeup,
};
use etcd_client::{Client, ConnectOptions};
use futures::stream::BoxStream;

use crate::NAME;
use crate::acquire::{Attempt, Outcome, PERMITS, READERS};
use crate::config::EtcdConfig;
use crate::connection::Conn;
use crate::error::Error;
use crate::held::EtcdHeld;
use crate::lease::KeyLease;
use crate::reentry::{Hold, Keeping, Life, Reentered};
use crate::shared::delete_in_background;

/// HTTP/2 keep-alive ping interval on busy connections, so a dead connection under a
/// long-lived watch is noticed. etcd refuses pings more often than every 5 s.
const H2_PING_INTERVAL: Duration = Duration::from_secs(10);

/// One etcd client: a gRPC channel balanced over the endpoints, shared by every lock it
/// takes. Auto-renewed holds share one lease per ttl; the others get their own (see the
/// crate docs).
pub struct EtcdBackend {
    conn: Conn,
    config: EtcdConfig,
}

impl EtcdBackend {
    /// Connect with `config`, bounded by its connect timeout. Checks the server answers
    /// (one `Status` request), so a wrong address or a server of the wrong kind fails here.
    ///
    /// # Errors
    /// As [`from_url`](crate::from_url).
    pub async fn connect(config: EtcdConfig) -> Result<Self> {
        config.validate()?;
        let mut options = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(config.connect_timeout())
            .with_keep_alive(H2_PING_INTERVAL, config.request_timeout());
        if let Some(tls) = config.tls_options()? {
            options = options.with_tls(tls);
        }
        if let Some((user, password)) = config.credentials() {
            options = options
                .with_user(user, password)
                .with_auto_token_refresh(true);
        }
        let endpoints = config.endpoints();
        let connect = async {
            let client = Client::connect(&endpoints, Some(options))
                .await
                .map_err(|e| Error::etcd("connect", e).at_connect())?;
            let conn = Conn {
                client: Arc::new(client),
                endpoints: endpoints.len(),
                timeout: config.request_timeout(),
                shared: Arc::default(),
                probe: match config.prefix() {
                    "" => "dlock".into(),
                    prefix => prefix.into(),
                },
            };
            let status = || {
                let mut maintenance = conn.client.maintenance_client();
                async move { maintenance.status().await }
            };
            conn.call("connect", status)
                .await
                .map_err(Error::at_connect)?;
            Ok::<_, Error>(conn)
        };
        let limit = config.connect_timeout();
        let conn = match tokio::time::timeout(limit, connect).await {
            Ok(conn) => conn?,
            Err(_) => {
                return Err(Error::TimedOut {
                    op: "connect",
                    after: limit,
                }
                .into());
            }
        };
        tracing::debug!(backend = NAME, endpoints = ?endpoints, "connected");
        Ok(Self { conn, config })
    }

    /// The configuration this client was made with.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }

    /// Ids of the leases this client granted and has not yet seen revoked or expired (some
    /// may have expired on the server since). For diagnostics and leak tests.
    pub fn open_leases(&self) -> Vec<i64> {
        self.conn.shared.open_leases()
    }

    /// Ids of this client's shared leases that hold no key now and linger (one ttl, kept
    /// alive) for its next acquire; a subset of [`Self::open_leases`]. They are revoked when
    /// the linger ends or this client (its last clone) is dropped. For diagnostics and leak
    /// tests.
    pub fn idle_shared_leases(&self) -> Vec<i64> {
        self.conn.shared.shared_leases.idle()
    }
}

impl Drop for EtcdBackend {
    fn drop(&mut self) {
        // Nobody can acquire through this client any more: nothing to linger for.
        self.conn.shared.shared_leases.close();
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: true,
            shared: true,
            permits: true,
            fencing: Fencing::Strict,
            expiry: Expiry::Ttl,
            wakeup: Wakeup::Notification {
                one_per_release: true,
                max_per_waiter: 1,
            },
            // Keys and leases are replicated and persisted; a new leader extends every lease.
            faults: dlock_core::Faults {
                holder_paused: dlock_core::FaultSafety::Fenced,
                server_restart: dlock_core::FaultSafety::Exclusive,
                member_down: dlock_core::FaultSafety::Exclusive,
                member_cut: dlock_core::FaultSafety::Exclusive,
                member_unreachable: dlock_core::FaultSafety::Exclusive,
                slow_link: dlock_core::FaultSafety::Exclusive,
                clock_jump: dlock_core::FaultSafety::Unspecified,
            },
            // Each key's value names its holder (an empty one, Go's or etcdctl's: its
            // lease); every contender has a key, ordered by its create revision; the lock
            // names under the prefix decode back to their keys.
            inspect: Inspection {
                who: true,
                waiters: WaiterView::Queue,
                list: true,
            },
            // A campaign is the mutex with the candidate's value on its key; a watch on
            // the lock prefix wakes observers (see `crate::election`).
            election: Observe::Woken {
                recheck: crate::election::RECHECK,
            },
            // The owner and count live in the holding key's value, and the holding key on
            // the lease of the client that created it: when that client ends, its lease
            // expires and the key goes, whatever the count (see `crate::reentry`).
            reentrant: Reentry::FirstSession,
            ..Default::default()
        }
    }

    async fn inspect(&self, key: &str) -> Result<KeyStatus> {
        crate::inspect::inspect(&self.conn, &self.config, key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        crate::inspect::list(&self.conn, &self.config, prefix).await
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.conn.shared.wakeups.load(Ordering::Relaxed))
    }

    async fn acquire(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.take(key, opts, deadline, None).await
    }

    /// Go's `Election::Campaign`: the exclusive acquire, whose key carries `value`.
    async fn campaign(
        &self,
        key: &str,
        value: &str,
        opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.take(key, opts, deadline, Some(value)).await
    }

    async fn leader(&self, key: &str) -> Result<Option<Leader>> {
        crate::election::leader(&self.conn, &self.prefix(key)).await
    }

    async fn leader_changes(&self, key: &str) -> Result<Option<BoxStream<'static, Result<()>>>> {
        let changes = crate::election::changes(&self.conn, &self.prefix(key)).await?;
        Ok(Some(changes))
    }
}

impl EtcdBackend {
    /// The prefix of `key`'s lock, `{lock name}/`, under which every contender's key is.
    fn prefix(&self, key: &str) -> String {
        format!("{}/", self.config.lock_name(key))
    }

    /// Acquire `key` (as an election candidate publishing `value`, for a campaign).
    async fn take(
        &self,
        key: &str,
        opts: &LockOptions,
        deadline: Deadline,
        value: Option<&str>,
    ) -> Result<Option<Grant>> {
        // A shared lease found gone is replaced once by a fresh one.
        let mut rounds = 0;
        let (my_key, lease, outcome, keeping) = loop {
            let join = KeyLease::for_options(&self.conn, opts);
            let lease = match deadline {
                Deadline::TryOnce => join.await?,
                _ => match deadline.run(join).await {
                    Some(lease) => lease?,
                    None => return Ok(None),
                },
            };
            let prefix = self.prefix(key);
            // A reader's key sits in the readers' range, which other readers pass over; a
            // permit's in the permits' range, the only one it counts.
            let name = match opts.mode {
                Mode::Exclusive => prefix.clone(),
                Mode::Shared => format!("{prefix}{READERS}"),
                Mode::Permits(_) => format!("{prefix}{PERMITS}"),
            };
            let my_key = match &lease {
                KeyLease::Own(own) => format!("{name}{:x}", own.id),
                KeyLease::Shared(shared) => self
                    .conn
                    .shared
                    .claim_key(format!("{name}{:x}", shared.lease.id)),
            };
            // An owner's key is registered before it is put: a re-entry of this client
            // that finds it holding (even before this attempt returns) lives on its lease.
            let keeping = opts.owner.map(|_| {
                let life = match &lease {
                    KeyLease::Shared(shared) => Life::Shared(shared.lease.clone()),
                    KeyLease::Own(_) => Life::Taking,
                };
                Keeping::start(&self.conn, &my_key, life)
            });
            let mut pending = Pending {
                conn: &self.conn,
                my_key: my_key.clone(),
                lease: Some(lease),
            };
            let attempt = Attempt {
                conn: &self.conn,
                key,
                my_key: my_key.clone(),
                prefix,
                mode: opts.mode,
                value,
                owner: opts.owner,
            };
            let outcome = {
                let lease = pending.lease.as_mut().expect("taken only below");
                match deadline {
                    Deadline::TryOnce => attempt.run(lease, deadline).await?,
                    // At the deadline the attempt is dropped and `pending` gives the key up.
                    _ => match deadline.run(attempt.run(lease, deadline)).await {
                        Some(outcome) => outcome?,
                        None => return Ok(None),
                    },
                }
            };
            let lease = pending.lease.take().expect("taken once");
            match (outcome, lease) {
                (Outcome::LeaseGone, KeyLease::Shared(shared)) if rounds == 0 => {
                    rounds += 1;
                    self.conn.shared.unclaim_key(&my_key);
                    shared.lease.declare_lost(&self.conn);
                }
                (Outcome::LeaseGone, _) => {
                    return Err(Error::LeaseGone { op: "acquire" }.into());
                }
                (outcome, lease) => break (my_key, lease, outcome, keeping),
            }
        };
        match outcome {
            Outcome::LeaseGone => unreachable!("handled above"),
            Outcome::Reenter(_) => unreachable!("handled by the attempt"),
            Outcome::Reentered(entry, sent_at, waited) => {
                let hold = entry.take();
                // Our key was deleted by the re-entering transaction: the lease we put it
                // on has nothing of ours left.
                match lease {
                    KeyLease::Own(mut own) => own.revoke_in_background(),
                    KeyLease::Shared(shared) => {
                        self.conn.shared.unclaim_key(&my_key);
                        drop(shared);
                    }
                }
                let token = u64::try_from(hold.rev).map_err(|_| Error::Protocol {
                    op: "acquire",
                    what: "a negative revision",
                })?;
                // The holding key on a lease of this client: the re-entry lives exactly
                // as long as that lease, and is kept alive with it, its lost signal that
                // lease's. Else (another client's) not kept alive: the watchdog's extend
                // (a read of the holding key) checks it every ttl/3.
                let life = self.conn.shared.owner_holds.life(&hold.etcd_key);
                let local = life.is_some();
                let (held, lost) = Reentered::start(hold, life);
                let mut grant = Grant::new(token, Box::new(held), sent_at).with_lost(lost);
                if local {
                    grant = grant.kept_alive();
                }
                Ok(Some(if waited { grant.after_wait() } else { grant }))
            }
            Outcome::Busy => {
                // Revoking our own lease deletes our key, before the caller can try again.
                match lease {
                    KeyLease::Own(mut own) => {
                        if let Err(e) = own.revoke("acquire").await {
                            tracing::debug!(backend = NAME, key, error = %e, "revoke after a busy try failed; retried in the background");
                        }
                    }
                    KeyLease::Shared(shared) => {
                        match self.conn.delete_key("acquire", &my_key, None).await {
                            Ok(_) => self.conn.shared.unclaim_key(&my_key),
                            Err(e) => {
                                tracing::debug!(backend = NAME, key, error = %e, "delete after a busy try failed; retried in the background");
                                delete_in_background(self.conn.clone(), my_key, None, Some(shared));
                            }
                        }
                    }
                }
                Ok(None)
            }
            Outcome::Held {
                rev,
                seen,
                watch,
                waited,
            } => {
                // The waiter's stream is not kept: the client's stream on held keys
                // watches our key from where the waiter had seen it.
                drop(watch);
                let sent_at = lease.renewed_at();
                let shared = matches!(lease, KeyLease::Shared(_));
                let owner = opts
                    .owner
                    .map(|owner| Hold::first(&self.conn, key, &my_key, rev, owner));
                if let Some(keeping) = &keeping {
                    keeping.set(Life::of(&lease));
                }
                let (mut held, lost) = EtcdHeld::start(&self.conn, key, my_key, rev, seen, lease);
                held.owner = owner;
                held.keeping = keeping;
                let token = u64::try_from(rev).map_err(|_| Error::Protocol {
                    op: "acquire",
                    what: "a negative revision",
                })?;
                let mut grant = Grant::new(token, Box::new(held), sent_at).with_lost(lost);
                if waited {
                    grant = grant.after_wait();
                }
                // The shared lease's keeper renews every hold on it and fires `lost` on
                // each when it is gone: no renewal timer per hold.
                Ok(Some(if shared { grant.kept_alive() } else { grant }))
            }
        }
    }
}

/// An attempt's lease until the attempt ends: dropped before (the deadline, or the acquire
/// future dropped), the attempt's key is given up in the background.
struct Pending<'a> {
    conn: &'a Conn,
    my_key: String,
    lease: Option<KeyLease>,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease.abandon(self.conn, std::mem::take(&mut self.my_key));
        }
    }
}
