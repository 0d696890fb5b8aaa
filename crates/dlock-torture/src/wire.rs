//! What workers tell the coordinator: one JSON object per line on a loopback TCP
//! connection per task. Only `Write` is answered (with [`WriteReply`]).

use serde::{Deserialize, Serialize};

/// A worker's message. Times are [`now_ns`](crate::clock::now_ns) readings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "t", rename_all = "snake_case")]
pub(crate) enum Msg {
    /// `acquire` returned a lease. `requested` is when the acquire was called, `at` when it
    /// returned: the grant happened between the two.
    Acquired {
        hold: u64,
        key: String,
        token: u64,
        requested: u64,
        at: u64,
        /// A shared (read) hold; it writes nothing to the store.
        #[serde(default)]
        shared: bool,
        /// One of this many permits (a semaphore hold); it writes nothing to the store.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        permits: Option<u32>,
        /// Taken as one key of a set (`acquire_all`): the set's id, the hold id of its first
        /// key; every key of the set is reported as a hold of its own.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        set: Option<u64>,
    },
    /// The holder entered its reentrant hold once more and got the hold's token.
    Reentered { hold: u64 },
    /// A write to the fenced store, carrying the hold's token (answered).
    Write { hold: u64, key: String, token: u64 },
    /// The lease's `lost()` fired (or `is_lost()` was seen) at `at`.
    Lost { hold: u64, at: u64, reason: String },
    /// The holder stops relying on the lease and is about to call `release`.
    Releasing { hold: u64, at: u64 },
    /// What `release` answered: `ok` or the error kind.
    Released { hold: u64, outcome: String },
    /// An acquire failed (the error kind and message).
    AcquireFailed { kind: String, error: String },
}

/// The fenced store's answer to a [`Msg::Write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WriteReply {
    pub(crate) accepted: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_as_one_json_line() {
        let msg = Msg::Acquired {
            hold: 7,
            key: "torture-x/k0".into(),
            token: 42,
            requested: 1,
            at: 2,
            shared: true,
            permits: Some(3),
            set: Some(7),
        };
        let line = serde_json::to_string(&msg).unwrap();
        assert!(!line.contains('\n'));
        assert!(line.contains(r#""t":"acquired""#), "{line}");
        assert_eq!(serde_json::from_str::<Msg>(&line).unwrap(), msg);
    }
}
