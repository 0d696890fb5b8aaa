//! The helpers of the reentrant-hold tests (`reentry`, `reentry_faults`).

use std::sync::Arc;
use std::time::Duration;

use dlock_core::{DistributedLock, Lease, LockOptions};

use super::PostgresHarness;

pub fn harness() -> PostgresHarness {
    PostgresHarness::from_env()
}

pub async fn client(h: &PostgresHarness) -> Arc<dyn DistributedLock> {
    h.must_client().await
}

pub fn owned(id: &str) -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(3)).owner(id)
}

pub fn plain() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(3))
}

pub async fn take(client: &dyn DistributedLock, key: &str, opts: &LockOptions) -> Lease {
    client
        .try_acquire(key, opts)
        .await
        .expect("try_acquire")
        .unwrap_or_else(|| panic!("{key} should be free (or the owner's)"))
}

pub async fn busy(client: &dyn DistributedLock, key: &str, why: &str) {
    let got = client
        .try_acquire(key, &plain())
        .await
        .expect("try_acquire");
    assert!(got.is_none(), "{key} should be held: {why}");
}

/// The owner rows of `key`, stale ones too.
pub async fn rows(h: &PostgresHarness, key: &str) -> Vec<String> {
    h.owner_rows(key, true).await.expect("owner rows")
}
