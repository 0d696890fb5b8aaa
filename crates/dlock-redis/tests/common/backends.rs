//! `scripts/backends` from the tests that change a topology's roles (a failover, a master
//! stopped and resumed), and the round trip those tests make around such a change.

use std::path::PathBuf;

use dlock_core::{DistributedLock, LockOptions};
use dlock_redis::RedisLock;

/// The path of `scripts/backends`.
pub fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/backends")
}

/// Run `scripts/backends ARGS…` (bounded by its own TIMEOUT); its standard output, trimmed
/// (`failover GROUP` prints the new master's address). A failure names the command to start
/// the servers of the last argument, the group.
pub async fn run(args: &[&str]) -> String {
    let owned: Vec<String> = args.iter().map(|&arg| arg.to_owned()).collect();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(script()).args(owned).output()
    })
    .await
    .expect("the scripts/backends task")
    .unwrap_or_else(|e| panic!("cannot run {} {args:?}: {e}", script().display()));
    let group = args.last().copied().unwrap_or_default();
    assert!(
        out.status.success(),
        "scripts/backends {} failed ({}): {}{}\n  start the servers with: scripts/backends up \
         {group}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Take the free `key` and release it at once; a failure names `when` (`before the
/// failover`). Before a change it also makes the client learn the topology and connect.
pub async fn acquire_and_release(lock: &RedisLock, key: &str, opts: &LockOptions, when: &str) {
    lock.try_acquire(key, opts)
        .await
        .unwrap_or_else(|e| panic!("acquire {when}: {e}"))
        .expect("the key is free")
        .release()
        .await
        .unwrap_or_else(|e| panic!("release {when}: {e}"));
}
