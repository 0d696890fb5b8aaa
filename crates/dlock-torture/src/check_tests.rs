//! Tests of the end-of-run checks.

use super::*;
use crate::faults::Victim;
use dlock_core::{Faults, Fencing};

const S: u64 = 1_000_000_000;

fn hold(id: u64, process: u32, token: u64, start: u64, end: u64) -> HoldRec {
    HoldRec {
        id,
        process,
        key: "k".into(),
        token,
        shared: false,
        permits: None,
        set: None,
        requested: start.saturating_sub(10),
        start,
        end: Some(end),
        lost_at: None,
        lost_reason: None,
        outcome: Some("ok".into()),
    }
}

fn write(seq: u64, hold: u64, token: u64, accepted: bool) -> WriteRec {
    WriteRec {
        seq,
        key: "k".into(),
        hold,
        token,
        at: seq,
        accepted,
    }
}

fn caps(paused: FaultSafety) -> Capabilities {
    Capabilities {
        fencing: Fencing::Strict,
        faults: Faults {
            holder_paused: paused,
            ..Faults::default()
        },
        ..Capabilities::default()
    }
}

fn pause_of(process: u32, start: u64, end: u64) -> FaultRec {
    FaultRec {
        kind: FaultKind::Pause,
        victim: Some(Victim {
            slot: 0,
            process,
            held: vec!["k".into()],
        }),
        units: vec![],
        start,
        end,
        recovered: Some(end),
        first_acquire: Some(end),
        takeovers: vec![],
    }
}

fn run(holds: &[HoldRec], log: &[WriteRec], faults: &[FaultRec], caps: Capabilities) -> Analysis {
    analyse(&Input {
        holds,
        log,
        faults,
        caps,
        grace: 2 * S,
        run_end: 100 * S,
        t0: 0,
    })
}

#[test]
fn a_calm_history_passes() {
    let holds = [hold(1, 1, 1, S, 2 * S), hold(2, 2, 2, 3 * S, 4 * S)];
    let log = [write(0, 1, 1, true), write(1, 2, 2, true)];
    let a = run(&holds, &log, &[], caps(FaultSafety::Fenced));
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    assert_eq!(a.holds, 2);
}

fn read(id: u64, process: u32, token: u64, start: u64, end: u64) -> HoldRec {
    HoldRec {
        shared: true,
        ..hold(id, process, token, start, end)
    }
}

#[test]
fn readers_overlap_each_other_but_not_a_writer() {
    let readers = [read(1, 1, 1, S, 3 * S), read(2, 2, 2, 2 * S, 4 * S)];
    let a = run(&readers, &[], &[], caps(FaultSafety::Fenced));
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    let writer_among = [read(1, 1, 1, S, 3 * S), hold(2, 2, 2, 2 * S, 4 * S)];
    let a = run(&writer_among, &[], &[], caps(FaultSafety::Fenced));
    assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
    assert_eq!(a.violations[0].what, "overlap");
}

#[test]
fn a_writer_token_tops_earlier_readers_and_a_reader_token_earlier_writers() {
    let ok = [
        hold(1, 1, 5, S, 2 * S),
        read(2, 2, 6, 3 * S, 4 * S),
        read(3, 1, 6, 3 * S, 4 * S),
    ];
    assert!(
        run(&ok, &[], &[], caps(FaultSafety::Fenced))
            .violations
            .is_empty()
    );
    let writer_low = [read(1, 1, 7, S, 2 * S), hold(2, 2, 6, 3 * S, 4 * S)];
    let a = run(&writer_low, &[], &[], caps(FaultSafety::Fenced));
    assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
    assert_eq!(a.violations[0].what, "token regression");
    let reader_low = [hold(1, 1, 7, S, 2 * S), read(2, 2, 7, 3 * S, 4 * S)];
    let a = run(&reader_low, &[], &[], caps(FaultSafety::Fenced));
    assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
}

