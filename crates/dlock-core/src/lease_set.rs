//! Several keys held as one: [`LeaseSet`], and how a set is taken (all keys or none).
//!
//! A set is taken key by key in one canonical order (the keys' bytes, ascending), on every
//! backend: two callers whose sets overlap, given in any order, both take the shared keys
//! in the same order, so neither can hold one key while waiting for a key the other holds
//! (no deadlock). The alternative, one atomic step on the server for all keys, exists on
//! some servers only (one Lua script needs the keys on one Redis node, one etcd
//! transaction cannot wait); taking keys one by one keeps every backend's own protocol,
//! waiters, fencing and crash bound for each key.
//!
//! While a set is being taken, the keys already taken are held, and other clients wait for
//! them as for any held key. When a key cannot be taken (busy past the deadline, an error),
//! the keys taken so far are released before the call returns.

use std::time::Duration;

use futures::future::{join_all, select_all};
use tokio::time::Instant;

use crate::{DistributedLock, ErrorKind, Lease, LockError, LockOptions, LostReason, Result, Wait};

/// Several keys held as one, each with its own [`Lease`].
///
/// Obtained from [`LockExt::acquire_all`](crate::LockExt::acquire_all) or
/// [`try_acquire_all`](crate::LockExt::try_acquire_all). Each key has its own fencing token
/// ([`fencing_token`](Self::fencing_token)); [`lost`](Self::lost) fires when any of the keys
/// is lost, and [`release`](Self::release) gives every key back. Dropping the set drops each
/// lease, which releases each key in the background (see [`Lease`]).
///
/// ```no_run
/// use dlock_core::{DistributedLock, LockExt as _, LockOptions};
///
/// // A transfer between two accounts: both keys or neither, named in any order.
/// async fn transfer(lock: &dyn DistributedLock) -> dlock_core::Result<()> {
///     let set = lock.acquire_all(&["accounts/7", "accounts/3"], &LockOptions::new()).await?;
///     assert_eq!(set.keys().collect::<Vec<_>>(), ["accounts/3", "accounts/7"]);
///     let token = set.fencing_token("accounts/7").expect("in the set");
///     // ... write account 7 with `token`, account 3 with its own ...
///     set.release().await
/// }
/// ```
#[derive(Debug)]
#[must_use = "a LeaseSet dropped at once releases its keys at once: bind it for as long as the work needs them"]
pub struct LeaseSet {
    /// One lease per key, in the order the keys were taken (ascending bytes).
    leases: Vec<Lease>,
}

impl LeaseSet {
    /// How many keys the set holds (duplicates in the request count once).
    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Whether the set holds no key (never true: an empty set is refused).
    pub fn is_empty(&self) -> bool {
        self.leases.is_empty()
    }

    /// The keys, in the order they were taken (ascending bytes).
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.leases.iter().map(Lease::key)
    }

    /// The lease of each key, in the order they were taken.
    pub fn leases(&self) -> &[Lease] {
        &self.leases
    }

    /// The lease of `key`, if the set holds it.
    pub fn get(&self, key: &str) -> Option<&Lease> {
        self.leases
            .binary_search_by(|lease| lease.key().as_bytes().cmp(key.as_bytes()))
            .ok()
            .map(|i| &self.leases[i])
    }

    /// The fencing token of `key`'s lease, if the set holds it. Each key's token is that
    /// key's own (see [`Lease::fencing_token`]): pass the token of the key a write is about.
    pub fn fencing_token(&self, key: &str) -> Option<u64> {
        self.get(key).map(Lease::fencing_token)
    }

    /// Whether any of the keys is known to be lost.
    pub fn is_lost(&self) -> bool {
        self.leases.iter().any(Lease::is_lost)
    }

    /// Resolves, with the key and the reason, once any of the keys is lost; never resolves
    /// while every key is kept. Like [`Lease::lost`], it fires before the server can give
    /// that key to another client.
    pub async fn lost(&self) -> (&str, LostReason) {
        let each = self
            .leases
            .iter()
            .map(|lease| Box::pin(async move { (lease.key(), lease.lost().await) }));
        select_all(each).await.0
    }

    /// Keep every key for `ttl` from now (see [`Lease::extend`]), all at once.
    ///
    /// # Errors
    /// The first error in key order, after every key was tried.
    pub async fn extend(&self, ttl: Duration) -> Result<()> {
        let results = join_all(self.leases.iter().map(|lease| lease.extend(ttl))).await;
        results.into_iter().collect()
    }

    /// Give every key back, all at once (see [`Lease::release`]).
    ///
    /// # Errors
    /// The first error in key order, after every key was released or tried.
    ///
    /// # Cancel safety
    /// As for [`Lease::release`]: what was not answered yet is released in the background.
    pub async fn release(self) -> Result<()> {
        let results = join_all(self.leases.into_iter().map(Lease::release)).await;
        results.into_iter().collect()
    }

    /// The leases, one per key in the order they were taken, to keep or give back apart.
    pub fn into_leases(self) -> Vec<Lease> {
        self.leases
    }
}

