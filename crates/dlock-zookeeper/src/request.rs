//! Requests that outlive a dropped connection: sent again once the client is connected,
//! within a time bound, and the delete of a lock node built on them.

use std::future::Future;

use tokio::time::Instant;
use zookeeper_client as zk;

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
