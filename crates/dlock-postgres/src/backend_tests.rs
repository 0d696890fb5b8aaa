//! The backend's connect warnings, and which side statements are sent again.

use super::*;

/// What `connect` logs, and its error, for `url`. The hosts used are TEST-NET-1
/// addresses (RFC 5737: never routed) with a 100 ms connect timeout: the connection
/// fails quickly, after the warning.
fn connect_logging(url: &str) -> (String, LockError) {
    let config = PostgresConfig::from_url(url).unwrap();
    let (log, result) =
        dlock_conformance::testkit::warnings_of(|| PostgresBackend::connect(config));
    (
        log,
        result.expect_err("nothing answers at a TEST-NET-1 address"),
    )
}

#[test]
fn a_password_to_an_unverified_remote_server_is_warned_about_once_without_secrets() {
    let (log, err) =
        connect_logging("postgres://app-user:hunter2-pw@192.0.2.1:5433/d?connect_timeout=100ms");
    assert_eq!(err.kind(), dlock_core::ErrorKind::Unavailable, "{err}");
    assert_eq!(log.matches(" WARN ").count(), 1, "{log}");
    assert!(
        log.contains("server=192.0.2.1:5433")
            && log.contains("sslmode=\"prefer\"")
            && log.contains("not verified"),
        "{log}"
    );
    for secret in ["hunter2-pw", "app-user"] {
        assert!(!log.contains(secret), "the log shows {secret:?}: {log}");
    }

    let (log, _) = connect_logging(
        "postgres://app-user:hunter2-pw@192.0.2.1/d?connect_timeout=100ms&sslmode=require",
    );
    assert!(log.contains("sslmode=\"require\""), "{log}");
}

#[test]
fn no_warning_for_a_verified_server_or_no_password() {
    for url in [
        "postgres://app:pw@192.0.2.1/d?connect_timeout=100ms&sslmode=verify-full",
        "postgres://app@192.0.2.1/d?connect_timeout=100ms",
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

/// A count change is never sent again after an error that leaves open whether it ran (no
/// answer in time, a broken connection); a text (safe to repeat) is.
#[test]
fn a_count_change_is_resent_only_when_it_cannot_have_run() {
    let count = Statement::Simple("UPDATE …".into());
    let lost = [
        Error::NoAnswer {
            op: "acquire",
            addr: "127.0.0.1:5432".into(),
            after: std::time::Duration::from_secs(5),
        },
        Error::Sql {
            op: "acquire",
            source: sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset)),
        },
    ];
    for e in &lost {
        assert!(e.is_connection_lost(), "{e}");
        assert!(!SideQuery::Statement(&count).may_resend(e), "{e}");
        assert!(SideQuery::Text("SELECT 1", None).may_resend(e), "{e}");
    }
}
