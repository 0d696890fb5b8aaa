//! The connection every request goes through: [`Conn`] bounds each request by the request
//! timeout and sends again a request that never left; [`revision`] and [`ranged`] read
//! etcd's answers.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use etcd_client::{
    Client, Compare, CompareOp, GetOptions, KeyValue, ResponseHeader, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};

use crate::NAME;
use crate::error::{Error, never_sent};
use crate::keywatch::HeldKeys;
use crate::shared::SharedLeases;

/// The client and what every request needs: its timeout, and the counters.
#[derive(Clone)]
pub(crate) struct Conn {
    /// Shared, not cloned, by the clones of `Conn` (one per hold): a `Client` is a handle
    /// per gRPC service, each a clone of the channel.
    pub(crate) client: Arc<Client>,
    /// How many endpoints the client balances over.
    pub(crate) endpoints: usize,
    pub(crate) timeout: Duration,
    pub(crate) shared: Arc<Shared>,
    /// A key read with each keep-alive of a shared lease (the bare lock prefix, which no
    /// lock uses): a linearizable read needs a leader backed by a quorum, which a lease
    /// renewal does not (a leader cut off from the others renews in memory until it
    /// notices).
    pub(crate) probe: Arc<str>,
}

#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) wakeups: AtomicU64,
    /// Numbers the attempts' keys on shared leases whose plain name is taken.
    pub(crate) attempts: AtomicU64,
    /// Names of the keys on shared leases that an attempt, a hold or a background delete
    /// of this client uses (see [`Shared::claim_key`]).
    claimed: Mutex<HashSet<String>>,
    /// Leases granted (or being granted) and not yet seen gone, with the instant by which
    /// the server has certainly expired those no longer kept alive (a revoke that failed).
    /// Those are forgotten once that instant passes, so the map stays bounded by the leases
    /// alive now.
    leases: Mutex<HashMap<i64, Option<Instant>>>,
    /// The leases shared by auto-renewed holds, one per ttl.
    pub(crate) shared_leases: SharedLeases,
    /// The watch stream on held keys.
    pub(crate) keys: HeldKeys,
    /// What keeps each owner hold's key of this client alive, for its re-entries here.
    pub(crate) owner_holds: crate::reentry::OwnerHolds,
}

impl Shared {
    /// Note a lease this client is about to grant and will keep alive.
    pub(crate) fn lease_opened(&self, id: i64) {
        let mut leases = self.leases();
        let now = Instant::now();
        leases.retain(|_, gone_by| gone_by.is_none_or(|t| t > now));
        leases.insert(id, None);
    }

    /// The lease is gone on the server (revoked, expired, or never granted).
    pub(crate) fn lease_closed(&self, id: i64) {
        self.leases().remove(&id);
    }

    /// Nothing keeps the lease alive any more, but its revoke failed: the server expires it
    /// within `ttl`.
    pub(crate) fn lease_abandoned(&self, id: i64, ttl: Duration) {
        if let Some(gone_by) = self.leases().get_mut(&id) {
            *gone_by = Some(Instant::now() + ttl);
        }
    }

    /// A name for a new attempt's key on a shared lease: `base` (`{lock name}/{lease id}`,
    /// Go's layout), or, while something of ours still uses that name (a hold, or the
    /// background delete of an abandoned attempt, which must never delete a later
    /// attempt's key), `base-{attempt number}`. Reusing one name per lease and lock keeps
    /// the prefix's ranges short: etcd's range walks every name under the prefix that
    /// has history since the last compaction, one per attempt if each had a new name.
    pub(crate) fn claim_key(&self, base: String) -> String {
        let mut claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        let name = match claimed.contains(&base) {
            false => base,
            true => format!(
                "{base}-{:x}",
                self.attempts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ),
        };
        claimed.insert(name.clone());
        name
    }

    /// Claim exactly `name`, if nothing of ours claims it: `true` when claimed. While the
    /// claim is held no attempt of ours takes that name, so a key under it on one of our
    /// shared leases can be deleted without a compare (see [`crate::shared`]'s sweep).
    pub(crate) fn claim_exact(&self, name: &str) -> bool {
        let mut claimed = self.claimed.lock().unwrap_or_else(|e| e.into_inner());
        match claimed.contains(name) {
            true => false,
            false => claimed.insert(name.to_owned()),
        }
    }

    /// Nothing of ours uses `name` any more: it is deleted, or was never put.
    pub(crate) fn unclaim_key(&self, name: &str) {
        self.claimed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(name);
    }

    /// Ids of the leases that may still exist on the server.
    pub(crate) fn open_leases(&self) -> Vec<i64> {
        let now = Instant::now();
        let mut leases = self.leases();
        leases.retain(|_, gone_by| gone_by.is_none_or(|t| t > now));
        leases.keys().copied().collect()
    }

