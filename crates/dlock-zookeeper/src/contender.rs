//! Our lock node while it waits its turn: created in one round trip with the directory
//! listing, found again after a lost connection (Curator's protected mode), and deleted if
//! the acquire gives up.

use std::sync::Arc;
use std::time::Duration;

use dlock_core::raw::Grant;
use dlock_core::{Mode, Owner, holder_description};
use tokio::time::Instant;
use zookeeper_client::{self as zk, Acls, CreateMode};

use crate::NAME;
use crate::acquire::Budget;
use crate::config::CuratorRecipe;
use crate::error::{is_session_over, is_uncertain};
use crate::held::{ZookeeperHeld, watch_lease, watch_node};
use crate::nodes;
use crate::reentry::{self, OwnerData};
use crate::request::{MAX_RETRIES, delete, retry};
use crate::session::connected;

/// How long an acquire that gave up may spend deleting its node before it leaves that to a
/// background task.
const WITHDRAW_BOUND: Duration = Duration::from_secs(1);

/// Our lock node while it is not (yet) a lease. Dropped without
/// [`into_grant`](Contender::into_grant), it deletes the node in the background, retrying on
/// connection loss, so a timed-out, failed or cancelled acquire leaves nothing behind.
pub(crate) struct Contender {
    client: zk::Client,
    /// The ACL of every node we create (see [Security](crate#security)).
    acl: Arc<[zk::Acl]>,
    /// The key: the data of its key directory when we create that (see
    /// [Inspecting](crate#inspecting)).
    key: Arc<str>,
    dir: String,
    uuid: uuid::Uuid,
    /// Exclusive or shared: which name our node gets.
    mode: Mode,
    /// Which name an exclusive node gets: Curator's mutex's or its write lock's.
    curator: CuratorRecipe,
    /// What `dir` hangs from, so a missing one is made the way Curator makes it.
    parent: Parent,
    /// An election candidate's value: our node is then a `latch-` node carrying it (see
    /// [Elections](crate#elections)).
    value: Option<Arc<str>>,
    /// A reentrant hold's owner: our node's data then carries the owner and count (see
    /// [Reentrant holds](crate#reentrant-holds)).
    owner: Option<Owner>,
    node: Option<Node>,
    /// A create went out whose outcome is unknown.
    unsure: bool,
    /// The key was busy when we first looked, and we waited (the grant is a hand-off).
    waited: bool,
}

/// What the directory a contender's node goes in hangs from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parent {
    /// The base path: a lock's key directory is made in it, and the base path's missing
    /// nodes are made persistent.
    Base,
    /// A semaphore's key directory (`locks` and `leases` go in it): made a container node
    /// in the base path when missing, as Curator's `creatingParentContainersIfNeeded` does.
    Semaphore,
}

#[derive(Debug, Clone)]
struct Node {
    name: String,
    czxid: i64,
}

impl Contender {
    pub(crate) fn new(
        client: &zk::Client,
        acl: Arc<[zk::Acl]>,
        key: &str,
        dir: &str,
        mode: Mode,
        curator: CuratorRecipe,
    ) -> Self {
        Self {
            client: client.clone(),
            acl,
            key: key.into(),
            dir: dir.to_owned(),
            uuid: uuid::Uuid::new_v4(),
            mode,
            curator,
            parent: Parent::Base,
            value: None,
            owner: None,
            node: None,
            unsure: false,
            waited: false,
        }
    }

    /// The same, for a node in one of a semaphore's directories (`locks` or `leases`).
    pub(crate) fn in_semaphore(mut self) -> Self {
        self.parent = Parent::Semaphore;
        self
    }

    /// The same, as an election candidate publishing `value`: a `_c_{uuid}-latch-` node
    /// (Curator's `LeaderLatch` name) whose data is `value`.
    pub(crate) fn campaigning(mut self, value: &str) -> Self {
        self.value = Some(value.into());
        self
    }

    /// The same, for a reentrant hold of `owner` (nothing changes for `None`).
    pub(crate) fn owned(mut self, owner: Option<Owner>) -> Self {
        self.owner = owner;
        self
    }

    /// The owner of the reentrant hold we queue for, if any.
    pub(crate) fn owner(&self) -> Option<Owner> {
        self.owner
    }

    /// The path of our node, once created.
    pub(crate) fn path(&self) -> Option<String> {
        self.node
            .as_ref()
            .map(|n| format!("{}/{}", self.dir, n.name))
    }

    /// The directory our node goes in.
    pub(crate) fn dir(&self) -> &str {
        &self.dir
    }

