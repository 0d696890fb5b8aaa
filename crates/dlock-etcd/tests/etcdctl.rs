//! Interoperation with etcd's own lock: `etcdctl lock <name>` (Go's `concurrency.Mutex`) and
//! this crate exclude each other on the same lock name, in both of our modes (our readers
//! are writers to etcdctl), and `inspect` shows either side's keys in one queue. And with
//! etcd's own election: `etcdctl elect <name>` (Go's `concurrency.Election`) and our
//! candidates stand in one line, and each side reads the other's leader and value.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::EtcdHarness;
use dlock_core::{DistributedLock, Election, Leader, LockOptions, Wait};
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use tokio::time::{Instant, sleep, timeout};

/// A fresh lock name, and the name etcdctl must use for it (the documented mapping).
fn names(harness: &EtcdHarness) -> (String, String) {
    let key = format!("dlock-interop-{}", uuid::Uuid::new_v4().simple());
    let etcdctl_name = harness.config().lock_name(&key);
    (key, etcdctl_name)
}

/// `etcdctl --endpoints … <args…>` against the server under test, stdout piped.
fn etcdctl(harness: &EtcdHarness, args: &[&str]) -> (Child, Lines<BufReader<ChildStdout>>) {
    let endpoints: Vec<String> = harness
        .config()
        .endpoints()
        .iter()
        .map(|e| e.trim_start_matches("http://").to_owned())
        .collect();
    let mut child = Command::new("etcdctl")
        .arg("--endpoints")
        .arg(endpoints.join(","))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run etcdctl ({e}); it comes with the Debian package etcd-client")
        });
    let lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    (child, lines)
}

async fn next_line(lines: &mut Lines<BufReader<ChildStdout>>, within: Duration) -> Option<String> {
    timeout(within, lines.next_line())
        .await
        .ok()
        .and_then(|line| line.expect("read etcdctl's output"))
}

fn signal(child: &Child, signal: &str) {
    let pid = child.id().expect("etcdctl is running").to_string();
    let status = std::process::Command::new("kill")
        .args([signal, &pid])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid} failed");
}

/// Until the lock has no keys left on the server (nothing leaked by either side).
async fn wait_clean(harness: &EtcdHarness, key: &str) {
    let started = Instant::now();
    loop {
        let left = harness.lock_keys(key).await;
        if left.is_empty() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "keys left under {key}: {:?}",
            left.iter()
                .map(|kv| String::from_utf8_lossy(kv.key()).into_owned())
                .collect::<Vec<_>>()
        );
        sleep(Duration::from_millis(100)).await;
    }
}

/// `etcdctl lock NAME -- sh -c 'echo …; sleep 3'` holds the lock while its command runs: our
/// acquire waits until the command ends and etcdctl unlocks, then gets a later revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_wait_while_etcdctl_runs_a_command_under_the_lock() {
    let harness = EtcdHarness::from_env();
    let (key, name) = names(&harness);
    let lock = harness.lock().await;
    let opts = LockOptions::new().ttl(Duration::from_secs(5));

    let script = "echo \"locked $ETCD_LOCK_REV\"; sleep 3";
    let (mut child, mut out) = etcdctl(&harness, &["lock", &name, "--", "sh", "-c", script]);
    let line = next_line(&mut out, Duration::from_secs(10))
        .await
        .expect("etcdctl reports it holds the lock");
    let locked_at = Instant::now();
    let etcdctl_rev: u64 = line
        .strip_prefix("locked ")
        .and_then(|r| r.trim().parse().ok())
        .unwrap_or_else(|| panic!("unexpected etcdctl output {line:?}"));

    assert!(
        lock.try_acquire(&key, &opts)
            .await
            .expect("try_acquire")
            .is_none(),
        "we took a lock etcdctl holds"
    );
    let waiter = {
        let (lock, key) = (lock.clone(), key.clone());
        let opts = opts.wait(Wait::For(Duration::from_secs(30)));
        tokio::spawn(async move {
            let lease = lock
                .acquire(&key, &opts)
                .await
                .expect("acquire after etcdctl");
            (Instant::now(), lease)
        })
    };
    let status = timeout(Duration::from_secs(15), child.wait())
        .await
        .expect("etcdctl ends after its command")
        .expect("wait for etcdctl");
    assert!(status.success(), "etcdctl failed: {status}");
    let exited = Instant::now();
    let (acquired, lease) = waiter.await.expect("waiter task");
    assert!(
        acquired - locked_at >= Duration::from_millis(2500),
        "we acquired {:?} after etcdctl locked, while its 3 s command ran",
        acquired - locked_at
    );
    assert!(
        acquired <= exited + Duration::from_secs(2),
        "we acquired {:?} after etcdctl exited: not woken by its unlock",
        acquired.saturating_duration_since(exited)
    );
    assert!(
        lease.fencing_token() > etcdctl_rev,
        "our token {} is not after etcdctl's revision {etcdctl_rev}",
        lease.fencing_token()
    );
    lease.release().await.expect("release");
    wait_clean(&harness, &key).await;
}

