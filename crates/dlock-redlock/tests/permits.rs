//! Permits with nodes cut off (proxies that black-hole traffic): a permit needs
//! `floor(M N / (N + 1)) + 1` of the M = 5 nodes, so with one node cut a 2-permit key
//! (4 needed) still works and never admits a third holder, and a 4-permit key (5 needed)
//! refuses with a clear error rather than risk a fifth.

mod common;

use std::time::Duration;

use common::{RedlockHarness, must_take, unique_key};
use dlock_conformance::{Harness, History, Hold, Proxy};
use dlock_core::{DistributedLock, ErrorKind, LockOptions, Wait};
use dlock_redlock::RedlockLock;
use futures::future::join_all;
use tokio::time::{Instant, sleep, timeout};

/// `n` clients that reach every node through one proxy per node.
async fn proxied(harness: &RedlockHarness, n: usize) -> (Vec<RedlockLock>, Vec<Proxy>) {
    let mut proxies = Vec::new();
    for addr in harness.server_addrs() {
        proxies.push(Proxy::start(addr).await.expect("proxy"));
    }
    let url = harness.url_with_addrs(&proxies.iter().map(Proxy::addr).collect::<Vec<_>>());
    let mut clients = Vec::new();
    for _ in 0..n {
        clients.push(harness.lock_at(&url).await);
    }
    (clients, proxies)
}

fn permits(n: u32) -> LockOptions {
    LockOptions::new().permits(n).ttl(Duration::from_secs(1))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_permits_work_with_one_node_cut_and_never_admit_a_third() {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 4;
    let harness = RedlockHarness::from_env();
    let (clients, proxies) = proxied(&harness, CLIENTS).await;
    let key = unique_key("permits-cut-2");
    proxies[2].cut();
    // Two holders over four nodes keep their permits across several ttls (each extension
    // reaches 4 of 5), and a third is refused all along.
    let held = [
        must_take(&clients[0], &key, &permits(2)).await,
        must_take(&clients[1], &key, &permits(2)).await,
    ];
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        assert!(
            held.iter().all(|l| !l.is_lost()),
            "a permit lost with 4 of 5 nodes up"
        );
        let third = clients[2].try_acquire(&key, &permits(2)).await;
        assert!(
            matches!(third, Ok(None)),
            "a third holder of two permits: {third:?}"
        );
        sleep(Duration::from_millis(200)).await;
    }
    for lease in held {
        lease.release().await.expect("release through 4 nodes");
    }
    // Contending clients all get their turns, and never more than two at once.
    let history = History::new();
    let ordered = clients[0].capabilities().fencing.is_ordered();
    let tasks = clients.iter().enumerate().map(|(c, client)| {
        let (key, history) = (key.clone(), history.clone());
        async move {
            for _ in 0..ROUNDS {
                let wait = permits(2).wait(Wait::For(Duration::from_secs(60)));
                let lease = client
                    .acquire(&key, &wait)
                    .await
                    .expect("acquire, one node cut");
                let start = Instant::now();
                // A fixed pause, not a poll: it gives holders time to overlap.
                sleep(Duration::from_millis(30)).await;
                history.record(Hold {
                    client: c,
                    key: key.clone(),
                    token: lease.fencing_token(),
                    mode: lease.mode(),
                    start,
                    end: Instant::now(),
                    lost_at: None,
                });
                lease.release().await.expect("release");
            }
        }
    });
    join_all(tasks).await;
    let violations = history.check(ordered);
    assert!(violations.is_empty(), "{violations:?}");
    assert_eq!(history.holds().len(), CLIENTS * ROUNDS);
    for proxy in &proxies {
        proxy.heal();
    }
    harness.forget_fence(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_permits_need_every_node_and_refuse_clearly_with_one_cut() {
    let harness = RedlockHarness::from_env();
    let (clients, proxies) = proxied(&harness, 2).await;
    let key = unique_key("permits-cut-4");
    // Taken with every node up; once a node is cut, its extensions reach 4 of the 5 it
    // needs and lost() fires.
    let lease = must_take(&clients[0], &key, &permits(4)).await;
    proxies[4].cut();
    timeout(Duration::from_secs(5), lease.lost_signal().lost())
        .await
        .expect("a 4-permit lease is lost with a node cut");
    drop(lease);
    for ask in [
        clients[1].try_acquire(&key, &permits(4)).await,
        clients[1]
            .acquire(&key, &permits(4).wait(Wait::For(Duration::from_secs(2))))
            .await
            .map(Some),
    ] {
        let err = ask.expect_err("a 4-permit acquire with one of five nodes cut");
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
        assert!(err.to_string().contains("5 needed"), "{err}");
    }
    // A majority still serves one permit (once the lost lease's entries are gone): the cut
    // costs only wide limits.
    let one = clients[1]
        .acquire(&key, &permits(1).wait(Wait::For(Duration::from_secs(10))))
        .await
        .expect("one permit with a majority up");
    one.release().await.expect("release");
    for proxy in &proxies {
        proxy.heal();
    }
    // Nothing was left on the nodes: all four permits are free again.
    let mut again = Vec::new();
    for _ in 0..4 {
        let wait = permits(4).wait(Wait::For(Duration::from_secs(10)));
        again.push(
            clients[1]
                .acquire(&key, &wait)
                .await
                .expect("acquire, healed"),
        );
    }
    for lease in again {
        lease.release().await.expect("release");
    }
    harness.forget_fence(&key).await;
}
