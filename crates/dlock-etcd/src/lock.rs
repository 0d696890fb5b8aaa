//! The [`Backend`] and [`Held`] implementations: connection, acquire, release, renewal and
//! loss detection, in that order. The protocol is described in the crate docs.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant, Held, LockClient};
use dlock_core::{Capabilities, Expiry, Fencing, LockError, LockStats, LostReason, Result, Wakeup};
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, KeyValue, LeaseGrantOptions,
    LeaseKeepAliveStream, LeaseKeeper, PutOptions, ResponseHeader, SortOrder, SortTarget, Txn,
    TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions, WatchResponse, WatchStream,
};
use futures::future::BoxFuture;
use rand::Rng;
use tokio::time::Instant;

use crate::config::EtcdConfig;
use crate::error::{Error, never_sent};

pub(crate) const NAME: &str = "etcd";

/// HTTP/2 keep-alive ping interval on busy connections, so a dead connection under a
/// long-lived watch is noticed. etcd refuses pings more often than every 5 s.
const H2_PING_INTERVAL: Duration = Duration::from_secs(10);

/// The watch id of a waiter's own key on its watch stream; predecessors get the next ones.
const OWN_WATCH: i64 = 1;

/// How many times in a row a waiter's watch may break (the stream fails, or the server
/// cancels a watch) before the acquire gives up.
const WATCH_BREAKS: u32 = 3;

/// Connect to the etcd cluster named by `url`: parse and check the whole URL, then connect
/// (and authenticate), bounded by its `connect_timeout`.
///
/// # Errors
/// [`LockError::InvalidConfig`] for a bad URL or an unreadable TLS file, before any network
/// I/O; [`LockError::Unavailable`] when no endpoint answers within the connect timeout;
/// [`LockError::Backend`] when the server refuses (wrong credentials, not an etcd server).
pub async fn from_url(url: &str) -> Result<LockClient<EtcdBackend>> {
    let config = EtcdConfig::from_url(url)?;
    Ok(LockClient::new(EtcdBackend::connect(config).await?))
}

/// One etcd client: a gRPC channel balanced over the endpoints, shared by every lock it
/// takes. Each acquisition gets its own lease (see the crate docs).
pub struct EtcdBackend {
    conn: Conn,
    config: EtcdConfig,
}

impl EtcdBackend {
    /// Connect with `config`, bounded by its connect timeout. Checks the server answers
    /// (one `Status` request), so a wrong address or a server of the wrong kind fails here.
    ///
    /// # Errors
    /// As [`from_url`].
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
                client,
                endpoints: endpoints.len(),
                timeout: config.request_timeout(),
                shared: Arc::default(),
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
        self.conn.shared.leases().iter().copied().collect()
    }
}

impl fmt::Debug for EtcdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdBackend")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// The client and what every request needs: its timeout, and the counters.
#[derive(Clone)]
struct Conn {
    client: Client,
    /// How many endpoints the client balances over.
    endpoints: usize,
    timeout: Duration,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    wakeups: AtomicU64,
    /// Leases granted (or being granted) and not yet seen gone.
    leases: Mutex<HashSet<i64>>,
}

impl Shared {
    fn leases(&self) -> std::sync::MutexGuard<'_, HashSet<i64>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Conn {
    /// Run one request made by `request`, bounded by the request timeout. A request that
    /// never left (the balancer picked an endpoint that refused the connection: a member
    /// that is down, or a connection not yet re-made after it came back) is made and sent
    /// again, at most twice per endpoint.
    async fn call<T, F, Fut>(&self, op: &'static str, mut request: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let attempts = 2 * self.endpoints + 1;
        self.call_once(op, async {
            let mut attempt = 1;
            loop {
                match request().await {
                    Err(e) if attempt < attempts && never_sent(&e) => {
                        tracing::debug!(backend = NAME, op, error = %e, "connection refused; sending again");
                        attempt += 1;
                    }
                    answer => return answer,
                }
            }
        })
        .await
    }

