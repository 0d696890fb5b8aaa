//! The etcd harness: clients of the server named by `DLOCK_ETCD_URL` (default the single
//! member on 127.0.0.1:2379), a raw etcd client for fault injection and residue checks.

#![allow(dead_code)] // each test binary uses a different part

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::Harness;
use dlock_core::{BoxError, DistributedLock, ErrorKind, Result};
use dlock_etcd::{EtcdConfig, EtcdLock};
use etcd_client::{Client, DeleteOptions, GetOptions, LeaseTimeToLiveOptions};

pub(crate) const DEFAULT_URL: &str = "etcd://127.0.0.1:2379";
pub(crate) const DEFAULT_CLUSTER_URL: &str =
    "etcd://127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793";

pub(crate) struct EtcdHarness {
    url: String,
    setup: &'static str,
    /// Every client this harness made, to check their leases for leaks.
    clients: Mutex<Vec<EtcdLock>>,
}

impl EtcdHarness {
    /// Wait (up to 10 s) until nothing of `key`'s is left on the server; fail naming it.
    pub(crate) async fn assert_clean(&self, key: &str) {
        use dlock_conformance::Harness as _;
        let started = tokio::time::Instant::now();
        loop {
            let left = self.residue(key).await.expect("residue");
            if left.is_empty() {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "left on the server: {left:?}"
            );
            // The poll's interval, until the bound.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The single member (`DLOCK_ETCD_URL`).
    pub(crate) fn from_env() -> Self {
        Self::new(
            dlock_conformance::env_url("DLOCK_ETCD_URL", DEFAULT_URL),
            "etcd",
        )
    }

    /// The 3-member cluster (`DLOCK_ETCD_CLUSTER_URL`).
    pub(crate) fn cluster_from_env() -> Self {
        Self::new(
            dlock_conformance::env_url("DLOCK_ETCD_CLUSTER_URL", DEFAULT_CLUSTER_URL),
            "etcd-cluster",
        )
    }

    fn new(url: String, setup: &'static str) -> Self {
        Self {
            url,
            setup,
            clients: Mutex::default(),
        }
    }

    pub(crate) fn config(&self) -> EtcdConfig {
        EtcdConfig::from_url(&self.url).expect("the harness URL parses")
    }

    /// A new client, as its concrete type.
    pub(crate) async fn lock(&self) -> EtcdLock {
        self.or_unreachable(&self.url, self.lock_at(&self.url).await)
    }

    async fn lock_at(&self, url: &str) -> Result<EtcdLock> {
        let lock = dlock_etcd::from_url(url).await?;
        self.clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(lock.clone());
        Ok(lock)
    }

    /// A plain etcd client of the server under test.
    pub(crate) async fn raw(&self) -> Client {
        let endpoints = self.config().endpoints();
        let connect = async {
            let mut client = Client::connect(&endpoints, None).await?;
            client.status().await?;
            Ok::<_, etcd_client::Error>(client)
        };
        let answer = match tokio::time::timeout(Duration::from_secs(10), connect).await {
            Ok(answer) => answer.map_err(|e| e.to_string()),
            Err(_) => Err("no answer within 10 s".to_owned()),
        };
        self.or_unreachable(&self.url, answer)
    }

    /// The etcd keys of `key`'s lock (`{lock name}/{lease}`), oldest first.
    pub(crate) async fn lock_keys(&self, key: &str) -> Vec<etcd_client::KeyValue> {
        let prefix = format!("{}/", self.config().lock_name(key));
        let options = GetOptions::new().with_prefix().with_sort(
            etcd_client::SortTarget::Create,
            etcd_client::SortOrder::Ascend,
        );
        self.raw()
            .await
            .get(prefix, Some(options))
            .await
            .expect("list lock keys")
            .kvs()
            .to_vec()
    }
}

/// A loopback server of the wrong kind (it answers like Redis and hangs up), started once.
pub(crate) fn not_etcd() -> SocketAddr {
    static ADDR: OnceLock<SocketAddr> = OnceLock::new();
    *ADDR.get_or_init(|| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let addr = listener.local_addr().expect("local addr");
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let _ = stream.write_all(b"-ERR unknown command\r\n");
            }
        });
        addr
    })
}

#[async_trait]
impl Harness for EtcdHarness {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn setup(&self) -> &'static str {
        self.setup
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(self.lock_at(url).await?))
    }

    fn bad_urls(&self) -> Vec<(String, ErrorKind)> {
        let first = self.server_addrs()[0];
        vec![
            ("etcd://".into(), ErrorKind::InvalidConfig),
            ("etcd://127.0.0.1:0".into(), ErrorKind::InvalidConfig),
            (format!("etcd://{first}/path"), ErrorKind::InvalidConfig),
            (format!("etcd://{first}?nope=1"), ErrorKind::InvalidConfig),
            (
                format!("etcd://{first}?timeout=soon"),
                ErrorKind::InvalidConfig,
            ),
            (format!("etcds://{first}"), ErrorKind::InvalidConfig),
            (
                format!("etcds://{first}?ca=/nonexistent/dlock-ca.pem"),
                ErrorKind::InvalidConfig,
            ),
            ("redis://127.0.0.1:6379".into(), ErrorKind::InvalidConfig),
            ("not a url".into(), ErrorKind::InvalidConfig),
            // Auth is off on the test servers: etcd refuses to authenticate anyone.
            (
                format!("etcd://dlock:sekrit-password@{first}"),
                ErrorKind::Backend,
            ),
            // A server of the wrong kind: it does not speak gRPC.
            (format!("etcd://{}", not_etcd()), ErrorKind::Backend),
        ]
    }

    async fn break_lease(&self, key: &str) -> Result<(), BoxError> {
        let prefix = format!("{}/", self.config().lock_name(key));
        self.raw()
            .await
            .delete(prefix, Some(DeleteOptions::new().with_prefix()))
            .await?;
        Ok(())
    }

    /// The keys under `prefix`'s lock name, and every lease a client of this harness
    /// granted that is alive on the server. Not residue: a client's idle shared lease (one
    /// per ttl) that the server confirms holds no key: it is no lock state, and it lingers
    /// one ttl for the client's next acquire, then is revoked (`tests/shared_lease.rs`
    /// checks the linger ends). An owner's hold count lives in its holding key's value, so
    /// no key of its own is left to report.
    async fn residue(&self, prefix: &str) -> Result<Vec<String>, BoxError> {
        let mut raw = self.raw().await;
        let name = self.config().lock_name(prefix);
        let keys = raw
            .get(name, Some(GetOptions::new().with_prefix().with_keys_only()))
            .await?;
        let mut left: Vec<String> = keys
            .kvs()
            .iter()
            .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
            .collect();
        let clients = self
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for client in clients {
            let idle = client.backend().idle_shared_leases();
            for id in client.backend().open_leases() {
                let options = LeaseTimeToLiveOptions::new().with_keys();
                let lease = raw.lease_time_to_live(id, Some(options)).await?;
                let (ttl, keys) = (lease.ttl(), lease.keys().len());
                if ttl > 0 && !(keys == 0 && idle.contains(&id)) {
                    left.push(format!("lease {id:x} (ttl {ttl} s, {keys} keys)"));
                }
            }
        }
        Ok(left)
    }
}
