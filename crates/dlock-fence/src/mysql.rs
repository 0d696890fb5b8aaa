//! Fenced updates on MySQL and MariaDB (sqlx); the table and a worked example are in the
//! [crate docs](crate#sql-mysql-mariadb-postgresql).

crate::sql::fenced_update!("mysql", sqlx::MySql, sqlx::MySqlConnection);
