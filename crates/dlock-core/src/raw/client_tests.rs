//! Tests of `client`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;
use crate::{Wait, raw::backend::Held};

/// A backend whose grants arrive `late` after their request was sent, and whose
/// extends answer with the next of `extends` (`true`: still ours).
#[derive(Debug, Default)]
struct Late {
    late: Duration,
    /// How long each extend takes to answer.
    confirm_takes: Duration,
    extends: Mutex<Vec<bool>>,
    acquires: AtomicUsize,
    releases: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct Handle {
    ours: bool,
    takes: Duration,
    releases: Arc<AtomicUsize>,
}

#[async_trait]
impl Held for Handle {
    async fn extend(&mut self, _ttl: Duration) -> Result<()> {
        tokio::time::sleep(self.takes).await;
        match self.ours {
            true => Ok(()),
            false => Err(LockError::not_held("late", "k", LostReason::NotHeld)),
        }
    }
    async fn release(&mut self) -> Result<()> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[async_trait]
impl Backend for Late {
    const NAME: &'static str = "late";

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    async fn inspect(&self, key: &str) -> Result<crate::KeyStatus> {
        Ok(crate::KeyStatus::new(key, false))
    }

    async fn list(&self, _prefix: &str) -> Result<Vec<String>> {
        Err(LockError::Unsupported {
            backend: Self::NAME,
            what: "listing held keys",
        })
    }

