//! [`PostgresConfig`]: where the server is, how to talk to it, and which table maps keys to
//! advisory lock ids.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use dlock_core::raw::parse_duration;
use dlock_core::raw::url::{Host, LockUrl};
use dlock_core::{LockError, Result, Secret};
use sqlx::postgres::{PgConnectOptions, PgSslMode};

use crate::NAME;

/// The range every timeout option accepts.
const TIMEOUTS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);

/// How to reach one PostgreSQL server, and which table maps keys to lock ids.
///
/// Built from a URL with [`PostgresConfig::from_url`], or from [`PostgresConfig::new`] and
/// [`with_option`](PostgresConfig::with_option). `Debug` never shows the password.
#[derive(Debug, Clone)]
pub struct PostgresConfig {
    /// Server host name or IP address.
    pub host: String,
    /// Server port. Default 5432.
    pub port: u16,
    /// User (role) name.
    pub user: String,
    /// Password, if any. Never shown by `Debug` or in errors.
    pub password: Option<Secret>,
    /// Database holding the key table.
    pub database: String,
    /// The key table (key name → lock id); the sequences `{table}_id` and `{table}_fence`
    /// go with it. Created if missing. An identifier of lower-case letters, digits and `_`,
    /// at most 57 characters. Default `dlock_keys`.
    pub table: String,
    /// The first of the two 32-bit numbers of every advisory lock this client takes
    /// (`pg_advisory_lock(namespace, id)`): a space of its own, apart from other users of
    /// advisory locks in the same database. Default [`PostgresConfig::DEFAULT_NAMESPACE`].
    pub namespace: i32,
    /// Bound on opening a connection (TCP, TLS, authentication, session setup).
    /// Default 5 s.
    pub connect_timeout: Duration,
    /// Bound on the answer to a statement that does not wait for a lock, and how long a
    /// waiting statement may stay silent past its server-side lock timeout. Default 5 s.
    pub response_timeout: Duration,
    /// Most connections open at once for holding and waiting: every held key and every
    /// waiting acquire pins one. Default 100.
    pub max_connections: u32,
    /// `application_name` the sessions show in `pg_stat_activity`, and
    /// [`inspect`](dlock_core::DistributedLock::inspect) as each holder's and waiter's
    /// `who`. `None` (the default): this process's
    /// [`holder_description`](dlock_core::holder_description), `NAME@HOST:PID`, read when
    /// connecting (cut to PostgreSQL's 63 bytes by shortening the host name).
    pub application_name: Option<String>,
    tls: Tls,
}

/// TLS settings as the URL gave them; [`Tls::mode`] resolves what sqlx is told.
#[derive(Debug, Clone, Default)]
struct Tls {
    mode: Option<SslMode>,
    root_cert: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
}

/// The `sslmode` values, libpq's and sqlx's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Plain text.
    Disable,
    /// Plain text, TLS if the server insists; the certificate is not checked.
    Allow,
    /// TLS if the server offers it, plain text if not; the certificate is not checked.
    Prefer,
    /// TLS or fail; the certificate is not checked.
    Require,
    /// TLS; the certificate must chain to `sslrootcert`.
    VerifyCa,
    /// TLS; the certificate must chain to `sslrootcert` (or a public root) and name the host.
    VerifyFull,
}

impl SslMode {
    const ALL: [Self; 6] = [
        Self::Disable,
        Self::Allow,
        Self::Prefer,
        Self::Require,
        Self::VerifyCa,
        Self::VerifyFull,
    ];

    /// The option value, as the URL spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Allow => "allow",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// Whether the server must prove who it is.
    pub(crate) fn verifies(self) -> bool {
        matches!(self, Self::VerifyCa | Self::VerifyFull)
    }

    fn to_sqlx(self) -> PgSslMode {
        match self {
            Self::Disable => PgSslMode::Disable,
            Self::Allow => PgSslMode::Allow,
            Self::Prefer => PgSslMode::Prefer,
            Self::Require => PgSslMode::Require,
            Self::VerifyCa => PgSslMode::VerifyCa,
            Self::VerifyFull => PgSslMode::VerifyFull,
        }
    }
}

impl FromStr for SslMode {
    type Err = ();

    /// Case-insensitive, as sqlx reads it.
    fn from_str(value: &str) -> std::result::Result<Self, ()> {
        Self::ALL
            .into_iter()
            .find(|mode| mode.name().eq_ignore_ascii_case(value))
            .ok_or(())
    }
}

