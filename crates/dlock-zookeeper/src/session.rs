//! The session: one ZooKeeper session per backend, shared by every lock taken through it,
//! replaced when it ends. Every lock node is ephemeral, so the session is what keeps each
//! lease alive; here too is how long a lease survives a disconnection.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use dlock_core::raw::Deadline;
use dlock_core::{LockError, Result};
use zookeeper_client::{self as zk, Acl, Acls, AuthId, Permission, SessionState};

use crate::NAME;
use crate::config::ZookeeperConfig;
use crate::error::Error;

/// One ZooKeeper session and the lock recipe on top of it.
///
/// All locks of one backend share its session. When the session expires, the leases it
/// carried are lost and the next acquire opens a new session.
#[derive(Debug)]
pub struct ZookeeperBackend {
    pub(crate) config: ZookeeperConfig,
    /// The ACL of every node the lock creates: see [`node_acl`].
    acl: Arc<[Acl]>,
    session: tokio::sync::Mutex<zk::Client>,
    session_id: AtomicI64,
    session_timeout_ms: AtomicU64,
    pub(crate) wakeups: AtomicU64,
    /// The node each key's reentrant hold was last granted on, per owner.
    pub(crate) hints: Arc<crate::reentry::Hints>,
}

impl ZookeeperBackend {
    /// Open a session to the ensemble `config` names, within its connect timeout: over TLS
    /// if configured, then authenticated if configured.
    ///
    /// With [digest](ZookeeperConfig::digest) or [SASL](ZookeeperConfig::sasl) credentials,
    /// the session must also be allowed
    /// to read the base path's ACL when that path exists: a
    /// [`LockError::Backend`](dlock_core::LockError::Backend) otherwise (a wrong password,
    /// or a base path that belongs to another identity). A base path that anyone may write
    /// to is logged as a warning: the ACLs of the lock nodes do not protect much then (see
    /// [Security](crate#security)).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`](dlock_core::LockError::InvalidConfig) for settings that
    /// do not fit together or TLS files that cannot be read;
    /// [`LockError::Unavailable`](dlock_core::LockError::Unavailable) when no member answers
    /// in time; [`LockError::Backend`](dlock_core::LockError::Backend) when the server refuses
    /// the session or the credentials.
    pub async fn connect(config: ZookeeperConfig) -> Result<Self> {
        config.validate()?;
        let client = open_session(&config).await?;
        if config.digest.is_some() || config.sasl.is_some() {
            let deadline = Deadline::At(tokio::time::Instant::now() + config.connect_timeout);
            tokio::try_join!(
                crate::auth::check_sasl_login(&client, &config, deadline),
                check_base_access(&client, &config, deadline),
            )?;
        }
        let backend = Self {
            acl: node_acl(&config),
            config,
            session_id: AtomicI64::new(0),
            session_timeout_ms: AtomicU64::new(0),
            session: tokio::sync::Mutex::new(client.clone()),
            wakeups: AtomicU64::new(0),
            hints: Arc::default(),
        };
        backend.note_session(&client);
        Ok(backend)
    }

    /// The configuration this backend was made from.
    pub fn config(&self) -> &ZookeeperConfig {
        &self.config
    }

    /// The id of the current session (as the server's `cons` command prints it, in hex),
    /// for operators matching a client to its connection.
    pub fn session_id(&self) -> i64 {
        self.session_id.load(Ordering::Relaxed)
    }

    /// The session timeout the server granted.
    pub fn session_timeout(&self) -> Duration {
        Duration::from_millis(self.session_timeout_ms.load(Ordering::Relaxed))
    }

    fn note_session(&self, client: &zk::Client) {
        self.session_id
            .store(client.session_id().0, Ordering::Relaxed);
        let timeout = u64::try_from(client.session_timeout().as_millis()).unwrap_or(u64::MAX);
        self.session_timeout_ms.store(timeout, Ordering::Relaxed);
        tracing::debug!(backend = NAME, session = %client.session_id(), timeout_ms = timeout, "session open");
    }

    /// The ACL of every node the lock creates (lock nodes, key directories, base path
    /// nodes).
    pub(crate) fn acl(&self) -> Arc<[Acl]> {
        Arc::clone(&self.acl)
    }

    /// The current session's client; a new session if the current one has ended. Waiting
    /// for another task that is opening one ends at `deadline` too.
    pub(crate) async fn client(&self, deadline: Deadline) -> Result<zk::Client> {
        let Some(mut current) = deadline.run(self.session.lock()).await else {
            return Err(Error::zk("connect", zk::Error::Timeout).into());
        };
        if current.state().is_terminated() {
            tracing::info!(backend = NAME, state = %current.state(), "session ended; opening a new one");
            let fresh = deadline
                .run(open_session(&self.config))
                .await
                .unwrap_or_else(|| Err(Error::zk("connect", zk::Error::Timeout).into()))?;
            self.note_session(&fresh);
            *current = fresh;
        }
        Ok(current.clone())
    }
}

