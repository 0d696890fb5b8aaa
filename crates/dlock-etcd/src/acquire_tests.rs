//! Unit tests of the key ranges an attempt waits for.

use super::*;

fn blocks(mode: Mode, name: &str) -> bool {
    let key = format!("dlock/cron/{name}");
    blocking_ranges("dlock/cron/", mode)
        .iter()
        .any(|(start, end)| start.as_str() <= key.as_str() && key.as_str() < end.as_str())
}

#[test]
fn a_reader_is_blocked_by_every_key_under_the_lock_but_the_readers() {
    for name in [
        "694d8f1a2b3c",
        "694d8f1a2b3c-2",
        "write/17a",
        "read",
        "reader",
        "zz",
    ] {
        assert!(blocks(Mode::Shared, name), "{name}");
    }
    for name in ["read/694d8f1a2b3c", "read/694d8f1a2b3c-3", "read/"] {
        assert!(!blocks(Mode::Shared, name), "{name}");
    }
}

#[test]
fn a_writer_is_blocked_by_every_key_under_the_lock_and_none_beside_it() {
    for name in ["694d8f1a2b3c", "read/694d8f1a2b3c", "write/17a", "zz"] {
        assert!(blocks(Mode::Exclusive, name), "{name}");
    }
    for key in ["dlock/cron", "dlock/cron0", "dlock/cronjob/1"] {
        let inside = blocking_ranges("dlock/cron/", Mode::Exclusive)
            .iter()
            .any(|(start, end)| start.as_str() <= key && key < end.as_str());
        assert!(!inside, "{key}");
    }
}
