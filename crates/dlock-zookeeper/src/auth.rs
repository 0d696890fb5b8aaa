//! Who a session authenticates as: ZooKeeper `digest` credentials or SASL `DIGEST-MD5`
//! credentials, the ACL identity each gives the nodes the lock creates, and how a refusal
//! of them reads.

use dlock_core::{LockError, Result, Secret};
use zookeeper_client as zk;

use crate::NAME;
use crate::config::ZookeeperConfig;
use crate::error::Error;

/// ZooKeeper `digest` credentials: the session is identified as
/// `digest:{user}:{base64(sha1("{user}:{password}"))}`. `Debug` never shows the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digest {
    user: String,
    password: Secret,
}

impl Digest {
    /// Credentials for `user` (not empty, no `:`) with `password` (not empty).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for an empty user name or password, or a user name with
    /// a `:` (the server splits `user:password` at the first `:`). The message never shows
    /// the password.
    pub fn new(user: impl Into<String>, password: impl Into<Secret>) -> Result<Self> {
        let (user, password) = (user.into(), password.into());
        if user.is_empty() {
            return Err(LockError::invalid_config(
                NAME,
                "digest auth needs a user name: zk://user:password@host",
            ));
        }
        if user.contains(':') {
            return Err(LockError::invalid_config(
                NAME,
                "a digest user name cannot hold ':' (ZooKeeper splits user:password at the first ':')",
            ));
        }
        if password.expose().is_empty() {
            return Err(LockError::invalid_config(
                NAME,
                "digest auth needs a password: zk://user:password@host",
            ));
        }
        Ok(Self { user, password })
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The password.
    pub fn password(&self) -> &Secret {
        &self.password
    }

    /// The id ZooKeeper gives a session authenticated with these credentials,
    /// `{user}:{base64(sha1("{user}:{password}"))}` (what `getAcl` shows after `digest:`,
    /// and what an operator writes in `setAcl {path} digest:{id}:cdrwa`). It is derived
    /// from the password: keep it as private as the password itself (it can be attacked
    /// offline).
    pub fn id(&self) -> String {
        use base64::Engine as _;
        use sha1::Digest as _;
        let hash = sha1::Sha1::digest(self.auth_data());
        format!(
            "{}:{}",
            self.user,
            base64::engine::general_purpose::STANDARD.encode(hash)
        )
    }

    /// `user:password`, the auth data of ZooKeeper's `digest` scheme.
    pub(crate) fn auth_data(&self) -> Vec<u8> {
        format!("{}:{}", self.user, self.password.expose()).into_bytes()
    }
}

/// SASL `DIGEST-MD5` credentials (the URL's `user:password@` with `auth=sasl`): the server
/// checks them against its JAAS `Server` section and identifies the session as
/// `sasl:{user}`. The password never crosses the network (challenge and response).
/// `Debug` never shows the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sasl {
    user: String,
    password: Secret,
}

impl Sasl {
    /// Credentials for `user` (not empty; no `:`, `/` or `@`) with `password` (not empty).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for an empty user name or password, or a user name with
    /// `:`, `/` or `@`: the server reads `/` and `@` as the host and realm parts of a
    /// Kerberos principal and may rewrite the identity (`kerberos.removeRealmFromPrincipal`),
    /// so the nodes' ACL would not match it, and `:` cannot be written in an ACL by hand
    /// (`setAcl /p sasl:{user}:cdrwa`). The message never shows the password.
    pub fn new(user: impl Into<String>, password: impl Into<Secret>) -> Result<Self> {
        let (user, password) = (user.into(), password.into());
        if user.is_empty() {
            return Err(LockError::invalid_config(
                NAME,
                "SASL auth needs a user name: zk://user:password@host?auth=sasl",
            ));
        }
        if user.contains([':', '/', '@']) {
            return Err(LockError::invalid_config(
                NAME,
                "a SASL user name cannot hold ':', '/' or '@' (the server reads '/' and '@' \
                 as parts of a Kerberos principal and may rewrite the identity)",
            ));
        }
        if password.expose().is_empty() {
            return Err(LockError::invalid_config(
                NAME,
                "SASL auth needs a password: zk://user:password@host?auth=sasl",
            ));
        }
        Ok(Self { user, password })
    }

    /// The user name: the session's identity is `sasl:{user}`.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The password.
    pub fn password(&self) -> &Secret {
        &self.password
    }

    /// The client library's `DIGEST-MD5` options. It keeps its own copy of the password
    /// (its `Debug` would show it: never log them).
    #[cfg(feature = "sasl")]
    pub(crate) fn options(&self) -> zk::SaslOptions {
        zk::SaslOptions::digest_md5(self.user.clone(), self.password.expose().to_owned()).into()
    }
}

/// How the URL's credentials authenticate (the `auth` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scheme {
    /// `auth=digest`, the default: ZooKeeper's `digest` scheme (`addauth digest`).
    Digest,
    /// `auth=sasl`: SASL `DIGEST-MD5`.
    Sasl,
}

