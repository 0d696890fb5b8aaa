//! TLS for `rediss://` and `redlocks://`: the rustls crypto provider, and the `ca`, `cert`
//! and `key` files turned into what redis-rs takes.
//!
//! # Why this crate installs a process-default crypto provider
//!
//! redis-rs (1.x, feature `tokio-rustls-comp`) builds its rustls `ClientConfig` itself, on
//! every connect, with `ClientConfig::builder()`; it takes certificates from us, but no
//! config and no provider. That builder uses rustls's *process-default* `CryptoProvider`.
//! When none is installed, rustls installs the one its crate features name, and panics when
//! they name none or more than one: a binary in which some other dependency enables rustls's
//! `aws-lc-rs` (its default) beside the `ring` this crate enables, or `custom-provider`, panics
//! on its first `rediss://` connect.
//!
//! So before building a TLS client, [`dlock_core::raw::install_crypto_provider`] installs rustls's `ring` provider
//! as the process default unless one is installed already. An application that installed
//! its own provider first keeps it: it is its choice, and every TLS connection of this
//! crate then uses it. Otherwise the outcome is what redis-rs would have installed itself
//! when the features are unambiguous (ring, the provider this crate enables), and `ring`
//! instead of a panic when they are not. Building our own `ClientConfig` with
//! `builder_with_provider` would avoid the process default altogether, but redis-rs 1.x has
//! no way to take one (short of replacing its TCP and TLS connect with ours).

use std::path::Path;
use std::sync::Arc;

use dlock_core::{LockError, Result};
use redis::{ClientTlsConfig, TlsCertificates};
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::NAME;
use crate::config::RedisConfig;

/// The provider TLS connections use: the process default, which
/// [`dlock_core::raw::install_crypto_provider`] made
/// sure exists.
fn provider() -> Arc<CryptoProvider> {
    dlock_core::raw::install_crypto_provider();
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// The certificates the `ca`, `cert` and `key` options name, read and checked: every file
/// readable, PEM of the right kind, the key the certificate's. `None` when no option is set
/// (the system's roots, no client certificate). Local file I/O only; errors name the option
/// and the path, never the files' contents.
///
/// # Errors
/// [`LockError::InvalidConfig`].
pub(crate) fn certificates(config: &RedisConfig) -> Result<Option<TlsCertificates>> {
    let ca = match &config.ca {
        Some(path) => {
            let pem = read("ca", path)?;
            Some((roots(path, &pem)?, pem))
        }
        None => None,
    };
    let identity = match (&config.cert, &config.key) {
        (Some(cert_path), Some(key_path)) => {
            let cert = read("cert", cert_path)?;
            let key = read("key", key_path)?;
            check_identity(cert_path, &cert, key_path, &key)?;
            Some(ClientTlsConfig {
                client_cert: cert,
                client_key: key,
            })
        }
        _ => None,
    };
    if ca.is_none() && identity.is_none() {
        return Ok(None);
    }
    Ok(Some(TlsCertificates {
        client_tls: identity,
        root_cert: ca.map(|(_, pem)| pem),
    }))
}

fn read(option: &str, path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| LockError::InvalidConfig {
        backend: NAME,
        message: format!("cannot read the {option} file {}", path.display()),
        source: Some(Box::new(e)),
    })
}

/// An error about the file of `option`. PEM parse errors are not kept as the source: some
/// quote a line of the file, and a key file's lines are the key.
fn bad(option: &str, path: &Path, what: &str) -> LockError {
    LockError::invalid_config(NAME, format!("the {option} file {} {what}", path.display()))
}

fn certs(option: &str, path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| bad(option, path, "is not valid PEM"))?;
    if certs.is_empty() {
        return Err(bad(
            option,
            path,
            "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
        ));
    }
    Ok(certs)
}

fn roots(path: &Path, pem: &[u8]) -> Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in certs("ca", path, pem)? {
        roots.add(cert).map_err(|e| LockError::InvalidConfig {
            backend: NAME,
            message: format!(
                "the ca file {} holds a certificate that cannot be a trust anchor",
                path.display()
            ),
            source: Some(Box::new(e)),
        })?;
    }
    Ok(roots)
}

