//! Lock node names: ours, which children of a key directory contend for the key and in
//! which mode, and what a contender waits for.
//!
//! Ours are Curator's protected names: `_c_{uuid}-lock-{seq}` for an exclusive hold (the
//! name of Curator's `InterProcessMutex`; go-zookeeper's `zk.Lock` makes the same shape), or
//! `_c_{uuid}-__WRIT__{seq}` with `curator=read_write_lock` (Curator's
//! `InterProcessReadWriteLock` write lock), and `_c_{uuid}-__READ__{seq}` for a shared one
//! (its read lock). Contenders are the children whose name ends in one of the names below followed by
//! the server's 10-digit sequence number, ordered by that number: `-lock-`, `__lock__`
//! (kazoo's `Lock`) and `__WRIT__` (Curator's write lock) are exclusive, `__READ__` and
//! `__rlock__` (kazoo's `ReadLock`) shared. See [Interop](crate#interop-with-curator-go-zookeeper-and-kazoo)
//! for why exclusive holds keep the name `-lock-`. An election candidate's node is
//! `_c_{uuid}-latch-{seq}`, the name of Curator's `LeaderLatch`, and `latch-` contends as
//! an exclusive hold: see [Elections](crate#elections).

use dlock_core::Mode;

use crate::config::CuratorRecipe;

/// The protected-mode marker Curator puts in front of the uuid.
const PROTECTED: &str = "_c_";
/// Curator's and go-zookeeper's lock name; kazoo matches it with
/// `extra_lock_patterns=["-lock-"]`. Our exclusive holds use it.
const LOCK_NAME: &str = "-lock-";
/// The read lock's name in Curator's `InterProcessReadWriteLock`. Our shared holds use it
/// (after `_c_{uuid}-`, as Curator does).
const READ_NAME: &str = "__READ__";
/// The write lock's name in Curator's `InterProcessReadWriteLock`. Our exclusive holds use
/// it (after `_c_{uuid}-`) with `curator=read_write_lock`.
const WRITE_NAME: &str = "__WRIT__";
/// Curator's `LeaderLatch` node name (its `LOCK_NAME`, after `_c_{uuid}-`). Our election
/// candidates use it.
const LATCH_NAME: &str = "latch-";
/// kazoo's lock (and write lock) name.
const KAZOO_LOCK_NAME: &str = "__lock__";
/// kazoo's read lock name.
const KAZOO_READ_NAME: &str = "__rlock__";
/// The name of a lease node in a semaphore's `leases` directory, after `_c_{uuid}-`
/// (Curator's `InterProcessSemaphoreV2`).
const LEASE_NAME: &str = "lease-";
/// Digits ZooKeeper appends to a sequential node's name.
const SEQUENCE_DIGITS: usize = 10;

/// Every name a contender's node may end with (before its sequence), and its mode.
const NAMES: [(&str, Mode); 6] = [
    (LOCK_NAME, Mode::Exclusive),
    (LATCH_NAME, Mode::Exclusive),
    (KAZOO_LOCK_NAME, Mode::Exclusive),
    (WRITE_NAME, Mode::Exclusive),
    (READ_NAME, Mode::Shared),
    (KAZOO_READ_NAME, Mode::Shared),
];

/// `_c_{uuid}-`: what every node of one create attempt starts with, so the attempt can find
/// its node after a lost connection.
pub(crate) fn protected_prefix(uuid: &uuid::Uuid) -> String {
    format!("{PROTECTED}{}-", uuid.hyphenated())
}

/// The name to create ephemeral-sequential for a hold in `mode` (the server appends the
/// sequence number): `_c_{uuid}-lock-` (or `_c_{uuid}-__WRIT__` when exclusive holds
/// exclude Curator's read-write lock) or `_c_{uuid}-__READ__`; for a permit, the lease
/// node `_c_{uuid}-lease-` (it goes in the semaphore's `leases` directory).
pub(crate) fn node_prefix(uuid: &uuid::Uuid, mode: Mode, curator: CuratorRecipe) -> String {
    let protected = protected_prefix(uuid);
    match (mode, curator) {
        (Mode::Exclusive, CuratorRecipe::Mutex) => {
            format!("{}{LOCK_NAME}", protected.trim_end_matches('-'))
        }
        (Mode::Exclusive, CuratorRecipe::ReadWriteLock) => format!("{protected}{WRITE_NAME}"),
        (Mode::Shared, _) => format!("{protected}{READ_NAME}"),
        (Mode::Permits(_), _) => format!("{protected}{LEASE_NAME}"),
    }
}