    /// Run `request` once, bounded by the request timeout.
    async fn call_once<T>(
        &self,
        op: &'static str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(answer) => answer.map_err(|e| Error::etcd(op, e)),
            Err(_) => Err(Error::TimedOut {
                op,
                after: self.timeout,
            }),
        }
    }

    async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse, Error> {
        self.call(op, || {
            let (mut kv, txn) = (self.client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Revoke lease `id`; a lease the server no longer has counts as revoked.
    async fn revoke(&self, op: &'static str, id: i64) -> Result<(), Error> {
        let revoke = || {
            let mut lease = self.client.lease_client();
            async move { lease.revoke(id).await }
        };
        match self.call(op, revoke).await {
            Ok(_) => {}
            Err(e) if e.is_lease_not_found() => {}
            Err(e) => return Err(e),
        }
        self.shared.leases().remove(&id);
        Ok(())
    }

    /// A watch stream whose first watch is `my_key`'s deletion after revision `seen`.
    async fn watch_own(
        &self,
        op: &'static str,
        my_key: &str,
        seen: i64,
    ) -> Result<Box<OwnWatch>, Error> {
        let options = WatchOptions::new()
            .with_start_revision(seen + 1)
            .with_filters([WatchFilterType::NoPut])
            .with_watch_id(OWN_WATCH);
        let watch = || {
            let (mut watch, options) = (self.client.watch_client(), options.clone());
            async move {
                let mut stream = watch.watch(my_key, Some(options)).await?;
                match stream.message().await? {
                    Some(created) if created.created() && !created.canceled() => {
                        Ok((created.watch_id(), stream))
                    }
                    Some(refused) => Err(etcd_client::Error::WatchError(format!(
                        "the server did not create the watch: {}",
                        refused.cancel_reason()
                    ))),
                    None => Err(etcd_client::Error::WatchError(
                        "the watch stream ended before the watch was created".into(),
                    )),
                }
            }
        };
        let (own_id, stream) = self.call(op, watch).await?;
        Ok(Box::new(OwnWatch { stream, own_id }))
    }
}

/// A value only ever used through `&mut`, so it can be `Sync` without being shared: the
/// gRPC streams are `Send` but not `Sync`, and a [`Held`] must be both.
#[derive(Default)]
struct Exclusive<T>(Mutex<T>);

impl<T> Exclusive<T> {
    fn get(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(|e| e.into_inner())
    }
}

/// The revision a response was served at.
fn revision(op: &'static str, header: Option<&ResponseHeader>) -> Result<i64, Error> {
    header.map(ResponseHeader::revision).ok_or(Error::Protocol {
        op,
        what: "a response without a header",
    })
}

/// The key-values of the `i`-th operation of a transaction, which must be a range.
fn ranged<'a>(
    op: &'static str,
    ops: &'a [TxnOpResponse],
    i: usize,
) -> Result<&'a [KeyValue], Error> {
    match ops.get(i) {
        Some(TxnOpResponse::Get(range)) => Ok(range.kvs()),
        _ => Err(Error::Protocol {
            op,
            what: "a transaction without the expected range result",
        }),
    }
}

/// A lease ttl in etcd's whole seconds, rounded up.
fn whole_seconds(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis().div_ceil(1000))
        .unwrap_or(i64::MAX)
        .max(1)
}

