//! Measure the PostgreSQL backend's latencies against the server `DLOCK_POSTGRES_URL`
//! names (default `postgres://dlock:dlock@127.0.0.1:5432/dlock`), next to the server's own
//! round trip (`SELECT 1` on a plain sqlx connection) and a raw
//! `pg_advisory_lock` + `pg_advisory_unlock` pair on one connection.
//!
//! ```text
//! cargo run --release -p dlock-postgres --example postgres_latency [-- ROUNDS]
//! ```

use std::time::Duration;

use dlock_core::{DistributedLock, LockOptions, Wait};
use sqlx::{Connection, Executor};
use tokio::time::Instant;

fn percentiles(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let at = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    format!(
        "p50 {:>8.3} ms   p99 {:>8.3} ms",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DLOCK_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://dlock:dlock@127.0.0.1:5432/dlock".to_owned());
    let rounds: usize = std::env::args().nth(1).map_or(Ok(500), |n| n.parse())?;
    let prefix = format!("latency-{}/", std::process::id());
    let opts = LockOptions::new().ttl(Duration::from_secs(30));

    let mut raw = sqlx::PgConnection::connect(&url).await?;
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        raw.execute("SELECT 1").await?;
        samples.push(t.elapsed());
    }
    println!("server round trip (SELECT 1)    {}", percentiles(samples));
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        raw.execute("SELECT pg_advisory_lock(1, 1)").await?;
        raw.execute("SELECT pg_advisory_unlock(1, 1)").await?;
        samples.push(t.elapsed());
    }
    println!("raw lock + unlock (2 trips)     {}", percentiles(samples));

    let a = dlock_postgres::from_url(&url).await?;
    let b = dlock_postgres::from_url(&url).await?;
    let key = format!("{prefix}k");

    let (mut take, mut release) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let lease = a.try_acquire(&key, &opts).await?.expect("free");
        take.push(t.elapsed());
        let t = Instant::now();
        lease.release().await?;
        release.push(t.elapsed());
    }
    println!("try_acquire, free               {}", percentiles(take));
    println!("release, no waiter              {}", percentiles(release));

    // Inspecting a held key, and listing the held keys under the prefix, from another
    // client: one statement each, reading pg_locks (and pg_stat_activity).
    let lease = a.try_acquire(&key, &opts).await?.expect("free");
    let (mut looked, mut listed) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        b.inspect(&key).await?;
        looked.push(t.elapsed());
        let t = Instant::now();
        b.list(&prefix).await?;
        listed.push(t.elapsed());
    }
    lease.release().await?;
    println!("inspect, key held               {}", percentiles(looked));
    println!("list, one key held              {}", percentiles(listed));

    // Shared holds: a first reader, and a second one on the same holder connection (its
    // re-entry first checks pg_locks for a waiting writer).
    let read = opts.shared();
    let (mut first, mut again) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let one = a.try_acquire(&key, &read).await?.expect("free");
        first.push(t.elapsed());
        let t = Instant::now();
        let two = a.try_acquire(&key, &read).await?.expect("readers share");
        again.push(t.elapsed());
        one.release().await?;
        two.release().await?;
    }
    println!("try_acquire shared, free        {}", percentiles(first));
    println!("try_acquire shared, re-entry    {}", percentiles(again));

    let lease = a.try_acquire(&key, &opts).await?.expect("free");
    let (mut busy, mut extend) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        assert!(b.try_acquire(&key, &opts).await?.is_none());
        busy.push(t.elapsed());
        let t = Instant::now();
        lease.extend(Duration::from_secs(30)).await?;
        extend.push(t.elapsed());
    }
    println!("try_acquire, held               {}", percentiles(busy));
    println!("extend                          {}", percentiles(extend));
    lease.release().await?;

    // Hand-off: a waiter is blocked on the row; time from release() being called until the
    // waiter's acquire returns.
    let mut handoff = Vec::new();
    let mut holder = a.try_acquire(&key, &opts).await?.expect("free");
    let (mut holder_client, mut waiter_client) = (&a, &b);
    for _ in 0..rounds.min(200) {
        let waiting = {
            let (w, key) = (waiter_client.clone(), key.clone());
            let opts = opts.wait(Wait::For(Duration::from_secs(10)));
            tokio::spawn(async move { w.acquire(&key, &opts).await.map(|l| (Instant::now(), l)) })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released = Instant::now();
        holder.release().await?;
        let (acquired, lease) = waiting.await??;
        handoff.push(acquired - released);
        holder = lease;
        std::mem::swap(&mut holder_client, &mut waiter_client);
    }
    holder.release().await?;
    println!("hand-off (release -> waiter)    {}", percentiles(handoff));
    println!(
        "wake-ups counted                {}",
        a.stats().wakeups + b.stats().wakeups
    );

    // A 300 ms deadline on a held key: how long until Timeout (the server's lock_timeout
    // ends the wait).
    let lease = a.try_acquire(&key, &opts).await?.expect("free");
    let mut timeouts = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let err = b
            .acquire(&key, &opts.wait(Wait::For(Duration::from_millis(300))))
            .await
            .expect_err("held");
        assert_eq!(err.kind(), dlock_core::ErrorKind::Timeout);
        timeouts.push(t.elapsed());
    }
    lease.release().await?;
    println!("300 ms deadline -> Timeout      {}", percentiles(timeouts));

    // A holder's session ends on the server (as when its process dies): time until a
    // waiter holds the key.
    let mut freed = Vec::new();
    for _ in 0..20 {
        let lease = a.try_acquire(&key, &opts).await?.expect("free");
        let holder: i32 = sqlx::query_scalar(
            "SELECT l.pid FROM pg_locks l JOIN dlock_keys k ON l.locktype = 'advisory' \
             AND l.objsubid = 2 AND l.objid = k.id::oid AND l.granted WHERE k.name = $1",
        )
        .bind(&key)
        .fetch_one(&mut raw)
        .await?;
        let waiting = {
            let (b, key) = (b.clone(), key.clone());
            let opts = opts.wait(Wait::For(Duration::from_secs(10)));
            tokio::spawn(async move { b.acquire(&key, &opts).await.map(|l| (Instant::now(), l)) })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let killed = Instant::now();
        raw.execute(format!("SELECT pg_terminate_backend({holder})").as_str())
            .await?;
        let (acquired, newer) = waiting.await??;
        freed.push(acquired - killed);
        newer.release().await?;
        assert!(lease.release().await.is_err(), "the killed lease is gone");
    }
    println!("holder's session killed -> held {}", percentiles(freed));
    elections(&a, &b, &format!("{prefix}e"), rounds).await?;
    reentry(&a, &b, &format!("{prefix}r"), rounds).await?;
    permits(&a, &b, &format!("{prefix}p"), rounds, &mut raw).await
}

