//! Looking without touching: who holds a key and who waits for it, and the held keys under
//! a prefix, read with plain reads that take no lock (see the crate docs' *Inspecting*).
//!
//! Row mode: InnoDB shows a row lock nobody waits for to no other session (MariaDB has no
//! `performance_schema.data_locks`), so each holding transaction inserts its own row in
//! `{table}_held` with its grant (MariaDB 10.5+: in the locking statement itself; else a
//! statement right after it) and never commits it: the
//! release is a `ROLLBACK`, and a session that ends rolls back too. A `READ UNCOMMITTED`
//! read sees exactly the holds of the transactions open now. Waiters are the sessions
//! whose running statement is a dlock wait on the key (`information_schema.PROCESSLIST`),
//! but those that hold it.
//!
//! Named mode: `IS_USED_LOCK(name)` is the holding connection, the fence row it wrote at
//! the grant gives the token and the time, and the waiters are the sessions running a
//! `GET_LOCK` of the key's name.

use std::time::{Duration, SystemTime};

use dlock_core::{HolderStatus, KeyStatus, Mode, WaiterStatus};
use sqlx::Row;
use sqlx::mysql::MySqlRow;

use crate::LockMode;
use crate::backend::Inner;
use crate::error::Error;
use crate::named::lock_name;
use crate::sql::{self, Sql, Tokens, literal, row_name};

/// `0x…` bytes never end an escaped row name, so the least name after every name that
/// starts with `prefix` is `prefix` with its last byte raised by one (ASCII names).
fn upper_bound(prefix: &str) -> Option<String> {
    let mut bytes = prefix.as_bytes().to_vec();
    let last = bytes.pop()?;
    bytes.push(last.checked_add(1)?);
    String::from_utf8(bytes).ok()
}

