//! `redlocks://` end to end: three private TLS `redis-server`s that require client
//! certificates, started by this test with a test CA (the shared nodes run no TLS). The
//! `ca`, `cert` and `key` options apply to every node.
//!
//! Built with rustls's `custom-provider` feature (a dev-dependency), so rustls cannot
//! choose a crypto provider by itself, as in a binary that enables two: a connect that left
//! the choice to rustls would panic here.

#[path = "../../dlock-redis/tests/tls_server/mod.rs"]
mod tls_server;

use std::time::Duration;

use dlock_core::{DistributedLock, ErrorKind, LockOptions};
use tls_server::{Certificates, ClientAuth, TlsRedis};
use tokio::time::Instant;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_over_tls_with_client_certificates() {
    let certs = Certificates::new();
    let servers: Vec<TlsRedis> = (0..3)
        .map(|_| TlsRedis::start(&certs, ClientAuth::Required))
        .collect();
    let hosts = servers
        .iter()
        .map(TlsRedis::addr)
        .collect::<Vec<_>>()
        .join(",");
    let ca = format!("ca={}", certs.file("ca.pem"));
    let identity = format!(
        "cert={}&key={}",
        certs.file("client.pem"),
        certs.file("client.key")
    );
    let url = format!("redlocks://{hosts}?{ca}&{identity}");

    let lock = dlock_redlock::from_url(&url)
        .await
        .unwrap_or_else(|e| panic!("connect over TLS to {url}: {e}"));
    let other = dlock_redlock::from_url(&url)
        .await
        .expect("a second client");
    let key = format!("test-tls-redlock-{:016x}", rand::random::<u64>());
    let opts = LockOptions::new().ttl(Duration::from_secs(10));
    let lease = lock
        .try_acquire(&key, &opts)
        .await
        .expect("try_acquire over TLS")
        .expect("free");
    assert!(lease.fencing_token() > 0);
    assert!(
        other.try_acquire(&key, &opts).await.expect("try").is_none(),
        "a second client is excluded"
    );
    lease.release().await.expect("release over TLS");
    other
        .try_acquire(&key, &opts)
        .await
        .expect("try")
        .expect("free again")
        .release()
        .await
        .expect("release");

    // Without the client certificate every node refuses: a Backend error, at once.
    let started = Instant::now();
    let err = match dlock_redlock::from_url(&format!("redlocks://{hosts}?{ca}")).await {
        Ok(_) => panic!("connected without a client certificate"),
        Err(err) => err,
    };
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("TLS failed"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2), "{err}");

    // A missing file is InvalidConfig naming it, before any node is dialled.
    let err = match dlock_redlock::from_url(&format!(
        "redlocks://{hosts}?ca={}",
        certs.file("missing.pem")
    ))
    .await
    {
        Ok(_) => panic!("connected with a missing ca file"),
        Err(err) => err,
    };
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    assert!(err.to_string().contains("cannot read the ca file"), "{err}");
    assert!(err.to_string().contains("redlock"), "{err}");
}
