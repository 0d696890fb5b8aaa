//! Fenced updates on PostgreSQL, with tokens from dlock's PostgreSQL backend (strict fencing).

#![cfg(feature = "postgres")]

mod common;
#[macro_use]
mod sql_store;

sql_store_tests! {
    server: "PostgreSQL",
    setup: "postgres",
    env: "DLOCK_POSTGRES_URL",
    default_url: "postgres://dlock:dlock@127.0.0.1:5432/dlock",
    connection: sqlx::PgConnection,
    update: dlock_fence::postgres::update,
    plain_url: |url| url.split('?').next().unwrap_or_default().to_owned(),
    status_type: "TEXT",
}