/// The name to create ephemeral-sequential for an election candidate:
/// `_c_{uuid}-latch-`, as Curator's `LeaderLatch` names its protected nodes.
pub(crate) fn latch_prefix(uuid: &uuid::Uuid) -> String {
    format!("{}{LATCH_NAME}", protected_prefix(uuid))
}

/// The sequence number and mode of a contender, `None` for any other child.
pub(crate) fn parse(name: &str) -> Option<(&str, Mode)> {
    let split = name.len().checked_sub(SEQUENCE_DIGITS)?;
    let (head, digits) = (name.get(..split)?, name.get(split..)?);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    NAMES
        .iter()
        .find(|(tag, _)| head.ends_with(tag))
        .map(|&(_, mode)| (digits, mode))
}

/// Whether `name` ends in the server's 10-digit sequence number (what every lock client
/// orders by; a 64-bit sequence would never be ordered).
pub(crate) fn has_sequence(name: &str) -> bool {
    name.len() >= SEQUENCE_DIGITS
        && name.as_bytes()[name.len() - SEQUENCE_DIGITS..]
            .iter()
            .all(u8::is_ascii_digit)
}

/// The sequence number of a contender, `None` for any other child.
pub(crate) fn sequence(name: &str) -> Option<&str> {
    parse(name).map(|(digits, _)| digits)
}

/// A child of the key directory that contends for the key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) mode: Mode,
}

/// The contenders among `children`, in lock order (lowest sequence first).
pub(crate) fn contenders(children: Vec<String>) -> Vec<Node> {
    let mut contenders: Vec<Node> = children
        .into_iter()
        .filter_map(|name| {
            let mode = parse(&name)?.1;
            Some(Node { name, mode })
        })
        .collect();
    contenders.sort_by(|a, b| sequence(&a.name).cmp(&sequence(&b.name)));
    contenders
}

