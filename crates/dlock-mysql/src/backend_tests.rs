//! Tests of `backend`.

use super::*;

/// What `connect` logs, and its error, for `url`. The hosts used are TEST-NET-1
/// addresses (RFC 5737: never routed) with a 100 ms connect timeout: the connection
/// fails quickly, after the warning.
fn connect_logging(url: &str) -> (String, LockError) {
    let config = MysqlConfig::from_url(url).unwrap();
    let (log, result) = dlock_conformance::testkit::warnings_of(|| MysqlBackend::connect(config));
    (
        log,
        result.expect_err("nothing answers at a TEST-NET-1 address"),
    )
}

#[test]
fn a_password_to_an_unverified_remote_server_is_warned_about_once_without_secrets() {
    let (log, err) =
        connect_logging("mysql://app-user:hunter2-pw@192.0.2.1:3307/d?connect_timeout=100ms");
    assert_eq!(err.kind(), dlock_core::ErrorKind::Unavailable, "{err}");
    assert_eq!(log.matches(" WARN ").count(), 1, "{log}");
    assert!(
        log.contains("server=192.0.2.1:3307")
            && log.contains("ssl_mode=\"preferred\"")
            && log.contains("not verified"),
        "{log}"
    );
    for secret in ["hunter2-pw", "app-user"] {
        assert!(!log.contains(secret), "the log shows {secret:?}: {log}");
    }

    let (log, _) = connect_logging(
        "mysql://app-user:hunter2-pw@192.0.2.1/d?connect_timeout=100ms&ssl-mode=required",
    );
    assert!(log.contains("ssl_mode=\"required\""), "{log}");
}

#[test]
fn sequences_are_used_on_mariadb_from_10_3_only() {
    assert!(has_sequences("10.11.14-MariaDB-0+deb12u2"));
    assert!(has_sequences("10.3.0-MariaDB"));
    assert!(has_sequences("11.4.2-MariaDB-log"));
    assert!(!has_sequences("10.2.44-MariaDB"));
    assert!(!has_sequences("8.0.36"));
}

#[test]
fn only_mariadb_from_10_5_records_a_hold_in_its_locking_statement() {
    assert!(has_returning("10.11.14-MariaDB-0+deb12u2"));
    assert!(has_returning("10.5.0-MariaDB"));
    assert!(!has_returning("10.4.34-MariaDB"));
    assert!(!has_returning("10.3.39-MariaDB-log"));
    assert!(!has_returning("8.0.36"));
    let older = Sql::new("t", Tokens::Sequence, Server::MariaDb).with_returning(false);
    assert!(!older.records_in_lock());
    let holder = crate::sql::Holder { key: "k", who: "w" };
    let tried = older.try_take("k", Mode::Exclusive, None, false, holder);
    assert!(!tried.contains("RETURNING"), "{tried}");
    assert!(tried.contains("NEXTVAL"), "{tried}");
    assert!(tried.ends_with("WHERE FOUND_ROWS() > 0"), "{tried}");
    let waited = older.wait_take("k", Mode::Exclusive, None, holder);
    assert!(waited.ends_with(" FOR UPDATE"), "{waited}");
}

#[test]
fn no_warning_for_a_verified_server_or_no_password() {
    for url in [
        "mysql://app:pw@192.0.2.1/d?connect_timeout=100ms&ssl-mode=verify_identity",
        "mysql://app@192.0.2.1/d?connect_timeout=100ms",
    ] {
        let (log, err) = connect_logging(url);
        assert_eq!(
            err.kind(),
            dlock_core::ErrorKind::Unavailable,
            "{url}: {err}"
        );
        assert!(log.is_empty(), "{url}: {log}");
    }
}
