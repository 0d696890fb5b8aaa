//! The session: one ZooKeeper session per backend, shared by every lock taken through it,
//! replaced when it ends. Every lock node is ephemeral, so the session is what keeps each
//! lease alive; here too is how long a lease survives a disconnection.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::Result;
use dlock_core::raw::Deadline;
use zookeeper_client::{self as zk, SessionState};

use crate::NAME;
use crate::config::ZookeeperConfig;
use crate::error::Error;

/// One ZooKeeper session and the lock recipe on top of it.
///
/// All locks of one backend share its session. When the session expires, the leases it
/// carried are lost and the next acquire opens a new session.
#[derive(Debug)]
pub struct ZookeeperBackend {
    pub(crate) config: ZookeeperConfig,
    session: tokio::sync::Mutex<zk::Client>,
    session_id: AtomicI64,
    session_timeout_ms: AtomicU64,
    pub(crate) wakeups: AtomicU64,
}

impl ZookeeperBackend {
    /// Open a session to the ensemble `config` names, within its connect timeout.
    ///
    /// # Errors
    /// [`LockError::Unavailable`](dlock_core::LockError::Unavailable) when no member answers
    /// in time; [`LockError::Backend`](dlock_core::LockError::Backend) when the server refuses
    /// the session.
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
    pub(crate) async fn client(&self, deadline: Deadline) -> Result<zk::Client> {
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
pub(crate) fn lost_after_disconnect(session_timeout: Duration) -> Duration {
    session_timeout / 4
}

/// Wait until the client is connected; an error once its session has ended.
pub(crate) async fn connected(client: &zk::Client) -> Result<(), zk::Error> {
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
}
