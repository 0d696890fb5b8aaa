//! `rediss+sentinel://` and `rediss+cluster://` end to end, against private TLS servers this
//! test starts with a test CA (the shared Sentinel and Cluster servers run no TLS): a TLS
//! master watched by a TLS sentinel, and a one-node TLS cluster. Locking, a waiter woken
//! over the TLS subscriber connection, and an untrusted CA refused.

#![cfg(feature = "tls")]

mod common;
mod tls_server;

use std::time::Duration;

use dlock_core::{DistributedLock, ErrorKind, LockOptions};
use tls_server::{Certificates, ClientAuth, TlsRedis};
use tokio::time::Instant;

fn key(name: &str) -> String {
    format!("test-tls-topology-{name}-{:016x}", rand::random::<u64>())
}

/// Take a key, have a second client wait for it, release: the waiter gets it promptly.
async fn lock_and_hand_over(url: &str) {
    let holder = dlock_redis::from_url(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let waiter = dlock_redis::from_url(url)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"));
    let key = key("handover");
    let (lease, waiting) = common::take_with_a_waiter(&holder, waiter, &key).await;
    // Let the waiter queue and subscribe.
    let started = Instant::now();
    loop {
        let status = holder.inspect(&key).await.expect("inspect");
        if status.waiters.as_ref().is_some_and(|w| !w.is_empty()) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the waiter never queued"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let next = common::hand_over(lease, waiting).await;
    next.release().await.expect("release");
}

#[tokio::test]
async fn sentinel_over_tls() {
    let certs = Certificates::new();
    let master = TlsRedis::start(&certs, ClientAuth::Optional);
    let sentinel = TlsRedis::start_sentinel(&certs, "tlsmaster", master.port);
    let ca = certs.file("ca.pem");
    let url = format!("rediss+sentinel://{}/tlsmaster?ca={ca}", sentinel.addr());
    lock_and_hand_over(&url).await;

    // A CA the client does not trust: refused, quickly, as TLS.
    let other = certs.file("other-ca.pem");
    let url = format!(
        "rediss+sentinel://{}/tlsmaster?ca={other}&connect_timeout=5s",
        sentinel.addr()
    );
    let started = Instant::now();
    let err = dlock_redis::from_url(&url)
        .await
        .expect_err("an untrusted sentinel is refused");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    assert!(err.to_string().contains("TLS failed"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2), "{err}");
}

#[tokio::test]
async fn cluster_over_tls() {
    let certs = Certificates::new();
    let node = TlsRedis::start_cluster_node(&certs);
    let ca = certs.file("ca.pem");
    // Give the one node every slot, with a plain TLS client of its own.
    let tls = redis::TlsCertificates {
        client_tls: None,
        root_cert: Some(std::fs::read(&ca).expect("read the CA")),
    };
    dlock_core::raw::install_crypto_provider();
    let admin = redis::Client::build_with_tls(format!("rediss://{}", node.addr()), tls)
        .expect("a TLS client of the node");
    let mut conn = admin
        .get_multiplexed_async_connection()
        .await
        .expect("connect to the node");
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query_async(&mut conn)
        .await
        .expect("CLUSTER ADDSLOTSRANGE");
    let started = Instant::now();
    loop {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query_async(&mut conn)
            .await
            .expect("CLUSTER INFO");
        if info.contains("cluster_state:ok") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the one-node cluster never became ok: {info}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let url = format!("rediss+cluster://{}?ca={ca}", node.addr());
    lock_and_hand_over(&url).await;
    let lock = dlock_redis::from_url(&url).await.expect("connect");
    let key = key("braces}");
    let lease = lock
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("try_acquire")
        .expect("free");
    lease.release().await.expect("release");
}
