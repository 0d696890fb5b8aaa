//! The statements on `{table}_owner` (see `reentry`). A `DELETE` whose condition reads
//! `{table}_held` waits for the holds' row locks (InnoDB locks what a `DELETE`'s subquery
//! reads, even `READ UNCOMMITTED`), an `UPDATE`'s does not: conditions on the holds'
//! records are only ever in `UPDATE`s.

use std::time::Duration;

use dlock_core::Owner;

use crate::config::LockMode;
use crate::named::lock_name;
use crate::sql::{Sql, literal};

/// Set the next statement (alone, in autocommit) to read `READ UNCOMMITTED`: the holds'
/// `{table}_held` records are never committed.
const DIRTY: &str = "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED;";

impl Sql {
    /// Whether the hold of owner row `o` is the key's current hold (see the module docs).
    pub(super) fn current(&self, mode: LockMode, name: &str) -> String {
        match mode {
            LockMode::Row => format!(
                "EXISTS (SELECT 1 FROM `{}` h WHERE h.name = o.name AND h.token = o.token \
                 AND h.mode = 'exclusive')",
                self.held
            ),
            LockMode::Named => format!(
                "EXISTS (SELECT 1 FROM `{}` f WHERE f.name = o.name AND f.fence = o.token \
                 AND f.holder = IS_USED_LOCK({}))",
                self.fence,
                literal(&lock_name(&self.table, name))
            ),
        }
    }

    /// The owner check of a lease of hold `token`.
    fn owned_by(&self, mode: LockMode, name: &str, owner: Owner, token: u64) -> String {
        format!(
            "o.name = {} AND o.owner = {} AND o.token = {token} AND o.entries > 0 AND {}",
            literal(name),
            literal(owner.as_str()),
            self.current(mode, name)
        )
    }

    /// Re-enter `owner`'s current hold of `name`: one more entry, the hold's token through
    /// `LAST_INSERT_ID`, the expiry pushed to `ttl` from now at least. Then delete the row
    /// if its hold is gone (stale). Answers (rows matched, token).
    pub(super) fn reenter(
        &self,
        mode: LockMode,
        name: &str,
        owner: Owner,
        ttl: Duration,
    ) -> String {
        let (o, n) = (&self.owner, literal(name));
        format!(
            "{DIRTY}UPDATE `{o}` o SET entries = entries + 1, token = LAST_INSERT_ID(token), \
               expires = GREATEST(expires, {until}) \
             WHERE o.name = {n} AND o.owner = {w} AND o.entries > 0 AND {current};\
             SELECT CAST(ROW_COUNT() AS SIGNED), CAST(LAST_INSERT_ID() AS UNSIGNED);\
             {DIRTY}UPDATE `{o}` o SET entries = 0 WHERE o.name = {n} AND NOT {current};\
             DELETE FROM `{o}` WHERE name = {n} AND entries = 0",
            until = until(ttl),
            w = literal(owner.as_str()),
            current = self.current(mode, name),
        )
    }

    /// Record a new hold of `owner` (taken just now: any row of the key is stale). Its
    /// expiry is now: the first lease lives in the client that keeps the lock, which needs
    /// none.
    pub(super) fn own(&self, name: &str, owner: Owner, token: u64) -> String {
        format!(
            "INSERT INTO `{}` (name, owner, token, entries, expires) \
               VALUES ({}, {}, {token}, 1, NOW(6)) \
             ON DUPLICATE KEY UPDATE owner = VALUES(owner), token = VALUES(token), entries = 1, \
               expires = VALUES(expires), since = CURRENT_TIMESTAMP(6)",
            self.owner,
            literal(name),
            literal(owner.as_str()),
        )
    }

    /// A lease of another client renews: the hold is still current, and its expiry is
    /// pushed to `ttl` from now at least (never shortened).
    pub(super) fn touch(
        &self,
        mode: LockMode,
        name: &str,
        owner: Owner,
        token: u64,
        ttl: Duration,
    ) -> String {
        format!(
            "{DIRTY}UPDATE `{}` o SET expires = GREATEST(expires, {}) WHERE {}",
            self.owner,
            until(ttl),
            self.owned_by(mode, name, owner, token)
        )
    }

