//! Permits (`mode=row`): a key with a limit of N is N slot rows of `{table}_slots`,
//! `(name, 0)` to `(name, N-1)`, created on first use and kept; a permit is InnoDB's
//! exclusive row lock on one of them, held by an open transaction like a key's row.
//!
//! Taking one without waiting is one locking read that skips locked rows (`FOR UPDATE SKIP
//! LOCKED`, the lowest free slot), with a consistent count of the slots beside it that
//! tells "every slot is held" from "the slots do not exist yet". InnoDB cannot wait for
//! any one of N rows, so a waiter waits on one slot row for [`PERMIT_WAIT_ROUND`] (woken
//! by the server's grant when that slot frees) and then looks at every slot again, taking
//! the next slot round the key each round.

use std::sync::atomic::Ordering;
use std::time::Duration;

use dlock_core::raw::Deadline;
use sqlx::Row;
use tokio::time::Instant;

use crate::acquire::{Attempt, Guarded, Step};
use crate::backend::Batch;
use crate::error::Error;
use crate::named::digest_name;
use crate::pool::Lent;
use crate::sql::{Sql, literal, set_idle};

/// The prefix of a key's [creation lock](Sql::creation_lock): unlike named mode's
/// `dlock:`, so the two never share a name.
const CREATION_PREFIX: &str = "dlock-slots:";

/// How long a creator waits for its turn to create a key's slots, in seconds: longer than
/// a turn lasts (one insert, whose lock wait is [`PERMIT_WAIT_ROUND`], and a commit), so
/// only a creator whose turn went to a stalled server goes ahead without one.
pub(crate) const TURN_WAIT: u32 = 2;

/// What a creating [`Sql::permit_try`] may wait on the server beyond a plain try: its turn
/// and its insert's lock wait.
pub(crate) const CREATE_WAITS: Duration =
    Duration::from_secs(TURN_WAIT as u64 + PERMIT_WAIT_ROUND as u64);

/// Statements of a creating [`Sql::permit_try`] up to and including the creation lock's
/// release, after the idle timeout's `SET`: `ROLLBACK`, `GET_LOCK`, the lock wait, the
/// insert, `BEGIN`, `RELEASE_LOCK`.
const CREATED_AFTER: usize = 6;

/// How long a permit waiter waits on one slot row before it looks at every slot again,
/// in seconds (the shortest lock wait MySQL 8 accepts): the bound on how long a permit
/// freed on a slot nobody waits on stays free while others wait.
pub(crate) const PERMIT_WAIT_ROUND: u32 = 1;

/// The slot a waiter waits on in round `round`: the waiters of a key spread over its slots
/// by connection id, and each moves one slot on per round.
fn wait_slot(connection: u64, round: u64, limit: u32) -> u32 {
    // The remainder is below `limit`, a u32.
    u32::try_from(connection.wrapping_add(round) % u64::from(limit)).unwrap_or(0)
}

/// Slot numbers `0..limit` as a derived table `k(slot)`: cross-joined decimal digits,
/// portable to both servers (MySQL 8 caps recursive CTEs at 1,000 rows by default).
fn slot_numbers(limit: u32) -> String {
    let digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 \
                  UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 \
                  UNION ALL SELECT 8 UNION ALL SELECT 9)";
    let places = limit.saturating_sub(1).max(1).ilog10() + 1;
    let sum: Vec<String> = (0..places)
        .map(|p| format!("{} * d{p}.d", 10u32.pow(p)))
        .collect();
    let tables: Vec<String> = (0..places).map(|p| format!("{digits} d{p}")).collect();
    format!(
        "(SELECT {} AS slot FROM {}) k",
        sum.join(" + "),
        tables.join(" CROSS JOIN ")
    )
}

impl Sql {
    /// Create the missing slots `0..limit` of `name` (in autocommit, or committed by the
    /// `BEGIN` that follows where lock connections run with it off): a consistent read and
    /// plain inserts, as for a key's row.
    fn create_slots(&self, name: &str, limit: u32) -> String {
        format!(
            "INSERT INTO `{s}` (name, slot) SELECT {n}, k.slot FROM {k} \
               WHERE k.slot < {limit} \
                 AND NOT EXISTS (SELECT 1 FROM `{s}` p WHERE p.name = {n} AND p.slot = k.slot)",
            s = self.slots,
            n = literal(name),
            k = slot_numbers(limit),
        )
    }

