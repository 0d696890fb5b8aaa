//! Permits with nodes cut off (proxies that black-hole traffic): a permit needs
//! `floor(M N / (N + 1)) + 1` of the M = 5 nodes, so with one node cut a 2-permit key
//! (4 needed) still works and never admits a third holder, and a 4-permit key (5 needed)
//! refuses with a clear error rather than risk a fifth. On one node, the script a waiting
//! round that won too few nodes gives a permit back with keeps the giver's place in the
//! queue, and calls exactly the waiters whose turn the permit (or a dead entry dropped)
//! makes.

mod common;

use std::time::Duration;

use common::{RedlockHarness, must_take, unique_key};
use dlock_conformance::{Harness, History, Hold, Proxy};
use dlock_core::{DistributedLock, ErrorKind, LockOptions, Wait};
use dlock_redis::server::{Names, Node, View, Waiter, Wake, new_permit_token};
use dlock_redlock::RedlockLock;
use futures::future::join_all;
use redis::AsyncCommands;
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

/// On node 0, a permit of `limit`: one held by a long entry, another by a giver that
/// gives it back rejoining the queue with `giver_ticket`, beside waiters queued with the
/// `others` tickets (dead: their entries expired) and one with ticket 200 that listens for
/// calls. How the listener's wait for a call ended (900 ms at most, before its first
/// refresh).
async fn given_back_on_one_node(
    limit: u32,
    giver_ticket: u64,
    others: &[(u64, bool)],
) -> (RedlockHarness, Names, Wake) {
    let harness = RedlockHarness::from_env();
    let key = unique_key("permits-give-back");
    let names = Names::new(harness.prefix(), &key);
    let node = Node::new(&harness.config().nodes[0], "redlock").expect("node");
    let (held, giver, waiter) = (
        new_permit_token(limit),
        new_permit_token(limit),
        new_permit_token(limit),
    );
    let (now, far) = (now_micros(), now_micros() + 60_000_000);
    let mut admin = harness.admin(0).await.expect("admin connection");
    let _: () = admin.zadd(&names.key, &held, far).await.expect("ZADD");
    let _: () = admin.zadd(&names.key, &giver, far).await.expect("ZADD");
    let mut queued = vec![(waiter.clone(), 200, true)];
    queued.extend(
        others
            .iter()
            .map(|&(t, alive)| (new_permit_token(limit), t, alive)),
    );
    for (token, ticket, alive) in &queued {
        let expires = if *alive { far } else { now - 1_000_000 };
        let _: () = admin.zadd(&names.queue, token, ticket).await.expect("ZADD");
        let _: () = admin
            .zadd(&names.waiters, token, expires)
            .await
            .expect("ZADD");
    }
    for side in [&names.key, &names.queue, &names.waiters] {
        let _: () = admin.pexpire(side, 60_000).await.expect("PEXPIRE");
    }
    let mut listener = Waiter::new(
        vec![node.clone()],
        names.clone(),
        waiter,
        Some(200),
        1,
        None,
    );
    let subscribed = listener.subscribe().await;
    assert!(subscribed.failed.is_empty(), "{:?}", subscribed.failed);
    listener.start_attempt();
    let given = node
        .give_back_permit(&names, &giver, Some(giver_ticket))
        .await
        .expect("give back");
    assert!(given, "the giver's permit was not given back");
    let held_view = View::Held {
        holder: String::new(),
        expires: None,
    };
    let woken = listener
        .wait(&[held_view], Instant::now() + Duration::from_millis(900))
        .await;
    // What the node keeps: the other permit, and the giver queued.
    let members: Vec<String> = admin.zrange(&names.key, 0, -1).await.expect("ZRANGE");
    assert_eq!(
        members,
        std::slice::from_ref(&held),
        "the key's permit holders"
    );
    let rank: Option<usize> = admin.zrank(&names.queue, &giver).await.expect("ZRANK");
    assert!(rank.is_some(), "the giver did not rejoin the queue");
    drop(listener);
    let _: () = admin.zrem(&names.key, &held).await.expect("ZREM");
    for (token, _, _) in queued.iter().skip(1) {
        let _: () = admin.zrem(&names.queue, token).await.expect("ZREM");
        let _: () = admin.zrem(&names.waiters, token).await.expect("ZREM");
    }
    node.release(&names, &giver, false)
        .await
        .expect("leave the queue");
    (harness, names, woken)
}

/// Nothing of the key is left on node 0 once the background requests have ended.
async fn assert_nothing_left(harness: &RedlockHarness, names: &Names) {
    assert!(
        dlock_core::settle(Duration::from_secs(10)).await,
        "background requests still running after 10 s"
    );
    let mut admin = harness.admin(0).await.expect("admin connection");
    for left in [&names.key, &names.queue, &names.waiters] {
        let exists: bool = admin.exists(left).await.expect("EXISTS");
        assert!(!exists, "{left} is left on the node");
    }
    let _: () = admin.del(&names.fence).await.expect("DEL");
}

/// Microseconds since the Unix epoch: the unit of queue entries' expiries.
fn now_micros() -> u64 {
    let since = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    u64::try_from(since.expect("clock after 1970").as_micros()).expect("µs fit in u64")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_given_back_by_a_waiter_stays_its_turn() {
    // The giver's ticket (100) is before the queued waiter's (200): back in the queue
    // first, the free permit is its own turn, and the waiter behind is not called.
    let (harness, names, woken) = given_back_on_one_node(2, 100, &[]).await;
    assert_eq!(
        woken,
        Wake::Deadline,
        "a waiter behind the giver was called for the giver's own turn"
    );
    assert_nothing_left(&harness, &names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_given_back_behind_an_earlier_waiter_calls_it() {
    // The giver's ticket (300) is after the queued waiter's (200): the free permit is that
    // waiter's turn, and only the give-back can tell it (it would sleep until its refresh,
    // a second later).
    let (harness, names, woken) = given_back_on_one_node(2, 300, &[]).await;
    assert_eq!(
        woken,
        Wake::Called,
        "the waiter whose turn the permit given back is was not called"
    );
    assert_nothing_left(&harness, &names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_dropped_behind_the_head_calls_those_it_held_up() {
    // Four permits, two held; queued: a live waiter (ticket 1), a dead one (2), the
    // listener (200), so the listener has no turn (2 held + 2 ahead). The giver gives its
    // permit back ahead of them all (ticket 0), and the dead entry goes: 1 held + 2 ahead
    // of the listener is its turn, which only this give-back can tell it.
    let (harness, names, woken) = given_back_on_one_node(4, 0, &[(1, true), (2, false)]).await;
    assert_eq!(
        woken,
        Wake::Called,
        "the waiter a dropped entry let in was not called"
    );
    assert_nothing_left(&harness, &names).await;
}
