//! Leader elections ([`Election`]): one leader at a time, terms that grow with every new
//! leader, a published value that `leader()` and observers read, prompt hand-over on
//! resignation and after a crash, bad values refused before any I/O. On a backend that
//! declares no elections ([`Observe::Unsupported`]), each scenario checks the refusal
//! instead.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::election::MAX_VALUE_LEN;
use dlock_core::{DistributedLock, Election, ErrorKind, Leader, Observe, Wait};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::time::{Instant, sleep, timeout};

use super::{SLACK, join_panics, opts, unreachable_client, violations_report};
use crate::{Ctx, History, Hold};

/// The election on `key` of `client`, candidates waiting up to `wait`.
fn election(cx: &Ctx, client: Arc<dyn DistributedLock>, key: &str, wait: Duration) -> Election {
    Election::new(client, key).options(opts(cx).wait(Wait::For(wait)))
}

/// How long an observer may take to see a change: the backend's declared bound, plus
/// slack.
fn observe_bound(observe: Observe) -> Duration {
    SLACK
        + match observe {
            Observe::Woken { recheck } => recheck,
            Observe::Polled { every } => every,
            Observe::Unsupported => Duration::ZERO,
        }
}

/// On a backend without elections: a campaign, `leader()` and `observe()` are refused
/// with `Unsupported`, and the key is untouched; `None` then.
async fn election_or_refused(cx: Ctx) -> Option<Ctx> {
    let client = cx.client().await;
    if client.capabilities().election != Observe::Unsupported {
        return Some(cx);
    }
    let key = cx.key("refused");
    let e = election(&cx, client, &key, Duration::ZERO);
    let err = e.campaign("v").await.expect_err("no elections here");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let err = e.leader().await.expect_err("no elections here");
    assert_eq!(err.kind(), ErrorKind::Unsupported, "{err}");
    let first = e.observe().next().await.expect("one item");
    assert_eq!(
        first.expect_err("no elections").kind(),
        ErrorKind::Unsupported
    );
    cx.finish().await;
    None
}

/// Wait (up to `bound`) until `leader()` answers `expected`.
async fn leader_becomes(e: &Election, expected: Option<&Leader>, bound: Duration) {
    let started = Instant::now();
    loop {
        let now = e.leader().await.expect("leader()");
        if now.as_ref() == expected {
            return;
        }
        assert!(
            started.elapsed() < bound,
            "leader() is {now:?} after {bound:?}, expected {expected:?}"
        );
        sleep(Duration::from_millis(20)).await;
    }
}

/// The observer's next change, within `bound`.
async fn next_change(
    changes: &mut BoxStream<'static, dlock_core::Result<Option<Leader>>>,
    bound: Duration,
) -> Option<Leader> {
    let item = timeout(bound, changes.next())
        .await
        .unwrap_or_else(|_| panic!("the observer saw no change within {bound:?}"));
    item.expect("the stream goes on").expect("observe")
}

/// Elections reach the server where the backend declares them: a candidate of a dead
/// server answers `Unavailable` (and `Unsupported` where it declares none).
pub async fn election_is_declared(cx: Ctx) {
    let declared = cx.client().await.capabilities().election != Observe::Unsupported;
    if let Some(dead) = unreachable_client(&cx).await {
        let e = election(&cx, dead, &cx.key("k"), Duration::ZERO);
        let err = timeout(Duration::from_secs(30), e.campaign("v"))
            .await
            .expect("an unreachable server answers within its timeouts")
            .expect_err("nothing answers");
        let expected = match declared {
            true => ErrorKind::Unavailable,
            false => ErrorKind::Unsupported,
        };
        assert_eq!(err.kind(), expected, "{err}");
    }
    cx.finish().await;
}

/// `leader()` shows nobody, then the leader's value and term (its fencing token), a
/// proclaimed value in the same term, and nobody once it resigned.
pub async fn leader_shows_the_campaign_value_and_term(cx: Ctx) {
    let Some(cx) = election_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let mine = election(&cx, a, &key, SLACK);
    let theirs = election(&cx, b, &key, SLACK);
    assert_eq!(theirs.leader().await.expect("leader()"), None);
    // Blanks, quotes, a backslash and non-ASCII text come back as they went.
    let value = r#"alpha "α" \ 10.0.0.1:80 "#;
    let mut leading = mine.campaign(value).await.expect("campaign");
    assert_eq!(leading.value(), value);
    let term = leading.term();
    leader_becomes(&theirs, Some(&Leader::new(value, term)), SLACK).await;
    leading.proclaim("alpha: draining").await.expect("proclaim");
    assert_eq!(leading.term(), term, "a proclaim keeps the term");
    leader_becomes(&theirs, Some(&Leader::new("alpha: draining", term)), SLACK).await;
    leading.resign().await.expect("resign");
    leader_becomes(&theirs, None, SLACK).await;
    cx.finish().await;
}