/// Take every key of `keys` on `lock` (see [`LockExt::acquire_all`](crate::LockExt)):
/// `Ok(None)` when a key stayed busy (at once with `once`, else past `opts.wait`), with
/// every key taken meanwhile released again.
pub(crate) async fn take_all<L, K>(
    lock: &L,
    keys: &[K],
    opts: &LockOptions,
    once: bool,
) -> Result<std::result::Result<LeaseSet, String>>
where
    L: DistributedLock + ?Sized,
    K: AsRef<str> + Sync,
{
    let keys = canonical(lock, keys, opts)?;
    let deadline = match opts.wait {
        Wait::For(wait) => Some(Instant::now().checked_add(wait)),
        _ => None,
    };
    let mut pass = 0u32;
    loop {
        pass = pass.saturating_add(1);
        let set = match take_each(lock, &keys, opts, once, deadline).await? {
            Ok(set) => set,
            Err(busy) => return Ok(Err(busy)),
        };
        // A key taken early may have been lost while a later one was waited for (a
        // partition that healed meanwhile): such a set is not handed out. It is given
        // back, and taken again while the wait allows.
        let Some(lost) = set.leases.iter().find(|l| l.is_lost()) else {
            return Ok(Ok(set));
        };
        let (key, reason) = (lost.key().to_owned(), lost.state.lost_reason());
        tracing::debug!(%key, "a key of the set was lost before the set was complete");
        give_back(set.leases).await;
        // Without renewal a key that expired while a later one was waited for would
        // expire again on every pass: that is an answer, not a passing fault.
        if !opts.auto_renew {
            return Err(LockError::LeaseLost {
                backend: lock.backend_name(),
                key,
                reason: reason.unwrap_or(LostReason::Expired),
            });
        }
        // A pause that grows with each pass, so a fault that keeps costing a key does not
        // make the set hammer the server.
        let pause = (opts.ttl / 10).min(Duration::from_millis(100)) * pass.min(10);
        let resume = Instant::now() + pause;
        let may_wait = match (opts.wait, deadline) {
            _ if once => false,
            (Wait::No, _) => false,
            (_, Some(Some(at))) => resume < at,
            _ => true,
        };
        if !may_wait {
            return Ok(Err(key));
        }
        tokio::time::sleep_until(resume).await;
    }
}

/// One pass over `keys`, in order: every lease, or the key that stayed busy (with what was
/// taken given back).
async fn take_each<L>(
    lock: &L,
    keys: &[&str],
    opts: &LockOptions,
    once: bool,
    deadline: Option<Option<Instant>>,
) -> Result<std::result::Result<LeaseSet, String>>
where
    L: DistributedLock + ?Sized,
{
    let mut leases = Vec::with_capacity(keys.len());
    for &key in keys {
        let step = match (once, deadline) {
            (true, _) => lock.try_acquire(key, opts).await.map(|l| l.ok_or(())),
            // The wait is one budget for the whole set.
            (false, Some(at)) => {
                let left = at.map_or(Duration::MAX, |at| {
                    at.saturating_duration_since(Instant::now())
                });
                busy_as_err(lock.acquire(key, &opts.wait(Wait::For(left))).await)
            }
            (false, None) => busy_as_err(lock.acquire(key, opts).await),
        };
        match step {
            Ok(Ok(lease)) => leases.push(lease),
            Ok(Err(())) => {
                give_back(leases).await;
                return Ok(Err(key.to_owned()));
            }
            Err(e) => {
                give_back(leases).await;
                return Err(e);
            }
        }
    }
    Ok(Ok(LeaseSet { leases }))
}

