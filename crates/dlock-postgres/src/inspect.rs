//! Inspecting: who holds a key and who waits for it, read from `pg_locks` and
//! `pg_stat_activity` in one statement on a side connection, and the held keys under a
//! prefix (`pg_locks` joined with the key table). Nothing is taken, queued or written.

use std::time::{Duration, SystemTime};

use dlock_core::{HolderStatus, KeyStatus, Mode, Result, WaiterStatus};
use sqlx::Row;
use sqlx::postgres::PgRow;

use crate::backend::Inner;
use crate::error::Error;

/// One row of [`Sql::inspect`](crate::sql::Sql::inspect): one session's hold of, or wait
/// for, one of the key's advisory locks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockRow {
    /// 0 for the key's own lock, `s` for permit slot `s`.
    pub(crate) slot: i64,
    /// Held or asked for in share mode (`ShareLock`), else exclusive.
    pub(crate) shared: bool,
    pub(crate) granted: bool,
    /// The session's backend pid; `None` for a prepared transaction.
    pub(crate) pid: Option<i32>,
    /// When the wait began (`pg_locks.waitstart`), microseconds since 1970.
    pub(crate) wait_start_us: Option<i64>,
    /// The session's `application_name`.
    pub(crate) application: Option<String>,
    /// The session's client address, where the reader may see it.
    pub(crate) addr: Option<String>,
    /// A leader's value and term (its row in the election table), on its hold's row.
    pub(crate) leader: Option<(String, i64)>,
    /// A reentrant hold's owner, count and token (its row in the owner table), on its
    /// hold's row.
    pub(crate) owner: Option<(String, i32, i64)>,
}

impl LockRow {
    fn read(row: &PgRow) -> Result<Self, sqlx::Error> {
        Ok(Self {
            slot: row.try_get(0)?,
            shared: row.try_get(1)?,
            granted: row.try_get(2)?,
            pid: row.try_get(3)?,
            wait_start_us: row.try_get(4)?,
            application: row.try_get(5)?,
            addr: row.try_get(6)?,
            leader: match has(row, "leader_value") {
                true => row
                    .try_get::<Option<String>, _>("leader_value")?
                    .zip(row.try_get::<Option<i64>, _>("leader_term")?),
                false => None,
            },
            owner: match has(row, "owner_id") {
                true => {
                    let id = row.try_get::<Option<String>, _>("owner_id")?;
                    let holds = row.try_get::<Option<i32>, _>("owner_holds")?;
                    let token = row.try_get::<Option<i64>, _>("owner_token")?;
                    id.zip(holds).zip(token).map(|((i, h), t)| (i, h, t))
                }
                false => None,
            },
        })
    }

    /// Who the session is: its application name (dlock's sessions carry their holder's
    /// `NAME@HOST:PID`), else its backend pid and, where visible, its address.
    fn who(&self) -> String {
        if let Some(name) = self.application.as_ref().filter(|n| !n.is_empty()) {
            return name.clone();
        }
        match (self.pid, &self.addr) {
            (Some(pid), Some(addr)) => format!("backend {pid} from {addr}"),
            (Some(pid), None) => format!("backend {pid}"),
            (None, _) => "a prepared transaction".to_owned(),
        }
    }

    /// The mode of the hold or request, on a key that is (`semaphore`) or may be a mutex.
    fn mode(&self, semaphore: bool) -> Mode {
        match (self.slot, self.shared) {
            (_, true) => Mode::Shared,
            (0, false) if !semaphore => Mode::Exclusive,
            // Slot locks do not store the key's limit.
            _ => Mode::Permits(0),
        }
    }
}

/// Whether `row` has a column named `name`.
fn has(row: &PgRow, name: &str) -> bool {
    use sqlx::Column;
    row.columns().iter().any(|c| c.name() == name)
}

/// The status of `key` from its lock rows (holders first, then waiters in line).
///
/// A key is known to be a semaphore when one of its slots other than 0 shows: its slot-0
/// holds are permits then, and its waiters, who wait in their clients, are not visible
/// (`waiters: None`). A semaphore with only slot 0 taken looks like a mutex (slot 0 is the
/// key's own lock).
pub(crate) fn status(key: &str, rows: &[LockRow]) -> KeyStatus {
    let semaphore = rows.iter().any(|r| r.slot != 0);
    let mut status = KeyStatus::new(key, !semaphore);
    for row in rows {
        if row.granted {
            let mut holder = HolderStatus::new(row.mode(semaphore));
            holder.who = Some(row.who());
            // A leader shows its value, and its term as the token.
            if let Some((value, term)) = &row.leader {
                holder.who = Some(value.clone());
                holder.fencing_token = u64::try_from(*term).ok();
            }
            // A reentrant hold shows its owner and count, and its token.
            if let Some((owner, holds, token)) = &row.owner {
                holder.who = Some(format!("{owner} (held {holds} times) in {}", row.who()));
                holder.fencing_token = u64::try_from(*token).ok();
            }
            status.holders.push(holder);
        } else if let Some(waiters) = &mut status.waiters {
            let mut waiter = WaiterStatus::new();
            waiter.mode = Some(row.mode(semaphore));
            waiter.since = row.wait_start_us.and_then(since_epoch);
            waiter.who = Some(row.who());
            waiters.push(waiter);
        }
    }
    status
}