/// One acquisition's lease, with its keep-alive stream. Revoked in the background when
/// dropped unless it was revoked (or seen gone) before: that is what makes a dropped or
/// timed-out acquire, and a dropped holder, leave nothing behind.
struct LeaseHandle {
    conn: Conn,
    id: i64,
    /// The ttl asked for, in whole seconds. The server may grant more (it has a minimum).
    asked: i64,
    /// When the last grant or keep-alive that succeeded was sent: the server keeps the
    /// lease at least `asked` seconds from then.
    renewed_at: Instant,
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
    fn new(conn: &Conn, asked: i64) -> Self {
        let id = rand::rng().random_range(1..=i64::MAX);
        conn.shared.leases().insert(id);
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
    async fn grant(&mut self, op: &'static str) -> Result<(), Error> {
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
    async fn keep_alive(&mut self, op: &'static str) -> Result<(), Error> {
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

    /// While waiting: when the next keep-alive is due.
    fn renewal_due(&self) -> Instant {
        self.retry_at
            .unwrap_or_else(|| self.renewed_at + self.ttl() / 3)
    }

    /// While waiting: keep the lease alive; give up when it is gone, or when it may have
    /// expired because keep-alives keep failing.
    async fn renew_while_waiting(&mut self, key: &str) -> Result<()> {
        match self.keep_alive("acquire").await {
            Ok(()) => Ok(()),
            Err(e) if e.is_lease_gone() => Err(lease_lost(
                key,
                "the lease of our waiting key expired or was revoked",
            )),
            Err(e) => {
                let retry = (self.ttl() / 10).max(Duration::from_millis(50));
                let last_safe = self.renewed_at + self.ttl() - self.ttl() / 10;
                let now = Instant::now();
                if now + retry >= last_safe {
                    return Err(e.into());
                }
                tracing::debug!(backend = NAME, key, error = %e, "keep-alive while waiting failed; retrying");
                self.retry_at = Some(now + retry);
                Ok(())
            }
        }
    }

    /// Revoke the lease now (one raft commit; deletes the keys attached to it).
    async fn revoke(&mut self, op: &'static str) -> Result<(), Error> {
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
    fn revoke_in_background(&mut self) {
        if !std::mem::replace(&mut self.live, false) {
            return;
        }
        *self.keeper.get() = None;
        let (conn, id) = (self.conn.clone(), self.id);
        let spawned = dlock_core::raw::spawn_cleanup(async move {
            if let Err(e) = conn.revoke("release", id).await {
                tracing::debug!(backend = NAME, lease = id, error = %e, "background revoke failed; the lease expires with its ttl");
            }
        });
        if !spawned {
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
        self.conn.shared.leases().remove(&self.id);
    }
}

impl Drop for LeaseHandle {
    fn drop(&mut self) {
        self.revoke_in_background();
    }
}

fn lease_lost(key: &str, why: &str) -> LockError {
    LockError::LeaseLost {
        backend: NAME,
        key: key.to_owned(),
        reason: LostReason::SessionEnded(why.to_owned()),
    }
}

fn not_held(key: &str) -> LockError {
    LockError::NotHeld {
        backend: NAME,
        key: key.to_owned(),
        reason: LostReason::NotHeld,
    }
}

/// A watch stream carrying the watch on our own key, and while waiting one on the
/// predecessor.
struct OwnWatch {
    stream: WatchStream,
    own_id: i64,
}

/// What a watch response means to a waiter.
enum Seen {
    /// The server created the predecessor's watch: its id, and the store revision then.
    Created(i64, i64),
    OwnDeleted,
    PredecessorDeleted,
    /// The server refused or canceled a watch we rely on.
    Canceled(String),
    Nothing,
}

impl OwnWatch {
    /// `predecessor` is the id of the predecessor's watch, if one is set up.
    fn classify(&self, response: &WatchResponse, predecessor: Option<i64>) -> Seen {
        let id = response.watch_id();
        let ours = id == self.own_id || Some(id) == predecessor;
        if response.created() && !response.canceled() {
            let revision = response.header().map_or(i64::MAX, |h| h.revision());
            return Seen::Created(id, revision);
        }
        if response.canceled() {
            // A refused create carries no usable id; an old predecessor's cancel is ours
            // to ignore.
            return match ours || response.created() {
                true => Seen::Canceled(format!(
                    "the server canceled the watch: {}",
                    response.cancel_reason()
                )),
                false => Seen::Nothing,
            };
        }
        let deleted = response
            .events()
            .iter()
            .any(|e| e.event_type() == EventType::Delete);
        match (deleted, id == self.own_id, Some(id) == predecessor) {
            (true, true, _) => Seen::OwnDeleted,
            (true, false, true) => Seen::PredecessorDeleted,
            _ => Seen::Nothing,
        }
    }
}

/// How an attempt ended.
enum Outcome {
    /// We hold the key. `seen` is a revision at which our key was the oldest; `watch`
    /// the waiter's stream, whose own-key watch becomes the lost signal.
    Held {
        rev: i64,
        seen: i64,
        watch: Option<Box<OwnWatch>>,
    },
    /// The key is held and the deadline does not allow waiting.
    Busy,
}

/// A waiter's next step.
enum Next {
    /// Read who is ahead of us.
    Check,
    /// Wait for this predecessor, which existed at this revision.
    Wait(Vec<u8>, i64),
    /// Nobody is ahead of us at this revision.
    Held(i64),
    /// The watch broke (`true`: the server refused or canceled it).
    Broken(bool, String),
}

impl Next {
    fn broken(refused: bool, why: impl fmt::Display) -> Self {
        Self::Broken(refused, why.to_string())
    }
}

/// One acquisition of `key`: its lock prefix and its own etcd key.
struct Attempt<'a> {
    conn: &'a Conn,
    key: &'a str,
    prefix: String,
    my_key: String,
}

impl Attempt<'_> {
    /// Grant the lease, create our key and read the owner in one transaction, then wait
    /// for our turn if the deadline allows.
    async fn run(&self, lease: &mut LeaseHandle, deadline: Deadline) -> Result<Outcome> {
        const OP: &str = "acquire";
        lease.grant(OP).await?;
        let oldest = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_limit(1);
        let newest_two = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_limit(2);
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.my_key.as_str(),
                CompareOp::Equal,
                0,
            )])
            .and_then([
                TxnOp::put(
                    self.my_key.as_str(),
                    "",
                    Some(PutOptions::new().with_lease(lease.id)),
                ),
                TxnOp::get(self.prefix.as_str(), Some(oldest)),
                TxnOp::get(self.prefix.as_str(), Some(newest_two)),
            ]);
        let answer = self.conn.txn(OP, txn).await?;
        if !answer.succeeded() {
            return Err(Error::Protocol {
                op: OP,
                what: "the key of a fresh lease already existed",
            }
            .into());
        }
        let rev = revision(OP, answer.header())?;
        let ops = answer.op_responses();
        let owner = ranged(OP, &ops, 1)?.first().map(KeyValue::create_revision);
        if owner == Some(rev) {
            return Ok(Outcome::Held {
                rev,
                seen: rev,
                watch: None,
            });
        }
        if !deadline.may_wait() {
            return Ok(Outcome::Busy);
        }
        // Ours is the newest key, so the second newest is the one we wait for.
        let predecessor = ranged(OP, &ops, 2)?
            .iter()
            .find(|kv| kv.create_revision() < rev)
            .map(|kv| (kv.key().to_vec(), rev));
        self.wait(lease, rev, predecessor).await
    }

