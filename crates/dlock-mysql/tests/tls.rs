//! TLS end to end, against a private MariaDB server this test binary starts (the shared
//! servers run no TLS): a test CA made with openssl, a server certificate for `127.0.0.1`
//! only, a user that `REQUIRE`s SSL and one that requires a client certificate. See
//! `common/tls.rs`. The TLS policy itself (which options give which mode) is unit-tested in
//! `src/tls.rs`.

mod common;

use std::time::Duration;

use common::tls::{PASSWORD, TlsMariadb};
use dlock_core::{DistributedLock, ErrorKind, LockError, LockOptions, Wait};
use dlock_mysql::MysqlLock;
use tokio::time::{Instant, timeout};

fn opts() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(5))
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_nanos();
    format!("mysql-tls-{nanos:x}/{name}")
}

async fn connect(url: &str) -> MysqlLock {
    match timeout(Duration::from_secs(20), dlock_mysql::from_url(url)).await {
        Ok(Ok(lock)) => lock,
        Ok(Err(e)) => panic!("{url}: {e}"),
        Err(_) => panic!("{url}: no answer within 20 s"),
    }
}

/// Connect and take a key with `url`, which must fail: the error, checked to come quickly,
/// be of `kind`, and show no password.
async fn refused(url: &str, kind: ErrorKind) -> LockError {
    let started = Instant::now();
    let attempt = async {
        let lock = dlock_mysql::from_url(url).await?;
        lock.try_acquire(&unique("refused"), &opts())
            .await
            .map(|_| ())
    };
    let err = match timeout(Duration::from_secs(20), attempt).await {
        Ok(Ok(())) => panic!("{url}: accepted, expected {kind}"),
        Ok(Err(e)) => e,
        Err(_) => panic!("{url}: no answer within 20 s (a hang), expected {kind}"),
    };
    assert_eq!(err.kind(), kind, "{url}: {err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{url}: refused only after {:?}",
        started.elapsed()
    );
    assert!(!err.is_retryable(), "{url}: {err}");
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(
            !text.contains(PASSWORD),
            "{url}: the error shows the password: {text}"
        );
    }
    err
}

/// (a) The lock over verified TLS: acquire, try_acquire, release, a second client excluded
/// and woken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_works_over_verified_tls() {
    let server = TlsMariadb::shared();
    let url = server.verified_url();
    let (a, b) = (connect(&url).await, connect(&url).await);
    let key = unique("k");

    let lease = a
        .try_acquire(&key, &opts())
        .await
        .expect("try_acquire over TLS")
        .expect("the key is free");
    assert!(
        b.try_acquire(&key, &opts())
            .await
            .expect("try_acquire over TLS")
            .is_none(),
        "a second client is excluded"
    );
    let waiter = tokio::spawn(async move {
        let wait = opts().wait(Wait::For(Duration::from_secs(10)));
        let lease = b.acquire(&key, &wait).await.expect("acquire over TLS");
        (b, key, lease)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!waiter.is_finished(), "the waiter waits for the holder");
    let first = lease.fencing_token();
    lease.release().await.expect("release over TLS");
    let (b, key, lease) = timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter is woken by the release")
        .expect("the waiter task");
    assert!(lease.fencing_token() > first);
    lease.extend(Duration::from_secs(5)).await.expect("extend");
    lease.release().await.expect("release");
    let again = b
        .try_acquire(&key, &opts())
        .await
        .expect("try")
        .expect("free after the release");
    again.release().await.expect("release");

    // The URL options alone, without ssl-mode, mean the same verified connection.
    let bare = server.url(
        "dlock",
        "127.0.0.1",
        &format!("ssl-ca={}", server.file("ca.pem")),
    );
    let lease = connect(&bare)
        .await
        .try_acquire(&unique("bare"), &opts())
        .await
        .expect("try_acquire")
        .expect("free");
    lease.release().await.expect("release");
}

/// (b) A CA that did not sign the server's certificate: refused at once with a typed,
/// non-retryable error, never a plain-text connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_that_did_not_sign_the_server_certificate_is_refused() {
    let server = TlsMariadb::shared();
    let other = server.file("other-ca.pem");
    for query in [
        format!("ssl-ca={other}"),
        format!("ssl-mode=verify_identity&ssl-ca={other}"),
        format!("ssl-mode=verify_ca&ssl-ca={other}"),
    ] {
        let url = server.url("dlock", "127.0.0.1", &query);
        let err = refused(&url, ErrorKind::Backend).await;
        let text = err.to_string();
        assert!(
            text.contains("TLS handshake refused") && text.contains("UnknownIssuer"),
            "{query}: {text}"
        );
    }
    // The same server is reachable without a check (encryption only): the refusal above is
    // the certificate check's.
    let unchecked = server.url("dlock", "127.0.0.1", "ssl-mode=required");
    connect(&unchecked).await;
}

