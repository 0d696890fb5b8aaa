//! Elections, as Go's `concurrency.Election` runs them on the mutex's layout: a campaign
//! is an exclusive acquire whose key carries the candidate's value ([`crate::lock`]),
//! [`leader`] reads the oldest key under the lock prefix (Go's `Leader`), [`changes`]
//! watches the prefix (Go's `Observe`), and [`proclaim`] puts a new value on our key if it
//! is still ours (Go's `Proclaim`).

use std::time::Duration;

use dlock_core::{Leader, LockError, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp, WatchOptions,
    WatchStream,
};
use futures::stream::{self, BoxStream, StreamExt};

use crate::NAME;
use crate::acquire::{PERMITS, READERS, blocking_ranges};
use crate::connection::Conn;
use crate::error::{Error, not_held};
use crate::inspect::read_value;

/// How long an observer goes without reading the leader. The watch on the prefix carries
/// every change the server makes there, a lease's expiry included (etcd deletes its keys,
/// and the deletions are events), so this only bounds a watch that stalls without failing
/// (a member cut off from its leader, before `require_leader` cancels the watch): one
/// linearizable read per observer per second is cheap, and a stall is seen within it.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// The leader of the election under `prefix` (`{lock name}/`): the oldest key under it
/// (one linearizable range read, sorted by create revision, limit 1: Go's
/// `Get(prefix, WithFirstCreate())`), if it is an exclusive one (a reader or a permit that
/// holds the key is not a leader); its value, as `inspect` shows it (an empty one, as
/// Go's `Mutex` puts: `lease {id}`), and its create revision, the term.
pub(crate) async fn leader(conn: &Conn, prefix: &str) -> Result<Option<Leader>> {
    const OP: &str = "leader";
    let (start, end) = blocking_ranges(prefix, dlock_core::Mode::Exclusive).remove(0);
    let read = || {
        let (mut kv, start, end) = (conn.client.kv_client(), start.clone(), end.clone());
        async move {
            let first = GetOptions::new()
                .with_range(end)
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1);
            kv.get(start, Some(first)).await
        }
    };
    let answer = conn.call(OP, read).await?;
    let Some(kv) = answer.kvs().first() else {
        return Ok(None);
    };
    let name = kv.key().strip_prefix(prefix.as_bytes()).unwrap_or_default();
    if name.starts_with(READERS.as_bytes()) || name.starts_with(PERMITS.as_bytes()) {
        return Ok(None);
    }
    let value = read_value(kv.value(), false)
        .0
        .unwrap_or_else(|| format!("lease {:x}", kv.lease()));
    let term = u64::try_from(kv.create_revision()).map_err(|_| Error::Protocol {
        op: OP,
        what: "a negative revision",
    })?;
    Ok(Some(Leader::new(value, term)))
}

/// Put `value` on `my_key` (with `lease`) if its create revision is still `rev`: Go's
/// `Proclaim`, one transaction (one raft commit). `NotHeld` when the key is not ours.
pub(crate) async fn proclaim(
    conn: &Conn,
    key: &str,
    my_key: &str,
    rev: i64,
    lease: i64,
    value: &str,
) -> Result<()> {
    let txn = Txn::new()
        .when([Compare::create_revision(my_key, CompareOp::Equal, rev)])
        .and_then([TxnOp::put(
            my_key,
            value,
            Some(PutOptions::new().with_lease(lease)),
        )]);
    match conn.txn("proclaim", txn).await?.succeeded() {
        true => Ok(()),
        false => Err(not_held(key)),
    }
}

/// A stream that yields whenever a key under `prefix` is put or deleted (a candidate
/// queues or is granted, a proclaim, a resignation, a lease's expiry): one watch on the
/// prefix, from the current revision, on a stream of its own, created (the server's
/// answer read) before this returns. Ends with an error when the watch does.
pub(crate) async fn changes(conn: &Conn, prefix: &str) -> Result<BoxStream<'static, Result<()>>> {
    const OP: &str = "observe";
    let open = || {
        let (mut watch, prefix) = (conn.client.watch_client(), prefix.to_owned());
        async move {
            let mut stream = watch
                .watch(prefix, Some(WatchOptions::new().with_prefix()))
                .await?;
            match stream.message().await? {
                Some(created) if created.created() && !created.canceled() => Ok(stream),
                Some(refused) => Err(etcd_client::Error::WatchError(format!(
                    "the server did not create the watch: {}",
                    refused.cancel_reason()
                ))),
                None => Err(etcd_client::Error::WatchError(
                    "the watch stream ended before the watch was created".into(),
                )),
            }
        }
    };
    let stream = conn.call(OP, open).await?;
    Ok(stream::unfold(Some(stream), next_change).boxed())
}

/// The next change on `stream`: `Ok` for a response with events; an error, and then the
/// end, when the watch breaks.
async fn next_change(stream: Option<WatchStream>) -> Option<(Result<()>, Option<WatchStream>)> {
    const OP: &str = "observe";
    let mut stream = stream?;
    loop {
        let broken = match stream.message().await {
            Ok(Some(response)) if response.canceled() => LockError::backend(
                NAME,
                OP,
                format!(
                    "the server canceled the watch: {}",
                    response.cancel_reason()
                ),
            ),
            Ok(Some(response)) if response.events().is_empty() => continue,
            Ok(Some(_)) => return Some((Ok(()), Some(stream))),
            Ok(None) => LockError::unavailable(NAME, OP, "the watch stream ended"),
            Err(e) => Error::etcd(OP, e).into(),
        };
        return Some((Err(broken), None));
    }
}