    /// The `GET_LOCK` name that makes the clients creating `name`'s slots take turns.
    pub(crate) fn creation_lock(&self, name: &str) -> String {
        digest_name(CREATION_PREFIX, &self.slots, name)
    }

    /// Take a permit of `name` without waiting. Statements: set the idle timeout; with
    /// `create`, end the transaction a miss left open, take the key's
    /// [creation lock](Self::creation_lock), shorten the lock wait, create the missing
    /// slots, and (after the `BEGIN` that commits them) release the creation lock; begin;
    /// count the slots below `limit` (a consistent read); lock the lowest free slot below
    /// `limit`, skipping locked ones, selecting [`Self::locked_value`]; `record` the hold if
    /// one was locked. Two rows: the count and the grant; one: the count, which tells busy
    /// from missing slots.
    ///
    /// The count comes first: `SKIP LOCKED` also skips slots another client's insert has
    /// not committed yet, so a count taken after it could include slots the locking read
    /// skipped only because they were not yet committed, and answer "every slot held"
    /// while none was. Counted first, every counted slot was committed before the locking
    /// read began, so it skipped them because they were locked by holders.
    ///
    /// Only by holders because creators take turns: a creator's insert (a consistent read
    /// at `READ COMMITTED`) then sees every slot an earlier creator made and inserts only
    /// missing ones, so it locks no existing slot. Two creators at once would collide: the
    /// second's duplicate-key check takes a shared lock on the first's new slot and keeps
    /// it, after the error, until its transaction ends, a round trip later; `SKIP LOCKED`
    /// skips that slot meanwhile, so a try that found every other slot held answered
    /// "busy" with a permit free (seen in CI: 6 of 8 racing clients got one).
    pub(crate) fn permit_try(
        &self,
        name: &str,
        limit: u32,
        idle: Option<u32>,
        create: bool,
        record: &str,
    ) -> String {
        let (create, created) = if create {
            let turn = literal(&self.creation_lock(name));
            (
                format!(
                    "ROLLBACK;DO GET_LOCK({turn}, {TURN_WAIT});{};{};",
                    // A duplicate-key check waits only for a writer that skipped the
                    // creation lock (one whose turn timed out, an operator). MySQL 8's
                    // shortest wait; MariaDB's 0 would fail the NEXTVAL below while
                    // another transaction has drawn one: error 1180.
                    Sql::lock_wait(PERMIT_WAIT_ROUND),
                    self.create_slots(name, limit)
                ),
                format!("DO RELEASE_LOCK({turn});"),
            )
        } else {
            (String::new(), String::new())
        };
        format!(
            "{set}{create}BEGIN;{created}\
             SELECT CAST(COUNT(*) AS UNSIGNED) FROM `{s}` WHERE name = {n} AND slot < {limit};\
             SELECT {v} FROM `{s}` WHERE name = {n} AND slot < {limit} \
               ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED;{record}",
            set = set_idle(idle),
            v = self.locked_value(),
            s = self.slots,
            n = literal(name),
        )
    }

    /// Wait for slot `slot` of `name`: set the idle timeout and the lock wait when the
    /// session lacks them, begin, lock the slot (waiting), selecting [`Self::locked_value`].
    pub(crate) fn permit_wait(
        &self,
        name: &str,
        slot: u32,
        idle: Option<u32>,
        lock_wait: Option<u32>,
    ) -> String {
        let lock_wait = lock_wait.map_or_else(String::new, |s| format!("{};", Sql::lock_wait(s)));
        format!(
            "{set}{lock_wait}BEGIN;\
             SELECT {v} FROM `{s}` WHERE name = {n} AND slot = {slot} FOR UPDATE",
            set = set_idle(idle),
            v = self.locked_value(),
            s = self.slots,
            n = literal(name),
        )
    }
}

