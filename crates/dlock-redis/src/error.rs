//! What can go wrong talking to one Redis server, and how it maps to [`LockError`].

use std::sync::Arc;
use std::time::Duration;

use dlock_core::LockError;
use redis::{ErrorKind as RedisKind, RedisError, RetryMethod};

/// A failed request to one server. Cloneable, so one failed connection attempt can answer
/// every caller that waited for it. Messages name the server as `host:port`, never with
/// credentials.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The client library reported an error (I/O, refused, reset, or a server error reply).
    #[error("{op} on {addr}: {source}")]
    Redis {
        /// The operation, e.g. `"acquire"`.
        op: &'static str,
        /// The server, `host:port`.
        addr: Arc<str>,
        /// The client library's error.
        #[source]
        source: RedisError,
    },
    /// The answer was not the Redis protocol: another kind of server on the port (a
    /// database, an HTTP server). The client library's parser message stays in the source.
    #[error(
        "{op} on {addr}: the server did not answer as Redis (another kind of server on this port?)"
    )]
    NotRedis {
        /// The operation.
        op: &'static str,
        /// The server.
        addr: Arc<str>,
        /// The client library's parse error.
        #[source]
        source: RedisError,
    },
    /// TLS failed (`rediss://`): the server's certificate is not trusted (signed by a CA
    /// the client does not trust, or not for this host), the server wants a client
    /// certificate or refused ours, or it answered with something that is not TLS. Not
    /// retryable: the same settings fail the same way.
    #[error("{op} on {addr}: TLS failed: {source}")]
    Tls {
        /// The operation.
        op: &'static str,
        /// The server.
        addr: Arc<str>,
        /// The client library's error, with the rustls error under it.
        #[source]
        source: RedisError,
    },
    /// No answer within the configured timeout.
    #[error("{op} on {addr}: no answer within {after:?}")]
    TimedOut {
        /// The operation.
        op: &'static str,
        /// The server.
        addr: Arc<str>,
        /// The timeout that ran out.
        after: Duration,
    },
    /// Sentinel named no master, or the server it named is not a master (yet): a failover
    /// is under way, or the master's name is wrong. Retryable: the next request asks the
    /// sentinels again.
    #[error("{op} on {addr}: {why}")]
    NoMaster {
        /// The operation.
        op: &'static str,
        /// The master's name and the sentinels.
        addr: Arc<str>,
        /// What the sentinels said.
        why: String,
    },
    /// The server answered something this protocol never returns.
    #[error("{op} on {addr}: unexpected reply {reply}")]
    Reply {
        /// The operation.
        op: &'static str,
        /// The server.
        addr: Arc<str>,
        /// The reply, abbreviated.
        reply: String,
    },
}

impl Error {
    pub(crate) fn redis(op: &'static str, addr: &Arc<str>, source: RedisError) -> Self {
        let addr = addr.clone();
        if source.kind() == RedisKind::Parse {
            Self::NotRedis { op, addr, source }
        } else if tls_failure(&source) {
            Self::Tls { op, addr, source }
        } else {
            Self::Redis { op, addr, source }
        }
    }

    pub(crate) fn timed_out(op: &'static str, addr: &Arc<str>, after: Duration) -> Self {
        Self::TimedOut {
            op,
            addr: addr.clone(),
            after,
        }
    }

