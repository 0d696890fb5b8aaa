//! Requests that outlive a dropped connection: sent again once the client is connected,
//! within a time bound, and the deletes of lock nodes and key directories built on them.

use std::future::Future;

use tokio::time::Instant;
use zookeeper_client as zk;

use crate::NAME;
use crate::error::is_uncertain;
use crate::session::connected;

/// How often one request is retried after an uncertain failure before giving up (each retry
/// first waits until the client is connected again, so this only guards against a client
/// that keeps failing while connected).
pub(crate) const MAX_RETRIES: usize = 16;

/// Run a request until it gets a definite answer, by `until`: after an uncertain failure
/// (the connection dropped) it is sent again once the client is connected. Only for
/// requests that are safe to repeat. Running out of time is [`zk::Error::Timeout`].
pub(crate) async fn retry<T, F, Fut>(
    client: &zk::Client,
    until: Instant,
    mut request: F,
) -> Result<T, zk::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, zk::Error>>,
{
    let attempts = async {
        for _ in 0..MAX_RETRIES {
            match request().await {
                Err(e) if is_uncertain(&e) => connected(client).await?,
                answer => return answer,
            }
        }
        Err(zk::Error::ConnectionLoss)
    };
    tokio::time::timeout_at(until, attempts)
        .await
        .unwrap_or(Err(zk::Error::Timeout))
}

/// Delete `path` by `until`, retrying after a lost connection. `Ok(true)` when this call
/// deleted it, `Ok(false)` when it was not there (a retry that finds it gone after an
/// uncertain attempt counts as deleted).
pub(crate) async fn delete(
    client: &zk::Client,
    path: &str,
    until: Instant,
) -> Result<bool, zk::Error> {
    let mut uncertain = false;
    let attempts = async {
        for _ in 0..MAX_RETRIES {
            match client.delete(path, None).await {
                Ok(()) => return Ok(true),
                Err(zk::Error::NoNode) => return Ok(uncertain),
                Err(e) if is_uncertain(&e) => {
                    uncertain = true;
                    connected(client).await?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(zk::Error::ConnectionLoss)
    };
    tokio::time::timeout_at(until, attempts)
        .await
        .unwrap_or(Err(zk::Error::Timeout))
}

/// Delete a key's directory if it is empty (best effort: a contender may be using it).
/// Container nodes are reaped by the server too, but only at its check interval.
pub(crate) async fn delete_dir_if_empty(client: &zk::Client, dir: &str) {
    match client.delete(dir, None).await {
        Ok(()) | Err(zk::Error::NoNode | zk::Error::NotEmpty) => {}
        Err(e) => {
            tracing::debug!(backend = NAME, dir, error = %e, "could not remove the key directory")
        }
    }
}

/// Delete our node and, in the same round trip, the key directory if that leaves it empty
/// (`NotEmpty` while others wait). `Ok(true)` when the node was deleted, `Ok(false)` when it
/// was not there; after a lost connection the node's delete is retried by `until`.
pub(crate) async fn delete_node_and_dir(
    client: &zk::Client,
    path: &str,
    dir: &str,
    until: Instant,
) -> Result<bool, zk::Error> {
    let node = client.delete(path, None);
    let dir_deleted = client.delete(dir, None);
    let pipelined = futures::future::join(node, dir_deleted);
    let (node, _) = tokio::time::timeout_at(until, pipelined)
        .await
        .map_err(|_| zk::Error::Timeout)?;
    match node {
        Ok(()) => Ok(true),
        Err(zk::Error::NoNode) => Ok(false),
        Err(e) if is_uncertain(&e) => {
            delete(client, path, until).await?;
            delete_dir_if_empty(client, dir).await;
            Ok(true)
        }
        Err(e) => Err(e),
    }
}
