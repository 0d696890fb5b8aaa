//! The one error type: a refused write, bad input, or the store failing.

/// A boxed error from the store's client, kept as the [`source`](std::error::Error::source).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a fenced write did not happen.
///
/// [`StaleToken`](FenceError::StaleToken) is the answer the check exists for: a holder whose
/// lease ended wrote after a newer holder did, and the store kept the newer write. Treat it
/// as "you are no longer the holder": stop, do not retry with the same token.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FenceError {
    /// The store already holds a token at least as large: a newer (or the same) holder has
    /// written since. Nothing was changed.
    #[error("stale fencing token {token}: the store already holds token {stored}")]
    StaleToken {
        /// The token this write carried.
        token: u64,
        /// The token the store holds, read right after the refusal. A fence written by
        /// something other than this crate that is not a token in range reads as 0.
        stored: u64,
    },
    /// No row has the id the SQL update named (a fenced update never creates rows). Nothing
    /// was changed.
    #[error("no row with the given id to write with fencing token {token}")]
    Missing {
        /// The token this write carried.
        token: u64,
    },
    /// The arguments were refused before any I/O: an identifier that is not a plain name, a
    /// token of 0, or one too large for the store's column.
    #[error("invalid {what}: {why}")]
    InvalidInput {
        /// Which argument, e.g. `"token"` or `"table name"`.
        what: &'static str,
        /// What is wrong with it.
        why: String,
    },
    /// The store could not be reached or answered with an error; whether the write happened
    /// is unknown only if the error came after the request went out (a lost connection).
    #[error("{store} failed")]
    Store {
        /// `"mysql"`, `"postgres"`, `"redis"` or `"etcd"`.
        store: &'static str,
        /// The client's error.
        #[source]
        source: BoxError,
    },
}

impl FenceError {
    /// Whether the write was refused because a newer holder wrote first.
    pub fn is_stale(&self) -> bool {
        matches!(self, FenceError::StaleToken { .. })
    }

    #[allow(dead_code)] // unused when every store feature is off
    pub(crate) fn store(store: &'static str, source: impl Into<BoxError>) -> Self {
        FenceError::Store {
            store,
            source: source.into(),
        }
    }
}

/// Refuse token 0 before any I/O: no dlock backend hands it out, and it is what an unfenced
/// record starts with, so a write with it could never be ordered after anything.
#[allow(dead_code)] // unused when every store feature is off
pub(crate) fn check_token(token: u64) -> Result<(), FenceError> {
    if token == 0 {
        return Err(FenceError::InvalidInput {
            what: "token",
            why: "0 is not a fencing token (dlock's tokens start at 1)".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_zero_is_refused_and_every_other_token_passes() {
        assert!(matches!(
            check_token(0),
            Err(FenceError::InvalidInput { what: "token", .. })
        ));
        for token in [1, 2, u64::MAX] {
            assert!(check_token(token).is_ok());
        }
    }
}
