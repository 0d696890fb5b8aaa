//! The backend's private error and its one conversion into [`LockError`], and the two
//! [`LockError`]s the protocol reports itself ([`lease_lost`], [`not_held`]).

use std::time::Duration;

use dlock_core::{LockError, LostReason};

use crate::NAME;

/// What went wrong talking to etcd, with the operation it happened in.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// The client library's error (transport or a gRPC status from the server).
    #[error("{source}")]
    Etcd {
        op: &'static str,
        #[source]
        source: Box<etcd_client::Error>,
    },
    /// No answer within the request timeout.
    #[error("no answer within {after:?}")]
    TimedOut { op: &'static str, after: Duration },
    /// A keep-alive answered that the lease no longer exists.
    #[error("the lease expired or was revoked")]
    LeaseGone { op: &'static str },
    /// The peer accepted the connection but did not answer as an etcd server (another
    /// kind of server on the port, TLS on one side only, a refused client certificate).
    #[error(
        "the server accepted the connection but did not answer as etcd (another kind of \
         server, TLS on one side only, or a refused client certificate): {source}"
    )]
    NotEtcd {
        op: &'static str,
        #[source]
        source: Box<etcd_client::Error>,
    },
    /// The server answered with something the protocol does not expect.
    #[error("unexpected answer: {what}")]
    Protocol {
        op: &'static str,
        what: &'static str,
    },
}

impl Error {
    pub(crate) fn etcd(op: &'static str, source: etcd_client::Error) -> Self {
        Self::Etcd {
            op,
            source: Box::new(source),
        }
    }

    /// At connect: a connection that was accepted and then failed, rather than refused,
    /// means the peer is not an etcd server.
    pub(crate) fn at_connect(self) -> Self {
        match self {
            Self::Etcd { op, source }
                if local_status(&source).is_some_and(|code| code != grpc::UNAVAILABLE) =>
            {
                Self::NotEtcd { op, source }
            }
            other => other,
        }
    }

    fn source_error(&self) -> Option<&etcd_client::Error> {
        match self {
            Self::Etcd { source, .. } => Some(source),
            _ => None,
        }
    }

    /// The gRPC status code the server answered with, if it answered.
    fn code(&self) -> Option<i32> {
        match self.source_error() {
            Some(etcd_client::Error::GRpcStatus(status)) => Some(status.code() as i32),
            _ => None,
        }
    }

    /// The server says the lease does not exist (expired or revoked).
    pub(crate) fn is_lease_not_found(&self) -> bool {
        match self.source_error() {
            Some(etcd_client::Error::GRpcStatus(status)) => {
                self.code() == Some(grpc::NOT_FOUND) && status.message().contains("lease not found")
            }
            Some(etcd_client::Error::LeaseKeepAliveError(message)) => {
                message.contains("lease not found")
            }
            _ => false,
        }
    }

    /// The lease is gone on the server (a keep-alive said so, or a request named it).
    pub(crate) fn is_lease_gone(&self) -> bool {
        matches!(self, Self::LeaseGone { .. }) || self.is_lease_not_found()
    }

    /// Whether the server (rather than the network) refused: a wrong password, a
    /// permission, a malformed request, or a server that does not speak etcd's protocol.
    fn is_refusal(&self) -> bool {
        match self {
            Self::Etcd { source, .. } => match **source {
                // Made by the client from a transport error: the network failed.
                etcd_client::Error::GRpcStatus(_) if local_status(source).is_some() => false,
                // Raft dropped the proposal (a leader change under way); etcd 3.4 sends it
                // with code Unknown, but sending it again later succeeds.
                etcd_client::Error::GRpcStatus(ref status)
                    if status.message().contains("raft proposal dropped") =>
                {
                    false
                }
                etcd_client::Error::GRpcStatus(_) => !matches!(
                    self.code(),
                    Some(
                        grpc::UNAVAILABLE
                            | grpc::DEADLINE_EXCEEDED
                            | grpc::CANCELLED
                            | grpc::ABORTED
                            | grpc::RESOURCE_EXHAUSTED
                    )
                ),
                etcd_client::Error::InvalidArgs(_)
                | etcd_client::Error::InvalidUri(_)
                | etcd_client::Error::InvalidMetadataValue(_)
                | etcd_client::Error::Utf8Error(_) => true,
                _ => false,
            },
            Self::TimedOut { .. } => false,
            Self::LeaseGone { .. } | Self::NotEtcd { .. } | Self::Protocol { .. } => true,
        }
    }