/// (c) `verify_identity` checks the host name: the certificate names `127.0.0.1` only, so
/// `localhost` (the same server, same CA) is refused.
///
/// `verify_ca` is meant to skip the name, but sqlx 0.8.6 misses the name-mismatch error
/// rustls ≥ 0.23.24 gives (`NotValidForNameContext`; sqlx issue #3793, transact-rs/sqlx),
/// so it checks the name too. Pinned here: the crate docs say so, and a sqlx upgrade that
/// changes it fails this test and gets the docs updated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_name_the_certificate_does_not_name_is_refused() {
    let server = TlsMariadb::shared();
    let ca = server.file("ca.pem");
    for query in [
        format!("ssl-mode=verify_identity&ssl-ca={ca}"),
        format!("ssl-ca={ca}"),
        format!("ssl-mode=verify_ca&ssl-ca={ca}"),
    ] {
        let url = server.url("dlock", "localhost", &query);
        let err = refused(&url, ErrorKind::Backend).await;
        let text = err.to_string();
        assert!(
            text.contains("TLS handshake refused")
                && text.contains("certificate not valid for name \"localhost\""),
            "{query}: {text}"
        );
    }
    // The same options with the name the certificate gives connect.
    let url = server.url(
        "dlock",
        "127.0.0.1",
        &format!("ssl-mode=verify_ca&ssl-ca={ca}"),
    );
    connect(&url).await;
}

/// (d) The user that requires TLS cannot log in over plain text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_that_requires_tls_is_refused_in_plain_text() {
    let server = TlsMariadb::shared();
    let url = server.url("dlock", "127.0.0.1", "ssl-mode=disabled");
    let err = refused(&url, ErrorKind::Backend).await;
    assert!(err.to_string().contains("Access denied"), "{err}");
}

/// `ssl-cert` and `ssl-key` present a client certificate, which a `REQUIRE X509` user
/// needs; the server is verified at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_presented() {
    let server = TlsMariadb::shared();
    let ca = server.file("ca.pem");
    let with_cert = format!(
        "ssl-ca={ca}&ssl-cert={}&ssl-key={}",
        server.file("client.pem"),
        server.file("client.key")
    );
    let lock = connect(&server.url("dlock_x509", "127.0.0.1", &with_cert)).await;
    let lease = lock
        .try_acquire(&unique("x509"), &opts())
        .await
        .expect("try_acquire with a client certificate")
        .expect("free");
    lease.release().await.expect("release");

    let without = server.url("dlock_x509", "127.0.0.1", &format!("ssl-ca={ca}"));
    let err = refused(&without, ErrorKind::Backend).await;
    assert!(err.to_string().contains("Access denied"), "{err}");
}

/// The test server itself: dropping it stops the server and removes its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_test_server_is_stopped_and_removed() {
    let server = TlsMariadb::start();
    let (dir, port) = (server.dir().to_owned(), server.port());
    connect(&server.verified_url()).await;
    drop(server);
    assert!(!dir.exists(), "{} is left behind", dir.display());
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the server still listens on {port}"
    );
}

/// A server at its limit of prepared statements (`max_prepared_stmt_count`, shared by every
/// session) still grants and releases keys: the first try of a hold, a prepared statement,
/// goes as a text batch instead. The limit is set on this binary's private server (the
/// only one its tests may reconfigure), by a user of its own with `SUPER`, and put back
/// after, even when the test fails; other tests of this binary that connect meanwhile send
/// text too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_to_prepare_still_grants_keys() {
    use futures::FutureExt;
    use sqlx::{Connection, Executor, Row};
    let server = TlsMariadb::shared();
    let url = server.verified_url();
    let ca = server.file("ca.pem");
    let admin_url = server.url(
        "dlock_admin",
        "127.0.0.1",
        &format!("ssl-mode=verify_identity&ssl-ca={ca}"),
    );
    let mut admin = sqlx::MySqlConnection::connect(&admin_url)
        .await
        .expect("an admin connection to the private server");
    let limit: u64 = admin
        .fetch_one("SELECT CAST(@@GLOBAL.max_prepared_stmt_count AS UNSIGNED)")
        .await
        .expect("read the limit")
        .get(0);
    admin
        .execute("SET GLOBAL max_prepared_stmt_count = 0")
        .await
        .expect("refuse every prepare");
    let locks = async {
        let (a, b) = (connect(&url).await, connect(&url).await);
        let key = unique("unprepared");
        // A ttl of 10 s or more: a connection keeps it between holds, so each client's
        // second try is the prepared one (its first sets the session's idle timeout in a
        // text batch).
        let opts = LockOptions::new().ttl(Duration::from_secs(30));
        for (client, other) in [(&a, &b), (&b, &a), (&a, &b)] {
            let lease = client
                .try_acquire(&key, &opts)
                .await
                .expect("try_acquire while the server refuses to prepare")
                .expect("the key is free");
            let excluded = other.try_acquire(&key, &opts).await.expect("try_acquire");
            assert!(excluded.is_none(), "a second client is excluded");
            lease.release().await.expect("release");
        }
    };
    let outcome = std::panic::AssertUnwindSafe(locks).catch_unwind().await;
    admin
        .execute(format!("SET GLOBAL max_prepared_stmt_count = {limit}").as_str())
        .await
        .expect("put the limit back");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
