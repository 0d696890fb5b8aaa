//! Lock node names: ours, and which children of a key directory contend for the lock.
//!
//! Ours are Curator's protected names, `_c_{uuid}-lock-{seq}` (go-zookeeper's `zk.Lock`
//! makes the same shape). Contenders are the children whose name ends in `-lock-` or
//! `__lock__` (kazoo) followed by the server's 10-digit sequence number; they are ordered by
//! that number, the lowest holds the lock.

/// The protected-mode marker Curator puts in front of the uuid.
const PROTECTED: &str = "_c_";
/// Curator's and go-zookeeper's lock name; kazoo matches it with
/// `extra_lock_patterns=["-lock-"]`.
const LOCK_NAME: &str = "-lock-";
/// kazoo's lock name.
const KAZOO_LOCK_NAME: &str = "__lock__";
/// Digits ZooKeeper appends to a sequential node's name.
const SEQUENCE_DIGITS: usize = 10;

/// `_c_{uuid}-`: what every node of one create attempt starts with, so the attempt can find
/// its node after a lost connection.
pub(crate) fn protected_prefix(uuid: &uuid::Uuid) -> String {
    format!("{PROTECTED}{}-", uuid.hyphenated())
}

/// `_c_{uuid}-lock-`: the name to create ephemeral-sequential; the server appends the
/// sequence number.
pub(crate) fn node_prefix(uuid: &uuid::Uuid) -> String {
    format!(
        "{}{}",
        protected_prefix(uuid).trim_end_matches('-'),
        LOCK_NAME
    )
}

/// The sequence number of a contender, `None` for any other child.
pub(crate) fn sequence(name: &str) -> Option<&str> {
    let split = name.len().checked_sub(SEQUENCE_DIGITS)?;
    let (head, digits) = (name.get(..split)?, name.get(split..)?);
    (digits.bytes().all(|b| b.is_ascii_digit())
        && (head.ends_with(LOCK_NAME) || head.ends_with(KAZOO_LOCK_NAME)))
    .then_some(digits)
}

/// The contenders among `children`, in lock order (lowest sequence first).
pub(crate) fn contenders(children: Vec<String>) -> Vec<String> {
    let mut contenders: Vec<String> = children
        .into_iter()
        .filter(|c| sequence(c).is_some())
        .collect();
    contenders.sort_by(|a, b| sequence(a).cmp(&sequence(b)));
    contenders
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn our_names_are_curator_protected_names() {
        let uuid = uuid::Uuid::from_u128(0x1b4e28ba_2fa1_11d2_883f_0016cb8e9a2a);
        assert_eq!(
            node_prefix(&uuid),
            "_c_1b4e28ba-2fa1-11d2-883f-0016cb8e9a2a-lock-"
        );
        assert_eq!(
            protected_prefix(&uuid),
            "_c_1b4e28ba-2fa1-11d2-883f-0016cb8e9a2a-"
        );
        let ours = format!("{}0000000007", node_prefix(&uuid));
        assert!(ours.starts_with(&protected_prefix(&uuid)));
        assert_eq!(sequence(&ours), Some("0000000007"));
    }

    #[test]
    fn contenders_follow_curator_go_and_kazoo_naming() {
        let children = vec![
            "_c_8eb6aa5e-6d50-4a41-a6b6-5a0e6fa4d3f1-lock-0000000031".to_owned(), // ours / Curator
            "_c_5fa8c3a1e0b94e0c8d8f3b1e2a7c6d90-lock-0000000029".to_owned(),     // go-zookeeper
            "3f2ae1c0b5d84f6e9a7c2b1d0e8f7a6b__lock__0000000030".to_owned(),      // kazoo
            "lock-0000000001".to_owned(), // no `-lock-`: not a contender
            "leases".to_owned(),          // unrelated child
            "x-lock-000000002".to_owned(), // 9 digits
            "x-lock-00000000a2".to_owned(), // not digits
            "3f2a__rlock__0000000003".to_owned(), // kazoo read lock: not ours to order
            "_c_1-lock-0000000032".to_owned(),
        ];
        let order = contenders(children);
        let seqs: Vec<_> = order.iter().map(|n| sequence(n).unwrap()).collect();
        assert_eq!(
            seqs,
            ["0000000029", "0000000030", "0000000031", "0000000032"]
        );
    }

    #[test]
    fn odd_names_do_not_panic() {
        for name in [
            "",
            "-lock-",
            "é-lock-0000000001",
            "ééééé",
            "__lock__123456789",
        ] {
            let _ = sequence(name);
        }
        assert_eq!(sequence("é-lock-0000000001"), Some("0000000001"));
    }
}
