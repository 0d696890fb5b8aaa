//! Looking without touching: a key's holders and waiters, and the held keys under a prefix,
//! read with `getChildren` and `getData` only, pipelined (see [Inspecting](crate#inspecting)).
//! Nothing is created, changed or deleted, and no watch is left behind.

use std::time::{Duration, SystemTime};

use dlock_core::raw::Deadline;
use dlock_core::{HolderStatus, KeyStatus, Mode, Result, WaiterStatus};
use futures::StreamExt;
use futures::future::join_all;
use tokio::time::Instant;
use zookeeper_client::{self as zk, Stat};

use crate::NAME;
use crate::config::{Segment, key_segment, parse_segment};
use crate::error::Error;
use crate::nodes::{self, Node};
use crate::request::retry;
use crate::semaphore::{LEASES, LOCKS};
use crate::session::ZookeeperBackend;

/// The longest `who` shown from a node's data (another client may keep anything there).
const MAX_WHO: usize = 256;
/// How many key directories [`ZookeeperBackend::held_keys`] reads at once.
const LIST_IN_FLIGHT: usize = 256;

/// A node read with `getData`: its name, data and stat.
struct Read {
    name: String,
    data: Vec<u8>,
    stat: Stat,
}

impl ZookeeperBackend {
    /// Who holds `key` and who waits. Two round trips (one when the key has no node):
    /// `getChildren` of the key directory and of a semaphore's `locks` and `leases`,
    /// pipelined; then `getData` of every node listed, pipelined.
    pub(crate) async fn status(&self, key: &str) -> Result<KeyStatus> {
        let (client, until) = self.reader().await?;
        let failed = |e| Error::zk("inspect", e);
        let dir = self.config.key_dir(key);
        let (locks, leases) = (format!("{dir}/{LOCKS}"), format!("{dir}/{LEASES}"));
        let (listed, queued, leased) = tokio::join!(
            children(&client, until, &dir),
            children(&client, until, &locks),
            children(&client, until, &leases),
        );
        let order = nodes::contenders(listed.map_err(failed)?);
        let queue = nodes::contenders(queued.map_err(failed)?);
        let leased = leased.map_err(failed)?;
        let (order, queue, leased) = tokio::join!(
            read_contenders(&client, until, &dir, order),
            read_contenders(&client, until, &locks, queue),
            read_all(&client, until, &leases, leased),
        );
        let mut status = KeyStatus::new(key, true);
        let waiters = status.waiters.get_or_insert_with(Vec::new);
        // A lock: the contenders that hold in their mode, and the others in queue order.
        let order = order.map_err(failed)?;
        let (nodes, reads): (Vec<Node>, Vec<Read>) = order.into_iter().unzip();
        for (at, (node, read)) in nodes.iter().zip(&reads).enumerate() {
            match nodes::waits_for(&nodes, at) {
                None => status.holders.push(holder(node.mode, read)),
                Some(_) => waiters.push(waiter(node.mode, read)),
            }
        }
        // A semaphore: every lease node holds a permit (as Curator counts them) but the one
        // the acquirer at the front of the `locks` queue may have made and is still
        // counting with; the `locks` queue waits.
        let queue = queue.map_err(failed)?;
        let mut leased = leased.map_err(failed)?;
        leased.sort_by_key(|read| read.stat.czxid);
        if let Some(pending) = queue
            .first()
            .and_then(|(_, counting)| pending_lease(&leased, &counting.stat))
        {
            leased.remove(pending);
        }
        let permits = Mode::Permits(0);
        status
            .holders
            .extend(leased.iter().map(|read| holder(permits, read)));
        waiters.extend(queue.iter().map(|(_, read)| waiter(permits, read)));
        Ok(status)
    }

