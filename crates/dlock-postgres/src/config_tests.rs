//! Table-driven URL tests of [`PostgresConfig`].

use super::*;
use dlock_core::ErrorKind;

type Check = fn(&PostgresConfig) -> bool;

#[test]
fn good_urls() {
    let cases: &[(&str, Check)] = &[
        ("postgres://dlock:dlock@127.0.0.1:5432/dlock", |c| {
            c.host == "127.0.0.1"
                && c.port == 5432
                && c.user == "dlock"
                && c.password.as_ref().map(Secret::expose) == Some("dlock")
                && c.database == "dlock"
                && c.table == "dlock_keys"
                && c.namespace == PostgresConfig::DEFAULT_NAMESPACE
                && c.connect_timeout == Duration::from_secs(5)
                && c.max_connections == 100
                && c.application_name.is_none()
                && c.ssl_mode().ok() == Some(SslMode::Prefer)
        }),
        ("postgresql://u@db.example/app", |c| {
            c.port == 5432 && c.password.is_none()
        }),
        ("postgres://u:p%40ss@h/d%2Dx", |c| {
            c.password.as_ref().map(Secret::expose) == Some("p@ss") && c.database == "d-x"
        }),
        ("postgres://u@[::1]:5433/d", |c| {
            c.host == "::1" && c.port == 5433 && c.addr() == "[::1]:5433"
        }),
        ("postgres://u@h/d?table=my_locks2&namespace=-7", |c| {
            c.table == "my_locks2"
                && c.fence_sequence() == "my_locks2_fence"
                && c.id_sequence() == "my_locks2_id"
                && c.namespace == -7
        }),
        (
            "postgres://u@h/d?connect_timeout=250ms&response_timeout=2s&max_connections=7",
            |c| {
                c.connect_timeout == Duration::from_millis(250)
                    && c.response_timeout == Duration::from_secs(2)
                    && c.max_connections == 7
            },
        ),
        ("postgres://u@h/d?application_name=billing%20worker", |c| {
            c.application_name.as_deref() == Some("billing worker")
                && c.application_name() == "billing worker"
        }),
        ("postgres://u@h/d?sslmode=require", |c| {
            c.ssl_mode().ok() == Some(SslMode::Require)
        }),
        ("postgres://u@h/d?sslmode=disable", |c| {
            c.ssl_mode().ok() == Some(SslMode::Disable)
        }),
        ("postgres://u@h/d?sslrootcert=/etc/ca.pem", |c| {
            c.ssl_mode().ok() == Some(SslMode::VerifyFull)
        }),
        (
            "postgres://u@h/d?ssl-mode=VERIFY-CA&ssl-root-cert=/ca.pem",
            |c| c.ssl_mode().ok() == Some(SslMode::VerifyCa),
        ),
        (
            "postgres://u@h/d?sslcert=/c&sslkey=/k&sslmode=require",
            |c| c.ssl_mode().ok() == Some(SslMode::Require),
        ),
    ];
    for (url, check) in cases {
        let config = PostgresConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
        assert!(check(&config), "{url}: {config:?}");
        config.validate().unwrap();
        config.connect_options().unwrap();
    }
}

#[test]
fn bad_urls_name_the_problem() {
    let cases = [
        ("not a url", "not a URL"),
        ("mysql://u@h/d", "scheme"),
        ("postgres:///d", "host"),
        ("postgres://u:sekrit/x@h/d", "percent-encode"),
        ("postgres://h/d", "user"),
        ("postgres://u@h", "database"),
        ("postgres://u@h/", "database"),
        ("postgres://u@h/a/b", "database"),
        ("postgres://u@h/d#frag", "fragment"),
        ("postgres://u@h:99999/d", "port"),
        ("postgres://u@h1,h2/d", "several hosts"),
        ("postgres://u@h/d?colour=blue", "colour"),
        ("postgres://u@h/d?table=", "table"),
        ("postgres://u@h/d?table=Locks", "table"),
        ("postgres://u@h/d?table=a-b", "table"),
        ("postgres://u@h/d?table=x%22;DROP", "table"),
        ("postgres://u@h/d?namespace=1e3", "namespace"),
        ("postgres://u@h/d?namespace=4294967295", "namespace"),
        ("postgres://u@h/d?connect_timeout=soon", "connect_timeout"),
        ("postgres://u@h/d?connect_timeout=5", "connect_timeout"),
        ("postgres://u@h/d?response_timeout=2h", "response_timeout"),
        ("postgres://u@h/d?max_connections=0", "max_connections"),
        (
            "postgres://u@h/d?application_name=a%0Ab",
            "application_name",
        ),
        ("postgres://u@h/d?sslmode=sometimes", "sslmode"),
        ("postgres://u@h/d?sslrootcert=", "sslrootcert"),
        (
            "postgres://u@h/d?sslmode=prefer&sslrootcert=/ca",
            "plain text",
        ),
        (
            "postgres://u@h/d?sslmode=require&sslrootcert=/ca",
            "ignored",
        ),
        ("postgres://u@h/d?sslmode=verify-ca", "without sslrootcert"),
        ("postgres://u@h/d?sslcert=/c", "go together"),
    ];
    for (url, names) in cases {
        let err = PostgresConfig::from_url(url).expect_err(url);
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
        assert!(err.to_string().contains(names), "{url}: {err}");
    }
    let long = format!("postgres://u@h/d?table={}", "t".repeat(58));
    assert!(PostgresConfig::from_url(&long).is_err());
    let longest = format!("postgres://u@h/d?table={}", "t".repeat(57));
    PostgresConfig::from_url(&longest).unwrap();
}