#[test]
fn an_overlap_in_calm_weather_is_a_violation_even_if_fenced() {
    let holds = [hold(1, 1, 1, S, 3 * S), hold(2, 2, 2, 2 * S, 4 * S)];
    let log = [write(0, 1, 1, true), write(1, 2, 2, true)];
    let a = run(&holds, &log, &[], caps(FaultSafety::Fenced));
    assert_eq!(a.violations.len(), 1, "{:?}", a.violations);
    assert_eq!(a.violations[0].what, "overlap");
    assert!(a.violations[0].detail.contains("calm weather"));
}

#[test]
fn a_paused_holder_overlap_is_allowed_when_fenced_and_declared() {
    // Process 1 is paused 1..5 s while holding; process 2 takes the key at 4 s.
    let mut paused = hold(1, 1, 1, S, 6 * S);
    paused.lost_at = Some(5 * S + 1);
    let holds = [paused, hold(2, 2, 2, 4 * S, 4 * S + S / 2)];
    let log = [
        write(0, 1, 1, true),
        write(1, 2, 2, true),
        write(2, 1, 1, false),
    ];
    let faults = [pause_of(1, S, 5 * S)];
    let a = run(&holds, &log, &faults, caps(FaultSafety::Fenced));
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    assert_eq!(a.fenced_overlaps.get(&FaultKind::Pause), Some(&1));
    assert_eq!(a.expected_rejections, 1);

    // Declared exclusive: the same history is a violation.
    let a = run(&holds, &log, &faults, caps(FaultSafety::Exclusive));
    assert!(
        a.violations.iter().any(|v| v.what == "overlap"),
        "{:?}",
        a.violations
    );
    // The store interleaving the two: a violation even when fenced is declared.
    let log = [write(0, 2, 2, true), write(1, 1, 2, true)];
    let mut same = holds.clone();
    same[0].token = 2;
    let a = run(&same, &log, &faults, caps(FaultSafety::Fenced));
    assert!(
        a.violations.iter().any(|v| v.what == "unfenced overlap"),
        "{:?}",
        a.violations
    );
}

#[test]
fn a_grant_noted_after_the_pause_is_the_later_hold_and_is_excused_when_fenced() {
    // Process 1 was granted token 1 just before its pause (1..5 s) and noted it at 5 s,
    // while process 2 (token 2, taken at 4 s) still held the key.
    let mut noted_late = hold(1, 1, 1, 5 * S, 6 * S);
    noted_late.requested = S - 10;
    noted_late.lost_at = Some(5 * S + 5);
    let holds = [hold(2, 2, 2, 4 * S, 7 * S), noted_late];
    let log = [write(0, 2, 2, true), write(1, 1, 1, false)];
    let faults = [pause_of(1, S, 5 * S)];
    let a = run(&holds, &log, &faults, caps(FaultSafety::Fenced));
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    assert_eq!(a.fenced_overlaps.get(&FaultKind::Pause), Some(&1));
}

#[test]
fn a_pause_of_another_process_excuses_nothing() {
    let holds = [hold(1, 1, 1, S, 3 * S), hold(2, 2, 2, 2 * S, 4 * S)];
    let faults = [pause_of(3, S, 5 * S)];
    let a = run(&holds, &[], &faults, caps(FaultSafety::Fenced));
    assert!(
        a.violations.iter().any(|v| v.what == "overlap"),
        "{:?}",
        a.violations
    );
}

#[test]
fn tokens_must_grow_across_surely_ordered_holds() {
    // Hold 2 was requested after hold 1 started, yet got a lower token.
    let mut h2 = hold(2, 2, 1, 3 * S, 4 * S);
    h2.requested = 2 * S;
    let holds = [hold(1, 1, 5, S, 2 * S), h2.clone()];
    let a = run(&holds, &[], &[], caps(FaultSafety::Fenced));
    assert!(
        a.violations.iter().any(|v| v.what == "token regression"),
        "{:?}",
        a.violations
    );
    // Requested before hold 1 started: the order of the two grants is unknown.
    h2.requested = S / 2;
    let a = run(
        &[hold(1, 1, 5, S, 2 * S), h2],
        &[],
        &[],
        caps(FaultSafety::Fenced),
    );
    assert!(a.violations.is_empty(), "{:?}", a.violations);
}

