//! Reentrant holds ([`Owner`]): the owner and the hold count live in the data of the lock
//! node that holds the key, changed only by compare-and-set on the node's data version. See
//! [Reentrant holds](crate#reentrant-holds).
//!
//! The data of an owner's node is `dlock-owner/1 {count} {owner} {write} {who}`: a tag that
//! plain holds (`NAME@HOST:PID`), Curator (an IP address) and kazoo (its identifier) do not
//! write, the count, the owner id (no spaces), the random id of the write that set it (to
//! tell, after a lost connection, whether our compare-and-set went through) and the
//! description of the process that created the node.

mod held;
mod hints;

pub(crate) use held::{HoldNode, grant};
pub(crate) use hints::Hints;

use dlock_core::Owner;
use tokio::time::Instant;
use zookeeper_client::{self as zk, Stat};

use crate::NAME;
use crate::error::is_uncertain;
use crate::request::retry;
use crate::session::connected;

/// The tag an owner's node data starts with.
const TAG: &str = "dlock-owner/1";
/// How many compare-and-set rounds one release or re-entry tries before giving up (each
/// lost round means another lease of the owner changed the count meanwhile).
const MAX_ROUNDS: usize = 256;

/// The owner and count kept in a holding node's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OwnerData {
    pub(crate) count: u64,
    pub(crate) owner: String,
    write: u64,
    pub(crate) who: String,
}

impl OwnerData {
    /// The data of a new owner node: count 1.
    pub(crate) fn first(owner: Owner, who: &str) -> Vec<u8> {
        Self {
            count: 1,
            owner: owner.as_str().to_owned(),
            write: rand_id(),
            who: who.to_owned(),
        }
        .encode()
    }

    /// Parse a node's data; `None` for anything but an owner's node.
    pub(crate) fn parse(data: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(data).ok()?;
        let mut fields = text.splitn(5, ' ');
        if fields.next()? != TAG {
            return None;
        }
        let count = fields.next()?.parse().ok().filter(|&n| n >= 1)?;
        let owner = fields
            .next()
            .filter(|o| Owner::new(o).check(NAME).is_ok())?;
        let write = u64::from_str_radix(fields.next()?, 16).ok()?;
        Some(Self {
            count,
            owner: owner.to_owned(),
            write,
            who: fields.next().unwrap_or_default().to_owned(),
        })
    }

    fn encode(&self) -> Vec<u8> {
        format!(
            "{TAG} {} {} {:016x} {}",
            self.count, self.owner, self.write, self.who
        )
        .into_bytes()
    }

    fn is(&self, owner: Owner) -> bool {
        self.owner == owner.as_str()
    }

    /// The same hold with `count`, written by a new write id.
    fn with_count(&self, count: u64) -> Self {
        Self {
            count,
            write: rand_id(),
            ..self.clone()
        }
    }
}

fn rand_id() -> u64 {
    uuid::Uuid::new_v4().as_u64_pair().0
}

/// Whether a node's `data` says it is a hold of `owner`.
pub(crate) fn is_owners(data: &[u8], owner: Owner) -> bool {
    OwnerData::parse(data).is_some_and(|d| d.is(owner))
}

/// `holder` (read as `data` with its `stat`) is `owner`'s hold of the key: raise its count
/// and delete our own queued node `ours` (version 0: it never held, so nobody re-entered
/// it) in one `multi`. `false`: the holder changed meanwhile (list again).
pub(crate) async fn reenter(
    client: &zk::Client,
    holder: &str,
    data: &[u8],
    stat: &Stat,
    ours: &str,
    until: Instant,
) -> Result<bool, zk::Error> {
    let Some(hold) = OwnerData::parse(data) else {
        return Ok(false);
    };
    let raised = hold.with_count(hold.count + 1).encode();
    let attempt = async {
        let mut multi = client.new_multi_writer();
        multi.add_set_data(holder, &raised, Some(stat.version))?;
        multi.add_delete(ours, Some(0))?;
        multi.commit().await.map_err(zk::Error::from)
    };
    match tokio::time::timeout_at(until, attempt)
        .await
        .unwrap_or(Err(zk::Error::Timeout))
    {
        Ok(_) => Ok(true),
        Err(zk::Error::BadVersion | zk::Error::NoNode) => Ok(false),
        Err(e) if is_uncertain(&e) => {
            // The multi deleted our node if and only if it went through.
            connected(client).await?;
            let ours = retry(client, until, || client.check_stat(ours)).await?;
            Ok(ours.is_none())
        }
        Err(e) => Err(e),
    }
}

