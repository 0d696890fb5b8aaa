//! Fenced puts on etcd, with tokens from dlock's etcd backend (strict fencing).

#![cfg(feature = "etcd")]

mod common;

use common::{Handover, unique_name, unreachable};
use dlock::Fencing;
use dlock_fence::{FenceError, etcd as fenced};
use etcd_client::{Client, DeleteOptions};

async fn connect() -> (String, Client) {
    let url = common::url("DLOCK_ETCD_URL", "etcd://127.0.0.1:2379");
    // etcd://host:port[,host:port…][/…][?…] → the client's endpoints.
    let hosts = url.split_once("://").map_or(url.as_str(), |(_, rest)| rest);
    let hosts = hosts.split(['/', '?']).next().unwrap_or_default();
    let endpoints: Vec<String> = hosts.split(',').map(|h| format!("http://{h}")).collect();
    let client = Client::connect(endpoints, None)
        .await
        .unwrap_or_else(|e| unreachable("etcd", "etcd", e));
    (url, client)
}

/// Delete the data key and its fence key.
async fn delete(client: &mut Client, key: &str) {
    client
        .delete(key, Some(DeleteOptions::new().with_prefix()))
        .await
        .expect("delete");
}

#[tokio::test]
async fn the_late_write_of_a_holder_that_lost_its_lease_is_refused() {
    let (url, mut client) = connect().await;
    let (lock_key, data) = (unique_name(), unique_name());
    let handover = Handover::after_lost_lease(&url, "etcd", "etcd", &lock_key).await;
    assert_eq!(handover.capabilities.fencing, Fencing::Strict);
    let (stale, newer) = (
        handover.stale.fencing_token(),
        handover.newer.fencing_token(),
    );
    assert!(stale < newer, "stale {stale}, newer {newer}");

    fenced::put(&mut client, data.as_str(), "newer", newer)
        .await
        .expect("the newer holder writes");
    let late = fenced::put(&mut client, data.as_str(), "stale", stale).await;

    assert!(
        matches!(late, Err(FenceError::StaleToken { token, stored }) if token == stale && stored == newer),
        "{late:?}"
    );
    let kept = fenced::get(&mut client, data.as_str())
        .await
        .expect("read back");
    assert_eq!(kept, Some((b"newer".to_vec(), newer)));
    delete(&mut client, &data).await;
    handover.finish().await;
}

#[tokio::test]
async fn an_equal_token_is_refused_only_a_larger_one_writes() {
    let (_, mut client) = connect().await;
    let data = unique_name();
    fenced::put(&mut client, data.as_str(), "first", 5)
        .await
        .expect("first write");

    let equal = fenced::put(&mut client, data.as_str(), "again", 5).await;
    let smaller = fenced::put(&mut client, data.as_str(), "older", 4).await;
    fenced::put(&mut client, data.as_str(), "larger", 10)
        .await
        .expect("a larger token writes");

    assert!(
        matches!(
            equal,
            Err(FenceError::StaleToken {
                token: 5,
                stored: 5
            })
        ),
        "{equal:?}"
    );
    assert!(
        matches!(
            smaller,
            Err(FenceError::StaleToken {
                token: 4,
                stored: 5
            })
        ),
        "{smaller:?}"
    );
    let kept = fenced::get(&mut client, data.as_str())
        .await
        .expect("read back");
    assert_eq!(kept, Some((b"larger".to_vec(), 10)));
    delete(&mut client, &data).await;
}
