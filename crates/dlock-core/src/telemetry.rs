//! The figures every dlock client records through the [`metrics`] facade, for every backend
//! and mode, in one place.
//!
//! Nothing is exported until the application installs a recorder (a Prometheus, StatsD or
//! OpenTelemetry exporter for the `metrics` crate); without one, recording costs next to
//! nothing. Every figure carries the labels `backend` (`redis`, `zookeeper`, …) and
//! `primitive` (the [`Mode`]: `exclusive`, `shared`, `permits`; or `election` for a
//! [campaign](crate::Election::campaign)); the key is left out unless
//! [`label_keys`] turns it on, since one series per key can overwhelm a metrics store.
//!
//! | name | kind | extra labels | what it counts |
//! |---|---|---|---|
//! | `dlock_acquire_seconds` | histogram | `outcome`: `acquired`, `busy`, `timeout`, `error` | how long each `acquire` or `try_acquire` took, from the call to its answer (`busy`: `try_acquire` found the key held) |
//! | `dlock_handoffs_total` | counter | | acquisitions granted after waiting for a holder to let go, in this client or on the server |
//! | `dlock_hold_seconds` | histogram | | how long each lease was held, from its grant to its release, drop or loss |
//! | `dlock_leases_held` | gauge | | leases held now |
//! | `dlock_renewals_total` | counter | `outcome`: `ok`, `failed`, `not_held` | renewals sent by the watchdog and manual `extend`s (`failed`: not answered or refused, retried while the lease is safe; `not_held`: the server says the key is not ours) |
//! | `dlock_leases_lost_total` | counter | `reason`: `expired`, `not_held`, `unreachable`, `session_ended` | leases lost, by [`LostReason`] |
//! | `dlock_cleanups_pending` | gauge | (none) | background clean-ups not finished yet: releases of dropped leases, what cancelled acquires left (see [`settle`](crate::settle)) |
//!
//! ```
//! // Per-key series, only where the keys are few.
//! dlock_core::telemetry::label_keys(true);
//! # dlock_core::telemetry::label_keys(false);
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use metrics::Label;

use crate::LostReason;
#[cfg(doc)]
use crate::Mode;

/// `dlock_acquire_seconds`: see the [module docs](self).
pub const ACQUIRE_SECONDS: &str = "dlock_acquire_seconds";
/// `dlock_handoffs_total`: see the [module docs](self).
pub const HANDOFFS_TOTAL: &str = "dlock_handoffs_total";
/// `dlock_hold_seconds`: see the [module docs](self).
pub const HOLD_SECONDS: &str = "dlock_hold_seconds";
/// `dlock_leases_held`: see the [module docs](self).
pub const LEASES_HELD: &str = "dlock_leases_held";
/// `dlock_renewals_total`: see the [module docs](self).
pub const RENEWALS_TOTAL: &str = "dlock_renewals_total";
/// `dlock_leases_lost_total`: see the [module docs](self).
pub const LEASES_LOST_TOTAL: &str = "dlock_leases_lost_total";
/// `dlock_cleanups_pending`: see the [module docs](self).
pub const CLEANUPS_PENDING: &str = "dlock_cleanups_pending";

static KEY_LABEL: AtomicBool = AtomicBool::new(false);

/// Add the label `key` to every figure of a lock from now on (off by default). Every key
/// then makes series of its own: turn it on only where the keys are few and known.
pub fn label_keys(on: bool) {
    KEY_LABEL.store(on, Ordering::Relaxed);
}

/// The labels of one lease or acquire: backend, primitive, and the key where enabled.
#[derive(Debug, Clone)]
pub(crate) struct Labels(Vec<Label>);

impl Labels {
    pub(crate) fn new(backend: &'static str, primitive: &'static str, key: &str) -> Self {
        let mut labels = vec![
            Label::from_static_parts("backend", backend),
            Label::from_static_parts("primitive", primitive),
        ];
        if KEY_LABEL.load(Ordering::Relaxed) {
            labels.push(Label::new("key", key.to_owned()));
        }
        Self(labels)
    }

    fn with(&self, name: &'static str, value: &'static str) -> Vec<Label> {
        let mut labels = self.0.clone();
        labels.push(Label::from_static_parts(name, value));
        labels
    }

    /// An acquire answered with `outcome` after `took`.
    pub(crate) fn acquired(&self, outcome: &'static str, took: Duration) {
        metrics::histogram!(ACQUIRE_SECONDS, self.with("outcome", outcome)).record(took);
    }

    /// A grant came after waiting for a holder to let go.
    pub(crate) fn handoff(&self) {
        metrics::counter!(HANDOFFS_TOTAL, self.0.clone()).increment(1);
    }

    /// A lease started.
    pub(crate) fn lease_started(&self) {
        metrics::gauge!(LEASES_HELD, self.0.clone()).increment(1.0);
    }

    /// A lease ended (released, dropped or lost) after `held`.
    pub(crate) fn lease_ended(&self, held: Duration) {
        metrics::histogram!(HOLD_SECONDS, self.0.clone()).record(held);
        metrics::gauge!(LEASES_HELD, self.0.clone()).decrement(1.0);
    }

    /// A renewal (or manual extend) was answered with `outcome`.
    pub(crate) fn renewal(&self, outcome: &'static str) {
        metrics::counter!(RENEWALS_TOTAL, self.with("outcome", outcome)).increment(1);
    }

    /// A lease was lost for `reason`.
    pub(crate) fn lost(&self, reason: &LostReason) {
        let reason = match reason {
            LostReason::Expired => "expired",
            LostReason::NotHeld => "not_held",
            LostReason::Unreachable(_) => "unreachable",
            LostReason::SessionEnded(_) => "session_ended",
        };
        metrics::counter!(LEASES_LOST_TOTAL, self.with("reason", reason)).increment(1);
    }
}

/// A background clean-up started. Counted up and down (never set from a count read
/// earlier), so concurrent clean-ups cannot publish their counts out of order.
pub(crate) fn cleanup_started() {
    metrics::gauge!(CLEANUPS_PENDING).increment(1.0);
}

/// A background clean-up ended.
pub(crate) fn cleanup_ended() {
    metrics::gauge!(CLEANUPS_PENDING).decrement(1.0);
}