/// The key a row name was escaped from; `None` for a name shortened with a digest (a key
/// whose escaped form is over 255 bytes), which cannot be turned back.
pub(crate) fn key_of(row: &str) -> Option<String> {
    if row.contains("%%") {
        return None;
    }
    let mut out = Vec::with_capacity(row.len());
    let mut bytes = row.bytes();
    while let Some(b) = bytes.next() {
        if b == b'%' {
            let hex = [bytes.next()?, bytes.next()?];
            let hex = std::str::from_utf8(&hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
        } else {
            out.push(b);
        }
    }
    String::from_utf8(out).ok()
}

/// Microseconds since the epoch, as the server gave them, as a time.
fn micros(at: Option<u64>) -> Option<SystemTime> {
    at.map(|us| SystemTime::UNIX_EPOCH + Duration::from_micros(us))
}

/// The last column of a holder row: a reentrant hold's owner and count, from its
/// `{table}_owner` row (`NULL` for any other hold).
const OWNER_COLUMN: &str =
    "CAST(CONCAT('owner ', o.owner, ', held ', o.entries, ' times') AS CHAR)";

/// Add a reentrant hold's owner and count (the row's last column) to its `who`.
fn with_owner(holder: &mut HolderStatus, row: &MySqlRow) -> Result<(), Error> {
    let owner: Option<String> = row.try_get(6).map_err(Error::sql("inspect"))?;
    if let (Some(owner), Some(who)) = (owner, holder.who.as_mut()) {
        who.push_str(&format!(" ({owner})"));
    }
    Ok(())
}

/// `who` of a session the server shows: its connection id and client address.
fn session(id: u64, user: Option<&str>, host: Option<&str>) -> String {
    match (user, host) {
        (Some(user), Some(host)) => format!("connection {id} ({user}@{host})"),
        (None, Some(host)) => format!("connection {id} ({host})"),
        _ => format!("connection {id}"),
    }
}

/// A row of the waiters query: connection id, client address, running statement.
struct Running {
    id: u64,
    host: Option<String>,
    info: String,
}

fn running(rows: &[&MySqlRow]) -> Result<Vec<Running>, Error> {
    rows.iter()
        .map(|row| {
            Ok(Running {
                id: row.try_get(0).map_err(Error::sql("inspect"))?,
                host: row.try_get(1).map_err(Error::sql("inspect"))?,
                info: row
                    .try_get::<Option<String>, _>(2)
                    .map_err(Error::sql("inspect"))?
                    .unwrap_or_default(),
            })
        })
        .collect()
}

impl Sql {
    /// The statement a granting batch adds right after its locking read: record the hold
    /// in `{table}_held` (uncommitted, undone by the release's `ROLLBACK`), only if the
    /// read locked a row (`FOUND_ROWS()`), with the token the read drew where the
    /// sequence gives it (`LASTVAL`; counters: set by [`Self::record_token`]), and `who`:
    /// the client's `holder_description`, or an election candidate's value.
    pub(crate) fn record_holder(&self, name: &str, key: &str, mode: Mode, who: &str) -> String {
        let token = match self.tokens {
            Tokens::Sequence => format!("LASTVAL(`{}`)", self.sequence()),
            Tokens::Counter => "NULL".to_owned(),
        };
        let (mode, permits) = crate::sql::held_mode(mode);
        format!(
            "INSERT INTO `{h}` (name, conn, held_key, mode, permits, token, who) \
             SELECT {n}, CONNECTION_ID(), {k}, '{mode}', {permits}, {token}, {w} FROM DUAL \
             WHERE FOUND_ROWS() > 0",
            h = self.held,
            n = literal(name),
            k = literal(key),
            w = literal(who),
        )
    }

    /// Counters (MySQL 8): the token of this session's hold, once taken.
    pub(crate) fn record_token(&self, name: &str, token: u64) -> String {
        format!(
            "UPDATE `{}` SET token = {token} WHERE name = {} AND conn = CONNECTION_ID()",
            self.held,
            literal(name)
        )
    }

    /// Sessions (but this one) running a statement that names `needle`.
    fn running_with(needle: &str) -> String {
        format!(
            "SELECT CAST(ID AS UNSIGNED), CAST(HOST AS CHAR), CAST(INFO AS CHAR) \
             FROM information_schema.PROCESSLIST \
             WHERE ID <> CONNECTION_ID() AND INFO IS NOT NULL AND LOCATE({}, INFO) > 0 \
             ORDER BY TIME DESC, ID",
            literal(needle)
        )
    }

    /// Row mode: the holds of `name` (a dirty read of `{table}_held`: the holding
    /// transactions' own uncommitted rows), and the sessions running a statement on it.
    pub(crate) fn inspect_rows(&self, name: &str) -> String {
        format!(
            "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED;\
             SELECT CAST(h.conn AS UNSIGNED), CAST(h.mode AS CHAR), CAST(h.permits AS UNSIGNED), \
                    h.token, CAST(UNIX_TIMESTAMP(h.since) * 1000000 AS UNSIGNED), \
                    CAST(h.who AS CHAR), {owner} \
             FROM `{h}` h LEFT JOIN `{o}` o ON o.name = h.name AND o.token = h.token \
             WHERE h.name = {n} ORDER BY h.since, h.conn;\
             {waiters}",
            h = self.held,
            o = self.owner,
            owner = OWNER_COLUMN,
            n = literal(name),
            waiters = Self::running_with(&format!("WHERE name = {}", literal(name))),
        )
    }

    /// Row mode: the held keys starting with `prefix` (a dirty read, as above).
    pub(crate) fn list_rows(&self, prefix: &str) -> String {
        format!(
            "SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED;\
             SELECT DISTINCT held_key FROM `{h}` WHERE LEFT(held_key, {len}) = {p} \
             ORDER BY held_key",
            h = self.held,
            len = prefix.len(),
            p = literal(prefix),
        )
    }

    /// Named mode: the holding connection of `lock` (`IS_USED_LOCK`), its user and
    /// address, the token and time of its grant where its fence row names it, and the
    /// value it leads with where its `{table}_value` row names it; then the sessions
    /// running a `GET_LOCK` of it.
    pub(crate) fn inspect_named(&self, lock: &str, row: &str) -> String {
        format!(
            "SELECT CAST(l.id AS UNSIGNED), CAST(p.USER AS CHAR), CAST(p.HOST AS CHAR), \
                    f.fence, CAST(UNIX_TIMESTAMP(f.granted_at) * 1000000 AS UNSIGNED), \
                    CAST(v.value AS CHAR), {owner} \
             FROM (SELECT IS_USED_LOCK({l}) AS id) l \
             LEFT JOIN information_schema.PROCESSLIST p ON p.ID = l.id \
             LEFT JOIN `{f}` f ON f.name = {r} AND f.holder = l.id \
             LEFT JOIN `{v}` v ON v.name = {r} AND v.conn = l.id \
             LEFT JOIN `{o}` o ON o.name = {r} AND o.token = f.fence \
             WHERE l.id IS NOT NULL;\
             {waiters}",
            l = literal(lock),
            f = self.fence,
            v = self.value,
            o = self.owner,
            owner = OWNER_COLUMN,
            r = literal(row),
            waiters = Self::running_with(&format!("GET_LOCK({}, ", literal(lock))),
        )
    }

    /// Named mode: the row names starting with `prefix`'s of the fence rows (one per key
    /// ever locked in named mode) whose named lock is held now.
    pub(crate) fn list_named(&self, table: &str, prefix: &str) -> String {
        let upper = upper_bound(prefix).map_or_else(String::new, |upper| {
            format!(" AND name < {}", literal(&upper))
        });
        format!(
            "SELECT CAST(name AS CHAR) FROM `{f}` WHERE name >= {p}{upper} \
               AND IS_USED_LOCK(CONCAT('dlock:', \
                     LEFT(SHA2(CONCAT({t}, X'00', name), 256), 58))) IS NOT NULL \
             ORDER BY name",
            f = self.fence,
            p = literal(prefix),
            t = literal(table),
        )
    }

    /// Whether `statement` (one statement of a running batch) waits for a row-mode hold
    /// of `name`, and in which mode.
    fn row_wait(&self, name: &str, statement: &str) -> Option<Mode> {
        let n = literal(name);
        let key_row = format!("FROM `{}` WHERE name = {n} ", self.table);
        if let Some(rest) = statement.split_once(&key_row).map(|(_, rest)| rest) {
            // MariaDB's waits record the hold in the same statement (`Sql::wait_take`).
            let rest = rest.trim_end();
            return match rest.strip_suffix(" RETURNING token").unwrap_or(rest) {
                "FOR UPDATE" => Some(Mode::Exclusive),
                "LOCK IN SHARE MODE" | "FOR SHARE" => Some(Mode::Shared),
                _ => None,
            };
        }
        let slot_row = format!("FROM `{}` WHERE name = {n} AND slot = ", self.slots);
        let rest = statement.split_once(&slot_row)?.1.trim_end();
        let slot = rest.strip_suffix(" FOR UPDATE")?;
        slot.bytes()
            .all(|b| b.is_ascii_digit())
            .then_some(Mode::Permits(0))
    }

    /// The status of `key` (row name `name`) from an [`Self::inspect_rows`] batch's rows.
    pub(crate) fn rows_status(
        &self,
        key: &str,
        name: &str,
        rows: &[MySqlRow],
    ) -> Result<KeyStatus, Error> {
        let mut status = KeyStatus::new(key, true);
        // Each row of the first query has seven columns, of the second three.
        let (holds, others): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r.len() == 7);
        let mut holding = Vec::with_capacity(holds.len());
        for row in holds {
            let conn: u64 = row.try_get(0).map_err(Error::sql("inspect"))?;
            holding.push(conn);
            let mode: String = row.try_get(1).map_err(Error::sql("inspect"))?;
            let permits: u32 = row.try_get(2).map_err(Error::sql("inspect"))?;
            let mut holder = HolderStatus::new(match mode.as_str() {
                "shared" => Mode::Shared,
                "permits" => Mode::Permits(permits),
                _ => Mode::Exclusive,
            });
            holder.fencing_token = row.try_get(3).map_err(Error::sql("inspect"))?;
            holder.since = micros(row.try_get(4).map_err(Error::sql("inspect"))?);
            let who: Option<String> = row.try_get(5).map_err(Error::sql("inspect"))?;
            holder.who = Some(match who {
                Some(who) if !who.is_empty() => who,
                _ => session(conn, None, None),
            });
            with_owner(&mut holder, row)?;
            status.holders.push(holder);
        }
        let waiters = status.waiters.get_or_insert_with(Vec::new);
        // A granted wait's session still shows its statement for a moment after the answer
        // (the server clears it after sending it), when its record already shows the hold.
        for run in running(&others)?
            .into_iter()
            .filter(|run| !holding.contains(&run.id))
        {
            let Some(mode) = run.info.split(';').find_map(|s| self.row_wait(name, s)) else {
                continue;
            };
            let mut waiter = WaiterStatus::new();
            waiter.mode = Some(mode);
            waiter.who = Some(session(run.id, None, run.host.as_deref()));
            waiters.push(waiter);
        }
        Ok(status)
    }

    /// The status of `key` from an [`Self::inspect_named`] batch's rows.
    pub(crate) fn named_status(
        &self,
        key: &str,
        lock: &str,
        rows: &[MySqlRow],
    ) -> Result<KeyStatus, Error> {
        let mut status = KeyStatus::new(key, true);
        let (holds, others): (Vec<_>, Vec<_>) = rows.iter().partition(|r| r.len() == 7);
        let mut holding = Vec::with_capacity(holds.len());
        for row in holds {
            let id: u64 = row.try_get(0).map_err(Error::sql("inspect"))?;
            holding.push(id);
            let user: Option<String> = row.try_get(1).map_err(Error::sql("inspect"))?;
            let host: Option<String> = row.try_get(2).map_err(Error::sql("inspect"))?;
            let mut holder = HolderStatus::new(Mode::Exclusive);
            holder.fencing_token = row.try_get(3).map_err(Error::sql("inspect"))?;
            holder.since = micros(row.try_get(4).map_err(Error::sql("inspect"))?);
            let value: Option<String> = row.try_get(5).map_err(Error::sql("inspect"))?;
            // A leader shows its value; any other holder, its session.
            holder.who =
                Some(value.unwrap_or_else(|| session(id, user.as_deref(), host.as_deref())));
            with_owner(&mut holder, row)?;
            status.holders.push(holder);
        }
        let call = format!("SELECT GET_LOCK({}, ", literal(lock));
        let waiters = status.waiters.get_or_insert_with(Vec::new);
        // As in row mode: the holder's `GET_LOCK` may show for a moment after its grant.
        for run in running(&others)?
            .into_iter()
            .filter(|run| !holding.contains(&run.id))
        {
            let waits = run.info.split(';').any(|s| {
                // A wait round of at least a second; `GET_LOCK(name, 0)` is a try.
                s.trim()
                    .strip_prefix(&call)
                    .and_then(|rest| rest.strip_suffix(')'))
                    .is_some_and(|round| round.parse::<u32>().is_ok_and(|r| r > 0))
            });
            if waits {
                let mut waiter = WaiterStatus::new();
                waiter.mode = Some(Mode::Exclusive);
                waiter.who = Some(session(run.id, None, run.host.as_deref()));
                waiters.push(waiter);
            }
        }
        Ok(status)
    }
}

