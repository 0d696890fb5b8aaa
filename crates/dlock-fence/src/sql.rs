//! Fenced `UPDATE`s on SQL tables: the table's identifiers, checked once, and the update
//! shared by the [MySQL](crate::mysql) and [PostgreSQL](crate::postgres) modules.

use crate::FenceError;

/// Longest identifier accepted: PostgreSQL's limit (MySQL's is 64).
const MAX_IDENTIFIER_LEN: usize = 63;

/// A table whose rows carry a fence column, named by plain identifiers.
///
/// The names are checked when the value is made: ASCII letters, digits and `_`, not
/// starting with a digit, at most 63 bytes; the table name may be qualified once
/// (`schema.table`). They are written into the SQL unquoted (values are always bound), so
/// nothing a caller passes can change the statement; a name that needs quoting (a reserved
/// word, mixed case on PostgreSQL) is the one thing this does not handle.
///
/// ```
/// use dlock_fence::sql::FencedTable;
///
/// let invoices = FencedTable::new("invoices", "id", "fence")?;
/// assert!(FencedTable::new("invoices; DROP TABLE x", "id", "fence").is_err());
/// # Ok::<(), dlock_fence::FenceError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencedTable {
    pub(crate) table: String,
    pub(crate) id_column: String,
    pub(crate) fence_column: String,
}

impl FencedTable {
    /// A table `table` whose rows are found by `id_column` and fenced by `fence_column` (a
    /// `BIGINT NOT NULL DEFAULT 0`).
    ///
    /// # Errors
    /// [`FenceError::InvalidInput`] naming the argument that is not a plain identifier.
    pub fn new(table: &str, id_column: &str, fence_column: &str) -> Result<Self, FenceError> {
        let mut segments = table.split('.');
        let qualified = segments.clone().count() == 2;
        if segments.clone().count() > 2 {
            return Err(invalid(
                "table name",
                table,
                "at most one `.` (schema.table)",
            ));
        }
        for segment in segments.by_ref() {
            check_identifier("table name", segment, qualified)?;
        }
        check_identifier("id column", id_column, false)?;
        check_identifier("fence column", fence_column, false)?;
        if id_column == fence_column {
            return Err(invalid(
                "fence column",
                fence_column,
                "is the id column; the fence needs a column of its own",
            ));
        }
        Ok(Self {
            table: table.to_owned(),
            id_column: id_column.to_owned(),
            fence_column: fence_column.to_owned(),
        })
    }

    /// The table name as given.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The fence as the `BIGINT` the column holds.
    #[allow(dead_code)] // unused when neither SQL feature is on
    pub(crate) fn column_value(token: u64) -> Result<i64, FenceError> {
        crate::error::check_token(token)?;
        i64::try_from(token).map_err(|_| FenceError::InvalidInput {
            what: "token",
            why: format!("{token} does not fit a signed BIGINT fence column"),
        })
    }
}

fn check_identifier(what: &'static str, name: &str, qualified: bool) -> Result<(), FenceError> {
    let part = if qualified { " (each part)" } else { "" };
    if name.is_empty() || name.len() > MAX_IDENTIFIER_LEN {
        return Err(invalid(what, name, &format!("must be 1 to 63 bytes{part}")));
    }
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_');
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(invalid(
            what,
            name,
            &format!("must be ASCII letters, digits and `_`, not starting with a digit{part}"),
        ));
    }
    Ok(())
}

fn invalid(what: &'static str, name: &str, why: &str) -> FenceError {
    FenceError::InvalidInput {
        what,
        why: format!("{name:?} {why}"),
    }
}

