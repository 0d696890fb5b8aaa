//! Fenced updates on MySQL and MariaDB (sqlx): see the [crate docs](crate#sql-mysql-mariadb-postgresql)
//! for the table and a worked example.

crate::sql::fenced_update!("mysql", sqlx::MySql, sqlx::MySqlConnection);
