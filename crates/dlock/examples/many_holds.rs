//! One client holding many keys at once: acquire rate, client CPU while holding, false
//! losses, failed releases and release time. A measurement by hand, not a test.
//!
//! `cargo run --release -p dlock --example many_holds -- URL [KEYS] [TTL_SECS] [HOLD_SECS]`
//! (defaults 10000 keys, ttl 30 s, held 30 s), e.g. with `mysql://…?mode=named` or
//! `postgres://…`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock::{DistributedLock, Lease, LockOptions};
use futures::future::join_all;

/// Acquires and releases in flight at once.
const CONCURRENCY: usize = 16;

/// This process's user + system CPU time (Linux `/proc/self/stat`, clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    // utime and stime are fields 14 and 15 of the line, 11 and 12 after the name.
    Duration::from_millis((ticks(11) + ticks(12)) * 10)
}

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let url = args
        .get(1)
        .expect("usage: many_holds URL [KEYS] [TTL_SECS] [HOLD_SECS]");
    let arg = |i: usize, default: u64| {
        args.get(i)
            .map_or(default, |a| a.parse().expect("a number"))
    };
    let (keys, ttl, hold) = (arg(2, 10_000), arg(3, 30), arg(4, 30));
    let lock: Arc<dyn DistributedLock> = dlock::connect(url).await?;
    let opts = LockOptions::new().ttl(Duration::from_secs(ttl));
    let run = std::process::id();
    let names: Vec<String> = (0..keys).map(|i| format!("many-{run}/{i}")).collect();

    let started = Instant::now();
    let mut leases: Vec<Lease> = Vec::with_capacity(names.len());
    let mut refused = None;
    for chunk in names.chunks(CONCURRENCY) {
        for taken in join_all(chunk.iter().map(|k| lock.try_acquire(k, &opts))).await {
            match taken {
                Ok(Some(lease)) => leases.push(lease),
                Ok(None) => refused = refused.or(Some("a key was busy".to_owned())),
                Err(e) => refused = refused.or(Some(e.to_string())),
            }
        }
        if refused.is_some() {
            break;
        }
    }
    let took = started.elapsed();
    println!(
        "acquired {} of {keys} in {took:.2?}: {:.0}/s",
        leases.len(),
        leases.len() as f64 / took.as_secs_f64()
    );
    if let Some(why) = &refused {
        println!("stopped: {why}");
    }

    let (cpu0, wall0) = (cpu_time(), Instant::now());
    tokio::time::sleep(Duration::from_secs(hold)).await;
    let (cpu, wall) = (cpu_time() - cpu0, wall0.elapsed());
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    println!(
        "held {} keys at ttl {ttl} s for {wall:.1?}: client CPU {:.2} % of a core, {lost} lost",
        leases.len(),
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );

    let started = Instant::now();
    let mut failed = 0;
    let mut first_failure = None;
    let mut leases = leases.into_iter();
    loop {
        let chunk: Vec<Lease> = leases.by_ref().take(CONCURRENCY).collect();
        if chunk.is_empty() {
            break;
        }
        for released in join_all(chunk.into_iter().map(Lease::release)).await {
            if let Err(e) = released {
                failed += 1;
                first_failure = first_failure.or(Some(e.to_string()));
            }
        }
    }
    println!(
        "released in {:.2?}, {failed} failed{}",
        started.elapsed(),
        first_failure.map_or(String::new(), |e| format!(" (first: {e})"))
    );
    Ok(())
}
