//! Shared holds (read-write locks): readers together, a writer alone, a waiting writer not
//! starved by later readers. On a backend that does not declare
//! [`Capabilities::shared`](dlock_core::Capabilities::shared), each scenario checks the
//! declared behaviour instead: a shared acquire is refused with `Unsupported`, before any
//! network I/O, and leaves nothing.

use std::time::Duration;

use dlock_core::{DistributedLock, ErrorKind, LockOptions, Mode};
use tokio::time::{Instant, sleep, timeout};

use super::leases::killed_holder;
use super::{
    SLACK, contend, dead_server_answers, declared_or_refused, must_be_held, must_take, opts,
    unreachable_client, violations_report, waiting,
};
use crate::Ctx;

fn read(cx: &Ctx) -> LockOptions {
    opts(cx).shared()
}

/// On a backend without shared holds: check the refusal and finish. Returns `None` then.
async fn shared_or_refused(cx: Ctx) -> Option<Ctx> {
    let declared = cx.client().await.capabilities().shared;
    let asked = read(&cx);
    declared_or_refused(cx, declared, asked).await
}

/// Shared holds are refused before any I/O where the backend has none, and reach the
/// server where it has them: a client of a dead server answers `Unsupported` or
/// `Unavailable` accordingly.
pub async fn shared_mode_is_declared(cx: Ctx) {
    let declared = cx.client().await.capabilities().shared;
    if let Some(dead) = unreachable_client(&cx).await {
        dead_server_answers(&*dead, &cx.key("k"), &read(&cx), declared).await;
    }
    cx.finish().await;
}

/// Readers share: several clients hold one key shared at once; a writer cannot take it
/// until the last reader is gone, then it can.
pub async fn readers_share(cx: Ctx) {
    let Some(cx) = shared_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let mut readers = Vec::new();
    let mut leases = Vec::new();
    for _ in 0..3 {
        let client = cx.client().await;
        leases.push(must_take(&*client, &key, &read(&cx)).await);
        readers.push(client);
    }
    assert!(leases.iter().all(|l| l.mode() == Mode::Shared));
    let writer = cx.client().await;
    must_be_held(&*writer, &key, &opts(&cx), "three readers hold it").await;
    let last = leases.pop().expect("three leases");
    for lease in leases {
        lease.release().await.expect("release a reader");
    }
    must_be_held(&*writer, &key, &opts(&cx), "one reader still holds it").await;
    last.release().await.expect("release the last reader");
    let lease = writer
        .acquire(&key, &waiting(&cx, SLACK))
        .await
        .expect("the writer takes the key once the readers are gone");
    must_be_held(&*readers[0], &key, &read(&cx), "a writer holds it").await;
    lease.release().await.expect("release");
    cx.finish().await;
}

/// A writer excludes readers and writers: clients taking one key in both modes in a loop
/// never overlap a writer, and tokens keep the declared order (a writer's above every
/// earlier token, a reader's above every earlier writer's).
pub async fn writer_excludes_readers_and_writers(cx: Ctx) {
    const CLIENTS: usize = 4;
    const ROUNDS: usize = 6;
    let Some(cx) = shared_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    // Every client writes now and then; most holds are reads.
    let mode = |c, round| {
        if (c + round) % 3 == 0 {
            Mode::Exclusive
        } else {
            Mode::Shared
        }
    };
    let wait = waiting(&cx, Duration::from_secs(120));
    let pause = Duration::from_millis(5);
    let (history, ordered) = contend(&cx, &key, (CLIENTS, ROUNDS), wait, pause, mode).await;
    let violations = history.check(ordered);
    assert!(violations.is_empty(), "{}", violations_report(&violations));
    cx.finish().await;
}