impl Tls {
    /// The mode the connection uses, or why the settings are refused: as the MySQL
    /// backend's policy. No `sslmode`: `verify-full` when any file is given, `prefer`
    /// (sqlx's and libpq's default) when none is. Refused, since the connection would look
    /// checked and not be: `sslrootcert` with a mode that does not verify, any file with
    /// `disable`, `allow` or `prefer`, `verify-ca` without `sslrootcert`, and `sslcert`
    /// without `sslkey` or the reverse.
    fn mode(&self) -> Result<SslMode> {
        let files = self.root_cert.is_some() || self.cert.is_some() || self.key.is_some();
        if self.cert.is_some() != self.key.is_some() {
            return Err(LockError::invalid_config(
                NAME,
                "sslcert and sslkey go together (the client certificate and its key)",
            ));
        }
        let Some(mode) = self.mode else {
            return Ok(if files {
                SslMode::VerifyFull
            } else {
                SslMode::Prefer
            });
        };
        let refused = match mode {
            SslMode::Disable | SslMode::Allow | SslMode::Prefer if files => Some(
                "may use plain text and does not check the server's certificate, yet TLS files \
                 are given; use sslmode=verify-full (the default when a file is given)",
            ),
            SslMode::Require if self.root_cert.is_some() => Some(
                "does not check the server's certificate, so sslrootcert would be ignored; use \
                 sslmode=verify-full (or verify-ca)",
            ),
            SslMode::VerifyCa if self.root_cert.is_none() => Some(
                "without sslrootcert accepts a certificate any public CA issued, for any name; \
                 give sslrootcert, or use verify-full",
            ),
            _ => None,
        };
        match refused {
            Some(why) => Err(LockError::invalid_config(
                NAME,
                format!("sslmode={} {why}", mode.name()),
            )),
            None => Ok(mode),
        }
    }
}

impl PostgresConfig {
    /// The default port.
    pub const DEFAULT_PORT: u16 = 5432;
    /// The default key table.
    pub const DEFAULT_TABLE: &'static str = "dlock_keys";
    /// The default namespace: `0x646c6f63`, "dloc" in ASCII.
    pub const DEFAULT_NAMESPACE: i32 = 0x646c_6f63;
    /// The default connect timeout.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default response timeout.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default connection limit.
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 100;
    /// Longest table name: identifiers are at most 63 bytes and `_fence` is added.
    const MAX_TABLE_LEN: usize = 63 - "_fence".len();

    /// A server at `host:5432`, logging in as `user` to `database`, with every other setting
    /// at its default.
    pub fn new(
        host: impl Into<String>,
        user: impl Into<String>,
        database: impl Into<String>,
    ) -> Self {
        Self {
            host: host.into(),
            port: Self::DEFAULT_PORT,
            user: user.into(),
            password: None,
            database: database.into(),
            table: Self::DEFAULT_TABLE.to_owned(),
            namespace: Self::DEFAULT_NAMESPACE,
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            application_name: None,
            tls: Tls::default(),
        }
    }

