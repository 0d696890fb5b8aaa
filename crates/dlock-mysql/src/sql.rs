//! Row names and the SQL the backend sends.
//!
//! Statements go as text batches (several statements, one round trip), so names are sent as
//! binary literals `X'…'` and table names are validated identifiers: nothing a key contains
//! can change a statement. A batch stops at its first failing statement, which tells the
//! caller where it failed. The one prepared statement, the usual first try of a hold on
//! MariaDB ([`Sql::prepared_take`]), takes its names as parameters instead.

use std::fmt::Write as _;
use std::time::Duration;

use dlock_core::Mode;
use dlock_core::raw::key;

/// Width of the `name` column, in bytes.
pub(crate) const NAME_WIDTH: usize = 255;

/// The longest key, in bytes (the core's default `max_key_len`): the width of
/// `{table}_held.held_key`.
pub(crate) const MAX_KEY: usize = 1024;

/// The session's `innodb_lock_wait_timeout` on lock connections, in seconds: a waiting
/// statement returns at least this often, so a silent connection is noticed (the client
/// gives it `response_timeout` more) and a waiter whose client vanished does not wait on the
/// server for ever. Deadlines are enforced by the client, which kills the waiting statement.
pub(crate) const LOCK_WAIT_ROUND: u32 = 60;

/// Width of a hold's `who` (`{table}_held`) and of a leader's `value` (`{table}_value`),
/// in bytes: a holder description or an election value
/// ([`MAX_VALUE_LEN`](dlock_core::election::MAX_VALUE_LEN) bytes) fits.
pub(crate) const VALUE_WIDTH: usize = 400;
const _: () = assert!(dlock_core::election::MAX_VALUE_LEN <= VALUE_WIDTH);

/// Characters a row name keeps as they are; every other one is percent-escaped.
fn readable(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_./:@+=,~".contains(c)
}

/// The row name of `key`: [`key::escape`]d to readable ASCII, then [`key::shorten`]ed to
/// [`NAME_WIDTH`] (a readable prefix and a SHA-256 digest). Injective, and compared as bytes
/// by the binary column, so `A` and `a` are different rows.
pub(crate) fn row_name(key: &str) -> String {
    key::shorten(&key::escape(key, readable), NAME_WIDTH)
}

/// `name` as a binary string literal.
pub(crate) fn literal(name: &str) -> String {
    let mut out = String::with_capacity(3 + 2 * name.len());
    out.push_str("X'");
    for b in name.bytes() {
        let _ = write!(out, "{b:02X}");
    }
    out.push('\'');
    out
}

/// The session idle timeout for a lease of `ttl`: whole seconds, rounded up, at least 1.
pub(crate) fn idle_seconds(ttl: Duration) -> u32 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    u32::try_from(secs.max(1)).unwrap_or(u32::MAX)
}

/// Where fencing tokens come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tokens {
    /// `{table}_seq`, a MariaDB sequence read by the locking statement itself: no commit.
    Sequence,
    /// `{table}_fence`, a per-key counter committed apart from the lock (MySQL 8, which has
    /// no sequences).
    Counter,
}

/// Which server the statements are for: the two spell a shared row lock differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Server {
    /// MariaDB: `LOCK IN SHARE MODE [NOWAIT]` (it has no `FOR SHARE`).
    MariaDb,
    /// MySQL 8: `FOR SHARE [NOWAIT]` (its `LOCK IN SHARE MODE` takes no `NOWAIT`).
    MySql,
}

impl Server {
    /// The server `VERSION()` names.
    pub(crate) fn of_version(version: &str) -> Self {
        if version.contains("MariaDB") {
            Server::MariaDb
        } else {
            Server::MySql
        }
    }
}

/// `SET SESSION wait_timeout = …;`, or nothing when the session has it already.
pub(crate) fn set_idle(idle: Option<u32>) -> String {
    idle.map_or_else(String::new, |idle| {
        format!("SET SESSION wait_timeout = {idle};")
    })
}

/// A hold as its granting statement records it in `{table}_held`: the key, and who holds
/// it (the client's `holder_description`, or an election candidate's value).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Holder<'a> {
    pub(crate) key: &'a str,
    pub(crate) who: &'a str,
}

/// The `mode` and `permits` columns of a `mode` hold's row in `{table}_held`.
pub(crate) fn held_mode(mode: Mode) -> (&'static str, u32) {
    match mode {
        Mode::Exclusive => ("exclusive", 0),
        Mode::Shared => ("shared", 0),
        Mode::Permits(n) => ("permits", n),
    }
}

