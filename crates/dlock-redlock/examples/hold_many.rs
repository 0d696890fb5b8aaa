//! Hold many keys at once and report what keeping them alive costs (a by-hand measurement,
//! not run in CI).
//!
//! ```text
//! cargo run --release -p dlock-redlock --example hold_many -- URL [KEYS] [TTL_S] [HOLD_S]
//! ```
//!
//! `URL` is `redis://…` or `redlock://…` (defaults: 10000 keys, ttl 30 s, held 30 s).
//! Prints the acquire rate, this process's CPU while holding (user + system time over wall
//! time, all threads), leases lost, failed releases, the release time, and the commands per
//! second the server(s) processed while holding (`INFO stats`, so other clients of the same
//! servers count too).

use std::time::{Duration, Instant};

use dlock_core::{DistributedLock, LockOptions};
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args
        .next()
        .ok_or("usage: hold_many URL [KEYS] [TTL_S] [HOLD_S]")?;
    let keys: usize = args.next().map_or(Ok(10_000), |s| s.parse())?;
    let ttl = Duration::from_secs_f64(args.next().map_or(Ok(30.0), |s| s.parse())?);
    let hold = Duration::from_secs_f64(args.next().map_or(Ok(30.0), |s| s.parse())?);

    let servers = server_urls(&url);
    let lock: Box<dyn DistributedLock> = if url.starts_with("redlock") {
        Box::new(dlock_redlock::from_url(&url).await?)
    } else {
        Box::new(dlock_redis::from_url(&url).await?)
    };
    let opts = LockOptions::new().ttl(ttl);
    let run = format!("hold_many/{}", std::process::id());

    let started = Instant::now();
    let leases: Vec<_> = futures::stream::iter(0..keys)
        .map(|i| {
            let (lock, opts, key) = (&lock, &opts, format!("{run}/{i}"));
            async move { lock.try_acquire(&key, opts).await }
        })
        .buffer_unordered(256)
        .collect()
        .await;
    let acquired = started.elapsed();
    let leases: Vec<_> = leases
        .into_iter()
        .map(|l| l.map(|l| l.expect("fresh keys are free")))
        .collect::<Result<_, _>>()?;
    println!(
        "acquired {keys} keys in {:.2} s ({:.0}/s)",
        acquired.as_secs_f64(),
        keys as f64 / acquired.as_secs_f64()
    );

    let commands_before = commands_processed(&servers).await?;
    let cpu_before = cpu_seconds()?;
    let held_since = Instant::now();
    tokio::time::sleep(hold).await;
    let wall = held_since.elapsed().as_secs_f64();
    let cpu = cpu_seconds()? - cpu_before;
    let commands = commands_processed(&servers).await?;
    let (commands, requests) = (
        commands.0 - commands_before.0,
        commands.1 - commands_before.1,
    );
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    println!(
        "held {:.1} s at ttl {:?}: client CPU {:.2} % of a core, lost {lost}, \
         server: {:.0} commands/s ({:.0} EVALSHA/s)",
        wall,
        ttl,
        100.0 * cpu / wall,
        commands as f64 / wall,
        requests as f64 / wall,
    );

    let started = Instant::now();
    let failed = futures::stream::iter(leases)
        .map(|lease| lease.release())
        .buffer_unordered(256)
        .filter(|r| std::future::ready(r.is_err()))
        .count()
        .await;
    println!(
        "released in {:.2} s, failed releases {failed}",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `redis://host:port` of every server the URL names.
fn server_urls(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let hosts = rest.split(['/', '?']).next().unwrap_or_default();
    let hosts = hosts.rsplit_once('@').map_or(hosts, |(_, h)| h);
    hosts.split(',').map(|h| format!("redis://{h}")).collect()
}

/// The servers' `total_commands_processed` (commands run inside scripts count too) and
/// `EVALSHA` calls (requests), summed.
async fn commands_processed(servers: &[String]) -> Result<(u64, u64), Box<dyn std::error::Error>> {
    let (mut commands, mut requests) = (0, 0);
    for url in servers {
        let client = redis::Client::open(url.as_str())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .arg("commandstats")
            .query_async(&mut conn)
            .await?;
        commands += info
            .lines()
            .find_map(|l| l.strip_prefix("total_commands_processed:"))
            .ok_or("no total_commands_processed in INFO")?
            .trim()
            .parse::<u64>()?;
        requests += info
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(Ok(0), str::parse::<u64>)?;
    }
    Ok((commands, requests))
}

/// This process's user + system CPU time, in seconds (Linux: /proc/self/stat, fields 14
/// and 15, in clock ticks of 1/100 s).
fn cpu_seconds() -> Result<f64, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let after_name = stat.rsplit(')').next().ok_or("bad /proc/self/stat")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Field 3 (state) is fields[0] here, so utime (14) and stime (15) are 11 and 12.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    Ok(ticks as f64 / 100.0)
}