    /// Parse `postgres://user[:password]@host[:port]/database[?option=value&…]`
    /// (`postgresql://` is the same). No network I/O.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is wrong: the scheme, a missing host, user or
    /// database, an unknown option or a bad option value. The message never shows the
    /// password.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = LockUrl::parse(NAME, url, crate::SCHEMES, Self::DEFAULT_PORT)?;
        let host = match url.hosts() {
            [host] => host,
            [] => return Err(LockError::invalid_config(NAME, "the URL names no host")),
            _ => {
                return Err(LockError::invalid_config(
                    NAME,
                    "the URL names several hosts; a postgres:// URL names one server",
                ));
            }
        };
        let Some(user) = url.username() else {
            return Err(LockError::invalid_config(
                NAME,
                "the URL names no user (postgres://user:password@host/database)",
            ));
        };
        let database = url.path().strip_prefix('/').unwrap_or_default();
        if database.is_empty() || database.contains('/') {
            return Err(LockError::invalid_config(
                NAME,
                "the URL path must name one database (postgres://user:password@host/database)",
            ));
        }
        let config = Self {
            port: host.port,
            password: url.password().cloned(),
            ..Self::new(host.name.clone(), user, database)
        };
        let config = url
            .options()
            .iter()
            .try_fold(config, |config, (key, value)| {
                config.with_option(key, value)
            })?;
        config.tls.mode()?;
        Ok(config)
    }

    /// Set one option by its URL name: `table`, `namespace`, `connect_timeout`,
    /// `response_timeout`, `max_connections`, `application_name`, or the TLS options
    /// `sslmode` (`disable`, `allow`, `prefer`, `require`, `verify-ca`, `verify-full`),
    /// `sslrootcert`, `sslcert`, `sslkey` (sqlx's spellings, `ssl-mode`, `ssl-root-cert`,
    /// `ssl-cert`, `ssl-key` too).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for an unknown key or a bad value, naming it.
    pub fn with_option(mut self, key: &str, value: &str) -> Result<Self> {
        let bad = |what: &str| {
            LockError::invalid_config(NAME, format!("option {key}={value:?} must be {what}"))
        };
        match key.parse::<ConfigKey>()? {
            ConfigKey::Table => {
                check_table(value)?;
                value.clone_into(&mut self.table);
            }
            ConfigKey::Namespace => {
                self.namespace = value.parse().map_err(|_| bad("a 32-bit signed integer"))?;
            }
            ConfigKey::ConnectTimeout => {
                self.connect_timeout = parse_duration(NAME, key, value, TIMEOUTS)?
            }
            ConfigKey::ResponseTimeout => {
                self.response_timeout = parse_duration(NAME, key, value, TIMEOUTS)?
            }
            ConfigKey::MaxConnections => {
                self.max_connections = value
                    .parse()
                    .ok()
                    .filter(|n| (1..=10_000).contains(n))
                    .ok_or_else(|| bad("a number from 1 to 10000"))?;
            }
            ConfigKey::ApplicationName => {
                if value.len() > 63 || !value.chars().all(|c| c.is_ascii_graphic() || c == ' ') {
                    return Err(bad("printable ASCII, at most 63 characters"));
                }
                self.application_name = Some(value.to_owned());
            }
            ConfigKey::SslMode => {
                self.tls.mode = Some(value.parse().map_err(|()| {
                    bad("one of disable, allow, prefer, require, verify-ca, verify-full")
                })?);
            }
            ConfigKey::SslRootCert => self.tls.root_cert = Some(non_empty_path(key, value)?),
            ConfigKey::SslCert => self.tls.cert = Some(non_empty_path(key, value)?),
            ConfigKey::SslKey => self.tls.key = Some(non_empty_path(key, value)?),
        }
        Ok(self)
    }

    /// `host:port`, as errors and logs show the server (never with credentials).
    pub fn addr(&self) -> String {
        Host::new(self.host.clone(), self.port).to_string()
    }

    /// The sequence fencing tokens come from: `{table}_fence`.
    pub fn fence_sequence(&self) -> String {
        format!("{}_fence", self.table)
    }

    /// The sequence lock ids come from: `{table}_id`.
    pub fn id_sequence(&self) -> String {
        format!("{}_id", self.table)
    }

    /// Check what `from_url` cannot: values set directly on the fields.
    pub(crate) fn validate(&self) -> Result<()> {
        check_table(&self.table)?;
        if self.host.is_empty() || self.user.is_empty() || self.database.is_empty() {
            return Err(LockError::invalid_config(
                NAME,
                "host, user and database must be set",
            ));
        }
        if self.max_connections == 0 {
            return Err(LockError::invalid_config(
                NAME,
                "max_connections must be at least 1",
            ));
        }
        if self.connect_timeout.is_zero() || self.response_timeout.is_zero() {
            return Err(LockError::invalid_config(
                NAME,
                "timeouts must be longer than zero",
            ));
        }
        self.tls.mode()?;
        Ok(())
    }

    /// The TLS mode connections use.
    pub(crate) fn ssl_mode(&self) -> Result<SslMode> {
        self.tls.mode()
    }

    /// Whether a password would go to another machine whose server is not verified.
    pub(crate) fn login_exposed(&self) -> bool {
        self.password
            .as_ref()
            .is_some_and(|p| !p.expose().is_empty())
            && !self.tls.mode().is_ok_and(SslMode::verifies)
            && !is_loopback(&self.host)
    }

    /// Check that the TLS files can be read, so a wrong path is a config error at connect.
    pub(crate) fn check_tls_files(&self) -> Result<()> {
        let files = [
            ("sslrootcert", &self.tls.root_cert),
            ("sslcert", &self.tls.cert),
            ("sslkey", &self.tls.key),
        ];
        for (option, path) in files {
            let Some(path) = path else { continue };
            if let Err(e) = std::fs::read(path) {
                return Err(LockError::InvalidConfig {
                    backend: NAME,
                    message: format!("{option}: cannot read {}: {e}", path.display()),
                    source: Some(Box::new(e)),
                });
            }
        }
        Ok(())
    }

    /// The `application_name` connections carry: the configured one, else this process's
    /// holder description, cut to [`MAX_APPLICATION_NAME`] bytes.
    pub(crate) fn application_name(&self) -> String {
        match &self.application_name {
            Some(name) => name.clone(),
            None => fit_application_name(dlock_core::holder_description()),
        }
    }

    /// sqlx's connect options for this server.
    pub(crate) fn connect_options(&self) -> Result<PgConnectOptions> {
        let mut opts = PgConnectOptions::new_without_pgpass()
            .host(&self.host)
            .port(self.port)
            .username(&self.user)
            .database(&self.database)
            .application_name(&self.application_name())
            // Room for the prepared takes and releases (see `sql::Statement`): each
            // connection prepares them once and keeps them.
            .statement_cache_capacity(STATEMENT_CACHE)
            .ssl_mode(self.tls.mode()?.to_sqlx());
        if let Some(password) = &self.password {
            opts = opts.password(password.expose());
        }
        if let Some(root) = &self.tls.root_cert {
            opts = opts.ssl_root_cert(root);
        }
        if let Some(cert) = &self.tls.cert {
            opts = opts.ssl_client_cert(cert);
        }
        if let Some(key) = &self.tls.key {
            opts = opts.ssl_client_key(key);
        }
        Ok(opts)
    }
}

