//! The statements of reentrant holds: the owner table `{table}_owner`, one row per hold
//! (`ns`, `id`: the key; `owner`; `pid`, `started`: the session that holds the key's lock,
//! in this run of the server; `token`; `holds`: the count; `expires`: how long the leases
//! of other clients keep the hold once the first client's are gone).
//!
//! A row is trusted only while `pg_locks` shows its session holding the key's lock
//! exclusively (and it was written in this run of the server): a row left by a session that
//! ended (a crash) is ignored, and overwritten by the key's next owner hold. The first
//! client's own count changes run on its holder connection instead, where the session
//! itself proves it (see [`On::Holder`]).

use std::time::Duration;

use dlock_core::Owner;

use crate::sql::{Param, Sql, Statement, millis, text_literal};

/// Where a count statement runs, and so what proves the row's hold is live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum On {
    /// A side connection: `pg_locks` must show the row's session holding the key's lock,
    /// a read that copies the server's whole lock table.
    Side,
    /// The session that holds the key's lock for hold `token` (its holder connection,
    /// through the carrier): the row must be this session's, of that hold. The session
    /// holds the lock while that row exists with a count above zero: the row is written
    /// with the lock, and the lock given back with the row deleted, or once the count is
    /// zero (or the session ended).
    Holder { token: u64 },
}

/// The parameters of a prepared statement being written: `$1` is the owner, and each
/// [`push`](Self::push) is the next `$n`.
struct Params(Vec<Param>);

impl Params {
    fn new(owner: &Owner) -> Self {
        Self(vec![Param::Text(owner.as_str().to_owned())])
    }

    /// `value` as the next parameter; its `$n`.
    fn push(&mut self, value: Param) -> String {
        self.0.push(value);
        format!("${}", self.0.len())
    }

    fn statement(self, text: String) -> Statement {
        Statement::Prepared {
            text,
            params: self.0,
        }
    }
}

impl Sql {
    /// The channel a release that brings a hold's count to zero notifies (payload: the
    /// key's id), for the first client, which keeps the lock until then.
    pub(crate) fn owner_channel(&self) -> String {
        // As unsigned, so that the name has no '-'.
        format!("dlock_owners_{}", self.namespace as u32)
    }

    /// Whether the owner table exists.
    pub(crate) fn owners_exist(&self) -> String {
        format!("SELECT to_regclass('{}') IS NOT NULL", self.owners)
    }

    /// Create the owner table, serialised as [`create`](Self::create) is.
    pub(crate) fn create_owners(&self) -> String {
        format!(
            "BEGIN; SELECT pg_advisory_xact_lock({ns}, 0); \
             CREATE TABLE IF NOT EXISTS {owners} (\
               ns integer NOT NULL, \
               id integer NOT NULL, \
               owner text NOT NULL, \
               pid integer NOT NULL, \
               started timestamptz NOT NULL, \
               token bigint NOT NULL, \
               holds integer NOT NULL, \
               expires timestamptz, \
               PRIMARY KEY (ns, id)); \
             COMMIT",
            ns = self.namespace,
            owners = self.owners,
        )
    }

    /// Row `o` (of key `id`, an expression) is of a live hold, as `on` can check it: a `WITH`
    /// entry to put first (empty for a side connection) and the condition. On the holder
    /// connection the entry locks the row first without waiting (`r`), so that a count
    /// change there never waits on another client's statement: a wait past the carrier's
    /// bound (the session's idle timeout, less a margin) would end the holder connection and
    /// every hold it carries. Busy, it fails (changing nothing), and a side connection sends
    /// the change.
    fn live(&self, on: On, id: &str, params: &mut Params) -> (String, String) {
        match on {
            On::Side => (String::new(), self.owner_holds()),
            On::Holder { token } => (
                format!(
                    "r AS (SELECT 1 FROM {owners} WHERE ns = {ns} AND id = {id} \
                       FOR UPDATE NOWAIT)",
                    owners = self.owners,
                    ns = self.namespace,
                ),
                format!(
                    "EXISTS (SELECT 1 FROM r) AND o.token = {token} \
                     AND o.started = pg_postmaster_start_time() AND o.pid = pg_backend_pid()",
                    token = params.push(Param::BigInt(i64::try_from(token).unwrap_or(i64::MAX))),
                ),
            ),
        }
    }

    /// Row `o`'s session holds the key's lock exclusively, in this run of the server.
    fn owner_holds(&self) -> String {
        format!(
            "o.started = pg_postmaster_start_time() \
             AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND l.classid = ({ns})::oid AND l.objid = (o.id)::oid AND l.objsubid = 2 \
               AND l.mode = 'ExclusiveLock' AND l.granted AND l.pid = o.pid)",
            ns = self.namespace,
        )
    }