/// The client certificate and key parse, and the key is the certificate's: checked by
/// building a throw-away rustls config with the provider the connections will use.
fn check_identity(cert_path: &Path, cert: &[u8], key_path: &Path, key: &[u8]) -> Result<()> {
    let chain = certs("cert", cert_path, cert)?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|_| {
        bad(
            "key",
            key_path,
            "holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
        )
    })?;
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| LockError::InvalidConfig {
            backend: NAME,
            message: "the TLS crypto provider supports no TLS version".into(),
            source: Some(Box::new(e)),
        })?
        .with_root_certificates(RootCertStore::empty());
    match builder.with_client_auth_cert(chain, key) {
        Ok(_) => Ok(()),
        Err(rustls::Error::InconsistentKeys(_)) => Err(LockError::invalid_config(
            NAME,
            format!(
                "the key file {} is not the key of the certificate in the cert file {}",
                key_path.display(),
                cert_path.display()
            ),
        )),
        Err(e) => Err(LockError::InvalidConfig {
            backend: NAME,
            message: format!(
                "the cert file {} and key file {} cannot be used",
                cert_path.display(),
                key_path.display()
            ),
            source: Some(Box::new(e)),
        }),
    }
}

/// Whether `e` (or an error under it) is a rustls error: a TLS handshake or record that
/// failed, as opposed to the network. redis-rs keeps an I/O error behind an `Arc`, and
/// tokio-rustls keeps the rustls error inside an I/O error.
pub(crate) fn is_tls_error(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        if e.is::<rustls::Error>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return true;
        }
        if let Some(shared) = e.downcast_ref::<Arc<dyn std::error::Error + Send + Sync>>()
            && is_tls_error(&**shared)
        {
            return true;
        }
        cause = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::ErrorKind;

    #[test]
    fn installing_the_provider_never_panics_and_keeps_the_first() {
        dlock_core::raw::install_crypto_provider();
        let first = Arc::as_ptr(CryptoProvider::get_default().expect("installed"));
        dlock_core::raw::install_crypto_provider();
        let again = Arc::as_ptr(CryptoProvider::get_default().expect("installed"));
        assert_eq!(first, again, "a provider already installed stays");
    }

    #[test]
    fn no_files_is_no_certificates() {
        let mut config = RedisConfig::new("h", 6379);
        config.tls = true;
        assert!(certificates(&config).unwrap().is_none());
    }

    #[test]
    fn unreadable_and_malformed_files_are_invalid_config_naming_option_and_path() {
        let dir = std::env::temp_dir().join(format!("dlock-redis-tls-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&dir).unwrap();
        let secret = dir.join("secret.pem");
        std::fs::write(&secret, "not pem at all: sekrit-key-material\n").unwrap();
        let missing = dir.join("missing.pem");
        let base = {
            let mut c = RedisConfig::new("h", 6379);
            c.tls = true;
            c
        };
        let cases = [
            (
                RedisConfig {
                    ca: Some(missing.clone()),
                    ..base.clone()
                },
                "cannot read the ca file",
                &missing,
            ),
            (
                RedisConfig {
                    ca: Some(secret.clone()),
                    ..base.clone()
                },
                "the ca file",
                &secret,
            ),
            (
                RedisConfig {
                    cert: Some(secret.clone()),
                    key: Some(missing.clone()),
                    ..base.clone()
                },
                "cannot read the key file",
                &missing,
            ),
            (
                RedisConfig {
                    cert: Some(secret.clone()),
                    key: Some(secret.clone()),
                    ..base.clone()
                },
                "the cert file",
                &secret,
            ),
        ];
        for (config, needle, path) in cases {
            let err = certificates(&config).expect_err(needle);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
            let text = format!("{err} {err:?}");
            assert!(text.contains(needle), "{text}");
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(!text.contains("sekrit"), "never the contents: {text}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rustls_errors_are_found_under_io_errors() {
        let rustls_error =
            rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, rustls_error);
        assert!(is_tls_error(&redis::RedisError::from(io)));
        let plain = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(!is_tls_error(&redis::RedisError::from(plain)));
    }
}
