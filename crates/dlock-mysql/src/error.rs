//! The backend's private error, and its one conversion into [`LockError`].

use std::time::Duration;

use dlock_core::LockError;

use crate::NAME;

/// MariaDB and MySQL: a lock wait timed out (also MariaDB's answer to `NOWAIT`).
const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;
/// MySQL 8: `NOWAIT` found the row locked.
const ER_LOCK_NOWAIT: u16 = 3572;
/// `KILL QUERY` (or a statement timeout) interrupted the statement.
const ER_QUERY_INTERRUPTED: u16 = 1317;
/// InnoDB picked this transaction as a deadlock victim.
const ER_LOCK_DEADLOCK: u16 = 1213;
/// An insert found the key taken (another client created the row just before).
const ER_DUP_ENTRY: u16 = 1062;
/// The server holds `max_prepared_stmt_count` prepared statements already (all sessions).
const ER_MAX_PREPARED_STMT_COUNT_REACHED: u16 = 1461;
/// Server errors that mean the session is gone: shutdown in progress (1053), MariaDB's
/// "connection was killed" (1927), MySQL 8's "session was killed" (3169) and idle
/// disconnect (4031).
const SESSION_GONE: &[u16] = &[1053, 1927, 3169, 4031];

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
    /// Every connection of the pool was in use (holding or waiting) for the connect timeout.
    #[error(
        "all {limit} lock connections stayed in use for {after:?}: each waiting acquire and \
         each holder connection takes one (raise the URL option max_connections)"
    )]
    Exhausted { limit: u32, after: Duration },
    /// The TLS handshake failed: the server's certificate did not pass the check `ssl-mode`
    /// asks for (unknown CA, another name, expired), or the server refused ours. Not a
    /// lost connection: trying again gives the same answer.
    #[error(
        "TLS handshake refused: {source} (the server's certificate fails the ssl-mode check, \
         or the server refused the client certificate)"
    )]
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
}

impl Error {
    pub(crate) fn sql(op: &'static str) -> impl FnOnce(sqlx::Error) -> Self {
        move |source| Self::Sql { op, source }
    }

    /// For a failed connect: a TLS refusal gets its own variant. rustls reports every TLS
    /// failure (a certificate it rejects, the server's alert) as an I/O error of kind
    /// `InvalidData`, which sqlx and the socket never give otherwise.
    pub(crate) fn connect(source: sqlx::Error) -> Self {
        match &source {
            sqlx::Error::Io(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                Self::TlsRefused { source }
            }
            _ => Self::Sql {
                op: "connect",
                source,
            },
        }
    }

    fn db_code(&self) -> Option<u16> {
        match self {
            Self::Sql {
                source: sqlx::Error::Database(e),
                ..
            } => e
                .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
                .map(|e| e.number()),
            _ => None,
        }
    }

    /// The row is locked by another session (`NOWAIT` refused, or a lock wait ran out).
    pub(crate) fn is_lock_busy(&self) -> bool {
        matches!(self.db_code(), Some(ER_LOCK_WAIT_TIMEOUT | ER_LOCK_NOWAIT))
    }

    /// The statement was interrupted by `KILL QUERY`.
    pub(crate) fn is_interrupted(&self) -> bool {
        self.db_code() == Some(ER_QUERY_INTERRUPTED)
    }

    /// InnoDB rolled the transaction back as a deadlock victim; trying again is safe.
    pub(crate) fn is_deadlock(&self) -> bool {
        self.db_code() == Some(ER_LOCK_DEADLOCK)
    }

    /// Another client created the row between our check and our insert.
    pub(crate) fn is_duplicate(&self) -> bool {
        self.db_code() == Some(ER_DUP_ENTRY)
    }

    /// The server refused to prepare one more statement (its `max_prepared_stmt_count`,
    /// shared by every session, is reached); nothing ran.
    pub(crate) fn is_prepare_refused(&self) -> bool {
        self.db_code() == Some(ER_MAX_PREPARED_STMT_COUNT_REACHED)
    }

    /// The connection is unusable: closed, reset, killed, or silent. Whatever its session
    /// held is gone (or will be, when the server notices).
    pub(crate) fn is_connection_lost(&self) -> bool {
        match self {
            Self::NoAnswer { .. } => true,
            Self::Exhausted { .. } | Self::TlsRefused { .. } => false,
            Self::Sql { source, .. } => match source {
                sqlx::Error::Io(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
                sqlx::Error::Database(_) => {
                    self.db_code().is_some_and(|c| SESSION_GONE.contains(&c))
                }
                _ => false,
            },
        }
    }
}

impl From<Error> for LockError {
    fn from(e: Error) -> Self {
        let op = match &e {
            Error::Sql { op, .. } | Error::NoAnswer { op, .. } => *op,
            Error::Exhausted { .. } | Error::TlsRefused { .. } => "connect",
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
        assert!(io.is_connection_lost());
        assert_eq!(LockError::from(io).kind(), ErrorKind::Unavailable);
        let silent = Error::NoAnswer {
            op: "acquire",
            addr: "127.0.0.1:3306".into(),
            after: Duration::from_secs(5),
        };
        assert_eq!(LockError::from(silent).kind(), ErrorKind::Unavailable);
        let busy = Error::Exhausted {
            limit: 100,
            after: Duration::from_secs(5),
        };
        assert!(busy.to_string().contains("max_connections"));
        assert_eq!(LockError::from(busy).kind(), ErrorKind::Unavailable);
        let refused = Error::Sql {
            op: "connect",
            source: sqlx::Error::Tls("the server does not support TLS".into()),
        };
        assert!(!refused.is_connection_lost());
        assert_eq!(LockError::from(refused).kind(), ErrorKind::Backend);
    }

    #[test]
    fn a_refused_tls_handshake_is_backend_not_unavailable() {
        // What rustls gives sqlx for a certificate it rejects.
        let rejected = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        );
        let err = Error::connect(sqlx::Error::Io(rejected));
        assert!(matches!(err, Error::TlsRefused { .. }), "{err:?}");
        assert!(!err.is_connection_lost());
        let err = LockError::from(err);
        assert_eq!(err.kind(), ErrorKind::Backend);
        assert!(!err.is_retryable());
        assert!(
            err.to_string()
                .contains("TLS handshake refused: error communicating with database: invalid peer certificate: UnknownIssuer"),
            "{err}"
        );
        // A socket error while connecting stays a connection problem.
        let reset = Error::connect(sqlx::Error::Io(std::io::ErrorKind::ConnectionReset.into()));
        assert_eq!(LockError::from(reset).kind(), ErrorKind::Unavailable);
    }
}
