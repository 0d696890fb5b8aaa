//! Redlock: one lock over five independent Redis servers, held while a majority holds it.
//!
//! `cargo run -p dlock --example redlock` (nodes on 127.0.0.1:7001–7005 by default)

use dlock::LockOptions;

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let url = std::env::var("DLOCK_REDLOCK_URL").unwrap_or_else(|_| {
        "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005"
            .into()
    });
    let lock = dlock::connect(&url).await?;
    match lock
        .try_acquire("reports/nightly", &LockOptions::new())
        .await?
    {
        Some(lease) => {
            println!("a majority granted it; token {}", lease.fencing_token());
            lease.release().await?;
        }
        None => println!("another client holds a majority"),
    }
    Ok(())
}