    /// The operation that failed.
    pub fn op(&self) -> &'static str {
        match self {
            Self::Redis { op, .. }
            | Self::NotRedis { op, .. }
            | Self::Tls { op, .. }
            | Self::TimedOut { op, .. }
            | Self::NoMaster { op, .. }
            | Self::Reply { op, .. } => op,
        }
    }

    /// Whether the server could not be reached or did not answer (retryable), as opposed to
    /// a refusal or a reply that is not Redis.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Self::TimedOut { .. } | Self::NoMaster { .. } => true,
            Self::Reply { .. } | Self::NotRedis { .. } | Self::Tls { .. } => false,
            Self::Redis { source, .. } => {
                io_failure(source)
                    || source.is_connection_refusal()
                    || source.kind() == RedisKind::ClusterConnectionNotFound
                    || matches!(
                        source.retry_method(),
                        // LOADING, BUSY, TRYAGAIN, MASTERDOWN, READONLY (failover under way).
                        RetryMethod::WaitAndRetry | RetryMethod::RefreshSlotsAndRetry
                    )
            }
        }
    }

    /// Whether the connection that gave this error must be replaced: it broke, timed out
    /// (a silent peer), or is out of step with the protocol.
    pub(crate) fn breaks_connection(&self) -> bool {
        match self {
            Self::TimedOut { .. }
            | Self::NotRedis { .. }
            | Self::Tls { .. }
            | Self::NoMaster { .. } => true,
            Self::Reply { .. } => false,
            // A master demoted to a replica (a Sentinel failover) answers writes with
            // READONLY: reconnect, so the next request finds the new master.
            Self::Redis { source, .. } => {
                io_failure(source)
                    || source.kind() == RedisKind::Server(redis::ServerErrorKind::ReadOnly)
            }
        }
    }

    /// The connection to `addr` closed under a request (`what` says how).
    pub(crate) fn closed(op: &'static str, addr: &Arc<str>, what: &'static str) -> Self {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, what);
        Self::redis(op, addr, io.into())
    }

    /// The [`LockError`] for this failure, naming `backend`: [`LockError::Unavailable`] when
    /// the server could not be reached or timed out, [`LockError::Backend`] when it refused
    /// (wrong password, not a Redis server, TLS failed, a script error).
    pub fn into_lock_error(self, backend: &'static str) -> LockError {
        let op = self.op();
        if self.is_unavailable() {
            LockError::unavailable(backend, op, self)
        } else {
            LockError::backend(backend, op, self)
        }
    }
}

/// The error is rustls's: TLS failed, as opposed to the network.
fn tls_failure(source: &RedisError) -> bool {
    #[cfg(feature = "tls")]
    {
        crate::tls::is_tls_error(source)
    }
    #[cfg(not(feature = "tls"))]
    {
        let _ = source;
        false
    }
}

/// The connection failed or went silent (as opposed to an answer from the server).
fn io_failure(source: &RedisError) -> bool {
    source.is_io_error() || source.is_timeout() || source.is_connection_dropped()
}

impl From<Error> for LockError {
    fn from(e: Error) -> Self {
        e.into_lock_error(crate::NAME)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::ErrorKind;

    fn addr() -> Arc<str> {
        Arc::from("127.0.0.1:6379")
    }

    #[test]
    fn unreachable_is_unavailable_and_refusals_are_backend() {
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let e: LockError = Error::redis("connect", &addr(), refused).into();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        let e: LockError = Error::timed_out("acquire", &addr(), Duration::from_secs(2)).into();
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("127.0.0.1:6379"), "{e}");
        let auth = RedisError::from((RedisKind::AuthenticationFailed, "WRONGPASS"));
        let e: LockError = Error::redis("connect", &addr(), auth).into();
        assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
        let parse = RedisError::from((RedisKind::Parse, "Incompatible type - Parse error at 1"));
        let err = Error::redis("connect", &addr(), parse);
        assert!(err.breaks_connection());
        let e = err.into_lock_error("redlock");
        assert_eq!(e.kind(), ErrorKind::Backend);
        let text = e.to_string();
        assert!(text.contains("did not answer as Redis"), "{text}");
        assert!(
            !text.contains("Incompatible"),
            "the raw parser message stays in the source: {text}"
        );
    }

    #[test]
    fn a_demoted_master_or_no_master_is_unavailable_and_reconnects() {
        let readonly = RedisError::from((
            RedisKind::Server(redis::ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        let err = Error::redis("acquire", &addr(), readonly);
        assert!(err.breaks_connection(), "{err}");
        assert!(err.is_unavailable(), "{err}");
        let none = Error::NoMaster {
            op: "connect",
            addr: Arc::from("master dlock via 127.0.0.1:26379"),
            why: "sentinel 127.0.0.1:26379 knows no master by that name".into(),
        };
        assert!(none.breaks_connection());
        let e = none.into_lock_error("redis");
        assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
        assert!(e.to_string().contains("master dlock"), "{e}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn tls_failures_are_refusals_that_break_the_connection() {
        let untrusted = rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer);
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, untrusted);
        let err = Error::redis("connect", &addr(), io.into());
        assert!(matches!(err, Error::Tls { .. }), "{err:?}");
        assert!(err.breaks_connection());
        assert!(!err.is_unavailable());
        let e = err.into_lock_error("redis");
        assert_eq!(e.kind(), ErrorKind::Backend, "{e}");
        assert!(e.to_string().contains("TLS failed"), "{e}");
        assert!(e.to_string().contains("UnknownIssuer"), "{e}");
    }
}
