//! The lock operations of one [`Node`], each a single script call: acquire, refresh a
//! waiter, release, renew, proclaim, claim.

use std::time::Duration;

use redis::ScriptInvocation;

use crate::error::Error;
use crate::node::Node;
use crate::renew::HeldKey;
use crate::scripts::{self, Names};

/// The answer to one acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attempt {
    /// The key is ours, with this fencing token.
    Taken {
        /// The fencing token the server issued.
        fence: u64,
    },
    /// Someone holds the key, or it is free but another waiter's turn.
    Busy {
        /// How long the holder's ttl still runs; `None` when the key has no expiry (another
        /// library's lock taken without a timeout) or is free but another waiter's turn.
        pttl: Option<Duration>,
        /// The holder's token (the key's value), or the token of the waiter whose turn it
        /// is when the key is free.
        holder: String,
        /// The caller is the first live waiter in the key's queue: the key is its to take
        /// once the holder is gone.
        first: bool,
    },
    /// The key was held under the caller's owner: the attempt entered that hold (raised
    /// its count) at once. Only an owner's acquire ([`Node::acquire_owned`]) answers this.
    Entered {
        /// The hold's fencing token, the same for every entry of the hold.
        fence: u64,
        /// The hold's token (the lock key's value, the first entry's token).
        hold: String,
    },
}

/// How one acquire attempt treats the key's queue of waiters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Queueing {
    /// Join (or stay in) the queue when the key cannot be taken: the caller will wait.
    pub wait: bool,
    /// The caller's place in the queue, the same on every server a lock spans (Redlock);
    /// `None`: the server's clock in µs when the caller first joins.
    pub ticket: Option<u64>,
    /// A floor for the fencing token, proposed alike to every server a lock spans so that
    /// they issue the same token (see the acquire script); `None`: the server's clock.
    pub fence_floor: Option<u64>,
}

impl Node {
    /// One attempt to take the lock `names` with `token` for `ttl`: taken when the key is
    /// free and nobody waits before us; otherwise, with `queueing.wait`, we join the
    /// key's queue of waiters. A reader's token ([`scripts::new_reader_token`]) asks for a
    /// shared hold: taken when no writer holds the key and none waits before us. A permit's
    /// token ([`scripts::new_permit_token`]) asks for one of its limit's permits.
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script.
    pub async fn acquire(
        &self,
        names: &Names,
        token: &str,
        ttl: Duration,
        queueing: &Queueing,
    ) -> Result<Attempt, Error> {
        self.acquire_as(names, token, ttl, queueing, false).await
    }

    /// [`acquire`](Self::acquire), for an election candidate when `leader`: a grant then
    /// publishes on the key's channel, so observers see the new leader at once.
    pub(crate) async fn acquire_as(
        &self,
        names: &Names,
        token: &str,
        ttl: Duration,
        queueing: &Queueing,
        leader: bool,
    ) -> Result<Attempt, Error> {
        self.acquire_with(names, token, ttl, queueing, leader, None)
            .await
    }

    /// [`acquire_as`](Self::acquire_as), under `owner` when given (a reentrant hold, see
    /// the crate docs).
    pub(crate) async fn acquire_with(
        &self,
        names: &Names,
        token: &str,
        ttl: Duration,
        queueing: &Queueing,
        leader: bool,
        owner: Option<&str>,
    ) -> Result<Attempt, Error> {
        // The token says the mode: a reader's joins the readers, a permit's takes one of
        // its limit's permits, a writer's takes the key.
        let script = if scripts::is_reader_token(token) {
            &*scripts::ACQUIRE_SHARED
        } else if scripts::is_permit_token(token) {
            &*scripts::ACQUIRE_PERMIT
        } else {
            &*scripts::ACQUIRE
        };
        let mut call = script.prepare_invoke();
        queue_keys(&mut call, names)
            .arg(token)
            .arg(scripts::millis(ttl))
            .arg(scripts::millis(scripts::fence_lifetime(ttl)))
            .arg(if queueing.wait { "1" } else { "0" })
            .arg(ticket(queueing.ticket))
            .arg(queueing.fence_floor.unwrap_or(0))
            .arg(&names.channel)
            .arg(scripts::millis(scripts::WAITER_LEASE));
        if let Some(owner) = owner {
            call.key(&names.hold).arg("0").arg(owner);
        } else if leader {
            call.arg("1");
        }
        let attempt = self.attempt(&call).await?;
        // On a cluster, the key held with exactly this token means an earlier send of this
        // acquire ran though its answer was lost (a re-try after an I/O error or a
        // timeout): the key is ours, but its fencing token is unknown. Never leave it
        // locked for a full ttl: release it and try once more.
        if let Attempt::Busy { holder, .. } = &attempt
            && holder == token
            && owner.is_none()
            && std::ptr::eq(script, &*scripts::ACQUIRE)
            && self.is_cluster()
        {
            tracing::debug!(server = %self.addr(), "the key holds our own token: releasing it and trying again");
            self.release_as(names, token, true, leader).await?;
            return self.attempt(&call).await;
        }
        Ok(attempt)
    }