    /// The key was busy: we wait, and the grant will be a hand-off
    /// ([`Grant::after_wait`]).
    pub(crate) fn note_wait(&mut self) {
        self.waited = true;
    }

    /// Whether [`note_wait`](Self::note_wait) was called.
    pub(crate) fn waited(&self) -> bool {
        self.waited
    }

    /// A contender like this one, with a new uuid and no node yet, to queue again after
    /// our node vanished (the old one has nothing left to clean up).
    pub(crate) fn renewed(mut self) -> Self {
        self.forget();
        Self {
            client: self.client.clone(),
            acl: Arc::clone(&self.acl),
            key: Arc::clone(&self.key),
            dir: self.dir.clone(),
            uuid: uuid::Uuid::new_v4(),
            mode: self.mode,
            curator: self.curator,
            parent: self.parent,
            value: self.value.clone(),
            owner: self.owner,
            node: None,
            unsure: false,
            waited: self.waited,
        }
    }

    pub(crate) fn name(&self) -> Option<&str> {
        self.node.as_ref().map(|n| n.name.as_str())
    }

    /// Create our node (ephemeral-sequential, protected name, named for our mode) and list the key directory,
    /// in one round trip: ZooKeeper answers one session's requests in order, so the listing
    /// already holds our node. The directory is a container node that outlives its last
    /// lock node until the server's container reaper removes it, so it is usually there;
    /// when it is not (`NoNode`: first use of the key, or reaped), create it, our node and
    /// the listing in the next round trip, and the base path first if that is missing
    /// (persistent nodes). Every node gets our ACL. Our node's data is this process's
    /// [`holder_description`] (a candidate's: its value, and its name `latch-`), a key
    /// directory's the key (a semaphore's `locks` and `leases` get none); see
    /// [Inspecting](crate#inspecting). After a lost connection,
    /// finds the node the lost create may have made before creating again (Curator's
    /// protected mode).
    pub(crate) async fn create(&mut self, budget: Budget) -> Result<Vec<String>, zk::Error> {
        let name_prefix = match &self.value {
            Some(_) => nodes::latch_prefix(&self.uuid),
            None => nodes::node_prefix(&self.uuid, self.mode, self.curator),
        };
        let prefix = format!("{}/{name_prefix}", self.dir);
        let acl = Arc::clone(&self.acl);
        let acls = Acls::new(&acl);
        let container = CreateMode::Container.with_acls(acls);
        let ephemeral_sequential = CreateMode::EphemeralSequential.with_acls(acls);
        let persistent = CreateMode::Persistent.with_acls(acls);
        // Whether to send the directory's create too: only once it was found missing, since
        // a create that fails with `NodeExists` still costs the ensemble a logged write.
        let mut make_dir = false;
        let dir_data: &[u8] = match self.parent {
            Parent::Base => self.key.as_bytes(),
            Parent::Semaphore => &[],
        };
        let value = self.value.clone();
        let owned = self
            .owner
            .map(|owner| OwnerData::first(owner, holder_description()));
        let who = match &owned {
            Some(data) => data.as_slice(),
            None => value.as_deref().unwrap_or(holder_description()).as_bytes(),
        };
        for _ in 0..MAX_RETRIES {
            self.unsure = true;
            let dir = make_dir.then(|| self.client.create(&self.dir, dir_data, &container));
            let create = self.client.create(&prefix, who, &ephemeral_sequential);
            let list = self.client.list_children(&self.dir);
            let dir = async {
                match dir {
                    Some(dir) => Some(dir.await),
                    None => None,
                }
            };
            let (dir, created, listed) =
                tokio::time::timeout_at(budget.until(), futures::future::join3(dir, create, list))
                    .await
                    .map_err(|_| zk::Error::Timeout)?;
            match created {
                Ok((stat, sequence)) => {
                    self.unsure = false;
                    let name = format!("{name_prefix}{sequence}");
                    let ours = nodes::has_sequence(&name);
                    self.node = Some(Node {
                        name,
                        czxid: stat.czxid,
                    });
                    if !ours {
                        // Not the 10-digit sequence every lock client orders by (a 64-bit
                        // sequence): waiting would never end. The drop deletes the node.
                        return Err(zk::Error::UnexpectedError(format!(
                            "the server gave the lock node the sequence {sequence}, not 10 digits"
                        )));
                    }
                    return match listed {
                        Ok(children) => Ok(children),
                        Err(_) => self.list(budget).await,
                    };
                }
                Err(zk::Error::NoNode) => {
                    self.unsure = false;
                    match dir {
                        // No directory: make it with the next try.
                        None => make_dir = true,
                        // No parent yet (first use): make it, then try again.
                        Some(Err(zk::Error::NoNode)) => {
                            self.make_parent(budget, &persistent, &container).await?;
                        }
                        // The reaper removed the directory between our two creates: try
                        // again.
                        Some(Ok(_) | Err(zk::Error::NodeExists)) => {}
                        Some(Err(e)) if is_uncertain(&e) => {}
                        // The directory cannot be made (`NoAuth`: the base path's ACL does
                        // not let us create children).
                        Some(Err(e)) => return Err(e),
                    }
                }
                Err(e) if is_uncertain(&e) => {
                    tracing::info!(backend = NAME, dir = %self.dir, error = %e, "connection lost during create; looking for our node");
                    connected(&self.client).await?;
                    if let Some(node) = self.find(budget).await? {
                        tracing::info!(backend = NAME, dir = %self.dir, node = %node.name, "found the node the lost create made");
                        self.unsure = false;
                        self.node = Some(node);
                        return self.list(budget).await;
                    }
                }
                Err(e) => {
                    if is_session_over(&e) {
                        // The session's nodes are gone with it.
                        self.unsure = false;
                    }
                    return Err(e);
                }
            }
        }
        Err(zk::Error::ConnectionLoss)
    }