    /// The held keys starting with `prefix`, sorted. `getChildren` of the base path, then
    /// per key directory whose name may hold such a key (pipelined): `getChildren` (and
    /// `getData` for a name shortened with a digest, whose key is the directory's data);
    /// for a semaphore without lock nodes, `getChildren` of its `leases`.
    pub(crate) async fn held_keys(&self, prefix: &str) -> Result<Vec<String>> {
        let (client, until) = self.reader().await?;
        let failed = |e| Error::zk("list", e);
        let base = self.config.base.as_str();
        let names = children(&client, until, base).await.map_err(failed)?;
        let candidates = names.into_iter().filter_map(|name| {
            let segment = parse_segment(&name)?;
            let may_match = match &segment {
                Segment::Key(key) => key.starts_with(prefix),
                Segment::Shortened(head) => {
                    let wanted = prefix.as_bytes();
                    match head.len() >= wanted.len() {
                        true => head.starts_with(wanted),
                        false => wanted.starts_with(head),
                    }
                }
            };
            may_match.then_some((name, segment))
        });
        let answers: Vec<_> = futures::stream::iter(candidates)
            .map(|(name, segment)| held_key(&client, until, base, name, segment, prefix))
            .buffer_unordered(LIST_IN_FLIGHT)
            .collect()
            .await;
        let mut held = Vec::new();
        for answer in answers {
            held.extend(answer.map_err(failed)?);
        }
        held.sort_unstable();
        Ok(held)
    }

    /// The session's client (a new session if the last one ended) and how long its
    /// requests may take: a session timeout, as for an acquire's.
    async fn reader(&self) -> Result<(zk::Client, Instant)> {
        let deadline = Deadline::At(Instant::now() + self.config.connect_timeout);
        let client = self.client(deadline).await?;
        let until = Instant::now() + client.session_timeout();
        Ok((client, until))
    }
}

/// Whether the key directory `{base}/{name}` is held, and by which key: `Some(key)` when
/// it has a contender or a lease node (and, for a shortened name, its data is a key of
/// that name starting with `prefix`).
async fn held_key(
    client: &zk::Client,
    until: Instant,
    base: &str,
    name: String,
    segment: Segment,
    prefix: &str,
) -> Result<Option<String>, zk::Error> {
    let dir = format!("{base}/{name}");
    let data = async {
        match segment {
            Segment::Key(key) => Ok::<_, zk::Error>(Some(key)),
            Segment::Shortened(_) => {
                let key = read(client, until, &dir)
                    .await?
                    .and_then(|(data, _)| String::from_utf8(data).ok())
                    .filter(|key| key_segment(key) == name);
                if key.is_none() {
                    tracing::debug!(
                        backend = NAME,
                        dir,
                        "a shortened key directory whose data is not its key (made by \
                         another client or an older dlock): not listed"
                    );
                }
                Ok(key)
            }
        }
    };
    let (listed, key) = tokio::join!(children(client, until, &dir), data);
    let Some(key) = key?.filter(|key| key.starts_with(prefix)) else {
        return Ok(None);
    };
    let listed = listed?;
    if listed.iter().any(|child| nodes::parse(child).is_some()) {
        return Ok(Some(key));
    }
    if !listed.iter().any(|child| child == LEASES) {
        return Ok(None);
    }
    let leases = children(client, until, &format!("{dir}/{LEASES}")).await?;
    Ok((!leases.is_empty()).then_some(key))
}

/// The children of `dir`; none when it is missing.
async fn children(
    client: &zk::Client,
    until: Instant,
    dir: &str,
) -> Result<Vec<String>, zk::Error> {
    match retry(client, until, || client.list_children(dir)).await {
        Err(zk::Error::NoNode) => Ok(Vec::new()),
        answer => answer,
    }
}

/// The data and stat of `path`; `None` when it is gone.
async fn read(
    client: &zk::Client,
    until: Instant,
    path: &str,
) -> Result<Option<(Vec<u8>, Stat)>, zk::Error> {
    match retry(client, until, || client.get_data(path)).await {
        Err(zk::Error::NoNode) => Ok(None),
        answer => answer.map(Some),
    }
}

/// Every child `names` of `dir` read at once (pipelined); those gone meanwhile left out.
async fn read_all(
    client: &zk::Client,
    until: Instant,
    dir: &str,
    names: Vec<String>,
) -> Result<Vec<Read>, zk::Error> {
    let reads = names.into_iter().map(|name| async move {
        let path = format!("{dir}/{name}");
        let read = read(client, until, &path).await?;
        Ok(read.map(|(data, stat)| Read { name, data, stat }))
    });
    join_all(reads)
        .await
        .into_iter()
        .filter_map(Result::transpose)
        .collect()
}