/// What the contender at `position` of `order` waits for: `None` when it holds the key,
/// otherwise the index of the node to watch.
///
/// - Exclusive: holds when first; otherwise watches the node just before it, whatever its
///   mode (Curator's write lock and mutex do the same).
/// - Shared: holds when no exclusive node is before it; otherwise watches the *last*
///   exclusive node before it. Curator's read lock watches the first one instead, and is
///   woken once per writer ahead of it; the last one can only go once every earlier
///   writer went (or by giving up), so its deletion is usually the one that admits us, and
///   a release wakes exactly the readers between that writer and the next one.
pub(crate) fn waits_for(order: &[Node], position: usize) -> Option<usize> {
    let ahead = order.get(..position)?;
    match order.get(position)?.mode {
        Mode::Exclusive => position.checked_sub(1),
        Mode::Shared => ahead.iter().rposition(|n| n.mode == Mode::Exclusive),
        // Lease nodes are counted in `leases`, never ordered in a lock directory (`parse`
        // gives no name this mode); a permit's turn to count comes from the `locks` mutex.
        Mode::Permits(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uuid() -> uuid::Uuid {
        uuid::Uuid::from_u128(0x1b4e28ba_2fa1_11d2_883f_0016cb8e9a2a)
    }

    #[test]
    fn our_names_are_curator_protected_names() {
        let uuid = uuid();
        let mutex = CuratorRecipe::Mutex;
        let rw = CuratorRecipe::ReadWriteLock;
        assert_eq!(
            node_prefix(&uuid, Mode::Exclusive, mutex),
            "_c_1b4e28ba-2fa1-11d2-883f-0016cb8e9a2a-lock-"
        );
        assert_eq!(
            node_prefix(&uuid, Mode::Exclusive, rw),
            "_c_1b4e28ba-2fa1-11d2-883f-0016cb8e9a2a-__WRIT__"
        );
        for curator in [mutex, rw] {
            assert_eq!(
                node_prefix(&uuid, Mode::Shared, curator),
                "_c_1b4e28ba-2fa1-11d2-883f-0016cb8e9a2a-__READ__"
            );
        }
        assert_eq!(
            node_prefix(&uuid, Mode::Permits(3), mutex),
            "_c_1b4e28ba-2fa1-11d2-883f-0016cb8e9a2a-lease-"
        );
        assert_eq!(
            latch_prefix(&uuid),
            "_c_1b4e28ba-2fa1-11d2-883f-0016cb8e9a2a-latch-"
        );
        let latch = format!("{}0000000007", latch_prefix(&uuid));
        assert_eq!(parse(&latch), Some(("0000000007", Mode::Exclusive)));
        assert_eq!(
            protected_prefix(&uuid),
            "_c_1b4e28ba-2fa1-11d2-883f-0016cb8e9a2a-"
        );
        for mode in [Mode::Exclusive, Mode::Shared] {
            for curator in [mutex, rw] {
                let ours = format!("{}0000000007", node_prefix(&uuid, mode, curator));
                assert!(ours.starts_with(&protected_prefix(&uuid)));
                assert_eq!(parse(&ours), Some(("0000000007", mode)));
            }
        }
    }

    #[test]
    fn contenders_follow_curator_go_and_kazoo_naming() {
        let children = vec![
            "_c_8eb6aa5e-6d50-4a41-a6b6-5a0e6fa4d3f1-lock-0000000031".to_owned(), // ours / Curator
            "_c_5fa8c3a1e0b94e0c8d8f3b1e2a7c6d90-lock-0000000029".to_owned(),     // go-zookeeper
            "3f2ae1c0b5d84f6e9a7c2b1d0e8f7a6b__lock__0000000030".to_owned(),      // kazoo
            "_c_8eb6aa5e-6d50-4a41-a6b6-5a0e6fa4d3f2-__WRIT__0000000033".to_owned(), // Curator writer
            "_c_8eb6aa5e-6d50-4a41-a6b6-5a0e6fa4d3f3-__READ__0000000028".to_owned(), // reader
            "3f2a__rlock__0000000034".to_owned(),                                    // kazoo reader
            "_c_8eb6aa5e-6d50-4a41-a6b6-5a0e6fa4d3f4-latch-0000000027".to_owned(),   // LeaderLatch
            "lock-0000000001".to_owned(), // no `-lock-`: not a contender
            "leases".to_owned(),          // unrelated child
            "x-lock-000000002".to_owned(), // 9 digits
            "x-lock-00000000a2".to_owned(), // not digits
            "x-__READ-0000000002".to_owned(), // not a name we know
            "_c_1-lock-0000000032".to_owned(),
        ];
        let order = contenders(children);
        let seqs: Vec<_> = order
            .iter()
            .map(|n| (sequence(&n.name).unwrap(), n.mode))
            .collect();
        use Mode::{Exclusive as X, Shared as S};
        assert_eq!(
            seqs,
            [
                ("0000000027", X),
                ("0000000028", S),
                ("0000000029", X),
                ("0000000030", X),
                ("0000000031", X),
                ("0000000032", X),
                ("0000000033", X),
                ("0000000034", S),
            ]
        );
    }

    fn queue(modes: &str) -> Vec<Node> {
        modes
            .chars()
            .map(|c| Node {
                name: c.to_string(),
                mode: if c == 'w' {
                    Mode::Exclusive
                } else {
                    Mode::Shared
                },
            })
            .collect()
    }

    #[test]
    fn a_writer_holds_first_and_watches_its_predecessor() {
        let order = queue("rrw");
        assert_eq!(waits_for(&order, 2), Some(1));
        assert_eq!(waits_for(&queue("w"), 0), None);
        assert_eq!(waits_for(&queue("wrw"), 2), Some(1));
    }

    #[test]
    fn readers_share_until_a_writer_is_ahead() {
        let order = queue("rrwrrwr");
        assert_eq!(waits_for(&order, 0), None);
        assert_eq!(waits_for(&order, 1), None);
        // Readers behind writers watch the last writer ahead of them.
        assert_eq!(waits_for(&order, 3), Some(2));
        assert_eq!(waits_for(&order, 4), Some(2));
        assert_eq!(waits_for(&order, 6), Some(5));
        assert_eq!(waits_for(&order, 7), None, "out of range");
    }

    #[test]
    fn odd_names_do_not_panic() {
        for name in [
            "",
            "-lock-",
            "é-lock-0000000001",
            "ééééé",
            "__lock__123456789",
            "__READ__",
        ] {
            let _ = parse(name);
        }
        assert_eq!(sequence("é-lock-0000000001"), Some("0000000001"));
        assert!(has_sequence("_c_1-lease-0000000001"));
        for name in ["", "é", "lease-000000001", "lease-00000000x1"] {
            assert!(!has_sequence(name), "{name}");
        }
    }
}
