//! The harness for the standalone ZooKeeper server (and the ensemble, for fault tests).

#![allow(dead_code, unreachable_pub)]

#[cfg(feature = "tls")]
pub mod private;
pub mod proxy;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::Harness;
use dlock_core::{BoxError, DistributedLock, ErrorKind, Result};
use dlock_zookeeper::ZookeeperConfig;
use zookeeper_client as zk;

/// The session timeout the tests use: short, so crash scenarios are quick (the servers'
/// tickTime of 500 ms allows sessions from 1 s).
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(2);

pub struct ZookeeperHarness {
    url: String,
    setup: &'static str,
    /// The private server this harness tests, with auth: over TLS with digest auth, or
    /// over its plain port with SASL.
    #[cfg(feature = "tls")]
    private: Option<(&'static private::Server, Private)>,
}

/// How a harness reaches the private server.
#[cfg(feature = "tls")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Private {
    /// `zks://` with a client certificate, digest auth.
    TlsDigest,
    /// `zk://` on the plain port, SASL `DIGEST-MD5`, base path [`private::SASL_ROOT`].
    Sasl,
}

impl ZookeeperHarness {
    /// The standalone server: `DLOCK_ZK_URL`, default `zk://127.0.0.1:2181`, with the tests'
    /// short session timeout.
    pub fn from_env() -> Self {
        Self::new(
            &dlock_conformance::env_url("DLOCK_ZK_URL", "zk://127.0.0.1:2181"),
            "zookeeper",
            SESSION_TIMEOUT,
        )
    }

    /// The ensemble: `DLOCK_ZK_ENSEMBLE_URL`, default the three members on 2182..2184, with
    /// `session_timeout`.
    pub fn ensemble_from_env(session_timeout: Duration) -> Self {
        Self::new(
            &dlock_conformance::env_url(
                "DLOCK_ZK_ENSEMBLE_URL",
                "zk://127.0.0.1:2182,127.0.0.1:2183,127.0.0.1:2184",
            ),
            "zk-ensemble",
            session_timeout,
        )
    }

    /// The private TLS server (started on first use, one per test process), as the
    /// digest user [`private::USER`], trusting its CA, with the client certificate it
    /// requires.
    #[cfg(feature = "tls")]
    pub fn tls() -> Self {
        let server = private::shared();
        let url = format!(
            "zks://{}:{}@127.0.0.1:{}?{}",
            private::USER,
            private::PASSWORD,
            server.port(),
            server.tls_query()
        );
        Self {
            private: Some((server, Private::TlsDigest)),
            ..Self::new(
                &url,
                "zookeeper (a private TLS server the test starts)",
                SESSION_TIMEOUT,
            )
        }
    }

    /// The private server's plain port (started on first use, one per test process), as
    /// the SASL `DIGEST-MD5` user [`private::USER`], under [`private::SASL_ROOT`].
    #[cfg(all(feature = "tls", feature = "sasl"))]
    pub fn sasl() -> Self {
        let server = private::shared();
        let url = format!(
            "zk://{}:{}@127.0.0.1:{}?auth=sasl&root={}",
            private::USER,
            private::PASSWORD,
            server.plain_port(),
            private::SASL_ROOT
        );
        Self {
            private: Some((server, Private::Sasl)),
            ..Self::new(
                &url,
                "zookeeper (a private server with SASL the test starts)",
                SESSION_TIMEOUT,
            )
        }
    }

    /// `base` with `session_timeout` unless it sets one.
    fn new(base: &str, setup: &'static str, session_timeout: Duration) -> Self {
        // RUST_LOG=dlock_zookeeper=debug shows the recipe at work.
        dlock_conformance::init_tracing();
        let url = if base.contains("session_timeout=") {
            base.to_owned()
        } else {
            let timeout = format!("session_timeout={}ms", session_timeout.as_millis());
            dlock_conformance::url_with_option(base, &timeout)
        };
        Self {
            url,
            setup,
            #[cfg(feature = "tls")]
            private: None,
        }
    }

    pub fn config(&self) -> ZookeeperConfig {
        ZookeeperConfig::from_url(&self.url).expect("the test URL parses")
    }

    /// A client of the test server; a server that cannot be used fails the test, naming
    /// it and the command that starts it.
    pub async fn must_client(&self) -> std::sync::Arc<dyn dlock_core::DistributedLock> {
        self.client().await.unwrap_or_else(|e| {
            panic!(
                "cannot use the zookeeper server at {}: {e}\n  start it with: scripts/backends up zookeeper",
                dlock_core::raw::url::redact(&self.url())
            )
        })
    }

