//! Reentrant holds ([`Owner`]): the owner and the hold count live in the value of the
//! holding key (`H`, the oldest key under the lock prefix) as [`owner_value`] writes it, a
//! format no other writer produces (Go's `Mutex` and `etcdctl lock` put empty values, our
//! plain keys a holder description, election values have no control character). Every
//! change of the count is one transaction comparing `H`'s mod revision ([`Hold::step`]),
//! putting with `ignore_lease` so that `H` stays on the lease of the client that created
//! it, and keeps its create revision: the fencing token of every entry of the hold.
//!
//! The first client's grant is an [`EtcdHeld`](crate::held::EtcdHeld) carrying a [`Hold`];
//! re-entries ([`enter`]) are [`Reentered`] grants, with no lease of their own. In the
//! client whose lease `H` is on (found in the client's [`OwnerHolds`], where each owner
//! key is registered with what keeps it alive, [`Life`], from before it is put until the
//! client leaves its lease) a re-entry is kept alive with that lease and carries its lost
//! signal; in another client its renewal reads `H` ([`Hold::check`]). When the first
//! grant is released while the count is above zero, [`keep_until_freed`] keeps its lease
//! (and so `H`) until whoever lowers the count to zero deletes `H`.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::Held;
use dlock_core::{LostReason, Owner, Result};
use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
};
use futures::future::BoxFuture;
use tokio::sync::{oneshot, watch};
use tokio::time::Instant;

use crate::NAME;
use crate::acquire::{Attempt, Outcome};
use crate::connection::{Conn, ranged, revision};
use crate::error::{Error, not_held};
use crate::keywatch::HeldWatch;
use crate::lease::KeyLease;

mod life;
pub(crate) use life::{Keeping, Life, OwnerHolds};
use life::{life_check, life_lost};

/// What an owner hold's value starts with. The control character keeps it apart from
/// every value anyone else puts (election values have none; Go's are empty).
const TAG: &str = "\u{1}dlock-owner ";

/// How many times a count change is tried again when another entry changed the count first.
const STEP_TRIES: u32 = 200;

/// The value of a key taken under `owner`, entered `count` times, first by `who`:
/// `\x01dlock-owner {count} {owner} {who}`.
pub(crate) fn owner_value(owner: &str, count: u64, who: &str) -> String {
    format!("{TAG}{count} {owner} {who}")
}

/// An owner hold's value read back: (count, owner, who took it first).
pub(crate) fn parse(value: &[u8]) -> Option<(u64, &str, &str)> {
    let rest = std::str::from_utf8(value).ok()?.strip_prefix(TAG)?;
    let (count, rest) = rest.split_once(' ')?;
    let (owner, who) = rest.split_once(' ').unwrap_or((rest, ""));
    Some((count.parse().ok()?, owner, who))
}

/// How `inspect` and `leader` show an owner hold's value: `job-7 (held 3 times)
/// NAME@HOST:PID`; a waiter's (`holding` false): `job-7 NAME@HOST:PID`.
pub(crate) fn describe(value: &[u8], holding: bool) -> Option<String> {
    let (count, owner, who) = parse(value)?;
    let times = if count == 1 { "time" } else { "times" };
    let shown = match holding {
        true => format!("{owner} (held {count} {times}) {who}"),
        false => format!("{owner} {who}"),
    };
    Some(shown.trim_end().to_owned())
}

/// A change of the count.
enum Step<'a> {
    /// One more entry; the entering attempt's own key (queued behind `H`) is deleted in the
    /// same transaction.
    Enter(&'a str),
    /// One entry fewer; `H` is deleted when none is left.
    Leave,
}

/// One grant's view of an owner hold: `H`, its create revision (the token), the owner, and
/// the last state of `H` this grant saw (its mod revision and count), against which the
/// next change is compared.
#[derive(Clone)]
pub(crate) struct Hold {
    conn: Conn,
    key: String,
    pub(crate) etcd_key: String,
    pub(crate) rev: i64,
    owner: Owner,
    who: String,
    pub(crate) mod_rev: i64,
    count: u64,
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("etcd_key", &self.etcd_key)
            .field("create_revision", &self.rev)
            .field("owner", &self.owner)
            .finish_non_exhaustive()
    }
}

