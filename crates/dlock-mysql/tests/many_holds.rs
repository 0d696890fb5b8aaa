//! One client holding many keys: in named mode they share holder connections, stay held
//! through many renewals, release cleanly, and a holder connection's end is felt by exactly
//! its holds; in row mode the connection limit is the holding limit, with an error naming it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::MysqlHarness;
use dlock_conformance::Harness;
use dlock_conformance::testkit::{must_take_all, unique_key};
use dlock_core::{DistributedLock, ErrorKind, LockOptions, Wait};
use tokio::time::{sleep, timeout};

async fn client(h: &MysqlHarness) -> Arc<dyn DistributedLock> {
    h.client().await.expect("the MySQL server answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_mode_killing_a_holder_connection_fires_lost_on_exactly_its_holds() {
    let h = MysqlHarness::named();
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

    let holder = h.holder_of(&shared[0]).await.unwrap().expect("a holder");
    for key in &shared[1..] {
        assert_eq!(
            h.holder_of(key).await.unwrap(),
            Some(holder),
            "{key} shares the connection"
        );
    }
    assert_ne!(h.holder_of(&waited).await.unwrap(), Some(holder));
    h.kill_session(holder).await.unwrap();

    for lease in &on_shared {
        timeout(Duration::from_secs(2), lease.lost())
            .await
            .expect("lost() fires on every hold of the killed connection");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn row_mode_holds_at_most_max_connections_keys_and_says_so() {
    let h = MysqlHarness::from_env();
    let url = format!("{}?max_connections=2&connect_timeout=300ms", h.url());
    let lock = h.connect(&url).await.expect("connect");
    assert_eq!(lock.capabilities().max_held, Some(2));
    let opts = LockOptions::new();
    let keys: Vec<String> = (0..3).map(|i| unique_key(&format!("row{i}"))).collect();
    let held = must_take_all(&*lock, &keys[..2], &opts).await;
    let err = lock
        .try_acquire(&keys[2], &opts)
        .await
        .expect_err("a third key");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("max_connections"), "{err}");
    for lease in held {
        lease.release().await.expect("release");
    }
}