    /// A raw client of the server under test, for what an operator would do by hand.
    pub async fn raw(&self) -> Result<zk::Client, BoxError> {
        #[cfg(feature = "tls")]
        match self.private {
            Some((server, Private::TlsDigest)) => return Ok(server.raw(true).await?),
            Some((server, Private::Sasl)) => {
                let user = (private::USER, private::PASSWORD);
                return Ok(server.raw_plain(Some(user)).await?);
            }
            None => {}
        }
        let hosts = self.config().hosts.join(",");
        let connect = zk::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .connect(&hosts);
        Ok(tokio::time::timeout(Duration::from_secs(10), connect).await??)
    }
}

/// The 10-digit sequence of a lock node, exclusive or shared (ours, Curator's,
/// go-zookeeper's or kazoo's).
pub fn sequence(name: &str) -> Option<&str> {
    let split = name.len().checked_sub(10)?;
    let (head, digits) = (name.get(..split)?, name.get(split..)?);
    let named = [
        "-lock-",
        "latch-",
        "__lock__",
        "__WRIT__",
        "__READ__",
        "__rlock__",
    ]
    .iter()
    .any(|tag| head.ends_with(tag));
    (digits.bytes().all(|b| b.is_ascii_digit()) && named).then_some(digits)
}

#[async_trait]
impl Harness for ZookeeperHarness {
    fn name(&self) -> &'static str {
        "zookeeper"
    }

    fn setup(&self) -> &'static str {
        self.setup
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(dlock_zookeeper::from_url(url).await?))
    }

    fn bad_urls(&self) -> Vec<(String, ErrorKind)> {
        #[cfg(feature = "tls")]
        match self.private {
            Some((server, Private::TlsDigest)) => return tls_bad_urls(server),
            Some((server, Private::Sasl)) => return sasl_bad_urls(server),
            None => {}
        }
        let mut urls: Vec<(String, ErrorKind)> = [
            "zk://",
            "zk://127.0.0.1:notaport",
            "zk://127.0.0.1:2181?bogus=1",
            "zk://127.0.0.1:2181?session_timeout=soon",
            "zk://127.0.0.1:2181?root=relative/path",
            "zk://127.0.0.1:2181?root=/a/../..",
            "zk://dlock@127.0.0.1:2181",
            "zk://:sekrit-password@127.0.0.1:2181",
            "zk://127.0.0.1:2181?ca=/etc/ca.pem",
            "zks://127.0.0.1:2181",
            "redis://127.0.0.1:2181",
            "not a url",
        ]
        .into_iter()
        .map(|u| (u.to_owned(), ErrorKind::InvalidConfig))
        .collect();
        // A server of the wrong kind (Redis) on the port: no ZooKeeper session can be made.
        let redis = dlock_conformance::env_url("DLOCK_REDIS_URL", "redis://127.0.0.1:6379");
        let redis = redis
            .trim_start_matches("redis://")
            .split('/')
            .next()
            .unwrap_or_default();
        urls.push((
            format!("zk://{redis}?connect_timeout=3s"),
            ErrorKind::Unavailable,
        ));
        urls
    }

    async fn break_lease(&self, key: &str) -> Result<(), BoxError> {
        let zk = self.raw().await?;
        let dir = self.config().key_dir(key);
        let mut children = zk.list_children(&dir).await?;
        children.retain(|c| sequence(c).is_some());
        children.sort_by(|a, b| sequence(a).cmp(&sequence(b)));
        let holder = children.first().ok_or("no lock node to break")?;
        zk.delete(&format!("{dir}/{holder}"), None).await?;
        Ok(())
    }

    /// Every child of the key directories of keys starting with `prefix`: a lock node, ours
    /// or another client's, is a hold or a queued waiter. An empty key directory is not
    /// residue: it holds nothing, and the lock leaves it on purpose to the server's
    /// container reaper (see the crate docs' Release); the test `key_directory` checks that
    /// it is a container node, which the reaper removes. A semaphore's `locks` and `leases`
    /// directories are looked into the same way: every node in them is residue, the empty
    /// directories (containers too, checked in `permits`) are not.
    async fn residue(&self, prefix: &str) -> Result<Vec<String>, BoxError> {
        let zk = self.raw().await?;
        let config = self.config();
        let segment_prefix = config.key_dir(prefix)[config.base.len() + 1..].to_owned();
        let dirs = match zk.list_children(&config.base).await {
            Ok(dirs) => dirs,
            Err(zk::Error::NoNode) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut left = Vec::new();
        for dir in dirs.into_iter().filter(|d| d.starts_with(&segment_prefix)) {
            let path = format!("{}/{dir}", config.base);
            let children = match zk.list_children(&path).await {
                Ok(children) => children,
                Err(zk::Error::NoNode) => continue,
                Err(e) => return Err(e.into()),
            };
            for child in children {
                let child = format!("{path}/{child}");
                if !(child.ends_with("/locks") || child.ends_with("/leases")) {
                    left.push(child);
                    continue;
                }
                match zk.list_children(&child).await {
                    Ok(nodes) => left.extend(nodes.into_iter().map(|n| format!("{child}/{n}"))),
                    Err(zk::Error::NoNode) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(left)
    }

    /// The session timeout: a session lease's lifetime without heartbeats.
    fn ttl(&self) -> Duration {
        self.config().session_timeout
    }
}

/// What the private TLS server with auth must refuse, and how.
#[cfg(feature = "tls")]
fn tls_bad_urls(server: &private::Server) -> Vec<(String, ErrorKind)> {
    use private::{PASSWORD, USER};
    let port = server.port();
    let (ca, cert, key, other_ca) = (
        server.file("ca.pem"),
        server.file("client.pem"),
        server.file("client.key"),
        server.file("other-ca.pem"),
    );
    let tls = server.tls_query();
    let t = "connect_timeout=3s";
    vec![
        // A wrong password: the base path /dlock belongs to the right one.
        (
            format!("zks://{USER}:wrong-password@127.0.0.1:{port}?{tls}&{t}"),
            ErrorKind::Backend,
        ),
        // No credentials: NoAuth under /dlock.
        (
            format!("zks://127.0.0.1:{port}?{tls}&{t}"),
            ErrorKind::Backend,
        ),
        // Trusting another CA.
        (
            format!(
                "zks://{USER}:{PASSWORD}@127.0.0.1:{port}?ca={other_ca}&cert={cert}&key={key}&{t}"
            ),
            ErrorKind::Backend,
        ),
        // Without the client certificate the server requires.
        (
            format!("zks://{USER}:{PASSWORD}@127.0.0.1:{port}?ca={ca}&{t}"),
            ErrorKind::Backend,
        ),
        // Plain text to the TLS port.
        (
            format!("zk://{USER}:{PASSWORD}@127.0.0.1:{port}?{t}"),
            ErrorKind::Unavailable,
        ),
        // Files that are not there or not PEM.
        (
            format!("zks://{USER}:{PASSWORD}@127.0.0.1:{port}?ca=/nonexistent/ca.pem"),
            ErrorKind::InvalidConfig,
        ),
        (
            format!(
                "zks://{USER}:{PASSWORD}@127.0.0.1:{port}?ca={}&cert={cert}&key={key}",
                server.file("zoo.cfg")
            ),
            ErrorKind::InvalidConfig,
        ),
        (
            format!("zks://{USER}:{PASSWORD}@127.0.0.1:{port}?ca={ca}&cert={cert}&key={ca}"),
            ErrorKind::InvalidConfig,
        ),
        // Refused before any I/O.
        (
            format!("zks://{USER}@127.0.0.1:{port}?{tls}"),
            ErrorKind::InvalidConfig,
        ),
        (format!("zks://127.0.0.1:{port}"), ErrorKind::InvalidConfig),
        (
            format!("zk://{USER}:{PASSWORD}@127.0.0.1:{port}?ca={ca}"),
            ErrorKind::InvalidConfig,
        ),
    ]
}

/// What the private server's SASL port must refuse, and how.
#[cfg(feature = "tls")]
fn sasl_bad_urls(server: &private::Server) -> Vec<(String, ErrorKind)> {
    use private::{PASSWORD, SASL_ROOT, USER};
    let port = server.plain_port();
    let q = format!("root={SASL_ROOT}&connect_timeout=3s");
    vec![
        // A wrong password: the server ends the SASL exchange with AuthFailed.
        (
            format!("zk://{USER}:wrong-password@127.0.0.1:{port}?auth=sasl&{q}"),
            ErrorKind::Backend,
        ),
        // A user the server does not know.
        (
            format!("zk://nobody:{PASSWORD}@127.0.0.1:{port}?auth=sasl&{q}"),
            ErrorKind::Backend,
        ),
        // Another valid user: the base path belongs to USER.
        (
            format!(
                "zk://{}:{}@127.0.0.1:{port}?auth=sasl&{q}",
                private::OTHER_USER,
                private::OTHER_PASSWORD
            ),
            ErrorKind::Backend,
        ),
        // No credentials: NoAuth under the base path.
        (format!("zk://127.0.0.1:{port}?{q}"), ErrorKind::Backend),
        // Refused before any I/O.
        (
            format!("zk://127.0.0.1:{port}?auth=sasl&{q}"),
            ErrorKind::InvalidConfig,
        ),
        (
            format!("zk://{USER}:{PASSWORD}@127.0.0.1:{port}?auth=gssapi&{q}"),
            ErrorKind::InvalidConfig,
        ),
        (
            format!("zk://a%40b:{PASSWORD}@127.0.0.1:{port}?auth=sasl&{q}"),
            ErrorKind::InvalidConfig,
        ),
    ]
}