    /// Wait until no key under the prefix is older than ours: watch the deletion of the
    /// newest older key (only it: one wake-up per release) and of our own key, keep our
    /// lease alive, re-check after each deletion.
    ///
    /// The predecessor's watch starts at the current revision, so etcd serves it from its
    /// synced watcher group at once (a watch starting in the past is caught up by a loop
    /// that runs every 100 ms, which would delay the hand-off). If the store moved on
    /// since the read that named the predecessor, a read after the watch exists closes the
    /// gap: a deletion before it is seen by that read, one after it by the watch.
    async fn wait(
        &self,
        lease: &mut LeaseHandle,
        rev: i64,
        known: Option<(Vec<u8>, i64)>,
    ) -> Result<Outcome> {
        const OP: &str = "acquire";
        let mut watch: Option<Box<OwnWatch>> = None;
        let mut next_id = OWN_WATCH + 1;
        let mut breaks = 0;
        let mut next = match known {
            Some((predecessor, seen)) => Next::Wait(predecessor, seen),
            None => Next::Check,
        };
        loop {
            let (predecessor, seen) = match next {
                Next::Wait(predecessor, seen) => (predecessor, seen),
                Next::Check | Next::Broken(..) => match self.check(rev).await? {
                    (None, seen) => return Ok(Outcome::Held { rev, seen, watch }),
                    (Some(predecessor), seen) => (predecessor, seen),
                },
                Next::Held(seen) => return Ok(Outcome::Held { rev, seen, watch }),
            };
            let stream = match &mut watch {
                Some(stream) => stream,
                None => watch.insert(self.conn.watch_own(OP, &self.my_key, seen).await?),
            };
            let mut pred_id = next_id.max(stream.own_id + 1);
            next_id = pred_id + 1;
            let options = WatchOptions::new()
                .with_filters([WatchFilterType::NoPut])
                .with_watch_id(pred_id);
            self.conn
                .call_once(
                    OP,
                    stream.stream.watch(predecessor.as_slice(), Some(options)),
                )
                .await?;
            next = loop {
                let response = tokio::select! {
                    message = stream.stream.message() => match message {
                        Ok(Some(response)) => response,
                        Ok(None) => break Next::broken(false, "the watch stream ended"),
                        Err(e) => break Next::broken(false, e),
                    },
                    _ = tokio::time::sleep_until(lease.renewal_due()) => {
                        lease.renew_while_waiting(self.key).await?;
                        continue;
                    }
                };
                let deleted = match stream.classify(&response, Some(pred_id)) {
                    Seen::Created(id, revision) => {
                        // The id the server gave, should it not honour the one asked for.
                        pred_id = id;
                        if revision <= seen {
                            continue;
                        }
                        match self.check(rev).await? {
                            (Some(still), _) if still == predecessor => continue,
                            (Some(other), seen) => Next::Wait(other, seen),
                            (None, seen) => Next::Held(seen),
                        }
                    }
                    Seen::PredecessorDeleted => Next::Check,
                    Seen::OwnDeleted => {
                        return Err(lease_lost(
                            self.key,
                            "our waiting key was deleted (its lease expired or was revoked)",
                        ));
                    }
                    Seen::Canceled(why) => break Next::broken(true, why),
                    Seen::Nothing => continue,
                };
                // Our predecessor is gone: one wake-up.
                self.conn.shared.wakeups.fetch_add(1, Ordering::Relaxed);
                breaks = 0;
                let _ = stream.stream.cancel(pred_id).await;
                break deleted;
            };
            if let Next::Broken(refused, why) = &next {
                watch = None;
                breaks += 1;
                tracing::debug!(
                    backend = NAME,
                    key = self.key,
                    why,
                    "watch broke while waiting; re-checking"
                );
                if breaks > WATCH_BREAKS {
                    return Err(match refused {
                        true => LockError::backend(NAME, OP, why.clone()),
                        false => LockError::unavailable(NAME, OP, why.clone()),
                    });
                }
            }
        }
    }

