//! `rediss://` end to end, against private TLS `redis-server`s this test starts with a test
//! CA (the shared servers run no TLS): locking over TLS, a server the client does not
//! trust, and client certificates.
//!
//! This binary is built with rustls's `custom-provider` feature (a dev-dependency), so
//! rustls cannot choose a crypto provider from its crate features, as in a binary that
//! enables two providers: every connect here would panic if this crate left the choice to
//! rustls. Nothing here installs a provider.

#![cfg(feature = "tls")]

mod tls_server;

use std::time::Duration;

use dlock_core::{DistributedLock, ErrorKind, LockError, LockOptions, Wait};
use tls_server::{Certificates, ClientAuth, TlsRedis};
use tokio::time::Instant;

/// How long a refusal may take: far below the connect timeout the URLs set (5 s), so a
/// refusal that hangs until the timeout fails the test.
const QUICK: Duration = Duration::from_secs(2);

fn key(name: &str) -> String {
    format!("test-tls-{name}-{:016x}", rand::random::<u64>())
}

fn url(server: &TlsRedis, options: &str) -> String {
    format!("rediss://{}?connect_timeout=5s&{options}", server.addr())
}

/// Connect to `url` and expect a TLS refusal: a `Backend` error saying TLS failed, quickly.
async fn refused(url: &str) -> LockError {
    let started = Instant::now();
    let result = dlock_redis::from_url(url).await;
    let elapsed = started.elapsed();
    let err = match result {
        Ok(_) => panic!("{url}: connected, but should have been refused"),
        Err(err) => err,
    };
    assert_eq!(err.kind(), ErrorKind::Backend, "{url}: {err}");
    assert!(err.to_string().contains("TLS failed"), "{url}: {err}");
    assert!(
        elapsed < QUICK,
        "{url}: refused only after {elapsed:?}: {err}"
    );
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_over_tls_with_a_private_ca() {
    let certs = Certificates::new();
    let server = TlsRedis::start(&certs, ClientAuth::Optional);
    let url = url(&server, &format!("ca={}", certs.file("ca.pem")));
    let key = key("lock");
    let opts = LockOptions::new().ttl(Duration::from_secs(10));

    let a = dlock_redis::from_url(&url)
        .await
        .unwrap_or_else(|e| panic!("connect over TLS to {url}: {e}"));
    let b = dlock_redis::from_url(&url).await.expect("a second client");
    let lease = a
        .try_acquire(&key, &opts)
        .await
        .expect("try_acquire over TLS")
        .expect("the key is free");
    assert!(
        b.try_acquire(&key, &opts)
            .await
            .expect("try_acquire")
            .is_none(),
        "a second client is excluded"
    );

    // A waiter's release notice comes over its own TLS (pub/sub) connection.
    let waiter = tokio::spawn({
        let key = key.clone();
        let opts = opts.wait(Wait::For(Duration::from_secs(5)));
        async move {
            let lease = b.acquire(&key, &opts).await.expect("the waiter acquires");
            (Instant::now(), lease)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released = Instant::now();
    lease.release().await.expect("release over TLS");
    let (acquired, lease) = waiter.await.expect("waiter task");
    assert!(
        acquired.duration_since(released) < Duration::from_secs(1),
        "the waiter was woken by the release, not by the ttl"
    );
    lease.release().await.expect("the waiter releases");
    assert!(
        a.try_acquire(&key, &opts)
            .await
            .expect("try_acquire")
            .expect("free again")
            .release()
            .await
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_the_client_does_not_trust_is_refused_quickly() {
    let certs = Certificates::new();
    let server = TlsRedis::start(&certs, ClientAuth::Optional);
    // The server's certificate is signed by ca.pem; the client trusts only other-ca.pem.
    let err = refused(&url(&server, &format!("ca={}", certs.file("other-ca.pem")))).await;
    let chain = format!("{err:?}");
    assert!(
        chain.contains("UnknownIssuer") || chain.contains("certificate"),
        "the error says why: {chain}"
    );
    // Without `ca` the client trusts the system's roots, which do not include the test CA.
    refused(&url(&server, "")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_requires_client_certificates() {
    let certs = Certificates::new();
    let server = TlsRedis::start(&certs, ClientAuth::Required);
    let ca = format!("ca={}", certs.file("ca.pem"));

    // No client certificate: the server refuses the handshake.
    refused(&url(&server, &ca)).await;
    // A client certificate signed by a CA the server does not trust: refused too.
    refused(&url(
        &server,
        &format!(
            "{ca}&cert={}&key={}",
            certs.file("other-client.pem"),
            certs.file("other-client.key")
        ),
    ))
    .await;

    // The test CA's client certificate: accepted.
    let url = url(
        &server,
        &format!(
            "{ca}&cert={}&key={}",
            certs.file("client.pem"),
            certs.file("client.key")
        ),
    );
    let lock = dlock_redis::from_url(&url)
        .await
        .unwrap_or_else(|e| panic!("connect with a client certificate to {url}: {e}"));
    let key = key("mtls");
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let lease = lock
        .try_acquire(&key, &opts)
        .await
        .expect("try_acquire with a client certificate")
        .expect("free");
    let other = dlock_redis::from_url(&url).await.expect("a second client");
    assert!(other.try_acquire(&key, &opts).await.expect("try").is_none());
    lease.release().await.expect("release");
}

#[tokio::test]
async fn tls_files_are_checked_before_any_network_io() {
    let certs = Certificates::new();
    // Nothing listens on port 1: only an error found before connecting can be
    // InvalidConfig.
    let missing = certs.file("missing.pem");
    let cases = [
        (format!("ca={missing}"), "cannot read the ca file"),
        (
            format!("cert={}&key={missing}", certs.file("client.pem")),
            "cannot read the key file",
        ),
        (
            format!(
                "cert={}&key={}",
                certs.file("ca.key"),
                certs.file("client.key")
            ),
            "holds no PEM certificate",
        ),
        (
            format!(
                "cert={}&key={}",
                certs.file("client.pem"),
                certs.file("ca.key")
            ),
            "is not the key of the certificate",
        ),
    ];
    for (options, needle) in cases {
        let url = format!("rediss://127.0.0.1:1?{options}");
        let err = match dlock_redis::from_url(&url).await {
            Ok(_) => panic!("{url}: connected"),
            Err(err) => err,
        };
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
        let text = format!("{err} {err:?}");
        assert!(text.contains(needle), "{url}: {text}");
        for file in ["client.pem", "client.key", "ca.key"] {
            let contents = std::fs::read_to_string(certs.dir().join(file)).expect(file);
            for line in contents.lines().filter(|l| !l.starts_with("-----")) {
                assert!(!text.contains(line), "never the files' contents: {text}");
            }
        }
    }
}
