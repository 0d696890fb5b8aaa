//! Cluster names: every name of a lock in the lock key's hash slot, whatever the key.

use super::Names;
use redis::cluster_routing::Slot;

fn same_slot(names: &Names) -> bool {
    let slot = Slot::for_key(&names.key);
    [&names.fence, &names.queue, &names.waiters, &names.hold]
        .iter()
        .all(|name| Slot::for_key(name) == slot)
}

#[test]
fn plain_keys_keep_the_one_server_names() {
    for key in ["a", "reports/nightly", "a{b", "{x", "ünï"] {
        let names = Names::in_cluster("dlock:", key);
        assert_eq!(names, Names::new("dlock:", key), "{key}");
        assert!(same_slot(&names), "{key}");
    }
}

#[test]
fn keys_with_a_closing_brace_get_companions_tagged_with_their_slot() {
    for (prefix, key) in [
        ("dlock:", "near}:fence"),
        ("dlock:", "a{b}c"),
        ("dlock:", "}"),
        ("dlock:", "a{}b}"),
        ("", "{tag}rest"),
        ("{app}:", "k"),
        ("x}", "k"),
    ] {
        let plain = Names::new(prefix, key);
        let names = Names::in_cluster(prefix, key);
        assert_eq!(names.key, plain.key, "the lock key keeps its name");
        assert!(same_slot(&names), "{prefix}{key}: {names:?}");
        assert!(names.fence.starts_with("{s"), "{names:?}");
        assert!(names.fence.ends_with(&plain.fence), "{names:?}");
    }
    // Distinct keys keep distinct companions.
    let a = Names::in_cluster("dlock:", "a}");
    let b = Names::in_cluster("dlock:", "b}");
    assert_ne!(a.fence, b.fence);
}

/// Found in review: when only keys whose companions left the lock key's slot were tagged,
/// `sN}{L` (empty prefix) kept the plain name `{sN}{L}:fence`, which is exactly the tagged
/// name of `L` whenever both lock keys hash to slot N (one key in 16,384 of this form).
#[test]
fn a_crafted_key_never_gets_another_keys_companions() {
    for i in 0..40_000 {
        let other = format!("}}b{i}");
        let tag = super::slot_tag(Slot::for_key(&other));
        let crafted = format!("{tag}}}{{{other}");
        let (a, b) = (
            Names::in_cluster("", &other),
            Names::in_cluster("", &crafted),
        );
        assert_ne!(a.fence, b.fence, "{other:?} and {crafted:?}");
        assert_ne!(a.hold, b.hold, "{other:?} and {crafted:?}");
    }
}