/// A reentrant hold: the first entry, a re-entry in the same client and in another, their
/// releases (the count down), the last release in the first client (the unlock too), and
/// how long a plain waiter takes to get the key after the owner's last release in the other
/// client (the notification to the first client, its check, its unlock, the grant).
async fn reentry(
    a: &dlock_postgres::PostgresLock,
    b: &dlock_postgres::PostgresLock,
    key: &str,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .owner("job-7");
    let plain = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Wait::For(Duration::from_secs(10)));
    let mut samples: [Vec<Duration>; 7] = Default::default();
    for _ in 0..rounds {
        let t = Instant::now();
        let first = a.try_acquire(key, &opts).await?.expect("free");
        samples[0].push(t.elapsed());
        let t = Instant::now();
        let again = a.try_acquire(key, &opts).await?.expect("re-entry");
        samples[1].push(t.elapsed());
        let t = Instant::now();
        let other = b.try_acquire(key, &opts).await?.expect("re-entry");
        samples[2].push(t.elapsed());
        let t = Instant::now();
        again.release().await?;
        samples[3].push(t.elapsed());
        let t = Instant::now();
        other.release().await?;
        samples[4].push(t.elapsed());
        let t = Instant::now();
        first.release().await?;
        samples[5].push(t.elapsed());
        // The last release in the other client: a plain waiter of the first client.
        let first = a.try_acquire(key, &opts).await?.expect("free");
        let other = b.try_acquire(key, &opts).await?.expect("re-entry");
        first.release().await?;
        let waiter = {
            let (a, key) = (a.clone(), key.to_owned());
            tokio::spawn(async move {
                let lease = a.acquire(&key, &plain).await;
                (Instant::now(), lease)
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let t = Instant::now();
        other.release().await?;
        let (at, lease) = waiter.await?;
        samples[6].push(at.duration_since(t));
        lease?.release().await?;
    }
    let names = [
        "owner try_acquire, key free     ",
        "re-entry, same client           ",
        "re-entry, another client        ",
        "release, count down (first)     ",
        "release, count down (another)   ",
        "last release, first client      ",
        "last release, other -> waiter   ",
    ];
    for (name, samples) in names.iter().zip(samples) {
        println!("{name}{}", percentiles(samples));
    }
    Ok(())
}

/// An election: a campaign on a free key, a proclaim, `leader()` from another client, a
/// resignation, and how long an observer takes to see a proclaim (the notification, then
/// its read of the leader).
async fn elections(
    a: &dlock_postgres::PostgresLock,
    b: &dlock_postgres::PostgresLock,
    key: &str,
    rounds: usize,
) -> Result<(), Box<dyn std::error::Error>> {
    use dlock_core::Election;
    use futures::StreamExt;
    let opts = LockOptions::new().ttl(Duration::from_secs(30));
    let mine = Election::new(std::sync::Arc::new(a.clone()), key).options(opts);
    let theirs = Election::new(std::sync::Arc::new(b.clone()), key).options(opts);
    let (mut campaign, mut proclaim, mut leader, mut resign) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let mut leading = mine.campaign("10.0.0.7:8080").await?;
        campaign.push(t.elapsed());
        let t = Instant::now();
        leading.proclaim("10.0.0.7:8081").await?;
        proclaim.push(t.elapsed());
        let t = Instant::now();
        theirs.leader().await?.expect("a leader");
        leader.push(t.elapsed());
        let t = Instant::now();
        leading.resign().await?;
        resign.push(t.elapsed());
    }
    println!("campaign, key free              {}", percentiles(campaign));
    println!("proclaim                        {}", percentiles(proclaim));
    println!("leader(), key led               {}", percentiles(leader));
    println!("resign                          {}", percentiles(resign));

    let mut changes = theirs.observe();
    changes.next().await.expect("the leader now")?;
    let mut leading = mine.campaign("v0").await?;
    changes.next().await.expect("the first leader")?;
    let mut seen = Vec::new();
    for i in 1..=rounds.min(200) {
        let t = Instant::now();
        leading.proclaim(&format!("v{i}")).await?;
        changes.next().await.expect("the proclaim")?;
        seen.push(t.elapsed());
    }
    leading.resign().await?;
    println!("proclaim -> observer sees it    {}", percentiles(seen));
    Ok(())
}

/// Permits of a semaphore of 4: tries on free and taken slots, the hand-off from a release
/// (its notification) to a waiter, and from an ended session (the re-check) to a waiter.
async fn permits(
    a: &dlock_postgres::PostgresLock,
    b: &dlock_postgres::PostgresLock,
    key: &str,
    rounds: usize,
    raw: &mut sqlx::PgConnection,
) -> Result<(), Box<dyn std::error::Error>> {
    let opts = LockOptions::new().ttl(Duration::from_secs(30)).permits(4);
    let (mut first, mut last, mut busy) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let t = Instant::now();
        let mut held = vec![a.try_acquire(key, &opts).await?.expect("free")];
        first.push(t.elapsed());
        held.push(a.try_acquire(key, &opts).await?.expect("free"));
        held.push(a.try_acquire(key, &opts).await?.expect("free"));
        let t = Instant::now();
        held.push(a.try_acquire(key, &opts).await?.expect("free"));
        last.push(t.elapsed());
        let t = Instant::now();
        assert!(b.try_acquire(key, &opts).await?.is_none());
        busy.push(t.elapsed());
        for lease in held {
            lease.release().await?;
        }
    }
    println!("permit try, slot 0 free         {}", percentiles(first));
    println!("permit try, only slot 3 free    {}", percentiles(last));
    println!("permit try, all 4 taken         {}", percentiles(busy));

    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(a.try_acquire(key, &opts).await?.expect("free"));
    }
    let (mut handoff, mut ended) = (Vec::new(), Vec::new());
    for round in 0..rounds.min(200) {
        let waiting = {
            let (b, key) = (b.clone(), key.to_owned());
            let opts = opts.wait(Wait::For(Duration::from_secs(10)));
            tokio::spawn(async move { b.acquire(&key, &opts).await.map(|l| (Instant::now(), l)) })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let released = Instant::now();
        if round < 10 {
            // The session of a holder connection (of a's) ends: no notification.
            let holder: i32 = sqlx::query_scalar(
                "SELECT l.pid FROM pg_locks l JOIN dlock_keys k ON l.locktype = 'advisory' \
                 AND l.objsubid = 2 AND l.objid = k.id::oid AND l.granted WHERE k.name = $1 \
                 LIMIT 1",
            )
            .bind(key)
            .fetch_one(&mut *raw)
            .await?;
            raw.execute(format!("SELECT pg_terminate_backend({holder})").as_str())
                .await?;
            let (acquired, lease) = waiting.await??;
            ended.push(acquired - released);
            lease.release().await?;
            for lease in held.drain(..) {
                let _ = lease.release().await;
            }
            for _ in 0..4 {
                held.push(a.try_acquire(key, &opts).await?.expect("free"));
            }
            continue;
        }
        held.remove(0).release().await?;
        let (acquired, lease) = waiting.await??;
        handoff.push(acquired - released);
        lease.release().await?;
        held.push(a.try_acquire(key, &opts).await?.expect("free"));
    }
    for lease in held {
        lease.release().await?;
    }
    println!("permit hand-off (release)       {}", percentiles(handoff));
    println!("permit session killed -> held   {}", percentiles(ended));
    Ok(())
}