/// The ACL of every node the lock creates: with credentials, all permissions for their
/// digest or SASL identity and nobody else (see [Security](crate#security)); without, all
/// permissions for anyone.
///
/// Not ZooKeeper's `auth` ACL (`Acls::creator_all`): that one grants every identity the
/// creating session has, and a session over TLS with a client certificate also has the
/// certificate's `x509:` identity, so any client holding a certificate with the same
/// subject, credentials or not, could delete the lock's nodes.
fn node_acl(config: &ZookeeperConfig) -> Arc<[Acl]> {
    match crate::auth::acl_identity(config) {
        Some((scheme, id)) => Arc::new([Acl::new(Permission::ALL, AuthId::new(scheme, &id))]),
        None => Acls::anyone_all().iter().cloned().collect(),
    }
}

/// Open a session: TLS when configured, SASL when configured (the client library runs it
/// right after the connect request, on every connection), then digest auth when configured.
///
/// ZooKeeper keeps credentials per connection, not per session: the client library sends
/// them again first thing on every reconnection of the session, and a replaced session
/// gets them from here. They are sent once the session is established, not with the
/// connect request (`Connector::with_auth`): over TLS, the server (3.8, Netty) sometimes
/// answers a pipelined auth packet before the connect request, and the client library then
/// fails to read the answer as a connect response ("insufficient buf"; 1 to 2 % of
/// sessions in `tests/tls_auth.rs`'s burst; never with auth sent afterwards).
async fn open_session(config: &ZookeeperConfig) -> Result<zk::Client> {
    let hosts = config.connect_string();
    #[allow(unused_mut)]
    let mut connector = zk::Client::connector()
        .with_session_timeout(config.session_timeout)
        // The client's own default, pinned: `lost_after_disconnect` relies on it.
        .with_connection_timeout(config.session_timeout * 2 / 5)
        .with_fail_eagerly();
    let secure = match &config.tls {
        #[cfg(feature = "tls")]
        Some(tls) => {
            connector = connector.with_tls(crate::tls::options(tls)?);
            true
        }
        #[cfg(not(feature = "tls"))]
        Some(_) => {
            return Err(LockError::invalid_config(
                NAME,
                "zks:// needs the `tls` feature of dlock-zookeeper, which is not enabled in this build",
            ));
        }
        None => false,
    };
    #[cfg(feature = "sasl")]
    if let Some(sasl) = &config.sasl {
        connector = connector.with_sasl(sasl.options());
    }
    let connect = async {
        let attempt = || async {
            match secure {
                #[cfg(feature = "tls")]
                true => connector.clone().secure_connect(&hosts).await,
                _ => connector.clone().connect(&hosts).await,
            }
        };
        let started = tokio::time::Instant::now();
        let mut sasl_retries = crate::auth::sasl_retries(config);
        let mut answer = attempt().await;
        let mut took = started.elapsed();
        while matches!(answer, Err(zk::Error::NoHosts)) {
            if sasl_retries > 0 {
                sasl_retries -= 1;
            } else if !(secure && slow_handshake(config, took, started.elapsed())) {
                break;
            }
            let sent = tokio::time::Instant::now();
            answer = attempt().await;
            took = sent.elapsed();
        }
        let client = match answer {
            #[cfg(feature = "tls")]
            Err(zk::Error::NoHosts) if secure => return Err(tls_refusal(config).await),
            answer => answer,
        }
        .map_err(|e| crate::auth::connect_error(config, e))?;
        if let Some(digest) = &config.digest {
            client
                .auth("digest", &digest.auth_data())
                .await
                .map_err(|e| LockError::from(Error::zk("authenticate", e)))?;
        }
        Ok(client)
    };
    match tokio::time::timeout(config.connect_timeout, connect).await {
        Ok(answer) => answer,
        Err(_) => Err(Error::zk("connect", zk::Error::Timeout).into()),
    }
}

/// Whether a TLS connect attempt that found no member, after `took` (`elapsed` since the
/// first), is worth another: it ran into the connection timeout (2/5 of the session
/// timeout, which bounds the TCP connect, the TLS handshake and the connect request), as
/// handshakes do in a burst on a loaded host (13 of 300 sessions in `tests/tls_auth.rs`'s
/// burst during a full test run), and a whole attempt still fits in the connect timeout.
/// A refusal (nothing listening, a certificate refused, plain text to the TLS port) comes
/// back at once and is not tried again.
fn slow_handshake(config: &ZookeeperConfig, took: Duration, elapsed: Duration) -> bool {
    let per_attempt = config.session_timeout * 2 / 5;
    took >= per_attempt / 2 && elapsed + per_attempt <= config.connect_timeout
}

