//! The [`Backend`] and [`Held`] implementations: connection, acquire, release, renewal and
//! loss detection, in that order.

use std::future::Future;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Backend, Deadline, Grant, Held};
use dlock_core::{Capabilities, Expiry, Fencing, LockError, LockStats, LostReason, Result, Wakeup};
use tokio::time::Instant;
use zookeeper_client::{self as zk, Acls, CreateMode, EventType, SessionState};

use crate::NAME;
use crate::config::ZookeeperConfig;
use crate::error::{Error, is_session_over, is_uncertain};
use crate::nodes;

/// How often one request is retried after an uncertain failure before giving up (each retry
/// first waits until the client is connected again, so this only guards against a client
/// that keeps failing while connected).
const MAX_RETRIES: usize = 16;
/// How many sessions one acquire may go through (a session that expires while it waits is
/// replaced and the acquire starts over).
const MAX_SESSIONS: usize = 3;
/// How long an acquire that gave up may spend deleting its node before it leaves that to a
/// background task.
const WITHDRAW_BOUND: Duration = Duration::from_secs(1);

const EPHEMERAL_SEQUENTIAL: zk::CreateOptions<'static> =
    CreateMode::EphemeralSequential.with_acls(Acls::anyone_all());
const CONTAINER: zk::CreateOptions<'static> = CreateMode::Container.with_acls(Acls::anyone_all());
const PERSISTENT: zk::CreateOptions<'static> = CreateMode::Persistent.with_acls(Acls::anyone_all());

// ------------------------------------------------------------------------------ connection

/// One ZooKeeper session and the lock recipe on top of it.
///
/// All locks of one backend share its session. When the session expires, the leases it
/// carried are lost and the next acquire opens a new session.
#[derive(Debug)]
pub struct ZookeeperBackend {
    config: ZookeeperConfig,
    session: tokio::sync::Mutex<zk::Client>,
    session_id: AtomicI64,
    session_timeout_ms: AtomicU64,
    wakeups: AtomicU64,
}

impl ZookeeperBackend {
    /// Open a session to the ensemble `config` names, within its connect timeout.
    ///
    /// # Errors
    /// [`LockError::Unavailable`] when no member answers in time; [`LockError::Backend`]
    /// when the server refuses the session.
    pub async fn connect(config: ZookeeperConfig) -> Result<Self> {
        let client = open_session(&config).await?;
        let backend = Self {
            config,
            session_id: AtomicI64::new(0),
            session_timeout_ms: AtomicU64::new(0),
            session: tokio::sync::Mutex::new(client.clone()),
            wakeups: AtomicU64::new(0),
        };
        backend.note_session(&client);
        Ok(backend)
    }

    /// The configuration this backend was made from.
    pub fn config(&self) -> &ZookeeperConfig {
        &self.config
    }

    /// The id of the current session (as the server's `cons` command prints it, in hex),
    /// for operators matching a client to its connection.
    pub fn session_id(&self) -> i64 {
        self.session_id.load(Ordering::Relaxed)
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.session_timeout_ms.load(Ordering::Relaxed))
    }

    fn note_session(&self, client: &zk::Client) {
        self.session_id
            .store(client.session_id().0, Ordering::Relaxed);
        let timeout = u64::try_from(client.session_timeout().as_millis()).unwrap_or(u64::MAX);
        self.session_timeout_ms.store(timeout, Ordering::Relaxed);
        tracing::debug!(backend = NAME, session = %client.session_id(), timeout_ms = timeout, "session open");
    }

    /// The current session's client; a new session if the current one has ended.
    async fn client(&self, deadline: Deadline) -> Result<zk::Client> {
        let mut current = self.session.lock().await;
        if current.state().is_terminated() {
            tracing::info!(backend = NAME, state = %current.state(), "session ended; opening a new one");
            let fresh = deadline
                .run(open_session(&self.config))
                .await
                .unwrap_or_else(|| Err(Error::zk("connect", zk::Error::Timeout).into()))?;
            self.note_session(&fresh);
            *current = fresh;
        }
        Ok(current.clone())
    }
}

