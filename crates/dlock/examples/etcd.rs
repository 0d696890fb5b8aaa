//! etcd: the same lock as `etcdctl lock dlock/cron` (the default key prefix is `dlock/`) —
//! run this while `etcdctl lock dlock/cron` holds it and it waits.
//!
//! `cargo run -p dlock --example etcd`

use std::time::Duration;

use dlock::{ErrorKind, LockOptions, Wait};

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::var("DLOCK_ETCD_URL").unwrap_or_else(|_| "etcd://127.0.0.1:2379".into());
    let lock = dlock::connect(&url).await?;
    let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(3)));
    match lock.acquire("cron", &opts).await {
        Ok(lease) => {
            println!("holding `cron`, revision {}", lease.fencing_token());
            lease.release().await
        }
        Err(e) if e.kind() == ErrorKind::Timeout => {
            println!("`cron` is held (by etcdctl lock or another dlock client)");
            Ok(())
        }
        Err(e) => Err(e),
    }
}