impl Hold {
    /// The hold an attempt took with its own key (`etcd_key`, put at `rev` with count 1).
    pub(crate) fn first(conn: &Conn, key: &str, etcd_key: &str, rev: i64, owner: Owner) -> Self {
        Self {
            conn: conn.clone(),
            key: key.to_owned(),
            etcd_key: etcd_key.to_owned(),
            rev,
            owner,
            who: dlock_core::holder_description().to_owned(),
            mod_rev: rev,
            count: 1,
        }
    }

    /// The hold `kv` (the oldest key under the prefix) is, if it is `owner`'s.
    pub(crate) fn of(conn: &Conn, key: &str, kv: &KeyValue, owner: Owner) -> Option<Self> {
        let mut hold = Self {
            conn: conn.clone(),
            key: key.to_owned(),
            etcd_key: String::from_utf8(kv.key().to_vec()).ok()?,
            rev: kv.create_revision(),
            owner,
            who: String::new(),
            mod_rev: 0,
            count: 0,
        };
        hold.absorb(Some(kv)).then_some(hold)
    }

    /// Take in a fresh read of `H`: `false` when it is not this hold any more (gone, or
    /// another incarnation of the name).
    fn absorb(&mut self, kv: Option<&KeyValue>) -> bool {
        let Some(kv) = kv else { return false };
        if kv.create_revision() != self.rev {
            return false;
        }
        match parse(kv.value()) {
            Some((count, owner, who)) if count > 0 && owner == self.owner.as_str() => {
                self.count = count;
                self.who = who.to_owned();
                self.mod_rev = kv.mod_revision();
                true
            }
            _ => false,
        }
    }

    /// Change the count by one, in one transaction compared on `H`'s mod revision (sent
    /// again with a fresh read of `H`, which the failed transaction returns, when another
    /// entry changed it first). The new count, or `None` when `H` is not this hold any more.
    async fn step(&mut self, op: &'static str, step: Step<'_>) -> Result<Option<u64>, Error> {
        for _ in 0..STEP_TRIES {
            let h = self.etcd_key.as_str();
            let count = match step {
                Step::Enter(_) => self.count + 1,
                Step::Leave => self.count - 1,
            };
            let mut ops = vec![match count {
                0 => TxnOp::delete(h, None),
                _ => TxnOp::put(
                    h,
                    owner_value(self.owner.as_str(), count, &self.who),
                    Some(PutOptions::new().with_ignore_lease()),
                ),
            }];
            if let Step::Enter(mine) = step {
                ops.push(TxnOp::delete(mine, None));
            }
            let txn = Txn::new()
                .when([Compare::mod_revision(h, CompareOp::Equal, self.mod_rev)])
                .and_then(ops)
                .or_else([TxnOp::get(h, None)]);
            let answer = self.conn.txn(op, txn).await?;
            if answer.succeeded() {
                self.mod_rev = revision(op, answer.header())?;
                self.count = count;
                return Ok(Some(count));
            }
            let ops = answer.op_responses();
            if !self.absorb(ranged(op, &ops, 0)?.first()) {
                return Ok(None);
            }
        }
        Err(Error::Protocol {
            op,
            what: "the hold count kept changing under every attempt to change it",
        })
    }

    /// Whether `H` is still this hold (one linearizable read).
    pub(crate) async fn check(&mut self, op: &'static str) -> Result<bool, Error> {
        let get = || {
            let mut kv = self.conn.client.kv_client();
            let h = self.etcd_key.clone();
            async move { kv.get(h, None).await }
        };
        let answer = self.conn.call(op, get).await?;
        Ok(self.absorb(answer.kvs().first()))
    }

    /// Lower the count (deleting `H` at zero): the count left, `None` when not held.
    pub(crate) async fn leave(&mut self, op: &'static str) -> Result<Option<u64>, Error> {
        self.step(op, Step::Leave).await
    }

    fn not_held(&self) -> dlock_core::LockError {
        not_held(&self.key)
    }
}

