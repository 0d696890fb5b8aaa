//! Batching by gathering: a queue into a task that is started on first use, and the wait
//! that collects what queued in one moment (the leases the core's watchdog woke in one
//! timer tick) into one batch. Used by this crate's per-node renewals and by Redlock's
//! cluster-wide ones.

use std::fmt;
use std::sync::{Mutex, PoisonError};

use tokio::sync::mpsc;

/// The most yields spent gathering one batch, so a steady stream of items cannot hold back
/// the first of them for long.
const MAX_GATHER_YIELDS: usize = 16;

/// A queue into a task started on first use, and started again if the runtime that ran the
/// previous one shut down.
pub struct TaskQueue<T> {
    sender: Mutex<Option<mpsc::UnboundedSender<T>>>,
}

impl<T> Default for TaskQueue<T> {
    fn default() -> Self {
        Self {
            sender: Mutex::new(None),
        }
    }
}

impl<T> fmt::Debug for TaskQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TaskQueue").finish_non_exhaustive()
    }
}

impl<T: Send + 'static> TaskQueue<T> {
    /// Queue `item` for the task, first spawning `start(receiver)` on the current runtime if
    /// no task runs.
    ///
    /// # Errors
    /// `item` back when no task can take it (no tokio runtime).
    pub fn send<F, Fut>(&self, item: T, start: F) -> Result<(), T>
    where
        F: FnOnce(mpsc::UnboundedReceiver<T>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut sender = self.sender.lock().unwrap_or_else(PoisonError::into_inner);
        let item = match sender.as_ref() {
            Some(s) => match s.send(item) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(item)) => item,
            },
            None => item,
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(item);
        };
        let (new, receiver) = mpsc::unbounded_channel();
        runtime.spawn(start(receiver));
        if let Err(mpsc::error::SendError(item)) = new.send(item) {
            return Err(item);
        }
        *sender = Some(new);
        Ok(())
    }
}

/// Wait for the next item of `queue`, then gather into `batch` (up to `max` items) what
/// queues behind it in the same moment. `false` once the queue is closed and empty.
///
/// It yields rather than waits on a timer, so a lone item is held back only by tasks that
/// were already runnable; and since the tasks woken in one timer tick run a few at a time
/// on every worker, one yield catches only a handful, so it yields again while the queue
/// still grows.
pub async fn gather<T>(
    queue: &mut mpsc::UnboundedReceiver<T>,
    batch: &mut Vec<T>,
    max: usize,
) -> bool {
    if queue.recv_many(batch, max).await == 0 {
        return false;
    }
    for _ in 0..MAX_GATHER_YIELDS {
        if batch.len() >= max {
            break;
        }
        tokio::task::yield_now().await;
        let before = batch.len();
        while batch.len() < max
            && let Ok(item) = queue.try_recv()
        {
            batch.push(item);
        }
        if batch.len() == before {
            break;
        }
    }
    true
}