    /// A condition that is always true and makes the statement's commit asynchronous (no
    /// wait for the WAL flush): for the count and renewal updates of a live hold, whose row
    /// means nothing after a server crash (the crash ends the session that holds the lock,
    /// and `started` no longer matches), so its writes need not outlive one. A re-entry and
    /// its release each waited for a flush before (about 1 ms each on the test machine).
    /// In a `WHERE`, a volatile condition without columns is evaluated for every row the
    /// statement changes; a statement that changes no row commits nothing to flush.
    fn unflushed() -> &'static str {
        "set_config('synchronous_commit', 'off', true) = 'off'"
    }

    /// The row of key `id` for a hold of this session with `token` (an expression).
    fn owner_row(&self, id: i32, owner: &str, token: &str) -> String {
        format!(
            "INSERT INTO {owners} (ns, id, owner, pid, started, token, holds, expires) \
             SELECT {ns}, {id}, {owner}, pg_backend_pid(), pg_postmaster_start_time(), {token}, \
               1, NULL",
            owners = self.owners,
            ns = self.namespace,
            owner = text_literal(owner),
        )
    }

    /// Replace a row left by a hold that is gone.
    fn owner_conflict(&self) -> &'static str {
        " ON CONFLICT (ns, id) DO UPDATE SET owner = EXCLUDED.owner, pid = EXCLUDED.pid, \
           started = EXCLUDED.started, token = EXCLUDED.token, holds = 1, expires = NULL"
    }

    /// An owner's first try: the lock, the token and the hold's row (count 1, replacing a
    /// row a gone hold left), in one statement, and the owner channel notified (at commit)
    /// for the owner's waiters in other clients, which re-enter. One row: the token (NULL:
    /// busy), the idle timeout, the notification.
    pub(crate) fn try_owned(&self, id: i32, owner: &dlock_core::Owner, idle_ms: u64) -> String {
        let timeouts = crate::sql::hold_timeouts(idle_ms);
        format!(
            "WITH t AS (SELECT CASE WHEN pg_try_advisory_lock({ns}, {id}) \
               THEN nextval('{fence}') END AS token OFFSET 0), \
             w AS ({row} FROM t WHERE t.token IS NOT NULL{conflict}) \
             SELECT t.token, CASE WHEN t.token IS NOT NULL THEN {timeouts} END, \
               CASE WHEN t.token IS NOT NULL THEN pg_notify('{channel}', '{id}') END \
             FROM t",
            ns = self.namespace,
            fence = self.fence_seq,
            row = self.owner_row(id, owner.as_str(), "t.token"),
            conflict = self.owner_conflict(),
            channel = self.owner_channel(),
        )
    }

    /// After an owner's wait was granted, in the same transaction: the hold's row (the
    /// token `currval` of the fencing sequence, taken by this session's grant), the owner
    /// channel notified as by [`try_owned`](Self::try_owned). One row: the token.
    pub(crate) fn own_after_wait(&self, id: i32, owner: &dlock_core::Owner) -> String {
        format!(
            "WITH w AS ({row}{conflict} RETURNING token) \
             SELECT w.token, pg_notify('{channel}', '{id}') FROM w",
            row = self.owner_row(
                id,
                owner.as_str(),
                &format!("currval('{}')", self.fence_seq)
            ),
            conflict = self.owner_conflict(),
            channel = self.owner_channel(),
        )
    }

    /// The first client gives the hold's lock back (its count is zero): the row goes with
    /// it. One row: whether the lock was held.
    pub(crate) fn unlock_owned(&self, id: i32) -> String {
        format!(
            "WITH d AS (DELETE FROM {owners} WHERE ns = {ns} AND id = {id} \
               AND pid = pg_backend_pid()) \
             SELECT pg_advisory_unlock({ns}, {id})",
            owners = self.owners,
            ns = self.namespace,
        )
    }

    /// After a stopped owner's wait: the row a grant just before the stop may have written.
    pub(crate) fn forget_owned(&self, id: i32) -> String {
        format!(
            "DELETE FROM {} WHERE ns = {} AND id = {id} AND pid = pg_backend_pid()",
            self.owners, self.namespace
        )
    }

    /// `$1` = owner: re-enter its hold of key `id`, if it has a live one (not held by
    /// session `not_pid`: an owner's own wait): the count up by one, and the other clients'
    /// lease kept for `ttl` more (never less than before). One row: the hold's token; none
    /// when the owner holds nothing (on the holder connection: when it does not hold that
    /// hold). Prepared: the text is one of a few for every key.
    pub(crate) fn reenter(
        &self,
        id: i32,
        ttl: Duration,
        not_pid: Option<i32>,
        owner: &Owner,
        on: On,
    ) -> Statement {
        let mut params = Params::new(owner);
        let id = params.push(Param::Int(id));
        let ms = params.push(Param::BigInt(
            i64::try_from(millis(ttl)).unwrap_or(i64::MAX),
        ));
        let not_pid = not_pid.map_or_else(String::new, |pid| {
            format!(" AND o.pid <> {}", params.push(Param::Int(pid)))
        });
        let (first, held) = self.live(on, &id, &mut params);
        let with = match first.as_str() {
            "" => String::new(),
            first => format!("WITH {first} "),
        };
        params.statement(format!(
            "{with}UPDATE {owners} o SET holds = o.holds + 1, \
               expires = greatest(o.expires, now() + {ms}::float8 * interval '1 millisecond') \
             WHERE o.ns = {ns} AND o.id = {id} AND o.owner = $1 AND o.holds > 0{not_pid} \
               AND {held} AND {unflushed} \
             RETURNING o.token",
            owners = self.owners,
            ns = self.namespace,
            unflushed = Self::unflushed(),
        ))
    }

    /// `$1` = owner: one lease of hold `token` of key `id` released, the count down by one.
    /// One row: the count left (none: the hold is gone); with `notify`, a count of zero
    /// notifies the first client (at commit), which keeps the lock until then. Prepared, as
    /// [`reenter`](Self::reenter).
    pub(crate) fn release_owned(
        &self,
        id: i32,
        token: u64,
        notify: bool,
        owner: &Owner,
        on: On,
    ) -> Statement {
        let mut params = Params::new(owner);
        let id = params.push(Param::Int(id));
        let token = params.push(Param::BigInt(i64::try_from(token).unwrap_or(i64::MAX)));
        let tell = if notify {
            format!(
                ", CASE WHEN u.holds = 0 THEN pg_notify('{}', {id}::text) END",
                self.owner_channel()
            )
        } else {
            String::new()
        };
        let (first, held) = self.live(on, &id, &mut params);
        let first = match first.as_str() {
            "" => String::new(),
            first => format!("{first}, "),
        };
        params.statement(format!(
            "WITH {first}u AS (UPDATE {owners} o SET holds = o.holds - 1 \
               WHERE o.ns = {ns} AND o.id = {id} AND o.token = {token} AND o.owner = $1 \
                 AND o.holds > 0 AND {held} AND {unflushed} \
               RETURNING o.holds) \
             SELECT u.holds{tell} FROM u",
            owners = self.owners,
            ns = self.namespace,
            unflushed = Self::unflushed(),
        ))
    }

    /// `$1` = owner: a lease of another client checks hold `token` of key `id` is still
    /// live and keeps it `ttl` more once the first client's leases are gone (never less
    /// than before). One row while it is.
    pub(crate) fn extend_owned(&self, id: i32, token: u64, ttl: Duration) -> String {
        format!(
            "UPDATE {owners} o SET \
               expires = greatest(o.expires, now() + {ms} * interval '1 millisecond') \
             WHERE o.ns = {ns} AND o.id = {id} AND o.token = {token} AND o.owner = $1 \
               AND o.holds > 0 AND {held} AND {unflushed} \
             RETURNING 1",
            owners = self.owners,
            ns = self.namespace,
            ms = millis(ttl),
            held = self.owner_holds(),
            unflushed = Self::unflushed(),
        )
    }

    /// The first client, whose own leases are gone: is hold `token` of key `id` over (its
    /// count zero, the other clients' leases expired, or its row gone)? Ending it here
    /// (count zero) is atomic with a re-entry, which needs a count above zero. One row:
    /// whether to give the lock back.
    pub(crate) fn owned_over(&self, id: i32, token: u64) -> String {
        format!(
            "WITH u AS (UPDATE {owners} o SET holds = 0 \
               WHERE o.ns = {ns} AND o.id = {id} AND o.token = {token} \
                 AND (o.holds <= 0 OR o.expires IS NULL OR o.expires < now()) AND {unflushed} \
               RETURNING 1) \
             SELECT EXISTS (SELECT 1 FROM u) OR NOT EXISTS (SELECT 1 FROM {owners} \
               WHERE ns = {ns} AND id = {id} AND token = {token})",
            owners = self.owners,
            ns = self.namespace,
            unflushed = Self::unflushed(),
        )
    }

    /// Delete hold `token`'s row of key `id` if its session ended: a first client whose
    /// session was lost tidies up after it.
    pub(crate) fn forget_gone(&self, id: i32, token: u64) -> String {
        format!(
            "DELETE FROM {owners} o WHERE o.ns = {ns} AND o.id = {id} AND o.token = {token} \
               AND NOT ({held})",
            owners = self.owners,
            ns = self.namespace,
            held = self.owner_holds(),
        )
    }

    /// Delete the namespace's rows whose hold is gone (their session ended): run at
    /// connect. A live hold's row is never touched (its session holds the lock before the
    /// row is visible, and until it is deleted).
    pub(crate) fn sweep_owners(&self) -> String {
        format!(
            "DELETE FROM {owners} o WHERE o.ns = {ns} AND NOT ({held})",
            owners = self.owners,
            ns = self.namespace,
            held = self.owner_holds(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::Advisory;
    use dlock_core::{Mode, Owner};

    #[test]
    fn an_owner_reaches_the_statements_as_hex_digits_or_a_parameter() {
        let sql = Sql::new("dlock_keys", 9);
        let mut lock = Advisory::new(7, Mode::Exclusive);
        lock.owner = Some(Owner::new("job'7"));
        for statement in [sql.try_take(&lock, 1).inlined(), sql.wait_take(&lock, 1, 1)] {
            assert!(!statement.contains("job'7"), "{statement}");
            assert!(
                statement.contains("INSERT INTO dlock_keys_owner"),
                "{statement}"
            );
        }
        let release = sql.release(&lock).inlined();
        assert!(
            release.contains("DELETE FROM dlock_keys_owner")
                && release.contains("pg_advisory_unlock(9, 7)")
                && release.contains("idle_session_timeout"),
            "{release}"
        );
        assert!(
            sql.unlock_all(&lock)
                .contains("DELETE FROM dlock_keys_owner")
        );
        let job = Owner::new("job-7");
        let reenter = sql
            .reenter(7, Duration::from_secs(2), None, &job, On::Side)
            .inlined();
        assert!(
            reenter.contains("o.owner = 'job-7'") && reenter.contains("2000::float8 * interval")
        );
        assert!(!reenter.contains("o.pid <>"));
        assert!(
            sql.reenter(7, Duration::from_secs(2), Some(41), &job, On::Side)
                .inlined()
                .contains("AND o.pid <> 41")
        );
        assert!(
            sql.release_owned(7, 42, true, &job, On::Side)
                .inlined()
                .contains("pg_notify('dlock_owners_9', 7::text)")
        );
        assert!(
            !sql.release_owned(7, 42, false, &job, On::Side)
                .inlined()
                .contains("pg_notify")
        );
    }

    #[test]
    fn a_count_change_on_the_holder_connection_checks_its_own_session_not_pg_locks() {
        let sql = Sql::new("dlock_keys", 9);
        let job = Owner::new("job");
        let ttl = Duration::from_secs(2);
        let reenter = sql
            .reenter(7, ttl, Some(41), &job, On::Holder { token: 42 })
            .inlined();
        let release = sql
            .release_owned(7, 42, false, &job, On::Holder { token: 42 })
            .inlined();
        for statement in [&reenter, &release] {
            assert!(!statement.contains("pg_locks"), "{statement}");
            assert!(
                statement.contains("o.pid = pg_backend_pid()")
                    && statement.contains("o.started = pg_postmaster_start_time()"),
                "{statement}"
            );
        }
        // Only the hold the session has, never the owner's own wait; the row locked first,
        // without waiting.
        assert!(reenter.contains("o.token = 42") && reenter.contains("o.pid <> 41"));
        for statement in [&reenter, &release] {
            assert!(statement.contains("FOR UPDATE NOWAIT"), "{statement}");
        }
        for statement in [
            sql.reenter(7, ttl, None, &job, On::Side).inlined(),
            sql.release_owned(7, 42, false, &job, On::Side).inlined(),
        ] {
            assert!(statement.contains("pg_locks"), "{statement}");
        }
    }

    #[test]
    fn count_and_renewal_updates_commit_without_waiting_for_the_wal_flush() {
        let sql = Sql::new("dlock_keys", 9);
        let ttl = Duration::from_secs(2);
        let job = Owner::new("job");
        for statement in [
            sql.reenter(7, ttl, None, &job, On::Side).inlined(),
            sql.reenter(7, ttl, None, &job, On::Holder { token: 42 })
                .inlined(),
            sql.release_owned(7, 42, true, &job, On::Side).inlined(),
            sql.release_owned(7, 42, false, &job, On::Holder { token: 42 })
                .inlined(),
            sql.extend_owned(7, 42, ttl),
            sql.owned_over(7, 42),
        ] {
            assert!(
                statement.contains("set_config('synchronous_commit', 'off', true)"),
                "{statement}"
            );
        }
        // The first acquire's row commits with its token, which must be on disk first.
        let mut lock = Advisory::new(7, Mode::Exclusive);
        lock.owner = Some(Owner::new("job"));
        assert!(
            !sql.try_take(&lock, 1)
                .inlined()
                .contains("synchronous_commit")
        );
    }
}
