//! Leader election on a key: [`Election`], [`Leadership`], [`Leader`].
//!
//! An election is a mutex whose hold carries a value: the candidate that holds the key
//! leads, and publishes its value where every process can read it (the holder's `who` in
//! [`inspect`](crate::DistributedLock::inspect)). The leader's term is its fencing token,
//! so it increases with every new leader, and work fenced by it is fenced by the term.
//! Each backend keeps the value where its standard recipe does (etcd's
//! `concurrency.Election`, Curator's `LeaderLatch`): see each backend's docs.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt};

use crate::{DistributedLock, Lease, LockError, LockOptions, LostReason, Mode, Observe, Result};

/// The longest value a candidate may publish, in bytes.
pub const MAX_VALUE_LEN: usize = 256;

/// Refuse, before any I/O, a value no backend can carry as it is: empty, longer than
/// [`MAX_VALUE_LEN`] bytes, or holding a control character (a value is printed one per
/// line by `dlock leader`).
pub fn check_value(backend: &'static str, value: &str) -> Result<()> {
    if value.is_empty() || value.len() > MAX_VALUE_LEN || value.chars().any(char::is_control) {
        return Err(LockError::invalid_config(
            backend,
            format!(
                "an election value is 1 to {MAX_VALUE_LEN} bytes with no control character (got {} bytes)",
                value.len()
            ),
        ));
    }
    Ok(())
}

/// Who leads an election: the value it published and its term (the fencing token of its
/// hold, larger for every new leader).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Leader {
    /// What the leader published ([`Election::campaign`], [`Leadership::proclaim`]).
    pub value: String,
    /// The leader's term: the fencing token of its hold.
    pub term: u64,
}

impl Leader {
    /// A leader with `value` in `term`.
    pub fn new(value: impl Into<String>, term: u64) -> Self {
        Self {
            value: value.into(),
            term,
        }
    }
}

impl fmt::Display for Leader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (term {})", self.value, self.term)
    }
}

/// An election on one key of a lock service.
///
/// ```no_run
/// use std::sync::Arc;
/// use dlock_core::{DistributedLock, Election};
///
/// async fn serve(lock: Arc<dyn DistributedLock>) -> dlock_core::Result<()> {
///     let election = Election::new(lock, "billing/leader");
///     let leadership = election.campaign("10.0.0.7:8080").await?;
///     tokio::select! {
///         reason = leadership.lost() => eprintln!("no longer leading: {reason}"),
///         _ = lead(leadership.term()) => leadership.resign().await?,
///     }
///     Ok(())
/// }
/// # async fn lead(_term: u64) {}
/// ```
pub struct Election<L: ?Sized = dyn DistributedLock> {
    lock: Arc<L>,
    key: String,
    opts: LockOptions,
}

impl<L: ?Sized> Clone for Election<L> {
    fn clone(&self) -> Self {
        Self {
            lock: self.lock.clone(),
            key: self.key.clone(),
            opts: self.opts,
        }
    }
}

