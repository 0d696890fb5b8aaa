//! Latency histograms, percentiles and Jain's fairness index.

use std::time::Duration;

/// Sub-buckets per power of two: values are kept to within 1/64 (about 1.6 %).
const SUB_BITS: u32 = 6;
const SUB: usize = 1 << SUB_BITS;
/// Enough powers of two for any `u64` nanosecond count.
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

/// A log-linear histogram of durations in nanoseconds: fixed size, no allocation per
/// sample, so recording costs the same at a million operations per second as at ten.
#[derive(Clone)]
pub(crate) struct Histogram {
    counts: Box<[u64]>,
    total: u64,
    max: u64,
}

impl std::fmt::Debug for Histogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Histogram")
            .field("total", &self.total)
            .field("max", &self.max)
            .finish()
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS].into_boxed_slice(),
            total: 0,
            max: 0,
        }
    }
}

impl Histogram {
    fn index(v: u64) -> usize {
        if v < SUB as u64 {
            return v as usize;
        }
        let exp = 63 - v.leading_zeros(); // >= SUB_BITS
        let shift = exp - SUB_BITS;
        let mantissa = (v >> shift) as usize - SUB; // 0..SUB
        (shift as usize + 1) * SUB + mantissa
    }

    /// The smallest value that lands in bucket `i` (what percentiles report).
    fn lower_bound(i: usize) -> u64 {
        if i < SUB {
            return i as u64;
        }
        let shift = (i / SUB - 1) as u32;
        ((SUB + i % SUB) as u64) << shift
    }

    pub(crate) fn record(&mut self, d: Duration) {
        let v = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.counts[Self::index(v)] += 1;
        self.total += 1;
        self.max = self.max.max(v);
    }

    pub(crate) fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(other.counts.iter()) {
            *a += b;
        }
        self.total += other.total;
        self.max = self.max.max(other.max);
    }

    pub(crate) fn count(&self) -> u64 {
        self.total
    }

    pub(crate) fn max(&self) -> Duration {
        Duration::from_nanos(self.max)
    }

    /// The `q`-quantile (0 < q <= 1) by nearest rank; `None` when empty.
    pub(crate) fn quantile(&self, q: f64) -> Option<Duration> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Duration::from_nanos(Self::lower_bound(i).min(self.max)));
            }
        }
        Some(self.max())
    }
}

/// Jain's fairness index of per-client counts: 1.0 when every client got the same share,
/// 1/n when one client got everything.
pub(crate) fn jain(counts: &[u64]) -> f64 {
    let n = counts.len() as f64;
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let squares: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    if squares == 0.0 {
        return 0.0;
    }
    sum * sum / (n * squares)
}

/// The most intervals (start, end) open at once; one that ends where another starts does
/// not overlap it.
pub(crate) fn most_at_once<T: Ord + Copy>(intervals: &[(T, T)]) -> usize {
    // (instant, +1 for a start, -1 for an end): ends sort before starts at the same instant.
    let mut events: Vec<(T, i8)> = intervals
        .iter()
        .flat_map(|&(start, end)| [(start, 1), (end, -1)])
        .collect();
    events.sort_unstable();
    let (mut open, mut most) = (0usize, 0usize);
    for (_, step) in events {
        if step > 0 {
            open += 1;
            most = most.max(open);
        } else {
            open = open.saturating_sub(1);
        }
    }
    most
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_the_bucket_precision() {
        let mut h = Histogram::default();
        for us in 1..=1000u64 {
            h.record(Duration::from_micros(us));
        }
        let p50 = h.quantile(0.5).unwrap().as_nanos() as f64;
        let p99 = h.quantile(0.99).unwrap().as_nanos() as f64;
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.02, "{p50}");
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.02, "{p99}");
        assert_eq!(h.max(), Duration::from_micros(1000));
        assert_eq!(h.count(), 1000);
    }

    #[test]
    fn small_and_huge_values_fit() {
        let mut h = Histogram::default();
        h.record(Duration::ZERO);
        h.record(Duration::from_nanos(63));
        h.record(Duration::from_secs(u64::MAX / 1_000_000_000));
        assert_eq!(h.quantile(0.34).unwrap(), Duration::from_nanos(63));
        assert!(h.quantile(1.0).unwrap() > Duration::from_secs(1 << 30));
        assert_eq!(Histogram::default().quantile(0.5), None);
    }

    #[test]
    fn merge_adds_counts() {
        let (mut a, mut b) = (Histogram::default(), Histogram::default());
        a.record(Duration::from_micros(10));
        b.record(Duration::from_micros(30));
        b.record(Duration::from_micros(30));
        a.merge(&b);
        assert_eq!(a.count(), 3);
        let p50 = a.quantile(0.5).unwrap().as_nanos() as f64;
        assert!((p50 / 30_000.0 - 1.0).abs() < 0.02, "{p50}");
    }

    #[test]
    fn most_at_once_counts_overlapping_intervals() {
        assert_eq!(most_at_once::<u32>(&[]), 0);
        assert_eq!(most_at_once(&[(0, 10), (5, 15), (8, 9), (20, 30)]), 3);
        assert_eq!(
            most_at_once(&[(0, 10), (10, 20)]),
            1,
            "a hand-off is no overlap"
        );
    }

    #[test]
    fn jain_index() {
        assert!((jain(&[5, 5, 5, 5]) - 1.0).abs() < 1e-9);
        assert!((jain(&[20, 0, 0, 0]) - 0.25).abs() < 1e-9);
        assert_eq!(jain(&[0, 0]), 0.0);
    }
}
