//! The whole conformance suite against a private ZooKeeper server with TLS (client
//! certificates required) and digest auth: every node the lock creates then has a
//! digest-only ACL. The server is started once for this test binary (see
//! `common/private.rs`); it needs `java`, Debian's `zookeeper` package and `openssl`, and
//! fails, never skips, without them.

#![cfg(feature = "tls")]

mod common;

use common::ZookeeperHarness;

// The module is `zookeeper_tls`, so the suite's names say which server failed
// (`zookeeper_tls::crash_release`); `tests/conformance.rs` runs it as `zookeeper` against
// the shared plain server.
dlock_conformance::conformance!(zookeeper_tls, ZookeeperHarness::tls());
