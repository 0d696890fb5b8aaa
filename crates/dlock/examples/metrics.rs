//! Serve dlock's figures on a Prometheus endpoint while a few tasks contend for a key.
//!
//! ```text
//! cargo run -p dlock --example metrics                       # memory://, 20 s, port 9898
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run -p dlock --example metrics
//! curl -s 127.0.0.1:9898/metrics | grep '^dlock_'            # while it runs
//! ```
//!
//! Every figure is recorded once in `dlock-core` (see `dlock::telemetry` for the table);
//! any exporter of the `metrics` crate works the same way.

use std::net::SocketAddr;
use std::time::Duration;

use dlock::{LockOptions, Wait};
use metrics_exporter_prometheus::PrometheusBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("DLOCK_URL").unwrap_or_else(|_| "memory://".into());
    let listen: SocketAddr = std::env::var("DLOCK_METRICS_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:9898".into())
        .parse()?;
    let run_for = Duration::from_secs(
        std::env::var("DLOCK_RUN_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    PrometheusBuilder::new()
        .with_http_listener(listen)
        .install()?;
    println!("serving http://{listen}/metrics for {run_for:?} ({url})");

    let lock = dlock::connect(&url).await?;
    let until = tokio::time::Instant::now() + run_for;
    let mut tasks = Vec::new();
    for task in 0..4u64 {
        let lock = lock.clone();
        tasks.push(tokio::spawn(async move {
            let opts = LockOptions::new()
                .ttl(Duration::from_secs(5))
                .wait(Wait::For(Duration::from_millis(200)));
            let mut taken = 0u64;
            while tokio::time::Instant::now() < until {
                // A busy key past 200 ms is a timeout, counted as such.
                if let Ok(lease) = lock.acquire("reports/nightly", &opts).await {
                    tokio::time::sleep(Duration::from_millis(20 + 10 * task)).await;
                    lease.release().await?;
                    taken += 1;
                }
            }
            Ok::<u64, dlock::LockError>(taken)
        }));
    }
    for (task, handle) in tasks.into_iter().enumerate() {
        println!("task {task}: {} holds", handle.await??);
    }
    Ok(())
}