    async fn acquire(
        &self,
        _key: &str,
        _opts: &LockOptions,
        _deadline: Deadline,
    ) -> Result<Option<Grant>> {
        self.acquires.fetch_add(1, Ordering::SeqCst);
        let sent_at = Instant::now();
        tokio::time::sleep(self.late).await;
        let ours = self.extends.lock().unwrap().pop().unwrap_or(true);
        let handle = Handle {
            ours,
            takes: self.confirm_takes,
            releases: self.releases.clone(),
        };
        Ok(Some(Grant::new(1, Box::new(handle), sent_at)))
    }
}

fn client(late: Duration, extends: &[bool]) -> LockClient<Late> {
    slow_client(late, Duration::ZERO, extends)
}

fn slow_client(late: Duration, confirm_takes: Duration, extends: &[bool]) -> LockClient<Late> {
    let mut extends = extends.to_vec();
    extends.reverse();
    LockClient::new(Late {
        late,
        confirm_takes,
        extends: Mutex::new(extends),
        ..Late::default()
    })
}

const TTL: Duration = Duration::from_secs(3);

#[tokio::test(start_paused = true)]
async fn a_late_grant_that_expired_on_the_server_is_not_handed_out() {
    let lock = client(TTL * 2, &[false]);
    let opts = LockOptions::new().ttl(TTL).wait(Wait::No);
    let lease = lock.try_acquire("k", &opts).await.unwrap();
    assert!(lease.is_none(), "an expired grant was handed out");
    tokio::task::yield_now().await;
    assert_eq!(lock.backend().releases.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn an_acquire_dropped_while_confirming_gives_the_grant_back() {
    let lock = slow_client(TTL, TTL / 2, &[true]);
    let opts = LockOptions::new().ttl(TTL).wait(Wait::No);
    let dropped = tokio::time::timeout(TTL + TTL / 4, lock.try_acquire("k", &opts)).await;
    assert!(dropped.is_err(), "the confirm should still be running");
    tokio::task::yield_now().await;
    assert_eq!(lock.backend().releases.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_waiting_acquire_tries_again_after_a_late_grant_expired() {
    let lock = client(TTL * 2, &[false, true]);
    let opts = LockOptions::new()
        .ttl(TTL)
        .wait(Wait::For(Duration::from_secs(60)));
    let lease = lock.acquire("k", &opts).await.unwrap();
    assert_eq!(lock.backend().acquires.load(Ordering::SeqCst), 2);
    assert!(!lease.is_lost());
}

#[tokio::test(start_paused = true)]
async fn a_confirmed_late_grant_runs_a_full_ttl_from_the_confirmation() {
    let lock = client(TTL, &[true]);
    let opts = LockOptions::new().ttl(TTL).auto_renew(false);
    let lease = lock.try_acquire("k", &opts).await.unwrap().unwrap();
    // Measured from the request, the lease would be lost at once; from the confirming
    // extend it lasts until just before another ttl.
    tokio::time::sleep(TTL - TTL / 5).await;
    assert!(!lease.is_lost());
}

#[tokio::test(start_paused = true)]
async fn confirming_a_late_grant_stops_at_the_acquire_deadline() {
    let lock = slow_client(TTL / 2, TTL, &[true]);
    let wait = TTL / 2 + TTL / 10;
    let opts = LockOptions::new().ttl(TTL).wait(Wait::For(wait));
    let started = Instant::now();
    let err = lock.acquire("k", &opts).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(started.elapsed() <= wait + Duration::from_millis(1));
}

#[tokio::test(start_paused = true)]
async fn a_prompt_grant_is_not_confirmed() {
    // An extend would say "not ours": a prompt grant must not send one.
    let lock = client(Duration::from_millis(10), &[false]);
    let opts = LockOptions::new().ttl(TTL).auto_renew(false);
    let lease = lock.try_acquire("k", &opts).await.unwrap();
    assert!(lease.is_some_and(|l| !l.is_lost()));
}

/// A reentrant backend for the owner paths, every grant token 7 with a handle that
/// renews fine: `lose_first` gives the first grant a loss signal the test fires (the
/// others get none: only a sibling can tell them); with `later_wait`, every acquire after
/// the first waits on the "server" until `go` (a re-entry of a hold lost meanwhile); with
/// `silent_release`, releases reach the server (counted) and are never answered.
#[derive(Debug, Default)]
struct Owned {
    lose_first: Mutex<Option<tokio::sync::oneshot::Receiver<LostReason>>>,
    later_wait: bool,
    silent_release: bool,
    calls: AtomicUsize,
    go: tokio::sync::Notify,
    releases: Arc<AtomicUsize>,
}

#[derive(Debug)]
struct OwnedHandle {
    silent_release: bool,
    releases: Arc<AtomicUsize>,
}

#[async_trait]
impl Held for OwnedHandle {
    async fn extend(&mut self, _ttl: Duration) -> Result<()> {
        Ok(())
    }
    async fn release(&mut self) -> Result<()> {
        self.releases.fetch_add(1, Ordering::SeqCst);
        if self.silent_release {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

#[async_trait]
impl Backend for Owned {
    const NAME: &'static str = "owned";

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reentrant: crate::Reentry::AnyLease,
            ..Capabilities::default()
        }
    }

    async fn inspect(&self, key: &str) -> Result<crate::KeyStatus> {
        Ok(crate::KeyStatus::new(key, false))
    }

    async fn list(&self, _prefix: &str) -> Result<Vec<String>> {
        Ok(Vec::new())
    }

    async fn acquire(
        &self,
        _key: &str,
        _opts: &LockOptions,
        deadline: Deadline,
    ) -> Result<Option<Grant>> {
        if self.calls.fetch_add(1, Ordering::SeqCst) > 0
            && self.later_wait
            && (deadline == Deadline::TryOnce || deadline.run(self.go.notified()).await.is_none())
        {
            return Ok(None);
        }
        let handle = OwnedHandle {
            silent_release: self.silent_release,
            releases: self.releases.clone(),
        };
        let grant = Grant::new(7, Box::new(handle), Instant::now());
        Ok(Some(match self.lose_first.lock().unwrap().take() {
            Some(lost) => grant.with_lost(Box::pin(async move {
                lost.await.unwrap_or(LostReason::NotHeld)
            })),
            None => grant,
        }))
    }
}

#[tokio::test]
async fn an_owners_leases_in_one_client_are_lost_together() {
    let (lose, lost) = tokio::sync::oneshot::channel();
    let client = LockClient::new(Owned {
        lose_first: Mutex::new(Some(lost)),
        ..Owned::default()
    });
    let opts = LockOptions::new().owner("job").wait(Wait::No);
    let first = client.acquire("k", &opts).await.unwrap();
    let second = client.acquire("k", &opts).await.unwrap();
    assert_eq!(second.fencing_token(), first.fencing_token());
    assert!(!second.is_lost());
    lose.send(LostReason::NotHeld).unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), second.lost())
        .await
        .expect("the re-entry hears of its hold's loss from the first lease");
    assert_eq!(reason, LostReason::NotHeld);
    assert!(first.is_lost());
}

#[tokio::test]
async fn a_re_entry_whose_own_ttl_runs_out_does_not_take_its_siblings_with_it() {
    let client = LockClient::new(Owned::default());
    let opts = LockOptions::new().owner("job").wait(Wait::No);
    let kept = client.acquire("k", &opts).await.unwrap();
    let short = client
        .acquire("k", &opts.auto_renew(false).ttl(LockOptions::MIN_TTL))
        .await
        .unwrap();
    let reason = tokio::time::timeout(Duration::from_secs(5), short.lost())
        .await
        .expect("a lease without renewal runs out");
    assert_eq!(reason, LostReason::Expired);
    let told = tokio::time::timeout(Duration::from_millis(200), kept.lost()).await;
    assert!(told.is_err(), "the renewed lease of the hold is not lost");
}

#[tokio::test]
async fn a_joined_try_acquire_does_not_wait_behind_another_task_of_its_owner() {
    let client = LockClient::new(Owned {
        later_wait: true,
        ..Owned::default()
    });
    let opts = LockOptions::new().owner("job");
    let _first = client.acquire("k", &opts.wait(Wait::No)).await.unwrap();
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.acquire("k", &opts).await.map(|l| l.fencing_token()) })
    };
    // Until the waiting task waits on the "server": its quick re-entry, then its wait.
    tokio::time::timeout(Duration::from_secs(5), async {
        while client.backend().calls.load(Ordering::SeqCst) < 3 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the owner's other task waits on the server");
    let tried = tokio::time::timeout(Duration::from_secs(5), client.try_acquire("k", &opts))
        .await
        .expect("try_acquire answers at once");
    assert!(tried.unwrap().is_none());
    let bounded = tokio::time::timeout(
        Duration::from_secs(5),
        client.acquire("k", &opts.wait(Wait::For(Duration::from_millis(200)))),
    )
    .await
    .expect("a bounded acquire keeps its deadline");
    assert_eq!(bounded.unwrap_err().kind(), ErrorKind::Timeout);
    client.backend().go.notify_waiters();
    assert_eq!(waiting.await.unwrap().unwrap(), 7);
}

#[tokio::test]
async fn an_owners_release_cut_off_after_it_was_sent_is_not_sent_again() {
    for (owner, sent) in [(true, 1), (false, 2)] {
        let client = LockClient::new(Owned {
            silent_release: true,
            ..Owned::default()
        });
        let releases = client.backend().releases.clone();
        let opts = match owner {
            true => LockOptions::new().owner("job"),
            false => LockOptions::new(),
        };
        let lease = client.acquire("k", &opts.wait(Wait::No)).await.unwrap();
        let cut = tokio::time::timeout(Duration::from_millis(50), lease.release()).await;
        assert!(cut.is_err(), "the release is never answered");
        // The dropped lease's background clean-up: done at once for the owner's (nothing
        // sent); the plain one's repeat is sent, and never answered.
        if owner {
            assert!(crate::settle(Duration::from_secs(5)).await);
        } else {
            tokio::time::timeout(Duration::from_secs(5), async {
                while releases.load(Ordering::SeqCst) < 2 {
                    tokio::task::yield_now().await;
                }
            })
            .await
            .expect("the plain release is sent again");
        }
        assert_eq!(
            releases.load(Ordering::SeqCst),
            sent,
            "owner {owner}: a plain release is sent again on drop, an owner's is not"
        );
    }
}
