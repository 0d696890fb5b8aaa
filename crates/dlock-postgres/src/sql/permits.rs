//! The statements of permits: taking the lowest free slot of a key, and giving one back
//! with a notification to the key's waiters.

use super::{NO_HOLD_TIMEOUTS, Sql, hold_timeouts, slot_class};

impl Sql {
    /// Take one permit of key `id` with limit `limit` without waiting: one statement that
    /// tries the slot locks `(namespace + s, id)` for s = 0, 1, …, `limit - 1` in order,
    /// skipping the slots in `held` (this session's own: the server would grant those again,
    /// re-entrantly), and stops at the first it gets. A recursive query tries the next slot
    /// only when the previous try failed, so it never takes two. When it gets one, the token
    /// and the idle timeout as in [`try_take`](Self::try_take). One row: the token (NULL:
    /// every slot is busy), the idle timeout, the slot taken.
    pub(crate) fn try_permit(&self, id: i32, limit: u32, held: &[i32], idle_ms: u64) -> String {
        let ns = self.namespace;
        let skip = if held.is_empty() {
            "false".to_owned()
        } else {
            let list: Vec<String> = held.iter().map(i32::to_string).collect();
            format!("s.n + 1 IN ({})", list.join(", "))
        };
        // The slot's class `namespace + s`, wrapped into int4 as `slot_class` does.
        let class =
            format!("(((({ns})::bigint + s.n + 1 + 2147483648) % 4294967296) - 2147483648)::int4");
        let timeouts = hold_timeouts(idle_ms);
        format!(
            "SELECT p.token, CASE WHEN p.token IS NOT NULL THEN {timeouts} END, p.slot \
             FROM (SELECT q.slot, CASE WHEN q.slot IS NOT NULL \
               THEN nextval('{fence}') END AS token \
             FROM (SELECT (WITH RECURSIVE s(n, got) AS ( \
                 SELECT -1, false \
                 UNION ALL \
                 SELECT s.n + 1, CASE WHEN {skip} THEN false \
                   ELSE pg_try_advisory_lock({class}, {id}) END \
                 FROM s WHERE NOT s.got AND s.n + 1 < {limit}) \
               SELECT n FROM s WHERE got) AS slot OFFSET 0) q OFFSET 0) p",
            fence = self.fence_seq,
        )
    }

    /// The channel a permit release notifies (payload: the key's id), one per namespace.
    pub(crate) fn permit_channel(&self) -> String {
        // As unsigned, so that the name has no '-'.
        format!("dlock_permits_{}", self.namespace as u32)
    }

    /// Give back slot `slot` of key `id` and tell the waiters of the key (`pg_notify`, sent
    /// when the statement commits, after the unlock); with `last`, the session back to its
    /// defaults. One row: whether the slot was held.
    pub(crate) fn unlock_permit(&self, id: i32, slot: i32, last: bool) -> String {
        let reset = if last {
            format!(", {NO_HOLD_TIMEOUTS}")
        } else {
            String::new()
        };
        format!(
            "SELECT pg_advisory_unlock({}, {id}), pg_notify('{}', '{id}'){reset}",
            slot_class(self.namespace, slot),
            self.permit_channel(),
        )
    }
}
