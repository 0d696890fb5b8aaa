//! The statements, in one place. Table and sequence names are checked identifiers
//! (`config::check_table`); lock ids, namespaces and durations are integers; key names are
//! only ever sent as bound parameters.

use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{Mode, Owner};

mod election;
mod permits;

/// One advisory lock as a hold takes it: the key's id and the mode. Shared and exclusive
/// holds of a key take the same lock (`namespace`, `id`), in PostgreSQL's share and
/// exclusive modes, so that the server's lock manager keeps them apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Advisory {
    pub(crate) id: i32,
    pub(crate) mode: Mode,
    /// A candidate's hold (exclusive): the value it publishes in the election table when
    /// granted; its release deletes the row. `None` for every other hold.
    pub(crate) value: Option<Arc<str>>,
    /// A reentrant hold's first grant (exclusive): the owner whose row (count 1) the
    /// granting statement writes in the owner table; its release deletes the row (see
    /// `crate::reentry`). `None` for every other hold.
    pub(crate) owner: Option<Owner>,
}

/// How long a connection stays silent before the server's TCP keepalive starts probing the
/// client, in seconds, when it holds nothing (a client gone without closing its socket is
/// dropped 3 probes 1 s apart later).
const KEEPALIVE_IDLE_S: u64 = 5;

/// A holder session's timeouts, as one expression: the server ends the session after
/// `idle_ms` without a statement (`idle_session_timeout`, which is how a silent holder's
/// locks free), and its TCP keepalive starts probing no sooner (`tcp_keepalives_idle`,
/// whole seconds rounded up). Left at the connection's 5 s, a partition or a lossy link
/// would end the session 8 s after the server last heard from the holder (3 probes, 1 s
/// apart): before its lease ran out and its `lost()` fired, whenever the ttl is longer.
pub(crate) fn hold_timeouts(idle_ms: u64) -> String {
    let [idle, keepalive] = timeout_values(idle_ms);
    format!(
        "set_config('idle_session_timeout', '{idle}', false) || \
         set_config('tcp_keepalives_idle', '{keepalive}', false)"
    )
}

/// [`hold_timeouts`] with the two values as the parameters `$2` and `$3`.
const HOLD_TIMEOUTS_2_3: &str = "set_config('idle_session_timeout', $2, false) || \
     set_config('tcp_keepalives_idle', $3, false)";

/// The values of [`hold_timeouts`]: the idle timeout in milliseconds and the keepalive idle
/// in whole seconds, as `set_config` takes them.
fn timeout_values(idle_ms: u64) -> [String; 2] {
    [
        idle_ms.to_string(),
        idle_ms.div_ceil(1000).max(KEEPALIVE_IDLE_S).to_string(),
    ]
}

/// A statement as it goes to the server.
///
/// The statements every plain hold runs (its take and its release) are
/// [`Prepared`](Statement::Prepared): their text is the same for every key, the key's id
/// and the timeouts being parameters, so each connection parses and plans them once and
/// then only binds and runs them (sqlx keeps them, by text). Sent as text instead, the
/// server parsed and planned both anew each time: measured on loopback, that was about
/// half of the server's work for a take and release (85 µs → 43 µs a cycle). The rest (a
/// candidate's or an owner's statements, permits, waits, which are batches of several)
/// go as [`Simple`](Statement::Simple) text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Statement {
    /// Sent as text (the simple query protocol): one or more statements.
    Simple(String),
    /// One statement, prepared once per connection; `params` are bound to `$1`, `$2`, …
    Prepared { text: String, params: Vec<Param> },
}

/// A value bound to a [`Statement::Prepared`]'s parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Param {
    Int(i32),
    BigInt(i64),
    Text(String),
}

impl Statement {
    /// The statement's text, with `$n` where its parameters go.
    pub(crate) fn text(&self) -> &str {
        match self {
            Self::Simple(text) | Self::Prepared { text, .. } => text,
        }
    }
}

#[cfg(test)]
impl Statement {
    /// The text with each parameter written in its place, as the server runs it.
    pub(crate) fn inlined(&self) -> String {
        let Self::Prepared { text, params } = self else {
            return self.text().to_owned();
        };
        // From the last, so that `$1` never replaces the start of `$10`.
        params
            .iter()
            .enumerate()
            .rev()
            .fold(text.clone(), |text, (i, param)| {
                let value = match param {
                    Param::Int(v) => v.to_string(),
                    Param::BigInt(v) => v.to_string(),
                    Param::Text(v) => format!("'{v}'"),
                };
                text.replace(&format!("${}", i + 1), &value)
            })
    }
}

