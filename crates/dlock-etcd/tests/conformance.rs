//! The whole conformance suite against the single etcd member (`DLOCK_ETCD_URL`).

mod common;

use common::EtcdHarness;

dlock_conformance::conformance!(etcd, EtcdHarness::from_env());
