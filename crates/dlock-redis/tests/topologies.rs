//! What differs on Sentinel and on a Redis Cluster, beyond the conformance suite
//! (`tests/sentinel.rs`, `tests/cluster.rs`): credentials, keys whose companions need a slot
//! tag, renewals spread over many slots, the declared capabilities.

mod common;

use std::time::Duration;

use common::topology::{Kind, TopologyHarness};
use dlock_core::{DistributedLock, ErrorKind, FaultSafety, LockOptions};
use dlock_redis::server::Names;
use redis::AsyncCommands;
use redis::cluster_routing::Slot;

/// The URL under test with its password replaced.
fn with_password(harness: &TopologyHarness, password: &str) -> String {
    let config = harness.config();
    let user = config.username.as_deref().unwrap_or("dlock");
    let url = harness.url_with_option("prefix=dlock:");
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let rest = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    format!("{scheme}://{user}:{password}@{rest}")
}

async fn a_wrong_password_is_refused_without_showing_it(harness: TopologyHarness) {
    let url = with_password(&harness, "not-the-sekrit-pw");
    let err = dlock_redis::from_url(&url)
        .await
        .expect_err("a wrong password is refused");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("not-the-sekrit-pw"), "{text}");
    assert!(!text.contains("dlock-secret"), "{text}");
}

#[tokio::test]
async fn sentinel_refuses_a_wrong_password_without_showing_it() {
    a_wrong_password_is_refused_without_showing_it(TopologyHarness::sentinel()).await;
}

#[tokio::test]
async fn cluster_refuses_a_wrong_password_without_showing_it() {
    a_wrong_password_is_refused_without_showing_it(TopologyHarness::cluster()).await;
}

#[tokio::test]
async fn sentinel_refuses_an_unknown_master_name() {
    let harness = TopologyHarness::sentinel();
    let url = dlock_conformance::Harness::url(&harness);
    let (sentinels, _master) = url.rsplit_once('/').expect("a Sentinel URL has a path");
    let url = format!("{sentinels}/no-such-master");
    let err = dlock_redis::from_url(&url)
        .await
        .expect_err("no such master");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("no master"), "{err}");
    assert!(!format!("{err} {err:?}").contains("dlock-secret"), "{err}");
}

async fn failovers_are_declared_fenced(harness: TopologyHarness) {
    let lock = harness.lock().await;
    let caps = lock.capabilities();
    assert_eq!(caps.faults.member_down, FaultSafety::Fenced);
    assert_eq!(caps.faults.server_restart, FaultSafety::Fenced);
    assert!(caps.inspect.list);
}

#[tokio::test]
async fn sentinel_declares_failovers_fenced() {
    failovers_are_declared_fenced(TopologyHarness::sentinel()).await;
}

#[tokio::test]
async fn cluster_declares_failovers_fenced() {
    failovers_are_declared_fenced(TopologyHarness::cluster()).await;
}

/// A key whose plain companions (`{<lock key>}:fence`) would hash to another slot than the
/// lock key: taken, waited for, inspected, listed and released like any other, with every
/// name of the lock in one slot.
#[tokio::test]
async fn cluster_keys_with_a_closing_brace_work() {
    let harness = TopologyHarness::cluster();
    assert_eq!(harness.kind(), Kind::Cluster);
    let prefix = common::unique_key("braces");
    let key = format!("{prefix}/a}}b{{c}}");
    let names = Names::in_cluster(&harness.config().prefix, &key);
    let plain = Names::new(&harness.config().prefix, &key);
    assert_ne!(
        Slot::for_key(&plain.fence),
        Slot::for_key(&plain.key),
        "the test key must be one whose plain names span slots"
    );
    assert_eq!(Slot::for_key(&names.queue), Slot::for_key(&names.key));

    let holder = harness.lock().await;
    let waiter = harness.lock().await;
    let (lease, waiting) = common::take_with_a_waiter(&holder, waiter, &key).await;
    // The waiter queues in the key's own slot.
    let mut admin = harness.admin().await.expect("admin connection");
    common::until_queued(&mut admin, &names, 1).await;
    let status = holder.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(status.waiters.as_ref().map(Vec::len), Some(1), "{status:?}");
    assert_eq!(
        holder.list(&prefix).await.expect("list"),
        vec![key.clone()],
        "list"
    );
    let token = lease.fencing_token();
    let next = common::hand_over(lease, waiting).await;
    assert!(next.fencing_token() > token);
    next.release().await.expect("release");
    let _: i64 = admin.del(&names.fence).await.expect("DEL fence");
}

/// Renewal batches are split by slot: many keys over many slots, a ttl that needs several
/// renewals, and every lease still held at the end.
#[tokio::test]
async fn cluster_renews_keys_spread_over_many_slots() {
    let harness = TopologyHarness::cluster();
    let lock = harness.lock().await;
    let prefix = common::unique_key("spread");
    let opts = LockOptions::new().ttl(Duration::from_millis(900));
    let mut leases = Vec::new();
    let mut slots = std::collections::HashSet::new();
    for i in 0..200 {
        let key = format!("{prefix}/{i}");
        slots.insert(Slot::for_key(
            Names::in_cluster(&harness.config().prefix, &key).key,
        ));
        leases.push(
            lock.try_acquire(&key, &opts)
                .await
                .expect("try_acquire")
                .expect("free"),
        );
    }
    assert!(slots.len() > 100, "the keys span {} slots", slots.len());
    tokio::time::sleep(Duration::from_millis(3000)).await;
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    assert_eq!(lost, 0, "{lost} of 200 leases were lost");
    let other = harness.lock().await;
    for i in [0, 57, 199] {
        let key = format!("{prefix}/{i}");
        assert!(
            other
                .try_acquire(&key, &opts)
                .await
                .expect("try_acquire")
                .is_none(),
            "{key} is held"
        );
    }
    let mut admin = harness.admin().await.expect("admin connection");
    for lease in leases {
        let names = Names::in_cluster(&harness.config().prefix, lease.key());
        lease.release().await.expect("release");
        let _: i64 = admin.del(&names.fence).await.expect("DEL fence");
    }
}

