//! The TLS policy: what the `ssl-mode`, `ssl-ca`, `ssl-cert` and `ssl-key` options resolve
//! to, and when a password goes out unprotected.
//!
//! A CA or a client certificate asks for TLS, so without `ssl-mode` it means
//! `verify_identity`; with no TLS option the mode stays sqlx's `preferred`, so a local
//! server without TLS works. Combinations sqlx would half-honour (dropping a file or a
//! check the URL asked for) are refused. A password going to a host that is not loopback,
//! over a connection whose server is not verified, is flagged for a warning at connect.
//! The crate docs' *Security* says why.

use std::path::PathBuf;
use std::str::FromStr;

use dlock_core::{LockError, Result, Secret};
use sqlx::mysql::{MySqlConnectOptions, MySqlSslMode};

use crate::NAME;

/// TLS settings as the URL gave them; [`Tls::mode`] resolves what sqlx is told.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tls {
    /// `ssl-mode`, if given.
    pub(crate) mode: Option<SslMode>,
    pub(crate) ca: Option<PathBuf>,
    pub(crate) cert: Option<PathBuf>,
    pub(crate) key: Option<PathBuf>,
}

/// The `ssl-mode` values: sqlx's [`MySqlSslMode`], which has no `PartialEq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    /// Plain text.
    Disabled,
    /// TLS if the server offers it, plain text if not; the certificate is not checked.
    Preferred,
    /// TLS or fail; the certificate is not checked (encryption without authentication).
    Required,
    /// TLS; the certificate must chain to `ssl-ca`; meant to accept any name (sqlx 0.8.6
    /// with rustls ≥ 0.23.24 checks the name too: sqlx issue #3793).
    VerifyCa,
    /// TLS; the certificate must chain to `ssl-ca` (or a public root) and name the host.
    VerifyIdentity,
}

impl SslMode {
    const ALL: [Self; 5] = [
        Self::Disabled,
        Self::Preferred,
        Self::Required,
        Self::VerifyCa,
        Self::VerifyIdentity,
    ];

    /// The option value, as the URL spells it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Preferred => "preferred",
            Self::Required => "required",
            Self::VerifyCa => "verify_ca",
            Self::VerifyIdentity => "verify_identity",
        }
    }

    /// Whether the server must prove who it is (its certificate is checked against a CA).
    fn verifies(self) -> bool {
        matches!(self, Self::VerifyCa | Self::VerifyIdentity)
    }

    fn to_sqlx(self) -> MySqlSslMode {
        match self {
            Self::Disabled => MySqlSslMode::Disabled,
            Self::Preferred => MySqlSslMode::Preferred,
            Self::Required => MySqlSslMode::Required,
            Self::VerifyCa => MySqlSslMode::VerifyCa,
            Self::VerifyIdentity => MySqlSslMode::VerifyIdentity,
        }
    }
}

impl FromStr for SslMode {
    type Err = ();

    /// Case-insensitive, as sqlx and the MySQL client read it (`VERIFY_IDENTITY` works).
    fn from_str(value: &str) -> std::result::Result<Self, ()> {
        Self::ALL
            .into_iter()
            .find(|mode| mode.name().eq_ignore_ascii_case(value))
            .ok_or(())
    }
}

impl Tls {
    /// The mode the connection uses, or why the settings are refused.
    ///
    /// - No `ssl-mode`: `verify_identity` when any file is given (asking for TLS means
    ///   asking for a checked server), `preferred` when none is (sqlx's default, kept so a
    ///   local server without TLS works; [`Tls::login_exposed`] warns about it).
    /// - Refused, since sqlx would silently drop a file or a check the URL asked for:
    ///   `ssl-ca` with a mode that does not verify (sqlx ignores the CA there), any file
    ///   with `disabled` or `preferred` (a plain-text fallback of a connection that named
    ///   TLS files), `verify_ca` without `ssl-ca` (every certificate any public CA issued,
    ///   for any name, would pass), and `ssl-cert` without `ssl-key` or the reverse.
    pub(crate) fn mode(&self) -> Result<SslMode> {
        let files = self.ca.is_some() || self.cert.is_some() || self.key.is_some();
        if self.cert.is_some() != self.key.is_some() {
            return Err(LockError::invalid_config(
                NAME,
                "ssl-cert and ssl-key go together (the client certificate and its key)",
            ));
        }
        let Some(mode) = self.mode else {
            return Ok(if files {
                SslMode::VerifyIdentity
            } else {
                SslMode::Preferred
            });
        };
        let refused = match mode {
            SslMode::Disabled if files => Some(
                "turns TLS off, yet TLS files (ssl-ca, ssl-cert, ssl-key) are given; drop \
                 one or the other",
            ),
            SslMode::Preferred if files => Some(
                "falls back to plain text and does not check the server's certificate, yet \
                 TLS files are given; use ssl-mode=verify_identity (the default when a file \
                 is given)",
            ),
            SslMode::Required if self.ca.is_some() => Some(
                "does not check the server's certificate, so ssl-ca would be ignored; use \
                 ssl-mode=verify_identity (or verify_ca) to check it against ssl-ca",
            ),
            SslMode::VerifyCa if self.ca.is_none() => Some(
                "without ssl-ca accepts a certificate any public CA issued, for any name; \
                 give ssl-ca, or use verify_identity to check the host name too",
            ),
            _ => None,
        };
        match refused {
            Some(why) => Err(LockError::invalid_config(
                NAME,
                format!("ssl-mode={} {why}", mode.name()),
            )),
            None => Ok(mode),
        }
    }

