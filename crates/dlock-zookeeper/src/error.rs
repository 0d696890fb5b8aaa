//! The backend's errors and their one mapping into [`LockError`].

use dlock_core::LockError;
use zookeeper_client as zk;

use crate::NAME;

/// What went wrong talking to ZooKeeper, with the operation it happened in.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The client library's error. Its `Timeout` also stands for "no answer within the
    /// bound" (the connection is down, or the server is a black hole).
    #[error("{}", describe(source))]
    Zk {
        op: &'static str,
        #[source]
        source: zk::Error,
    },
}

fn describe(e: &zk::Error) -> String {
    match e {
        zk::Error::Timeout => "no answer in time (the connection to the ensemble is down)".into(),
        zk::Error::NoHosts => "no ensemble member accepted a session".into(),
        zk::Error::NoAuth => "not authorized (NoAuth): the node's ACL does not grant this \
                              session's identity; are the credentials missing or wrong?"
            .into(),
        // Only a `sasl:` ACL can be invalid here: the server has no SASL provider.
        zk::Error::InvalidAcl => "invalid ACL (InvalidACL): with auth=sasl the server needs \
                                  authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider"
            .into(),
        e => e.to_string(),
    }
}

impl Error {
    pub(crate) fn zk(op: &'static str, source: zk::Error) -> Self {
        Self::Zk { op, source }
    }
}

/// Errors that say nothing about the outcome of a request: it may or may not have been
/// applied (the connection dropped, the client gave up waiting, I/O failed).
pub(crate) fn is_uncertain(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::ConnectionLoss | zk::Error::Timeout | zk::Error::Custom(_)
    )
}

/// Errors after which the session is gone for good: its ephemeral nodes are (or will soon
/// be) deleted by the server, and the client must be replaced.
pub(crate) fn is_session_over(e: &zk::Error) -> bool {
    matches!(
        e,
        zk::Error::SessionExpired
            | zk::Error::ClientClosed
            | zk::Error::AuthFailed
            | zk::Error::NoHosts
            | zk::Error::SessionMoved
    )
}

fn is_connection_error(e: &zk::Error) -> bool {
    is_uncertain(e)
        || matches!(
            e,
            zk::Error::SessionExpired
                | zk::Error::ClientClosed
                | zk::Error::NoHosts
                | zk::Error::SessionMoved
                | zk::Error::Throttled
        )
}

impl From<Error> for LockError {
    fn from(e: Error) -> Self {
        let Error::Zk { op, source } = &e;
        let op = *op;
        if is_connection_error(source) {
            LockError::unavailable(NAME, op, e)
        } else {
            LockError::backend(NAME, op, e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_core::ErrorKind;

    #[test]
    fn connection_errors_are_unavailable_and_refusals_backend() {
        for e in [
            zk::Error::ConnectionLoss,
            zk::Error::NoHosts,
            zk::Error::Timeout,
            zk::Error::SessionExpired,
        ] {
            let err = LockError::from(Error::zk("acquire", e.clone()));
            assert_eq!(err.kind(), ErrorKind::Unavailable, "{e}");
        }
        for e in [
            zk::Error::NoAuth,
            zk::Error::InvalidAcl,
            zk::Error::Unimplemented,
        ] {
            let err = LockError::from(Error::zk("acquire", e.clone()));
            assert_eq!(err.kind(), ErrorKind::Backend, "{e}");
        }
        let err = LockError::from(Error::zk("acquire", zk::Error::NoAuth));
        assert!(err.to_string().contains("NoAuth"), "{err}");
        let err = LockError::from(Error::zk("release", zk::Error::Timeout));
        assert_eq!(err.kind(), ErrorKind::Unavailable);
        assert!(err.to_string().contains("release"), "{err}");
        assert!(err.to_string().contains("no answer"), "{err}");
    }
}