/// A bare `etcdctl lock NAME` prints its key and holds the lock until interrupted; our
/// waiter is woken by its unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_wait_until_etcdctl_lock_is_interrupted() {
    let harness = EtcdHarness::from_env();
    let (key, name) = names(&harness);
    let lock = harness.lock().await;
    let (mut child, mut out) = etcdctl(&harness, &["lock", &name]);
    let line = next_line(&mut out, Duration::from_secs(10))
        .await
        .expect("etcdctl prints the key it holds");
    assert!(
        line.starts_with(&format!("{name}/")),
        "etcdctl's key {line:?} is not under {name}/"
    );
    let keys = harness.lock_keys(&key).await;
    assert_eq!(keys.len(), 1);
    assert_eq!(
        keys[0].key(),
        line.as_bytes(),
        "we read etcdctl's key under our lock name"
    );

    let waiter = {
        let (lock, key) = (lock.clone(), key.clone());
        let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(30)));
        tokio::spawn(async move {
            let lease = lock
                .acquire(&key, &opts)
                .await
                .expect("acquire after etcdctl");
            (Instant::now(), lease)
        })
    };
    sleep(Duration::from_millis(1500)).await;
    assert!(
        !waiter.is_finished(),
        "we acquired while etcdctl held the lock"
    );
    let keys = harness.lock_keys(&key).await;
    assert_eq!(keys.len(), 2, "our waiting key queues behind etcdctl's");
    assert_eq!(
        keys[0].key(),
        line.as_bytes(),
        "etcdctl's key stays the oldest"
    );

    let interrupted = Instant::now();
    signal(&child, "-TERM");
    let (acquired, lease) = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("we acquire once etcdctl unlocks")
        .expect("waiter task");
    assert!(
        acquired - interrupted < Duration::from_secs(2),
        "hand-off from etcdctl took {:?}",
        acquired - interrupted
    );
    let _ = timeout(Duration::from_secs(10), child.wait()).await;
    lease.release().await.expect("release");
    wait_clean(&harness, &key).await;
}

/// An etcdctl holder killed with SIGKILL cannot unlock: its session lease (`--ttl 2`)
/// expires, the server deletes its key, and our waiter is woken by that deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_get_the_lock_when_a_killed_etcdctl_session_expires() {
    let harness = EtcdHarness::from_env();
    let (key, name) = names(&harness);
    let lock = harness.lock().await;
    let (mut child, mut out) = etcdctl(&harness, &["lock", "--ttl", "2", &name]);
    next_line(&mut out, Duration::from_secs(10))
        .await
        .expect("etcdctl prints the key it holds");
    let waiter = {
        let (lock, key) = (lock.clone(), key.clone());
        let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(30)));
        tokio::spawn(async move {
            lock.acquire(&key, &opts)
                .await
                .expect("acquire after etcdctl")
        })
    };
    sleep(Duration::from_millis(500)).await;
    child.kill().await.expect("SIGKILL etcdctl");
    let killed = Instant::now();
    let lease = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("we acquire once etcdctl's lease expires")
        .expect("waiter task");
    let took = killed.elapsed();
    assert!(
        took <= Duration::from_secs(5),
        "acquired {took:?} after etcdctl was killed (its lease ttl is 2 s)"
    );
    lease.release().await.expect("release");
    wait_clean(&harness, &key).await;
}

