//! A waiter's watch stream: the watch on our own key shares it with the predecessor's
//! ([`OwnWatch::classify`] tells a waiter what a response means). Once the key is held,
//! the client's stream on held keys ([`crate::keywatch`]) watches it instead.

use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchResponse, WatchStream};

use crate::connection::Conn;
use crate::error::Error;

/// The watch id of a waiter's own key on its watch stream; predecessors get the next ones.
pub(crate) const OWN_WATCH: i64 = 1;

/// A watch stream carrying the watch on our own key, and while waiting one on the
/// predecessor.
pub(crate) struct OwnWatch {
    pub(crate) stream: WatchStream,
    pub(crate) own_id: i64,
}

/// What a watch response means to a waiter.
pub(crate) enum Seen {
    /// The server created the predecessor's watch: its id, and the store revision then.
    Created(i64, i64),
    OwnDeleted,
    PredecessorDeleted,
    /// The server refused or canceled a watch we rely on.
    Canceled(String),
    Nothing,
}

impl Conn {
    /// A watch stream whose first watch is `my_key`'s deletion, from the current revision
    /// (a watch starting in the past waits for etcd's 100 ms catch-up loop, and makes
    /// every write wait while that loop holds the store): the waiter's read after the
    /// predecessor's watch is created covers the revisions before.
    pub(crate) async fn watch_own(
        &self,
        op: &'static str,
        my_key: &str,
    ) -> Result<Box<OwnWatch>, Error> {
        let options = WatchOptions::new()
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

impl OwnWatch {
    /// `predecessor` holds the ids of the predecessor's watches.
    pub(crate) fn classify(&self, response: &WatchResponse, predecessor: &[i64]) -> Seen {
        let id = response.watch_id();
        let ours = id == self.own_id || predecessor.contains(&id);
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
        match (deleted, id == self.own_id, predecessor.contains(&id)) {
            (true, true, _) => Seen::OwnDeleted,
            (true, false, true) => Seen::PredecessorDeleted,
            _ => Seen::Nothing,
        }
    }
}
