//! The whole conformance suite again, against a private MariaDB server this test binary
//! starts with TLS (a CA made by the test, a user that requires TLS), every client
//! verifying it (`ssl-mode=verify_identity&ssl-ca=…`). See `common/tls.rs`.

mod common;

use common::MysqlHarness;

dlock_conformance::conformance!(mysql_tls, MysqlHarness::tls());