    /// Make the directory `dir` hangs from: the base path (persistent nodes), or a
    /// semaphore's key directory (a container node with the key as its data, in a base
    /// path made if missing).
    async fn make_parent(
        &self,
        budget: Budget,
        persistent: &zk::CreateOptions<'_>,
        container: &zk::CreateOptions<'_>,
    ) -> Result<(), zk::Error> {
        let client = &self.client;
        let parent = self.dir.rsplit_once('/').map_or("", |(parent, _)| parent);
        if self.parent == Parent::Base {
            return retry(client, budget.until(), || client.mkdir(parent, persistent)).await;
        }
        let base = parent.rsplit_once('/').map_or("", |(base, _)| base);
        for _ in 0..2 {
            match retry(client, budget.until(), || {
                client.create(parent, self.key.as_bytes(), container)
            })
            .await
            {
                Ok(_) | Err(zk::Error::NodeExists) => return Ok(()),
                Err(zk::Error::NoNode) => {
                    retry(client, budget.until(), || client.mkdir(base, persistent)).await?;
                }
                Err(e) => return Err(e),
            }
        }
        // The base path went again between our two creates: the caller tries once more.
        Ok(())
    }

    async fn list(&self, budget: Budget) -> Result<Vec<String>, zk::Error> {
        retry(&self.client, budget.until(), || {
            self.client.list_children(&self.dir)
        })
        .await
    }

    /// After a lost connection: the node our create may have made, accepted only if this
    /// session owns it. A node with our uuid from another session is deleted.
    async fn find(&self, budget: Budget) -> Result<Option<Node>, zk::Error> {
        let client = &self.client;
        // Let the server we talk to now catch up with the leader, so a create the old
        // server forwarded is visible.
        match retry(client, budget.until(), || client.sync(&self.dir)).await {
            Err(e) if is_session_over(&e) || e == zk::Error::Timeout => return Err(e),
            _ => {}
        }
        let children = match self.list(budget).await {
            Err(zk::Error::NoNode) => return Ok(None),
            children => children?,
        };
        let prefix = nodes::protected_prefix(&self.uuid);
        let session = client.session_id().0;
        let mut found = None;
        for name in children.into_iter().filter(|c| c.starts_with(&prefix)) {
            let path = format!("{}/{name}", self.dir);
            match retry(client, budget.until(), || client.check_stat(&path)).await? {
                Some(stat) if stat.ephemeral_owner == session && found.is_none() => {
                    found = Some(Node {
                        name,
                        czxid: stat.czxid,
                    });
                }
                Some(_) => {
                    tracing::info!(
                        backend = NAME,
                        path,
                        "deleting a lock node left by an abandoned create"
                    );
                    delete(client, &path, budget.until()).await?;
                }
                None => {}
            }
        }
        Ok(found)
    }