/// The statements for one lock table, its fence table and its token sequence.
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    pub(crate) table: String,
    pub(crate) fence: String,
    seq: String,
    /// `{table}_slots`: a semaphore key's permit slots (see `permits`).
    pub(crate) slots: String,
    /// `{table}_held`: who holds what, written uncommitted by each holding transaction
    /// (see [`Self::record_holder`]).
    pub(crate) held: String,
    /// `{table}_value`: the value a named-mode leader publishes (see `named`).
    pub(crate) value: String,
    /// `{table}_owner`: the owner and count of each reentrant hold (see `reentry`).
    pub(crate) owner: String,
    pub(crate) tokens: Tokens,
    server: Server,
    /// The server has `INSERT … RETURNING` (MariaDB from 10.5): see [`Self::records_in_lock`].
    returning: bool,
    /// The prepared first try of an exclusive and of a shared hold, when lock connections
    /// run with `autocommit` off (see [`Self::with_prepared_take`]).
    prepared_take: Option<[String; 2]>,
}

impl Sql {
    /// Statements for `server`'s tables named by a validated identifier, taking tokens
    /// from `tokens`.
    pub(crate) fn new(table: &str, tokens: Tokens, server: Server) -> Self {
        Self {
            table: table.to_owned(),
            fence: format!("{table}_fence"),
            seq: format!("{table}_seq"),
            slots: format!("{table}_slots"),
            held: format!("{table}_held"),
            value: format!("{table}_value"),
            owner: format!("{table}_owner"),
            tokens,
            server,
            returning: tokens == Tokens::Sequence,
            prepared_take: None,
        }
    }

    /// The same statements for lock connections that run with `autocommit` off (row mode
    /// on a server that [records in the lock](Self::records_in_lock)): the first try of an
    /// exclusive or shared hold is then one prepared statement, with no `BEGIN` (the
    /// statement starts the transaction). The server parses it once per connection, and
    /// runs one statement a try instead of two: about a quarter less of its CPU a cycle.
    pub(crate) fn with_prepared_take(mut self) -> Self {
        self.prepared_take = self.records_in_lock().then(|| {
            [Mode::Exclusive, Mode::Shared].map(|mode| self.lock_and_record_with(mode, true))
        });
        self
    }

    /// Lock connections run with `autocommit` off: see [`Self::with_prepared_take`].
    pub(crate) fn autocommit_off(&self) -> bool {
        self.prepared_take.is_some()
    }

    /// The prepared first try of a `mode` hold where lock connections run with `autocommit`
    /// off: [`Self::lock_and_record`] `NOWAIT`, with the hold's key, its `who` and the row
    /// name as the three parameters, in that order. `None` for a permit, or where the take
    /// goes as a text batch.
    pub(crate) fn prepared_take(&self, mode: Mode) -> Option<&str> {
        let [exclusive, shared] = self.prepared_take.as_ref()?;
        match mode {
            Mode::Exclusive => Some(exclusive),
            Mode::Shared => Some(shared),
            Mode::Permits(_) => None,
        }
    }

    /// The same statements for a server with or without `INSERT … RETURNING` (MariaDB from
    /// 10.5; a MariaDB with sequences is assumed to have it until told otherwise).
    pub(crate) fn with_returning(mut self, returning: bool) -> Self {
        self.returning = returning && self.tokens == Tokens::Sequence;
        self
    }

