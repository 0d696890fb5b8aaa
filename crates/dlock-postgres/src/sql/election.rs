//! The statements of elections: the election table's row of a leader (written by the
//! granting statement), reading the leader, proclaiming, and the table itself.

use super::{Sql, text_literal};

impl Sql {
    /// The election table's row of key `id`, for a value: `(ns, id)` its key, `pid` the
    /// holding session, `started` the server's start (a pid is unique only within one run
    /// of the server), `token` the leader's term, `value` what it publishes.
    fn upsert(&self, id: i32, value: &str, token: &str, from: &str) -> String {
        format!(
            "INSERT INTO {elect} (ns, id, pid, started, token, value) \
             SELECT {ns}, {id}, pg_backend_pid(), pg_postmaster_start_time(), {token}, {value} \
               {from} \
             ON CONFLICT (ns, id) DO UPDATE SET pid = EXCLUDED.pid, started = EXCLUDED.started, \
               token = EXCLUDED.token, value = EXCLUDED.value",
            elect = self.elect,
            ns = self.namespace,
            value = text_literal(value),
        )
    }

    /// After a candidate's wait was granted, in the same transaction: its row (the token
    /// `currval` of the fencing sequence, taken by this session's grant), and the
    /// notification of the key's observers, sent at commit. One row: the token.
    pub(super) fn publish(&self, id: i32, value: &str) -> String {
        format!(
            "WITH w AS ({upsert} RETURNING token) \
             SELECT w.token, pg_notify('{channel}', '{id}') FROM w",
            upsert = self.upsert(id, value, &format!("currval('{}')", self.fence_seq), ""),
            channel = self.leader_channel(),
        )
    }

    /// A candidate's try: the lock, the token, its row in the election table and the
    /// notification of the key's observers (sent at commit), all in one statement, so that
    /// nobody reads the key held with another holder's row. One row: the token (NULL: busy),
    /// the idle timeout, the notification.
    pub(super) fn try_campaign(&self, id: i32, value: &str, idle_ms: u64) -> String {
        let ns = self.namespace;
        let timeouts = super::hold_timeouts(idle_ms);
        format!(
            "WITH t AS (SELECT CASE WHEN pg_try_advisory_lock({ns}, {id}) \
               THEN nextval('{fence}') END AS token OFFSET 0), \
             w AS ({upsert}) \
             SELECT t.token, \
               CASE WHEN t.token IS NOT NULL THEN {timeouts} END, \
               CASE WHEN t.token IS NOT NULL THEN pg_notify('{channel}', '{id}') END \
             FROM t",
            fence = self.fence_seq,
            upsert = self.upsert(id, value, "t.token", "FROM t WHERE t.token IS NOT NULL"),
            channel = self.leader_channel(),
        )
    }

    /// The channel that wakes the observers of the elections of this namespace (payload:
    /// the key's id): a grant to a candidate, a proclaim, a release.
    pub(crate) fn leader_channel(&self) -> String {
        // As unsigned, so that the name has no '-'.
        format!("dlock_leaders_{}", self.namespace as u32)
    }

    /// The election table's lock of key id `id` held by the session of row `e` (its pid,
    /// in this run of the server): the key's own advisory lock, granted, exclusive. A row
    /// whose session does not hold it (the session ended, or gave the key back by hand) is
    /// not trusted, nor one written before the server last started (its pid may be another
    /// session's now).
    fn held_by(&self, id: &str) -> String {
        format!(
            "e.started = pg_postmaster_start_time() \
             AND EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' \
               AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
               AND l.classid = ({ns})::oid AND l.objid = ({id})::oid AND l.objsubid = 2 \
               AND l.mode = 'ExclusiveLock' AND l.granted AND l.pid = e.pid)",
            ns = self.namespace,
        )
    }

    /// `$1` = key: its leader's value and term, if a session holds the key with a row.
    pub(crate) fn leader(&self) -> String {
        format!(
            "SELECT e.value, e.token FROM {table} k \
             JOIN {elect} e ON e.ns = {ns} AND e.id = k.id \
             WHERE k.name = $1 AND {held}",
            table = self.table,
            elect = self.elect,
            ns = self.namespace,
            held = self.held_by("k.id"),
        )
    }

    /// `$1` = the new value of the leader of key `id` in term `token`, only while the
    /// session of its row holds the key (and the row is still that term's): one row per
    /// change (none: the leadership is gone), its observers notified at commit.
    pub(crate) fn proclaim(&self, id: i32, token: u64) -> String {
        format!(
            "WITH u AS (UPDATE {elect} e SET value = $1 \
               WHERE e.ns = {ns} AND e.id = {id} AND e.token = {token} AND {held} \
               RETURNING e.id) \
             SELECT pg_notify('{channel}', '{id}') FROM u",
            elect = self.elect,
            ns = self.namespace,
            held = self.held_by(&id.to_string()),
            channel = self.leader_channel(),
        )
    }

    /// Whether the election table exists, with every column (`started` came later).
    pub(crate) fn elect_exists(&self) -> String {
        format!(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = to_regclass('{}') \
               AND attname = 'started' AND NOT attisdropped)",
            self.elect
        )
    }

    /// Create the election table, serialised as [`create`](Self::create) is, or add the
    /// column an earlier version's lacks (its rows are then not trusted: `started` NULL).
    pub(crate) fn create_elect(&self) -> String {
        format!(
            "BEGIN; SELECT pg_advisory_xact_lock({ns}, 0); \
             CREATE TABLE IF NOT EXISTS {elect} (\
               ns integer NOT NULL, \
               id integer NOT NULL, \
               pid integer NOT NULL, \
               started timestamptz, \
               token bigint NOT NULL, \
               value text NOT NULL, \
               PRIMARY KEY (ns, id)); \
             ALTER TABLE {elect} ADD COLUMN IF NOT EXISTS started timestamptz; \
             COMMIT",
            ns = self.namespace,
            elect = self.elect,
        )
    }
}