    /// Delete our node now (the acquire gave up); if that does not finish promptly, the
    /// drop leaves it to a background task.
    pub(crate) async fn withdraw(&mut self) {
        let Some(node) = self.node.clone() else {
            return;
        };
        let path = format!("{}/{}", self.dir, node.name);
        let until = Instant::now() + WITHDRAW_BOUND;
        // The directory stays, for the container reaper (see `create`).
        let deleted = match self.owner {
            Some(owner) => reentry::discard(&self.client, &path, owner, until).await,
            None => delete(&self.client, &path, until).await.map(drop),
        };
        match deleted {
            Ok(()) => self.node = None,
            Err(e) => {
                tracing::debug!(backend = NAME, path, error = %e, "withdrawal continues in the background");
            }
        }
    }

    /// Our node is gone already (or deleted by a re-entry); nothing to clean up.
    pub(crate) fn forget(&mut self) {
        self.node = None;
        self.unsure = false;
    }

    /// Our node, which holds the key, as a reentrant hold's node (the caller makes the
    /// grant, see [`reentry::grant`]).
    pub(crate) fn into_hold(mut self) -> reentry::HoldNode {
        let node = self.node.take().expect("a held contender has its node");
        reentry::HoldNode {
            path: format!("{}/{}", self.dir, node.name),
            czxid: node.czxid,
            kept: true,
        }
    }

    /// The grant of our node, which holds the key. A negative czxid (no ZooKeeper hands one
    /// out) is refused as a protocol error, and the node is deleted as for a failed acquire.
    pub(crate) fn into_grant(mut self, key: &str, sent_at: Instant) -> Result<Grant, zk::Error> {
        let czxid = self
            .node
            .as_ref()
            .expect("a held contender has its node")
            .czxid;
        let Some(fencing_token) = token(czxid) else {
            return Err(zk::Error::UnexpectedError(format!(
                "the server gave the lock node a negative czxid ({czxid}); not a ZooKeeper answer"
            )));
        };
        let node = self.node.take().expect("a held contender has its node");
        let path = format!("{}/{}", self.dir, node.name);
        let timeout = self.client.session_timeout();
        let gone = watch_node(self.client.clone(), path.clone());
        let lost = watch_lease(self.client.clone(), path.clone(), gone.clone(), timeout);
        let held = ZookeeperHeld {
            client: self.client.clone(),
            key: key.to_owned(),
            path,
            gone,
        };
        // The session keeps every node of the client alive; `watch_lease` reports the end
        // of the session and the deletion of our node. It times a disconnect from when it
        // sees it, and sets the node's watch when first polled: listened to from the grant.
        let grant = Grant::new(fencing_token, Box::new(held), sent_at)
            .with_lost(Box::pin(lost))
            .kept_alive()
            .listened_from_grant();
        Ok(match self.waited {
            true => grant.after_wait(),
            false => grant,
        })
    }
}

impl Drop for Contender {
    fn drop(&mut self) {
        if self.node.is_none() && !self.unsure {
            return;
        }
        if tokio::runtime::Handle::try_current().is_err() {
            tracing::warn!(backend = NAME, dir = %self.dir, "acquire dropped outside a tokio runtime: its node goes when the session ends");
            return;
        }
        let client = self.client.clone();
        let dir = std::mem::take(&mut self.dir);
        let name = self.node.take().map(|n| n.name);
        let prefix = nodes::protected_prefix(&self.uuid);
        let owner = self.owner;
        dlock_core::raw::spawn_cleanup(async move {
            let until = Instant::now() + client.session_timeout() * 2;
            let names = match name {
                Some(name) => vec![name],
                None => match retry(&client, until, || client.list_children(&dir)).await {
                    Ok(children) => children
                        .into_iter()
                        .filter(|c| c.starts_with(&prefix))
                        .collect(),
                    Err(_) => Vec::new(),
                },
            };
            for name in names {
                let path = format!("{dir}/{name}");
                let deleted = match owner {
                    Some(owner) => reentry::discard(&client, &path, owner, until).await,
                    None => delete(&client, &path, until).await.map(drop),
                };
                if let Err(e) = deleted {
                    tracing::warn!(backend = NAME, path, error = %e, "could not delete an abandoned lock node; it goes when the session ends");
                }
            }
        });
    }
}

/// The fencing token: the lock node's czxid, the zxid of the transaction that created it.
/// Zxids only grow (across leader changes too), and a later holder's node was created after
/// every earlier holder's.
pub(crate) fn token(czxid: i64) -> Option<u64> {
    u64::try_from(czxid).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_czxids() {
        assert_eq!(token(0x1_0000_0005), Some(0x1_0000_0005));
        assert_eq!(token(0), Some(0));
        assert_eq!(token(-1), None, "a negative czxid is not a token");
    }
}
