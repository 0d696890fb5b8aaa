//! Reentrant holds on etcd: the owner and count in the holding key's value, re-entries from
//! many tasks and clients at once, the hold kept on the first client's lease after its own
//! leases are released, waiters of the owner joining a hold that begins while they wait,
//! cancelled re-entries leaving the count as it was, and nothing left behind.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::EtcdHarness;
use dlock_conformance::Harness as _;
use dlock_core::{DistributedLock, Lease, LockOptions, Wait};
use etcd_client::PutOptions;
use futures::future::join_all;
use tokio::time::{sleep, timeout};

fn fresh_key(label: &str) -> String {
    format!("dlock-reentry-{}/{label}", uuid::Uuid::new_v4().simple())
}

fn owned(id: &str) -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(4)).owner(id)
}

/// The holding key's value on the server: `(count, owner)`, parsed from
/// `\x01dlock-owner {count} {owner} {who}`.
async fn count_of(harness: &EtcdHarness, key: &str) -> Option<(u64, String, i64)> {
    let keys = harness.lock_keys(key).await;
    let kv = keys.first()?;
    let value = String::from_utf8(kv.value().to_vec()).expect("utf-8");
    let rest = value.strip_prefix("\u{1}dlock-owner ")?;
    let mut parts = rest.splitn(3, ' ');
    let count = parts.next()?.parse().ok()?;
    let owner = parts.next()?.to_owned();
    Some((count, owner, kv.create_revision()))
}

