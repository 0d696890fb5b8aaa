//! Elections: who leads (the lowest contender of the key directory, read with
//! `getChildren` and `getData`) and the stream that wakes observers (a persistent recursive
//! watch on the key directory). Campaigning is the lock recipe with a `latch-` node that
//! carries the value (see [`crate::contender::Contender::campaigning`]); proclaiming is a
//! `setData` on it (see [`crate::held`]). See [Elections](crate#elections).

use std::time::Duration;

use dlock_core::raw::Deadline;
use dlock_core::{Leader, LockError, Mode, Result};
use futures::stream::{self, BoxStream, StreamExt};
use tokio::time::Instant;
use zookeeper_client::{self as zk, AddWatchMode, EventType, SessionState};

use crate::NAME;
use crate::error::Error;
use crate::nodes;
use crate::request::retry;
use crate::session::ZookeeperBackend;

/// How long an observer goes without reading the leader. The server notifies every change
/// of the key directory's children, a session expiry's deletions included, so this only
/// bounds notifications lost while the observer's connection moves to another member
/// (ZOOKEEPER-4698; the stream also wakes on reconnection) or a watch the server dropped.
/// One second keeps an idle observer at two small reads a second.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

impl ZookeeperBackend {
    /// The leader of `key`: the lowest contender of its directory if it holds exclusively
    /// (a candidate's `latch-` node, Curator's `LeaderLatch`'s, or a plain exclusive
    /// hold's), its data as the value and its czxid as the term. Two round trips:
    /// `getChildren`, then `getData` of that node (gone meanwhile: list again).
    pub(crate) async fn read_leader(&self, key: &str) -> Result<Option<Leader>> {
        let deadline = Deadline::At(Instant::now() + self.config.connect_timeout);
        let client = self.client(deadline).await?;
        let until = Instant::now() + client.session_timeout();
        let failed = |e| LockError::from(Error::zk("leader", e));
        let dir = self.config.key_dir(key);
        loop {
            let children = match retry(&client, until, || client.list_children(&dir)).await {
                Err(zk::Error::NoNode) => return Ok(None),
                children => children.map_err(failed)?,
            };
            let order = nodes::contenders(children);
            // Readers first: they share, and nobody leads.
            let Some(first) = order.first().filter(|n| n.mode == Mode::Exclusive) else {
                return Ok(None);
            };
            let path = format!("{dir}/{}", first.name);
            let (data, stat) = match retry(&client, until, || client.get_data(&path)).await {
                // Resigned (or its session ended) between the two reads: the next one leads.
                Err(zk::Error::NoNode) => continue,
                read => read.map_err(failed)?,
            };
            let Ok(term) = u64::try_from(stat.czxid) else {
                return Err(LockError::backend(
                    NAME,
                    "leader",
                    format!("the leader's node has a negative czxid ({})", stat.czxid),
                ));
            };
            return Ok(Some(Leader::new(value(&data), term)));
        }
    }

    /// Wake observers of `key`: a persistent recursive watch (`addWatch`, ZooKeeper 3.6+)
    /// on the key directory, which may not exist yet, set before this returns. Every
    /// creation, deletion and data change of a node in it yields (a candidate queued or
    /// gone, a leader resigned or expired, a proclaim), and so does a reconnection, after
    /// which events may have been lost. The stream ends with an error when the session
    /// ends. A server without `addWatch` (3.5): `None`, and observers read the leader
    /// every [`RECHECK`].
    pub(crate) async fn watch_leader(
        &self,
        key: &str,
    ) -> Result<Option<BoxStream<'static, Result<()>>>> {
        let deadline = Deadline::At(Instant::now() + self.config.connect_timeout);
        let client = self.client(deadline).await?;
        let until = Instant::now() + client.session_timeout();
        let dir = self.config.key_dir(key);
        let watcher = match retry(&client, until, || {
            client.watch(&dir, AddWatchMode::PersistentRecursive)
        })
        .await
        {
            Ok(watcher) => watcher,
            Err(zk::Error::Unimplemented) => {
                tracing::warn!(
                    backend = NAME,
                    "the server has no persistent watches (ZooKeeper 3.6+): election observers poll"
                );
                return Ok(None);
            }
            Err(e) => return Err(Error::zk("observe", e).into()),
        };
        Ok(Some(
            stream::unfold(Some(watcher), |watcher| async move {
                // `None`: the session ended and the error was the last item (the watcher
                // panics if polled after a terminal event).
                let mut watcher = watcher?;
                loop {
                    let event = watcher.changed().await;
                    if event.event_type != EventType::Session {
                        return Some((Ok(()), Some(watcher)));
                    }
                    match event.session_state {
                        state if state.is_terminated() => {
                            let ended = zk::Error::SessionExpired;
                            tracing::info!(backend = NAME, %state, "observer's session ended");
                            return Some((Err(Error::zk("observe", ended).into()), None));
                        }
                        SessionState::SyncConnected | SessionState::ConnectedReadOnly => {
                            return Some((Ok(()), Some(watcher)));
                        }
                        // Disconnected: the watch is set again on reconnection.
                        _ => {}
                    }
                }
            })
            .boxed(),
        ))
    }
}

/// A leader node's data as its value: ours is the candidate's value as it was checked;
/// another client's (Curator's participant id) is shown without control characters.
fn value(data: &[u8]) -> String {
    String::from_utf8_lossy(data)
        .chars()
        .filter(|c| !c.is_control())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_the_data_as_written() {
        assert_eq!(value(b" alpha: draining "), " alpha: draining ");
        assert_eq!(value(b"a\nb\xff"), "ab\u{fffd}");
        assert_eq!(value(b""), "");
    }
}
