//! One client holding many keys: they share holder connections, stay held through many
//! renewals, release cleanly, and a holder connection's end is felt by exactly its holds.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::PostgresHarness;
use dlock_conformance::Harness;
use dlock_conformance::testkit::{must_take_all, unique_key};
use dlock_core::{DistributedLock, ErrorKind, LockOptions, Wait};
use tokio::time::{sleep, timeout};

async fn client(h: &PostgresHarness) -> Arc<dyn DistributedLock> {
    h.client().await.expect("the PostgreSQL server answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_a_holder_connection_fires_lost_on_exactly_its_holds() {
    let h = PostgresHarness::from_env();
    let (a, b) = (client(&h).await, client(&h).await);
    let opts = LockOptions::new().ttl(Duration::from_secs(1));
    // Five holds taken at once share one holder connection.
    let shared: Vec<String> = (0..5).map(|i| unique_key(&format!("shared{i}"))).collect();
    let on_shared = must_take_all(&*a, &shared, &opts).await;
    // A hold granted after a wait lives on the waiter's own connection.
    let waited = unique_key("waited");
    let blocker = b.try_acquire(&waited, &opts).await.unwrap().expect("free");
    let waiting = {
        let (a, key) = (a.clone(), waited.clone());
        let opts = opts.wait(Wait::For(Duration::from_secs(10)));
        tokio::spawn(async move { a.acquire(&key, &opts).await })
    };
    sleep(Duration::from_millis(200)).await;
    blocker.release().await.unwrap();
    let on_own = waiting.await.unwrap().expect("the waiter gets the key");

    let pids = h.sessions_on(&shared[0], true).await.unwrap();
    assert_eq!(pids.len(), 1, "{pids:?}");
    for key in &shared[1..] {
        assert_eq!(
            h.sessions_on(key, true).await.unwrap(),
            pids,
            "{key} shares the connection"
        );
    }
    assert_ne!(h.sessions_on(&waited, true).await.unwrap(), pids);
    h.kill_session(pids[0]).await.unwrap();

    for lease in &on_shared {
        timeout(Duration::from_secs(2), lease.lost())
            .await
            .expect("lost() fires on every hold of the terminated connection");
    }
    sleep(Duration::from_secs(1)).await;
    assert!(
        !on_own.is_lost(),
        "a hold on another connection is untouched"
    );
    for lease in on_shared {
        assert_eq!(
            lease.release().await.unwrap_err().kind(),
            ErrorKind::NotHeld
        );
    }
    on_own.release().await.expect("the untouched hold releases");
}