    /// Send one acquire script call and read its answer.
    async fn attempt(&self, call: &ScriptInvocation<'_>) -> Result<Attempt, Error> {
        // Taken: the fencing token, an integer; entered: `[fence, hold token]`; busy:
        // `[PTTL, holder, first]`.
        let reply: redis::Value = self.invoke("acquire", call).await?;
        if let redis::Value::Int(fence) = reply {
            return Ok(Attempt::Taken {
                fence: u64::try_from(fence).map_err(|_| self.reply("acquire", fence))?,
            });
        }
        if let redis::Value::Array(entered) = &reply
            && entered.len() == 2
        {
            let (fence, hold): (u64, String) =
                redis::from_redis_value(reply).map_err(|e| self.reply("acquire", e))?;
            return Ok(Attempt::Entered { fence, hold });
        }
        let (pttl, holder, first): (i64, Option<String>, i64) =
            redis::from_redis_value(reply).map_err(|e| self.reply("acquire", e))?;
        Ok(Attempt::Busy {
            pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
            holder: holder.unwrap_or_default(),
            first: first == 1,
        })
    }

    /// Refresh our entry in the key's queue of waiters (adding it back, with `ticket`, if
    /// it expired). `true`: the key is free and we are its first live waiter, so re-try.
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script.
    pub async fn touch(
        &self,
        names: &Names,
        token: &str,
        ticket: Option<u64>,
    ) -> Result<bool, Error> {
        self.touch_with(names, token, ticket, None).await
    }

    /// [`touch`](Self::touch); for a waiter of `owner`, `true` also when the key is held
    /// under that owner (re-try: the attempt enters the hold).
    pub(crate) async fn touch_with(
        &self,
        names: &Names,
        token: &str,
        ticket: Option<u64>,
        owner: Option<&str>,
    ) -> Result<bool, Error> {
        let mut call = scripts::TOUCH.prepare_invoke();
        queue_keys(&mut call, names)
            .arg(token)
            .arg(self::ticket(ticket))
            .arg(&names.channel)
            .arg(scripts::millis(scripts::WAITER_LEASE));
        if let Some(owner) = owner {
            call.key(&names.hold).arg(owner);
        }
        self.flag("touch", &call).await
    }

    /// Delete the lock if it is still ours and leave the key's queue of waiters; when
    /// `announce`, call the next waiter if the key is free now. `false`: the lock was not
    /// ours (the key was left alone). A waiter that gives up calls this too, to leave the
    /// queue.
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script.
    pub async fn release(&self, names: &Names, token: &str, announce: bool) -> Result<bool, Error> {
        self.release_as(names, token, announce, false).await
    }

    /// [`release`](Self::release), for a leader's hold when `leader`: a release then
    /// publishes on the key's channel even when nobody waits, for election observers.
    pub(crate) async fn release_as(
        &self,
        names: &Names,
        token: &str,
        announce: bool,
        leader: bool,
    ) -> Result<bool, Error> {
        self.release_with(names, token, announce, leader, None)
            .await
    }

    /// [`release_as`](Self::release_as); with `owner`, of the entry `token` of that
    /// owner's hold (see [`Node::release_owned`]).
    pub(crate) async fn release_with(
        &self,
        names: &Names,
        token: &str,
        announce: bool,
        leader: bool,
        owner: Option<&str>,
    ) -> Result<bool, Error> {
        let mut call = scripts::RELEASE.prepare_invoke();
        queue_keys(&mut call, names)
            .arg(token)
            .arg(&names.channel)
            .arg(if announce { "1" } else { "0" });
        if let Some(owner) = owner {
            call.key(&names.hold).arg("0").arg(owner);
        } else if leader {
            call.arg("1");
        }
        self.flag("release", &call).await
    }

