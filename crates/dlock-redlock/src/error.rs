//! Why a quorum could not be reached, and how that maps to [`LockError`].

use std::fmt;

use dlock_core::LockError;
use dlock_redis::server::NodeError;

use crate::NAME;

/// A Redlock failure: too few nodes answered for a quorum.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("{op}: only {answered} of {nodes} nodes answered, {quorum} needed; {failures}")]
    NoQuorum {
        op: &'static str,
        nodes: usize,
        quorum: usize,
        answered: usize,
        failures: Failures,
    },
}

/// The failed nodes' errors, shown one after the other.
#[derive(Debug)]
pub(crate) struct Failures(pub(crate) Vec<NodeError>);

impl fmt::Display for Failures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl From<Error> for LockError {
    /// [`LockError::Backend`] when a node refused (wrong password, not a Redis server),
    /// [`LockError::Unavailable`] when the nodes could not be reached or timed out.
    fn from(e: Error) -> Self {
        let Error::NoQuorum { op, failures, .. } = &e;
        let op = *op;
        if failures.0.iter().all(NodeError::is_unavailable) {
            LockError::unavailable(NAME, op, e)
        } else {
            LockError::backend(NAME, op, e)
        }
    }
}
