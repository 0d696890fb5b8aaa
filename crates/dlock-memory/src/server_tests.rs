//! Tests of `server`.

use super::*;

#[test]
fn expired_unreleased_keys_do_not_pile_up() {
    let mut state = State::default();
    for i in 0..10_000 {
        // Held for no time and never released, as by a crashed holder.
        state.grant(
            &format!("k{i}"),
            Mode::Exclusive,
            Duration::ZERO,
            None,
            None,
        );
    }
    assert!(state.keys.len() <= 128, "{} slots kept", state.keys.len());
    let live = state.grant("live", Mode::Exclusive, Duration::from_secs(60), None, None);
    for i in 0..1_000 {
        state.grant(&format!("j{i}"), Mode::Shared, Duration::ZERO, None, None);
    }
    assert!(state.holds("live", live.id), "a live holder is never swept");
}