/// The longest `application_name` PostgreSQL keeps (`NAMEDATALEN - 1`).
const MAX_APPLICATION_NAME: usize = 63;

/// How many prepared statements a lock connection keeps: the plain takes and releases of
/// both modes, with room to spare (the least recently used goes first). Side statements
/// are not kept (some name a key's id in their text).
const STATEMENT_CACHE: usize = 32;

/// `NAME@HOST:PID` cut to [`MAX_APPLICATION_NAME`] bytes: the end (`:PID`) is kept and
/// what comes before it is shortened, so the host name goes first.
fn fit_application_name(description: &str) -> String {
    if description.len() <= MAX_APPLICATION_NAME {
        return description.to_owned();
    }
    let tail = description
        .rfind(':')
        .map(|at| &description[at..])
        .filter(|tail| tail.len() <= MAX_APPLICATION_NAME)
        .unwrap_or_default();
    let mut head = MAX_APPLICATION_NAME - tail.len();
    while !description.is_char_boundary(head) {
        head -= 1;
    }
    format!("{}{tail}", &description[..head])
}

/// Whether `host` names this machine: `localhost` or a loopback address (not resolved).
fn is_loopback(host: &str) -> bool {
    let host = host.trim_end_matches('.');
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(ip)) => ip.is_loopback(),
        Ok(std::net::IpAddr::V6(ip)) => {
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|ip| ip.is_loopback())
        }
        Err(_) => false,
    }
}

/// The options a URL query may set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfigKey {
    Table,
    Namespace,
    ConnectTimeout,
    ResponseTimeout,
    MaxConnections,
    ApplicationName,
    SslMode,
    SslRootCert,
    SslCert,
    SslKey,
}

impl FromStr for ConfigKey {
    type Err = LockError;

    fn from_str(key: &str) -> Result<Self> {
        match key {
            "table" => Ok(Self::Table),
            "namespace" => Ok(Self::Namespace),
            "connect_timeout" => Ok(Self::ConnectTimeout),
            "response_timeout" => Ok(Self::ResponseTimeout),
            "max_connections" => Ok(Self::MaxConnections),
            "application_name" => Ok(Self::ApplicationName),
            "sslmode" | "ssl-mode" => Ok(Self::SslMode),
            "sslrootcert" | "ssl-root-cert" | "ssl-ca" => Ok(Self::SslRootCert),
            "sslcert" | "ssl-cert" => Ok(Self::SslCert),
            "sslkey" | "ssl-key" => Ok(Self::SslKey),
            other => Err(LockError::invalid_config(
                NAME,
                format!(
                    "unknown option {other:?} (known: table, namespace, connect_timeout, \
                     response_timeout, max_connections, application_name, sslmode, \
                     sslrootcert, sslcert, sslkey)"
                ),
            )),
        }
    }
}

fn check_table(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && name.len() <= PostgresConfig::MAX_TABLE_LEN;
    if ok {
        Ok(())
    } else {
        Err(LockError::invalid_config(
            NAME,
            format!(
                "table {name:?} is not a plain identifier (a lower-case letter or _, then \
                 lower-case letters, digits or _, at most {} characters)",
                PostgresConfig::MAX_TABLE_LEN
            ),
        ))
    }
}

fn non_empty_path(key: &str, value: &str) -> Result<PathBuf> {
    if value.is_empty() {
        return Err(LockError::invalid_config(
            NAME,
            format!("option {key} needs a file path"),
        ));
    }
    Ok(PathBuf::from(value))
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
