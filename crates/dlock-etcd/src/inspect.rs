//! Reading locks without touching them: [`inspect`] shows one lock's holders and queue from
//! one range read of its prefix (and the holders' leases' remaining ttls), [`list`] the held
//! keys under a prefix from one keys-only range read of the namespace. Each contender key
//! carries its holder's description as its value ([`key_value`]), which is how `who` is
//! known; the holders are told from the waiters by the crate's own rules ([`status`]).

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use dlock_core::raw::key;
use dlock_core::{HolderStatus, KeyStatus, Mode, Result, WaiterStatus, holder_description};
use etcd_client::{GetOptions, KeyValue, SortOrder, SortTarget};
use futures::StreamExt as _;

use crate::NAME;
use crate::acquire::{PERMITS, READERS};
use crate::config::EtcdConfig;
use crate::connection::Conn;

/// What a permit key's value says after its holder's description: its limit, which etcd
/// keeps nowhere else and without which a permit holder cannot be told from a waiter.
const LIMIT_TAG: &str = " permits=";

/// The longest `who` shown from a value not written by dlock (in characters).
const MAX_WHO: usize = 256;

/// How many `LeaseTimeToLive` requests [`inspect`] has in flight at once.
const TTL_READS: usize = 16;

/// The value a contender key is put with: this process's
/// [`holder_description`] (`NAME@HOST:PID`), followed for a permit by its limit
/// (` permits=N`). Go's `Mutex` puts an empty value and never reads it, so `etcdctl lock`
/// is not disturbed. An election candidate's key carries its value instead.
pub(crate) fn key_value(mode: Mode) -> String {
    match mode {
        Mode::Permits(limit) => format!("{}{LIMIT_TAG}{limit}", holder_description()),
        Mode::Exclusive | Mode::Shared => holder_description().to_owned(),
    }
}

/// A contender key's value read back: who put it (`None` for an empty value, as Go's
/// `Mutex` and `etcdctl lock` put), and a permit's limit where it is written. Not trimmed:
/// an election's value is shown exactly as the candidate published it.
pub(crate) fn read_value(value: &[u8], permit: bool) -> (Option<String>, Option<u32>) {
    // An owner hold's: `job-7 (held 3 times) NAME@HOST:PID`.
    if let Some(owned) = crate::reentry::describe(value, true) {
        return (Some(owned), None);
    }
    let text = String::from_utf8_lossy(value);
    let (who, limit) = match text.rsplit_once(LIMIT_TAG) {
        Some((who, limit)) if permit => match limit.parse::<u32>() {
            Ok(limit) if limit > 0 => (who, Some(limit)),
            _ => (text.as_ref(), None),
        },
        _ => (text.as_ref(), None),
    };
    let who = (!who.is_empty()).then(|| who.chars().take(MAX_WHO).collect());
    (who, limit)
}

/// One etcd key under a lock's prefix, as [`status`] reads it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Contender<'a> {
    /// The etcd key.
    pub(crate) key: &'a [u8],
    pub(crate) value: &'a [u8],
    pub(crate) create_revision: i64,
    /// 0 for a key on no lease.
    pub(crate) lease: i64,
}

impl<'a> From<&'a KeyValue> for Contender<'a> {
    fn from(kv: &'a KeyValue) -> Self {
        Self {
            key: kv.key(),
            value: kv.value(),
            create_revision: kv.create_revision(),
            lease: kv.lease(),
        }
    }
}