/// Candidates of several clients campaign again and again: leaderships never overlap,
/// and each new leader's term is larger than every earlier one's (as far as the backend's
/// fencing promises).
pub async fn one_leader_at_a_time_and_terms_increase(cx: Ctx) {
    const CANDIDATES: usize = 3;
    const TERMS: usize = 4;
    let Some(cx) = election_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let history = History::new();
    let mut tasks = Vec::new();
    let mut ordered = false;
    for c in 0..CANDIDATES {
        let client = cx.client().await;
        ordered = client.capabilities().fencing.is_ordered();
        let e = election(&cx, client, &key, Duration::from_secs(60));
        let history = history.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..TERMS {
                let leading = e
                    .campaign(&format!("candidate-{c}-{round}"))
                    .await
                    .expect("campaign");
                let start = Instant::now();
                sleep(Duration::from_millis(30)).await;
                history.record(Hold {
                    client: c,
                    key: e.key().to_owned(),
                    token: leading.term(),
                    mode: dlock_core::Mode::Exclusive,
                    start,
                    end: Instant::now(),
                    lost_at: None,
                });
                assert!(!leading.is_lost(), "leadership lost in calm weather");
                leading.resign().await.expect("resign");
            }
        }));
    }
    join_panics(futures::future::join_all(tasks).await);
    assert_eq!(history.holds().len(), CANDIDATES * TERMS);
    let violations = history.check(ordered);
    assert!(violations.is_empty(), "{}", violations_report(&violations));
    cx.finish().await;
}

/// A waiting candidate leads promptly once the leader resigns, in a later term.
pub async fn resign_hands_over_promptly(cx: Ctx) {
    let Some(cx) = election_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let ordered = a.capabilities().fencing.is_ordered();
    let first = election(&cx, a, &key, SLACK)
        .campaign("first")
        .await
        .expect("campaign");
    let next = election(&cx, b, &key, Duration::from_secs(60));
    let waiting = tokio::spawn(async move { next.campaign("next").await });
    sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "the second candidate led beside the first"
    );
    let first_term = first.term();
    let resigned = Instant::now();
    first.resign().await.expect("resign");
    let leading = timeout(SLACK, waiting)
        .await
        .expect("the waiting candidate leads within the slack after the resignation")
        .expect("task")
        .expect("campaign");
    let took = resigned.elapsed();
    if ordered {
        assert!(
            leading.term() > first_term,
            "{} after {first_term}",
            leading.term()
        );
    }
    tracing::info!(?took, "hand-over after a resignation");
    leading.resign().await.expect("resign");
    cx.finish().await;
}

/// An observer sees the leaders one after another, each value it proclaimed, and nobody
/// leading at the end, in order, each within the backend's declared bound.
pub async fn observers_see_every_leader_in_order(cx: Ctx) {
    let Some(cx) = election_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b, watcher) = (cx.client().await, cx.client().await, cx.client().await);
    let bound = observe_bound(watcher.capabilities().election);
    let observed = election(&cx, watcher, &key, SLACK);
    let mut changes = observed.observe();
    assert_eq!(
        next_change(&mut changes, bound).await,
        None,
        "nobody leads at first"
    );
    let mut first = election(&cx, a, &key, SLACK)
        .campaign("first")
        .await
        .expect("campaign");
    let term = first.term();
    assert_eq!(
        next_change(&mut changes, bound).await,
        Some(Leader::new("first", term))
    );
    first.proclaim("first, again").await.expect("proclaim");
    assert_eq!(
        next_change(&mut changes, bound).await,
        Some(Leader::new("first, again", term))
    );
    // The next candidate waits in line, so the hand-over is one change, or two with a
    // moment of nobody leading between.
    let second = election(&cx, b, &key, Duration::from_secs(60));
    let waiting = tokio::spawn(async move { second.campaign("second").await });
    sleep(Duration::from_millis(300)).await;
    first.resign().await.expect("resign");
    let leading = timeout(SLACK, waiting)
        .await
        .expect("the second candidate leads")
        .expect("task")
        .expect("campaign");
    let mut seen = next_change(&mut changes, bound).await;
    if seen.is_none() {
        seen = next_change(&mut changes, bound).await;
    }
    assert_eq!(seen, Some(Leader::new("second", leading.term())));
    leading.resign().await.expect("resign");
    assert_eq!(
        next_change(&mut changes, bound).await,
        None,
        "nobody leads at the end"
    );
    drop(changes);
    cx.finish().await;
}