/// The lock name and row name of `key` in named mode.
pub(crate) fn named_names(table: &str, key: &str) -> (String, String) {
    let row = row_name(key);
    (lock_name(table, &row), row)
}

impl Inner {
    /// What `inspect` shows of `key` (see the crate docs, *Inspecting*).
    pub(crate) async fn inspect(&self, key: &str) -> Result<KeyStatus, Error> {
        let inner = self;
        let status = match inner.config.mode {
            LockMode::Row => {
                let name = sql::row_name(key);
                let rows = inner
                    .side("inspect", &inner.sql.inspect_rows(&name))
                    .await?;
                inner.sql.rows_status(key, &name, &rows)?
            }
            LockMode::Named => {
                let (lock, row) = named_names(&inner.config.table, key);
                let sql = inner.sql.inspect_named(&lock, &row);
                let rows = inner.side("inspect", &sql).await?;
                inner.sql.named_status(key, &lock, &rows)?
            }
        };
        Ok(status)
    }

    /// The held keys starting with `prefix`, sorted (see the crate docs, *Inspecting*).
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<String>, Error> {
        let inner = self;
        let mut keys = match inner.config.mode {
            LockMode::Row => {
                let rows = inner.side("list", &inner.sql.list_rows(prefix)).await?;
                rows.iter()
                    .map(|row| {
                        let key: Vec<u8> = row.try_get(0).map_err(Error::sql("list"))?;
                        Ok(String::from_utf8_lossy(&key).into_owned())
                    })
                    .collect::<Result<Vec<_>, Error>>()?
            }
            LockMode::Named => {
                let sql = inner
                    .sql
                    .list_named(&inner.config.table, &sql::row_name(prefix));
                let rows = inner.side("list", &sql).await?;
                let mut keys = Vec::with_capacity(rows.len());
                for row in &rows {
                    let name: String = row.try_get(0).map_err(Error::sql("list"))?;
                    // A shortened name cannot be turned back into its key (see the docs).
                    keys.extend(key_of(&name).filter(|key| key.starts_with(prefix)));
                }
                keys
            }
        };
        keys.sort_unstable();
        keys.dedup();
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{Holder, Server};

    #[test]
    fn row_names_turn_back_into_keys_unless_shortened() {
        for key in ["orders/42", "it's", "caf\u{e9}", "a%20b", "x y", ""] {
            assert_eq!(key_of(&row_name(key)).as_deref(), Some(key), "{key}");
        }
        assert_eq!(key_of(&row_name(&"k".repeat(1024))), None);
    }

    #[test]
    fn prefixes_bound_a_range_of_names() {
        assert_eq!(upper_bound("ab").as_deref(), Some("ac"));
        assert_eq!(upper_bound(""), None);
        let sql = Sql::new("t", Tokens::Sequence, Server::MariaDb);
        assert!(sql.list_named("t", "").contains("name >= X''"));
        assert!(!sql.list_named("t", "").contains("name <"));
        assert!(sql.list_named("t", "a").contains("name < X'62'"));
    }

    #[test]
    fn only_waiting_statements_count_as_waiters() {
        let holder = Holder {
            key: "k",
            who: "w@h:1",
        };
        // The locking statement of each batch: the last of a wait, the one that locks of a
        // try.
        let last = |batch: String| batch.rsplit(';').next().unwrap_or_default().to_owned();
        let nowait = |batch: String| {
            let found = batch.split(';').rfind(|s| s.contains("NOWAIT"));
            found.map(str::to_owned)
        };
        for sql in [
            Sql::new("t", Tokens::Sequence, Server::MariaDb),
            Sql::new("t", Tokens::Counter, Server::MySql),
        ] {
            let wait = |mode| last(sql.wait_take("k", mode, Some(3), holder));
            assert_eq!(
                sql.row_wait("k", &wait(Mode::Exclusive)),
                Some(Mode::Exclusive)
            );
            assert_eq!(sql.row_wait("k", &wait(Mode::Shared)), Some(Mode::Shared));
            let tried = nowait(sql.try_take("k", Mode::Exclusive, None, false, holder));
            let tried = tried.expect("a NOWAIT statement");
            assert_eq!(sql.row_wait("k", &tried), None, "{tried}");
            assert_eq!(sql.row_wait("kk", &wait(Mode::Exclusive)), None);
        }
        let sql = Sql::new("t", Tokens::Sequence, Server::MariaDb);
        let n = literal("k");
        let slot = format!("SELECT 1 FROM `t_slots` WHERE name = {n} AND slot = 2 FOR UPDATE");
        assert_eq!(sql.row_wait("k", &slot), Some(Mode::Permits(0)));
        let scan = format!(
            "SELECT 1 FROM `t_slots` WHERE name = {n} AND slot < 3 ORDER BY slot LIMIT 1 \
             FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(sql.row_wait("k", &scan), None);
        // The inspecting query names the key too, and is no waiter.
        assert_eq!(sql.row_wait("k", &sql.inspect_rows(&row_name("k"))), None);
    }
}