    /// The locking clause of a `mode` hold of the key's row: InnoDB's exclusive row lock
    /// for a writer, its shared one for a reader (which InnoDB queues behind a waiting
    /// exclusive request). Permits lock slot rows instead (see `permits`), exclusively.
    fn lock_clause(&self, mode: Mode, nowait: bool) -> &'static str {
        match (mode, self.server, nowait) {
            (Mode::Exclusive | Mode::Permits(_), _, true) => "FOR UPDATE NOWAIT",
            (Mode::Exclusive | Mode::Permits(_), _, false) => "FOR UPDATE",
            (Mode::Shared, Server::MariaDb, true) => "LOCK IN SHARE MODE NOWAIT",
            (Mode::Shared, Server::MariaDb, false) => "LOCK IN SHARE MODE",
            (Mode::Shared, Server::MySql, true) => "FOR SHARE NOWAIT",
            (Mode::Shared, Server::MySql, false) => "FOR SHARE",
        }
    }

    /// The token sequence's name.
    pub(crate) fn sequence(&self) -> &str {
        &self.seq
    }

    /// Whether the token sequence exists: one row if it does.
    pub(crate) fn find_sequence(&self) -> String {
        format!(
            "SELECT 1 FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE() \
               AND TABLE_NAME = '{}' AND TABLE_TYPE = 'SEQUENCE'",
            self.seq
        )
    }

    /// The first token the sequence may hand out: above every counter of the fence table,
    /// so that tokens keep rising for keys locked before the sequence existed.
    pub(crate) fn first_token(&self) -> String {
        format!(
            "SELECT CAST(COALESCE(MAX(fence), 0) + 1 AS UNSIGNED) FROM `{}`",
            self.fence
        )
    }

    /// Create the token sequence, starting at `start`. InnoDB, so its stored state is as
    /// durable as the counters were; `CACHE 1000` writes it once per thousand tokens (the
    /// values cached when the server stops are skipped, never handed out again).
    pub(crate) fn create_sequence(&self, start: u64) -> String {
        format!(
            "CREATE SEQUENCE IF NOT EXISTS `{}` START WITH {start} MINVALUE 1 CACHE 1000 \
             NOCYCLE ENGINE=InnoDB COMMENT='dlock: fencing tokens, never reset by design'",
            self.seq
        )
    }

    /// What the locking statement selects from the row: the next token where the sequence
    /// gives it (drawn once the row is locked, so a later holder's is larger), else `0`.
    pub(crate) fn locked_value(&self) -> String {
        match self.tokens {
            Tokens::Sequence => format!("CAST(NEXTVAL(`{}`) AS UNSIGNED)", self.seq),
            Tokens::Counter => "CAST(0 AS UNSIGNED)".to_owned(),
        }
    }

    /// Create the tables if missing: the key rows, the fence counters, the permit slots.
    pub(crate) fn create_tables(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS `{t}` (\
               name VARBINARY({NAME_WIDTH}) NOT NULL PRIMARY KEY\
             ) ENGINE=InnoDB COMMENT='dlock: one row per key ever locked, kept for reuse';\
             CREATE TABLE IF NOT EXISTS `{f}` (\
               name VARBINARY({NAME_WIDTH}) NOT NULL PRIMARY KEY,\
               fence BIGINT UNSIGNED NOT NULL,\
               holder BIGINT UNSIGNED NOT NULL COMMENT 'CONNECTION_ID() of the latest holder',\
               granted_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)\
             ) ENGINE=InnoDB COMMENT='dlock: fencing counters, kept for ever by design';\
             CREATE TABLE IF NOT EXISTS `{s}` (\
               name VARBINARY({NAME_WIDTH}) NOT NULL,\
               slot SMALLINT UNSIGNED NOT NULL,\
               PRIMARY KEY (name, slot)\
             ) ENGINE=InnoDB COMMENT='dlock: permit slots, one row per slot ever used, kept for reuse';\
             CREATE TABLE IF NOT EXISTS `{h}` (\
               name VARBINARY({NAME_WIDTH}) NOT NULL,\
               conn BIGINT UNSIGNED NOT NULL COMMENT 'CONNECTION_ID() of the holding session',\
               held_key VARBINARY({MAX_KEY}) NOT NULL,\
               mode VARBINARY(16) NOT NULL,\
               permits INT UNSIGNED NOT NULL,\
               token BIGINT UNSIGNED NULL,\
               since TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6),\
               who VARBINARY({VALUE_WIDTH}) NOT NULL,\
               PRIMARY KEY (name, conn)\
             ) ENGINE=InnoDB COMMENT='dlock: each hold, inserted by its transaction and rolled back at release: read it READ UNCOMMITTED';\
             CREATE TABLE IF NOT EXISTS `{v}` (\
               name VARBINARY({NAME_WIDTH}) NOT NULL PRIMARY KEY,\
               conn BIGINT UNSIGNED NOT NULL COMMENT 'CONNECTION_ID() of the leader, valid while IS_USED_LOCK names it',\
               token BIGINT UNSIGNED NOT NULL,\
               value VARBINARY({VALUE_WIDTH}) NOT NULL\
             ) ENGINE=InnoDB COMMENT='dlock: the value of each named-mode election leader, deleted when it resigns';\
             CREATE TABLE IF NOT EXISTS `{o}` (\
               name VARBINARY({NAME_WIDTH}) NOT NULL PRIMARY KEY,\
               owner VARBINARY(64) NOT NULL,\
               token BIGINT UNSIGNED NOT NULL COMMENT 'the hold: its fencing token',\
               entries INT UNSIGNED NOT NULL COMMENT 'leases of the hold not released yet',\
               expires DATETIME(6) NOT NULL COMMENT 'the latest end of a lease of another client',\
               since TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)\
             ) ENGINE=InnoDB COMMENT='dlock: the owner and count of each reentrant hold, deleted when the hold ends'",
            t = self.table,
            f = self.fence,
            s = self.slots,
            h = self.held,
            v = self.value,
            o = self.owner,
        )
    }

    /// One row per table that exists: its name, engine, and its primary key column's type,
    /// length and collation.
    pub(crate) fn describe_tables(&self) -> String {
        format!(
            "SELECT CAST(t.TABLE_NAME AS CHAR), CAST(t.ENGINE AS CHAR), \
                    CAST(c.DATA_TYPE AS CHAR), CAST(c.CHARACTER_MAXIMUM_LENGTH AS UNSIGNED), \
                    CAST(c.COLLATION_NAME AS CHAR) \
             FROM information_schema.TABLES t \
             JOIN information_schema.COLUMNS c \
               ON c.TABLE_SCHEMA = t.TABLE_SCHEMA AND c.TABLE_NAME = t.TABLE_NAME \
              AND c.COLUMN_NAME = 'name' \
             WHERE t.TABLE_SCHEMA = DATABASE() \
               AND t.TABLE_NAME IN ('{}', '{}', '{}', '{}', '{}', '{}')",
            self.table, self.fence, self.slots, self.held, self.value, self.owner
        )
    }

    /// Session setup on every new connection, with `autocommit` off if not `autocommit`;
    /// the batch's last result is the connection id and the session's idle timeout.
    pub(crate) fn session_setup(autocommit: bool) -> String {
        format!(
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED;\
             SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_ROUND};{off}\
             SELECT CAST(CONNECTION_ID() AS UNSIGNED), CAST(@@SESSION.wait_timeout AS UNSIGNED)",
            off = if autocommit {
                ""
            } else {
                "SET SESSION autocommit = 0;"
            },
        )
    }

    /// Take the row without waiting, recording the hold as `who` holding `key` (see
    /// [`Self::record_holder`]). Statements: set the idle timeout; with `create`, end the
    /// transaction a miss left open and create the row (a consistent read, then a plain
    /// insert only if it saw no row, so it does not wait for a holder and takes no gap
    /// lock; a duplicate-key error means another client created it just now); begin; lock
    /// it in `mode`, `NOWAIT`, and record the hold (see [`Self::lock_and_record`]; its last
    /// row is the token: held; no row: missing; lock error: busy).
    /// `idle` is `None` when the session already has that idle timeout.
    pub(crate) fn try_take(
        &self,
        name: &str,
        mode: Mode,
        idle: Option<u32>,
        create: bool,
        holder: Holder<'_>,
    ) -> String {
        let n = literal(name);
        let t = &self.table;
        let create = if create {
            format!(
                "ROLLBACK;INSERT INTO `{t}` (name) SELECT {n} FROM DUAL \
                   WHERE NOT EXISTS (SELECT 1 FROM `{t}` WHERE name = {n});"
            )
        } else {
            String::new()
        };
        let take = self.lock_and_record(name, mode, true, holder);
        let record = match self.records_in_lock() {
            true => String::new(),
            false => format!(
                ";{}",
                self.record_holder(name, holder.key, mode, holder.who)
            ),
        };
        format!("{set}{create}BEGIN;{take}{record}", set = set_idle(idle))
    }

    /// Wait for the row: begin (which ends the transaction a failed `NOWAIT` left open) and
    /// lock it in `mode`, waiting up to [`LOCK_WAIT_ROUND`]; where the server can, the same
    /// statement records the hold (see [`Self::lock_and_record`]). The batch ends with the
    /// wait: a hold not recorded in it is recorded by a statement of its own once granted.
    pub(crate) fn wait_take(
        &self,
        name: &str,
        mode: Mode,
        idle: Option<u32>,
        holder: Holder<'_>,
    ) -> String {
        format!(
            "{set}BEGIN;{take}",
            set = set_idle(idle),
            take = self.lock_and_record(name, mode, false, holder),
        )
    }

    /// Whether a locking read records its hold in the same statement: on MariaDB from 10.5,
    /// whose `INSERT … SELECT … RETURNING` locks the key's row, draws the token and inserts
    /// the hold's row in one statement. MySQL 8 has no `RETURNING` (and takes its token
    /// after the grant), nor has MariaDB before 10.5: their locking read is a `SELECT`, and
    /// the record a statement of its own.
    pub(crate) fn records_in_lock(&self) -> bool {
        self.returning
    }

    /// The locking read of the key's row in `mode` (`NOWAIT` or waiting). Where
    /// [`Self::records_in_lock`]: `INSERT INTO {table}_held … SELECT name, CONNECTION_ID(),
    /// … FROM {table} WHERE name = … <lock> RETURNING token`, so the row lock, the token
    /// (drawn once the row is locked, so a later holder's is larger) and the hold's row come
    /// from one statement, answered by the token (no row: the key's row is missing).
    /// Otherwise `SELECT` [`Self::locked_value`] `FROM {table} WHERE name = … <lock>`.
    fn lock_and_record(&self, name: &str, mode: Mode, nowait: bool, holder: Holder<'_>) -> String {
        let n = literal(name);
        if !self.records_in_lock() {
            let (v, lock) = (self.locked_value(), self.lock_clause(mode, nowait));
            return format!("SELECT {v} FROM `{}` WHERE name = {n} {lock}", self.table);
        }
        self.lock_and_record_with(mode, nowait)
            .replacen('?', &literal(holder.key), 1)
            .replacen('?', &literal(holder.who), 1)
            .replacen('?', &n, 1)
    }

    /// [`Self::lock_and_record`]'s `INSERT … SELECT … RETURNING` with the hold's key, its
    /// `who` and the row name as parameters (`?`, in that order): the prepared form, and
    /// the text form once they are filled in with literals (which contain no `?`).
    fn lock_and_record_with(&self, mode: Mode, nowait: bool) -> String {
        let (v, lock) = (self.locked_value(), self.lock_clause(mode, nowait));
        let (mode, permits) = held_mode(mode);
        format!(
            "INSERT INTO `{h}` (name, conn, held_key, mode, permits, token, who) \
             SELECT name, CONNECTION_ID(), ?, '{mode}', {permits}, {v}, ? \
             FROM `{t}` WHERE name = ? {lock} RETURNING token",
            h = self.held,
            t = self.table,
        )
    }

    /// Record `holder` as the key's latest holder in its fence row (autocommit) and read
    /// the next token: the key's counter plus one, or the sequence's next value where there
    /// is one (then the counter row only records the holder). Sent once the lock is granted,
    /// so a later holder's token is larger.
    pub(crate) fn next_fence(&self, name: &str, holder: u64) -> String {
        let (first, next) = match self.tokens {
            Tokens::Counter => ("1".to_owned(), "fence + 1".to_owned()),
            Tokens::Sequence => {
                let v = format!("NEXTVAL(`{}`)", self.seq);
                (v, "VALUES(fence)".to_owned())
            }
        };
        format!(
            "INSERT INTO `{f}` (name, fence, holder) \
               VALUES ({n}, LAST_INSERT_ID({first}), {holder}) \
               ON DUPLICATE KEY UPDATE fence = LAST_INSERT_ID({next}), holder = {holder}, \
               granted_at = CURRENT_TIMESTAMP(6);\
             SELECT CAST(LAST_INSERT_ID() AS UNSIGNED)",
            f = self.fence,
            n = literal(name),
        )
    }

    /// Set how long the session's locking statements wait, in whole seconds.
    pub(crate) fn lock_wait(seconds: u32) -> String {
        format!("SET SESSION innodb_lock_wait_timeout = {seconds}")
    }

    /// Set the idle timeout of a holding session: the lease's renewal.
    pub(crate) fn keep(idle: u32) -> String {
        format!("SET SESSION wait_timeout = {idle}")
    }

    /// End the transaction (a `ROLLBACK`, see [`End`]), which hands the row to the next
    /// waiter and removes the hold's `{table}_held` row, and with `restore` restore the default idle timeout. The row stays for the
    /// key's next use.
    pub(crate) fn finish(end: End, restore: bool) -> String {
        let restore = if restore {
            ";SET SESSION wait_timeout = DEFAULT"
        } else {
            ""
        };
        format!("{}{restore}", end.sql())
    }

    /// `sql`, then the release of the permit creation lock the session may hold (a
    /// creating batch stopped before its own release; see [`Sql::permit_try`]).
    pub(crate) fn release_creation_lock(sql: &str, creation_lock: Option<&str>) -> String {
        match creation_lock {
            Some(name) => format!("{sql};DO RELEASE_LOCK({})", literal(name)),
            None => sql.to_owned(),
        }
    }

    /// Give up a transaction that holds nothing, and restore the idle timeout.
    pub(crate) const fn rollback() -> &'static str {
        "ROLLBACK;SET SESSION wait_timeout = DEFAULT"
    }
}

/// How a transaction ends. Both roll back: a hold's transaction wrote nothing but its
/// row in `{table}_held`, which must not outlive it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// The holder lets go (`release`).
    Release,
    /// A transaction that may hold the lock is given up (a wait stopped, a grant nobody
    /// took, a lease dropped).
    Rollback,
}

impl End {
    fn sql(self) -> &'static str {
        "ROLLBACK"
    }
}

#[cfg(test)]
#[path = "sql_tests.rs"]
mod tests;
