//! Leading an election from a thread: [`Leadership`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::runtime::Background;
use crate::{LostReason, Result};

#[cfg(doc)]
use super::Lease;
#[cfg(doc)]
use crate::LockError;

/// Leading an election: the blocking face of [`crate::Leadership`]. Dropping it resigns in
/// the background, as dropping a [`Lease`] releases it.
pub struct Leadership {
    /// `None` only once resigned or while dropping.
    inner: Option<crate::Leadership>,
    background: Arc<Background>,
}

impl Leadership {
    pub(super) fn new(leading: crate::Leadership, background: Arc<Background>) -> Self {
        Self {
            inner: Some(leading),
            background,
        }
    }

    fn leading(&self) -> &crate::Leadership {
        self.inner
            .as_ref()
            .expect("the leadership is present until resigned or dropped")
    }

    /// This leader's term: the fencing token of its hold.
    pub fn term(&self) -> u64 {
        self.leading().term()
    }

    /// The value this leader publishes now.
    pub fn value(&self) -> &str {
        self.leading().value()
    }

    /// Whether the leadership is known to be lost. Never blocks.
    pub fn is_lost(&self) -> bool {
        self.leading().is_lost()
    }

    /// Block until the leadership is lost, at most `timeout`, as [`Lease::wait_lost`].
    ///
    /// # Errors
    /// [`LockError::Unsupported`] inside an async context, unless `timeout` is zero.
    pub fn wait_lost(&self, timeout: Duration) -> Result<Option<LostReason>> {
        super::wait_lost(&self.background, self.leading().lease(), timeout)
    }

    /// Publish `value` instead; see [`crate::Leadership::proclaim`].
    ///
    /// # Errors
    /// As [`crate::Leadership::proclaim`]; [`LockError::Unsupported`] inside an async
    /// context.
    pub fn proclaim(&mut self, value: &str) -> Result<()> {
        let leading = self
            .inner
            .as_mut()
            .expect("the leadership is present until resigned or dropped");
        self.background.run(leading.proclaim(value))?
    }

    /// Stop leading: the next candidate leads at once.
    ///
    /// # Errors
    /// As [`crate::Leadership::resign`]; [`LockError::Unsupported`] inside an async context
    /// (the leadership is then given up in the background, as when dropped).
    pub fn resign(mut self) -> Result<()> {
        self.background.check_blocking_allowed()?;
        let leading = self.inner.take().expect("present until resigned");
        self.background.run(leading.resign())?
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        let _context = self.background.enter();
        drop(self.inner.take());
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Some(leading) => fmt::Debug::fmt(leading, f),
            None => f.write_str("Leadership(resigned)"),
        }
    }
}
