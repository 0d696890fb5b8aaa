//! The whole conformance suite against the standalone ZooKeeper server.

mod common;

use common::ZookeeperHarness;

dlock_conformance::conformance!(zookeeper, ZookeeperHarness::from_env());
