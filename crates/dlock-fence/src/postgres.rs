//! Fenced updates on PostgreSQL (sqlx); the table and a worked example are in the
//! [crate docs](crate#sql-mysql-mariadb-postgresql).

crate::sql::fenced_update!("postgres", sqlx::Postgres, sqlx::PgConnection);