/// The keys in the order every caller takes them (ascending bytes, duplicates once), each
/// checked as an acquire would check it: a bad key or option anywhere in the set is refused
/// before any key is taken.
fn canonical<'k, L, K>(lock: &L, keys: &'k [K], opts: &LockOptions) -> Result<Vec<&'k str>>
where
    L: DistributedLock + ?Sized,
    K: AsRef<str> + Sync,
{
    let mut keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
    if keys.is_empty() {
        return Err(LockError::invalid_key(
            "",
            "a key set must name at least one key",
        ));
    }
    keys.sort_unstable_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    keys.dedup();
    for key in &keys {
        lock.validate(key, opts)?;
    }
    Ok(keys)
}

/// A waiting acquire's answer with a busy key (a timeout) as `Ok(Err(()))`.
fn busy_as_err(result: Result<Lease>) -> Result<std::result::Result<Lease, ()>> {
    match result {
        Ok(lease) => Ok(Ok(lease)),
        Err(e) if e.kind() == ErrorKind::Timeout => Ok(Err(())),
        Err(e) => Err(e),
    }
}

/// Release what a set took before one of its keys failed, before the call returns.
async fn give_back(leases: Vec<Lease>) {
    for result in join_all(leases.into_iter().map(Lease::release)).await {
        if let Err(e) = result {
            tracing::debug!(error = %e, "giving back a key of an incomplete set");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;

    use super::*;
    use crate::raw::{Backend, Deadline, Grant, Held, LockClient};
    use crate::{Capabilities, LockExt as _};

    /// Grants every key but `busy`, at once, and logs what it was asked.
    #[derive(Debug, Default)]
    struct Log {
        busy: &'static str,
        log: Arc<Mutex<Vec<String>>>,
    }

    #[derive(Debug)]
    struct Taken(String, Arc<Mutex<Vec<String>>>);

    #[async_trait]
    impl Held for Taken {
        async fn extend(&mut self, _ttl: Duration) -> Result<()> {
            Ok(())
        }
        async fn release(&mut self) -> Result<()> {
            self.1.lock().unwrap().push(format!("release {}", self.0));
            Ok(())
        }
    }

    #[async_trait]
    impl Backend for Log {
        const NAME: &'static str = "log";

        fn capabilities(&self) -> Capabilities {
            Capabilities::default()
        }

        async fn inspect(&self, key: &str) -> Result<crate::KeyStatus> {
            Ok(crate::KeyStatus::new(key, false))
        }

        async fn list(&self, _prefix: &str) -> Result<Vec<String>> {
            Err(LockError::Unsupported {
                backend: Self::NAME,
                what: "listing held keys",
            })
        }

        async fn acquire(
            &self,
            key: &str,
            _opts: &LockOptions,
            _deadline: Deadline,
        ) -> Result<Option<crate::raw::Grant>> {
            self.log.lock().unwrap().push(format!("acquire {key}"));
            if key == self.busy {
                return Ok(None);
            }
            let held = Taken(key.to_owned(), self.log.clone());
            Ok(Some(Grant::new(1, Box::new(held), Instant::now())))
        }
    }

    fn lock(busy: &'static str) -> (LockClient<Log>, Arc<Mutex<Vec<String>>>) {
        let log = Arc::default();
        let backend = Log {
            busy,
            log: Arc::clone(&log),
        };
        (LockClient::new(backend), log)
    }

    #[tokio::test]
    async fn keys_are_taken_in_ascending_byte_order_once_each() {
        let (lock, log) = lock("");
        let set = lock
            .try_acquire_all(&["b", "a/x", "B", "a", "b"], &LockOptions::new())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(set.keys().collect::<Vec<_>>(), ["B", "a", "a/x", "b"]);
        assert_eq!(
            *log.lock().unwrap(),
            ["acquire B", "acquire a", "acquire a/x", "acquire b"]
        );
        set.release().await.unwrap();
    }

    #[tokio::test]
    async fn a_busy_key_gives_back_the_keys_taken_before_the_call_returns() {
        let (lock, log) = lock("c");
        let opts = LockOptions::new().wait(Wait::No);
        let err = lock.acquire_all(&["d", "c", "a"], &opts).await.unwrap_err();
        assert!(
            matches!(&err, LockError::Timeout { key, .. } if key == "c"),
            "{err}"
        );
        assert_eq!(
            *log.lock().unwrap(),
            ["acquire a", "acquire c", "release a"],
            "the key after the busy one is not tried; the one before is given back"
        );
    }

    #[tokio::test]
    async fn a_bad_key_anywhere_is_refused_before_any_key_is_asked_for() {
        let (lock, log) = lock("");
        let err = lock
            .try_acquire_all(&["a", "b\0"], &LockOptions::new())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidKey, "{err}");
        assert!(log.lock().unwrap().is_empty());
    }
}
