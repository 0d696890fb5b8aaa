//! TLS for `rediss://` and `redlocks://`: the rustls crypto provider, and telling TLS
//! failures from network ones.
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
//! So before building a TLS client, [`install_provider`] installs rustls's `ring` provider
//! as the process default unless one is installed already. An application that installed
//! its own provider first keeps it: it is its choice, and every TLS connection of this
//! crate then uses it. Otherwise the outcome is what redis-rs would have installed itself
//! when the features are unambiguous (ring, the provider this crate enables), and `ring`
//! instead of a panic when they are not. Building our own `ClientConfig` with
//! `builder_with_provider` would avoid the process default altogether, but redis-rs 1.x has
//! no way to take one (short of replacing its TCP and TLS connect with ours).

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

/// Make sure rustls has a process-default crypto provider: install `ring` unless one is
/// installed already (see the module docs). Never panics; cheap after the first call.
pub(crate) fn install_provider() {
    if CryptoProvider::get_default().is_none() {
        // An error means another thread installed one meanwhile: that one stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
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

    #[test]
    fn installing_the_provider_never_panics_and_keeps_the_first() {
        install_provider();
        let first = Arc::as_ptr(CryptoProvider::get_default().expect("installed"));
        install_provider();
        let again = Arc::as_ptr(CryptoProvider::get_default().expect("installed"));
        assert_eq!(first, again, "a provider already installed stays");
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
