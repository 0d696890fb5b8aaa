//! [`MysqlConfig`]: where the server is, how to talk to it, and which table holds the locks.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use dlock_core::raw::parse_duration;
use dlock_core::raw::url::{Host, LockUrl};
use dlock_core::{LockError, Result, Secret};
use sqlx::mysql::MySqlConnectOptions;

use crate::NAME;
use crate::tls::{SslMode, Tls};

/// The range every timeout option accepts.
const TIMEOUTS: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(1)..=Duration::from_secs(3600);

/// How to reach one MySQL or MariaDB server, and which table holds the locks.
///
/// Built from a URL with [`MysqlConfig::from_url`], or from [`MysqlConfig::new`] and
/// [`with_option`](MysqlConfig::with_option). `Debug` never shows the password.
#[derive(Debug, Clone)]
pub struct MysqlConfig {
    /// Server host name or IP address.
    pub host: String,
    /// Server port. Default 3306.
    pub port: u16,
    /// User name.
    pub user: String,
    /// Password, if any. Never shown by `Debug` or in errors.
    pub password: Option<Secret>,
    /// Database (schema) holding the lock tables.
    pub database: String,
    /// The lock table; the fence counters live in `{table}_fence`, permit slots in
    /// `{table}_slots`. Created if missing.
    /// An identifier of letters, digits and `_`, at most 58 characters. Default
    /// `dlock_locks`.
    pub table: String,
    /// Bound on opening a connection (TCP, TLS, authentication, session setup).
    /// Default 5 s.
    pub connect_timeout: Duration,
    /// Bound on the answer to a statement that does not wait for a lock (a black-holed
    /// server fails the call after it), and the time a waiting statement may stay silent
    /// past its server-side lock wait. Default 5 s.
    pub response_timeout: Duration,
    /// Most lock connections open at once. In [`LockMode::Row`] every held key and every
    /// waiting acquire pins one; in [`LockMode::Named`] holder connections carry many keys
    /// each and only waiting acquires take one of their own. Default 100.
    pub max_connections: u32,
    /// How a key is held. Default [`LockMode::Row`].
    pub mode: LockMode,
    tls: Tls,
}

/// How the MySQL backend holds a key (URL option `mode`). Every client of a key must use
/// the same mode: a row lock and a named lock on one key do not exclude each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockMode {
    /// `row`: a row locked by `SELECT … FOR UPDATE` in a transaction kept open on a
    /// connection of its own per held key (at most `max_connections` keys held at once).
    #[default]
    Row,
    /// `named`: a named lock (`GET_LOCK`), many per holder connection; for clients that hold
    /// many keys at once.
    Named,
}

impl LockMode {
    /// The URL spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::Row => "row",
            Self::Named => "named",
        }
    }
}

impl MysqlConfig {
    /// The default port.
    pub const DEFAULT_PORT: u16 = 3306;
    /// The default lock table.
    pub const DEFAULT_TABLE: &'static str = "dlock_locks";
    /// The default connect timeout.
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default response timeout.
    pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
    /// The default connection limit.
    pub const DEFAULT_MAX_CONNECTIONS: u32 = 100;
    /// Longest table name: MySQL identifiers are at most 64 characters and the fence table
    /// adds `_fence`.
    const MAX_TABLE_LEN: usize = 64 - "_fence".len();

