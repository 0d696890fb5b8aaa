//! The backend's private error, and its one conversion into [`LockError`].

use std::time::Duration;

use dlock_core::LockError;

use crate::NAME;

/// `lock_not_available`: `lock_timeout` ran out while waiting for the lock.
const LOCK_NOT_AVAILABLE: &str = "55P03";
/// `out_of_memory` in the lock table: the server's advisory locks fill
/// `max_locks_per_transaction × (max_connections + max_prepared_transactions)` entries.
const OUT_OF_SHARED_MEMORY: &str = "53200";
/// `unique_violation` (two clients creating the same key row, or the same table, at once).
const UNIQUE_VIOLATION: &str = "23505";
/// `duplicate_table` / `duplicate_object`: a concurrent `CREATE … IF NOT EXISTS`.
const DUPLICATE: &[&str] = &["42P07", "42710"];
/// SQLSTATEs that mean the server ended the session: `admin_shutdown` (terminated, server
/// stopping), `crash_shutdown`, `cannot_connect_now`, `idle_session_timeout`. (The
/// connection exception class `08` is matched by prefix in `is_connection_lost`.)
const SESSION_GONE: &[&str] = &["57P01", "57P02", "57P03", "57P05"];

/// What went wrong talking to the server.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The client library or the server reported an error.
    #[error("{source}")]
    Sql {
        op: &'static str,
        #[source]
        source: sqlx::Error,
    },
    /// Every connection of the pool was in use for the connect timeout.
    #[error(
        "all {limit} lock connections stayed in use for {after:?}: each waiting acquire and \
         each holder connection takes one (raise the URL option max_connections)"
    )]
    Exhausted { limit: u32, after: Duration },
    /// The TLS handshake failed: the server's certificate did not pass the `sslmode` check,
    /// or the server refused ours. Trying again gives the same answer.
    #[error("TLS handshake refused: {source}")]
    TlsRefused {
        #[source]
        source: sqlx::Error,
    },
    /// The server did not answer within the response (or connect) timeout.
    #[error("no answer from {addr} within {after:?}")]
    NoAnswer {
        op: &'static str,
        addr: String,
        after: Duration,
    },
    /// The server's shared lock table is full: every advisory lock held on the server (by
    /// any client) takes an entry.
    #[error(
        "the server's lock table is full ({source}): raise the server setting \
         max_locks_per_transaction (the table holds max_locks_per_transaction × \
         (max_connections + max_prepared_transactions) locks, shared by all sessions)"
    )]
    LockTableFull {
        #[source]
        source: sqlx::Error,
    },
    /// The server answered something the backend cannot use.
    #[error("{op}: {what}")]
    Unexpected { op: &'static str, what: String },
}

impl Error {
    pub(crate) fn sql(op: &'static str) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| Self::Sql { op, source }
    }

    /// For a failed connect: rustls reports a rejected certificate as an I/O error of kind
    /// `InvalidData`, which the socket never gives otherwise.
    pub(crate) fn connect(source: sqlx::Error) -> Self {
        match &source {
            sqlx::Error::Io(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                Self::TlsRefused { source }
            }
            sqlx::Error::Tls(_) => Self::TlsRefused { source },
            _ => Self::Sql {
                op: "connect",
                source,
            },
        }
    }

    fn code(&self) -> Option<String> {
        match self {
            Self::Sql {
                source: sqlx::Error::Database(e),
                ..
            } => e.code().map(|c| c.into_owned()),
            _ => None,
        }
    }

    /// This error, or [`Error::LockTableFull`] when it says the lock table is full.
    pub(crate) fn lock_table_full(self) -> Self {
        match self {
            Self::Sql { source, .. } if matches!(&source, sqlx::Error::Database(d) if d.code().as_deref() == Some(OUT_OF_SHARED_MEMORY)) => {
                Self::LockTableFull { source }
            }
            e => e,
        }
    }

    /// `lock_timeout` ran out: the key stayed held until the deadline.
    pub(crate) fn is_lock_timeout(&self) -> bool {
        self.code().as_deref() == Some(LOCK_NOT_AVAILABLE)
    }

    /// A concurrent creation of the same row or table; trying again finds it.
    pub(crate) fn is_duplicate(&self) -> bool {
        self.code()
            .is_some_and(|c| c == UNIQUE_VIOLATION || DUPLICATE.contains(&c.as_str()))
    }

    /// The server ended the session and said so (an administrator's terminate, its idle
    /// session timeout, a shutdown). Found on a pooled connection, that is the message it
    /// left while the connection was idle: the statement sent after it never ran.
    pub(crate) fn is_session_ended(&self) -> bool {
        self.code()
            .is_some_and(|c| SESSION_GONE.contains(&c.as_str()))
    }

    /// The connection is unusable: closed, reset, terminated, or silent. Whatever its
    /// session held is gone (or will be, when the server notices).
    pub(crate) fn is_connection_lost(&self) -> bool {
        match self {
            Self::NoAnswer { .. } => true,
            Self::Exhausted { .. }
            | Self::TlsRefused { .. }
            | Self::Unexpected { .. }
            | Self::LockTableFull { .. } => false,
            Self::Sql { source, .. } => match source {
                sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
                sqlx::Error::Database(_) => self
                    .code()
                    .is_some_and(|c| c.starts_with("08") || SESSION_GONE.contains(&c.as_str())),
                _ => false,
            },
        }
    }
}

impl From<Error> for LockError {
    fn from(e: Error) -> Self {
        let op = match &e {
            Error::Sql { op, .. } | Error::NoAnswer { op, .. } | Error::Unexpected { op, .. } => {
                *op
            }
            Error::Exhausted { .. } | Error::TlsRefused { .. } => "connect",
            Error::LockTableFull { .. } => "acquire",
        };
        if e.is_connection_lost() {
            return LockError::unavailable(NAME, op, e);
        }
        match &e {
            Error::Exhausted { .. } => LockError::unavailable(NAME, op, e),
            Error::Sql {
                source: sqlx::Error::Configuration(_),
                ..
            } => LockError::InvalidConfig {
                backend: NAME,
                message: format!("{op}: {e}"),
                source: Some(Box::new(e)),
            },
            _ => LockError::backend(NAME, op, e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::ErrorKind;

    #[test]
    fn io_and_silence_are_unavailable_refusals_are_backend() {
        let io = Error::Sql {
            op: "connect",
            source: sqlx::Error::Io(std::io::ErrorKind::ConnectionRefused.into()),
        };
        assert_eq!(LockError::from(io).kind(), ErrorKind::Unavailable);
        let silent = Error::NoAnswer {
            op: "acquire",
            addr: "127.0.0.1:5432".into(),
            after: Duration::from_secs(5),
        };
        assert_eq!(LockError::from(silent).kind(), ErrorKind::Unavailable);
        let busy = Error::Exhausted {
            limit: 100,
            after: Duration::from_secs(5),
        };
        assert_eq!(LockError::from(busy).kind(), ErrorKind::Unavailable);
        let rejected = std::io::Error::new(std::io::ErrorKind::InvalidData, "UnknownIssuer");
        let tls = Error::connect(sqlx::Error::Io(rejected));
        assert!(matches!(tls, Error::TlsRefused { .. }));
        assert_eq!(LockError::from(tls).kind(), ErrorKind::Backend);
    }
}