/// A waiting writer is not starved: readers that come after it queue behind it, and get the
/// key once the writer is done; a late reader from another client, and one from the first
/// reader's own client (a backend that carries both holds on one session must not let the
/// second one in past the writer).
pub async fn writer_not_starved_by_readers(cx: Ctx) {
    let Some(cx) = shared_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (first_reader, writer, other_reader) =
        (cx.client().await, cx.client().await, cx.client().await);
    let reading = must_take(&*first_reader, &key, &read(&cx)).await;
    let writing = {
        let (writer, key, wait) = (writer.clone(), key.clone(), waiting(&cx, SLACK * 10));
        tokio::spawn(async move { writer.acquire(&key, &wait).await })
    };
    // The writer queues; readers that arrive after it must not pass it.
    wait_until_queued(&*other_reader, &key, &read(&cx)).await;
    let late: Vec<_> = [other_reader, first_reader]
        .into_iter()
        .map(|client| {
            let (key, wait) = (
                key.clone(),
                read(&cx).wait(dlock_core::Wait::For(SLACK * 10)),
            );
            tokio::spawn(async move {
                let lease = client.acquire(&key, &wait).await;
                (lease, Instant::now())
            })
        })
        .collect();
    sleep(Duration::from_millis(200)).await;
    for (which, task) in ["another client", "the first reader's client"]
        .iter()
        .zip(&late)
    {
        assert!(
            !task.is_finished(),
            "a later reader from {which} passed a waiting writer"
        );
    }
    reading.release().await.expect("release the first reader");
    let writing = writing
        .await
        .expect("writer task")
        .expect("the writer takes the key after the first reader");
    let written_at = Instant::now();
    sleep(Duration::from_millis(100)).await;
    assert!(
        late.iter().all(|t| !t.is_finished()),
        "a reader got in while the writer held the key"
    );
    writing.release().await.expect("release the writer");
    for task in late {
        let (lease, read_at) = task.await.expect("late reader task");
        let lease = lease.expect("a late reader gets the key after the writer");
        assert!(read_at > written_at);
        lease.release().await.expect("release a late reader");
    }
    cx.finish().await;
}

/// Poll (within a bound) until a shared try_acquire finds `key` closed to readers: the
/// writer's request has reached the server's queue.
async fn wait_until_queued(client: &dyn DistributedLock, key: &str, opts: &LockOptions) {
    let until = Instant::now() + SLACK;
    loop {
        match client.try_acquire(key, opts).await.expect("try_acquire") {
            None => return,
            Some(lease) => {
                lease.release().await.expect("release a probe");
                assert!(
                    Instant::now() < until,
                    "readers still get in {SLACK:?} after a writer started waiting"
                );
                // The poll's interval, until the bound.
                sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

/// `try_acquire` answers at once in both modes: shared on a key a writer holds, exclusive
/// on a key a reader holds.
pub async fn shared_try_acquire_answers_at_once(cx: Ctx) {
    let Some(cx) = shared_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b) = (cx.client().await, cx.client().await);
    let writing = must_take(&*a, &key, &opts(&cx)).await;
    let asked = Instant::now();
    must_be_held(&*b, &key, &read(&cx), "a writer holds it").await;
    writing.release().await.expect("release");
    let reading = must_take(&*a, &key, &read(&cx)).await;
    must_be_held(&*b, &key, &opts(&cx), "a reader holds it").await;
    assert!(
        asked.elapsed() < SLACK,
        "try_acquire took {:?}",
        asked.elapsed()
    );
    reading.release().await.expect("release");
    cx.finish().await;
}

/// A shared acquire that times out, and one that is cancelled, leave nothing: the writer's
/// release frees the key for anyone at once.
pub async fn shared_timeout_and_cancellation_leave_nothing(cx: Ctx) {
    let Some(cx) = shared_or_refused(cx).await else {
        return;
    };
    let key = cx.key("k");
    let (a, b, c) = (cx.client().await, cx.client().await, cx.client().await);
    let writing = must_take(&*a, &key, &opts(&cx)).await;
    let err = b
        .acquire(
            &key,
            &read(&cx).wait(dlock_core::Wait::For(Duration::from_millis(300))),
        )
        .await
        .expect_err("a reader times out while a writer holds the key");
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    let gave_up = timeout(Duration::from_millis(300), c.acquire(&key, &read(&cx))).await;
    assert!(
        gave_up.is_err(),
        "the reader should still have been waiting"
    );
    writing.release().await.expect("release");
    let lease = b
        .acquire(&key, &waiting(&cx, Duration::from_secs(1)))
        .await
        .expect("nobody who gave up holds or blocks the key");
    lease.release().await.expect("release");
    cx.finish().await;
}

/// A SIGKILLed reader and a SIGKILLed writer free the key within the backend's crash
/// bound.
pub async fn crashed_reader_and_writer_free_the_key(cx: Ctx) {
    let Some(cx) = shared_or_refused(cx).await else {
        return;
    };
    let b = cx.client().await;
    let bound = b.capabilities().crash_release_bound(cx.harness().ttl()) + SLACK;
    for (name, held) in [("reader", read(&cx)), ("writer", opts(&cx))] {
        let key = cx.key(name);
        let (_holder, killed) = killed_holder(&cx, &key, &held).await;
        let lease = b
            .acquire(&key, &waiting(&cx, bound + Duration::from_secs(10)))
            .await
            .unwrap_or_else(|e| panic!("the crashed {name}'s key frees: {e}"));
        let took = killed.elapsed();
        assert!(
            took <= bound,
            "the crashed {name}'s key freed after {took:?} (bound {bound:?})"
        );
        lease.release().await.expect("release");
    }
    cx.finish().await;
}