    /// A server at `host:3306`, logging in as `user` to `database`, with every other setting
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
            connect_timeout: Self::DEFAULT_CONNECT_TIMEOUT,
            response_timeout: Self::DEFAULT_RESPONSE_TIMEOUT,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            mode: LockMode::Row,
            tls: Tls::default(),
        }
    }

    /// Parse `mysql://user[:password]@host[:port]/database[?option=value&…]`
    /// (`mariadb://` is the same). No network I/O.
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
                    "the URL names several hosts; a mysql:// URL names one server",
                ));
            }
        };
        let Some(user) = url.username() else {
            return Err(LockError::invalid_config(
                NAME,
                "the URL names no user (mysql://user:password@host/database)",
            ));
        };
        let database = url.path().strip_prefix('/').unwrap_or_default();
        if database.is_empty() || database.contains('/') {
            return Err(LockError::invalid_config(
                NAME,
                "the URL path must name one database (mysql://user:password@host/database)",
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
        // Options come in any order: their combination is checked once all are read.
        config.tls.mode()?;
        Ok(config)
    }

    /// Set one option by its URL name: `table`, `connect_timeout`, `response_timeout`,
    /// `max_connections`, or the TLS options `ssl-mode` (`disabled`, `preferred`,
    /// `required`, `verify_ca`, `verify_identity`), `ssl-ca`, `ssl-cert`, `ssl-key`.
    ///
    /// How the TLS options combine (a file without `ssl-mode` means `verify_identity`;
    /// combinations that would ignore a file or a check are refused) is checked when the
    /// backend connects, and by [`from_url`](Self::from_url) once every option is read: see
    /// the crate docs' *Security*.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for an unknown key or a bad value, naming it.
    pub fn with_option(mut self, key: &str, value: &str) -> Result<Self> {
        match key.parse::<ConfigKey>()? {
            ConfigKey::Table => {
                check_table(value)?;
                value.clone_into(&mut self.table);
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
                    .ok_or_else(|| {
                        LockError::invalid_config(
                            NAME,
                            format!("option {key}={value:?} must be a number from 1 to 10000"),
                        )
                    })?;
            }
            ConfigKey::Mode => {
                self.mode = match value {
                    "row" => LockMode::Row,
                    "named" => LockMode::Named,
                    _ => {
                        return Err(LockError::invalid_config(
                            NAME,
                            format!("option {key}={value:?} must be row or named"),
                        ));
                    }
                };
            }
            ConfigKey::SslMode => {
                self.tls.mode = Some(value.parse().map_err(|()| {
                    LockError::invalid_config(
                        NAME,
                        format!(
                            "option {key}={value:?} is not one of disabled, preferred, \
                             required, verify_ca, verify_identity"
                        ),
                    )
                })?);
            }
            ConfigKey::SslCa => self.tls.ca = Some(non_empty_path(key, value)?),
            ConfigKey::SslCert => self.tls.cert = Some(non_empty_path(key, value)?),
            ConfigKey::SslKey => self.tls.key = Some(non_empty_path(key, value)?),
        }
        Ok(self)
    }

    /// `host:port`, as errors and logs show the server (never with credentials).
    pub fn addr(&self) -> String {
        Host::new(self.host.clone(), self.port).to_string()
    }

    /// The table holding the fence counters: `{table}_fence`.
    pub fn fence_table(&self) -> String {
        format!("{}_fence", self.table)
    }

    /// The table holding the permit slots of semaphore keys: `{table}_slots`.
    pub fn slots_table(&self) -> String {
        format!("{}_slots", self.table)
    }

    /// The table holding the values published by named-mode election leaders:
    /// `{table}_value` (see the crate docs' *Elections*).
    pub fn value_table(&self) -> String {
        format!("{}_value", self.table)
    }

    /// The table holding the owner and count of each reentrant hold: `{table}_owner`.
    pub fn owner_table(&self) -> String {
        format!("{}_owner", self.table)
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

    /// The TLS mode connections use: `ssl-mode`, or what its absence means (see
    /// [`Tls::mode`]).
    pub(crate) fn ssl_mode(&self) -> Result<SslMode> {
        self.tls.mode()
    }

    /// Check that the TLS files can be read (see [`Tls::check_files`]).
    pub(crate) fn check_tls_files(&self) -> Result<()> {
        self.tls.check_files()
    }

    /// Whether the password would go to another machine whose server is not verified
    /// (see [`Tls::login_exposed`]).
    pub(crate) fn login_exposed(&self) -> bool {
        self.tls.login_exposed(self.password.as_ref(), &self.host)
    }

    /// sqlx's connect options for this server.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for TLS options that do not go together.
    pub(crate) fn connect_options(&self) -> Result<MySqlConnectOptions> {
        let mut opts = MySqlConnectOptions::new()
            .host(&self.host)
            .port(self.port)
            .username(&self.user)
            .database(&self.database)
            // Text batches, but for the prepared first try of a hold (two forms, see
            // `Sql::with_prepared_take`): each connection keeps those prepared.
            .statement_cache_capacity(2);
        if let Some(password) = &self.password {
            opts = opts.password(password.expose());
        }
        self.tls.connect_options(opts)
    }
}

/// The options a URL query may set, with their one spelling (sqlx's TLS options keep
/// sqlx's spellings, with and without the dash).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ConfigKey {
    /// `table`: [`MysqlConfig::table`].
    Table,
    /// `connect_timeout`: [`MysqlConfig::connect_timeout`], e.g. `5s`, `500ms`.
    ConnectTimeout,
    /// `response_timeout`: [`MysqlConfig::response_timeout`], same format.
    ResponseTimeout,
    /// `max_connections`: [`MysqlConfig::max_connections`].
    MaxConnections,
    /// `mode`: [`MysqlConfig::mode`], `row` or `named`.
    Mode,
    /// `ssl-mode` (or `sslmode`).
    SslMode,
    /// `ssl-ca` (or `sslca`).
    SslCa,
    /// `ssl-cert` (or `sslcert`).
    SslCert,
    /// `ssl-key` (or `sslkey`).
    SslKey,
}

impl FromStr for ConfigKey {
    type Err = LockError;

    fn from_str(key: &str) -> Result<Self> {
        match key {
            "table" => Ok(Self::Table),
            "connect_timeout" => Ok(Self::ConnectTimeout),
            "response_timeout" => Ok(Self::ResponseTimeout),
            "max_connections" => Ok(Self::MaxConnections),
            "mode" => Ok(Self::Mode),
            "ssl-mode" | "sslmode" => Ok(Self::SslMode),
            "ssl-ca" | "sslca" => Ok(Self::SslCa),
            "ssl-cert" | "sslcert" => Ok(Self::SslCert),
            "ssl-key" | "sslkey" => Ok(Self::SslKey),
            other => Err(LockError::invalid_config(
                NAME,
                format!(
                    "unknown option {other:?} (known: table, connect_timeout, response_timeout, \
                     max_connections, mode, ssl-mode, ssl-ca, ssl-cert, ssl-key)"
                ),
            )),
        }
    }
}

fn check_table(name: &str) -> Result<()> {
    let mut chars = name.chars();
    let ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= MysqlConfig::MAX_TABLE_LEN;
    if ok {
        Ok(())
    } else {
        Err(LockError::invalid_config(
            NAME,
            format!(
                "table {name:?} is not an identifier (a letter or _, then letters, digits or _, \
                 at most {} characters)",
                MysqlConfig::MAX_TABLE_LEN
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
mod tests {
    use super::*;
    use dlock_core::ErrorKind;

    type Check = fn(&MysqlConfig) -> bool;

    #[test]
    fn good_urls() {
        let cases: &[(&str, Check)] = &[
            ("mysql://dlock:dlock@127.0.0.1:3306/dlock", |c| {
                c.host == "127.0.0.1"
                    && c.port == 3306
                    && c.user == "dlock"
                    && c.password.as_ref().map(Secret::expose) == Some("dlock")
                    && c.database == "dlock"
                    && c.table == "dlock_locks"
                    && c.connect_timeout == Duration::from_secs(5)
                    && c.max_connections == 100
            }),
            ("mariadb://u@db.example/app", |c| {
                c.port == 3306 && c.password.is_none()
            }),
            ("mysql://u:p%40ss@h/d%2Dx", |c| {
                c.password.as_ref().map(Secret::expose) == Some("p@ss") && c.database == "d-x"
            }),
            ("mysql://u@[::1]:3307/d", |c| {
                c.host == "::1" && c.port == 3307 && c.addr() == "[::1]:3307"
            }),
            ("mysql://u@h/d?table=My_Locks2", |c| {
                c.table == "My_Locks2" && c.fence_table() == "My_Locks2_fence"
            }),
            (
                "mysql://u@h/d?connect_timeout=250ms&response_timeout=2s",
                |c| {
                    c.connect_timeout == Duration::from_millis(250)
                        && c.response_timeout == Duration::from_secs(2)
                },
            ),
            ("mysql://u@h/d?response_timeout=1500ms", |c| {
                c.response_timeout == Duration::from_millis(1500)
            }),
            ("mysql://u@h/d?mode=named", |c| c.mode == LockMode::Named),
            ("mysql://u@h/d?max_connections=7", |c| {
                c.max_connections == 7
            }),
            ("mysql://u@h/d?ssl-mode=VERIFY_CA&sslca=/etc/ca.pem", |c| {
                c.ssl_mode().ok() == Some(SslMode::VerifyCa)
                    && c.tls.ca.as_deref() == Some(std::path::Path::new("/etc/ca.pem"))
            }),
            (
                "mysql://u@h/d?sslmode=required&ssl-cert=/c&ssl-key=/k",
                |c| c.ssl_mode().ok() == Some(SslMode::Required) && c.tls.key.is_some(),
            ),
        ];
        for (url, check) in cases {
            let config = MysqlConfig::from_url(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(check(&config), "{url}: {config:?}");
            config.validate().unwrap();
        }
    }

    #[test]
    fn bad_urls_name_the_problem() {
        let cases = [
            ("not a url", "not a URL"),
            ("redis://u@h/d", "scheme"),
            ("mysql:///d", "host"),
            ("MySQL://u:sekrit/x@h/d", "percent-encode"),
            ("mysql://h/d", "user"),
            ("mysql://u@h", "database"),
            ("mysql://u@h/", "database"),
            ("mysql://u@h/a/b", "database"),
            ("mysql://u@h/d#frag", "fragment"),
            ("mysql://u@h:99999/d", "port"),
            ("mysql://u@h/d?colour=blue", "colour"),
            ("mysql://u@h/d?table=", "table"),
            ("mysql://u@h/d?table=a-b", "table"),
            ("mysql://u@h/d?table=1abc", "table"),
            ("mysql://u@h/d?table=x%60;DROP", "table"),
            ("mysql://u@h/d?connect_timeout=soon", "connect_timeout"),
            ("mysql://u@h/d?connect_timeout=0", "connect_timeout"),
            ("mysql://u@h/d?response_timeout=2h", "response_timeout"),
            ("mysql://u@h/d?max_connections=0", "max_connections"),
            ("mysql://u@h/d?mode=fast", "mode"),
            ("mysql://u@h/d?ssl-mode=sometimes", "ssl-mode"),
            ("mysql://u@h/d?ssl-ca=", "ssl-ca"),
        ];
        for (url, names) in cases {
            let err = MysqlConfig::from_url(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
            assert!(err.to_string().contains(names), "{url}: {err}");
        }
        let long = format!("mysql://u@h/d?table={}", "t".repeat(59));
        assert!(MysqlConfig::from_url(&long).is_err());
        let longest = format!("mysql://u@h/d?table={}", "t".repeat(58));
        MysqlConfig::from_url(&longest).unwrap();
    }

    #[test]
    fn password_never_shows() {
        let url = "mysql://dlock:hunter2-secret@h/d?colour=x";
        let err = MysqlConfig::from_url(url).unwrap_err();
        assert!(!format!("{err} {err:?}").contains("hunter2"));
        let config = MysqlConfig::from_url("mysql://dlock:hunter2-secret@h/d").unwrap();
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("hunter2") && shown.contains("<redacted>"),
            "{shown}"
        );
    }

    #[test]
    fn validate_checks_fields_set_directly() {
        let mut config = MysqlConfig::new("h", "u", "d");
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
            |password, host| format!("mysql://app:{password}@{host}:3306/dlock?table=t"),
            |url| MysqlConfig::from_url(url).map(|c| format!("{c:?}")),
        );
    }
}