async fn open_session(config: &ZookeeperConfig) -> Result<zk::Client> {
    let hosts = config.connect_string();
    let connect = zk::Client::connector()
        .with_session_timeout(config.session_timeout)
        // The client's own default, pinned: `lost_after_disconnect` relies on it.
        .with_connection_timeout(config.session_timeout * 2 / 5)
        .with_fail_eagerly()
        .connect(&hosts);
    match tokio::time::timeout(config.connect_timeout, connect).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(e)) => Err(Error::zk("connect", e).into()),
        Err(_) => Err(Error::zk("connect", zk::Error::Timeout).into()),
    }
}

/// Wait until the client is connected; an error once its session has ended.
async fn connected(client: &zk::Client) -> Result<(), zk::Error> {
    let mut states = client.state_watcher();
    loop {
        match states.peek_state() {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => return Ok(()),
            SessionState::Disconnected => {
                states.changed().await;
            }
            SessionState::Expired => return Err(zk::Error::SessionExpired),
            SessionState::AuthFailed => return Err(zk::Error::AuthFailed),
            SessionState::Closed => return Err(zk::Error::ClientClosed),
        }
    }
}

/// Run a request until it gets a definite answer, by `until`: after an uncertain failure
/// (the connection dropped) it is sent again once the client is connected. Only for
/// requests that are safe to repeat. Running out of time is [`zk::Error::Timeout`].
async fn retry<T, F, Fut>(
    client: &zk::Client,
    until: Instant,
    mut request: F,
) -> Result<T, zk::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, zk::Error>>,
{
    let attempts = async {
        for _ in 0..MAX_RETRIES {
            match request().await {
                Err(e) if is_uncertain(&e) => connected(client).await?,
                answer => return answer,
            }
        }
        Err(zk::Error::ConnectionLoss)
    };
    tokio::time::timeout_at(until, attempts)
        .await
        .unwrap_or(Err(zk::Error::Timeout))
}

