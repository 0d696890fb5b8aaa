//! TLS for `zks://`: the client library's rustls connector, fed from the PEM files the
//! configuration names, with a process-wide crypto provider installed once.

use std::path::Path;

use dlock_core::{LockError, Result};
use zookeeper_client as zk;

use crate::NAME;
use crate::config::Tls;

/// The client library's TLS options for `tls`, reading its PEM files (local I/O only).
///
/// # Errors
/// [`LockError::InvalidConfig`] naming the option and file that cannot be read or used.
pub(crate) fn options(tls: &Tls) -> Result<zk::TlsOptions> {
    dlock_core::raw::install_crypto_provider();
    let ca = tls
        .ca
        .as_deref()
        .ok_or_else(|| LockError::invalid_config(NAME, "zks:// needs ca=PATH"))?;
    let mut options = zk::TlsOptions::new()
        .with_pem_ca(&read_pem("ca", ca)?)
        .map_err(|e| file_error("ca", ca, e))?;
    if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
        options = options
            .with_pem_identity(&read_pem("cert", cert)?, &read_pem("key", key)?)
            .map_err(|e| file_error("cert and key", cert, e))?;
    }
    Ok(options)
}

fn read_pem(option: &'static str, path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| LockError::InvalidConfig {
        backend: NAME,
        message: format!("cannot read the {option} file {}", path.display()),
        source: Some(Box::new(e)),
    })
}

fn file_error(option: &'static str, path: &Path, e: zk::Error) -> LockError {
    LockError::InvalidConfig {
        backend: NAME,
        message: format!("the {option} file {} is not usable", path.display()),
        source: Some(Box::new(e)),
    }
}

/// Why a TLS handshake with `host` (`name:port` or `[v6]:port`) fails, when it fails for a
/// TLS reason: the server's certificate is not trusted or does not name the host, or the
/// server refused ours (a fatal alert). `None` when the handshake succeeds or fails for
/// another reason (nothing listens, no answer within `within`, the connection is closed):
/// the client library reports all of these alike as "no host", which would read as an
/// outage worth retrying.
///
/// The handshake runs on a blocking thread with a plain socket and the same trust and
/// identity as the client library's.
pub(crate) async fn diagnose(tls: &Tls, host: &str, within: std::time::Duration) -> Option<String> {
    let config = client_config(tls)?;
    let (name, _) = host.rsplit_once(':')?;
    let name = name
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let server_name = rustls::pki_types::ServerName::try_from(name).ok()?;
    let host = host.to_owned();
    let handshake = move || {
        use std::net::ToSocketAddrs as _;
        let addr = host.to_socket_addrs().ok()?.next()?;
        let mut tcp = std::net::TcpStream::connect_timeout(&addr, within).ok()?;
        tcp.set_read_timeout(Some(within)).ok()?;
        tcp.set_write_timeout(Some(within)).ok()?;
        let mut conn = rustls::ClientConnection::new(config, server_name).ok()?;
        let tls_error = |e: std::io::Error| {
            e.get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                .map(ToString::to_string)
        };
        while conn.is_handshaking() {
            if let Err(e) = conn.complete_io(&mut tcp) {
                return tls_error(e);
            }
        }
        // With TLS 1.3 the server checks our certificate after our side of the handshake
        // is done: its refusal is the first thing it sends.
        let mut byte = [0_u8; 1];
        match std::io::Read::read(&mut rustls::Stream::new(&mut conn, &mut tcp), &mut byte) {
            Err(e) => tls_error(e),
            Ok(_) => None,
        }
    };
    tokio::task::spawn_blocking(handshake).await.ok().flatten()
}

/// A rustls client configuration like the client library's: the CA's roots, hostname
/// verification, the client certificate if any; `ring`.
fn client_config(tls: &Tls) -> Option<std::sync::Arc<rustls::ClientConfig>> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(tls.ca.as_ref()?).ok()? {
        roots.add(cert.ok()?).ok()?;
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .ok()?
        .with_root_certificates(roots);
    let config = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .ok()?
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            builder
                .with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(key).ok()?)
                .ok()?
        }
        _ => builder.with_no_client_auth(),
    };
    Some(std::sync::Arc::new(config))
}
