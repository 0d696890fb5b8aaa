//! Tests of `lock`.

use super::*;

#[test]
fn validity_saturates_and_lost_fires_before_it_ends() {
    let ttl = Duration::from_secs(10);
    assert_eq!(
        validity(ttl, Duration::from_millis(500)),
        Duration::from_millis(10_000 - 500 - 100 - 2)
    );
    assert_eq!(validity(ttl, Duration::from_secs(11)), Duration::ZERO);
    assert_eq!(
        validity(Duration::from_millis(1), Duration::ZERO),
        Duration::ZERO
    );
    // The core fires lost() ttl/10 + 2 ms before sent_at + ttl: never after the
    // validity's end, sent_at + ttl - drift.
    for ms in [100, 101, 999, 2_000, 30_000, 86_400_000] {
        let ttl = Duration::from_millis(ms);
        assert!(ttl / 10 + Duration::from_millis(2) >= drift(ttl), "{ttl:?}");
    }
}

#[test]
fn a_majority_holder_is_told_from_a_split_vote() {
    let held = |h: &str| View::Held {
        holder: h.into(),
        expires: None,
    };
    let lease = [held("w"), held("w"), held("w"), held("a"), View::Down];
    assert!(majority_holder(&lease, 3));
    let split = [held("a"), held("a"), held("b"), held("b"), View::Open];
    assert!(!majority_holder(&split, 3));
}

#[test]
fn backoff_is_bounded() {
    for _ in 0..100 {
        assert!(backoff(Duration::from_secs(1)) <= MAX_BACKOFF);
        assert!(backoff(Duration::from_millis(1)) <= Duration::from_millis(9));
    }
}
