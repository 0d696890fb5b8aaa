//! One holder at a time: many clients and tasks on one key, try_acquire, keys that must
//! not merge, and one client shared by many tasks.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures::future::join_all;
use tokio::time::{Instant, sleep};

use super::{join_panics, must_be_held, must_take, opts, violations_report, waiting};
use crate::{Ctx, History, Hold};

/// Promise 1: Many clients (separate connections), many tasks, one key: no two holders overlap,
/// and a read-modify-write done under the lock loses no update.
pub async fn mutual_exclusion(cx: Ctx) {
    const CLIENTS: usize = 4;
    const TASKS: usize = 3;
    const ROUNDS: u64 = 5;
    let key = cx.key("shared");
    let history = History::new();
    let counter = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(cx.client().await);
    }
    // Read from a client in use: a connection that fails fails the test, it does not turn
    // the token check off.
    let ordered = clients[0].capabilities().fencing.is_ordered();
    let mut tasks = Vec::new();
    for (c, client) in clients.into_iter().enumerate() {
        for _ in 0..TASKS {
            let (client, key, history, counter) = (
                client.clone(),
                key.clone(),
                history.clone(),
                counter.clone(),
            );
            let opts = waiting(&cx, Duration::from_secs(120));
            tasks.push(tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lease = client
                        .acquire(&key, &opts)
                        .await
                        .expect("acquire under contention");
                    let start = Instant::now();
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    // A fixed pause, not a poll: it widens the read-modify-write window.
                    sleep(Duration::from_millis(1)).await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    let end = Instant::now();
                    assert!(!lease.is_lost(), "lease lost in calm weather");
                    history.record(Hold {
                        client: c,
                        key: key.clone(),
                        token: lease.fencing_token(),
                        mode: lease.mode(),
                        start,
                        end,
                        lost_at: None,
                    });
                    lease.release().await.expect("release");
                }
            }));
        }
    }
    join_panics(join_all(tasks).await);
    let violations = history.check(ordered);
    assert!(violations.is_empty(), "{}", violations_report(&violations));
    let total = (CLIENTS * TASKS) as u64 * ROUNDS;
    assert_eq!(
        counter.load(Ordering::SeqCst),
        total,
        "updates under the lock were lost"
    );
    assert_eq!(history.holds().len() as u64, total);
    cx.finish().await;
}

/// Promise 2: try_acquire answers at once: `None` while held (by another client, or by another task
/// of the same client), a lease once free.
pub async fn try_acquire_answers_at_once(cx: Ctx) {
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let opts = opts(&cx);
    let lease = must_take(&*a, &key, &opts).await;
    let asked = Instant::now();
    must_be_held(&*b, &key, &opts, "held by a").await;
    must_be_held(&*a, &key, &opts, "held by another task of a").await;
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "try_acquire on a held key took {:?}",
        asked.elapsed()
    );
    lease.release().await.expect("release");
    must_take(&*b, &key, &opts)
        .await
        .release()
        .await
        .expect("release");
    cx.finish().await;
}

/// Promise 9: Different keys never block each other, however close they are: a key and its
/// children, case, trailing space, percent-encoding, separators the backend uses inside its
/// own names, and letters a collation might fold. All are held at once.
pub async fn independent_keys(cx: Ctx) {
    let (a, b) = (cx.client().await, cx.client().await);
    let base = cx.key("near");
    let mut keys = vec![base.clone(), base.to_uppercase()];
    for suffix in [
        "/child", "/", " ", "%2F", "%2f", ":fence", "}:fence", "/../x", ".", "ss", "ß", "é",
        "e\u{301}", "\\",
    ] {
        keys.push(format!("{base}{suffix}"));
    }
    // The same client and another one, alternately.
    let mut leases = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let client = if i % 2 == 0 { &a } else { &b };
        match client.try_acquire(key, &opts(&cx)).await {
            Ok(Some(lease)) => leases.push(lease),
            Ok(None) => panic!(
                "{key:?} is busy while only {:?} are held: the backend merges distinct keys",
                &keys[..i]
            ),
            Err(e) => panic!("try_acquire({key:?}): {e}"),
        }
    }
    // A waiter parked on a held key does not hold up its own client on other keys.
    let parked = tokio::spawn({
        let (b, key, opts) = (
            b.clone(),
            base.clone(),
            waiting(&cx, Duration::from_secs(60)),
        );
        async move { b.acquire(&key, &opts).await }
    });
    // A fixed pause, not a poll: let the waiter park (not observable) before the next call.
    sleep(Duration::from_millis(200)).await;
    let other = tokio::time::timeout(
        Duration::from_secs(5),
        b.try_acquire(&cx.key("other"), &opts(&cx)),
    )
    .await
    .expect("a parked waiter held up its client's try_acquire of another key")
    .expect("try_acquire")
    .expect("another key is free while a waiter is parked");
    other.release().await.expect("release");
    for lease in leases {
        lease.release().await.expect("release");
    }
    parked
        .await
        .expect("the parked waiter's task")
        .expect("the parked waiter gets the key once it is released")
        .release()
        .await
        .expect("release");
    cx.finish().await;
}

/// Promise 16: One client value shared by hundreds of tasks works, and stays exclusive.
pub async fn shared_client(cx: Ctx) {
    const TASKS: usize = 200;
    const KEYS: usize = 10;
    let client = cx.client().await;
    let history = History::new();
    let tasks = (0..TASKS).map(|i| {
        let (client, history, key, opts) = (
            client.clone(),
            history.clone(),
            cx.key(&format!("k{}", i % KEYS)),
            waiting(&cx, Duration::from_secs(120)),
        );
        tokio::spawn(async move {
            let lease = client
                .acquire(&key, &opts)
                .await
                .expect("acquire from a shared client");
            let start = Instant::now();
            tokio::task::yield_now().await;
            history.record(Hold {
                client: i,
                key,
                token: lease.fencing_token(),
                mode: lease.mode(),
                start,
                end: Instant::now(),
                lost_at: None,
            });
            lease.release().await.expect("release");
        })
    });
    join_panics(join_all(tasks).await);
    assert_eq!(history.holds().len(), TASKS);
    let violations = history.check(client.capabilities().fencing.is_ordered());
    assert!(violations.is_empty(), "{}", violations_report(&violations));
    cx.finish().await;
}
