//! The whole conformance suite against a master found through Sentinel
//! (`DLOCK_REDIS_SENTINEL_URL`, default: `scripts/backends up redis-sentinel`).

mod common;

use common::topology::TopologyHarness;

dlock_conformance::conformance!(redis_sentinel, TopologyHarness::sentinel());
