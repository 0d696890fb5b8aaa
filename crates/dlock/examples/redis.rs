//! Redis: pass the fencing token to storage so a stale holder's late write is refused.
//!
//! `DLOCK_REDIS_URL=redis://127.0.0.1:6379 cargo run -p dlock --example redis`

use std::time::Duration;

use dlock::{LockOptions, Wait};

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::var("DLOCK_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let lock = dlock::connect(&url).await?;
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(10))
        .wait(Wait::For(Duration::from_secs(5)));
    let lease = lock.acquire("invoices/2026-11", &opts).await?;
    // The store must refuse older tokens: UPDATE invoices SET …, fence = $token WHERE id = …
    // AND fence < $token. The dlock-fence crate does it for SQL, Redis and etcd.
    println!("write invoices with fence {}", lease.fencing_token());
    println!("fencing here is {:?}", lock.capabilities().fencing);
    lease.release().await
}
