//! The fenced-update tests every SQL store runs (MySQL/MariaDB and PostgreSQL differ only in
//! their connection type, URL and text column type), written once.

/// The SQL store tests, for one store.
macro_rules! sql_store_tests {
    (
        server: $server:expr,
        setup: $setup:expr,
        env: $env:expr,
        default_url: $default_url:expr,
        connection: $conn:ty,
        update: $update:path,
        plain_url: $plain_url:expr,
        status_type: $status_type:expr $(,)?
    ) => {
        use common::{Handover, unique_name, unreachable};
        use dlock::Fencing;
        use dlock_fence::FenceError;
        use dlock_fence::sql::FencedTable;

        /// A table of its own with one row (id 1, fence 0), and a connection to it.
        struct Fixture {
            url: String,
            conn: $conn,
            table: FencedTable,
        }

        impl Fixture {
            async fn new() -> Self {
                let url = common::url($env, $default_url);
                // sqlx takes the same URL without dlock's options.
                let plain: fn(&str) -> String = $plain_url;
                let mut conn = <$conn as sqlx::Connection>::connect(&plain(&url))
                    .await
                    .unwrap_or_else(|e| unreachable($server, $setup, e));
                let name = unique_name();
                let create = format!(
                    "CREATE TABLE {name} (id BIGINT PRIMARY KEY, status {} NOT NULL, \
                     fence BIGINT NOT NULL DEFAULT 0)",
                    $status_type
                );
                sqlx::query(&create)
                    .execute(&mut conn)
                    .await
                    .expect("create the table");
                let insert = format!("INSERT INTO {name} (id, status) VALUES (1, 'new')");
                sqlx::query(&insert)
                    .execute(&mut conn)
                    .await
                    .expect("insert the row");
                let table = FencedTable::new(&name, "id", "fence").expect("a plain name");
                Self { url, conn, table }
            }

            async fn write(&mut self, status: &'static str, token: u64) -> Result<(), FenceError> {
                $update(&mut self.conn, &self.table, 1_i64, token, |set| {
                    set.push("status = ").push_bind(status);
                })
                .await
            }

            async fn row(&mut self) -> (String, i64) {
                let select = format!(
                    "SELECT status, fence FROM {} WHERE id = 1",
                    self.table.table()
                );
                sqlx::query_as(&select)
                    .fetch_one(&mut self.conn)
                    .await
                    .expect("read the row")
            }

            async fn drop_table(mut self) {
                let drop = format!("DROP TABLE {}", self.table.table());
                sqlx::query(&drop)
                    .execute(&mut self.conn)
                    .await
                    .expect("drop the table");
            }
        }

        #[tokio::test]
        async fn the_late_write_of_a_holder_that_lost_its_lease_is_refused() {
            let mut store = Fixture::new().await;
            let handover = Handover::after_lost_lease(&store.url, $server, $setup, &unique_name()).await;
            assert_eq!(handover.capabilities.fencing, Fencing::Strict);
            let (stale, newer) = (
                handover.stale.fencing_token(),
                handover.newer.fencing_token(),
            );
            assert!(stale < newer, "stale {stale}, newer {newer}");

            store
                .write("newer", newer)
                .await
                .expect("the newer holder writes");
            let late = store.write("stale", stale).await;

            assert!(
                matches!(late, Err(FenceError::StaleToken { token, stored }) if token == stale && stored == newer),
                "{late:?}"
            );
            assert_eq!(store.row().await, ("newer".to_owned(), newer as i64));
            handover.finish().await;
            store.drop_table().await;
        }

        #[tokio::test]
        async fn an_equal_token_is_refused_only_a_larger_one_writes() {
            let mut store = Fixture::new().await;
            store.write("first", 5).await.expect("first write");

            let equal = store.write("again", 5).await;
            let smaller = store.write("older", 4).await;
            store
                .write("larger", 10)
                .await
                .expect("a larger token writes");

            assert!(
                matches!(
                    equal,
                    Err(FenceError::StaleToken {
                        token: 5,
                        stored: 5
                    })
                ),
                "{equal:?}"
            );
            assert!(
                matches!(
                    smaller,
                    Err(FenceError::StaleToken {
                        token: 4,
                        stored: 5
                    })
                ),
                "{smaller:?}"
            );
            assert_eq!(store.row().await, ("larger".to_owned(), 10));
            store.drop_table().await;
        }

        #[tokio::test]
        async fn a_missing_row_is_missing_not_stale() {
            let mut store = Fixture::new().await;
            let answer = $update(&mut store.conn, &store.table, 2_i64, 7, |_| {}).await;
            assert!(
                matches!(answer, Err(FenceError::Missing { token: 7 })),
                "{answer:?}"
            );
            store.drop_table().await;
        }
    };
}