    fn leases(&self) -> std::sync::MutexGuard<'_, HashMap<i64, Option<Instant>>> {
        self.leases.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Conn {
    /// Run one request made by `request`, bounded by the request timeout. A request that
    /// never left (the balancer picked an endpoint that refused the connection: a member
    /// that is down, or a connection not yet re-made after it came back) is made and sent
    /// again, at most twice per endpoint.
    pub(crate) async fn call<T, F, Fut>(&self, op: &'static str, mut request: F) -> Result<T, Error>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let attempts = 2 * self.endpoints + 1;
        self.call_once(op, async {
            let mut attempt = 1;
            let mut backoff = Duration::from_millis(20);
            loop {
                match request().await {
                    // Refused before it was proposed (the apply backlog is long): the
                    // request did nothing, so it is sent again, within the timeout.
                    Err(e) if too_many_requests(&e) => {
                        tracing::debug!(backend = NAME, op, "the server is overloaded; sending again");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_millis(500));
                    }
                    Err(e) if attempt < attempts && never_sent(&e) => {
                        tracing::debug!(backend = NAME, op, error = %e, "connection refused; sending again");
                        attempt += 1;
                    }
                    answer => return answer,
                }
            }
        })
        .await
    }

    /// Run `request` once, bounded by the request timeout.
    pub(crate) async fn call_once<T>(
        &self,
        op: &'static str,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.timeout, request).await {
            Ok(answer) => answer.map_err(|e| Error::etcd(op, e)),
            Err(_) => Err(Error::TimedOut {
                op,
                after: self.timeout,
            }),
        }
    }

    /// Delete `key`, only if its create revision is `rev` when given (one commit). `true`
    /// when it was deleted (or nothing was to compare), `false` when it was not ours.
    pub(crate) async fn delete_key(
        &self,
        op: &'static str,
        key: &str,
        rev: Option<i64>,
    ) -> Result<bool, Error> {
        let compare = rev.map(|rev| Compare::create_revision(key, CompareOp::Equal, rev));
        let txn = Txn::new()
            .when(compare.into_iter().collect::<Vec<_>>())
            .and_then([TxnOp::delete(key, None)]);
        Ok(self.txn(op, txn).await?.succeeded())
    }

    /// Read [`Self::probe`] (linearizable: a quorum confirms the leader; no raft commit).
    pub(crate) async fn confirm_quorum(&self, op: &'static str) -> Result<(), Error> {
        let get = || {
            let mut kv = self.client.kv_client();
            let probe = self.probe.clone();
            async move {
                let options = GetOptions::new().with_keys_only().with_limit(1);
                kv.get(probe.as_bytes(), Some(options)).await
            }
        };
        self.call(op, get).await.map(drop)
    }

    pub(crate) async fn txn(&self, op: &'static str, txn: Txn) -> Result<TxnResponse, Error> {
        self.call(op, || {
            let (mut kv, txn) = (self.client.kv_client(), txn.clone());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Revoke lease `id`; a lease the server no longer has counts as revoked.
    pub(crate) async fn revoke(&self, op: &'static str, id: i64) -> Result<(), Error> {
        let revoke = || {
            let mut lease = self.client.lease_client();
            async move { lease.revoke(id).await }
        };
        match self.call(op, revoke).await {
            Ok(_) => {}
            Err(e) if e.is_lease_not_found() => {}
            Err(e) => return Err(e),
        }
        self.shared.lease_closed(id);
        Ok(())
    }
}

/// etcd's `ErrTooManyRequests`: the server refuses new proposals while its applied index
/// lags its committed index by more than 5,000 entries.
fn too_many_requests(e: &etcd_client::Error) -> bool {
    matches!(e, etcd_client::Error::GRpcStatus(status) if status.message() == "etcdserver: too many requests")
}

/// The revision a response was served at.
pub(crate) fn revision(op: &'static str, header: Option<&ResponseHeader>) -> Result<i64, Error> {
    header.map(ResponseHeader::revision).ok_or(Error::Protocol {
        op,
        what: "a response without a header",
    })
}

/// The key-values of the `i`-th operation of a transaction, which must be a range.
pub(crate) fn ranged<'a>(
    op: &'static str,
    ops: &'a [TxnOpResponse],
    i: usize,
) -> Result<&'a [KeyValue], Error> {
    match ops.get(i) {
        Some(TxnOpResponse::Get(range)) => Ok(range.kvs()),
        _ => Err(Error::Protocol {
            op,
            what: "a transaction without the expected range result",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abandoned_leases_are_forgotten_once_the_server_has_expired_them() {
        let shared = Shared::default();
        for id in 0..1000 {
            shared.lease_opened(id);
            shared.lease_abandoned(id, Duration::ZERO);
        }
        shared.lease_opened(7_000);
        shared.lease_opened(7_001);
        shared.lease_abandoned(7_001, Duration::from_secs(60));
        let mut open = shared.open_leases();
        open.sort_unstable();
        assert_eq!(open, [7_000, 7_001], "kept alive, or not yet expired");
        assert_eq!(
            shared.leases().len(),
            2,
            "the map does not grow with failed revokes"
        );
        shared.lease_closed(7_000);
        assert_eq!(shared.open_leases(), [7_001]);
    }

    #[test]
    fn a_name_claimed_exactly_is_not_given_to_an_attempt_until_let_go() {
        let shared = Shared::default();
        assert!(shared.claim_exact("k/1"));
        assert!(!shared.claim_exact("k/1"), "claimed already");
        assert_ne!(shared.claim_key("k/1".to_owned()), "k/1");
        shared.unclaim_key("k/1");
        assert_eq!(shared.claim_key("k/1".to_owned()), "k/1");
    }
}
