//! The election workload: N candidates campaign in one election while one more client
//! follows it with `Election::observe`.
//!
//! Each candidate loops: `campaign(value)` (the value names the candidate), lead for
//! `--hold` but at least [`MIN_HOLD`], `resign()`. The observer is subscribed before the
//! warm-up ends and records, for each leader it reports, the instant it saw it. From these
//! come the terms per second, the hand-over (a leader's `resign` call → the next leader's
//! `campaign` returned) and the observer's lag (a `campaign` returned → the observer
//! reported that term), and the share of terms the observer saw at all: a backend that
//! polls ([`Observe::Polled`]) misses a term shorter than its period.
//!
//! Every leadership is recorded as a hold in the conformance suite's `History`, its term as
//! the token: two leaders at once (or a term going back) is a failure, never a number.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use dlock::{DistributedLock, Election, Mode, Observe};
use dlock_conformance::{History, Hold};
use futures::StreamExt as _;
use futures::future::join_all;
use tokio::sync::oneshot;
use tokio::time::{Instant, sleep};

use crate::backends;
use crate::run::{LockFailure, Plan, Window};
use crate::stats::Histogram;

/// The shortest term: long enough that an observer woken by the server sees each leader
/// before it resigns, so the share seen measures the backend rather than the hold.
pub(crate) const MIN_HOLD: Duration = Duration::from_millis(10);

/// An election measurement that never had two leaders at once.
#[derive(Debug)]
pub(crate) struct ElectionMeasure {
    /// Terms begun (campaigns returned) in the window.
    pub(crate) count: u64,
    pub(crate) per_sec: f64,
    /// A leader's `resign` call → the next leader's `campaign` returned, for terms begun in
    /// the window.
    pub(crate) handover: Histogram,
    /// A `campaign` returned → the observer reported that term, for the terms of the window
    /// it reported (an observer that saw the term first counts 0).
    pub(crate) lag: Histogram,
    /// Terms of the window the observer reported.
    pub(crate) observed: u64,
    /// Terms begun in the window per candidate.
    pub(crate) per_client: Vec<u64>,
    /// Leaderships the history checker saw (warm-up and drain included).
    pub(crate) holds_checked: usize,
}

/// `1 s`, `250 ms`: the periods backends declare are whole seconds or milliseconds.
pub(crate) fn period(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{} s", d.as_secs())
    } else if d.subsec_nanos().is_multiple_of(1_000_000) {
        format!("{} ms", d.as_millis())
    } else {
        humantime::format_duration(d).to_string()
    }
}

/// How a backend's observers learn of a new leader, as the report prints it.
pub(crate) fn observe_label(observe: Observe) -> String {
    match observe {
        Observe::Unsupported => "unsupported".into(),
        Observe::Woken { recheck } => format!("woken (recheck {})", period(recheck)),
        Observe::Polled { every } => format!("polled every {}", period(every)),
    }
}

/// One candidate's leaderships: (term, `campaign` returned, `resign` called).
type Terms = Vec<(u64, Instant, Instant)>;

/// The value candidate `i` publishes.
fn value(i: usize) -> String {
    format!("candidate-{i}")
}

/// Run the election workload with `clients` candidates and one observer, each from its own
/// `dlock::connect(url)`.
pub(crate) async fn run(
    url: &str,
    clients: usize,
    plan: &Plan,
) -> Result<ElectionMeasure, LockFailure> {
    let connected =
        join_all((0..=clients).map(|_| backends::connect(url, plan.connect_timeout))).await;
    let mut locks: Vec<Arc<dyn DistributedLock>> = connected
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| format!("connect: {e}"))?;
    let observer = locks.pop().ok_or_else(|| "no client".to_owned())?;
    run_with(locks, observer, plan).await
}