/// No member accepted a TLS session: if a TLS handshake with the first host fails for a
/// TLS reason (an untrusted server certificate, or the server refusing ours), that is the
/// error, [`LockError::Backend`]: retrying will not help. Otherwise the members are
/// unavailable.
#[cfg(feature = "tls")]
async fn tls_refusal(config: &ZookeeperConfig) -> LockError {
    let unavailable = || Error::zk("connect", zk::Error::NoHosts).into();
    let (Some(tls), Some(host)) = (&config.tls, config.hosts.first()) else {
        return unavailable();
    };
    let within = config.connect_timeout.min(Duration::from_secs(2));
    match crate::tls::diagnose(tls, host, within).await {
        Some(why) => LockError::backend(
            NAME,
            "connect",
            format!("the TLS handshake with {host} fails: {why}"),
        ),
        None => unavailable(),
    }
}

/// With credentials: the base path, when it exists, must let this session read its ACL
/// (`NoAuth` means the password is wrong, or the path belongs to another identity). A base
/// path anyone may create or delete children of is worth a warning.
async fn check_base_access(
    client: &zk::Client,
    config: &ZookeeperConfig,
    deadline: Deadline,
) -> Result<()> {
    let base = &config.base;
    let user = crate::auth::describe_user(config);
    let answer = deadline
        .run(client.get_acl(base))
        .await
        .unwrap_or(Err(zk::Error::Timeout));
    match answer {
        Ok((acls, _)) => {
            let open = acls.iter().any(|acl| {
                acl.scheme() == "world"
                    && acl.id() == "anyone"
                    && (acl.permission().has(Permission::CREATE)
                        || acl.permission().has(Permission::DELETE))
            });
            if open {
                tracing::warn!(
                    backend = NAME,
                    base,
                    "anyone may create or delete nodes under the base path: other clients can \
                     plant or remove key directories; give it this client's ACL only \
                     (setAcl {base} digest:<the user's digest id>:cdrwa, or sasl:<user>:cdrwa)"
                );
            }
            Ok(())
        }
        Err(zk::Error::NoNode) => Ok(()),
        Err(zk::Error::NoAuth) => Err(LockError::backend(
            NAME,
            "connect",
            format!(
                "{user} may not read the ACL of the base path {base} (NoAuth): a \
                 wrong password, or the path belongs to another identity"
            ),
        )),
        Err(e) => Err(Error::zk("connect", e).into()),
    }
}

/// How long the client may stay disconnected before the lease is reported lost.
///
/// The server expires a session one session timeout `T` after it last heard from the
/// client. The client reports `Disconnected` after `2T/5` without a byte from the server
/// (the connection timeout [`open_session`] sets; checked every eighth of it, `T/20`), and
/// pings after `3T/20` idle (three checks); so when the disconnection is seen,
/// the server may have last heard from us up to `3T/5` earlier. Of the `2T/5` left, `3T/20`
/// is kept as a margin for scheduling delays on a busy machine and clock-rate drift: the
/// lease is reported lost `T/4` after the disconnection, before the server can give the key
/// to anyone else (the server rounds expiries up to its next tick, which only adds room).
/// (Curator's LOST comes a whole `T` after SUSPENDED, which can be after the server expired
/// the session.)
pub(crate) fn lost_after_disconnect(session_timeout: Duration) -> Duration {
    session_timeout / 4
}

/// Wait until the client is connected; an error once its session has ended.
pub(crate) async fn connected(client: &zk::Client) -> Result<(), zk::Error> {
    let mut states = client.state_watcher();
    loop {
        match states.peek_state() {
            SessionState::SyncConnected | SessionState::ConnectedReadOnly => return Ok(()),
            SessionState::Disconnected => {
                states.changed().await;
            }
            SessionState::Expired => return Err(zk::Error::SessionExpired),
            SessionState::AuthFailed => return Err(zk::Error::AuthFailed),
            SessionState::Closed => return Err(zk::Error::ClientClosed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_fires_before_the_server_can_expire_the_session() {
        let t = Duration::from_secs(10);
        // Last heard up to 3T/5 before the disconnection was seen; the server expires at T.
        let server_expiry_after_disconnect = t - t * 3 / 5;
        assert!(lost_after_disconnect(t) + t * 3 / 20 <= server_expiry_after_disconnect);
    }
}
