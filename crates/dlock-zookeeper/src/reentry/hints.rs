//! What a client remembers of the owner holds it was granted, for quicker re-entries.

use std::collections::HashMap;
use std::sync::Mutex;

use dlock_core::Owner;

/// The most keys [`Hints`] remembers; past that it starts afresh.
const MAX_HINTS: usize = 4096;

/// The node that held each key for an owner, as this client last saw it granted: a
/// re-entry through this client tries it first ([`raise`](super::raise), two round trips) before
/// queueing a node. A wrong hint costs one `getData` (the node is gone, or not that hold),
/// and is forgotten.
#[derive(Debug, Default)]
pub(crate) struct Hints(Mutex<HashMap<String, (Owner, String, i64)>>);

impl Hints {
    /// The holding node (path, czxid) last seen for `key` and `owner`.
    pub(crate) fn get(&self, key: &str, owner: Owner) -> Option<(String, i64)> {
        let hints = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (held_by, path, czxid) = hints.get(key)?;
        (*held_by == owner).then(|| (path.clone(), *czxid))
    }

    /// `owner`'s hold of `key` is the node at `path`, created at `czxid`.
    pub(crate) fn set(&self, key: &str, owner: Owner, path: &str, czxid: i64) {
        let mut hints = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if hints.len() >= MAX_HINTS && !hints.contains_key(key) {
            hints.clear();
        }
        hints.insert(key.to_owned(), (owner, path.to_owned(), czxid));
    }

    /// The node at `path` no longer holds `key`.
    pub(crate) fn forget(&self, key: &str, path: &str) {
        let mut hints = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if hints.get(key).is_some_and(|(_, known, _)| known == path) {
            hints.remove(key);
        }
    }
}
