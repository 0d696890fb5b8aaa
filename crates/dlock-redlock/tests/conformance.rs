//! The whole conformance suite against the five Redlock nodes.

mod common;

use common::RedlockHarness;

dlock_conformance::conformance!(redlock, RedlockHarness::from_env());