    /// A lease is released: one entry less. Answers (rows matched, entries left).
    pub(super) fn leave(&self, mode: LockMode, name: &str, owner: Owner, token: u64) -> String {
        format!(
            "{DIRTY}UPDATE `{}` o SET entries = LAST_INSERT_ID(entries - 1) WHERE {};\
             SELECT CAST(ROW_COUNT() AS SIGNED), CAST(LAST_INSERT_ID() AS UNSIGNED)",
            self.owner,
            self.owned_by(mode, name, owner, token)
        )
    }

    /// The holding client's look at the count of hold `token`: ended (0) when every lease
    /// of another client stopped renewing; then the entries left (no row: 0).
    pub(super) fn poll(&self, name: &str, token: u64) -> String {
        let (o, n) = (&self.owner, literal(name));
        format!(
            "UPDATE `{o}` SET entries = 0 \
               WHERE name = {n} AND token = {token} AND entries > 0 AND expires < NOW(6);\
             SELECT CAST(entries AS UNSIGNED) FROM `{o}` WHERE name = {n} AND token = {token}"
        )
    }

    /// Delete the row of hold `token` (with `stale`, only if the hold is gone). A `DELETE`
    /// whose condition reads `{table}_held` would wait for the holds' row locks, an `UPDATE`
    /// does not: a stale row is marked ended first (no entry left), then rows so marked
    /// are deleted (an ended hold's row is never needed again).
    pub(super) fn forget(&self, mode: LockMode, name: &str, token: u64, stale: bool) -> String {
        let (o, n) = (&self.owner, literal(name));
        let mark = match stale {
            true => format!(
                "{DIRTY}UPDATE `{o}` o SET entries = 0 \
                   WHERE o.name = {n} AND o.token = {token} AND NOT {};",
                self.current(mode, name)
            ),
            false => String::new(),
        };
        let ended = match stale {
            true => " AND entries = 0",
            false => "",
        };
        format!("{mark}DELETE FROM `{o}` WHERE name = {n} AND token = {token}{ended}")
    }
}

/// `ttl` from now, by the server's clock.
fn until(ttl: Duration) -> String {
    format!("NOW(6) + INTERVAL {} MICROSECOND", ttl.as_micros().max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{Server, Tokens};

    #[test]
    fn owner_statements_check_the_owner_the_hold_and_that_it_is_current() {
        let sql = Sql::new("t", Tokens::Sequence, Server::MariaDb);
        let owner = Owner::new("job-7");
        let reenter = sql.reenter(LockMode::Row, "k", owner, Duration::from_secs(2));
        assert!(reenter.starts_with(DIRTY));
        assert!(reenter.contains("o.owner = X'6A6F622D37'"));
        assert!(reenter.contains("FROM `t_held` h WHERE h.name = o.name AND h.token = o.token"));
        assert!(reenter.contains("INTERVAL 2000000 MICROSECOND"));
        let leave = sql.leave(LockMode::Named, "k", owner, 9);
        assert!(leave.contains("o.token = 9 AND o.entries > 0"));
        assert!(leave.contains("IS_USED_LOCK(X'"));
        assert!(
            sql.forget(LockMode::Row, "k", 9, true)
                .contains("AND NOT EXISTS")
        );
        assert!(!sql.forget(LockMode::Row, "k", 9, false).contains("NOT"));
        // No DELETE reads the holds' records (it would wait for their locks).
        for sql in [
            sql.forget(LockMode::Row, "k", 9, true),
            sql.reenter(LockMode::Row, "k", owner, Duration::from_secs(1)),
        ] {
            let delete = &sql[sql.find("DELETE").expect("a DELETE")..];
            assert!(!delete.contains("t_held"), "{delete}");
        }
        assert!(sql.own("k", owner, 9).contains("ON DUPLICATE KEY"));
    }
}