    /// One linearizable read: the newest key older than ours, and our own key. Fails with
    /// `LeaseLost` when our key is gone.
    async fn check(&self, rev: i64) -> Result<(Option<Vec<u8>>, i64)> {
        const OP: &str = "acquire";
        let newest_older = GetOptions::new()
            .with_prefix()
            .with_sort(SortTarget::Create, SortOrder::Descend)
            .with_max_create_revision(rev - 1)
            .with_limit(1);
        let txn = Txn::new().and_then([
            TxnOp::get(self.prefix.as_str(), Some(newest_older)),
            TxnOp::get(self.my_key.as_str(), None),
        ]);
        let answer = self.conn.txn(OP, txn).await?;
        let seen = revision(OP, answer.header())?;
        let ops = answer.op_responses();
        let mine = ranged(OP, &ops, 1)?.first().map(KeyValue::create_revision);
        if mine != Some(rev) {
            return Err(lease_lost(
                self.key,
                "our waiting key was deleted (its lease expired or was revoked)",
            ));
        }
        let predecessor = ranged(OP, &ops, 0)?.first().map(|kv| kv.key().to_vec());
        Ok((predecessor, seen))
    }
}

#[async_trait]
impl Backend for EtcdBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: true,
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
            },
            ..Default::default()
        }
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.conn.shared.wakeups.load(Ordering::Relaxed))
    }

    async fn acquire(&self, key: &str, ttl: Duration, deadline: Deadline) -> Result<Option<Grant>> {
        let mut lease = LeaseHandle::new(&self.conn, whole_seconds(ttl));
        let prefix = format!("{}/", self.config.lock_name(key));
        let attempt = Attempt {
            conn: &self.conn,
            key,
            my_key: format!("{prefix}{:x}", lease.id),
            prefix,
        };
        let outcome = match deadline {
            Deadline::TryOnce => attempt.run(&mut lease, deadline).await?,
            // At the deadline the attempt is dropped and `lease` revokes itself.
            _ => match deadline.run(attempt.run(&mut lease, deadline)).await {
                Some(outcome) => outcome?,
                None => return Ok(None),
            },
        };
        match outcome {
            Outcome::Busy => {
                // Revoking deletes our key, before the caller can try again.
                if let Err(e) = lease.revoke("acquire").await {
                    tracing::debug!(backend = NAME, key, error = %e, "revoke after a busy try failed; retried in the background");
                }
                Ok(None)
            }
            Outcome::Held { rev, seen, watch } => {
                let sent_at = lease.renewed_at;
                let lost = lost_signal(self.conn.clone(), attempt.my_key.clone(), seen, watch);
                let held = EtcdHeld {
                    conn: self.conn.clone(),
                    key: key.to_owned(),
                    my_key: attempt.my_key,
                    rev,
                    lease,
                };
                let token = u64::try_from(rev).map_err(|_| Error::Protocol {
                    op: "acquire",
                    what: "a negative revision",
                })?;
                Ok(Some(
                    Grant::new(token, Box::new(held), sent_at).with_lost(lost),
                ))
            }
        }
    }
}