impl fmt::Display for Statement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.text())
    }
}

/// A session back to holding nothing: no idle timeout, keepalive probes after
/// [`KEEPALIVE_IDLE_S`].
const NO_HOLD_TIMEOUTS: &str = "set_config('idle_session_timeout', '0', false) || \
     set_config('tcp_keepalives_idle', '5', false)";

impl Advisory {
    /// A hold of lock `id` in `mode`, not a candidate's.
    pub(crate) fn new(id: i32, mode: Mode) -> Self {
        Self {
            id,
            mode,
            value: None,
            owner: None,
        }
    }

    /// The suffix of the advisory lock functions of this mode (`pg_advisory_lock_shared`).
    fn suffix(&self) -> &'static str {
        match self.mode {
            Mode::Shared => "_shared",
            // A permit is an exclusive lock on one of the key's slots (see `try_permit`).
            Mode::Exclusive | Mode::Permits(_) => "",
        }
    }
}

/// The first number of slot `slot`'s advisory lock: `namespace + slot`, wrapping in `int4`.
/// Slot 0 is the key's own lock `(namespace, id)`.
pub(crate) fn slot_class(namespace: i32, slot: i32) -> i32 {
    namespace.wrapping_add(slot)
}

/// The statements of one configuration.
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    pub(crate) table: String,
    /// The election table: one row per key with a leader (see [`upsert`](Self::upsert)).
    elect: String,
    /// The owner table: one row per reentrant hold (see `crate::reentry`).
    pub(crate) owners: String,
    id_seq: String,
    pub(crate) fence_seq: String,
    pub(crate) namespace: i32,
}

/// Milliseconds for a `set_config` of a duration setting: rounded up, at least 1 (0 would
/// mean "no limit").
pub(crate) fn millis(d: Duration) -> u64 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    u64::try_from(ms)
        .unwrap_or(u64::MAX)
        .clamp(1, i32::MAX as u64)
}

/// `value` as a text expression made of hex digits only:
/// `convert_from(decode('…', 'hex'), 'UTF8')`. Nothing in the value reaches the statement's
/// text as itself, whatever `standard_conforming_strings` says.
pub(crate) fn text_literal(value: &str) -> String {
    let mut hex = String::with_capacity(value.len() * 2);
    for byte in value.bytes() {
        let _ = write!(hex, "{byte:02x}");
    }
    format!("convert_from(decode('{hex}', 'hex'), 'UTF8')")
}

impl Sql {
    pub(crate) fn new(table: &str, namespace: i32) -> Self {
        Self {
            table: table.to_owned(),
            elect: format!("{table}_elect"),
            owners: format!("{table}_owner"),
            id_seq: format!("{table}_id"),
            fence_seq: format!("{table}_fence"),
            namespace,
        }
    }

