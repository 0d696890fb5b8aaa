//! A `metrics` recorder that keeps every figure dlock records, so scenarios can read them
//! back. Installed once per test process (by [`crate::run`]) with per-key labels on
//! ([`dlock_core::telemetry::label_keys`]): each scenario's keys are its own, so concurrent
//! scenarios never see each other's figures.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

/// Every series recorded so far: its name, its labels, and its value (a counter's count, a
/// gauge's value, a histogram's number of samples).
#[derive(Debug, Default)]
pub struct Figures {
    series: Mutex<HashMap<Key, Arc<Series>>>,
}

#[derive(Debug, Default)]
struct Series {
    /// Counter: the count; gauge: the value's bits; histogram: the samples.
    value: AtomicU64,
}

impl CounterFn for Series {
    fn increment(&self, value: u64) {
        self.value.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.value.fetch_max(value, Ordering::SeqCst);
    }
}

impl GaugeFn for Series {
    fn increment(&self, value: f64) {
        self.update(|v| v + value);
    }
    fn decrement(&self, value: f64) {
        self.update(|v| v - value);
    }
    fn set(&self, value: f64) {
        self.value.store(value.to_bits(), Ordering::SeqCst);
    }
}

impl HistogramFn for Series {
    fn record(&self, _value: f64) {
        self.value.fetch_add(1, Ordering::SeqCst);
    }
}

impl Series {
    fn update(&self, f: impl Fn(f64) -> f64) {
        let _ = self
            .value
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |bits| {
                Some(f(f64::from_bits(bits)).to_bits())
            });
    }
}

impl Figures {
    /// The process's figures, recording from the first call on (once per process; where
    /// another recorder was installed first, nothing is recorded here and scenarios that
    /// read figures fail saying so).
    pub fn installed() -> &'static Figures {
        static FIGURES: OnceLock<&'static Figures> = OnceLock::new();
        FIGURES.get_or_init(|| {
            let figures: &'static Figures = Box::leak(Box::default());
            if metrics::set_global_recorder(Keeper(figures)).is_ok() {
                dlock_core::telemetry::label_keys(true);
            }
            figures
        })
    }

    fn series(&self, key: &Key) -> Arc<Series> {
        self.series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone()
    }

    /// Whether any series named `name` was recorded.
    pub fn seen(&self, name: &str) -> bool {
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        series.keys().any(|key| key.name() == name)
    }

    /// The sum over the series named `name` whose labels include every pair of `labels`:
    /// counts for counters and histograms (samples), values for gauges (`gauge` true).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)], gauge: bool) -> f64 {
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        series
            .iter()
            .filter(|(key, _)| key.name() == name)
            .filter(|(key, _)| {
                labels
                    .iter()
                    .all(|(k, v)| key.labels().any(|l| l.key() == *k && l.value() == *v))
            })
            .map(|(_, s)| {
                let bits = s.value.load(Ordering::SeqCst);
                match gauge {
                    true => f64::from_bits(bits),
                    false => bits as f64,
                }
            })
            .sum()
    }
}

/// The recorder that fills the figures.
#[derive(Debug)]
struct Keeper(&'static Figures);

impl Recorder for Keeper {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.0.series(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.0.series(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.0.series(key))
    }
}
