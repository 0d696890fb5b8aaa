//! What a client remembers of the owner holds it was granted, for quicker re-entries.

use std::collections::HashMap;
use std::sync::Mutex;

use dlock_core::Owner;

use super::OwnerData;

/// The most keys [`Hints`] remembers; past that it starts afresh.
const MAX_HINTS: usize = 4096;

/// The node that held each key for an owner, as this client last saw it granted: a
/// re-entry through this client tries it first ([`raise`](super::raise)) before queueing a
/// node. A wrong hint costs one `getData` (the node is gone, or not that hold), and is
/// forgotten.
///
/// With it, the node's data and data version as this client last wrote them: the next
/// count change through this client writes at that version at once, one round trip, and
/// reads the node only after that write is refused (another client changed the count).
#[derive(Debug, Default)]
pub(crate) struct Hints(Mutex<HashMap<String, Hint>>);

#[derive(Debug)]
struct Hint {
    owner: Owner,
    path: String,
    czxid: i64,
    written: Option<(OwnerData, i32)>,
}

impl Hints {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Hint>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The holding node (path, czxid) last seen for `key` and `owner`.
    pub(crate) fn get(&self, key: &str, owner: Owner) -> Option<(String, i64)> {
        let hints = self.map();
        let hint = hints.get(key)?;
        (hint.owner == owner).then(|| (hint.path.clone(), hint.czxid))
    }

    /// `owner`'s hold of `key` is the node at `path`, created at `czxid`.
    pub(crate) fn set(&self, key: &str, owner: Owner, path: &str, czxid: i64) {
        let mut hints = self.map();
        if hints
            .get(key)
            .is_some_and(|h| h.path == path && h.czxid == czxid)
        {
            return;
        }
        if hints.len() >= MAX_HINTS && !hints.contains_key(key) {
            hints.clear();
        }
        let hint = Hint {
            owner,
            path: path.to_owned(),
            czxid,
            written: None,
        };
        hints.insert(key.to_owned(), hint);
    }

    /// The data and data version this client last wrote to the node at `path`, if it is
    /// still `key`'s hint.
    pub(crate) fn written(&self, key: &str, path: &str) -> Option<(OwnerData, i32)> {
        let hints = self.map();
        let hint = hints.get(key).filter(|h| h.path == path)?;
        hint.written.clone()
    }

    /// This client wrote `data` to the node at `path`, which is now at data `version`. Two
    /// tasks of the client may tell it out of order: the later version is kept.
    pub(crate) fn wrote(&self, key: &str, path: &str, data: OwnerData, version: i32) {
        if let Some(hint) = self.map().get_mut(key).filter(|h| h.path == path)
            && hint
                .written
                .as_ref()
                .is_none_or(|(_, known)| *known < version)
        {
            hint.written = Some((data, version));
        }
    }

    /// The node at `path` no longer holds `key`.
    pub(crate) fn forget(&self, key: &str, path: &str) {
        let mut hints = self.map();
        if hints.get(key).is_some_and(|h| h.path == path) {
            hints.remove(key);
        }
    }
}
