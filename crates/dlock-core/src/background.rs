//! Clean-up work that outlives the call that started it: the release of a dropped lease, the
//! queued node or lease of a cancelled acquire. It runs on the caller's tokio runtime and is
//! counted, so a process about to exit can wait for it with [`settle`].

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;

static PENDING: AtomicUsize = AtomicUsize::new(0);
static SETTLED: Notify = Notify::const_new();

/// Decrements the count when the clean-up ends, however it ends.
struct Counted;

impl Drop for Counted {
    fn drop(&mut self) {
        crate::telemetry::cleanup_ended();
        if PENDING.fetch_sub(1, Ordering::SeqCst) == 1 {
            SETTLED.notify_waiters();
        }
    }
}

/// Run `cleanup` in the background on the current tokio runtime, counted by [`settle`].
/// Returns `false` (and drops `cleanup`) outside a runtime: the server then frees whatever
/// it was for when its ttl or session runs out.
///
/// For backend crates; applications wait with [`settle`].
pub fn spawn_cleanup(cleanup: impl Future<Output = ()> + Send + 'static) -> bool {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return false;
    };
    PENDING.fetch_add(1, Ordering::SeqCst);
    crate::telemetry::cleanup_started();
    let counted = Counted;
    runtime.spawn(async move {
        let _counted = counted;
        cleanup.await;
    });
    true
}

/// Wait until the background clean-up started so far has finished (and whatever it
/// started in turn), at most `limit`; `true` when nothing is left. Some backends also run
/// each acquire in a task of its own, which counts until it ends.
///
/// Dropping a [`Lease`](crate::Lease) without `release`, or an `acquire` future before it
/// answers, leaves the server-side clean-up to a background task. A process that is about
/// to exit (returning from `main` stops the runtime and its tasks) calls this first, so
/// that nothing it held or queued lingers on the server until a ttl or session runs out.
///
/// ```no_run
/// # async fn demo() {
/// // ... leases dropped, acquires cancelled ...
/// if !dlock_core::settle(std::time::Duration::from_secs(5)).await {
///     eprintln!("some locks are freed by their ttl instead");
/// }
/// # }
/// ```
pub async fn settle(limit: Duration) -> bool {
    let until = tokio::time::Instant::now() + limit;
    loop {
        // Registered before the check, so a notification in between is not missed.
        let settled = SETTLED.notified();
        if PENDING.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if tokio::time::timeout_at(until, settled).await.is_err() {
            return PENDING.load(Ordering::SeqCst) == 0;
        }
    }
}