impl<L: ?Sized> fmt::Debug for Election<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("key", &self.key)
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl<L: DistributedLock + ?Sized + 'static> Election<L> {
    /// The election on `key`. Candidates wait as long as it takes
    /// ([`Wait::Forever`](crate::Wait::Forever)) with the default ttl and auto-renew; see
    /// [`options`](Self::options).
    pub fn new(lock: Arc<L>, key: impl Into<String>) -> Self {
        Self {
            lock,
            key: key.into(),
            opts: LockOptions::new().wait(crate::Wait::Forever),
        }
    }

    /// Campaign with `opts` instead: the wait bounds [`campaign`](Self::campaign), the ttl
    /// and auto-renew apply to the leadership. The mode must be exclusive (a leader leads
    /// alone); any other is refused by `campaign`.
    #[must_use]
    pub fn options(mut self, opts: LockOptions) -> Self {
        self.opts = opts;
        self
    }

    /// The key of this election.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Wait until this candidate leads, publishing `value`; candidates lead in the order
    /// the backend grants its mutex (first come, first served where
    /// [`Capabilities::fair`](crate::Capabilities::fair)).
    ///
    /// # Errors
    /// A bad key, a value [`check_value`] refuses, options that are not exclusive, or a
    /// backend without elections ([`LockError::Unsupported`]), before any I/O; otherwise as
    /// [`DistributedLock::acquire`] ([`LockError::Timeout`] past the wait).
    ///
    /// # Cancel safety
    /// As [`DistributedLock::acquire`]: dropping the future withdraws the candidate.
    pub async fn campaign(&self, value: &str) -> Result<Leadership> {
        let lease = self.lock.campaign(&self.key, value, &self.opts).await?;
        Ok(Leadership {
            lease,
            value: value.to_owned(),
        })
    }

    /// The leader right now, or `None` when nobody leads.
    ///
    /// # Errors
    /// A bad key before any I/O; [`LockError::Unavailable`] when the server cannot be read.
    pub async fn leader(&self) -> Result<Option<Leader>> {
        self.lock.leader(&self.key).await
    }

    /// Follow the leadership: the leader now (or `None`), then each change (a new leader,
    /// a new value, nobody leading), in order. A backend that wakes observers
    /// ([`Observe::Woken`]) reports each change it makes as it happens and a leader whose
    /// hold expired within `recheck`; one that cannot ([`Observe::Polled`]) reads the
    /// leader every `every`, so a leader that leads for less may be missed. The stream
    /// ends after an error (the server unreachable, the notifications lost): follow again
    /// to go on.
    pub fn observe(&self) -> BoxStream<'static, Result<Option<Leader>>> {
        let every = match self.lock.capabilities().election {
            Observe::Woken { recheck } => recheck,
            Observe::Polled { every } => every,
            Observe::Unsupported => {
                let unsupported = LockError::Unsupported {
                    backend: self.lock.backend_name(),
                    what: "leader elections",
                };
                return stream::once(async move { Err(unsupported) }).boxed();
            }
        };
        let watch = Watch {
            lock: self.lock.clone(),
            key: self.key.clone(),
            every,
            changes: None,
            seen: None,
            done: false,
        };
        stream::unfold(watch, |mut watch| async move {
            let next = watch.next().await?;
            Some((next, watch))
        })
        .boxed()
    }
}

/// The state of [`Election::observe`].
struct Watch<L: ?Sized> {
    lock: Arc<L>,
    key: String,
    /// How long to go without reading the leader.
    every: Duration,
    /// The backend's change notifications, once subscribed (`Some(None)`: it has none).
    changes: Option<Option<BoxStream<'static, Result<()>>>>,
    /// The last leadership reported.
    seen: Option<Option<Leader>>,
    done: bool,
}

impl<L: DistributedLock + ?Sized> Watch<L> {
    /// The next change, or `None` once the stream has ended.
    async fn next(&mut self) -> Option<Result<Option<Leader>>> {
        loop {
            if self.done {
                return None;
            }
            if let Err(e) = self.wait().await {
                self.done = true;
                return Some(Err(e));
            }
            match self.lock.leader(&self.key).await {
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
                Ok(now) if self.seen.as_ref() != Some(&now) => {
                    self.seen = Some(now.clone());
                    return Some(Ok(now));
                }
                Ok(_) => {}
            }
        }
    }

    /// Subscribe the first time (before the first read, so no change after it is missed);
    /// then wait for a notification or `every`.
    async fn wait(&mut self) -> Result<()> {
        let Some(changes) = &mut self.changes else {
            self.changes = Some(self.lock.leader_changes(&self.key).await?);
            return Ok(());
        };
        let Some(changes) = changes else {
            tokio::time::sleep(self.every).await;
            return Ok(());
        };
        tokio::select! {
            change = changes.next() => match change {
                Some(change) => change,
                None => Err(LockError::backend(
                    self.lock.backend_name(),
                    "observe",
                    "the server's change notifications ended",
                )),
            },
            () = tokio::time::sleep(self.every) => Ok(()),
        }
    }
}

