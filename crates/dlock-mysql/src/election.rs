//! Elections (see the crate docs' *Elections*): a campaign is an acquire whose hold
//! carries the candidate's value where others read it.
//!
//! Row mode: the value is the `who` of the hold's uncommitted `{table}_held` row (in place
//! of the client's description), so it lives and dies with the holding transaction; a
//! proclaim updates that row inside the transaction, on the holding connection.
//!
//! Named mode: a named lock has no row of its own, so the leader writes a committed row
//! `(name, conn, token, value)` in `{table}_value` right after its grant (in the fence
//! batch) and deletes it as it releases. A reader trusts the row only while
//! `IS_USED_LOCK(name)` is the connection that wrote it: a crashed leader's row is ignored,
//! and overwritten by the next campaign on the key.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::{Grant, Held};
use dlock_core::{Leader, LockError, LostReason, Result};
use sqlx::Row;

use crate::backend::Inner;
use crate::config::LockMode;
use crate::error::Error;
use crate::named::NamedLock;
use crate::sql::{self, Sql, literal};

/// How often an observer reads the leader: MySQL cannot wake a client when a row or a
/// named lock changes (no `LISTEN`, no change stream), so observers poll. A read is one
/// short round trip on a side connection; four a second per observer keeps a change
/// seen within a quarter of a second without loading the server.
pub(crate) const OBSERVE_EVERY: Duration = Duration::from_millis(250);

impl Sql {
    /// Row mode: publish `value` as the `who` of this session's own hold row, inside the
    /// holding transaction (uncommitted, undone with the hold). Matches one row while the
    /// hold is ours, none once it is gone.
    pub(crate) fn proclaim_row(&self, name: &str, value: &str) -> String {
        format!(
            "UPDATE `{h}` SET who = {v} WHERE name = {n} AND conn = CONNECTION_ID()",
            h = self.held,
            v = literal(value),
            n = literal(name),
        )
    }

    /// Row mode: the exclusive holder of `name`, its token and `who` (a dirty read of
    /// `{table}_held`, as `inspect` reads it). A hold whose token is not recorded yet
    /// (MySQL 8, between the grant and the keep) is not handed out yet: left out.
    pub(crate) fn leader_row(&self, name: &str) -> String {
        format!(
            "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED;\
             SELECT token, CAST(who AS CHAR) FROM `{h}` \
             WHERE name = {n} AND mode = 'exclusive' AND token IS NOT NULL \
             ORDER BY since, conn LIMIT 1",
            h = self.held,
            n = literal(name),
        )
    }

    /// Named mode, in the fence batch right after `SELECT LAST_INSERT_ID()` (the token):
    /// this session leads `row` with `value`, replacing whatever an earlier leader left
    /// (a crashed one's row).
    pub(crate) fn record_value(&self, row: &str, value: &str) -> String {
        format!(
            "INSERT INTO `{t}` (name, conn, token, value) \
               VALUES ({n}, CONNECTION_ID(), LAST_INSERT_ID(), {v}) \
             ON DUPLICATE KEY UPDATE conn = VALUES(conn), token = VALUES(token), \
               value = VALUES(value)",
            t = self.value,
            n = literal(row),
            v = literal(value),
        )
    }

    /// Named mode, in the release batch before `RELEASE_LOCK`: this session's value row
    /// goes first, so no later leader's row is ever touched.
    pub(crate) fn forget_value(&self, row: &str) -> String {
        format!(
            "DELETE FROM `{}` WHERE name = {} AND conn = CONNECTION_ID()",
            self.value,
            literal(row)
        )
    }

    /// Named mode, on a side connection: publish `value` for the leader of grant `token`,
    /// only while the connection that wrote the row holds the lock (`IS_USED_LOCK`).
    pub(crate) fn proclaim_named(&self, lock: &str, row: &str, token: u64, value: &str) -> String {
        format!(
            "UPDATE `{t}` SET value = {v} \
             WHERE name = {n} AND token = {token} AND conn = IS_USED_LOCK({l})",
            t = self.value,
            v = literal(value),
            n = literal(row),
            l = literal(lock),
        )
    }

    /// Named mode, on a side connection: remove the row of grant `token` once its
    /// connection no longer holds the lock (a leader whose holder connection died).
    pub(crate) fn forget_lost_value(&self, lock: &str, row: &str, token: u64) -> String {
        format!(
            "DELETE FROM `{t}` \
             WHERE name = {n} AND token = {token} AND NOT (conn <=> IS_USED_LOCK({l}))",
            t = self.value,
            n = literal(row),
            l = literal(lock),
        )
    }

