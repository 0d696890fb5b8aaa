//! MySQL / MariaDB: a row lock that the server frees at once if this process dies.
//!
//! `cargo run -p dlock --example mysql`

use dlock::LockOptions;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::var("DLOCK_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://dlock:dlock@127.0.0.1:3306/dlock?table=dlock_locks".into());
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
    lease.release().await
}