/// A candidate that gave up (its campaign dropped while it waited) leaves nothing: once the
/// leader resigns, the next candidate leads at once, and nobody leads after it.
pub async fn cancelled_campaign_leaves_nothing(cx: Ctx) {
    let Some(cx) = election_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let first = election(&cx, a, &key, SLACK)
        .campaign("first")
        .await
        .expect("campaign");
    let quitter = election(&cx, b, &key, Duration::from_secs(60));
    let gave_up = timeout(Duration::from_millis(300), quitter.campaign("quitter")).await;
    assert!(
        gave_up.is_err(),
        "the quitter should still have been waiting"
    );
    first.resign().await.expect("resign");
    let next = election(&cx, c, &key, SLACK);
    let leading = next
        .campaign("next")
        .await
        .expect("nobody who gave up holds or blocks the election");
    leader_becomes(&next, Some(&Leader::new("next", leading.term())), SLACK).await;
    leading.resign().await.expect("resign");
    leader_becomes(&next, None, SLACK).await;
    cx.finish().await;
}

/// A leader whose hold was broken is told (`lost()`), cannot proclaim (`NotHeld`), and
/// `leader()` does not show its value.
pub async fn proclaim_is_refused_after_loss(cx: Ctx) {
    let Some(cx) = election_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let mut leading = election(&cx, a, &key, SLACK)
        .campaign("doomed")
        .await
        .expect("campaign");
    cx.harness()
        .break_lease(&key)
        .await
        .expect("break the lease");
    let bound = cx.harness().ttl() + SLACK;
    timeout(bound, leading.lost())
        .await
        .unwrap_or_else(|_| panic!("lost() did not fire within {bound:?}"));
    let err = leading
        .proclaim("still here")
        .await
        .expect_err("a lost leader cannot proclaim");
    assert!(
        matches!(err.kind(), ErrorKind::NotHeld | ErrorKind::LeaseLost),
        "{err}"
    );
    assert!(
        leading.is_lost(),
        "a refused proclaim leaves the leadership lost"
    );
    let seen = election(&cx, b, &key, SLACK)
        .leader()
        .await
        .expect("leader()");
    assert!(
        seen.as_ref().is_none_or(|l| l.value != "still here"),
        "{seen:?}"
    );
    drop(leading);
    cx.finish().await;
}

/// A leader process killed with SIGKILL is replaced within the backend's crash bound, by
/// a candidate in a later term.
pub async fn crashed_leader_is_replaced_within_the_crash_bound(cx: Ctx) {
    let Some(cx) = election_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let b = cx.client().await;
    let bound = b.capabilities().crash_release_bound(cx.harness().ttl()) + SLACK;
    let ordered = b.capabilities().fencing.is_ordered();
    let mut leader = cx
        .harness()
        .spawn_leader(cx.test(), &key, "doomed", &opts(&cx))
        .await
        .unwrap_or_else(|e| panic!("{}", cx.unreachable_message(&e)));
    let next = election(&cx, b, &key, bound);
    leader_becomes(&next, Some(&Leader::new("doomed", leader.token())), SLACK).await;
    leader.kill().await;
    let killed = Instant::now();
    let leading = next
        .campaign("survivor")
        .await
        .expect("the candidate leads within the crash bound");
    assert!(killed.elapsed() <= bound, "took {:?}", killed.elapsed());
    if ordered {
        assert!(leading.term() > leader.token());
    }
    leading.resign().await.expect("resign");
    cx.finish().await;
}

/// Bad values (empty, too long, a control character), a shared campaign and a bad key
/// are refused before any I/O, even by a client of a dead server, and a bad proclaim
/// changes nothing.
pub async fn bad_election_values_are_refused_before_io(cx: Ctx) {
    let Some(cx) = election_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let long = "v".repeat(MAX_VALUE_LEN + 1);
    let bad = ["", long.as_str(), "two\nlines", "nul\0byte"];
    let mut clients = vec![cx.client().await];
    clients.extend(unreachable_client(&cx).await);
    for client in clients {
        let e = election(&cx, client.clone(), &key, Duration::ZERO);
        for value in bad {
            let err = e.campaign(value).await.expect_err("a bad value");
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{value:?}: {err}");
        }
        let shared = Election::new(client.clone(), key.clone()).options(opts(&cx).shared());
        let err = shared.campaign("v").await.expect_err("a shared campaign");
        assert!(
            matches!(
                err.kind(),
                ErrorKind::InvalidConfig | ErrorKind::Unsupported
            ),
            "{err}"
        );
        let err = Election::new(client.clone(), "")
            .leader()
            .await
            .expect_err("an empty key");
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
    }
    let a = cx.client().await;
    let mut leading = election(&cx, a, &key, SLACK)
        .campaign("fine")
        .await
        .expect("campaign");
    let err = leading.proclaim("").await.expect_err("a bad value");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert_eq!(leading.value(), "fine");
    let seen = election(&cx, cx.client().await, &key, SLACK)
        .leader()
        .await
        .expect("leader()");
    assert_eq!(seen, Some(Leader::new("fine", leading.term())));
    leading.resign().await.expect("resign");
    cx.finish().await;
}