/// Re-enter `hold` (found holding the key, under our owner): raise its count and delete
/// our queued key `mine`, in one transaction. `None` when `H` stopped being the owner's
/// hold meanwhile (our key then stays queued). The transaction runs in a task of its own:
/// an acquire dropped while it is in flight leaves the count as it was (the task lowers
/// it again when nobody takes the grant).
pub(crate) async fn enter(mut hold: Hold, mine: &str) -> Result<Option<Entry>, Error> {
    let (tx, rx) = oneshot::channel();
    let mine = mine.to_owned();
    let task = async move {
        let entered = match hold.step("acquire", Step::Enter(&mine)).await {
            Ok(Some(_)) => Ok(Some(Entry(Some(hold)))),
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        };
        // Not taken (the acquire was dropped): the entry's drop leaves it again.
        let _ = tx.send(entered);
    };
    if !dlock_core::raw::spawn_cleanup(task) {
        return Err(Error::Protocol {
            op: "acquire",
            what: "no runtime to re-enter on",
        });
    }
    rx.await.unwrap_or(Err(Error::Protocol {
        op: "acquire",
        what: "the re-entering task ended without an answer",
    }))
}

/// An entry the acquire has not handed out yet: dropped before it is (the acquire dropped),
/// it leaves the hold again, in the background.
pub(crate) struct Entry(Option<Hold>);

impl Entry {
    /// The hold, handed out.
    pub(crate) fn take(mut self) -> Hold {
        self.0.take().expect("taken once")
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        if let Some(mut hold) = self.0.take() {
            tracing::debug!(
                backend = NAME,
                key = hold.key,
                "an acquire dropped after it re-entered; leaving again"
            );
            dlock_core::raw::spawn_cleanup(async move {
                let _ = hold.leave("acquire").await;
            });
        }
    }
}

impl Attempt<'_> {
    /// Re-enter `hold`, the owner's hold found holding the key; should it end meanwhile,
    /// read who holds the key now (one read): our key (the key is ours, count 1), another
    /// hold of the owner (re-entered in turn), or anyone else (`None`: wait as usual).
    pub(crate) async fn reenter(
        &self,
        rev: i64,
        mut hold: Hold,
        waited: bool,
    ) -> Result<Option<Outcome>> {
        const OP: &str = "acquire";
        let owner = self.owner.expect("an owner's attempt");
        loop {
            let sent_at = tokio::time::Instant::now();
            if let Some(hold) = enter(hold, &self.my_key).await? {
                return Ok(Some(Outcome::Reentered(hold, sent_at, waited)));
            }
            let (start, end) = self.ranges().remove(0);
            let first = GetOptions::new()
                .with_range(end)
                .with_sort(SortTarget::Create, SortOrder::Ascend)
                .with_limit(1);
            let get = || {
                let (mut kv, start, first) =
                    (self.conn.client.kv_client(), start.clone(), first.clone());
                async move { kv.get(start, Some(first)).await }
            };
            let answer = self.conn.call(OP, get).await?;
            let seen = revision(OP, answer.header())?;
            let oldest = answer.kvs().first();
            if oldest
                .is_some_and(|kv| kv.key() == self.my_key.as_bytes() && kv.create_revision() == rev)
            {
                return Ok(Some(Outcome::Held {
                    rev,
                    seen,
                    watch: None,
                    waited,
                }));
            }
            match oldest
                .filter(|kv| kv.create_revision() < rev)
                .and_then(|kv| Hold::of(self.conn, self.key, kv, owner))
            {
                Some(next) => hold = next,
                None => return Ok(None),
            }
        }
    }
}

/// A re-entry's grant: it counts in `H` but has no key or lease of its own. In the client
/// whose lease `H` is on, it lives as long as that lease: it carries the lease's lost
/// signal and is kept alive with it. In another client, its renewal reads `H`. Either way
/// `H`'s deletion is lost too.
pub(crate) struct Reentered {
    key: String,
    /// `None` once released.
    hold: Option<Hold>,
    /// What keeps `H` alive, when it is this client's.
    life: Option<watch::Receiver<Life>>,
    _watch: HeldWatch,
}

impl fmt::Debug for Reentered {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reentered")
            .field("hold", &self.hold)
            .finish()
    }
}

impl Reentered {
    /// The grant of a re-entry of `hold`, and its lost signal: `H` deleted (seen by the
    /// client's watch on held keys from the revision of the re-entry on), or, when `H` is
    /// this client's (`life`), its lease lost.
    pub(crate) fn start(
        hold: Hold,
        life: Option<watch::Receiver<Life>>,
    ) -> (Self, BoxFuture<'static, LostReason>) {
        let (watch, deleted) = hold
            .conn
            .watch_held(&hold.etcd_key, hold.rev, hold.mod_rev + 1);
        let deleted = async move {
            match deleted.await {
                Ok(()) => LostReason::NotHeld,
                // Canceled: released.
                Err(_) => std::future::pending().await,
            }
        };
        let lease_lost = life.clone().map(life_lost);
        let lost = Box::pin(async move {
            match lease_lost {
                Some(lease_lost) => tokio::select! {
                    reason = deleted => reason,
                    reason = lease_lost => reason,
                },
                None => deleted.await,
            }
        });
        let held = Self {
            key: hold.key.clone(),
            hold: Some(hold),
            life,
            _watch: watch,
        };
        (held, lost)
    }
}