#[test]
fn the_store_log_is_checked() {
    let holds = [hold(1, 1, 1, S, 2 * S), hold(2, 2, 2, 3 * S, 4 * S)];
    let backwards = [write(0, 2, 2, true), write(1, 1, 1, true)];
    let a = run(&holds, &backwards, &[], caps(FaultSafety::Fenced));
    assert!(
        a.violations
            .iter()
            .any(|v| v.what == "store went backwards"),
        "{:?}",
        a.violations
    );
    let shared = [write(0, 1, 2, true), write(1, 2, 2, true)];
    let a = run(&holds, &shared, &[], caps(FaultSafety::Fenced));
    assert!(
        a.violations.iter().any(|v| v.what == "shared token"),
        "{:?}",
        a.violations
    );
    let rejected = [write(0, 2, 2, true), write(1, 1, 1, false)];
    let a = run(&holds, &rejected, &[], caps(FaultSafety::Fenced));
    assert!(
        a.violations
            .iter()
            .any(|v| v.what == "unexpected rejection"),
        "{:?}",
        a.violations
    );
}

#[test]
fn a_hold_told_it_was_lost_before_the_next_acquire_is_fine() {
    let mut first = hold(1, 1, 1, S, 5 * S);
    first.lost_at = Some(2 * S);
    let holds = [first, hold(2, 2, 2, 3 * S, 4 * S)];
    let a = run(&holds, &[], &[], caps(FaultSafety::Exclusive));
    assert!(a.violations.is_empty(), "{:?}", a.violations);
}

fn permit(id: u64, process: u32, of: u32, start: u64, end: u64) -> HoldRec {
    HoldRec {
        permits: Some(of),
        ..hold(id, process, id, start, end)
    }
}

#[test]
fn permit_holds_share_the_key_up_to_their_limit() {
    let two = [permit(1, 1, 2, S, 3 * S), permit(2, 2, 2, 2 * S, 4 * S)];
    let a = run(&two, &[], &[], caps(FaultSafety::Fenced));
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    assert_eq!(a.most_permit_holders["k"], 2);
}

#[test]
fn a_permit_hold_beyond_the_limit_in_calm_weather_is_a_violation() {
    let three = [
        permit(1, 1, 2, S, 4 * S),
        permit(2, 2, 2, 2 * S, 4 * S),
        permit(3, 3, 2, 3 * S, 4 * S),
    ];
    let a = run(&three, &[], &[], caps(FaultSafety::Fenced));
    let whats: Vec<&str> = a.violations.iter().map(|v| v.what).collect();
    assert_eq!(whats, ["over limit"], "{:?}", a.violations);
    assert!(a.violations[0].detail.contains("calm weather"));
    assert_eq!(a.most_permit_holders["k"], 3);
}

#[test]
fn a_paused_permit_holder_beyond_the_limit_is_excused_only_where_declared() {
    // Process 1 is paused 1..5 s while holding one of two permits; process 3 comes in at
    // 4 s beside process 2.
    let mut paused = permit(1, 1, 2, S, 6 * S);
    paused.lost_at = Some(5 * S + 1);
    let holds = [
        paused,
        permit(2, 2, 2, 2 * S, 5 * S),
        permit(3, 3, 2, 4 * S, 5 * S),
    ];
    let pause = [pause_of(1, S, 5 * S)];
    let a = run(&holds, &[], &pause, caps(FaultSafety::Fenced));
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    assert_eq!(a.stale_holders[&FaultKind::Pause].len(), 1);
    assert_eq!(
        a.most_permit_holders["k"], 2,
        "the stale holder is not counted"
    );
    let a = run(&holds, &[], &pause, caps(FaultSafety::Exclusive));
    let whats: Vec<&str> = a.violations.iter().map(|v| v.what).collect();
    assert_eq!(whats, ["over limit"], "{:?}", a.violations);
}