/// The other way round: while we hold the lock, `etcdctl lock NAME -- echo got` waits; it
/// runs its command promptly once we release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_waits_while_we_hold_the_lock() {
    let harness = EtcdHarness::from_env();
    let (key, name) = names(&harness);
    let lock = harness.lock().await;
    let lease = lock
        .try_acquire(&key, &LockOptions::new().ttl(Duration::from_secs(5)))
        .await
        .expect("try_acquire")
        .expect("a fresh lock is free");
    let (mut child, mut out) = etcdctl(&harness, &["lock", &name, "--", "echo", "got"]);
    assert_eq!(
        next_line(&mut out, Duration::from_millis(2000)).await,
        None,
        "etcdctl ran its command while we held the lock"
    );
    let keys = harness.lock_keys(&key).await;
    assert_eq!(keys.len(), 2, "etcdctl queues behind our key");
    assert!(
        lease.fencing_token() == keys[0].create_revision() as u64,
        "our key is the oldest"
    );
    let released = Instant::now();
    lease.release().await.expect("release");
    let line = next_line(&mut out, Duration::from_secs(5))
        .await
        .expect("etcdctl gets the lock after our release");
    assert_eq!(line, "got");
    assert!(
        released.elapsed() < Duration::from_secs(5),
        "etcdctl got the lock {:?} after our release",
        released.elapsed()
    );
    let status = timeout(Duration::from_secs(10), child.wait())
        .await
        .expect("etcdctl exits")
        .expect("wait for etcdctl");
    assert!(status.success(), "etcdctl failed: {status}");
    wait_clean(&harness, &key).await;
    // And we can take it again afterwards.
    let again = lock
        .try_acquire(&key, &LockOptions::new())
        .await
        .expect("try_acquire")
        .expect("free after etcdctl unlocked");
    again.release().await.expect("release");
    wait_clean(&harness, &key).await;
}

/// Our shared holds exclude etcdctl too: it waits while we hold the key shared, and our
/// reader waits while etcdctl holds it, woken by its unlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_and_our_readers_exclude_each_other() {
    let harness = EtcdHarness::from_env();
    let (key, name) = names(&harness);
    let lock = harness.lock().await;
    let read = LockOptions::new().shared().ttl(Duration::from_secs(5));
    let lease = lock
        .try_acquire(&key, &read)
        .await
        .expect("try_acquire")
        .expect("a fresh lock is free");
    let (mut child, mut out) = etcdctl(&harness, &["lock", &name]);
    assert_eq!(
        next_line(&mut out, Duration::from_millis(2000)).await,
        None,
        "etcdctl took the lock while we held it shared"
    );
    lease.release().await.expect("release");
    let line = next_line(&mut out, Duration::from_secs(5))
        .await
        .expect("etcdctl gets the lock after our reader's release");
    assert!(line.starts_with(&format!("{name}/")), "{line:?}");

    assert!(
        lock.try_acquire(&key, &read)
            .await
            .expect("try_acquire")
            .is_none(),
        "our reader took a lock etcdctl holds"
    );
    let waiter = {
        let (lock, key) = (lock.clone(), key.clone());
        let opts = read.wait(Wait::For(Duration::from_secs(30)));
        tokio::spawn(async move { lock.acquire(&key, &opts).await.expect("acquire") })
    };
    sleep(Duration::from_millis(1000)).await;
    assert!(!waiter.is_finished(), "our reader got in beside etcdctl");
    let interrupted = Instant::now();
    signal(&child, "-TERM");
    let lease = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("our reader gets in once etcdctl unlocks")
        .expect("waiter task");
    assert!(
        interrupted.elapsed() < Duration::from_secs(3),
        "hand-off from etcdctl took {:?}",
        interrupted.elapsed()
    );
    let _ = timeout(Duration::from_secs(10), child.wait()).await;
    lease.release().await.expect("release");
    wait_clean(&harness, &key).await;
}