impl Drop for Reentered {
    fn drop(&mut self) {
        // Dropped unreleased: the entry is left in the background.
        if let Some(mut hold) = self.hold.take() {
            dlock_core::raw::spawn_cleanup(async move {
                let _ = hold.leave("release").await;
            });
        }
    }
}

#[async_trait]
impl Held for Reentered {
    async fn release(&mut self) -> Result<()> {
        let Some(mut hold) = self.hold.take() else {
            return Err(not_held(&self.key));
        };
        match hold.leave("release").await? {
            Some(_) => Ok(()),
            None => Err(hold.not_held()),
        }
    }

    /// Nothing to renew: `H` lives on the first client's lease. Check it is still ours (in
    /// the first client, after checking that lease is alive, as its keeper last heard).
    async fn extend(&mut self, _ttl: Duration) -> Result<()> {
        let Some(hold) = &mut self.hold else {
            return Err(not_held(&self.key));
        };
        if let Some(life) = &self.life {
            let life = life.borrow().clone();
            life_check(&life, &self.key)?;
        }
        match hold.check("extend").await? {
            true => Ok(()),
            false => Err(hold.not_held()),
        }
    }
}

/// The first grant was released with entries left: keep its lease (and so `H`, and the
/// key's name, claimed) until `H` is deleted by the last entry's release, the lease is
/// lost, or `H` is found gone by the check every ttl (a fallback for the watch). An own
/// lease is kept alive meanwhile, as the shared one is by its keeper.
///
/// `keeping` (the hold's key in the client's [`OwnerHolds`]) follows the own lease's
/// renewals, for this client's re-entries, and is left with the lease.
pub(crate) fn keep_until_freed(conn: Conn, hold: Hold, lease: KeyLease, keeping: Option<Keeping>) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let mut lease = lease;
        let mut hold = hold;
        let (watch, mut deleted) = conn.watch_held(&hold.etcd_key, hold.rev, hold.mod_rev + 1);
        let ttl = Duration::from_secs(lease.asked().unsigned_abs());
        let mut check_at = Instant::now() + ttl;
        let mut watching = true;
        loop {
            let due = match &lease {
                KeyLease::Own(own) => own.renewal_due().min(check_at),
                KeyLease::Shared(_) => check_at,
            };
            tokio::select! {
                gone = &mut deleted, if watching => match gone {
                    Ok(()) => break,
                    // The watch could not be made again: the check below goes on.
                    Err(_) => watching = false,
                },
                () = lease.needs_tending(), if matches!(lease, KeyLease::Shared(_)) => break,
                () = tokio::time::sleep_until(due) => {}
            }
            // A keep-alive that keeps failing until the lease may have expired gives up.
            if let KeyLease::Own(own) = &mut lease
                && Instant::now() >= own.renewal_due()
            {
                let renewed = own.renew_while_waiting(&hold.key).await;
                if let Some(keeping) = &keeping {
                    keeping.set(match &renewed {
                        Ok(()) => Life::of(&lease),
                        Err(e) => Life::Gone(LostReason::Unreachable(e.to_string())),
                    });
                }
                if renewed.is_err() {
                    break;
                }
            }
            if Instant::now() >= check_at {
                check_at = Instant::now() + ttl;
                if let Ok(false) = hold.check("keep-alive").await {
                    break;
                }
            }
        }
        drop(watch);
        tracing::debug!(
            backend = NAME,
            key = hold.etcd_key,
            "the owner hold ended; leaving its lease"
        );
        drop(keeping);
        match lease {
            KeyLease::Own(mut own) => own.revoke_in_background(),
            KeyLease::Shared(shared) => {
                conn.shared.unclaim_key(&hold.etcd_key);
                drop(shared);
            }
        }
    });
}

#[cfg(test)]
#[path = "reentry_tests.rs"]
mod tests;