/// Delete `path` by `until`, retrying after a lost connection. `Ok(true)` when this call
/// deleted it, `Ok(false)` when it was not there (a retry that finds it gone after an
/// uncertain attempt counts as deleted).
async fn delete(client: &zk::Client, path: &str, until: Instant) -> Result<bool, zk::Error> {
    let mut uncertain = false;
    let attempts = async {
        for _ in 0..MAX_RETRIES {
            match client.delete(path, None).await {
                Ok(()) => return Ok(true),
                Err(zk::Error::NoNode) => return Ok(uncertain),
                Err(e) if is_uncertain(&e) => {
                    uncertain = true;
                    connected(client).await?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(zk::Error::ConnectionLoss)
    };
    tokio::time::timeout_at(until, attempts)
        .await
        .unwrap_or(Err(zk::Error::Timeout))
}

/// Delete a key's directory if it is empty (best effort: a contender may be using it).
/// Container nodes are reaped by the server too, but only at its check interval.
async fn delete_dir_if_empty(client: &zk::Client, dir: &str) {
    match client.delete(dir, None).await {
        Ok(()) | Err(zk::Error::NoNode | zk::Error::NotEmpty) => {}
        Err(e) => {
            tracing::debug!(backend = NAME, dir, error = %e, "could not remove the key directory")
        }
    }
}

/// Delete our node and, in the same round trip, the key directory if that leaves it empty
/// (`NotEmpty` while others wait). `Ok(true)` when the node was deleted, `Ok(false)` when it
/// was not there; after a lost connection the node's delete is retried by `until`.
async fn delete_node_and_dir(
    client: &zk::Client,
    path: &str,
    dir: &str,
    until: Instant,
) -> Result<bool, zk::Error> {
    let node = client.delete(path, None);
    let dir_deleted = client.delete(dir, None);
    let pipelined = futures::future::join(node, dir_deleted);
    let (node, _) = tokio::time::timeout_at(until, pipelined)
        .await
        .map_err(|_| zk::Error::Timeout)?;
    match node {
        Ok(()) => Ok(true),
        Err(zk::Error::NoNode) => Ok(false),
        Err(e) if is_uncertain(&e) => {
            delete(client, path, until).await?;
            delete_dir_if_empty(client, dir).await;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}

// ------------------------------------------------------------------------------ acquire

#[async_trait]
impl Backend for ZookeeperBackend {
    const NAME: &'static str = NAME;

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            fair: true,
            fencing: Fencing::Strict,
            expiry: Expiry::Session {
                timeout: self.session_timeout(),
            },
            wakeup: Wakeup::Notification {
                one_per_release: true,
                max_per_waiter: 1,
            },
            // Nodes and sessions are replicated and persisted: a restart or a lost member
            // ends no session early.
            faults: dlock_core::Faults {
                holder_paused: dlock_core::FaultSafety::Fenced,
                server_restart: dlock_core::FaultSafety::Exclusive,
                member_down: dlock_core::FaultSafety::Exclusive,
            },
            ..Default::default()
        }
    }

    fn stats(&self) -> LockStats {
        LockStats::with_wakeups(self.wakeups.load(Ordering::Relaxed))
    }

    async fn acquire(
        &self,
        key: &str,
        _ttl: Duration,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        let dir = self.config.key_dir(key);
        for _ in 0..MAX_SESSIONS {
            let client = self.client(deadline).await?;
            let budget = Budget {
                deadline,
                bound: client.session_timeout(),
            };
            match self.take(&client, key, &dir, budget).await {
                Ok(grant) => return Ok(grant),
                Err(e) if is_session_over(&e) => {
                    tracing::info!(backend = NAME, key, error = %e, "session ended during acquire; starting over");
                }
                Err(zk::Error::Timeout)
                    if !deadline.may_wait() && deadline != Deadline::TryOnce =>
                {
                    return Ok(None);
                }
                Err(e) => return Err(Error::zk("acquire", e).into()),
            }
        }
        Err(Error::zk("acquire", zk::Error::SessionExpired).into())
    }
}

/// How long the phases of one acquire may take: each request at most a session timeout
/// (a request unanswered that long means the session is as good as gone), and never past
/// the caller's deadline.
#[derive(Debug, Clone, Copy)]
struct Budget {
    deadline: Deadline,
    bound: Duration,
}

impl Budget {
    fn until(&self) -> Instant {
        let bounded = Instant::now() + self.bound;
        match self.deadline {
            Deadline::At(at) => at.min(bounded),
            Deadline::TryOnce | Deadline::Never => bounded,
        }
    }
}

impl ZookeeperBackend {
    /// The recipe on one session: create our node, then until we are the lowest contender,
    /// watch the one just before us.
    async fn take(
        &self,
        client: &zk::Client,
        key: &str,
        dir: &str,
        budget: Budget,
    ) -> Result<Option<Grant>, zk::Error> {
        let mut me = Contender::new(client, dir);
        let sent_at = Instant::now();
        let mut listed = Some(me.create(budget).await?);
        loop {
            let children = match listed.take() {
                Some(children) => children,
                None => match retry(client, budget.until(), || client.list_children(dir)).await {
                    Err(zk::Error::NoNode) => Vec::new(),
                    children => children?,
                },
            };
            let order = nodes::contenders(children);
            let Some(position) = order.iter().position(|n| Some(n.as_str()) == me.name()) else {
                // Our node is gone: an operator deleted it, or the session ended (then the
                // next request says so). Queue again at the back.
                tracing::info!(
                    backend = NAME,
                    dir,
                    "our lock node vanished while waiting; queueing again"
                );
                me.forget();
                me = Contender::new(client, dir);
                listed = Some(me.create(budget).await?);
                continue;
            };
            if position == 0 {
                return Ok(Some(me.into_grant(key, sent_at)));
            }
            if !budget.deadline.may_wait() {
                me.withdraw().await;
                return Ok(None);
            }
            let predecessor = format!("{dir}/{}", order[position - 1]);
            let watcher = match retry(client, budget.until(), || {
                client.get_and_watch_data(&predecessor)
            })
            .await
            {
                // Gone already: look again at once.
                Err(zk::Error::NoNode) => continue,
                watched => watched?.2,
            };
            let event = tokio::select! {
                event = watcher.changed() => event,
                () = budget.deadline.reached() => {
                    me.withdraw().await;
                    return Ok(None);
                }
            };
            self.wakeups.fetch_add(1, Ordering::Relaxed);
            tracing::trace!(backend = NAME, dir, event = ?event.event_type, "woken");
            if event.event_type == EventType::Session && event.session_state.is_terminated() {
                return Err(zk::Error::SessionExpired);
            }
        }
    }
}

/// Our lock node while it is not (yet) a lease. Dropped without
/// [`into_grant`](Contender::into_grant), it deletes the node in the background, retrying on
/// connection loss, so a timed-out, failed or cancelled acquire leaves nothing behind.
struct Contender {
    client: zk::Client,
    dir: String,
    uuid: uuid::Uuid,
    node: Option<Node>,
    /// A create went out whose outcome is unknown.
    unsure: bool,
}

#[derive(Debug, Clone)]
struct Node {
    name: String,
    czxid: i64,
}

impl Contender {
    fn new(client: &zk::Client, dir: &str) -> Self {
        Self {
            client: client.clone(),
            dir: dir.to_owned(),
            uuid: uuid::Uuid::new_v4(),
            node: None,
            unsure: false,
        }
    }

    fn name(&self) -> Option<&str> {
        self.node.as_ref().map(|n| n.name.as_str())
    }

    /// Create the key directory (a container node; `NodeExists` is the usual answer while
    /// the key is in use), our node (ephemeral-sequential, protected name), and list the
    /// directory, all in one round trip: ZooKeeper answers one session's requests in order,
    /// so the listing already holds our node. Creates the base path if missing. After a
    /// lost connection, finds the node the lost create may have made before creating again
    /// (Curator's protected mode).
    async fn create(&mut self, budget: Budget) -> Result<Vec<String>, zk::Error> {
        let prefix = format!("{}/{}", self.dir, nodes::node_prefix(&self.uuid));
        for _ in 0..MAX_RETRIES {
            self.unsure = true;
            let dir = self.client.create(&self.dir, &[], &CONTAINER);
            let create = self.client.create(&prefix, &[], &EPHEMERAL_SEQUENTIAL);
            let list = self.client.list_children(&self.dir);
            let (dir, created, listed) =
                tokio::time::timeout_at(budget.until(), futures::future::join3(dir, create, list))
                    .await
                    .map_err(|_| zk::Error::Timeout)?;
            match created {
                Ok((stat, sequence)) => {
                    self.unsure = false;
                    let name = format!("{}{sequence}", nodes::node_prefix(&self.uuid));
                    let ours = nodes::sequence(&name).is_some();
                    self.node = Some(Node {
                        name,
                        czxid: stat.czxid,
                    });
                    if !ours {
                        // Not the 10-digit sequence every lock client orders by (a 64-bit
                        // sequence): waiting would never end. The drop deletes the node.
                        return Err(zk::Error::UnexpectedError(format!(
                            "the server gave the lock node the sequence {sequence}, not 10 digits"
                        )));
                    }
                    return match listed {
                        Ok(children) => Ok(children),
                        Err(_) => self.list(budget).await,
                    };
                }
                Err(zk::Error::NoNode) => {
                    // No base path yet (first use), or a release removed the directory
                    // between our two creates: try again.
                    self.unsure = false;
                    if dir.err() == Some(zk::Error::NoNode) {
                        let base = self.dir.rsplit_once('/').map_or("", |(base, _)| base);
                        let client = &self.client;
                        retry(client, budget.until(), || client.mkdir(base, &PERSISTENT)).await?;
                    }
                }
                Err(e) if is_uncertain(&e) => {
                    tracing::info!(backend = NAME, dir = %self.dir, error = %e, "connection lost during create; looking for our node");
                    connected(&self.client).await?;
                    if let Some(node) = self.find(budget).await? {
                        tracing::info!(backend = NAME, dir = %self.dir, node = %node.name, "found the node the lost create made");
                        self.unsure = false;
                        self.node = Some(node);
                        return self.list(budget).await;
                    }
                }
                Err(e) => {
                    if is_session_over(&e) {
                        // The session's nodes are gone with it.
                        self.unsure = false;
                    }
                    return Err(e);
                }
            }
        }
        Err(zk::Error::ConnectionLoss)
    }

    async fn list(&self, budget: Budget) -> Result<Vec<String>, zk::Error> {
        retry(&self.client, budget.until(), || {
            self.client.list_children(&self.dir)
        })
        .await
    }

    /// After a lost connection: the node our create may have made, accepted only if this
    /// session owns it. A node with our uuid from another session is deleted.
    async fn find(&self, budget: Budget) -> Result<Option<Node>, zk::Error> {
        let client = &self.client;
        // Let the server we talk to now catch up with the leader, so a create the old
        // server forwarded is visible.
        match retry(client, budget.until(), || client.sync(&self.dir)).await {
            Err(e) if is_session_over(&e) || e == zk::Error::Timeout => return Err(e),
            _ => {}
        }
        let children = match self.list(budget).await {
            Err(zk::Error::NoNode) => return Ok(None),
            children => children?,
        };
        let prefix = nodes::protected_prefix(&self.uuid);
        let session = client.session_id().0;
        let mut found = None;
        for name in children.into_iter().filter(|c| c.starts_with(&prefix)) {
            let path = format!("{}/{name}", self.dir);
            match retry(client, budget.until(), || client.check_stat(&path)).await? {
                Some(stat) if stat.ephemeral_owner == session && found.is_none() => {
                    found = Some(Node {
                        name,
                        czxid: stat.czxid,
                    });
                }
                Some(_) => {
                    tracing::info!(
                        backend = NAME,
                        path,
                        "deleting a lock node left by an abandoned create"
                    );
                    delete(client, &path, budget.until()).await?;
                }
                None => {}
            }
        }
        Ok(found)
    }

    /// Delete our node now (the acquire gave up); if that does not finish promptly, the
    /// drop leaves it to a background task.
    async fn withdraw(&mut self) {
        let Some(node) = self.node.clone() else {
            return;
        };
        let path = format!("{}/{}", self.dir, node.name);
        let until = Instant::now() + WITHDRAW_BOUND;
        // The holder may release meanwhile: the directory goes too if it is left empty.
        match delete_node_and_dir(&self.client, &path, &self.dir, until).await {
            Ok(_) => self.node = None,
            Err(e) => {
                tracing::debug!(backend = NAME, path, error = %e, "withdrawal continues in the background");
            }
        }
    }

    /// Our node is gone already; nothing to clean up.
    fn forget(&mut self) {
        self.node = None;
        self.unsure = false;
    }

    fn into_grant(mut self, key: &str, sent_at: Instant) -> Grant {
        let node = self.node.take().expect("a held contender has its node");
        let path = format!("{}/{}", self.dir, node.name);
        let timeout = self.client.session_timeout();
        let lost = watch_lease(self.client.clone(), path.clone(), timeout);
        let held = ZookeeperHeld {
            client: self.client.clone(),
            key: key.to_owned(),
            dir: std::mem::take(&mut self.dir),
            path,
        };
        Grant::new(token(node.czxid), Box::new(held), sent_at).with_lost(Box::pin(lost))
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        if self.node.is_none() && !self.unsure {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            tracing::warn!(backend = NAME, dir = %self.dir, "acquire dropped outside a tokio runtime: its node goes when the session ends");
            return;
        }
        let client = self.client.clone();
        let dir = std::mem::take(&mut self.dir);
        let name = self.node.take().map(|n| n.name);
        let prefix = nodes::protected_prefix(&self.uuid);
        dlock_core::raw::spawn_cleanup(async move {
            let until = Instant::now() + client.session_timeout() * 2;
            let names = match name {
                Some(name) => vec![name],
                None => match retry(&client, until, || client.list_children(&dir)).await {
                    Ok(children) => children
                        .into_iter()
                        .filter(|c| c.starts_with(&prefix))
                        .collect(),
                    Err(_) => Vec::new(),
                },
            };
            for name in names {
                let path = format!("{dir}/{name}");
                if let Err(e) = delete(&client, &path, until).await {
                    tracing::warn!(backend = NAME, path, error = %e, "could not delete an abandoned lock node; it goes when the session ends");
                }
            }
            delete_dir_if_empty(&client, &dir).await;
        });
    }
}

/// The fencing token: the lock node's czxid, the zxid of the transaction that created it.
/// Zxids only grow (across leader changes too), and a later holder's node was created after
/// every earlier holder's.
fn token(czxid: i64) -> u64 {
    u64::try_from(czxid).unwrap_or_default()
}

// ------------------------------------------------------------------------------ release

/// A held lock: our node, on our session.
#[derive(Debug)]
struct ZookeeperHeld {
    client: zk::Client,
    key: String,
    dir: String,
    path: String,
}

impl ZookeeperHeld {
    fn not_held(&self) -> LockError {
        LockError::NotHeld {
            backend: NAME,
            key: self.key.clone(),
            reason: LostReason::NotHeld,
        }
    }

    fn until(&self) -> Instant {
        Instant::now() + self.client.session_timeout()
    }
}

#[async_trait]
impl Held for ZookeeperHeld {
    /// The session keeps the node alive, so there is nothing to extend: this checks that
    /// the node is still ours (an operator may have deleted it).
    async fn extend(&mut self, _ttl: Duration) -> Result<()> {
        let session = self.client.session_id().0;
        match retry(&self.client, self.until(), || {
            self.client.check_stat(&self.path)
        })
        .await
        {
            Ok(Some(stat)) if stat.ephemeral_owner == session => Ok(()),
            Ok(_) => Err(self.not_held()),
            Err(e) if is_session_over(&e) => Err(self.not_held()),
            Err(e) => Err(Error::zk("extend", e).into()),
        }
    }

    /// Delete our node, and the key directory with it when no one else waits (both sent at
    /// once: one round trip). On a lost connection the delete is retried; if it cannot
    /// finish in time a background task keeps trying while the session lives.
    async fn release(&mut self) -> Result<()> {
        match delete_node_and_dir(&self.client, &self.path, &self.dir, self.until()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.not_held()),
            Err(e) if is_session_over(&e) => Err(self.not_held()),
            Err(e) => {
                let (client, path, dir) =
                    (self.client.clone(), self.path.clone(), self.dir.clone());
                dlock_core::raw::spawn_cleanup(async move {
                    let until = Instant::now() + client.session_timeout() * 2;
                    let _ = delete_node_and_dir(&client, &path, &dir, until).await;
                });
                Err(Error::zk("release", e).into())
            }
        }
    }
}

// ------------------------------------------------------------------------------ loss detection

/// How long the client may stay disconnected before the lease is reported lost.
///
/// The server expires a session one session timeout `T` after it last heard from the
/// client. The client reports `Disconnected` after `2T/5` without a byte from the server
/// (the connection timeout [`open_session`] sets; checked every eighth of it, `T/20`), and
/// pings after `3T/20` idle (three checks); so when the disconnection is seen,
/// the server may have last heard from us up to `3T/5` earlier. Of the `2T/5` left, `3T/20`
/// is kept as a margin for scheduling delays on a busy machine and clock-rate drift: the
/// lease is reported lost `T/4` after the disconnection, before the server can give the key
/// to anyone else (the server rounds expiries up to its next tick, which only adds room).
/// (Curator's LOST comes a whole `T` after SUSPENDED, which can be after the server expired
/// the session.)
fn lost_after_disconnect(session_timeout: Duration) -> Duration {
    session_timeout / 4
}

/// Resolves when the lease on `path` is lost: the session ended, the client stayed
/// disconnected too long, or the node was deleted (an operator broke the lease).
async fn watch_lease(client: zk::Client, path: String, session_timeout: Duration) -> LostReason {
    let mut states = client.state_watcher();
    let node = watch_node(&client, &path);
    tokio::pin!(node);
    let mut lost_at: Option<Instant> = None;
    let mut state = states.peek_state();
    loop {
        match state {
            SessionState::Disconnected => {
                lost_at.get_or_insert(Instant::now() + lost_after_disconnect(session_timeout));
            }
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                if let Some(at) = lost_at.take() {
                    let away = lost_after_disconnect(session_timeout)
                        .saturating_sub(at.saturating_duration_since(Instant::now()));
                    tracing::info!(
                        backend = NAME,
                        path,
                        ?away,
                        "reconnected in time; the lease is kept"
                    );
                }
            }
            ended => return LostReason::SessionEnded(format!("session {ended}")),
        }
        state = tokio::select! {
            reason = &mut node => return reason,
            state = states.changed() => state,
            () = lost_at.map_or(Deadline::Never, Deadline::At).reached() => {
                return LostReason::SessionEnded(format!(
                    "disconnected for {:?}; the server may expire the session ({session_timeout:?}) before we reconnect",
                    lost_after_disconnect(session_timeout)
                ));
            }
        };
    }
}

/// Resolves when our node is deleted (or its session ends).
async fn watch_node(client: &zk::Client, path: &str) -> LostReason {
    loop {
        match client.check_and_watch_stat(path).await {
            Ok((None, _)) => return LostReason::NotHeld,
            Ok((Some(_), watcher)) => {
                let event = watcher.changed().await;
                match event.event_type {
                    EventType::NodeDeleted => return LostReason::NotHeld,
                    EventType::Session if event.session_state.is_terminated() => {
                        return LostReason::SessionEnded(format!(
                            "session {}",
                            event.session_state
                        ));
                    }
                    // Data changed (e.g. Curator's revoke request) or the like: watch again.
                    _ => {}
                }
            }
            Err(e) if is_session_over(&e) => {
                return LostReason::SessionEnded(e.to_string());
            }
            Err(_) => {
                if let Err(e) = connected(client).await {
                    return LostReason::SessionEnded(e.to_string());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_fires_before_the_server_can_expire_the_session() {
        let t = Duration::from_secs(10);
        // Last heard up to 3T/5 before the disconnection was seen; the server expires at T.
        let server_expiry_after_disconnect = t - t * 3 / 5;
        assert!(lost_after_disconnect(t) + t * 3 / 20 <= server_expiry_after_disconnect);
    }

    #[test]
    fn budget_never_passes_the_deadline() {
        let at = Instant::now() + Duration::from_millis(50);
        let budget = Budget {
            deadline: Deadline::At(at),
            bound: Duration::from_secs(10),
        };
        assert_eq!(budget.until(), at);
        let open = Budget {
            deadline: Deadline::TryOnce,
            bound: Duration::from_secs(1),
        };
        assert!(open.until() > Instant::now());
    }

    #[test]
    fn tokens_are_czxids() {
        assert_eq!(token(0x1_0000_0005), 0x1_0000_0005);
        assert_eq!(token(-1), 0);
    }
}