/// What a read of a hold's node found.
enum Read {
    /// `owner`'s hold: its data and data version.
    Hold(OwnerData, i32),
    /// No node at the path.
    Gone,
    /// Another node's data, or another hold (another owner, or another `czxid`).
    Other,
}

/// Read the node at `path`: is it `owner`'s hold, created at `czxid` when that is known?
async fn read_hold(
    client: &zk::Client,
    path: &str,
    czxid: Option<i64>,
    owner: Owner,
    until: Instant,
) -> Result<Read, zk::Error> {
    let (data, stat) = match retry(client, until, || client.get_data(path)).await {
        Err(zk::Error::NoNode) => return Ok(Read::Gone),
        read => read?,
    };
    let hold = OwnerData::parse(&data).filter(|d| d.is(owner));
    Ok(match hold {
        Some(hold) if czxid.is_none_or(|c| c == stat.czxid) => Read::Hold(hold, stat.version),
        _ => Read::Other,
    })
}

/// What [`lower`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lowered {
    /// The node is gone, or is not that hold of the owner (any more).
    NotHeld,
    /// The count went down by one and is above zero: the data written, and the node's data
    /// version after the write.
    Counted(OwnerData, i32),
    /// The count reached zero: the node was deleted.
    Freed,
}

/// Lower the count of the hold on `path` (created at `czxid`, when known) by one, deleting
/// the node at zero (version-checked: any session may). With `written` (the data and
/// version this client last wrote there), the first round writes at that version without
/// reading the node: one round trip unless another client moved the count since.
pub(crate) async fn lower(
    client: &zk::Client,
    path: &str,
    czxid: Option<i64>,
    owner: Owner,
    written: Option<(OwnerData, i32)>,
    until: Instant,
) -> Result<Lowered, zk::Error> {
    let gone = |uncertain: bool| match uncertain {
        true => Lowered::Freed,
        false => Lowered::NotHeld,
    };
    let mut uncertain = false;
    let mut written = written;
    for _ in 0..MAX_ROUNDS {
        let (hold, version) = match written.take() {
            Some(known) => known,
            None => match read_hold(client, path, czxid, owner, until).await? {
                Read::Hold(hold, version) => (hold, version),
                Read::Gone => return Ok(gone(uncertain)),
                Read::Other => return Ok(Lowered::NotHeld),
            },
        };
        let lowered = hold.with_count(hold.count - 1);
        let write = async {
            match hold.count {
                1 => client.delete(path, Some(version)).await.map(|()| None),
                _ => client
                    .set_data(path, &lowered.encode(), Some(version))
                    .await
                    .map(Some),
            }
        };
        match tokio::time::timeout_at(until, write)
            .await
            .unwrap_or(Err(zk::Error::Timeout))
        {
            Ok(None) => return Ok(Lowered::Freed),
            Ok(Some(now)) => return Ok(Lowered::Counted(lowered, now.version)),
            Err(zk::Error::BadVersion) => {}
            Err(zk::Error::NoNode) => return Ok(gone(uncertain)),
            Err(e) if is_uncertain(&e) => {
                connected(client).await?;
                uncertain = true;
                // A delete that went through leaves no node: the next read says so. A
                // count that went through is one version on, with our write id.
                if hold.count > 1 {
                    match retry(client, until, || client.get_data(path)).await {
                        Err(zk::Error::NoNode) => return Ok(Lowered::Freed),
                        read => {
                            let (data, now) = read?;
                            let ours =
                                OwnerData::parse(&data).is_some_and(|d| d.write == lowered.write);
                            if now.version == version.wrapping_add(1) && ours {
                                return Ok(Lowered::Counted(lowered, now.version));
                            }
                            if now.version != version {
                                // Changed since, by someone: whether ours went through
                                // cannot be told any more.
                                return Err(zk::Error::ConnectionLoss);
                            }
                        }
                    }
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(zk::Error::ConnectionLoss)
}

/// Raise the count of `owner`'s hold on `path` (created at `czxid`) by one: `getData`, then
/// `setData` with the version read; with `written` (see [`lower`]), `setData` at that
/// version first. The node's stat after the write (its `czxid` is the token) and the data
/// written; `None` when the node is gone or is not that hold.
pub(crate) async fn raise(
    client: &zk::Client,
    path: &str,
    czxid: i64,
    owner: Owner,
    written: Option<(OwnerData, i32)>,
    until: Instant,
) -> Result<Option<(Stat, OwnerData)>, zk::Error> {
    let mut written = written;
    for _ in 0..MAX_ROUNDS {
        let (hold, version) = match written.take() {
            Some(known) => known,
            None => match read_hold(client, path, Some(czxid), owner, until).await? {
                Read::Hold(hold, version) => (hold, version),
                Read::Gone | Read::Other => return Ok(None),
            },
        };
        let raised = hold.with_count(hold.count + 1);
        let write = client.set_data(path, &raised.encode(), Some(version));
        match tokio::time::timeout_at(until, write)
            .await
            .unwrap_or(Err(zk::Error::Timeout))
        {
            // Only the hold's node has its path (a lock node's name carries a random
            // uuid): the czxid only confirms it.
            Ok(now) if now.czxid == czxid => return Ok(Some((now, raised))),
            Ok(_) => return Ok(None),
            Err(zk::Error::BadVersion) => {}
            Err(zk::Error::NoNode) => return Ok(None),
            Err(e) if is_uncertain(&e) => {
                connected(client).await?;
                let (data, now) = match retry(client, until, || client.get_data(path)).await {
                    Err(zk::Error::NoNode) => return Ok(None),
                    read => read?,
                };
                let ours = OwnerData::parse(&data).is_some_and(|d| d.write == raised.write);
                if now.version == version.wrapping_add(1) && ours {
                    return Ok(Some((now, raised)));
                }
                if now.version != version {
                    return Err(zk::Error::ConnectionLoss);
                }
            }
            Err(e) => return Err(e),
        }
    }
    Err(zk::Error::ConnectionLoss)
}

/// Delete our queued owner node `path` (the acquire gave up): version 0 while nobody
/// re-entered it; if someone did (it held the key for a moment and another lease of the
/// owner counts on it), lower its count instead.
pub(crate) async fn discard(
    client: &zk::Client,
    path: &str,
    owner: Owner,
    until: Instant,
) -> Result<(), zk::Error> {
    let first = tokio::time::timeout_at(until, client.delete(path, Some(0)))
        .await
        .unwrap_or(Err(zk::Error::Timeout));
    match first {
        Ok(()) | Err(zk::Error::NoNode) => Ok(()),
        Err(_) => lower(client, path, None, owner, None, until)
            .await
            .map(drop),
    }
}

/// For [Inspecting](crate#inspecting): an owner node's data as `who`, e.g.
/// `job-7 (held 3 times) by app@host:42`.
pub(crate) fn describe(data: &[u8]) -> Option<String> {
    let hold = OwnerData::parse(data)?;
    let times = match hold.count {
        1 => "once".to_owned(),
        n => format!("{n} times"),
    };
    Some(match hold.who.is_empty() {
        true => format!("{} (held {times})", hold.owner),
        false => format!("{} (held {times}) by {}", hold.owner, hold.who),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_data_round_trips_and_others_do_not_parse() {
        let data = OwnerData::first(Owner::new("job-7"), "app@host:42");
        let hold = OwnerData::parse(&data).unwrap();
        assert_eq!((hold.count, hold.owner.as_str()), (1, "job-7"));
        assert_eq!(hold.who, "app@host:42");
        let raised = OwnerData::parse(&hold.with_count(3).encode()).unwrap();
        assert_eq!(raised.count, 3);
        assert_ne!(raised.write, hold.write);
        assert!(raised.is(Owner::new("job-7")) && !raised.is(Owner::new("job-8")));
        assert_eq!(
            describe(&hold.with_count(3).encode()).as_deref(),
            Some("job-7 (held 3 times) by app@host:42")
        );
        for other in [
            &b"app@host:42"[..],
            b"10.0.0.7",
            b"",
            b"dlock-owner/1 0 job-7 00 x",
            b"dlock-owner/1 2 job-7 zz",
            b"dlock-owner/1 x job-7 00",
            b"dlock-owner/2 1 job-7 00",
            b"\xff\xfe",
        ] {
            assert_eq!(OwnerData::parse(other), None, "{other:?}");
        }
    }
}