/// A dead first sentinel or seed node: the client asks the next one.
async fn a_dead_first_host_is_skipped(harness: TopologyHarness) {
    let url = harness.url_with_first_host(dlock_conformance::dead_addr());
    locks_work_at(&harness, &url, "dead-first").await;
}

/// A client built from `url` takes a fresh key and gives it back.
async fn locks_work_at(harness: &TopologyHarness, url: &str, label: &str) {
    let lock = harness.lock_at(url).await;
    let opts = LockOptions::new().ttl(Duration::from_secs(5));
    common::backends::acquire_and_release(&lock, &common::unique_key(label), &opts, label).await;
}

#[tokio::test]
async fn sentinel_skips_a_dead_first_sentinel() {
    a_dead_first_host_is_skipped(TopologyHarness::sentinel()).await;
}

#[tokio::test]
async fn cluster_skips_a_dead_first_seed() {
    a_dead_first_host_is_skipped(TopologyHarness::cluster()).await;
}

/// A first sentinel or seed node that is black-holed (it takes the connection and never
/// answers, as a host cut off without a reset): the client connects through the others
/// within its connect timeout, and its locks work.
async fn a_black_holed_first_host_is_skipped(harness: TopologyHarness) {
    let first = match &harness.config().topology {
        dlock_redis::Topology::Sentinel(sentinel) => sentinel.sentinels[0].clone(),
        _ => dlock_core::raw::url::Host::new(harness.config().host.clone(), harness.config().port),
    };
    let mut proxies = Vec::new();
    let hole = common::topology::proxy(&first, &mut proxies).await;
    proxies[0].cut();
    let url = harness.url_with_first_host(hole);
    locks_work_at(&harness, &url, "black-holed-first").await;
}

#[tokio::test]
async fn sentinel_skips_a_black_holed_first_sentinel() {
    a_black_holed_first_host_is_skipped(TopologyHarness::sentinel()).await;
}

#[tokio::test]
async fn cluster_skips_a_black_holed_first_seed() {
    a_black_holed_first_host_is_skipped(TopologyHarness::cluster()).await;
}

/// `ACL SETUSER` (or `DELUSER`) `args` on every data node: a replica does not get it by
/// replication.
async fn on_every_data_node(harness: &TopologyHarness, args: &[&str]) {
    let nodes = harness.data_nodes().await.unwrap_or_else(|e| {
        panic!("the data nodes: {e}; start them with: scripts/backends up redis-sentinel")
    });
    for node in nodes {
        let config = dlock_redis::RedisConfig {
            topology: dlock_redis::Topology::Server,
            ..harness.config().at(node.name.clone(), node.port)
        };
        let mut conn = dlock_redis::server::Node::new(&config, "redis")
            .expect("the data node's settings")
            .raw_connection()
            .await
            .unwrap_or_else(|e| panic!("connect to the data node {node}: {e}"));
        let _: redis::Value = redis::cmd("ACL")
            .arg(args)
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("ACL {} on {node}: {e}", args[0]));
    }
}

/// A user with only the rights the lock needs (`+@read +@write +@scripting +@pubsub
/// +@connection +time -@dangerous`, so no `ROLE`, which is `@admin`): the client trusts
/// the sentinels' answer and works.
#[tokio::test]
async fn sentinel_works_for_a_user_without_role() {
    let harness = TopologyHarness::sentinel();
    let user = format!("dlock-least-{}", std::process::id());
    let password = "least-privilege-pw";
    on_every_data_node(
        &harness,
        &[
            "SETUSER",
            &user,
            "reset",
            "on",
            &format!(">{password}"),
            "~*",
            "&*",
            "+@read",
            "+@write",
            "+@scripting",
            "+@pubsub",
            "+@connection",
            "-@dangerous",
            // The scripts read the server clock; `TIME` is only `@fast`.
            "+time",
        ],
    )
    .await;
    let url = with_password(&harness, password);
    let (scheme, rest) = url.split_once("://").expect("a URL");
    let hosts = rest.rsplit_once('@').map_or(rest, |(_, hosts)| hosts);
    let url = format!("{scheme}://{user}:{password}@{hosts}");
    let outcome = async {
        let lock = dlock_redis::from_url(&url).await?;
        let key = common::unique_key("least-privilege");
        let opts = LockOptions::new().ttl(Duration::from_secs(5));
        let lease = lock
            .try_acquire(&key, &opts)
            .await?
            .expect("the key is free");
        lease.release().await
    }
    .await;
    on_every_data_node(&harness, &["DELUSER", &user]).await;
    outcome.unwrap_or_else(|e| panic!("a user without ROLE: {e}"));
}