/// `inspect` and `list` see etcdctl's key as any other: etcdctl's holder (its value is
/// empty, so it is named by its lease) with our writer queued behind it, then our holder
/// (named by the value we put) with etcdctl queued behind it. Our value does not disturb
/// etcdctl, which ignores it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_etcdctl_and_us_in_one_queue() {
    let harness = EtcdHarness::from_env();
    let (key, name) = names(&harness);
    let lock = harness.lock().await;
    let me = dlock_core::holder_description();
    let (mut child, mut out) = etcdctl(&harness, &["lock", &name]);
    let line = next_line(&mut out, Duration::from_secs(10))
        .await
        .expect("etcdctl prints the key it holds");
    let etcdctl_key = harness.lock_keys(&key).await.remove(0);
    assert_eq!(etcdctl_key.key(), line.as_bytes());
    let etcdctl_who = format!("lease {:x}", etcdctl_key.lease());

    let waiter = {
        let (lock, key) = (lock.clone(), key.clone());
        let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(30)));
        tokio::spawn(async move { lock.acquire(&key, &opts).await.expect("acquire") })
    };
    let started = Instant::now();
    let status = loop {
        let status = lock.inspect(&key).await.expect("inspect");
        if status.waiters.as_ref().is_some_and(|w| !w.is_empty()) {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{status:?}");
        sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.holders.len(), 1, "{status:?}");
    let holder = &status.holders[0];
    assert_eq!(holder.mode, dlock_core::Mode::Exclusive);
    assert_eq!(holder.who.as_deref(), Some(etcdctl_who.as_str()));
    assert_eq!(
        holder.fencing_token,
        Some(etcdctl_key.create_revision() as u64)
    );
    assert!(
        holder
            .ttl_left
            .is_some_and(|t| t <= Duration::from_secs(60))
    );
    let waiters = status.waiters.expect("waiters are shown");
    assert_eq!(waiters.len(), 1, "{waiters:?}");
    assert_eq!(waiters[0].who.as_deref(), Some(me));
    assert_eq!(
        lock.list(&key).await.expect("list"),
        std::slice::from_ref(&key)
    );

    signal(&child, "-TERM");
    let lease = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("we acquire once etcdctl unlocks")
        .expect("waiter task");
    let _ = timeout(Duration::from_secs(10), child.wait()).await;
    let ours = harness.lock_keys(&key).await.remove(0);
    assert_eq!(ours.value(), me.as_bytes(), "our key's value names us");

    let (mut child, mut out) = etcdctl(&harness, &["lock", &name, "--", "echo", "got"]);
    let started = Instant::now();
    let status = loop {
        let status = lock.inspect(&key).await.expect("inspect");
        if status.waiters.as_ref().is_some_and(|w| !w.is_empty()) {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{status:?}");
        sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(status.holders[0].who.as_deref(), Some(me));
    assert_eq!(status.holders[0].fencing_token, Some(lease.fencing_token()));
    let waiters = status.waiters.expect("waiters are shown");
    assert!(
        waiters[0]
            .who
            .as_deref()
            .is_some_and(|w| w.starts_with("lease ")),
        "{waiters:?}"
    );
    lease.release().await.expect("release");
    let line = next_line(&mut out, Duration::from_secs(5))
        .await
        .expect("etcdctl gets the lock after our release");
    assert_eq!(line, "got");
    let _ = timeout(Duration::from_secs(10), child.wait()).await;
    wait_clean(&harness, &key).await;
    assert!(lock.list(&key).await.expect("list").is_empty());
}

/// `etcdctl elect NAME PROPOSAL` leads: our candidate waits behind it and `leader()` shows
/// its proposal, with its key's create revision as the term; interrupted, etcdctl resigns
/// and our candidate leads at once, in a later term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn we_campaign_behind_etcdctl_elect() {
    let harness = EtcdHarness::from_env();
    let (key, name) = names(&harness);
    let lock: std::sync::Arc<dyn DistributedLock> = std::sync::Arc::new(harness.lock().await);
    let (mut child, mut out) = etcdctl(&harness, &["elect", &name, "etcdctl proposal"]);
    let line = next_line(&mut out, Duration::from_secs(10))
        .await
        .expect("etcdctl prints its key once elected");
    assert!(line.starts_with(&format!("{name}/")), "{line:?}");
    assert_eq!(
        next_line(&mut out, Duration::from_secs(5)).await.as_deref(),
        Some("etcdctl proposal")
    );
    let theirs = harness.lock_keys(&key).await.remove(0);
    assert_eq!(theirs.key(), line.as_bytes());
    let their_term = theirs.create_revision() as u64;

    let election = Election::new(lock.clone(), key.clone())
        .options(LockOptions::new().wait(Wait::For(Duration::from_secs(30))));
    assert_eq!(
        election.leader().await.expect("leader()"),
        Some(Leader::new("etcdctl proposal", their_term))
    );
    let waiting = {
        let election = election.clone();
        tokio::spawn(async move {
            let leading = election
                .campaign("dlock candidate")
                .await
                .expect("campaign");
            (Instant::now(), leading)
        })
    };
    sleep(Duration::from_millis(1500)).await;
    assert!(!waiting.is_finished(), "we led beside etcdctl");
    assert_eq!(harness.lock_keys(&key).await.len(), 2, "we queue behind it");
    assert_eq!(
        election.leader().await.expect("leader()"),
        Some(Leader::new("etcdctl proposal", their_term)),
        "etcdctl still leads"
    );

    let interrupted = Instant::now();
    signal(&child, "-TERM");
    let (led, leading) = timeout(Duration::from_secs(10), waiting)
        .await
        .expect("we lead once etcdctl resigns")
        .expect("candidate task");
    assert!(
        led - interrupted < Duration::from_secs(2),
        "hand-over from etcdctl took {:?}",
        led - interrupted
    );
    assert!(leading.term() > their_term, "{}", leading.term());
    assert_eq!(
        election.leader().await.expect("leader()"),
        Some(Leader::new("dlock candidate", leading.term()))
    );
    let _ = timeout(Duration::from_secs(10), child.wait()).await;
    leading.resign().await.expect("resign");
    wait_clean(&harness, &key).await;
}

/// While we lead, `etcdctl elect -l NAME` prints our key and value (and our proclaimed
/// value after), and `etcdctl elect NAME PROPOSAL` waits; once we resign it leads, and
/// both our `leader()` and the listener show its proposal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_elect_sees_and_follows_our_leader() {
    let harness = EtcdHarness::from_env();
    let (key, name) = names(&harness);
    let lock: std::sync::Arc<dyn DistributedLock> = std::sync::Arc::new(harness.lock().await);
    let election = Election::new(lock, key.clone())
        .options(LockOptions::new().wait(Wait::For(Duration::from_secs(5))));
    let mut leading = election.campaign("dlock leader").await.expect("campaign");
    let ours = harness.lock_keys(&key).await.remove(0);
    let our_key = String::from_utf8_lossy(ours.key()).into_owned();
    assert_eq!(ours.create_revision() as u64, leading.term());

    let (mut listener, mut heard) = etcdctl(&harness, &["elect", "-l", &name]);
    let mut next_leader = async || {
        let key = next_line(&mut heard, Duration::from_secs(5)).await;
        let value = next_line(&mut heard, Duration::from_secs(5)).await;
        (key.expect("a leader's key"), value.expect("its value"))
    };
    assert_eq!(
        next_leader().await,
        (our_key.clone(), "dlock leader".to_owned())
    );
    leading.proclaim("dlock, again").await.expect("proclaim");
    assert_eq!(
        next_leader().await,
        (our_key.clone(), "dlock, again".to_owned())
    );

    let (mut candidate, mut out) = etcdctl(&harness, &["elect", &name, "etcdctl next"]);
    assert_eq!(
        next_line(&mut out, Duration::from_millis(2000)).await,
        None,
        "etcdctl led while we did"
    );
    assert_eq!(harness.lock_keys(&key).await.len(), 2, "etcdctl queues");
    let resigned = Instant::now();
    let our_term = leading.term();
    leading.resign().await.expect("resign");
    let their_key = next_line(&mut out, Duration::from_secs(5))
        .await
        .expect("etcdctl leads after our resignation");
    assert!(
        resigned.elapsed() < Duration::from_secs(2),
        "etcdctl led {:?} after our resignation",
        resigned.elapsed()
    );
    assert_eq!(
        next_line(&mut out, Duration::from_secs(5)).await.as_deref(),
        Some("etcdctl next")
    );
    assert_eq!(next_leader().await, (their_key, "etcdctl next".to_owned()));
    let leader = election
        .leader()
        .await
        .expect("leader()")
        .expect("etcdctl leads");
    assert_eq!(leader.value, "etcdctl next");
    assert!(leader.term > our_term, "{leader:?} after term {our_term}");

    signal(&candidate, "-TERM");
    signal(&listener, "-TERM");
    let _ = timeout(Duration::from_secs(10), candidate.wait()).await;
    let _ = timeout(Duration::from_secs(10), listener.wait()).await;
    wait_clean(&harness, &key).await;
}
