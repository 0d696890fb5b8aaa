//! The one public error type.

use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::LostReason;

/// A boxed error kept as the `source` of a [`LockError`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// `Result` with [`LockError`] as the error type.
pub type Result<T, E = LockError> = std::result::Result<T, E>;

/// Everything that can go wrong while taking, keeping or giving back a lock.
///
/// Each variant names the backend and, where known, the key and the operation; the cause
/// from the client library stays attached as [`source`](StdError::source). Match on
/// [`LockError::kind`] when only the category matters, and ask [`LockError::is_retryable`]
/// whether trying again later can succeed.
///
/// No message or `Debug` output contains a password: backends strip credentials before an
/// address reaches an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// `acquire` waited as long as [`LockOptions::wait`](crate::LockOptions::wait) allowed
    /// and the key stayed held by someone else.
    #[error("{backend}: timed out after {waited:?} waiting for key {key:?}")]
    Timeout {
        /// The backend, e.g. `"redis"`.
        backend: &'static str,
        /// The key that stayed busy.
        key: String,
        /// How long the call waited.
        waited: Duration,
    },
    /// `release` or `extend` of a lease that is no longer ours: it expired, was broken, or
    /// another client holds the key now. Nothing on the server was changed.
    #[error("{backend}: lease on key {key:?} is not held any more ({reason})")]
    NotHeld {
        /// The backend.
        backend: &'static str,
        /// The key of the lease.
        key: String,
        /// Why the lease is gone, as far as this client knows.
        reason: LostReason,
    },
    /// The lease was lost while an operation depended on it (for example an acquire that
    /// was waiting on the server with a session or lease that expired).
    #[error("{backend}: lease on key {key:?} was lost: {reason}")]
    LeaseLost {
        /// The backend.
        backend: &'static str,
        /// The key.
        key: String,
        /// Why the lease was lost.
        reason: LostReason,
    },
    /// The key cannot be used: empty, too long, or holding a NUL byte. Checked before any
    /// network I/O.
    #[error("invalid key {key}: {reason}")]
    InvalidKey {
        /// The key, quoted and shortened for display.
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The configuration or URL is wrong, or an option value is out of range. Checked before
    /// any network I/O where possible.
    #[error("{backend}: invalid configuration: {message}")]
    InvalidConfig {
        /// The backend (or `"dlock"` for a URL whose scheme is unknown).
        backend: &'static str,
        /// What is wrong, naming the option.
        message: String,
        /// The parse error behind it, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The backend cannot do what the options ask (a shared hold on a backend without
    /// them, see [`Capabilities`](crate::Capabilities)). Checked before any network I/O.
    #[error("{backend}: {what} is not supported by this backend")]
    Unsupported {
        /// The backend.
        backend: &'static str,
        /// What was asked for, e.g. `"a shared hold"`.
        what: &'static str,
    },
    /// The server could not be reached or stopped answering (refused, reset, timed out).
    /// Retryable.
    #[error("{backend}: server unavailable during {op}: {source}")]
    Unavailable {
        /// The backend.
        backend: &'static str,
        /// The operation, e.g. `"connect"`, `"acquire"`.
        op: &'static str,
        /// The client library's error.
        #[source]
        source: BoxError,
    },
    /// The server answered with an error: refused credentials, a wrong kind of server on the
    /// port, a script error, a permission problem.
    #[error("{backend}: server refused {op}: {source}")]
    Backend {
        /// The backend.
        backend: &'static str,
        /// The operation.
        op: &'static str,
        /// The server's answer.
        #[source]
        source: BoxError,
    },
}

/// The category of a [`LockError`], for matching without the details.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// See [`LockError::Timeout`].
    Timeout,
    /// See [`LockError::NotHeld`].
    NotHeld,
    /// See [`LockError::LeaseLost`].
    LeaseLost,
    /// See [`LockError::InvalidKey`].
    InvalidKey,
    /// See [`LockError::InvalidConfig`].
    InvalidConfig,
    /// See [`LockError::Unsupported`].
    Unsupported,
    /// See [`LockError::Unavailable`].
    Unavailable,
    /// See [`LockError::Backend`].
    Backend,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

impl LockError {
    /// The category of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::Timeout { .. } => ErrorKind::Timeout,
            Self::NotHeld { .. } => ErrorKind::NotHeld,
            Self::LeaseLost { .. } => ErrorKind::LeaseLost,
            Self::InvalidKey { .. } => ErrorKind::InvalidKey,
            Self::InvalidConfig { .. } => ErrorKind::InvalidConfig,
            Self::Unsupported { .. } => ErrorKind::Unsupported,
            Self::Unavailable { .. } => ErrorKind::Unavailable,
            Self::Backend { .. } => ErrorKind::Backend,
        }
    }

    /// Whether the same call can succeed if tried again later: the key was busy
    /// ([`Timeout`](Self::Timeout)) or the server was unreachable
    /// ([`Unavailable`](Self::Unavailable)).
    pub fn is_retryable(&self) -> bool {
        matches!(self.kind(), ErrorKind::Timeout | ErrorKind::Unavailable)
    }

    /// [`LockError::NotHeld`]: the lease on `key` is no longer ours, for `reason`.
    pub fn not_held(backend: &'static str, key: &str, reason: LostReason) -> Self {
        Self::NotHeld {
            backend,
            key: key.to_owned(),
            reason,
        }
    }

    /// An [`InvalidConfig`](Self::InvalidConfig) error without a source.
    pub fn invalid_config(backend: &'static str, message: impl Into<String>) -> Self {
        Self::InvalidConfig {
            backend,
            message: message.into(),
            source: None,
        }
    }

    /// An [`Unavailable`](Self::Unavailable) error.
    pub fn unavailable(
        backend: &'static str,
        op: &'static str,
        source: impl Into<BoxError>,
    ) -> Self {
        Self::Unavailable {
            backend,
            op,
            source: source.into(),
        }
    }

    /// A [`Backend`](Self::Backend) error.
    pub fn backend(backend: &'static str, op: &'static str, source: impl Into<BoxError>) -> Self {
        Self::Backend {
            backend,
            op,
            source: source.into(),
        }
    }

    /// An [`InvalidKey`](Self::InvalidKey) error; the key is quoted and shortened.
    pub fn invalid_key(key: &str, reason: &'static str) -> Self {
        const SHOWN: usize = 64;
        let mut shown: String = key.chars().take(SHOWN).collect();
        let more = key.chars().count() > SHOWN;
        shown = format!("{shown:?}");
        if more {
            shown.push_str(&format!("… ({} bytes)", key.len()));
        }
        Self::InvalidKey { key: shown, reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retryable_errors_are_timeout_and_unavailable() {
        let timeout = LockError::Timeout {
            backend: "memory",
            key: "k".into(),
            waited: Duration::from_millis(5),
        };
        assert!(timeout.is_retryable());
        assert!(LockError::unavailable("redis", "connect", "refused").is_retryable());
        assert!(!LockError::backend("redis", "acquire", "NOAUTH").is_retryable());
        assert!(!LockError::invalid_config("redis", "bad port").is_retryable());
    }

    #[test]
    fn invalid_key_message_is_short_and_escaped() {
        let err = LockError::invalid_key(&"x\0".repeat(500), "too long");
        let text = err.to_string();
        assert!(text.len() < 400, "{text}");
        assert!(text.contains("\\0"), "{text}");
        assert!(text.contains("1000 bytes"), "{text}");
    }
}
