//! [`Names`]: the keys and the channel one lock uses on the server, on one server and on a
//! Redis Cluster (where a script may only touch keys of one hash slot).

use std::sync::LazyLock;

/// The names one lock uses on the server.
///
/// | what | name |
/// |---|---|
/// | lock key (value: the holder's token) | `<prefix><key>` |
/// | fence counter | `{<prefix><key>}:fence` |
/// | release channel | `{<prefix><key>}:released` |
/// | waiters' queue (score: enqueue ticket) | `{<prefix><key>}:queue` |
/// | waiters' expiries (score: µs, server clock) | `{<prefix><key>}:waiters` |
/// | an owner's reentrant hold (hash: owner, hold, fence, entries) | `{<prefix><key>}:hold` |
///
/// The user's key is used verbatim, so with an empty prefix the lock key is exactly the
/// name another library (redis-py, redsync, node-redlock) would use for the same lock: the
/// two exclude each other. The fence key carries the lock key as its hash tag, so both sit
/// in one cluster slot (unless the key itself contains `}`). With a non-empty prefix that
/// does not start with `{`, no lock key can be another lock's fence, queue or waiters key;
/// with any other prefix (the empty one included), [`Names::check`] refuses the few keys
/// that would be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The lock key.
    pub key: String,
    /// The fence counter.
    pub fence: String,
    /// The pub/sub channel on which the next waiter is called (each message is the token
    /// of the waiter whose turn it is), and election observers are woken (`!leader`).
    pub channel: String,
    /// The queue of waiters: a sorted set of waiter tokens by enqueue ticket.
    pub queue: String,
    /// When each waiter's entry expires: a sorted set of waiter tokens by µs of the
    /// server clock.
    pub waiters: String,
    /// An owner's reentrant hold of the key: a hash of the owner id, the hold's random
    /// part, its fencing token and one field per entry (see `scripts/hold.rs`); it
    /// expires with the lock key and is deleted with it.
    pub hold: String,
}

/// The suffixes of the names a lock keeps beside its lock key (`{<lock key>}<suffix>`).
const SIDE_KEYS: [&str; 4] = ["}:fence", "}:queue", "}:waiters", "}:hold"];

impl Names {
    /// Refuse `key` if under `prefix` its lock key would be another lock's fence counter,
    /// queue or waiters key (`{<prefix><other key>}:fence`, …), so that one lock can
    /// never reset another's counter or queue or be blocked by it. Only reachable with a prefix that is empty or starts
    /// with `{`.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`](dlock_core::LockError::InvalidKey) for such a key.
    pub fn check(prefix: &str, key: &str) -> dlock_core::Result<()> {
        // With a prefix that does not start with `{` no lock key starts with `{`: nothing to
        // check, and nothing to allocate on every acquire.
        if !prefix.is_empty() && !prefix.starts_with('{') {
            return Ok(());
        }
        let lock = format!("{prefix}{key}");
        let side_shaped = lock.starts_with(&format!("{{{prefix}"))
            && SIDE_KEYS.iter().any(|suffix| lock.ends_with(suffix));
        if side_shaped {
            return Err(dlock_core::LockError::invalid_key(
                key,
                "under this key prefix the key names another lock's fence counter or queue \
                 ({<prefix><key>}:fence, :queue, :waiters, :hold); use another key, or a prefix \
                 such as dlock:",
            ));
        }
        Ok(())
    }

    /// The names for `key` under `prefix`.
    pub fn new(prefix: &str, key: &str) -> Self {
        let lock = format!("{prefix}{key}");
        Self {
            fence: format!("{{{lock}}}:fence"),
            channel: format!("{{{lock}}}:released"),
            queue: format!("{{{lock}}}:queue"),
            waiters: format!("{{{lock}}}:waiters"),
            hold: format!("{{{lock}}}:hold"),
            key: lock,
        }
    }
}

impl Names {
    /// The names for `key` under `prefix` on a Redis Cluster, where a script may only
    /// touch keys of one hash slot. They are those of [`Names::new`] when the lock key has
    /// no `}`: then the companions (`{<lock key>}:fence`, …) hash by the whole lock key, as
    /// the lock key itself does. A lock key with a `}` may not share their slot (the hash
    /// tag of `{<lock key>}` ends at its first `}`), so each of its companion names gets a
    /// short hash tag of the lock key's slot in front, `{<tag>}{<lock key>}:fence`: the
    /// lock key keeps its name (and its interplay with other libraries). Tagging every
    /// such key, not only those whose slots differ, keeps the names of two keys apart: a
    /// tagged name has a `}` inside its first braces, a plain one never does.
    pub fn in_cluster(prefix: &str, key: &str) -> Self {
        use redis::cluster_routing::Slot;
        let mut names = Self::new(prefix, key);
        let slot = Slot::for_key(&names.key);
        if names.key.contains('}') {
            let tag = format!("{{{}}}", slot_tag(slot));
            for name in [
                &mut names.fence,
                &mut names.channel,
                &mut names.queue,
                &mut names.waiters,
                &mut names.hold,
            ] {
                name.insert_str(0, &tag);
            }
        }
        names
    }
}

/// A short hash tag (`s<number>`, no braces) of `slot`, from a table of the first such tag
/// of every slot, made on first use (about 170,000 CRCs, a few milliseconds).
fn slot_tag(slot: redis::cluster_routing::Slot) -> &'static str {
    use redis::cluster_routing::Slot;
    use std::collections::HashMap;
    const SLOTS: usize = 16384;
    static TAGS: LazyLock<HashMap<Slot, String>> = LazyLock::new(|| {
        let mut tags = HashMap::with_capacity(SLOTS);
        let mut n: u64 = 0;
        while tags.len() < SLOTS {
            let tag = format!("s{n}");
            tags.entry(Slot::for_key(&tag)).or_insert(tag);
            n += 1;
        }
        tags
    });
    TAGS.get(&slot).map_or("", String::as_str)
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod cluster_tests;
