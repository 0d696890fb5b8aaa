//! Tests of `sql`.

use super::*;

#[test]
fn both_modes_name_the_same_lock_in_their_own_functions() {
    let sql = Sql::new("dlock_keys", 9);
    let (write, read) = (
        Advisory::new(7, Mode::Exclusive),
        Advisory::new(7, Mode::Shared),
    );
    assert!(
        sql.try_take(&write, 1)
            .inlined()
            .contains("pg_try_advisory_lock(9, 7)")
    );
    assert!(
        sql.try_take(&read, 1)
            .inlined()
            .contains("pg_try_advisory_lock_shared(9, 7)")
    );
    assert!(
        sql.wait_take(&write, 1, 1)
            .contains("pg_advisory_lock(9, 7)")
    );
    assert!(
        sql.wait_take(&read, 1, 1)
            .contains("pg_advisory_lock_shared(9, 7)")
    );
    assert!(
        sql.release(&write)
            .inlined()
            .contains("pg_advisory_unlock(9, 7)")
    );
    assert!(
        sql.unlock(&read)
            .inlined()
            .contains("pg_advisory_unlock_shared(9, 7)")
    );
    let again = sql.try_share_again(7, 1);
    assert!(again.contains("pg_locks") && again.contains("pg_try_advisory_lock_shared(9, 7)"));
}

#[test]
fn slots_are_classes_after_the_namespace_and_wrap() {
    assert_eq!(slot_class(9, 0), 9);
    assert_eq!(slot_class(9, 3), 12);
    assert_eq!(slot_class(i32::MAX, 1), i32::MIN);
    let sql = Sql::new("dlock_keys", 9);
    let taking = sql.try_permit(7, 3, &[0, 2], 1);
    assert!(taking.contains("s.n + 1 IN (0, 2)") && taking.contains("s.n + 1 < 3"));
    assert!(!sql.try_permit(7, 3, &[], 1).contains(" IN ("));
    let freeing = sql.unlock_permit(7, 2, false);
    assert!(freeing.contains("pg_advisory_unlock(11, 7)"));
    assert!(freeing.contains("pg_notify('dlock_permits_9', '7')"));
    assert!(!freeing.contains("idle_session_timeout"));
    assert!(
        sql.unlock_permit(7, 0, true)
            .contains("idle_session_timeout")
    );
    assert_eq!(
        Sql::new("t", -1).permit_channel(),
        "dlock_permits_4294967295"
    );
}

#[test]
fn a_candidates_value_reaches_the_statement_as_hex_digits_only() {
    assert_eq!(
        text_literal("a'\\é"),
        "convert_from(decode('61275cc3a9', 'hex'), 'UTF8')"
    );
    let sql = Sql::new("dlock_keys", 9);
    let mut lock = Advisory::new(7, Mode::Exclusive);
    lock.value = Some("it's".into());
    for statement in [sql.try_take(&lock, 1).inlined(), sql.wait_take(&lock, 1, 1)] {
        assert!(!statement.contains("it's"), "{statement}");
        assert!(
            statement.contains("INSERT INTO dlock_keys_elect"),
            "{statement}"
        );
        assert!(statement.contains("pg_notify('dlock_leaders_9', '7')"));
    }
    let release = sql.release(&lock).inlined();
    assert!(
        release.contains("DELETE FROM dlock_keys_elect")
            && release.contains("pg_advisory_unlock(9, 7)")
    );
    assert!(
        !sql.release(&Advisory::new(7, Mode::Exclusive))
            .inlined()
            .contains("elect")
    );
    assert!(
        sql.unlock_all(&lock)
            .contains("DELETE FROM dlock_keys_elect")
    );
}

#[test]
fn millis_round_up_and_never_mean_forever() {
    assert_eq!(millis(Duration::ZERO), 1);
    assert_eq!(millis(Duration::from_micros(1500)), 2);
    assert_eq!(millis(Duration::from_secs(2)), 2000);
    assert_eq!(millis(Duration::from_secs(u64::MAX)), i32::MAX as u64);
}

#[test]
fn a_hold_keeps_the_servers_keepalive_from_ending_the_session_before_its_ttl() {
    // 8 s of silence would end the session (5 s idle, 3 probes 1 s apart) before a 30 s
    // lease ran out: a hold raises the keepalive idle to its ttl, rounded up.
    let sql = Sql::new("dlock_keys", 9);
    let held = sql.try_permit(7, 3, &[], 30_000);
    assert!(held.contains("set_config('idle_session_timeout', '30000', false)"));
    assert!(held.contains("set_config('tcp_keepalives_idle', '30', false)"));
    assert!(Sql::keep(12_500).contains("set_config('tcp_keepalives_idle', '13', false)"));
    // Never below the connection's own.
    assert!(Sql::keep(2_500).contains("set_config('tcp_keepalives_idle', '5', false)"));
    // Holding nothing again: back to the connection's setting.
    let default = format!("set_config('tcp_keepalives_idle', '{KEEPALIVE_IDLE_S}', false)");
    assert!(Sql::session_setup().contains(&default));
    assert!(NO_HOLD_TIMEOUTS.contains(&default));
    assert!(sql.unlock_permit(7, 0, true).contains(&default));
}

#[test]
fn a_plain_take_and_release_have_one_text_for_every_key_and_ttl() {
    let sql = Sql::new("dlock_keys", 9);
    let (a, b) = (
        Advisory::new(7, Mode::Exclusive),
        Advisory::new(8, Mode::Exclusive),
    );
    let take = sql.try_take(&a, 1500);
    assert!(matches!(take, Statement::Prepared { .. }), "{take}");
    assert_eq!(take.text(), sql.try_take(&b, 30_000).text());
    assert_eq!(sql.release(&a).text(), sql.release(&b).text());
    assert_eq!(sql.unlock(&a).text(), sql.unlock(&b).text());
    let inlined = take.inlined();
    assert!(
        inlined.contains("pg_try_advisory_lock(9, 7)")
            && inlined.contains("set_config('idle_session_timeout', '1500', false)")
            && inlined.contains("set_config('tcp_keepalives_idle', '5', false)"),
        "{inlined}"
    );
    let long = sql.try_take(&a, 30_000).inlined();
    assert!(long.contains("set_config('tcp_keepalives_idle', '30', false)"));
}