/// The status of `key` from the keys under its lock prefix (`{lock name}/`), with the
/// lease of each holder (in the order of `holders`; 0 for a key on no lease).
///
/// A key's mode is its name's: `read/…` a reader, `permit/…` a permit, anything else
/// exclusive (ours, Go's `Mutex`'s, `etcdctl lock`'s). Oldest first (by create revision),
/// a key holds as the acquire decides: an exclusive key when no key is older, a reader when
/// no key outside the readers' range is older, a permit when fewer than its limit of
/// permit keys are older (a permit key without a limit in its value, not put by this
/// version of dlock, is shown holding, with `Permits(0)`). The others wait, in that order.
/// `who` is the value put with the key, or, for an empty value, `lease {id in hex}`: the
/// lease a tool like `etcdctl lease revoke` takes.
pub(crate) fn status(key: &str, prefix: &str, keys: &[Contender<'_>]) -> (KeyStatus, Vec<i64>) {
    let mut status = KeyStatus::new(key, true);
    let mut leases = Vec::new();
    let mut keys = keys.to_vec();
    keys.sort_by_key(|c| c.create_revision);
    // Keys older than the one looked at: all, those outside the readers' range, permits.
    let (mut older, mut older_writers, mut older_permits) = (0, 0, 0);
    for c in keys {
        let Some(name) = c.key.strip_prefix(prefix.as_bytes()) else {
            continue;
        };
        let reader = name.starts_with(READERS.as_bytes());
        let permit = name.starts_with(PERMITS.as_bytes());
        let (who, limit) = read_value(c.value, permit);
        let who = who.or_else(|| (c.lease != 0).then(|| format!("lease {:x}", c.lease)));
        let (mode, holds) = match (reader, permit, limit) {
            (true, _, _) => (Mode::Shared, older_writers == 0),
            (_, true, Some(limit)) => (Mode::Permits(limit), older_permits < limit as usize),
            (_, true, None) => (Mode::Permits(0), true),
            _ => (Mode::Exclusive, older == 0),
        };
        older += 1;
        older_writers += usize::from(!reader);
        older_permits += usize::from(permit);
        if holds {
            let mut holder = HolderStatus::new(mode);
            holder.fencing_token = u64::try_from(c.create_revision).ok();
            holder.who = who;
            status.holders.push(holder);
            leases.push(c.lease);
        } else if let Some(waiters) = &mut status.waiters {
            let mut waiter = WaiterStatus::new();
            waiter.mode = Some(mode);
            // An owner's waiter holds nothing yet: no count shown.
            waiter.who = crate::reentry::describe(c.value, false).or(who);
            waiters.push(waiter);
        }
    }
    (status, leases)
}

/// Who holds `key` and who waits: one linearizable range read of the lock's prefix (values
/// included, oldest first; no raft commit), then one `LeaseTimeToLive` per distinct holder
/// lease, [`TTL_READS`] at a time (served by the leader, no raft commit), for `ttl_left`.
/// A ttl that cannot be read (the lease is gone, or the user may not read every key on it)
/// is left `None`.
pub(crate) async fn inspect(conn: &Conn, config: &EtcdConfig, key: &str) -> Result<KeyStatus> {
    const OP: &str = "inspect";
    let prefix = format!("{}/", config.lock_name(key));
    let read = || {
        let (mut kv, prefix) = (conn.client.kv_client(), prefix.clone());
        async move {
            let options = GetOptions::new()
                .with_prefix()
                .with_sort(SortTarget::Create, SortOrder::Ascend);
            kv.get(prefix, Some(options)).await
        }
    };
    let answer = conn.call(OP, read).await?;
    let keys: Vec<Contender<'_>> = answer.kvs().iter().map(Contender::from).collect();
    let (mut status, leases) = status(key, &prefix, &keys);
    let mut ids: Vec<i64> = leases.iter().copied().filter(|&id| id != 0).collect();
    ids.sort_unstable();
    ids.dedup();
    let ttls: HashMap<i64, Duration> = futures::stream::iter(ids)
        .map(|id| async move {
            let ask = || {
                let mut lease = conn.client.lease_client();
                async move { lease.time_to_live(id, None).await }
            };
            match conn.call(OP, ask).await {
                Ok(answer) => u64::try_from(answer.ttl())
                    .ok()
                    .map(|ttl| (id, Duration::from_secs(ttl))),
                Err(e) => {
                    tracing::debug!(backend = NAME, key, lease = id, error = %e, "cannot read a holder's lease ttl");
                    None
                }
            }
        })
        .buffer_unordered(TTL_READS)
        .filter_map(std::future::ready)
        .collect()
        .await;
    for (holder, id) in status.holders.iter_mut().zip(leases) {
        holder.ttl_left = ttls.get(&id).copied();
    }
    Ok(status)
}

/// The held keys starting with `prefix`, sorted: one linearizable keys-only range read of
/// every etcd key under `{namespace prefix}{escaped prefix}` (no raft commit), whose lock
/// names are decoded back to keys ([`key_of`]). A lock with any key under it has a holder
/// (its oldest key holds), so every lock named is held.
pub(crate) async fn list(conn: &Conn, config: &EtcdConfig, prefix: &str) -> Result<Vec<String>> {
    const OP: &str = "list";
    // Escaping is a prefix code (character by character), so the lock names of the keys
    // under `prefix` are exactly those starting with its escaped form.
    let start = config.lock_name(prefix);
    let read = || {
        let (mut kv, start) = (conn.client.kv_client(), start.clone());
        async move {
            let options = GetOptions::new().with_prefix().with_keys_only();
            kv.get(start, Some(options)).await
        }
    };
    let answer = conn.call(OP, read).await?;
    let keys: BTreeSet<String> = answer
        .kvs()
        .iter()
        .filter_map(|kv| key_of(config, kv.key()))
        .filter(|key| key.starts_with(prefix))
        .collect();
    Ok(keys.into_iter().collect())
}

/// The dlock key whose lock an etcd key belongs to (`{prefix}{escaped key}/…`), if it is
/// one: the name up to the first `/` after the namespace prefix, percent-decoded, kept only
/// if it encodes back to the same name (so a name dlock would not write is not listed as
/// some other key).
pub(crate) fn key_of(config: &EtcdConfig, etcd_key: &[u8]) -> Option<String> {
    let rest = etcd_key.strip_prefix(config.prefix().as_bytes())?;
    let end = rest.iter().position(|&b| b == b'/')?;
    let name = std::str::from_utf8(&rest[..end]).ok()?;
    let key = unescape(name)?;
    let canonical = key::validate(&key, usize::MAX).is_ok()
        && config.lock_name(&key).as_bytes() == &etcd_key[..config.prefix().len() + end];
    canonical.then_some(key)
}

/// Undo [`dlock_core::raw::key::escape`]: every `%XX` back to its byte. `None` for a `%`
/// without two hex digits after it, or bytes that are not UTF-8.
fn unescape(name: &str) -> Option<String> {
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(prefix: &str) -> EtcdConfig {
        EtcdConfig::new(&["h"])
            .unwrap()
            .with_option("prefix", prefix)
            .unwrap()
    }

    #[test]
    fn lock_names_decode_back_to_their_keys() {
        for prefix in ["dlock/", "", "a%b/"] {
            let c = config(prefix);
            for key in ["cron", "a/b", "a%2Fb", "x/y/z", "é ü", "%%", "read", "-"] {
                for tail in ["/694d8f1a2b3c", "/read/694d8f1a2b3c-2", "/permit/1"] {
                    let etcd_key = format!("{}{tail}", c.lock_name(key));
                    assert_eq!(
                        key_of(&c, etcd_key.as_bytes()).as_deref(),
                        Some(key),
                        "{etcd_key}"
                    );
                }
            }
        }
    }

    #[test]
    fn names_dlock_would_not_write_are_not_keys() {
        let c = config("dlock/");
        for etcd_key in [
            "dlock/cron",       // no contender under it
            "other/cron/1",     // outside the namespace
            "dlock/a%2fb/1",    // lower-case escape
            "dlock/a%2/1",      // a cut escape
            "dlock/a%FF/1",     // not UTF-8
            "dlock/%41/1",      // an escape dlock would not write
            "dlock//1",         // the empty key
            "dlock/nul%00ed/1", // a key no acquire takes
        ] {
            assert_eq!(key_of(&c, etcd_key.as_bytes()), None, "{etcd_key}");
        }
    }

    #[test]
    fn values_name_the_holder_and_a_permits_limit() {
        let me = holder_description();
        assert_eq!(key_value(Mode::Exclusive), me);
        assert_eq!(key_value(Mode::Shared), me);
        let permit = key_value(Mode::Permits(3));
        assert_eq!(
            read_value(permit.as_bytes(), true),
            (Some(me.into()), Some(3))
        );
        assert_eq!(read_value(me.as_bytes(), false), (Some(me.into()), None));
        assert_eq!(read_value(b"", false), (None, None));
        // An election's value is shown as it was published, spaces included.
        assert_eq!(read_value(b" v ", false), (Some(" v ".into()), None));
        assert_eq!(read_value(b"", true), (None, None));
        // Only a permit's value carries a limit.
        assert_eq!(
            read_value(b"x permits=3", false),
            (Some("x permits=3".into()), None)
        );
        assert_eq!(read_value(b"x permits=0", true).1, None);
    }

    fn at<'a>(key: &'a str, value: &'a str, rev: i64) -> Contender<'a> {
        Contender {
            key: key.as_bytes(),
            value: value.as_bytes(),
            create_revision: rev,
            lease: 0x694d,
        }
    }

    /// Each holder's mode, token and who.
    type Holders = Vec<(Mode, u64, String)>;

    fn shown(keys: &[Contender<'_>]) -> (Holders, Vec<Option<Mode>>) {
        let (status, leases) = status("k", "dlock/k/", keys);
        assert_eq!(leases.len(), status.holders.len());
        let holders = status
            .holders
            .iter()
            .map(|h| {
                let who = h.who.clone().unwrap_or_default();
                (h.mode, h.fencing_token.unwrap(), who)
            })
            .collect();
        let waiters = status.waiters.unwrap().iter().map(|w| w.mode).collect();
        (holders, waiters)
    }

    #[test]
    fn the_oldest_key_holds_and_the_others_queue_in_order() {
        let me = holder_description();
        let (holders, waiters) = shown(&[
            at("dlock/k/read/2", me, 12),
            at("dlock/k/1", "", 10),
            at("dlock/k/3", me, 11),
        ]);
        assert_eq!(holders, [(Mode::Exclusive, 10, "lease 694d".into())]);
        assert_eq!(waiters, [Some(Mode::Exclusive), Some(Mode::Shared)]);
    }

    #[test]
    fn readers_before_the_first_writer_hold() {
        let (holders, waiters) = shown(&[
            at("dlock/k/read/1", "a", 10),
            at("dlock/k/read/2", "b", 11),
            at("dlock/k/3", "c", 12),
            at("dlock/k/read/4", "d", 13),
        ]);
        let modes: Vec<_> = holders.iter().map(|h| (h.0, h.1)).collect();
        assert_eq!(modes, [(Mode::Shared, 10), (Mode::Shared, 11)]);
        assert_eq!(waiters, [Some(Mode::Exclusive), Some(Mode::Shared)]);
        // A permit key blocks a reader and a writer, as any key outside the readers' range.
        let (holders, waiters) = shown(&[
            at("dlock/k/permit/1", "p permits=2", 10),
            at("dlock/k/read/2", "r", 11),
        ]);
        assert_eq!(holders.len(), 1);
        assert_eq!(waiters, [Some(Mode::Shared)]);
    }

    #[test]
    fn permits_hold_while_fewer_than_their_limit_are_older() {
        let (holders, waiters) = shown(&[
            at("dlock/k/permit/1", "a permits=2", 10),
            at("dlock/k/permit/2", "b permits=2", 11),
            at("dlock/k/permit/3", "c permits=2", 12),
            // Its own, larger limit lets it in beside the others (each counts on its own).
            at("dlock/k/permit/4", "d permits=5", 13),
            at("dlock/k/permit/5", "", 14),
        ]);
        let held: Vec<_> = holders.iter().map(|h| (h.0, h.2.as_str())).collect();
        assert_eq!(
            held,
            [
                (Mode::Permits(2), "a"),
                (Mode::Permits(2), "b"),
                (Mode::Permits(5), "d"),
                (Mode::Permits(0), "lease 694d"),
            ]
        );
        assert_eq!(waiters, [Some(Mode::Permits(2))]);
    }
}
