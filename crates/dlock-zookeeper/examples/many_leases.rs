//! One client holding many leases at once: how fast it takes them, what holding them costs
//! the client's CPU, and whether any is falsely reported lost, against the server
//! `DLOCK_ZOOKEEPER_URL` names (default `zk://127.0.0.1:2181`). Run by hand, not in CI.
//!
//! ```text
//! cargo run --release -p dlock-zookeeper --example many_leases [-- KEYS TTL_SECS HOLD_SECS IN_FLIGHT]
//! ```
//! Defaults: 10000 keys, ttl 30 s, held 30 s, 128 acquires in flight. The session timeout
//! is the URL's (10 s unless the URL sets `session_timeout`).

use std::time::Duration;

use dlock_core::{DistributedLock, LockOptions};
use futures::{StreamExt, stream};
use tokio::time::Instant;

/// User plus system CPU time this process has used so far (Linux `/proc/self/stat`).
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: 11 and 12 after the state.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // The kernel's USER_HZ is 100 on every Linux this runs on.
    Some(Duration::from_millis(ticks * 10))
}

fn arg(n: usize, default: u64) -> Result<u64, std::num::ParseIntError> {
    std::env::args().nth(n).map_or(Ok(default), |a| a.parse())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DLOCK_ZOOKEEPER_URL").unwrap_or_else(|_| "zk://127.0.0.1:2181".into());
    let keys = usize::try_from(arg(1, 10_000)?)?;
    let ttl = Duration::from_secs(arg(2, 30)?);
    let hold = Duration::from_secs(arg(3, 30)?);
    let in_flight = usize::try_from(arg(4, 128)?)?;
    let lock = dlock_zookeeper::from_url(&url).await?;
    println!(
        "{keys} keys, ttl {ttl:?}, held {hold:?}, {in_flight} acquires in flight, session timeout {:?}",
        lock.backend().session_timeout()
    );
    let prefix = format!("many-leases-{}", std::process::id());
    let opts = LockOptions::new().ttl(ttl);

    let started = Instant::now();
    let taken: Vec<_> = stream::iter(0..keys)
        .map(|i| {
            let (lock, key, opts) = (&lock, format!("{prefix}/{i}"), &opts);
            async move { lock.try_acquire(&key, opts).await }
        })
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let took = started.elapsed();
    let mut leases = Vec::with_capacity(keys);
    let mut failed = 0;
    for outcome in taken {
        match outcome {
            Ok(Some(lease)) => leases.push(lease),
            Ok(None) => failed += 1,
            Err(e) => {
                failed += 1;
                eprintln!("acquire failed: {e}");
            }
        }
    }
    println!(
        "acquired {} in {took:.2?}: {:.0}/s ({failed} failed)",
        leases.len(),
        leases.len() as f64 / took.as_secs_f64()
    );

    let (cpu0, wall0) = (cpu_time(), Instant::now());
    tokio::time::sleep(hold).await;
    let (cpu1, wall) = (cpu_time(), wall0.elapsed());
    if let (Some(a), Some(b)) = (cpu0, cpu1) {
        println!(
            "client CPU while holding: {:.2} % of a core",
            (b - a).as_secs_f64() / wall.as_secs_f64() * 100.0
        );
    }
    let lost: Vec<_> = leases.iter().filter(|l| l.is_lost()).collect();
    println!("lost while held: {}", lost.len());
    if let Some(first) = lost.first() {
        println!("  e.g. {}: {}", first.key(), first.lost().await);
    }

    let started = Instant::now();
    let released: Vec<_> = stream::iter(leases)
        .map(|lease| lease.release())
        .buffer_unordered(in_flight)
        .collect()
        .await;
    let errors: Vec<_> = released.iter().filter_map(|r| r.as_ref().err()).collect();
    println!(
        "released {} in {:.2?} ({} failed{})",
        released.len(),
        started.elapsed(),
        errors.len(),
        errors
            .first()
            .map(|e| format!(", e.g. {e}"))
            .unwrap_or_default()
    );
    Ok(())
}