/// The instant `us` microseconds after 1970 (before it, for a negative number).
fn since_epoch(us: i64) -> Option<SystemTime> {
    let offset = Duration::from_micros(us.unsigned_abs());
    match us >= 0 {
        true => SystemTime::UNIX_EPOCH.checked_add(offset),
        false => SystemTime::UNIX_EPOCH.checked_sub(offset),
    }
}

impl Inner {
    /// Who holds `key` and who waits: one statement on a side connection.
    pub(crate) async fn inspect(&self, key: &str) -> Result<KeyStatus> {
        let elections = self.elections.load(std::sync::atomic::Ordering::Relaxed);
        let owners = self.reentry.load(std::sync::atomic::Ordering::Relaxed);
        let sql = self.sql.inspect(elections, owners);
        let rows = self.side("inspect", &sql, Some(key)).await?;
        let rows = rows
            .iter()
            .map(LockRow::read)
            .collect::<Result<Vec<_>, _>>()
            .map_err(Error::sql("inspect"))?;
        Ok(status(key, &rows))
    }

    /// The held keys starting with `prefix`, in byte order: one statement on a side
    /// connection.
    pub(crate) async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        let rows = self.side("list", &self.sql.list(), Some(prefix)).await?;
        let names = rows
            .iter()
            .map(|row| row.try_get(0))
            .collect::<Result<_, _>>()
            .map_err(Error::sql("list"))?;
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(slot: i64, shared: bool, granted: bool) -> LockRow {
        LockRow {
            slot,
            shared,
            granted,
            pid: Some(40 + slot as i32),
            wait_start_us: (!granted).then_some(1_700_000_000_000_000),
            application: Some(format!("app{slot}@host:1")),
            addr: None,
            leader: None,
            owner: None,
        }
    }

    #[test]
    fn a_reentrant_hold_shows_its_owner_count_and_token() {
        let mut r = row(0, false, true);
        r.owner = Some(("job-7".to_owned(), 3, 42));
        let status = status("k", &[r]);
        assert_eq!(
            status.holders[0].who.as_deref(),
            Some("job-7 (held 3 times) in app0@host:1")
        );
        assert_eq!(status.holders[0].fencing_token, Some(42));
    }

    #[test]
    fn a_mutex_shows_its_holder_and_queue_in_order() {
        let status = status(
            "k",
            &[
                row(0, false, true),
                row(0, false, false),
                row(0, true, false),
            ],
        );
        assert_eq!(status.holders.len(), 1);
        assert_eq!(status.holders[0].mode, Mode::Exclusive);
        assert_eq!(status.holders[0].who.as_deref(), Some("app0@host:1"));
        assert_eq!(status.holders[0].fencing_token, None);
        let waiters = status.waiters.expect("a mutex's waiters show");
        let modes: Vec<_> = waiters.iter().map(|w| w.mode).collect();
        assert_eq!(modes, [Some(Mode::Exclusive), Some(Mode::Shared)]);
        assert_eq!(
            waiters[0].since,
            Some(SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
    }

    #[test]
    fn a_free_key_has_an_empty_queue() {
        let status = status("k", &[]);
        assert!(!status.is_held());
        assert_eq!(status.waiters, Some(Vec::new()));
    }

    #[test]
    fn slots_are_permits_and_hide_the_waiters() {
        let status = status("k", &[row(0, false, true), row(2, false, true)]);
        let modes: Vec<_> = status.holders.iter().map(|h| h.mode).collect();
        assert_eq!(modes, [Mode::Permits(0), Mode::Permits(0)]);
        assert_eq!(status.waiters, None);
    }

    #[test]
    fn shared_holders_each_show() {
        let status = status("k", &[row(0, true, true), row(0, true, true)]);
        assert_eq!(status.holders.len(), 2);
        assert!(status.holders.iter().all(|h| h.mode == Mode::Shared));
    }

    #[test]
    fn a_session_without_a_name_is_its_pid_and_address() {
        let mut r = row(0, false, true);
        r.application = Some(String::new());
        assert_eq!(r.who(), "backend 40");
        r.addr = Some("10.0.0.5".to_owned());
        assert_eq!(r.who(), "backend 40 from 10.0.0.5");
        r.pid = None;
        assert_eq!(r.who(), "a prepared transaction");
    }
}
