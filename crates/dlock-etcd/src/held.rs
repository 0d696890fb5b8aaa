//! A held key ([`EtcdHeld`]): the fenced release, and extend (a keep-alive and a read of
//! our key, or a move to a new lease for a new ttl).

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::Result;
use dlock_core::raw::Held;
use etcd_client::{Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp};

use crate::connection::Conn;
use crate::error::{Error, not_held};
use crate::lease::{LeaseHandle, whole_seconds};

/// A held key: our etcd key, its create revision (the fencing token) and its lease.
pub(crate) struct EtcdHeld {
    pub(crate) conn: Conn,
    pub(crate) key: String,
    pub(crate) my_key: String,
    pub(crate) rev: i64,
    pub(crate) lease: LeaseHandle,
}

impl fmt::Debug for EtcdHeld {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdHeld")
            .field("key", &self.key)
            .field("etcd_key", &self.my_key)
            .field("create_revision", &self.rev)
            .field("lease", &format_args!("{:x}", self.lease.id))
            .finish()
    }
}

/// Whether `my_key` still exists with create revision `rev` (one linearizable read).
async fn still_ours(conn: &Conn, my_key: &str, rev: i64) -> Result<bool, Error> {
    let get = || {
        let mut kv = conn.client.kv_client();
        async move {
            kv.get(my_key, Some(GetOptions::new().with_keys_only()))
                .await
        }
    };
    let answer = conn.call("extend", get).await?;
    Ok(answer
        .kvs()
        .first()
        .is_some_and(|kv| kv.create_revision() == rev))
}

impl EtcdHeld {
    /// etcd cannot change a lease's ttl: attach our key to a new lease of the new ttl (the
    /// key, and so its create revision, stays), then revoke the old lease.
    async fn move_to_new_lease(&mut self, asked: i64) -> Result<()> {
        const OP: &str = "extend";
        let mut fresh = LeaseHandle::new(&self.conn, asked);
        fresh.grant(OP).await?;
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.my_key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::put(
                self.my_key.as_str(),
                "",
                Some(PutOptions::new().with_lease(fresh.id)),
            )]);
        if !self.conn.txn(OP, txn).await?.succeeded() {
            return Err(not_held(&self.key));
        }
        // The old lease holds no key any more.
        std::mem::replace(&mut self.lease, fresh).revoke_in_background();
        Ok(())
    }
}

#[async_trait]
impl Held for EtcdHeld {
    async fn release(&mut self) -> Result<()> {
        const OP: &str = "release";
        let txn = Txn::new()
            .when([Compare::create_revision(
                self.my_key.as_str(),
                CompareOp::Equal,
                self.rev,
            )])
            .and_then([TxnOp::delete(self.my_key.as_str(), None)]);
        let deleted = self.conn.txn(OP, txn).await;
        // The key is gone (or was not ours): the lease only holds server memory now, so its
        // revoke need not delay the caller. The lease is this acquisition's alone: revoking
        // it removes nothing of anyone else.
        self.lease.revoke_in_background();
        if deleted?.succeeded() {
            Ok(())
        } else {
            Err(not_held(&self.key))
        }
    }

    async fn extend(&mut self, ttl: Duration) -> Result<()> {
        let asked = whole_seconds(ttl);
        if asked != self.lease.asked {
            return self.move_to_new_lease(asked).await;
        }
        let Self {
            conn,
            my_key,
            rev,
            lease,
            key,
        } = self;
        let (alive, ours) =
            tokio::join!(lease.keep_alive("extend"), still_ours(conn, my_key, *rev));
        match alive {
            Err(e) if e.is_lease_gone() => return Err(not_held(key)),
            Err(e) => return Err(e.into()),
            Ok(()) => {}
        }
        if !ours? {
            return Err(not_held(key));
        }
        Ok(())
    }
}
