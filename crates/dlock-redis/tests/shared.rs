//! Shared holds as the server and other clients see them: readers are a sorted set at the
//! lock key (so a plain `SET NX` sees the key busy), the key lives as long as its
//! longest-lived reader, and a release calls the run of readers at the head of the queue,
//! each once, but not the writer queued behind them.

mod common;

use std::time::Duration;

use common::{
    RedisHarness, forget_fence, set_foreign, unique_key, until_queued, wait_for_subscribers,
};
use dlock_conformance::testkit::must_take;
use dlock_core::{DistributedLock, LockOptions, Wait};
use dlock_redis::server::Names;
use redis::AsyncCommands;
use tokio::sync::{mpsc, oneshot};

fn read(ttl: Duration) -> LockOptions {
    LockOptions::new().shared().ttl(ttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_are_a_sorted_set_that_plain_set_nx_clients_see_busy() {
    let harness = RedisHarness::from_env();
    // The empty prefix: the lock key is the name another library would use.
    let lock = harness.lock_at(&harness.url_with_option("prefix=")).await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("readers-interop");
    let ttl = Duration::from_secs(30);
    let first = must_take(&lock, &key, &read(ttl)).await;
    let second = must_take(
        &harness.lock_at(&harness.url_with_option("prefix=")).await,
        &key,
        &read(ttl),
    )
    .await;
    let kind: String = redis::cmd("TYPE")
        .arg(&key)
        .query_async(&mut admin)
        .await
        .expect("TYPE");
    assert_eq!(kind, "zset");
    let readers: Vec<String> = admin.zrange(&key, 0, -1).await.expect("ZRANGE");
    assert_eq!(readers.len(), 2);
    assert!(
        readers.iter().all(|r| r.starts_with('r')
            && r.split_once(' ').is_some_and(
                |(random, who)| random.len() == 33 && who == dlock_core::holder_description()
            )),
        "{readers:?}"
    );
    let pttl: i64 = admin.pttl(&key).await.expect("PTTL");
    assert!((1..=30_000).contains(&pttl), "readers' key pttl {pttl}");
    assert!(
        !set_foreign(&mut admin, &key, 30_000).await,
        "a plain SET NX took a key readers hold"
    );
    first.release().await.expect("release");
    second.release().await.expect("release");
    let gone: bool = admin.exists(&key).await.expect("EXISTS");
    assert!(!gone, "the last reader's release leaves the key");
    // And the other way round: another library's lock keeps readers out.
    assert!(set_foreign(&mut admin, &key, 30_000).await);
    let refused = lock
        .try_acquire(&key, &read(ttl))
        .await
        .expect("try_acquire");
    assert!(refused.is_none(), "a reader joined another library's lock");
    let _: () = admin.del(&key).await.expect("DEL");
    forget_fence(&mut admin, "", &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_lives_as_long_as_its_longest_lived_reader() {
    let harness = RedisHarness::from_env();
    let lock = harness.lock().await;
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("readers-ttl");
    let names = Names::new(&harness.config().prefix, &key);
    let long = must_take(&lock, &key, &read(Duration::from_secs(60))).await;
    let other = harness.lock().await;
    let short = must_take(&other, &key, &read(Duration::from_secs(5))).await;
    let pttl: i64 = admin.pttl(&names.key).await.expect("PTTL");
    assert!(
        pttl > 50_000,
        "the key expires before its longest reader: {pttl} ms"
    );
    long.release().await.expect("release");
    let pttl: i64 = admin.pttl(&names.key).await.expect("PTTL");
    assert!(
        (1..=5_000).contains(&pttl),
        "after the long reader left: {pttl} ms"
    );
    short.release().await.expect("release");
    let gone: bool = admin.exists(&names.key).await.expect("EXISTS");
    assert!(!gone);
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_calls_the_run_of_readers_once_each_and_the_writer_after_them() {
    const READERS: usize = 3;
    let harness = RedisHarness::from_env();
    let mut admin = harness.admin().await.expect("admin connection");
    let key = unique_key("reader-run");
    let names = Names::new(&harness.config().prefix, &key);
    let holder = must_take(&harness.lock().await, &key, &LockOptions::new()).await;
    let wait = Wait::For(Duration::from_secs(60));
    let (held, mut reader_fences) = mpsc::unbounded_channel();
    let mut clients = Vec::new();
    let mut leave = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..READERS {
        let lock = harness.lock().await;
        clients.push(lock.clone());
        let (go, gone) = oneshot::channel::<()>();
        leave.push(go);
        let (key, held) = (key.clone(), held.clone());
        readers.push(tokio::spawn(async move {
            let lease = lock
                .acquire(&key, &LockOptions::new().shared().wait(wait))
                .await
                .expect("reader acquires");
            let _ = held.send(lease.fencing_token());
            let _ = gone.await;
            lease.release().await.expect("reader releases");
        }));
        until_queued(&mut admin, &names, clients.len()).await;
    }
    let writer_client = harness.lock().await;
    clients.push(writer_client.clone());
    let writer = {
        let key = key.clone();
        tokio::spawn(async move {
            let lease = writer_client
                .acquire(&key, &LockOptions::new().wait(wait))
                .await
                .expect("writer acquires");
            let fence = lease.fencing_token();
            lease.release().await.expect("writer releases");
            fence
        })
    };
    until_queued(&mut admin, &names, READERS + 1).await;
    // Every waiter listens (one subscriber connection per client), so none of them takes
    // the key in its re-try after subscribing instead of being called.
    wait_for_subscribers(&mut admin, &names.channel, READERS + 1).await;
    let wakeups = |clients: &[dlock_redis::RedisLock]| -> u64 {
        clients.iter().map(|c| c.stats().wakeups).sum()
    };
    let before = wakeups(&clients);
    let first_fence = holder.fencing_token();
    holder.release().await.expect("release");
    let mut fences = Vec::new();
    for _ in 0..READERS {
        fences.push(reader_fences.recv().await.expect("every reader gets in"));
    }
    assert!(
        fences.iter().all(|f| *f > first_fence),
        "{fences:?} vs {first_fence}"
    );
    assert_eq!(
        wakeups(&clients) - before,
        READERS as u64,
        "the release woke someone else than the {READERS} readers, or one of them twice"
    );
    assert!(!writer.is_finished(), "the writer got in beside readers");
    for go in leave {
        let _ = go.send(());
    }
    for reader in readers {
        reader.await.expect("reader");
    }
    let written = writer.await.expect("writer");
    assert!(
        fences.iter().all(|f| written > *f),
        "{written} vs {fences:?}"
    );
    assert_eq!(
        wakeups(&clients) - before,
        READERS as u64 + 1,
        "the last reader's release should wake the writer, once"
    );
    forget_fence(&mut admin, &harness.config().prefix, &key).await;
}