/// Run the election workload with these candidates (one task each) and this observer.
pub(crate) async fn run_with(
    candidates: Vec<Arc<dyn DistributedLock>>,
    observer: Arc<dyn DistributedLock>,
    plan: &Plan,
) -> Result<ElectionMeasure, LockFailure> {
    let clients = candidates.len();
    let caps = observer.capabilities();
    if caps.election == Observe::Unsupported {
        return Err(format!(
            "{} declares no elections (Observe::Unsupported)",
            observer.backend_name()
        )
        .into());
    }
    let key = format!("{}/elections{clients}", plan.prefix);
    let opts = plan.options();
    let hold = plan.hold.max(MIN_HOLD);
    let window = Window::after_warmup(plan);

    // The observer records the first instant it reported each (value, term); it stops when
    // told, after the candidates, or at its stream's error.
    let (stop, mut stopped) = oneshot::channel::<()>();
    let mut follow = Election::new(observer.clone(), key.clone()).observe();
    let watcher = tokio::spawn(async move {
        let mut seen: HashMap<(String, u64), Instant> = HashMap::new();
        loop {
            tokio::select! {
                _ = &mut stopped => return (seen, Ok(())),
                next = follow.next() => match next {
                    Some(Ok(Some(leader))) => {
                        seen.entry((leader.value, leader.term)).or_insert_with(Instant::now);
                    }
                    Some(Ok(None)) => {}
                    Some(Err(e)) => return (seen, Err(format!("observer: {e}"))),
                    None => return (seen, Err("observer: the stream ended".into())),
                },
            }
        }
    });

    let tasks: Vec<_> = candidates
        .iter()
        .enumerate()
        .map(|(i, lock)| {
            let election = Election::new(lock.clone(), key.clone()).options(opts);
            tokio::spawn(async move {
                let value = value(i);
                let mut terms = Terms::new();
                loop {
                    if Instant::now() >= window.stop {
                        break;
                    }
                    let leadership = match election.campaign(&value).await {
                        Ok(l) => l,
                        Err(e) => return (terms, Err(format!("candidate {i}: campaign: {e}"))),
                    };
                    let began = Instant::now();
                    sleep(hold).await;
                    let lost = leadership.is_lost();
                    let term = leadership.term();
                    let end = Instant::now();
                    let resigned = leadership.resign().await;
                    terms.push((term, began, end));
                    if lost {
                        return (
                            terms,
                            Err(format!(
                                "candidate {i}: the leadership was lost during the run"
                            )),
                        );
                    }
                    if let Err(e) = resigned {
                        return (terms, Err(format!("candidate {i}: resign: {e}")));
                    }
                }
                (terms, Ok(()))
            })
        })
        .collect();
    let limit = plan.limit(clients);
    let joined = tokio::time::timeout(limit, join_all(tasks)).await;
    // Every term ended before its resign, long before this: nothing more to see.
    let _ = stop.send(());
    let (seen, watched) = match watcher.await {
        Ok(w) => w,
        Err(e) => (HashMap::new(), Err(format!("observer panicked: {e}"))),
    };
    let joined = joined.map_err(|_| format!("the candidates did not finish within {limit:?}"))?;

    let history = History::new();
    let mut errors: Vec<String> = watched.err().into_iter().collect();
    let mut per_client = Vec::with_capacity(clients);
    // (campaign returned, resign called) of every leadership, for the hand-overs.
    let mut all = Vec::new();
    let mut lag = Histogram::default();
    let mut observed = 0;
    for (i, joined) in joined.into_iter().enumerate() {
        let (terms, result) = match joined {
            Ok(r) => r,
            Err(e) => (Terms::new(), Err(format!("candidate {i} panicked: {e}"))),
        };
        if let Err(e) = result {
            errors.push(e);
        }
        let mut in_window = 0;
        for &(term, began, end) in &terms {
            history.record(Hold {
                client: i,
                key: key.clone(),
                token: term,
                mode: Mode::Exclusive,
                start: began,
                end,
                lost_at: None,
            });
            all.push((began, end));
            if !window.contains(began) {
                continue;
            }
            in_window += 1;
            // Seen before the candidate's own answer arrived: no lag, not a negative one.
            if let Some(&at) = seen.get(&(value(i), term)) {
                observed += 1;
                lag.record(at.saturating_duration_since(began));
            }
        }
        per_client.push(in_window);
    }
    drop(candidates);
    let violations = history.check(caps.fencing.is_ordered());
    if !violations.is_empty() {
        let overlaps = violations
            .iter()
            .filter(|v| matches!(v, dlock_conformance::Violation::Overlap { .. }))
            .count();
        let shown: Vec<String> = violations.iter().take(3).map(|v| v.to_string()).collect();
        return Err(LockFailure {
            error: format!(
                "{} history violation(s) ({overlaps} overlaps) in {} leaderships: {}",
                violations.len(),
                all.len(),
                shown.join("; ")
            ),
            overlaps,
        });
    }
    if !errors.is_empty() {
        return Err(format!("{} client error(s): {}", errors.len(), errors.join("; ")).into());
    }
    // Leaders follow one another on the one key, as holders do in the contended workload.
    all.sort_by_key(|&(began, _)| began);
    let mut handover = Histogram::default();
    for pair in all.windows(2) {
        let ((_, resigned), (next, _)) = (pair[0], pair[1]);
        if window.contains(next) {
            handover.record(next.saturating_duration_since(resigned));
        }
    }
    let count = per_client.iter().sum::<u64>();
    Ok(ElectionMeasure {
        count,
        per_sec: count as f64 / plan.duration.as_secs_f64(),
        handover,
        lag,
        observed,
        per_client,
        holds_checked: all.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::run::tests::plan;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn candidates_take_turns_and_the_observer_sees_them() {
        for clients in [2, 6] {
            let m = run("memory://lockbench-elections-test", clients, &plan())
                .await
                .unwrap_or_else(|f| panic!("×{clients}: {}", f.error));
            // At most one term per MIN_HOLD: about 30 in 300 ms.
            assert!(m.count > 5, "×{clients}: {} terms", m.count);
            assert!(m.count <= 31, "×{clients}: {} terms of 10 ms", m.count);
            assert_eq!(m.per_client.len(), clients);
            assert_eq!(m.per_client.iter().sum::<u64>(), m.count);
            assert!(m.holds_checked as u64 >= m.count, "×{clients}");
            assert!(m.handover.count() > 0, "×{clients}");
            // Memory wakes its observers: a 10 ms term is hardly ever missed (a loaded
            // machine may keep the observer's task from running for that long).
            assert!(
                m.observed * 10 >= m.count * 9,
                "×{clients}: the observer saw {} of {} terms",
                m.observed,
                m.count
            );
            assert_eq!(m.lag.count(), m.observed);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn two_leaders_at_once_are_a_failure_not_a_number() {
        let client = || {
            Arc::new(dlock_core::raw::LockClient::new(
                crate::run::tests::AlwaysGrants::default(),
            )) as Arc<dyn DistributedLock>
        };
        let failure = run_with((0..4).map(|_| client()).collect(), client(), &plan())
            .await
            .expect_err("four candidates leading at once must fail");
        assert!(failure.overlaps > 0, "{}", failure.error);
        assert!(failure.error.contains("overlap"), "{}", failure.error);
    }

    #[test]
    fn the_declared_observe_is_named() {
        assert_eq!(observe_label(Observe::Unsupported), "unsupported");
        assert_eq!(
            observe_label(Observe::Woken {
                recheck: Duration::from_millis(500)
            }),
            "woken (recheck 500 ms)"
        );
        assert_eq!(
            observe_label(Observe::Polled {
                every: Duration::from_secs(1)
            }),
            "polled every 1 s"
        );
    }
}
