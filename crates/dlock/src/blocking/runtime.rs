//! The background runtime a blocking client owns: one worker thread that runs renewals,
//! lost signals and background releases while callers block on their own threads.

use std::future::Future;
use std::time::Duration;

use tokio::runtime::{EnterGuard, Handle, Runtime};

use crate::{LockError, Result};

/// The `backend` of the [`LockError::Unsupported`] that a blocking call returns inside an
/// async context.
pub const ORIGIN: &str = "dlock::blocking";

/// How long dropping the last client (or lease) waits for background clean-up
/// ([`settle`](crate::settle)) before it stops the runtime: 5 s.
pub const SHUTDOWN_SETTLE: Duration = Duration::from_secs(5);

/// How long the runtime's shutdown then waits for its thread to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(1);

/// A tokio runtime with one worker thread. Callers block in [`Background::run`], which
/// polls the call's future on the caller's thread while the worker drives I/O, timers and
/// the spawned tasks (watchdogs, background releases).
#[derive(Debug)]
pub(super) struct Background {
    /// `None` only while dropping.
    runtime: Option<Runtime>,
}

impl Background {
    /// Start the runtime (refused inside an async context, like every blocking call).
    pub(super) fn start() -> Result<std::sync::Arc<Self>> {
        check_blocking_allowed()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("dlock-blocking")
            .enable_all()
            .build()
            .map_err(|e| LockError::unavailable(ORIGIN, "connect", e))?;
        Ok(std::sync::Arc::new(Self {
            runtime: Some(runtime),
        }))
    }

    fn runtime(&self) -> &Runtime {
        self.runtime
            .as_ref()
            .expect("the runtime is present until dropped")
    }

    /// Block the calling thread on `future`, or refuse inside an async context.
    pub(super) fn run<F: Future>(&self, future: F) -> Result<F::Output> {
        check_blocking_allowed()?;
        Ok(self.runtime().block_on(future))
    }

    /// Enter the runtime's context, so that what a drop spawns runs on this runtime.
    pub(super) fn enter(&self) -> EnterGuard<'_> {
        self.runtime().enter()
    }

    /// `Ok` when the current thread may block (it is in no tokio runtime's context).
    pub(super) fn check_blocking_allowed(&self) -> Result<()> {
        check_blocking_allowed()
    }
}

/// `Ok` when the current thread may block; the refusal every blocking call returns
/// otherwise. A thread inside a runtime's context (a task, `spawn_blocking`, an
/// `enter` guard) is refused: tokio gives no way to tell the places that may block apart
/// from the ones that would stall the runtime.
fn check_blocking_allowed() -> Result<()> {
    match Handle::try_current() {
        Err(_) => Ok(()),
        Ok(_) => Err(LockError::Unsupported {
            backend: ORIGIN,
            what: "a blocking call inside an async runtime (use the async API there: dlock::connect)",
        }),
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let mut runtime = StopOnDrop(Some(runtime));
        let mut finish = move || {
            let runtime = runtime.0.take().expect("taken once");
            if !runtime.block_on(crate::settle(SHUTDOWN_SETTLE)) {
                tracing::warn!(
                    "dlock::blocking: background clean-up did not finish within {SHUTDOWN_SETTLE:?}; \
                     what it was releasing frees when its ttl (or session) runs out"
                );
            }
            runtime.shutdown_timeout(SHUTDOWN_GRACE);
        };
        if check_blocking_allowed().is_ok() {
            finish();
            return;
        }
        // Blocking here would stall the async caller: wait on a thread of our own.
        let spawned = std::thread::Builder::new()
            .name("dlock-blocking-stop".to_owned())
            .spawn(finish);
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "dlock::blocking: cannot start a thread to settle; stopping at once");
        }
    }
}

/// Stops a runtime without blocking if it is dropped unused (a thread that could not be
/// started): dropping a `Runtime` inside an async context would panic.
struct StopOnDrop(Option<Runtime>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            runtime.shutdown_background();
        }
    }
}
