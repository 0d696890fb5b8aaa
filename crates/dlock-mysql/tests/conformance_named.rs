//! The whole conformance suite against the MySQL / MariaDB server `DLOCK_MYSQL_URL` names,
//! in named-lock mode (`mode=named`).

mod common;

use common::MysqlHarness;

dlock_conformance::conformance!(mysql_named, MysqlHarness::named());