/// The contenders `order` of `dir`, read at once, in their order; those gone meanwhile left
/// out (the order of the others is unchanged, and holds as it would without them).
async fn read_contenders(
    client: &zk::Client,
    until: Instant,
    dir: &str,
    order: Vec<Node>,
) -> Result<Vec<(Node, Read)>, zk::Error> {
    let names = order.iter().map(|node| node.name.clone()).collect();
    let mut reads = read_all(client, until, dir, names)
        .await?
        .into_iter()
        .peekable();
    let mut read = Vec::new();
    for node in order {
        if let Some(next) = reads.next_if(|r| r.name == node.name) {
            read.push((node, next));
        }
    }
    Ok(read)
}

/// Of `leased` (in creation order), the lease node the acquirer holding the semaphore's
/// mutex (its mutex node's stat: `counting`) made and is still counting with: the last one
/// its session created after its mutex node. The acquirer deletes its mutex node once
/// admitted, before its acquire returns; until then its lease is a waiter's.
fn pending_lease(leased: &[Read], counting: &Stat) -> Option<usize> {
    let owner = counting.ephemeral_owner;
    leased.iter().rposition(|lease| {
        owner != 0 && lease.stat.ephemeral_owner == owner && lease.stat.czxid > counting.czxid
    })
}

fn holder(mode: Mode, read: &Read) -> HolderStatus {
    let mut holder = HolderStatus::new(mode);
    // The token the holder got: its node's czxid (see `contender::token`).
    holder.fencing_token = u64::try_from(read.stat.czxid).ok();
    holder.since = since(read.stat.ctime);
    holder.who = who(&read.data);
    holder
}

fn waiter(mode: Mode, read: &Read) -> WaiterStatus {
    let mut waiter = WaiterStatus::new();
    waiter.mode = Some(mode);
    waiter.since = since(read.stat.ctime);
    waiter.who = who(&read.data);
    waiter
}

/// When the node was created, by the server's clock.
fn since(ctime: i64) -> Option<SystemTime> {
    let ms = u64::try_from(ctime).ok()?;
    SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}

/// A node's data as its holder's description: dlock's `NAME@HOST:PID`, Curator's IP
/// address, kazoo's identifier; for a reentrant hold, its owner and count first
/// (`job-7 (held 3 times) by NAME@HOST:PID`); `None` when empty.
fn who(data: &[u8]) -> Option<String> {
    let described = crate::reentry::describe(data);
    let text = match &described {
        Some(described) => described.as_str().into(),
        None => String::from_utf8_lossy(data),
    };
    let who: String = text
        .trim()
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_WHO)
        .collect();
    (!who.is_empty()).then_some(who)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_is_the_data_made_printable() {
        assert_eq!(who(b"app@host:42"), Some("app@host:42".to_owned()));
        assert_eq!(who(b"10.0.0.7"), Some("10.0.0.7".to_owned()));
        assert_eq!(who(b""), None);
        assert_eq!(who(b" \n"), None);
        assert_eq!(who(b"a\x00b\xff"), Some("ab\u{fffd}".to_owned()));
        assert_eq!(who(&[b'x'; 1000]).map(|w| w.len()), Some(MAX_WHO));
    }

    #[test]
    fn since_is_the_node_ctime() {
        assert_eq!(
            since(1_700_000_000_123),
            Some(SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123))
        );
        assert_eq!(since(-1), None);
    }

    fn stat(czxid: i64, ephemeral_owner: i64) -> Stat {
        Stat {
            czxid,
            mzxid: czxid,
            pzxid: czxid,
            ctime: 0,
            mtime: 0,
            version: 0,
            cversion: 0,
            aversion: 0,
            ephemeral_owner,
            data_length: 0,
            num_children: 0,
        }
    }

    fn lease(czxid: i64, owner: i64) -> Read {
        Read {
            name: format!("_c_x-lease-{czxid:010}"),
            data: Vec::new(),
            stat: stat(czxid, owner),
        }
    }

    #[test]
    fn the_counting_acquirers_lease_is_not_a_holder() {
        let counting = stat(10, 7);
        // Session 7 holds a permit from before it queued (czxid 3) and counts with 12.
        let leased = [lease(3, 7), lease(5, 8), lease(12, 7)];
        assert_eq!(pending_lease(&leased, &counting), Some(2));
        // Admitted, or not created yet: every lease holds.
        assert_eq!(pending_lease(&leased[..2], &counting), None);
        // Another session's lease, even a later one, is not its.
        assert_eq!(pending_lease(&[lease(12, 8)], &counting), None);
        // A persistent mutex node (owner 0) owns no lease.
        assert_eq!(pending_lease(&[lease(12, 0)], &stat(10, 0)), None);
    }
}