    fn op(&self) -> &'static str {
        match self {
            Self::Etcd { op, .. }
            | Self::TimedOut { op, .. }
            | Self::LeaseGone { op }
            | Self::NotEtcd { op, .. }
            | Self::Protocol { op, .. } => op,
        }
    }
}

impl From<Error> for LockError {
    fn from(e: Error) -> Self {
        let op = e.op();
        if e.is_refusal() {
            LockError::backend(NAME, op, e)
        } else {
            LockError::unavailable(NAME, op, e)
        }
    }
}

/// Our key, or its lease, is gone while we wait for it: the acquire fails.
pub(crate) fn lease_lost(key: &str, why: &str) -> LockError {
    LockError::LeaseLost {
        backend: NAME,
        key: key.to_owned(),
        reason: LostReason::SessionEnded(why.to_owned()),
    }
}

/// Our key is no longer ours while we hold it (or at release).
pub(crate) fn not_held(key: &str) -> LockError {
    LockError::not_held(NAME, key, LostReason::NotHeld)
}

/// The request never left this process: the connection to the endpoint the balancer
/// picked was refused. Such a request is safe to send again, whatever it does.
pub(crate) fn never_sent(e: &etcd_client::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = match e {
        etcd_client::Error::GRpcStatus(status) if local_status(e) == Some(grpc::UNAVAILABLE) => {
            std::error::Error::source(status)
        }
        etcd_client::Error::TransportError(transport) => std::error::Error::source(transport),
        _ => None,
    };
    while let Some(e) = source {
        if e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            return true;
        }
        source = e.source();
    }
    false
}

/// The code of a gRPC status the client made itself from a transport error (a status the
/// server sent has no source).
fn local_status(e: &etcd_client::Error) -> Option<i32> {
    match e {
        etcd_client::Error::GRpcStatus(status) if std::error::Error::source(status).is_some() => {
            Some(status.code() as i32)
        }
        _ => None,
    }
}

/// gRPC status codes (fixed by the gRPC specification), so this crate needs no direct
/// dependency on the client's `tonic`.
pub(crate) mod grpc {
    pub(crate) const CANCELLED: i32 = 1;
    pub(crate) const DEADLINE_EXCEEDED: i32 = 4;
    pub(crate) const NOT_FOUND: i32 = 5;
    pub(crate) const RESOURCE_EXHAUSTED: i32 = 8;
    pub(crate) const ABORTED: i32 = 10;
    pub(crate) const UNAVAILABLE: i32 = 14;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(code: tonic::Code, message: &str) -> LockError {
        Error::etcd(
            "acquire",
            etcd_client::Error::GRpcStatus(tonic::Status::new(code, message)),
        )
        .into()
    }

    #[test]
    fn a_dropped_raft_proposal_is_retryable() {
        let e = answered(tonic::Code::Unknown, "raft proposal dropped");
        assert!(e.is_retryable(), "{e}");
    }

    #[test]
    fn a_leader_change_is_retryable() {
        let e = answered(tonic::Code::Unavailable, "etcdserver: leader changed");
        assert!(e.is_retryable(), "{e}");
    }

    #[test]
    fn a_refused_permission_is_a_backend_error() {
        let e = answered(
            tonic::Code::PermissionDenied,
            "etcdserver: permission denied",
        );
        assert_eq!(e.kind(), dlock_core::ErrorKind::Backend, "{e}");
        assert!(!e.is_retryable());
    }
}