    /// The files given, by option name.
    fn files(&self) -> impl Iterator<Item = (&'static str, &PathBuf)> {
        [
            ("ssl-ca", &self.ca),
            ("ssl-cert", &self.cert),
            ("ssl-key", &self.key),
        ]
        .into_iter()
        .filter_map(|(name, path)| path.as_ref().map(|path| (name, path)))
    }

    /// Check that the files can be read, so a wrong path is a config error at connect
    /// rather than an I/O error at every connection sqlx opens. Reads the local files only.
    pub(crate) fn check_files(&self) -> Result<()> {
        for (option, path) in self.files() {
            // Read whole (PEM files are small): a directory or an unreadable file fails.
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

    /// Whether a password would go to another machine over a connection whose server is
    /// not verified: without `verify_ca`/`verify_identity`, whoever answers for the host
    /// can ask sqlx for the password in clear (`mysql_clear_password`, or
    /// `caching_sha2_password` over unchecked TLS). Loopback hosts are exempt: that
    /// traffic does not leave the machine.
    pub(crate) fn login_exposed(&self, password: Option<&Secret>, host: &str) -> bool {
        password.is_some_and(|p| !p.expose().is_empty())
            && !self.mode().is_ok_and(SslMode::verifies)
            && !is_loopback(host)
    }

    /// `opts` with these TLS settings: the resolved mode and the files.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for options that do not go together.
    pub(crate) fn connect_options(
        &self,
        mut opts: MySqlConnectOptions,
    ) -> Result<MySqlConnectOptions> {
        opts = opts.ssl_mode(self.mode()?.to_sqlx());
        if let Some(ca) = &self.ca {
            opts = opts.ssl_ca(ca);
        }
        if let Some(cert) = &self.cert {
            opts = opts.ssl_client_cert(cert);
        }
        if let Some(key) = &self.key {
            opts = opts.ssl_client_key(key);
        }
        Ok(opts)
    }
}

/// Whether `host` names this machine: `localhost` or a loopback address. Only the text is
/// read; names are not resolved.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MysqlConfig;
    use dlock_core::ErrorKind;

    /// The TLS policy: which mode each combination of options gets, and which are refused.
    #[test]
    fn tls_mode_resolution() {
        use SslMode::*;
        let resolves: &[(&str, SslMode)] = &[
            // Nothing asked: sqlx's default, so a local server without TLS works.
            ("", Preferred),
            // A file asks for TLS: the server is verified, name included.
            ("ssl-ca=/ca.pem", VerifyIdentity),
            ("sslca=/ca.pem", VerifyIdentity),
            ("ssl-cert=/c.pem&ssl-key=/k.pem", VerifyIdentity),
            (
                "ssl-ca=/ca.pem&ssl-cert=/c.pem&ssl-key=/k.pem",
                VerifyIdentity,
            ),
            // The order of the options does not matter.
            ("ssl-ca=/ca.pem&ssl-mode=verify_ca", VerifyCa),
            ("ssl-mode=verify_ca&ssl-ca=/ca.pem", VerifyCa),
            // Explicit modes are kept.
            ("ssl-mode=disabled", Disabled),
            ("ssl-mode=preferred", Preferred),
            ("ssl-mode=required", Required),
            ("ssl-mode=Required&ssl-cert=/c.pem&ssl-key=/k.pem", Required),
            ("ssl-mode=verify_identity", VerifyIdentity),
            ("ssl-mode=verify_identity&ssl-ca=/ca.pem", VerifyIdentity),
            ("ssl-mode=VERIFY_IDENTITY&ssl-ca=/ca.pem", VerifyIdentity),
        ];
        for (query, mode) in resolves {
            let url = format!("mysql://u:p@db.example/d?{query}");
            let config = MysqlConfig::from_url(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!(config.ssl_mode().ok(), Some(*mode), "{url}");
            config.validate().unwrap();
            config.connect_options().unwrap();
        }
        // Refused: sqlx would drop a file or a check the URL asked for.
        let refused = [
            (
                "ssl-mode=disabled&ssl-ca=/ca.pem",
                "ssl-mode=disabled turns TLS off",
            ),
            ("ssl-mode=disabled&ssl-cert=/c&ssl-key=/k", "turns TLS off"),
            (
                "ssl-mode=preferred&ssl-ca=/ca.pem",
                "falls back to plain text",
            ),
            (
                "ssl-mode=preferred&ssl-cert=/c&ssl-key=/k",
                "falls back to plain text",
            ),
            (
                "ssl-mode=required&ssl-ca=/ca.pem",
                "ssl-ca would be ignored",
            ),
            (
                "ssl-ca=/ca.pem&ssl-mode=required",
                "ssl-ca would be ignored",
            ),
            ("ssl-mode=verify_ca", "without ssl-ca"),
            (
                "ssl-mode=verify_ca&ssl-cert=/c&ssl-key=/k",
                "without ssl-ca",
            ),
            ("ssl-cert=/c", "ssl-cert and ssl-key go together"),
            (
                "ssl-ca=/ca.pem&ssl-key=/k",
                "ssl-cert and ssl-key go together",
            ),
        ];
        for (query, names) in refused {
            let url = format!("mysql://u:p@db.example/d?{query}");
            let err = MysqlConfig::from_url(&url).expect_err(&url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
            assert!(err.to_string().contains(names), "{url}: {err}");
        }
        // Built option by option, the combination is checked by validate (at connect).
        let config = MysqlConfig::new("h", "u", "d")
            .with_option("ssl-ca", "/ca.pem")
            .and_then(|c| c.with_option("ssl-mode", "required"))
            .expect("each option alone is fine");
        assert_eq!(
            config.validate().unwrap_err().kind(),
            ErrorKind::InvalidConfig
        );
        assert!(config.connect_options().is_err());
    }

    #[test]
    fn a_password_to_a_remote_unverified_server_is_flagged() {
        let exposed = |url: &str| {
            MysqlConfig::from_url(url)
                .unwrap_or_else(|e| panic!("{url}: {e}"))
                .login_exposed()
        };
        for url in [
            "mysql://u:p@db.example/d",
            "mysql://u:p@db.example/d?ssl-mode=preferred",
            "mysql://u:p@db.example/d?ssl-mode=required",
            "mysql://u:p@db.example/d?ssl-mode=disabled",
            "mysql://u:p@10.0.0.5:3306/d?ssl-mode=required&ssl-cert=/c&ssl-key=/k",
            "mysql://u:p@[2001:db8::1]/d",
            // Not loopback by its text: names are not resolved.
            "mysql://u:p@localhost.example/d",
            "mysql://u:p@127.0.0.1.nip.io/d",
        ] {
            assert!(exposed(url), "{url}");
        }
        for url in [
            // Verified TLS.
            "mysql://u:p@db.example/d?ssl-ca=/ca.pem",
            "mysql://u:p@db.example/d?ssl-mode=verify_identity",
            "mysql://u:p@db.example/d?ssl-mode=verify_ca&ssl-ca=/ca.pem",
            // No password.
            "mysql://u@db.example/d",
            "mysql://u:@db.example/d",
            // Loopback: the traffic does not leave the machine.
            "mysql://u:p@127.0.0.1/d",
            "mysql://u:p@127.1.2.3:3307/d?ssl-mode=disabled",
            "mysql://u:p@localhost/d",
            "mysql://u:p@LocalHost./d",
            "mysql://u:p@[::1]/d",
            "mysql://u:p@[::ffff:127.0.0.1]/d",
        ] {
            assert!(!exposed(url), "{url}");
        }
    }

    #[test]
    fn unreadable_tls_files_are_config_errors() {
        let config =
            MysqlConfig::from_url("mysql://u:p@h/d?ssl-ca=/nonexistent/dlock-test-ca.pem").unwrap();
        let err = config.check_tls_files().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
        assert!(
            err.to_string()
                .contains("ssl-ca: cannot read /nonexistent/dlock-test-ca.pem"),
            "{err}"
        );
        let dir = MysqlConfig::from_url("mysql://u:p@h/d?ssl-ca=/").unwrap();
        let err = dir.check_tls_files().unwrap_err();
        assert!(err.to_string().contains("ssl-ca: cannot read /:"), "{err}");
        MysqlConfig::from_url("mysql://u:p@h/d")
            .unwrap()
            .check_tls_files()
            .unwrap();
    }
}
