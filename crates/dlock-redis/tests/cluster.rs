//! The whole conformance suite against a Redis Cluster (`DLOCK_REDIS_CLUSTER_URL`,
//! default: `scripts/backends up redis-cluster`).

mod common;

use common::topology::TopologyHarness;

dlock_conformance::conformance!(redis_cluster, TopologyHarness::cluster());
