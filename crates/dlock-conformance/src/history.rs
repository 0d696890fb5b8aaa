//! Every hold recorded as an interval, and the checker that rejects overlaps and token
//! regressions.

use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

/// One hold of a key, as its holder saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    /// Which client (any label the recorder chooses).
    pub client: usize,
    /// The key.
    pub key: String,
    /// The fencing token of the grant.
    pub token: u64,
    /// When `acquire` returned.
    pub start: Instant,
    /// When the holder called `release` (or stopped relying on the lease).
    pub end: Instant,
    /// When the holder was told the lease was lost, if it was.
    pub lost_at: Option<Instant>,
}

impl Hold {
    /// The last instant the holder could rightly believe it held the key.
    fn trusted_until(&self) -> Instant {
        match self.lost_at {
            Some(lost) => lost.min(self.end),
            None => self.end,
        }
    }
}

/// A broken promise found in a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// `second` acquired while `first` still believed it held the key.
    Overlap {
        /// The earlier hold.
        first: Hold,
        /// The hold that started inside it.
        second: Hold,
    },
    /// A later holder got a token no greater than an earlier holder's.
    TokenRegression {
        /// The earlier hold, with the greater or equal token.
        earlier: Hold,
        /// The later hold.
        later: Hold,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { first, second } => write!(
                f,
                "overlap on {:?}: client {} (token {}) acquired {:?} before client {} (token {}) released",
                first.key,
                second.client,
                second.token,
                first
                    .trusted_until()
                    .saturating_duration_since(second.start),
                first.client,
                first.token
            ),
            Violation::TokenRegression { earlier, later } => write!(
                f,
                "token regression on {:?}: client {} got token {} after client {} had token {}",
                later.key, later.client, later.token, earlier.client, earlier.token
            ),
        }
    }
}

/// A shared, append-only record of holds. Clone it into every task.
#[derive(Debug, Clone, Default)]
pub struct History {
    holds: Arc<Mutex<Vec<Hold>>>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record one hold.
    pub fn record(&self, hold: Hold) {
        self.holds
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(hold);
    }

    /// All holds recorded so far.
    pub fn holds(&self) -> Vec<Hold> {
        self.holds.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Check every key's holds: no hold may start while an earlier one was still trusted
    /// (not yet released and not yet told it was lost), and, when `ordered_tokens`, tokens
    /// must strictly increase in the order holds started.
    pub fn check(&self, ordered_tokens: bool) -> Vec<Violation> {
        check(&self.holds(), ordered_tokens)
    }
}

/// See [`History::check`].
pub fn check(holds: &[Hold], ordered_tokens: bool) -> Vec<Violation> {
    let mut by_key: std::collections::BTreeMap<&str, Vec<&Hold>> = Default::default();
    for hold in holds {
        by_key.entry(&hold.key).or_default().push(hold);
    }
    let mut violations = Vec::new();
    for (_, mut holds) in by_key {
        holds.sort_by_key(|h| h.start);
        let mut latest: Option<&Hold> = None; // the hold trusted the longest so far
        let mut top_token: Option<&Hold> = None;
        for hold in holds {
            if let Some(prev) = latest
                && hold.start < prev.trusted_until()
            {
                violations.push(Violation::Overlap {
                    first: prev.clone(),
                    second: hold.clone(),
                });
            }
            if ordered_tokens
                && let Some(prev) = top_token
                && hold.token <= prev.token
            {
                violations.push(Violation::TokenRegression {
                    earlier: prev.clone(),
                    later: hold.clone(),
                });
            }
            if latest.is_none_or(|l| hold.trusted_until() > l.trusted_until()) {
                latest = Some(hold);
            }
            if top_token.is_none_or(|t| hold.token > t.token) {
                top_token = Some(hold);
            }
        }
    }
    violations
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn hold(client: usize, token: u64, start_ms: u64, end_ms: u64, t0: Instant) -> Hold {
        Hold {
            client,
            key: "k".into(),
            token,
            start: t0 + Duration::from_millis(start_ms),
            end: t0 + Duration::from_millis(end_ms),
            lost_at: None,
        }
    }

    #[test]
    fn a_clean_history_passes() {
        let t0 = Instant::now();
        let holds = [
            hold(1, 1, 0, 10, t0),
            hold(2, 2, 11, 20, t0),
            hold(1, 3, 21, 30, t0),
        ];
        assert!(check(&holds, true).is_empty());
    }

    #[test]
    fn an_overlap_is_caught() {
        let t0 = Instant::now();
        let holds = [hold(1, 1, 0, 10, t0), hold(2, 2, 9, 20, t0)];
        let v = check(&holds, true);
        assert!(matches!(v.as_slice(), [Violation::Overlap { .. }]), "{v:?}");
    }

    #[test]
    fn an_overlap_hidden_behind_a_short_hold_is_caught() {
        let t0 = Instant::now();
        // Client 1 holds 0..100; client 2 holds 50..60 inside it; client 3 holds 70..80.
        let holds = [
            hold(1, 1, 0, 100, t0),
            hold(2, 2, 50, 60, t0),
            hold(3, 3, 70, 80, t0),
        ];
        assert_eq!(check(&holds, true).len(), 2);
    }

    #[test]
    fn a_token_regression_is_caught() {
        let t0 = Instant::now();
        let holds = [
            hold(1, 5, 0, 10, t0),
            hold(2, 5, 11, 20, t0),
            hold(1, 4, 21, 30, t0),
        ];
        let v = check(&holds, true);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(
            v.iter()
                .all(|v| matches!(v, Violation::TokenRegression { .. }))
        );
        assert!(check(&holds, false).is_empty());
    }

    #[test]
    fn a_holder_told_it_was_lost_before_the_next_acquire_is_no_overlap() {
        let t0 = Instant::now();
        let mut zombie = hold(1, 1, 0, 100, t0);
        zombie.lost_at = Some(t0 + Duration::from_millis(40));
        let holds = [zombie.clone(), hold(2, 2, 50, 60, t0)];
        assert!(check(&holds, true).is_empty());
        zombie.lost_at = Some(t0 + Duration::from_millis(55));
        assert_eq!(check(&[zombie, hold(2, 2, 50, 60, t0)], true).len(), 1);
    }

    #[test]
    fn keys_are_checked_separately() {
        let t0 = Instant::now();
        let mut other = hold(2, 1, 5, 8, t0);
        other.key = "other".into();
        assert!(check(&[hold(1, 1, 0, 10, t0), other], true).is_empty());
    }
}