    /// Give back the permit `token` took, and rejoin the key's queue of waiters with
    /// `ticket` (`None`: the server's clock), calling the waiter whose turn the permit is
    /// if that is not us: what a waiting Redlock round that lost does where it took one.
    /// `false`: the permit was not ours (we are queued all the same).
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script.
    pub async fn give_back_permit(
        &self,
        names: &Names,
        token: &str,
        queue_ticket: Option<u64>,
    ) -> Result<bool, Error> {
        let mut call = scripts::GIVE_BACK_PERMIT.prepare_invoke();
        queue_keys(&mut call, names)
            .arg(token)
            .arg(&names.channel)
            .arg(ticket(queue_ticket))
            .arg(scripts::millis(scripts::WAITER_LEASE));
        self.flag("give back", &call).await
    }

    /// Replace our token `held` by `new` (the same random bits, another value) if the key
    /// still holds it, keeping its ttl, and wake the election's observers. `false`: the key
    /// is not ours (nothing changed).
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script.
    pub(crate) async fn proclaim(
        &self,
        names: &Names,
        held: &str,
        new: &str,
    ) -> Result<bool, Error> {
        let mut call = scripts::PROCLAIM.prepare_invoke();
        call.key(&names.key).arg(held).arg(new).arg(&names.channel);
        self.flag("proclaim", &call).await
    }

    /// Reset a leader's ttl and its fence counter's lifetime if the key is still ours, in
    /// a request of its own. `false`: it was not ours.
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script.
    pub async fn extend_leader(
        &self,
        names: &Names,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, Error> {
        let mut call = scripts::EXTEND_LEADER.prepare_invoke();
        call.key(&names.key)
            .key(&names.fence)
            .arg(token)
            .arg(scripts::millis(ttl))
            .arg(scripts::millis(scripts::fence_lifetime(ttl)));
        self.flag("extend", &call).await
    }

    /// Reset the lock's ttl if it is still ours. `false`: it was not ours.
    ///
    /// Batched with the other renewals on this server, as [`Node::renew`], which a holder
    /// that renews repeatedly should call instead (it allocates nothing per renewal).
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script.
    pub async fn extend(&self, names: &Names, token: &str, ttl: Duration) -> Result<bool, Error> {
        self.renew(&HeldKey::new(names, token), ttl).await
    }

    /// Reset the ttl of one key, in a request of its own.
    pub(crate) async fn extend_one(&self, key: &HeldKey, ttl: Duration) -> Result<bool, Error> {
        if key.hold().is_some() {
            // An owner's entry: the batch script renews those.
            return self.renew_many(&[(key.clone(), ttl)]).await.map(|s| s[0]);
        }
        let mut call = scripts::EXTEND.prepare_invoke();
        call.key(key.key())
            .arg(key.token())
            .arg(scripts::millis(ttl));
        self.flag("extend", &call).await
    }

    /// Make the lock ours if it is missing, and raise the fence counter to at least `fence`.
    /// `false`: another holder has the key.
    ///
    /// # Errors
    /// The server could not be reached, timed out, or refused the script.
    pub async fn claim(
        &self,
        names: &Names,
        token: &str,
        ttl: Duration,
        fence: u64,
    ) -> Result<bool, Error> {
        let mut call = scripts::CLAIM.prepare_invoke();
        call.key(&names.key)
            .key(&names.fence)
            .arg(token)
            .arg(scripts::millis(ttl))
            .arg(fence)
            .arg(scripts::millis(scripts::fence_lifetime(ttl)));
        self.flag("claim", &call).await
    }
}

/// The keys of the scripts that read the queue, in their order: lock, fence, queue,
/// waiters' expiries.
pub(crate) fn queue_keys<'a, 'b>(
    call: &'b mut ScriptInvocation<'a>,
    names: &Names,
) -> &'b mut ScriptInvocation<'a> {
    call.key(&names.key)
        .key(&names.fence)
        .key(&names.queue)
        .key(&names.waiters)
}

/// A queue ticket as the scripts take it: empty for "the server's clock".
fn ticket(ticket: Option<u64>) -> String {
    ticket.map(|t| t.to_string()).unwrap_or_default()
}