/// Where a [`Sql::permit_try`] batch left the acquire (and `lent`'s creation lock).
pub(crate) fn tried(batch: Batch, lent: &mut Lent, limit: u32, set: bool, create: bool) -> Step {
    if create && batch.done >= usize::from(set) + CREATED_AFTER {
        lent.set_creation_lock(None);
    }
    let reused = lent.reused;
    let done = batch.done;
    match batch.error {
        None => match batch.rows.as_slice() {
            [_count, grant] => match grant.try_get::<u64, _>(0) {
                Ok(token) => Step::Granted(token),
                Err(e) => Step::Failed(Error::sql("acquire")(e)),
            },
            [count] => match count.try_get::<u64, _>(0) {
                // Every slot was committed before the locking read, which found each locked.
                Ok(count) if count >= u64::from(limit) => Step::Busy,
                // The slots were just created, yet some are missing (deleted meanwhile).
                Ok(_) if create => Step::Restart,
                Ok(_) => Step::Missing,
                Err(e) => Step::Failed(Error::sql("acquire")(e)),
            },
            _ => Step::Failed(Error::Sql {
                op: "acquire",
                source: sqlx::Error::RowNotFound,
            }),
        },
        // Another client created the same slots at once, or created and locked one while
        // the insert checked it: they exist now.
        Some(e) if e.is_duplicate() || e.is_deadlock() || e.is_lock_busy() => Step::Restart,
        Some(e) if e.is_connection_lost() && reused && done == 0 => Step::Replace,
        Some(e) => Step::Failed(e),
    }
}

impl Attempt {
    /// The statements of a permit try: see [`Sql::permit_try`]. A batch that creates
    /// slots leaves the session's lock wait shortened (recorded as unknown, so the next
    /// wait sets it, and the connection's return to the pool restores it).
    pub(crate) fn permit_try_sql(
        &self,
        lent: &mut Lent,
        limit: u32,
        idle: Option<u32>,
        create: bool,
    ) -> String {
        if create {
            lent.set_lock_wait(None);
            // Until the batch is seen to release it, the session may hold the creation
            // lock: the roll-back that ends the transaction (before a retry or a wait, or
            // the connection's return to the pool) releases it too.
            lent.set_creation_lock(Some(self.inner.sql.creation_lock(&self.name)));
        }
        let record = self.record_holder();
        self.inner
            .sql
            .permit_try(&self.name, limit, idle, create, &record)
    }

