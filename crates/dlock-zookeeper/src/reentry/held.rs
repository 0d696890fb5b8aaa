//! The grant and the lease of an owner's hold: renewals that check the holding node from
//! another session, releases that lower the count.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Grant, Held};
use dlock_core::{LockError, LostReason, Owner, Result};
use futures::FutureExt;
use tokio::time::Instant;
use zookeeper_client as zk;

use super::{Hints, Lowered, OwnerData, lower};
use crate::NAME;
use crate::error::{Error, is_session_over};
use crate::held::{ZookeeperHeld, watch_lease, watch_node};
use crate::request::retry;

/// Which node holds an owner's hold, as a grant found it.
#[derive(Debug, Clone)]
pub(crate) struct HoldNode {
    pub(crate) path: String,
    pub(crate) czxid: i64,
    /// The node is ephemeral on this client's session, which keeps it alive (the first
    /// lease, and re-entries through the same session); otherwise the lease's renewals
    /// check the node is still the same hold of the owner.
    pub(crate) kept: bool,
}

/// The grant of `owner`'s hold on `node`, for a lease of this client, remembered in
/// `hints` for the client's next re-entry.
pub(crate) fn grant(
    client: &zk::Client,
    hints: &Arc<Hints>,
    key: &str,
    node: HoldNode,
    owner: Owner,
    sent_at: Instant,
) -> Result<Grant, zk::Error> {
    let HoldNode { path, czxid, kept } = node;
    let Some(token) = crate::contender::token(czxid) else {
        return Err(zk::Error::UnexpectedError(format!(
            "the server gave the lock node a negative czxid ({czxid}); not a ZooKeeper answer"
        )));
    };
    let gone = watch_node(client.clone(), path.clone());
    let lost = watch_lease(
        client.clone(),
        path.clone(),
        gone.clone(),
        client.session_timeout(),
    );
    hints.set(key, owner, &path, czxid);
    let held = OwnerHeld {
        hints: Arc::clone(hints),
        node: ZookeeperHeld {
            client: client.clone(),
            key: key.to_owned(),
            path,
            gone,
        },
        czxid,
        owner,
        kept,
    };
    // Timed from the grant, as a plain hold's (see `Contender::into_grant`).
    let grant = Grant::new(token, Box::new(held), sent_at)
        .with_lost(Box::pin(lost))
        .listened_from_grant();
    Ok(match kept {
        true => grant.kept_alive(),
        false => grant,
    })
}

/// A lease of an owner's hold: the holding node, the hold's `czxid` (its token, and what
/// tells this hold from a later one of the same owner), and the owner.
pub(crate) struct OwnerHeld {
    hints: Arc<Hints>,
    node: ZookeeperHeld,
    czxid: i64,
    owner: Owner,
    /// The node is ephemeral on our session (see [`grant`]).
    kept: bool,
}

impl std::fmt::Debug for OwnerHeld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OwnerHeld")
            .field("node", &self.node)
            .field("czxid", &self.czxid)
            .field("owner", &self.owner)
            .field("kept", &self.kept)
            .finish()
    }
}

impl OwnerHeld {
    fn not_held(&self, reason: LostReason) -> LockError {
        LockError::not_held(NAME, &self.node.key, reason)
    }

    fn until(&self) -> Instant {
        Instant::now() + self.node.client.session_timeout()
    }
}

#[async_trait]
impl Held for OwnerHeld {
    /// On the node's own session: as a plain hold, no request. From another session: one
    /// `getData`, `NotHeld` unless the node is still there, created at our `czxid`, with
    /// our owner in its data. Nothing to lengthen either way: the node lives as long as
    /// the session that created it.
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        if self.kept {
            return self.node.extend(ttl).await;
        }
        if let Some(reason) = self.node.gone.clone().now_or_never() {
            return Err(self.not_held(reason));
        }
        let client = &self.node.client;
        let path = &self.node.path;
        match retry(client, self.until(), || client.get_data(path)).await {
            Ok((data, stat))
                if stat.czxid == self.czxid
                    && OwnerData::parse(&data).is_some_and(|d| d.is(self.owner)) =>
            {
                Ok(())
            }
            Ok(_) | Err(zk::Error::NoNode) => Err(self.not_held(LostReason::NotHeld)),
            Err(e) if is_session_over(&e) => {
                Err(self.not_held(LostReason::SessionEnded(e.to_string())))
            }
            Err(e) => Err(Error::zk("extend", e).into()),
        }
    }

    /// Lower the count by compare-and-set (`getData`, then `setData` with its version), or
    /// at one delete the node (`delete` with its version): two round trips, or one at the
    /// version this client last wrote (see [`lower`]).
    async fn release(&mut self) -> Result<()> {
        let client = &self.node.client;
        let until = self.until();
        let (key, path) = (&self.node.key, &self.node.path);
        let written = self.hints.written(key, path);
        match lower(client, path, Some(self.czxid), self.owner, written, until).await {
            Ok(Lowered::Counted(data, version)) => {
                self.hints.wrote(key, path, data, version);
                Ok(())
            }
            Ok(Lowered::Freed) => {
                self.hints.forget(&self.node.key, &self.node.path);
                Ok(())
            }
            Ok(Lowered::NotHeld) => {
                self.hints.forget(&self.node.key, &self.node.path);
                Err(self.not_held(LostReason::NotHeld))
            }
            Err(e) if is_session_over(&e) => Err(self.not_held(LostReason::NotHeld)),
            Err(e) => Err(Error::zk("release", e).into()),
        }
    }
}
