//! The whole conformance suite against the PostgreSQL server `DLOCK_POSTGRES_URL` names.

mod common;

use common::PostgresHarness;

dlock_conformance::conformance!(postgres, PostgresHarness::from_env());
