//! Every hold recorded as an interval, and the checker that rejects overlaps and token
//! regressions. It knows modes: shared holds may overlap each other, never an exclusive one,
//! and a permit hold starts only while fewer holds of permits than its limit are trusted.

use std::fmt;
use std::sync::{Arc, Mutex};

use dlock_core::Mode;
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
    /// Exclusive, shared or one of N permits.
    pub mode: Mode,
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
    /// `second` acquired while `first` still believed it held the key, and at least one
    /// of them is exclusive.
    Overlap {
        /// The earlier hold.
        first: Hold,
        /// The hold that started inside it.
        second: Hold,
    },
    /// `hold`, one of N permits, started while N or more other holds of permits were still
    /// trusted (N is `hold`'s own limit).
    OverLimit {
        /// The hold that started one too many.
        hold: Hold,
        /// The permit holds trusted when it started.
        holders: Vec<Hold>,
    },
    /// A later holder got a token no greater than an earlier holder's (for a shared
    /// later holder: than an earlier exclusive holder's).
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
            Violation::OverLimit { hold, holders } => write!(
                f,
                "too many holders of {:?}: client {} (token {}, {}) acquired while {} permits were held (clients {:?})",
                hold.key,
                hold.client,
                hold.token,
                hold.mode,
                holders.len(),
                holders.iter().map(|h| h.client).collect::<Vec<_>>()
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
    /// (not yet released and not yet told it was lost) unless both are shared (readers or
    /// permits), a permit hold may not start while its limit of permit holds is trusted,
    /// and, when `ordered_tokens`, an exclusive hold's token must be greater than every
    /// earlier hold's, a shared or permit hold's greater than every earlier exclusive
    /// hold's.
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
        // Among the holds so far, of any mode and exclusive only: the one trusted the
        // longest, and the one with the greatest token.
        let (mut any, mut exclusive) = (Latest::default(), Latest::default());
        // Permit holds that may still be trusted at the current start.
        let mut permits: Vec<&Hold> = Vec::new();
        for hold in holds {
            if let Mode::Permits(limit) = hold.mode {
                permits.retain(|p| p.trusted_until() > hold.start);
                if permits.len() >= limit as usize {
                    violations.push(Violation::OverLimit {
                        hold: hold.clone(),
                        holders: permits.iter().map(|&p| p.clone()).collect(),
                    });
                }
                permits.push(hold);
            }
            // What this hold must not overlap, nor get a smaller token than.
            let rival = match hold.mode {
                Mode::Exclusive => &any,
                Mode::Shared | Mode::Permits(_) => &exclusive,
            };
            if let Some(prev) = rival.trusted
                && hold.start < prev.trusted_until()
            {
                violations.push(Violation::Overlap {
                    first: prev.clone(),
                    second: hold.clone(),
                });
            }
            if ordered_tokens
                && let Some(prev) = rival.top_token
                && hold.token <= prev.token
            {
                violations.push(Violation::TokenRegression {
                    earlier: prev.clone(),
                    later: hold.clone(),
                });
            }
            any.add(hold);
            if hold.mode == Mode::Exclusive {
                exclusive.add(hold);
            }
        }
    }
    violations
}

#[derive(Default)]
struct Latest<'a> {
    trusted: Option<&'a Hold>,
    top_token: Option<&'a Hold>,
}

impl<'a> Latest<'a> {
    fn add(&mut self, hold: &'a Hold) {
        if self
            .trusted
            .is_none_or(|l| hold.trusted_until() > l.trusted_until())
        {
            self.trusted = Some(hold);
        }
        if self.top_token.is_none_or(|t| hold.token > t.token) {
            self.top_token = Some(hold);
        }
    }
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
            mode: Mode::Exclusive,
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

    fn shared(client: usize, token: u64, start_ms: u64, end_ms: u64, t0: Instant) -> Hold {
        Hold {
            mode: Mode::Shared,
            ..hold(client, token, start_ms, end_ms, t0)
        }
    }

    #[test]
    fn shared_holds_overlap_each_other_but_never_an_exclusive_one() {
        let t0 = Instant::now();
        let readers = [shared(1, 1, 0, 10, t0), shared(2, 1, 5, 20, t0)];
        assert!(
            check(&readers, true).is_empty(),
            "readers share, tokens may tie"
        );
        let writer_inside = [
            readers[0].clone(),
            readers[1].clone(),
            hold(3, 2, 15, 30, t0),
        ];
        assert_eq!(check(&writer_inside, true).len(), 1);
        let reader_inside_writer = [hold(1, 1, 0, 10, t0), shared(2, 2, 5, 20, t0)];
        assert_eq!(check(&reader_inside_writer, true).len(), 1);
    }

    #[test]
    fn a_writer_token_tops_every_earlier_token_and_a_reader_token_every_earlier_writer() {
        let t0 = Instant::now();
        let ok = [
            hold(1, 3, 0, 10, t0),
            shared(2, 4, 11, 20, t0),
            hold(3, 5, 21, 30, t0),
        ];
        assert!(check(&ok, true).is_empty());
        let writer_below_reader = [shared(1, 7, 0, 10, t0), hold(2, 6, 11, 20, t0)];
        assert_eq!(check(&writer_below_reader, true).len(), 1);
        let reader_below_writer = [hold(1, 7, 0, 10, t0), shared(2, 7, 11, 20, t0)];
        assert_eq!(check(&reader_below_writer, true).len(), 1);
    }

    fn permit(client: usize, of: u32, start_ms: u64, end_ms: u64, t0: Instant) -> Hold {
        Hold {
            mode: Mode::Permits(of),
            ..hold(client, client as u64, start_ms, end_ms, t0)
        }
    }

    #[test]
    fn permit_holds_are_counted_against_their_limit() {
        let t0 = Instant::now();
        let two_of_two = [permit(1, 2, 0, 10, t0), permit(2, 2, 5, 20, t0)];
        assert!(check(&two_of_two, true).is_empty());
        let third = [
            two_of_two[0].clone(),
            two_of_two[1].clone(),
            permit(3, 2, 8, 30, t0),
        ];
        let v = check(&third, true);
        assert!(
            matches!(v.as_slice(), [Violation::OverLimit { holders, .. }] if holders.len() == 2),
            "{v:?}"
        );
        // Once the first is gone, a third fits; one asking for more permits fits anyway.
        let later = [
            two_of_two[0].clone(),
            two_of_two[1].clone(),
            permit(3, 2, 11, 30, t0),
        ];
        assert!(check(&later, true).is_empty());
        let bigger = [
            two_of_two[0].clone(),
            two_of_two[1].clone(),
            permit(3, 3, 8, 30, t0),
        ];
        assert!(check(&bigger, true).is_empty());
    }

    #[test]
    fn permit_holds_never_overlap_an_exclusive_one() {
        let t0 = Instant::now();
        let holds = [permit(1, 5, 0, 10, t0), hold(2, 9, 5, 20, t0)];
        assert_eq!(check(&holds, true).len(), 1);
        let holds = [hold(2, 9, 0, 10, t0), permit(1, 5, 5, 20, t0)];
        assert_eq!(
            check(&holds, true).len(),
            2,
            "overlap and a token below the writer's"
        );
    }

    #[test]
    fn keys_are_checked_separately() {
        let t0 = Instant::now();
        let mut other = hold(2, 1, 5, 8, t0);
        other.key = "other".into();
        assert!(check(&[hold(1, 1, 0, 10, t0), other], true).is_empty());
    }
}
