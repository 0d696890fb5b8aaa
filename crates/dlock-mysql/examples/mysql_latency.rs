//! Measure the MySQL / MariaDB backend's latencies against the server `DLOCK_MYSQL_URL`
//! names (default `mysql://dlock:dlock@127.0.0.1:3306/dlock`), next to the server's own
//! round trip (`SELECT 1` on a plain sqlx connection).
//!
//! ```text
//! cargo run --release -p dlock-mysql --example mysql_latency [-- ROUNDS]
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
    let url = std::env::var("DLOCK_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://dlock:dlock@127.0.0.1:3306/dlock".to_owned());
    let rounds: usize = std::env::args().nth(1).map_or(Ok(500), |n| n.parse())?;
    let prefix = format!("latency-{}/", std::process::id());
    let opts = LockOptions::new().ttl(Duration::from_secs(30));

    let mut raw = sqlx::MySqlConnection::connect(&url).await?;
    let mut samples = Vec::new();
    for _ in 0..rounds {
        let t = Instant::now();
        raw.execute("SELECT 1").await?;
        samples.push(t.elapsed());
    }
    println!("server round trip (SELECT 1)    {}", percentiles(samples));

    let a = dlock_mysql::from_url(&url).await?;
    let b = dlock_mysql::from_url(&url).await?;
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

    // A 300 ms deadline on a held key: how long until Timeout (the waiting statement is
    // killed on the server before the answer).
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
        let holder: u64 = sqlx::query_scalar(
            "SELECT holder FROM dlock_locks_fence ORDER BY granted_at DESC LIMIT 1",
        )
        .fetch_one(&mut raw)
        .await?;
        let waiting = {
            let (b, key) = (b.clone(), key.clone());
            let opts = opts.wait(Wait::For(Duration::from_secs(10)));
            tokio::spawn(async move { b.acquire(&key, &opts).await.map(|l| (Instant::now(), l)) })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let killed = Instant::now();
        raw.execute(format!("KILL {holder}").as_str()).await?;
        let (acquired, newer) = waiting.await??;
        freed.push(acquired - killed);
        newer.release().await?;
        assert!(lease.release().await.is_err(), "the killed lease is gone");
    }
    println!("holder's session killed -> held {}", percentiles(freed));
    Ok(())
}