impl Scheme {
    /// Parse the `auth` option's value.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`]: Kerberos (`gssapi`, `kerberos`) is named as not
    /// supported, anything else as unknown.
    pub(crate) fn parse(value: &str) -> Result<Self> {
        match value {
            "digest" => Ok(Self::Digest),
            "sasl" => Ok(Self::Sasl),
            "gssapi" | "kerberos" | "sasl-gssapi" => Err(LockError::invalid_config(
                NAME,
                "SASL GSSAPI (Kerberos) is not supported: use auth=sasl (DIGEST-MD5, with a \
                 user_{name} entry in the server's JAAS Server section) or digest auth over zks://",
            )),
            other => Err(LockError::invalid_config(
                NAME,
                format!("option auth: unknown scheme {other:?} (known: digest, sasl)"),
            )),
        }
    }
}

/// The one identity every node the lock creates grants all permissions to, as ACL scheme
/// and id: the digest id, or the SASL user name. `None` without credentials.
pub(crate) fn acl_identity(config: &ZookeeperConfig) -> Option<(&'static str, String)> {
    match (&config.digest, &config.sasl) {
        (Some(digest), _) => Some(("digest", digest.id())),
        (None, Some(sasl)) => Some(("sasl", sasl.user().to_owned())),
        (None, None) => None,
    }
}

/// The scheme and user name the session authenticates as, for messages.
pub(crate) fn describe_user(config: &ZookeeperConfig) -> String {
    match (&config.digest, &config.sasl) {
        (Some(digest), _) => format!("digest user {:?}", digest.user()),
        (None, Some(sasl)) => format!("SASL user {:?}", sasl.user()),
        (None, None) => "a session without credentials".to_owned(),
    }
}

/// How many more times to try a connect that no member accepted, with SASL.
///
/// The client library sends SASL's first packet right behind the connect request, and the
/// server (3.8) sometimes answers it first; the library then fails to read the answer as a
/// connect response and reports that no member accepted a session (1 to 3 % of sessions in
/// a TLS burst, and seen over plain TCP too; the race digest auth avoids by authenticating
/// after the connect: see `session::open_session`). A new attempt usually passes, but on
/// a loaded machine the race comes more often: with three retries, one session of 200 in
/// `tests/sasl_auth.rs`'s TLS burst failed four attempts in a row during a full test run
/// on a busy 2-core machine. Every attempt stays within the connect timeout. Without SASL
/// nothing is retried: there "no member" means no member.
pub(crate) fn sasl_retries(config: &ZookeeperConfig) -> usize {
    if config.sasl.is_some() { 8 } else { 0 }
}

/// With SASL credentials, check that the server logged the session in as `sasl:{user}`
/// (`whoAmI`, ZooKeeper 3.7+; older servers are not checked). A server with no JAAS
/// `Server` section answers the SASL exchange without logging anyone in: without this
/// check the session would look fine and the first acquire fail with `InvalidACL`.
pub(crate) async fn check_sasl_login(
    client: &zk::Client,
    config: &ZookeeperConfig,
    deadline: dlock_core::raw::Deadline,
) -> Result<()> {
    let Some(sasl) = &config.sasl else {
        return Ok(());
    };
    let answer = deadline
        .run(client.list_auth_users())
        .await
        .unwrap_or(Err(zk::Error::Timeout));
    match answer {
        Ok(users)
            if users
                .iter()
                .any(|u| u.scheme() == "sasl" && u.user() == sasl.user()) =>
        {
            Ok(())
        }
        Ok(users) => {
            let schemes: Vec<&str> = users.iter().map(zk::AuthUser::scheme).collect();
            Err(LockError::backend(
                NAME,
                "connect",
                format!(
                    "the server did not log the session in as sasl:{} (its identities' \
                     schemes: {schemes:?}): it accepts no SASL logins (start it with a JAAS \
                     Server section, -Djava.security.auth.login.config=...)",
                    sasl.user()
                ),
            ))
        }
        Err(zk::Error::Unimplemented) => Ok(()),
        Err(e) => Err(Error::zk("connect", e).into()),
    }
}

/// The error of a session that could not be opened. A server that ends the SASL exchange
/// with `AuthFailed` refused the credentials: say so (it is not an outage to retry).
pub(crate) fn connect_error(config: &ZookeeperConfig, e: zk::Error) -> LockError {
    match (&config.sasl, e) {
        (Some(sasl), zk::Error::AuthFailed) => LockError::backend(
            NAME,
            "connect",
            format!(
                "SASL authentication failed for user {:?} (AuthFailed): a wrong user name or \
                 password, or the server does not accept SASL DIGEST-MD5 logins",
                sasl.user()
            ),
        ),
        (_, e) => Error::zk("connect", e).into(),
    }
}
