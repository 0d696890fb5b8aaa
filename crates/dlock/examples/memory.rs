//! The in-process backend: tasks of one process take turns through `with_lock`.
//!
//! `cargo run -p dlock --example memory`

use dlock::{LockExt, LockOptions};

#[tokio::main]
async fn main() -> dlock::Result<()> {
    let lock = dlock::connect("memory://example").await?;
    let tasks = (0..3).map(|i| {
        let lock = lock.clone();
        tokio::spawn(async move {
            lock.with_lock("jobs/compact", &LockOptions::new(), |token| async move {
                println!("task {i} compacts with token {token}");
            })
            .await
        })
    });
    for task in tasks {
        task.await.expect("task")?;
    }
    Ok(())
}