/// Leading an election: the hold of the election's key, with the value it publishes.
///
/// Dropping it resigns in the background, as dropping a [`Lease`] releases it.
#[derive(Debug)]
pub struct Leadership {
    lease: Lease,
    value: String,
}

impl Leadership {
    /// This leader's term: the fencing token of its hold, larger than every earlier
    /// leader's (as far as [`Capabilities::fencing`](crate::Capabilities::fencing)
    /// promises). Pass it to storage that checks it.
    pub fn term(&self) -> u64 {
        self.lease.fencing_token()
    }

    /// The value this leader publishes now.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Resolves with the reason once the leadership is lost; see [`Lease::lost`].
    pub async fn lost(&self) -> LostReason {
        self.lease.lost().await
    }

    /// Whether the leadership is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Publish `value` instead, for observers and [`Election::leader`]; the term stays.
    /// Owner-checked on the server: a leader that lost the key changes nothing.
    ///
    /// # Errors
    /// A value [`check_value`] refuses, before any I/O; [`LockError::NotHeld`] once the
    /// leadership is lost; [`LockError::Unavailable`] when the server cannot be reached.
    pub async fn proclaim(&mut self, value: &str) -> Result<()> {
        self.lease.proclaim(value).await?;
        value.clone_into(&mut self.value);
        Ok(())
    }

    /// Stop leading: release the key, so the next candidate leads at once.
    ///
    /// # Errors
    /// As [`Lease::release`].
    pub async fn resign(self) -> Result<()> {
        self.lease.release().await
    }

    /// The hold underneath, for what [`Lease`] offers beyond this (extend, the lost
    /// signal to pass on).
    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}

/// The leader of `status`'s key as [`inspect`](crate::DistributedLock::inspect) shows it:
/// its one exclusive holder's `who` and fencing token. The default of
/// [`Backend::leader`](crate::raw::Backend::leader).
pub(crate) fn leader_of(
    backend: &'static str,
    status: &crate::KeyStatus,
) -> Result<Option<Leader>> {
    let Some(holder) = status.holders.iter().find(|h| h.mode == Mode::Exclusive) else {
        return Ok(None);
    };
    match (&holder.who, holder.fencing_token) {
        (Some(value), Some(term)) => Ok(Some(Leader::new(value.clone(), term))),
        _ => Err(LockError::backend(
            backend,
            "leader",
            "the server shows the holder without its value or token",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ErrorKind, HolderStatus, KeyStatus};

    #[test]
    fn values_are_one_printable_line_of_at_most_256_bytes() {
        for good in [
            "a",
            "10.0.0.7:8080",
            "host a, ünïcode",
            &"v".repeat(MAX_VALUE_LEN),
        ] {
            assert!(check_value("t", good).is_ok(), "{good:?}");
        }
        for bad in ["", "a\nb", "nul\0", "tab\t", &"v".repeat(MAX_VALUE_LEN + 1)] {
            let err = check_value("t", bad).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        }
    }

    #[test]
    fn the_leader_is_the_exclusive_holder_with_its_value_and_token() {
        let mut status = KeyStatus::new("k", false);
        assert_eq!(leader_of("t", &status).unwrap(), None);
        let mut reader = HolderStatus::new(Mode::Shared);
        reader.who = Some("r".into());
        reader.fencing_token = Some(1);
        status.holders.push(reader);
        assert_eq!(
            leader_of("t", &status).unwrap(),
            None,
            "a reader does not lead"
        );
        let mut leader = HolderStatus::new(Mode::Exclusive);
        leader.who = Some("me".into());
        status.holders.push(leader.clone());
        assert!(
            leader_of("t", &status).is_err(),
            "a leader without its term"
        );
        leader.fencing_token = Some(7);
        status.holders[1] = leader;
        assert_eq!(leader_of("t", &status).unwrap(), Some(Leader::new("me", 7)));
    }
}
