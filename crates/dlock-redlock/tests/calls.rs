//! Who a node calls, and when: each script that changes a key's queue or its holders calls
//! (publishes the token of) exactly the waiters whose turn that change makes, so a waiter
//! never sleeps until its next refresh for a turn it already has. Checked on one node of
//! the Redlock set, with entries written by hand: a permit given back by a waiting round
//! keeps the giver's place and calls only a waiter it lets in; a dead entry dropped from
//! anywhere in the queue (by a give-back, a refresh, a reader's grant) calls those it held
//! up.

mod common;

use std::time::Duration;

use common::{RedlockHarness, unique_key};
use dlock_redis::server::{
    Names, Node, Queueing, View, Waiter, Wake, new_permit_token, new_reader_token, new_token,
};
use redis::AsyncCommands;
use tokio::time::Instant;

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
    let mut admin = harness.admin(0).await.expect("admin connection");
    let mut queued = vec![(waiter.clone(), 200, true)];
    queued.extend(
        others
            .iter()
            .map(|&(t, alive)| (new_permit_token(limit), t, alive)),
    );
    seed(&mut admin, &names, &[&held, &giver], &queued).await;
    let mut listener = listen(&node, &names, &waiter).await;
    let given = node
        .give_back_permit(&names, &giver, Some(giver_ticket))
        .await
        .expect("give back");
    assert!(given, "the giver's permit was not given back");
    let woken = called_within_900_ms(&mut listener).await;
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

/// On node 0: `members` hold permits of the key (for a minute), `queued` wait as (token,
/// ticket, alive: else their entry expired a second ago).
async fn seed(
    admin: &mut redis::aio::MultiplexedConnection,
    names: &Names,
    members: &[&String],
    queued: &[(String, u64, bool)],
) {
    let (now, far) = (now_micros(), now_micros() + 60_000_000);
    for member in members {
        let _: () = admin.zadd(&names.key, *member, far).await.expect("ZADD");
    }
    for (token, ticket, alive) in queued {
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
}

/// A waiter `token` (ticket 200) listening for calls on `node`.
async fn listen(node: &Node, names: &Names, token: &str) -> Waiter {
    let mut listener = Waiter::new(
        vec![node.clone()],
        names.clone(),
        token.to_owned(),
        Some(200),
        1,
        None,
    );
    let subscribed = listener.subscribe().await;
    assert!(subscribed.failed.is_empty(), "{:?}", subscribed.failed);
    listener.start_attempt();
    listener
}

/// How the listener's wait for a call ended: 900 ms at most, before its first refresh.
async fn called_within_900_ms(listener: &mut Waiter) -> Wake {
    let held = View::Held {
        holder: String::new(),
        expires: None,
    };
    listener
        .wait(&[held], Instant::now() + Duration::from_millis(900))
        .await
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_that_drops_a_dead_waiter_calls_those_it_held_up() {
    // Four permits, two held; queued: the first waiter (ticket 1), a dead one (2), the
    // listener (200), which has no turn (2 held + 2 ahead). The first waiter's refresh
    // drops the dead entry: 2 held + 1 ahead of the listener is its turn.
    let harness = RedlockHarness::from_env();
    let names = Names::new(harness.prefix(), &unique_key("permits-refresh"));
    let node = Node::new(&harness.config().nodes[0], "redlock").expect("node");
    let token = || new_permit_token(4);
    let (held, other, first, dead, waiter) = (token(), token(), token(), token(), token());
    let mut admin = harness.admin(0).await.expect("admin connection");
    let queued = [
        (first.clone(), 1, true),
        (dead, 2, false),
        (waiter.clone(), 200, true),
    ];
    seed(&mut admin, &names, &[&held, &other], &queued).await;
    let mut listener = listen(&node, &names, &waiter).await;
    node.touch(&names, &first, Some(1)).await.expect("refresh");
    let woken = called_within_900_ms(&mut listener).await;
    assert_eq!(
        woken,
        Wake::Called,
        "the waiter a dead entry held up was not called when a refresh dropped it"
    );
    drop(listener);
    let _: () = admin.del(&names.key).await.expect("DEL");
    node.release(&names, &first, false)
        .await
        .expect("leave the queue");
    assert_nothing_left(&harness, &names).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_granted_past_a_dead_entry_calls_the_readers_behind_it() {
    // Queued: a dead writer (ticket 1), a reader about to take the key (2), the listening
    // reader (200), which the writer held up. The first reader's grant drops the writer:
    // the listener's turn came with its own, and only this grant can tell it.
    let harness = RedlockHarness::from_env();
    let names = Names::new(harness.prefix(), &unique_key("readers-dead-writer"));
    let node = Node::new(&harness.config().nodes[0], "redlock").expect("node");
    let (reader, waiter) = (new_reader_token(), new_reader_token());
    let mut admin = harness.admin(0).await.expect("admin connection");
    let queued = [
        (new_token(), 1, false),
        (reader.clone(), 2, true),
        (waiter.clone(), 200, true),
    ];
    seed(&mut admin, &names, &[], &queued).await;
    let mut listener = listen(&node, &names, &waiter).await;
    let queueing = Queueing {
        wait: true,
        ticket: Some(2),
        fence_floor: None,
    };
    node.acquire(&names, &reader, Duration::from_secs(60), &queueing)
        .await
        .expect("acquire");
    let woken = called_within_900_ms(&mut listener).await;
    assert_eq!(
        woken,
        Wake::Called,
        "a reader the dead writer held up was not called when a grant dropped it"
    );
    drop(listener);
    node.release(&names, &reader, false).await.expect("release");
    assert_nothing_left(&harness, &names).await;
}
