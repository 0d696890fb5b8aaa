//! Fenced updates on MySQL/MariaDB, with tokens from dlock's MySQL backend (strict fencing).

#![cfg(feature = "mysql")]

mod common;
#[macro_use]
mod sql_store;

sql_store_tests! {
    server: "MySQL/MariaDB",
    setup: "mysql",
    env: "DLOCK_MYSQL_URL",
    default_url: "mysql://dlock:dlock@127.0.0.1:3306/dlock",
    connection: sqlx::MySqlConnection,
    update: dlock_fence::mysql::update,
    // sqlx reads `mariadb://` as `mysql://`.
    plain_url: |url| url.split('?').next().unwrap_or_default().replacen("mariadb://", "mysql://", 1),
    status_type: "VARCHAR(32)",
}