    /// Wait for a permit, woken by the server's grant of the slot row waited on, looking
    /// at every slot again after each [`PERMIT_WAIT_ROUND`], until the deadline.
    pub(crate) async fn permit_wait(&mut self, lent: &mut Lent, limit: u32) -> Step {
        let deadline = match self.deadline {
            Deadline::At(at) => Some(at),
            Deadline::TryOnce | Deadline::Never => None,
        };
        let mut round = 0u64;
        loop {
            let slot = wait_slot(lent.id(), round, limit);
            round += 1;
            let set = self.idle_to_set(lent);
            let lock_wait =
                (lent.lock_wait() != Some(PERMIT_WAIT_ROUND)).then_some(PERMIT_WAIT_ROUND);
            let sql = self.inner.sql.permit_wait(&self.name, slot, set, lock_wait);
            self.sent_at = Instant::now();
            let silent = self.sent_at
                + Duration::from_secs(PERMIT_WAIT_ROUND.into())
                + self.inner.config.response_timeout;
            lent.set_lock_wait(None);
            let batch = match self
                .guarded(lent, sql.as_str(), deadline, silent, set)
                .await
            {
                Guarded::Done(batch) => batch,
                Guarded::Stopped { why, late } => return Step::Stopped { why, late },
            };
            let before_begin = usize::from(set.is_some()) + usize::from(lock_wait.is_some());
            if batch.done >= before_begin {
                lent.set_lock_wait(Some(PERMIT_WAIT_ROUND));
            }
            match batch.error {
                None if batch.granted() => {
                    self.inner.wakeups.fetch_add(1, Ordering::Relaxed);
                    return self.record_after_wait(lent, &batch).await;
                }
                // An operator deleted the slot while we waited on it.
                None => return Step::Restart,
                // The round ran out: look at every slot, then wait on the next one.
                Some(e) if e.is_lock_busy() => match self.try_take(lent, false).await {
                    Step::Busy if self.deadline.may_wait() => {}
                    step => return step,
                },
                Some(e) if e.is_deadlock() => return Step::Restart,
                Some(e) => return Step::Failed(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{Server, Tokens};

    #[test]
    fn slot_numbers_cover_the_limit_with_as_many_digits_as_it_needs() {
        assert_eq!(slot_numbers(1).matches("CROSS JOIN").count(), 0);
        assert_eq!(slot_numbers(10).matches("CROSS JOIN").count(), 0);
        assert_eq!(slot_numbers(11).matches("CROSS JOIN").count(), 1);
        assert_eq!(slot_numbers(10_000).matches("CROSS JOIN").count(), 3);
        assert!(slot_numbers(10_000).contains("1000 * d3.d"));
    }

    #[test]
    fn creation_locks_are_per_key_and_table_and_never_a_named_mode_lock() {
        let sql = Sql::new("t", Tokens::Sequence, Server::MariaDb);
        let a = sql.creation_lock("a");
        assert!(a.starts_with(CREATION_PREFIX) && a.len() == 64, "{a}");
        assert_ne!(a, sql.creation_lock("A"));
        assert_ne!(
            a,
            Sql::new("u", Tokens::Sequence, Server::MariaDb).creation_lock("a")
        );
        assert_ne!(a, crate::named::lock_name("t_slots", "a"));
    }

    #[test]
    fn waiters_spread_over_the_slots_and_move_on_each_round() {
        assert_eq!(wait_slot(7, 0, 3), 1);
        assert_eq!(wait_slot(7, 1, 3), 2);
        assert_eq!(wait_slot(8, 0, 3), 2);
        assert_eq!(wait_slot(u64::MAX, 1, 1), 0);
    }

    #[test]
    fn permit_statements_lock_one_free_slot_below_the_limit() {
        let mariadb = Sql::new("t", Tokens::Sequence, Server::MariaDb);
        let try_once = mariadb.permit_try("k", 3, None, false, "");
        assert!(try_once.starts_with("BEGIN;"));
        assert!(try_once.contains("slot < 3 ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED"));
        assert!(try_once.contains("NEXTVAL(`t_seq`)"));
        // The count precedes the locking read (which skips uncommitted slots too).
        assert!(try_once.find("COUNT(*)") < try_once.find("SKIP LOCKED"));
        let create = mariadb.permit_try("k", 3, Some(5), true, "");
        let turn = literal(&mariadb.creation_lock("k"));
        assert!(create.starts_with(&format!(
            "SET SESSION wait_timeout = 5;ROLLBACK;DO GET_LOCK({turn}, 2);\
             SET SESSION innodb_lock_wait_timeout = 1;INSERT INTO `t_slots`"
        )));
        // Released once the `BEGIN` has committed the slots, before the count; the
        // statements through the release are the set and `CREATED_AFTER`.
        let release = format!("BEGIN;DO RELEASE_LOCK({turn});");
        let through = create.find(&release).expect("released after BEGIN") + release.len();
        assert!(create[through..].starts_with("SELECT CAST(COUNT(*)"));
        assert_eq!(create[..through].matches(';').count(), 1 + CREATED_AFTER);
        let wait = mariadb.permit_wait("k", 2, None, Some(1));
        assert!(wait.starts_with("SET SESSION innodb_lock_wait_timeout = 1;BEGIN;"));
        assert!(wait.ends_with("slot = 2 FOR UPDATE"));
        let mysql = Sql::new("t", Tokens::Counter, Server::MySql);
        assert!(
            mysql
                .permit_try("k", 3, None, true, "")
                .contains("SET SESSION innodb_lock_wait_timeout = 1;")
        );
        assert!(
            !mysql
                .permit_try("k", 3, None, false, "")
                .contains("NEXTVAL")
        );
    }
}
