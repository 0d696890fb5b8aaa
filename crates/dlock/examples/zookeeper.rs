//! ZooKeeper: stop the work as soon as the session holding the lock is lost.
//!
//! `cargo run -p dlock --example zookeeper`

use std::time::Duration;

use dlock::LockOptions;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::var("DLOCK_ZK_URL")
        .unwrap_or_else(|_| "zk://127.0.0.1:2181?session_timeout=10s".into());
    let lock = dlock::connect(&url).await?;
    let lease = lock.acquire("deploy/prod", &LockOptions::new()).await?;
    tokio::select! {
        reason = lease.lost() => {
            eprintln!("stopped the deploy: {reason}");
            return Ok(());
        }
        _ = tokio::time::sleep(Duration::from_secs(2)) => println!("deployed under czxid {}", lease.fencing_token()),
    }
    lease.release().await
}
