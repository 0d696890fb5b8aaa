//! The whole conformance suite against the real Redis server.

mod common;

use common::RedisHarness;

dlock_conformance::conformance!(redis, RedisHarness::from_env());
