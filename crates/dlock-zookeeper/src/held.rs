//! A held lock: renewal (answered from the session and our node's watch, without a
//! request), release, and the watch that reports the lease lost.

use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Deadline, Held};
use dlock_core::{LockError, LostReason, Result};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::time::Instant;
use zookeeper_client::{self as zk, EventType, SessionState};

use crate::NAME;
use crate::error::{Error, is_session_over};
use crate::request::{delete, retry};
use crate::session::{connected, lost_after_disconnect};

/// Resolves when our node is gone: deleted, or its session ended. One per held node,
/// shared by the lease's loss signal and its extends, so an extend knows of a deletion as
/// soon as the client has read the notification, without a request of its own.
pub(crate) type NodeGone = Shared<BoxFuture<'static, LostReason>>;

/// A held lock: our node, on our session.
pub(crate) struct ZookeeperHeld {
    pub(crate) client: zk::Client,
    pub(crate) key: String,
    pub(crate) path: String,
    pub(crate) gone: NodeGone,
}

impl std::fmt::Debug for ZookeeperHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZookeeperHeld")
            .field("key", &self.key)
            .field("path", &self.path)
            .field("session", &self.client.session_id())
            .finish_non_exhaustive()
    }
}

impl ZookeeperHeld {
    fn not_held(&self, reason: LostReason) -> LockError {
        LockError::not_held(NAME, &self.key, reason)
    }

    fn until(&self) -> Instant {
        Instant::now() + self.client.session_timeout()
    }
}

#[async_trait]
impl Held for ZookeeperHeld {
    /// The session keeps the node alive, so there is nothing to extend and nothing to ask
    /// the server: the session's heartbeats prove it alive for every lease at once, and the
    /// watch on our node says when it was deleted. Connected and not deleted: `Ok` at once.
    /// `NotHeld` once the node's deletion was notified or the session ended. While the
    /// client is disconnected, waits for it to connect again (the lease's loss signal fires
    /// if that takes too long).
    async fn extend(&mut self, _ttl: Duration) -> Result<()> {
        loop {
            // Polls the shared watch here, so a notification the client has read counts
            // even before the loss signal's task runs.
            if let Some(reason) = self.gone.clone().now_or_never() {
                return Err(self.not_held(reason));
            }
            match self.client.state() {
                SessionState::SyncConnected | SessionState::ConnectedReadOnly => return Ok(()),
                SessionState::Disconnected => {
                    let reconnected = tokio::select! {
                        reason = self.gone.clone() => return Err(self.not_held(reason)),
                        reconnected = connected(&self.client) => reconnected,
                    };
                    if let Err(e) = reconnected {
                        return Err(self.not_held(LostReason::SessionEnded(e.to_string())));
                    }
                }
                ended => {
                    return Err(self.not_held(LostReason::SessionEnded(format!("session {ended}"))));
                }
            }
        }
    }

    /// Write `value` as our node's data (`setData`, any version): one write, one round
    /// trip. Our node's path holds our uuid and is ephemeral on our session, so no other
    /// holder's node can be behind it: `NoNode` (deleted, or the session ended) is
    /// `NotHeld`. The term (the node's czxid) stays. Retried on a lost connection (writing
    /// the same data twice is harmless).
    async fn proclaim(&mut self, value: &str) -> Result<()> {
        if let Some(reason) = self.gone.clone().now_or_never() {
            return Err(self.not_held(reason));
        }
        let client = &self.client;
        match retry(client, self.until(), || {
            client.set_data(&self.path, value.as_bytes(), None)
        })
        .await
        {
            Ok(_) => Ok(()),
            Err(zk::Error::NoNode) => Err(self.not_held(LostReason::NotHeld)),
            Err(e) if is_session_over(&e) => {
                Err(self.not_held(LostReason::SessionEnded(e.to_string())))
            }
            Err(e) => Err(Error::zk("proclaim", e).into()),
        }
    }

    /// Delete our node: one write, one round trip. The key directory stays, empty or not,
    /// for the next acquire or the server's container reaper (see [Release](crate#protocol)).
    /// On a lost connection the delete is retried; if it cannot finish in time a background
    /// task keeps trying while the session lives.
    async fn release(&mut self) -> Result<()> {
        match delete(&self.client, &self.path, self.until()).await {
            Ok(true) => Ok(()),
            Ok(false) => Err(self.not_held(LostReason::NotHeld)),
            Err(e) if is_session_over(&e) => Err(self.not_held(LostReason::NotHeld)),
            Err(e) => {
                let (client, path) = (self.client.clone(), self.path.clone());
                dlock_core::raw::spawn_cleanup(async move {
                    let until = Instant::now() + client.session_timeout() * 2;
                    let _ = delete(&client, &path, until).await;
                });
                Err(Error::zk("release", e).into())
            }
        }
    }
}

/// Resolves when the lease on `path` is lost: the session ended, the client stayed
/// disconnected too long, or the node was deleted (an operator broke the lease).
pub(crate) async fn watch_lease(
    client: zk::Client,
    path: String,
    node: NodeGone,
    session_timeout: Duration,
) -> LostReason {
    let mut states = client.state_watcher();
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

/// The watch on our node at `path`: resolves when the node is deleted (or its session
/// ends). It sets its watch when first polled, by the lease's loss signal as soon as the
/// lease starts.
pub(crate) fn watch_node(client: zk::Client, path: String) -> NodeGone {
    async move { node_gone(&client, &path).await }
        .boxed()
        .shared()
}

async fn node_gone(client: &zk::Client, path: &str) -> LostReason {
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
