//! By hand, not in CI: hold many keys from one client and report the acquire rate, the
//! client's CPU while holding, false losses, failed releases and the release time.
//!
//! `DLOCK_ETCD_URL=etcd://127.0.0.1:2379 cargo run --release -p dlock-etcd --example hold_many -- 10000 30 30`
//! (keys, ttl in seconds, hold in seconds).

use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::{DistributedLock, LockOptions};
use futures::future::join_all;

/// utime + stime of this process, in seconds.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks: f64 =
        fields[11].parse::<f64>().unwrap_or(0.0) + fields[12].parse::<f64>().unwrap_or(0.0);
    ticks / 100.0
}

#[tokio::main]
async fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a number"))
        .collect();
    let (keys, ttl, hold) = (args[0] as usize, args[1], args[2]);
    let url = std::env::var("DLOCK_ETCD_URL").expect("DLOCK_ETCD_URL");
    let lock = Arc::new(dlock_etcd::from_url(&url).await.expect("connect"));
    let opts = LockOptions::new().ttl(Duration::from_secs(ttl));
    let base = format!("dlock-hold-many-{}", std::process::id());
    let gate = Arc::new(tokio::sync::Semaphore::new(128));
    let started = Instant::now();
    let leases = join_all((0..keys).map(|i| {
        let (lock, gate, opts, key) = (lock.clone(), gate.clone(), opts, format!("{base}/{i}"));
        async move {
            let _permit = gate.acquire().await.expect("semaphore");
            lock.try_acquire(&key, &opts)
                .await
                .expect("acquire")
                .expect("free")
        }
    }))
    .await;
    let took = started.elapsed();
    println!(
        "acquired {keys} in {took:.2?}: {:.0}/s",
        keys as f64 / took.as_secs_f64()
    );
    let (cpu0, wall0) = (cpu_seconds(), Instant::now());
    tokio::time::sleep(Duration::from_secs(hold)).await;
    let cpu = (cpu_seconds() - cpu0) / wall0.elapsed().as_secs_f64();
    let lost = leases.iter().filter(|l| l.is_lost()).count();
    println!(
        "holding {hold} s at ttl {ttl} s: {:.1} % of a core, {lost} lost",
        cpu * 100.0
    );
    let started = Instant::now();
    let failed = join_all(leases.into_iter().map(|l| async move {
        let released = l.release().await;
        if let Err(e) = &released {
            eprintln!("release: {e}");
        }
        released.is_err()
    }))
    .await
    .into_iter()
    .filter(|f| *f)
    .count();
    println!("released in {:.2?}, {failed} failed", started.elapsed());
}