    /// Named mode: the leader's token and value, from the row whose connection holds the
    /// lock now.
    pub(crate) fn leader_named(&self, lock: &str, row: &str) -> String {
        format!(
            "SELECT token, CAST(value AS CHAR) FROM `{t}` \
             WHERE name = {n} AND conn = IS_USED_LOCK({l})",
            t = self.value,
            n = literal(row),
            l = literal(lock),
        )
    }
}

impl Inner {
    /// The leader of `key`: one read on a side connection.
    pub(crate) async fn leader(&self, key: &str) -> Result<Option<Leader>, Error> {
        let sql = match self.config.mode {
            LockMode::Row => self.sql.leader_row(&sql::row_name(key)),
            LockMode::Named => {
                let lock = NamedLock::new(&self.config.table, key, None);
                self.sql.leader_named(lock.name(), lock.row())
            }
        };
        let rows = self.side("leader", &sql).await?;
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        let term: u64 = row.try_get(0).map_err(Error::sql("leader"))?;
        let value: String = row.try_get(1).map_err(Error::sql("leader"))?;
        Ok(Some(Leader::new(value, term)))
    }
}

/// A named-mode leadership: the carrier's hold, with the proclaim a carrier cannot run
/// (its session runs only the carrier's own requests), sent on a side connection and
/// owner-checked there.
pub(crate) struct NamedLeadership {
    inner: Arc<Inner>,
    held: Box<dyn Held>,
    key: String,
    lock: NamedLock,
    token: u64,
}

impl NamedLeadership {
    /// `grant` of `key`'s `lock`, able to proclaim.
    pub(crate) fn wrap(inner: Arc<Inner>, key: &str, lock: NamedLock, mut grant: Grant) -> Grant {
        let held = std::mem::replace(&mut grant.held, Box::new(Released));
        grant.held = Box::new(Self {
            inner,
            held,
            key: key.to_owned(),
            lock,
            token: grant.fencing_token,
        });
        grant
    }
}

impl fmt::Debug for NamedLeadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NamedLeadership")
            .field("held", &self.held)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl Held for NamedLeadership {
    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        self.held.extend(ttl).await
    }

    async fn release(&mut self) -> Result<()> {
        let released = self.held.release().await;
        if released.is_err() {
            // The holder connection died (or did not answer) with the value row in place:
            // remove it if the lock is no longer that connection's, so a leader lost this
            // way leaves nothing behind.
            let sql =
                self.inner
                    .sql
                    .forget_lost_value(self.lock.name(), self.lock.row(), self.token);
            if let Err(e) = self.inner.side("release", &sql).await {
                tracing::debug!(key = %self.key, error = %e, "could not remove a lost leader's value");
            }
        }
        released
    }

    async fn proclaim(&mut self, value: &str) -> Result<()> {
        let sql =
            self.inner
                .sql
                .proclaim_named(self.lock.name(), self.lock.row(), self.token, value);
        match self.inner.side_affected("proclaim", &sql).await? {
            0 => Err(LockError::not_held(
                crate::NAME,
                &self.key,
                LostReason::NotHeld,
            )),
            _ => Ok(()),
        }
    }
}

/// Stands in for a hold while it is moved.
#[derive(Debug)]
struct Released;

#[async_trait]
impl Held for Released {
    async fn extend(&mut self, _ttl: Duration) -> Result<()> {
        Err(LockError::backend(crate::NAME, "extend", "no hold"))
    }

    async fn release(&mut self) -> Result<()> {
        Err(LockError::backend(crate::NAME, "release", "no hold"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{Server, Tokens};

    #[test]
    fn values_go_as_hex_literals_and_every_write_is_owner_checked() {
        let sql = Sql::new("t", Tokens::Sequence, Server::MariaDb);
        let value = "it's \\ caf\u{e9}";
        let hex = literal(value);
        assert!(hex.starts_with("X'") && !hex[2..hex.len() - 1].contains('\''));
        let row = sql.proclaim_row("k", value);
        assert!(row.contains(&hex) && row.contains("`t_held`"));
        assert!(row.ends_with("AND conn = CONNECTION_ID()"));
        let named = sql.proclaim_named("dlock:ab", "k", 7, value);
        assert!(named.contains(&hex) && named.contains("`t_value`"));
        assert!(named.contains("token = 7 AND conn = IS_USED_LOCK(X'646C6F636B3A6162')"));
        assert!(sql.forget_value("k").ends_with("conn = CONNECTION_ID()"));
        assert!(sql.record_value("k", value).contains("LAST_INSERT_ID()"));
        assert!(
            sql.leader_named("dlock:ab", "k")
                .contains("conn = IS_USED_LOCK(")
        );
        assert!(
            sql.leader_row("k")
                .starts_with("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED;")
        );
    }
}
