//! The whole conformance suite against a private ZooKeeper server with SASL `DIGEST-MD5`
//! (`auth=sasl`, over its plain port): every node the lock creates then has a
//! `sasl:{user}`-only ACL. The server is started once for this test binary (see
//! `common/private.rs`); it needs `java`, Debian's `zookeeper` package and `openssl`, and
//! fails, never skips, without them.

#![cfg(all(feature = "tls", feature = "sasl"))]

mod common;

use common::ZookeeperHarness;

// The module is `zookeeper_sasl`, so the suite's names say which server failed
// (`zookeeper_sasl::crash_release`).
dlock_conformance::conformance!(zookeeper_sasl, ZookeeperHarness::sasl());
