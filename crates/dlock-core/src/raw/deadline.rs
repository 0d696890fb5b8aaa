//! One deadline per acquire, covering every phase.

use std::future::Future;

use tokio::time::Instant;

use crate::Wait;

/// When an acquisition must give up. Computed once when the call starts, so no phase
/// (connect, create, wait, retry) restarts the clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deadline {
    /// One attempt; a busy key is not waited for.
    TryOnce,
    /// Give up at this instant.
    At(Instant),
    /// Never give up.
    Never,
}

impl Deadline {
    /// The deadline for `wait`, counted from now.
    pub fn after(wait: Wait) -> Self {
        match wait {
            Wait::No => Deadline::TryOnce,
            Wait::For(d) => Instant::now()
                .checked_add(d)
                .map_or(Deadline::Never, Deadline::At),
            Wait::Forever => Deadline::Never,
        }
    }

    /// Whether a busy key may be waited for at all.
    pub fn may_wait(&self) -> bool {
        match self {
            Deadline::TryOnce => false,
            Deadline::At(at) => Instant::now() < *at,
            Deadline::Never => true,
        }
    }

    /// The earlier of the deadline and `at`.
    pub fn min(&self, at: Instant) -> Instant {
        match self {
            Deadline::TryOnce => Instant::now(),
            Deadline::At(d) => (*d).min(at),
            Deadline::Never => at,
        }
    }

    /// Run `fut` until the deadline: `None` if the deadline came first. `TryOnce` still lets
    /// the future run (one attempt is always allowed); use [`Deadline::may_wait`] to decide
    /// whether to wait at all.
    pub async fn run<F: Future>(&self, fut: F) -> Option<F::Output> {
        match self {
            Deadline::At(at) => tokio::time::timeout_at(*at, fut).await.ok(),
            Deadline::TryOnce | Deadline::Never => Some(fut.await),
        }
    }

    /// Sleep until the deadline; never returns for `Never`, at once for `TryOnce`.
    pub async fn reached(self) {
        match self {
            Deadline::TryOnce => {}
            Deadline::At(at) => tokio::time::sleep_until(at).await,
            Deadline::Never => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn run_gives_up_at_the_deadline() {
        let deadline = Deadline::after(Wait::For(Duration::from_millis(50)));
        let start = Instant::now();
        let out = deadline.run(std::future::pending::<()>()).await;
        assert_eq!(out, None);
        assert_eq!(start.elapsed(), Duration::from_millis(50));
        assert!(!deadline.may_wait());
    }

    #[test]
    fn try_once_may_not_wait() {
        assert!(!Deadline::after(Wait::No).may_wait());
        assert!(Deadline::after(Wait::Forever).may_wait());
    }
}
