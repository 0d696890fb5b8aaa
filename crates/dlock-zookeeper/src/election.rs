//! Elections: who leads (the lowest contender of the key directory, read with
//! `getChildren` and `getData`) and the stream that wakes observers (a persistent recursive
//! watch on the key directory). Campaigning is the lock recipe with a `latch-` node that
//! carries the value (see [`crate::contender::Contender::campaigning`]); proclaiming is a
//! `setData` on it (see [`crate::held`]). See [Elections](crate#elections).

use std::time::Duration;

use dlock_core::raw::Deadline;
use dlock_core::{Leader, LockError, Mode, Result};
use futures::stream::{self, BoxStream, StreamExt};
use tokio::sync::watch;
use tokio::task::JoinHandle;
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
    /// creation, deletion and data change of a node in it wakes the stream (a candidate
    /// queued or gone, a leader resigned or expired, a proclaim), and so does a
    /// reconnection, after which events may have been lost. Wake-ups coalesce: a task
    /// ([`forward`]) takes the watcher's events as they come and marks a `watch` channel
    /// changed, so however many events arrive while the observer is busy (or not polling),
    /// the stream holds one pending item, not a queue, and the observer reads the leader
    /// once for all of them. Dropping the stream aborts the task, which drops the watcher
    /// (the client removes it). The stream ends with an error when the session ends. A
    /// server without `addWatch` (3.5): `None`, and observers read the leader every
    /// [`RECHECK`].
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
        let (wake, woken) = watch::channel(());
        let forwarding = Forwarding(tokio::spawn(forward(watcher, wake)));
        Ok(Some(
            stream::unfold(Some((woken, forwarding)), |state| async move {
                // `None`: the session ended and the error was the last item.
                let (mut woken, forwarding) = state?;
                match woken.changed().await {
                    Ok(()) => Some((Ok(()), Some((woken, forwarding)))),
                    // The task ended: the session did (or the task panicked).
                    Err(_) => {
                        let ended = zk::Error::SessionExpired;
                        Some((Err(Error::zk("observe", ended).into()), None))
                    }
                }
            })
            .boxed(),
        ))
    }
}

/// The task that forwards a persistent watcher's events to an observer's stream, aborted
/// when the stream is dropped (dropping the watcher, which removes it).
struct Forwarding(JoinHandle<()>);

impl Drop for Forwarding {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Take `watcher`'s events as they come and mark `wake` changed for each node event and
/// each reconnection (a `watch` channel holds one pending change however many are sent:
/// the events coalesce, and nothing queues while the observer does not poll). Returns,
/// dropping `wake` (the stream then ends with an error), when the session ends or the
/// stream is gone.
async fn forward(mut watcher: zk::PersistentWatcher, wake: watch::Sender<()>) {
    loop {
        let event = watcher.changed().await;
        if event.event_type == EventType::Session {
            match event.session_state {
                // The watcher panics if polled after a terminal event.
                state if state.is_terminated() => {
                    tracing::info!(backend = NAME, %state, "observer's session ended");
                    return;
                }
                SessionState::SyncConnected | SessionState::ConnectedReadOnly => {}
                // Disconnected: the watch is set again on reconnection.
                _ => continue,
            }
        }
        if wake.send(()).is_err() {
            return;
        }
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
