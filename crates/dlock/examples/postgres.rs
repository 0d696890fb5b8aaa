//! PostgreSQL: an advisory lock that the server frees at once if this process dies, and that
//! another application can take by hand from SQL.
//!
//! `cargo run -p dlock --example postgres`

use dlock::LockOptions;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::var("DLOCK_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://dlock:dlock@127.0.0.1:5432/dlock".into());
    let lock = dlock::connect(&url).await?;
    let caps = lock.capabilities();
    println!(
        "frees on disconnect: {}, fencing: {:?}",
        caps.releases_on_disconnect, caps.fencing
    );
    let lease = lock
        .acquire("billing/close-month", &LockOptions::new())
        .await?;
    println!("closing the month with token {}", lease.fencing_token());
    // Meanwhile, from psql, this would wait for us:
    //   SELECT pg_advisory_lock(1684828003, id) FROM dlock_keys WHERE name = 'billing/close-month';
    lease.release().await
}
