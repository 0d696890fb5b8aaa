//! The whole conformance suite against the MySQL / MariaDB server `DLOCK_MYSQL_URL` names.

mod common;

use common::MysqlHarness;

dlock_conformance::conformance!(mysql, MysqlHarness::from_env());