async fn enter(client: &dyn DistributedLock, key: &str, opts: &LockOptions) -> Lease {
    timeout(
        Duration::from_secs(5),
        client.acquire(key, &opts.wait(Wait::No)),
    )
    .await
    .expect("a re-entry answers at once")
    .expect("the owner enters")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_count_lives_in_the_holding_keys_value_and_inspect_shows_it() {
    let harness = EtcdHarness::from_env();
    let (a, b) = (harness.lock().await, harness.lock().await);
    let key = fresh_key("k");
    let opts = owned("job-7");
    let first = enter(&a, &key, &opts).await;
    let token = first.fencing_token();
    assert_eq!(
        count_of(&harness, &key).await,
        Some((1, "job-7".into(), token as i64))
    );
    let second = enter(&b, &key, &opts).await;
    assert_eq!(second.fencing_token(), token, "the hold's token");
    let keys = harness.lock_keys(&key).await;
    assert_eq!(
        keys.len(),
        1,
        "a re-entry leaves no key of its own: {keys:?}"
    );
    assert_eq!(
        count_of(&harness, &key).await,
        Some((2, "job-7".into(), token as i64))
    );
    let status = b.inspect(&key).await.expect("inspect");
    assert_eq!(status.holders.len(), 1, "{status:?}");
    let holder = &status.holders[0];
    assert_eq!(holder.fencing_token, Some(token));
    let who = holder.who.clone().unwrap_or_default();
    assert!(who.starts_with("job-7 (held 2 times) "), "{who}");

    // The first client's lease goes first: the key stays on that client's lease.
    let lease_id = keys[0].lease();
    first.release().await.expect("release");
    let keys = harness.lock_keys(&key).await;
    assert_eq!(keys.len(), 1);
    assert_eq!(
        keys[0].lease(),
        lease_id,
        "the key stays on its first lease"
    );
    assert_eq!(
        count_of(&harness, &key).await,
        Some((1, "job-7".into(), token as i64))
    );
    // Past a few ttls, still held: the first client keeps its lease alive.
    sleep(Duration::from_secs(5)).await;
    assert!(!second.is_lost(), "the second client's lease still counts");
    assert!(
        a.try_acquire(&key, &LockOptions::new())
            .await
            .expect("try")
            .is_none(),
        "held while an entry counts"
    );
    second.release().await.expect("release");
    assert!(harness.lock_keys(&key).await.is_empty(), "freed at zero");
    harness.assert_clean(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_reentries_of_many_tasks_and_two_clients_share_one_token() {
    const TASKS: usize = 8;
    let harness = EtcdHarness::from_env();
    let (a, b) = (harness.lock().await, harness.lock().await);
    let key = fresh_key("k");
    let opts = owned("job-8");
    let first = enter(&a, &key, &opts).await;
    let token = first.fencing_token();
    let tasks: Vec<_> = (0..2 * TASKS)
        .map(|i| {
            let client = if i < TASKS { a.clone() } else { b.clone() };
            let (key, opts) = (key.clone(), opts);
            tokio::spawn(async move {
                client
                    .acquire(&key, &opts.wait(Wait::For(Duration::from_secs(20))))
                    .await
                    .expect("a task re-enters")
            })
        })
        .collect();
    let leases: Vec<Lease> = join_all(tasks)
        .await
        .into_iter()
        .map(|l| l.expect("task"))
        .collect();
    assert!(leases.iter().all(|l| l.fencing_token() == token));
    assert_eq!(
        count_of(&harness, &key).await.map(|c| c.0),
        Some(1 + 2 * TASKS as u64)
    );
    first.release().await.expect("release");
    // Released concurrently, from both clients: the key frees exactly after the last.
    let mut leases = leases;
    let last = leases.pop().expect("leases");
    join_all(leases.into_iter().map(Lease::release))
        .await
        .into_iter()
        .for_each(|r| r.expect("release"));
    assert_eq!(count_of(&harness, &key).await.map(|c| c.0), Some(1));
    assert!(
        b.try_acquire(&key, &LockOptions::new())
            .await
            .expect("try")
            .is_none()
    );
    last.release().await.expect("release");
    assert!(harness.lock_keys(&key).await.is_empty(), "freed at zero");
    harness.assert_clean(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn owner_waiters_join_a_hold_of_their_owner_that_begins_while_they_wait() {
    let harness = EtcdHarness::from_env();
    let (plain, b, c) = (
        harness.lock().await,
        harness.lock().await,
        harness.lock().await,
    );
    let key = fresh_key("k");
    let blocker = plain
        .acquire(&key, &LockOptions::new())
        .await
        .expect("plain hold");
    let waiters: Vec<_> = [b.clone(), c.clone()]
        .into_iter()
        .map(|client| {
            let key = key.clone();
            tokio::spawn(async move {
                client
                    .acquire(
                        &key,
                        &owned("job-9").wait(Wait::For(Duration::from_secs(20))),
                    )
                    .await
                    .expect("the owner's waiter gets the key")
            })
        })
        .collect();
    sleep(Duration::from_millis(300)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()));
    blocker.release().await.expect("release");
    let leases: Vec<Lease> = timeout(Duration::from_secs(5), join_all(waiters))
        .await
        .expect("both waiters get the key together")
        .into_iter()
        .map(|l| l.expect("task"))
        .collect();
    assert_eq!(
        leases[0].fencing_token(),
        leases[1].fencing_token(),
        "one hold of the owner"
    );
    assert_eq!(count_of(&harness, &key).await.map(|c| c.0), Some(2));
    for lease in leases {
        lease.release().await.expect("release");
    }
    harness.assert_clean(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancelled_reentries_leave_the_count_as_it_was() {
    let harness = EtcdHarness::from_env();
    let (a, b) = (harness.lock().await, harness.lock().await);
    let key = fresh_key("k");
    let opts = owned("job-10");
    let first = enter(&a, &key, &opts).await;
    for round in 0..40u64 {
        let client: Arc<dyn DistributedLock> = match round % 2 {
            0 => Arc::new(a.clone()),
            _ => Arc::new(b.clone()),
        };
        let (key, opts) = (key.clone(), opts);
        let task = tokio::spawn(async move {
            let _lease = client.acquire(&key, &opts).await;
            std::future::pending::<()>().await;
        });
        sleep(Duration::from_micros(200 * round)).await;
        task.abort();
        let _ = task.await;
    }
    dlock_core::settle(Duration::from_secs(10)).await;
    assert_eq!(
        count_of(&harness, &key).await.map(|c| c.0),
        Some(1),
        "every cancelled entry left"
    );
    first.release().await.expect("release");
    harness.assert_clean(&key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_owner_hold_on_its_own_lease_and_foreign_values() {
    let harness = EtcdHarness::from_env();
    let (a, b) = (harness.lock().await, harness.lock().await);
    let key = fresh_key("k");
    // Auto-renew off: the key is on a lease of its own, which its ttl ends.
    let unrenewed = owned("job-11")
        .ttl(Duration::from_secs(2))
        .auto_renew(false);
    let first = enter(&a, &key, &unrenewed).await;
    let second = enter(&b, &key, &owned("job-11")).await;
    assert_eq!(first.fencing_token(), second.fencing_token());
    // A shorter ttl never moves the key to a shorter lease.
    let lease_id = harness.lock_keys(&key).await[0].lease();
    first.release().await.expect("release");
    sleep(Duration::from_secs(4)).await;
    assert!(
        !second.is_lost(),
        "the first client keeps the own lease alive"
    );
    assert_eq!(harness.lock_keys(&key).await[0].lease(), lease_id);
    second.release().await.expect("release");
    harness.assert_clean(&key).await;

    // A key whose value looks like an owner's but lacks the tag is not re-entered.
    let other = fresh_key("foreign");
    let prefix = format!("{}/", harness.config().lock_name(&other));
    let mut raw = harness.raw().await;
    let lease = raw.lease_grant(10, None).await.expect("grant").id();
    raw.put(
        format!("{prefix}{lease:x}"),
        "dlock-owner 1 job-12 someone",
        Some(PutOptions::new().with_lease(lease)),
    )
    .await
    .expect("put");
    assert!(
        a.try_acquire(&other, &owned("job-12"))
            .await
            .expect("try")
            .is_none(),
        "a key of another writer is not re-entered"
    );
    raw.lease_revoke(lease).await.expect("revoke");
    harness.assert_clean(&other).await;
}

/// A re-entry in the client whose lease the holding key is on lives exactly as long as
/// that lease: cut that client off, and the re-entry's `lost()` fires before another
/// client can take the key, as a plain hold's does (the conformance scenario
/// `lost_fires_before_partitioned_lease_is_taken`), also once the first lease of the hold
/// is released and only the re-entry is left. The re-entry asks for a longer ttl than the
/// key's lease has, so nothing but that lease's own signal can fire it in time. The same
/// with the key on a lease of its own (auto-renew off): kept alive by the first client
/// once the first lease is released, else left to expire (then cutting the client off
/// changes nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reentry_in_the_first_client_is_lost_before_its_cut_off_lease_is_taken() {
    let harness = EtcdHarness::from_env();
    for (release_first, own_lease) in [(true, false), (false, false), (true, true), (false, true)] {
        let (a, cut) = harness
            .partitioned_client()
            .await
            .expect("a client through the proxy");
        let b = harness.lock().await;
        let key = fresh_key("cut");
        let opts = owned("job-13").ttl(Duration::from_secs(2));
        let first = enter(&*a, &key, &opts.auto_renew(!own_lease)).await;
        let second = enter(&*a, &key, &opts.ttl(Duration::from_secs(30))).await;
        assert_eq!(first.fencing_token(), second.fencing_token());
        let first = match release_first {
            true => {
                first.release().await.expect("release");
                None
            }
            false => Some(first),
        };
        cut.cut();
        let newer = b
            .acquire(
                &key,
                &LockOptions::new()
                    .ttl(Duration::from_secs(4))
                    .wait(Wait::For(Duration::from_secs(20))),
            )
            .await
            .expect("the cut-off client's key frees");
        assert!(
            second.is_lost(),
            "another client took the key but the cut-off re-entry was not told before \
             (first lease released: {release_first}, own lease: {own_lease})"
        );
        if let Some(first) = &first {
            assert!(first.is_lost());
        }
        assert!(newer.fencing_token() > second.fencing_token());
        newer.release().await.expect("release");
        cut.heal();
        drop((first, second));
        harness.assert_clean(&key).await;
    }
}
