//! What a backend crate needs and an application does not: the implementor API.
//!
//! A backend implements the server protocol only ([`Backend`] for acquire, [`Held`] for
//! what a grant keeps: extend, release, loss). [`LockClient`] turns it into a
//! [`DistributedLock`](crate::DistributedLock) and adds, once for every backend: key checks
//! ([`key`]), the process-local gate, one [`Deadline`] per acquire, late-grant
//! confirmation, the renewal watchdog and the lost signal. [`url`] is the one URL parser
//! every backend's `from_url` uses, and [`parse_duration`] the one spelling of durations in
//! it. [`spawn_cleanup`] runs the background clean-up that [`settle`](crate::settle) waits
//! for. [`renewal_due`] and [`renewal_retry`] are the watchdog's schedule, for a backend
//! that keeps a lease alive while it waits for its turn.
//!
//! Applications use the crate root; nothing here is needed to take a lock.

pub(crate) mod backend;
pub mod carrier;
pub(crate) mod client;
pub(crate) mod deadline;
mod duration;
pub(crate) mod gate;
pub mod key;
pub(crate) mod pending;
pub mod url;
pub(crate) mod watchdog;

pub use crate::background::spawn_cleanup;
pub use backend::{Backend, Grant, Held};
pub use client::LockClient;
pub use deadline::Deadline;
pub use duration::parse_duration;
pub use watchdog::{renewal_due, renewal_retry};

/// Make sure rustls has a process-default crypto provider, installing `ring` unless one is
/// installed already. Never panics; cheap after the first call.
///
/// Several client libraries (redis-rs, zookeeper-client, sqlx with a CA file) build their
/// rustls configuration with `ClientConfig::builder()`, which uses the process default and,
/// when none is installed, picks one from rustls's crate features: it panics when they name
/// more than one (a binary that links `aws-lc-rs`, rustls's default, beside the workspace's
/// `ring`) or none. A backend calls this before it opens a TLS connection. An application
/// that installed its own provider first keeps it: every TLS connection then uses that one.
#[cfg(feature = "rustls")]
pub fn install_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // `Err` only when another thread installed one meanwhile: that one stays.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