/// The fenced update and its refusal probe, written once for each sqlx database.
macro_rules! fenced_update {
    ($store:literal, $db:ty, $conn:ty) => {
        use sqlx::{Encode, QueryBuilder, Type};

        use crate::FenceError;
        use crate::sql::FencedTable;

        /// Run `UPDATE <table> SET <set…>, <fence> = :token WHERE <id> = :id AND <fence> <
        /// :token` on `conn`, with every value bound.
        ///
        /// `set` adds the caller's assignments to the builder, comma-separated, each a
        /// column name and a bound value (`set.push("total = ").push_bind(total)`); it may
        /// add none, to claim the row for `token` alone. Pass a transaction (`&mut *tx`) to
        /// make the write part of more work.
        ///
        /// One round trip when the write applies; a refused write costs one more (a
        /// `SELECT` of the stored fence, to tell a stale token from a missing row).
        ///
        /// # Errors
        /// - [`FenceError::StaleToken`]: the row's fence is already `>= token`; nothing
        ///   changed.
        /// - [`FenceError::Missing`]: no row has `id`; nothing changed.
        /// - [`FenceError::InvalidInput`]: `token` is 0 or above `i64::MAX`, before any I/O.
        /// - [`FenceError::Store`]: the database failed (including a syntax error from what
        ///   `set` added).
        pub async fn update<'a, I>(
            conn: &mut $conn,
            table: &FencedTable,
            id: I,
            token: u64,
            set: impl FnOnce(&mut QueryBuilder<'a, $db>),
        ) -> Result<(), FenceError>
        where
            I: 'a + Encode<'a, $db> + Type<$db> + Clone + Send,
        {
            let fence = FencedTable::column_value(token)?;
            let mut update = QueryBuilder::<$db>::new(format!("UPDATE {} SET ", table.table));
            let head = update.sql().len();
            set(&mut update);
            if update.sql().len() > head {
                update.push(", ");
            }
            update
                .push(format_args!("{} = ", table.fence_column))
                .push_bind(fence)
                .push(format_args!(" WHERE {} = ", table.id_column))
                .push_bind(id.clone())
                .push(format_args!(" AND {} < ", table.fence_column))
                .push_bind(fence);
            // The fence strictly grows, so an applied update always changes the row: MySQL's
            // affected-rows count (changed rows, not matched ones) is then exact too.
            let done = update
                .build()
                .execute(&mut *conn)
                .await
                .map_err(|e| FenceError::store($store, e))?;
            if done.rows_affected() > 0 {
                return Ok(());
            }
            // Only to explain the refusal: the update above already decided it atomically.
            let mut probe = QueryBuilder::<$db>::new(format!(
                "SELECT {} FROM {} WHERE {} = ",
                table.fence_column, table.table, table.id_column
            ));
            probe.push_bind(id);
            let stored: Option<Option<i64>> = probe
                .build_query_scalar()
                .fetch_optional(&mut *conn)
                .await
                .map_err(|e| FenceError::store($store, e))?;
            match stored {
                None => Err(FenceError::Missing { token }),
                Some(stored) => Err(FenceError::StaleToken {
                    token,
                    stored: stored.and_then(|s| u64::try_from(s).ok()).unwrap_or(0),
                }),
            }
        }
    };
}
#[allow(unused_imports)] // unused when neither SQL feature is on
pub(crate) use fenced_update;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_qualified_names_are_accepted() {
        for (table, id, fence) in [
            ("invoices", "id", "fence"),
            ("billing.invoices", "invoice_id", "fence_token"),
            ("_t1", "Id", "F"),
        ] {
            let t = FencedTable::new(table, id, fence).expect(table);
            assert_eq!(t.table(), table);
        }
    }

    #[test]
    fn names_that_could_change_the_statement_are_refused() {
        let long = "x".repeat(64);
        for (table, id, fence, what) in [
            ("t; DROP TABLE t", "id", "fence", "table name"),
            ("t", "id = id OR 1", "fence", "id column"),
            ("t", "id", "fence`", "fence column"),
            ("t", "id", "\"fence\"", "fence column"),
            ("a.b.c", "id", "fence", "table name"),
            ("a.", "id", "fence", "table name"),
            ("", "id", "fence", "table name"),
            ("1t", "id", "fence", "table name"),
            ("t", "id", long.as_str(), "fence column"),
            ("t", "é", "fence", "id column"),
            ("t", "id", "id", "fence column"),
        ] {
            match FencedTable::new(table, id, fence) {
                Err(FenceError::InvalidInput { what: got, .. }) => {
                    assert_eq!(got, what, "{table:?} {id:?} {fence:?}")
                }
                other => panic!("{table:?} {id:?} {fence:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn tokens_outside_a_signed_bigint_are_refused_before_io() {
        assert_eq!(FencedTable::column_value(1).unwrap(), 1);
        assert_eq!(
            FencedTable::column_value(i64::MAX as u64).unwrap(),
            i64::MAX
        );
        for token in [0, i64::MAX as u64 + 1, u64::MAX] {
            assert!(matches!(
                FencedTable::column_value(token),
                Err(FenceError::InvalidInput { what: "token", .. })
            ));
        }
    }
}