#[test]
fn a_password_to_a_remote_unverified_server_is_flagged() {
    let exposed = |url: &str| PostgresConfig::from_url(url).unwrap().login_exposed();
    assert!(exposed("postgres://u:p@db.example/d"));
    assert!(exposed("postgres://u:p@db.example/d?sslmode=require"));
    assert!(!exposed("postgres://u:p@db.example/d?sslrootcert=/ca"));
    assert!(!exposed("postgres://u@db.example/d"));
    assert!(!exposed("postgres://u:p@127.0.0.1/d"));
    assert!(!exposed("postgres://u:p@[::1]/d"));
}

#[test]
fn unreadable_tls_files_are_config_errors() {
    let config =
        PostgresConfig::from_url("postgres://u:p@h/d?sslrootcert=/nonexistent/ca.pem").unwrap();
    let err = config.check_tls_files().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(
        err.to_string().contains("sslrootcert: cannot read"),
        "{err}"
    );
}

#[test]
fn password_never_shows() {
    let err = PostgresConfig::from_url("postgres://dlock:hunter2-secret@h/d?colour=x").unwrap_err();
    assert!(!format!("{err} {err:?}").contains("hunter2"));
    let config = PostgresConfig::from_url("postgres://dlock:hunter2-secret@h/d").unwrap();
    let shown = format!("{config:?}");
    assert!(
        !shown.contains("hunter2") && shown.contains("<redacted>"),
        "{shown}"
    );
}

#[test]
fn validate_checks_fields_set_directly() {
    let mut config = PostgresConfig::new("h", "u", "d");
    config.validate().unwrap();
    config.table = "bad name".into();
    assert_eq!(
        config.validate().unwrap_err().kind(),
        ErrorKind::InvalidConfig
    );
}

#[test]
fn the_shared_url_table_passes() {
    dlock_conformance::urls::check_parser(
        |password, host| format!("postgres://app:{password}@{host}:5432/dlock?table=t"),
        |url| PostgresConfig::from_url(url).map(|c| format!("{c:?}")),
    );
}

#[test]
fn sessions_are_named_for_their_holder_by_default() {
    let config = PostgresConfig::from_url("postgres://u@h/d").unwrap();
    let name = config.application_name();
    assert!(name.len() <= MAX_APPLICATION_NAME, "{name}");
    assert!(
        name.ends_with(&format!(":{}", std::process::id())),
        "{name}"
    );
    let options = config.connect_options().unwrap();
    assert_eq!(options.get_application_name(), Some(name.as_str()));
}

#[test]
fn long_descriptions_keep_their_pid() {
    let short = "app@host:42";
    assert_eq!(fit_application_name(short), short);
    let long = format!("{}@{}:4194304", "n".repeat(40), "h".repeat(40));
    let fit = fit_application_name(&long);
    assert_eq!(fit.len(), MAX_APPLICATION_NAME);
    assert!(
        fit.starts_with(&"n".repeat(40)) && fit.ends_with("h:4194304"),
        "{fit}"
    );
    let wide = format!("{}@{}:7", "n".repeat(40), "é".repeat(40));
    let fit = fit_application_name(&wide);
    assert!(
        fit.len() <= MAX_APPLICATION_NAME && fit.ends_with(":7"),
        "{fit}"
    );
}