    /// Run once per new connection: its backend pid (for `pg_cancel_backend`), durable
    /// commits (a fencing token is on disk before the holder hears of it), a check every
    /// second that the client is still there while a statement runs (a client killed while
    /// waiting leaves the lock queue at once), and TCP keepalives from the server's side.
    /// The keepalive idle is [`KEEPALIVE_IDLE_S`]; a hold raises it ([`hold_timeouts`]).
    pub(crate) fn session_setup() -> &'static str {
        "SELECT pg_backend_pid(), \
         set_config('synchronous_commit', 'on', false), \
         set_config('client_connection_check_interval', '1000', false), \
         set_config('tcp_keepalives_idle', '5', false), \
         set_config('tcp_keepalives_interval', '1', false), \
         set_config('tcp_keepalives_count', '3', false)"
    }

    /// Whether the table and both sequences exist.
    pub(crate) fn exists(&self) -> String {
        format!(
            "SELECT to_regclass('{}') IS NOT NULL AND to_regclass('{}') IS NOT NULL \
             AND to_regclass('{}') IS NOT NULL",
            self.table, self.id_seq, self.fence_seq
        )
    }

    /// Create the table and sequences, serialised between clients by a transaction-level
    /// advisory lock on id 0 of the namespace (ids start at 1).
    pub(crate) fn create(&self) -> String {
        let (t, ids, fence, ns) = (&self.table, &self.id_seq, &self.fence_seq, self.namespace);
        format!(
            "BEGIN; SELECT pg_advisory_xact_lock({ns}, 0); \
             CREATE SEQUENCE IF NOT EXISTS {ids} AS integer; \
             CREATE SEQUENCE IF NOT EXISTS {fence} AS bigint; \
             CREATE TABLE IF NOT EXISTS {t} (\
               name text PRIMARY KEY, \
               id integer NOT NULL UNIQUE DEFAULT nextval('{ids}'), \
               created timestamptz NOT NULL DEFAULT now()); \
             ALTER SEQUENCE {ids} OWNED BY {t}.id; \
             COMMIT"
        )
    }

    /// `$1` = key: its id, if it has one.
    pub(crate) fn lookup(&self) -> String {
        format!("SELECT id FROM {} WHERE name = $1", self.table)
    }

    /// `$1` = key: give it an id unless it has one (then nothing is returned).
    pub(crate) fn insert(&self) -> String {
        format!(
            "INSERT INTO {} (name) VALUES ($1) ON CONFLICT (name) DO NOTHING RETURNING id",
            self.table
        )
    }

    /// Take the lock without waiting; when granted, take a fencing token and start the
    /// session's idle timeout, in the same statement. One row: the token, or NULL when busy.
    ///
    /// A shared request is refused while an exclusive one waits (the lock manager checks
    /// waiting requests before held ones), so later readers do not pass a waiting writer.
    pub(crate) fn try_take(&self, lock: &Advisory, idle_ms: u64) -> Statement {
        let (ns, id, suffix) = (self.namespace, lock.id, lock.suffix());
        if let Some(value) = &lock.value {
            return Statement::Simple(self.try_campaign(id, value, idle_ms));
        }
        if let Some(owner) = &lock.owner {
            return Statement::Simple(self.try_owned(id, owner, idle_ms));
        }
        // `$1` = id, `$2` and `$3` = the timeouts.
        let [idle, keepalive] = timeout_values(idle_ms);
        Statement::Prepared {
            text: self.take_if(
                &format!("pg_try_advisory_lock{suffix}({ns}, $1)"),
                HOLD_TIMEOUTS_2_3,
            ),
            params: vec![Param::Int(id), Param::Text(idle), Param::Text(keepalive)],
        }
    }

    /// [`try_take`](Self::try_take) of a plain hold on a session whose idle timeout (and
    /// keepalive) are already the hold's: the same statement without the `set_config`s,
    /// which were about a fifth of the server's work for a take and release (measured with
    /// `pgbench`, 32 clients on 32 keys: 17.6k cycles/s with them, 21.3k without; 26k for a
    /// bare `pg_advisory_lock` + `pg_advisory_unlock`). `$1` = id.
    pub(crate) fn try_take_kept(&self, lock: &Advisory) -> Statement {
        let (ns, suffix) = (self.namespace, lock.suffix());
        let text = format!(
            "SELECT CASE WHEN pg_try_advisory_lock{suffix}({ns}, $1) \
             THEN nextval('{fence}') END AS token",
            fence = self.fence_seq,
        );
        Statement::Prepared {
            text,
            params: vec![Param::Int(lock.id)],
        }
    }

    /// A session that holds nothing back to its defaults (see [`NO_HOLD_TIMEOUTS`]).
    pub(crate) fn rest() -> Statement {
        Statement::Simple(format!("SELECT {NO_HOLD_TIMEOUTS}"))
    }

    /// [`try_take`](Self::try_take) of a shared lock on a session that already holds it
    /// shared. The server grants a lock its session already holds in that mode without
    /// looking at its queue, so a waiting writer would be passed: the statement first looks
    /// for a request waiting on the lock in `pg_locks` and answers busy (NULL) if there is
    /// one. Dearer (`pg_locks` reads the whole lock table), so only for re-entry.
    pub(crate) fn try_share_again(&self, id: i32, idle_ms: u64) -> String {
        let ns = self.namespace;
        let condition = format!(
            "CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' \
               AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND classid = ({ns})::oid AND objid = ({id})::oid AND objsubid = 2 \
               AND NOT granted) \
             THEN false ELSE pg_try_advisory_lock_shared({ns}, {id}) END"
        );
        self.take_if(&condition, &hold_timeouts(idle_ms))
    }

    /// The try statement around `condition`, which takes the lock when true, then sets
    /// `timeouts`. `CASE` keeps the order: the token is taken only after the lock.
    fn take_if(&self, condition: &str, timeouts: &str) -> String {
        format!(
            "SELECT t.token, CASE WHEN t.token IS NOT NULL THEN {timeouts} END \
             FROM (SELECT CASE WHEN {condition} \
               THEN nextval('{fence}') END AS token OFFSET 0) t",
            fence = self.fence_seq,
        )
    }

    /// Wait for the lock at most `wait_ms` (`lock_timeout`, local to this batch's implicit
    /// transaction, with no `statement_timeout` a server or role default might set); when
    /// granted, the token and the idle timeout as in
    /// [`try_take`](Self::try_take). `OFFSET 0` keeps the lock in a subquery evaluated
    /// before the token is taken.
    ///
    /// A candidate's wait goes on, once granted, with no `lock_timeout` (its row may wait
    /// for the previous leader's release to commit, and a lock timeout then would leave the
    /// lock held by a batch that failed) and the statement of
    /// [`publish`](Self::publish), whose first column is the token too.
    pub(crate) fn wait_take(&self, lock: &Advisory, idle_ms: u64, wait_ms: u64) -> String {
        let (id, suffix) = (lock.id, lock.suffix());
        let timeouts = hold_timeouts(idle_ms);
        let mut sql = format!(
            "SELECT set_config('lock_timeout', '{wait_ms}', true), \
               set_config('statement_timeout', '0', true); \
             SELECT nextval('{fence}'), {timeouts} \
             FROM (SELECT pg_advisory_lock{suffix}({ns}, {id}) OFFSET 0) l",
            ns = self.namespace,
            fence = self.fence_seq,
        );
        if let Some(value) = &lock.value {
            let _ = write!(
                sql,
                "; SELECT set_config('lock_timeout', '0', true); {}",
                self.publish(id, value)
            );
        }
        if let Some(owner) = &lock.owner {
            let _ = write!(
                sql,
                "; SELECT set_config('lock_timeout', '0', true); {}",
                self.own_after_wait(id, owner)
            );
        }
        sql
    }

    /// Renew with a new ttl: the session's idle timeout.
    pub(crate) fn keep(idle_ms: u64) -> String {
        format!("SELECT {}", hold_timeouts(idle_ms))
    }

    /// Release: one row, whether the lock was held; the session back to its defaults.
    pub(crate) fn release(&self, lock: &Advisory) -> Statement {
        match self.unlock(lock) {
            Statement::Simple(text) => Statement::Simple(format!("{text}, {NO_HOLD_TIMEOUTS}")),
            Statement::Prepared { text, params } => Statement::Prepared {
                text: format!("{text}, {NO_HOLD_TIMEOUTS}"),
                params,
            },
        }
    }

    /// Release one of several locks the session holds: one row, whether it was held. A
    /// candidate's release deletes its row in the election table too (this session's), and
    /// notifies the key's observers at commit.
    pub(crate) fn unlock(&self, lock: &Advisory) -> Statement {
        let (ns, id) = (self.namespace, lock.id);
        if lock.owner.is_some() {
            return Statement::Simple(self.unlock_owned(id));
        }
        match lock.value {
            None => Statement::Prepared {
                text: format!("SELECT pg_advisory_unlock{}({ns}, $1)", lock.suffix()),
                params: vec![Param::Int(id)],
            },
            Some(_) => Statement::Simple(format!(
                "WITH d AS (DELETE FROM {elect} WHERE ns = {ns} AND id = {id} \
                   AND pid = pg_backend_pid()) \
                 SELECT pg_advisory_unlock({ns}, {id}), pg_notify('{channel}', '{id}')",
                elect = self.elect,
                channel = self.leader_channel(),
            )),
        }
    }

    /// This key table's advisory locks in `pg_locks` (alias `l`): locks of two `int4`s
    /// (`objsubid = 2`) in the current database whose first number is one of the
    /// namespace's [`Mode::MAX_PERMITS`] slots.
    fn own_locks(&self) -> String {
        format!(
            "l.locktype = 'advisory' AND l.objsubid = 2 \
             AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
             AND {} < {}",
            self.slot_of_lock(),
            Mode::MAX_PERMITS
        )
    }

    /// The slot of `pg_locks` row `l`: its first number less the namespace, as unsigned
    /// 32-bit numbers (0 for the key's own lock).
    fn slot_of_lock(&self) -> String {
        let ns = i64::from(self.namespace as u32);
        format!("((l.classid::int8 - {ns} + 4294967296) % 4294967296)")
    }

    /// `$1` = key: every hold of and wait for the key's locks (its own and its permit
    /// slots), read from `pg_locks` and `pg_stat_activity`, changing nothing. One row per
    /// lock and session: the slot, whether shared, whether granted, the backend pid, when
    /// it began to wait (microseconds since 1970), the session's application name and
    /// client address. Holders first, then waiters in the order they began to wait. No
    /// rows when the key has no row in the table (it was never locked) or nobody holds or
    /// waits for it.
    ///
    /// With `elections` (the election table exists), two more columns (`leader_value`,
    /// `leader_term`): the value and term of a leader's row, on the row of the session that
    /// holds the key's own lock exclusively with that pid in the election table. With
    /// `owners` (the owner table exists), three more (`owner_id`, `owner_holds`,
    /// `owner_token`): a reentrant hold's row, on the row of its session, the same way.
    pub(crate) fn inspect(&self, elections: bool, owners: bool) -> String {
        let on = |alias: &str| {
            format!(
                "{alias}.ns = {ns} AND {alias}.id = k.id AND {alias}.pid = l.pid \
                   AND {alias}.started = pg_postmaster_start_time() AND l.granted \
                   AND l.mode = 'ExclusiveLock' AND {slot} = 0 ",
                ns = self.namespace,
                slot = self.slot_of_lock(),
            )
        };
        let (mut columns, mut join) = (String::new(), String::new());
        if elections {
            columns.push_str(", e.value AS leader_value, e.token AS leader_term");
            let _ = write!(join, "LEFT JOIN {} e ON {}", self.elect, on("e"));
        }
        if owners {
            columns
                .push_str(", o.owner AS owner_id, o.holds AS owner_holds, o.token AS owner_token");
            let _ = write!(join, "LEFT JOIN {} o ON {}", self.owners, on("o"));
        }
        format!(
            "SELECT {slot} AS slot, l.mode = 'ShareLock', l.granted, l.pid, \
               (extract(epoch FROM l.waitstart) * 1000000)::int8, \
               a.application_name, host(a.client_addr){columns} \
             FROM {table} k \
             JOIN pg_locks l ON l.objid = k.id::oid AND {own} \
             LEFT JOIN pg_stat_activity a ON a.pid = l.pid \
             {join}\
             WHERE k.name = $1 \
             ORDER BY l.granted DESC, l.waitstart NULLS LAST, slot, l.pid",
            slot = self.slot_of_lock(),
            table = self.table,
            own = self.own_locks(),
        )
    }

    /// `$1` = prefix: the names of the held keys (any slot, any mode) that start with it,
    /// in byte order. `pg_locks` is read once; the names come from the key table by id.
    pub(crate) fn list(&self) -> String {
        format!(
            "SELECT k.name FROM {table} k \
             WHERE k.id IN (SELECT l.objid::int8 FROM pg_locks l WHERE l.granted AND {own}) \
             AND starts_with(k.name, $1) \
             ORDER BY k.name COLLATE \"C\"",
            table = self.table,
            own = self.own_locks(),
        )
    }

    /// After a stopped wait: drop whatever the session may have been granted (and the row
    /// of a candidate granted just before the stop, its observers notified).
    pub(crate) fn unlock_all(&self, lock: &Advisory) -> String {
        let all = format!("SELECT pg_advisory_unlock_all(), {NO_HOLD_TIMEOUTS}");
        if lock.owner.is_some() {
            return format!("{}; {all}", self.forget_owned(lock.id));
        }
        match lock.value {
            None => all.to_owned(),
            Some(_) => format!(
                "DELETE FROM {elect} WHERE ns = {ns} AND id = {id} AND pid = pg_backend_pid(); \
                 SELECT pg_notify('{channel}', '{id}'); {all}",
                elect = self.elect,
                ns = self.namespace,
                id = lock.id,
                channel = self.leader_channel(),
            ),
        }
    }
}

#[cfg(test)]
#[path = "sql_tests.rs"]
mod tests;
