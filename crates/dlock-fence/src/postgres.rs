//! Fenced updates on PostgreSQL (sqlx): see the [crate docs](crate#sql-mysql-mariadb-postgresql)
//! for the table and a worked example.

crate::sql::fenced_update!("postgres", sqlx::Postgres, sqlx::PgConnection);
