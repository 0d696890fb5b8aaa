//! A held lock: renewal (a check that the node is still ours), release, and the watch that
//! reports the lease lost.

use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Deadline, Held};
use dlock_core::{LockError, LostReason, Result};
use tokio::time::Instant;
use zookeeper_client::{self as zk, EventType, SessionState};

use crate::NAME;
use crate::error::{Error, is_session_over};
use crate::request::{delete_node_and_dir, retry};
use crate::session::{connected, lost_after_disconnect};

/// A held lock: our node, on our session.
#[derive(Debug)]
pub(crate) struct ZookeeperHeld {
    pub(crate) client: zk::Client,
    pub(crate) key: String,
    pub(crate) dir: String,
    pub(crate) path: String,
}

impl ZookeeperHeld {
    fn not_held(&self) -> LockError {
        LockError::not_held(NAME, &self.key, LostReason::NotHeld)
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

/// Resolves when the lease on `path` is lost: the session ended, the client stayed
/// disconnected too long, or the node was deleted (an operator broke the lease).
pub(crate) async fn watch_lease(
    client: zk::Client,
    path: String,
    session_timeout: Duration,
) -> LostReason {
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
