//! `settle` waits for background clean-up. Its own test binary: the count is process-wide.

use std::time::Duration;

#[tokio::test(start_paused = true)]
async fn settle_waits_for_cleanup_and_gives_up_at_its_limit() {
    assert!(
        dlock_core::settle(Duration::ZERO).await,
        "nothing pending yet"
    );
    assert!(dlock_core::raw::spawn_cleanup(tokio::time::sleep(
        Duration::from_millis(300)
    )));
    assert!(
        !dlock_core::settle(Duration::from_millis(100)).await,
        "the clean-up is still running"
    );
    assert!(
        dlock_core::settle(Duration::from_secs(1)).await,
        "the clean-up finished by then"
    );
}

#[test]
fn outside_a_runtime_nothing_is_spawned() {
    assert!(!dlock_core::raw::spawn_cleanup(async {}));
}
