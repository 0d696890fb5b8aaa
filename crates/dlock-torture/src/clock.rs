//! One clock for every process of a run: `CLOCK_MONOTONIC`, which Linux keeps system-wide,
//! so instants taken by different workers and by the coordinator compare directly.

use std::time::Duration;

use nix::time::{ClockId, clock_gettime};

/// Nanoseconds on the system-wide monotonic clock.
pub(crate) fn now_ns() -> u64 {
    let ts = clock_gettime(ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC is always readable");
    let secs = u64::try_from(ts.tv_sec()).expect("monotonic seconds are not negative");
    let nanos = u64::try_from(ts.tv_nsec()).expect("nanoseconds are not negative");
    secs * 1_000_000_000 + nanos
}

/// `d` in nanoseconds.
pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds as milliseconds, for reports.
pub(crate) fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward_with_std_instant() {
        let a = now_ns();
        let start = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(20));
        let b = now_ns();
        let elapsed = ns(start.elapsed());
        assert!(b > a);
        // Same clock as std's Instant on Linux: the two spans agree closely.
        assert!(
            (b - a).abs_diff(elapsed) < ns(Duration::from_millis(5)),
            "{} vs {elapsed}",
            b - a
        );
    }
}