/// A held key: our etcd key, its create revision (the fencing token) and its lease.
struct EtcdHeld {
    conn: Conn,
    key: String,
    my_key: String,
    rev: i64,
    lease: LeaseHandle,
}

impl fmt::Debug for EtcdHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdHeld")
            .field("key", &self.key)
            .field("etcd_key", &self.my_key)
            .field("create_revision", &self.rev)
            .field("lease", &format_args!("{:x}", self.lease.id))
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

impl EtcdHeld {
    /// etcd cannot change a lease's ttl: attach our key to a new lease of the new ttl (the
    /// key, and so its create revision, stays), then revoke the old lease.
    async fn move_to_new_lease(&mut self, asked: i64) -> Result<()> {
        const OP: &str = "extend";
        let mut fresh = LeaseHandle::new(&self.conn, asked);
        fresh.grant(OP).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.my_key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::put(
                self.my_key.as_str(),
                "",
                Some(PutOptions::new().with_lease(fresh.id)),
            )]);
        if !self.conn.txn(OP, txn).await?.succeeded() {
            return Err(not_held(&self.key));
        }
        // The old lease holds no key any more.
        std::mem::replace(&mut self.lease, fresh).revoke_in_background();
        Ok(())
    }
}

#[async_trait]
impl Held for EtcdHeld {
    async fn release(&mut self) -> Result<()> {
        const OP: &str = "release";
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.my_key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::delete(self.my_key.as_str(), None)]);
        let deleted = self.conn.txn(OP, txn).await;
        // The key is gone (or was not ours): the lease only holds server memory now, so its
        // revoke need not delay the caller. The lease is this acquisition's alone: revoking
        // it removes nothing of anyone else.
        self.lease.revoke_in_background();
        if deleted?.succeeded() {
            Ok(())
        } else {
            Err(not_held(&self.key))
        }
    }

    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let asked = whole_seconds(ttl);
        if asked != self.lease.asked {
            return self.move_to_new_lease(asked).await;
        }
        let Self {
            conn,
            my_key,
            rev,
            lease,
            key,
        } = self;
        let (alive, ours) =
            tokio::join!(lease.keep_alive("extend"), still_ours(conn, my_key, *rev));
        match alive {
            Err(e) if e.is_lease_gone() => return Err(not_held(key)),
            Err(e) => return Err(e.into()),
            Ok(()) => {}
        }
        if !ours? {
            return Err(not_held(key));
        }
        Ok(())
    }
}

/// Resolves when our key is deleted while we hold it (an operator, `break_lease`, or the
/// lease expiring on the server). Lease expiry without a deletion seen here is caught by
/// the keep-alives in [`Held::extend`].
fn lost_signal(
    conn: Conn,
    my_key: String,
    seen: i64,
    watch: Option<Box<OwnWatch>>,
) -> BoxFuture<'static, LostReason> {
    Box::pin(async move {
        let mut watch = match watch {
            Some(watch) => watch,
            None => match conn.watch_own("watch", &my_key, seen).await {
                Ok(watch) => watch,
                Err(e) => {
                    tracing::debug!(backend = NAME, key = my_key, error = %e, "cannot watch our key; loss is detected by renewal");
                    return std::future::pending().await;
                }
            },
        };
        loop {
            match watch.stream.message().await {
                Ok(Some(response)) => match watch.classify(&response, None) {
                    Seen::OwnDeleted => return LostReason::NotHeld,
                    Seen::Canceled(_) => return std::future::pending().await,
                    _ => {}
                },
                Ok(None) | Err(_) => return std::future::pending().await,
            }
        }
    })
}
