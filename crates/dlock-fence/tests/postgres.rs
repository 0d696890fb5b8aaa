//! Fenced updates on PostgreSQL, with tokens from dlock's PostgreSQL backend (strict fencing).

#![cfg(feature = "postgres")]

mod common;

use common::{Handover, unique_name, unreachable};
use dlock::Fencing;
use dlock_fence::FenceError;
use dlock_fence::postgres::update;
use dlock_fence::sql::FencedTable;
use sqlx::{Connection, PgConnection};

const SERVER: &str = "PostgreSQL";
const SETUP: &str = "postgres";

/// A table of its own with one row (id 1, fence 0), and a connection to it.
struct Fixture {
    url: String,
    conn: PgConnection,
    table: FencedTable,
}

impl Fixture {
    async fn new() -> Self {
        let url = common::url(
            "DLOCK_POSTGRES_URL",
            "postgres://dlock:dlock@127.0.0.1:5432/dlock",
        );
        // sqlx takes the same URL without dlock's options.
        let plain = url.split('?').next().unwrap_or_default();
        let mut conn = PgConnection::connect(plain)
            .await
            .unwrap_or_else(|e| unreachable(SERVER, SETUP, e));
        let name = unique_name();
        let create = format!(
            "CREATE TABLE {name} (id BIGINT PRIMARY KEY, status TEXT NOT NULL, \
             fence BIGINT NOT NULL DEFAULT 0)"
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
        update(&mut self.conn, &self.table, 1_i64, token, |set| {
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
    let handover = Handover::after_lost_lease(&store.url, SERVER, SETUP, &unique_name()).await;
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
    let answer = update(&mut store.conn, &store.table, 2_i64, 7, |_| {}).await;
    assert!(
        matches!(answer, Err(FenceError::Missing { token: 7 })),
        "{answer:?}"
    );
    store.drop_table().await;
}
