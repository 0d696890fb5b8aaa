//! What every store's tests share: the server URLs, unique names, and a key whose first
//! holder lost its lease to a second one.

#![allow(dead_code, unreachable_pub)]

use std::time::Duration;

use dlock::{Capabilities, DistributedLock, Lease, LockOptions, Wait};

/// The URL in `var` (as `scripts/backends env` exports it), or `default`.
pub fn url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// The failure for a server that cannot be used; names it and the command that starts it,
/// never its URL (which may carry a password).
pub fn unreachable(server: &str, setup: &str, error: impl std::fmt::Display) -> ! {
    panic!(
        "the {server} test server is unreachable ({error}); start it with `scripts/backends up {setup}`"
    )
}

/// A name no other test or helper uses: `fence_test_` and 16 hex digits (a valid SQL
/// identifier too).
pub fn unique_name() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("fence_test_{}", &id[..16])
}

/// A key that two clients held in turn: the first lease, taken without renewal and a short
/// ttl, ran out (as a holder paused past its ttl does) and the second client acquired it.
pub struct Handover {
    /// The lease whose ttl ran out; its holder may still believe it holds the key.
    pub stale: Lease,
    /// The lease of the client that acquired the key after that.
    pub newer: Lease,
    /// What the backend declares (its fencing strength above all).
    pub capabilities: Capabilities,
}

impl Handover {
    /// Take `key` on a first client of the dlock server at `url` and let its lease run out
    /// until a second client acquires it.
    pub async fn after_lost_lease(url: &str, server: &str, setup: &str, key: &str) -> Self {
        let first = connect(url, server, setup).await;
        let second = connect(url, server, setup).await;
        let paused = LockOptions::new()
            .ttl(Duration::from_secs(1))
            .auto_renew(false)
            .wait(Wait::For(Duration::from_secs(10)));
        let stale = first
            .acquire(key, &paused)
            .await
            .unwrap_or_else(|e| unreachable(server, setup, e));
        // The second client is let in only once the first lease has expired on the server;
        // the bound is generous for servers whose expiry counts whole seconds.
        let waiting = LockOptions::new()
            .ttl(Duration::from_secs(30))
            .wait(Wait::For(Duration::from_secs(30)));
        let newer = second
            .acquire(key, &waiting)
            .await
            .expect("the second client acquires once the first lease expired");
        Self {
            stale,
            newer,
            capabilities: second.capabilities(),
        }
    }

    /// Release the newer lease; the stale one is gone already, and dropping it only
    /// schedules a release the server refuses.
    pub async fn finish(self) {
        self.newer.release().await.expect("release the newer lease");
        drop(self.stale);
    }
}

async fn connect(url: &str, server: &str, setup: &str) -> std::sync::Arc<dyn DistributedLock> {
    dlock::connect(url)
        .await
        .unwrap_or_else(|e| unreachable(server, setup, e))
}
