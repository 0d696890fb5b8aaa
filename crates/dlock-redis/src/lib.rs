//! A dlock backend for one Redis server.
//!
//! ```no_run
//! # async fn demo() -> dlock_core::Result<()> {
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, LockOptions, Wait};
//!
//! let lock = dlock_redis::from_url("redis://127.0.0.1:6379").await?;
//! let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
//! let lease = lock.acquire("reports/nightly", &opts).await?;
//! // ... work, passing lease.fencing_token() to storage that checks it ...
//! lease.release().await
//! # }
//! ```
//!
//! [`RedisLock`] is a [`dlock_core::raw::LockClient`]: it adds key checks, the per-process FIFO
//! gate, the deadline and the renewal watchdog to the protocol below. A client keeps two
//! connections to the server: one multiplexed connection for every request of every task,
//! and one subscriber connection (opened when an acquire first has to wait) that listens
//! for the release of every key its waiters want. Holding keeps no subscription and no task
//! per key in this crate: one renewal task per server serves every held key.
//!
//! # Protocol
//!
//! Keys on the server (`<prefix>` defaults to `dlock:`):
//!
//! | what | name | value |
//! |---|---|---|
//! | lock | `<prefix><key>` | the holder's token: 128 random bits, hex; ttl = the lease's |
//! | fence counter | `{<prefix><key>}:fence` | the last fencing token; expires 1 h after the last grant's ttl |
//! | release channel | `{<prefix><key>}:released` | (pub/sub) each message is a released token |
//!
//! Every step that reads and writes is one Lua script, run atomically by the server as
//! `EVALSHA` (the scripts are loaded when a connection opens; after a server restart or
//! `SCRIPT FLUSH` a `NOSCRIPT` answer makes the call load the script and run it again).
//!
//! 1. **Acquire**: `SET lock token NX PX ttl`. When it is set, the fencing token is
//!    `max(counter + 1, server time in µs)`, stored back in the fence counter and returned.
//!    When the key is held, the script returns its `PTTL` and the holder's token instead.
//! 2. **Wait** (only when the deadline allows): subscribe to the key's release channel and
//!    wait for the server's confirmation, *then* try again, so a release between the failed
//!    try and the subscription is seen by the re-try. Then sleep until the holder that the
//!    last try saw announces its release, or its PTTL runs out (a crashed holder announces
//!    nothing), whichever comes first, and try again. A release message carries the
//!    released token, so a late message about an earlier holder wakes nobody. No polling
//!    interval: only a key without expiry (another library's lock taken without a timeout)
//!    is re-checked every second.
//! 3. **Extend** (the watchdog, every ttl/3 less a jitter): `PEXPIRE lock ttl` if the lock
//!    still holds our token; otherwise [`LockError::NotHeld`](dlock_core::LockError::NotHeld)
//!    and `lost()`. Renewals are coalesced per server: every extend of the client goes to
//!    one queue, and one task sends whatever has queued (up to 512 keys) as one script call,
//!    `KEYS` = the lock keys, `ARGV` = each key's token and ttl, answering one status per
//!    key, so a key that is not ours fails only its own lease. There is no timer: a lone
//!    extend goes out at once, and a batch is what queued while the previous one was in
//!    flight. A batch that fails (timeout, broken connection) fails each of its extends,
//!    which the watchdog retries as before.
//! 4. **Release**: `DEL lock` if it still holds our token, then `PUBLISH channel token`; a
//!    key that is not ours is left alone and the release reports `NotHeld`.
//! 5. **Cancelled acquire**: if an acquire future is dropped while its request is in flight,
//!    a background release with the same token removes the key it may have taken.
//!
//! Round trips (RTT = one request and its answer):
//!
//! | operation | round trips |
//! |---|---|
//! | `try_acquire`, key free | 1 |
//! | `try_acquire`, key held | 1 |
//! | `acquire` that waits | 1 try, 1 `SUBSCRIBE` (on the subscriber connection, opened once per client), 1 re-try; then 1 re-try per wake-up |
//! | `extend` (each renewal) | 1, shared with the renewals queued with it: N held keys cost about N / batch size requests (one server command each) per renewal round |
//! | `release` | 1 (the `PUBLISH` is inside the script) |
//! | contended hand-off | the release (1), the server pushes the message, the waiter re-tries (1): about 1.5 RTT from the release call to the next holder |
//! | first use of a client | connect, then 1 pipelined `SCRIPT LOAD` of all scripts |
//!
//! # Capabilities
//!
//! | capability | value | why |
//! |---|---|---|
//! | fair | no | every waiter is woken by a release and they race; the local gate keeps FIFO among the tasks of one client only |
//! | fencing | best effort | the counter lives in the server's memory; tokens are floored by the server clock (µs), so they keep increasing across a restart without persistence or a failover unless the server clock steps back |
//! | expiry | ttl | a silent holder's key expires `ttl` after its last renewal |
//! | releases on disconnect | no | the key is not tied to a connection: a killed holder's key frees after its ttl |
//! | wake-up | notification, not one per release | pub/sub wakes every waiting client of the key; all but one go back to sleep |
//! | max key length | 1024 bytes | the core's default |
//!
//! # URL
//!
//! ```text
//! redis://[user[:password]@]host[:port][/db][?option=value&…]
//! rediss://…[?ca=PATH][&cert=PATH&key=PATH]     (TLS with rustls; feature `tls`, on by default)
//! ```
//!
//! | part | default | meaning |
//! |---|---|---|
//! | `user`, `password` | none | `AUTH` (percent-encoded in the URL) |
//! | `port` | 6379 | |
//! | `/db` | 0 | `SELECT db` |
//! | `prefix` | `dlock:` | prepended to every lock key; may be empty (`?prefix=`), so a lock shares its key with another library's lock of the same name (redis-py, redsync, node-redlock use `SET key token NX PX` and compare-and-delete too, so they exclude each other) |
//! | `connect_timeout` | `5s` | bound on opening a connection (`500ms`, `5s`, `1.5s`, `2m`; a bare number is refused) |
//! | `response_timeout` | `2s` | bound on each answer; a connection that times out is replaced |
//! | `ca` | the system's roots | `rediss://` only: PEM file of the CA certificate(s) to trust *instead of* the system's roots |
//! | `cert`, `key` | none | `rediss://` only, together: PEM files of a client certificate (chain) and its private key, for a server with `tls-auth-clients yes` |
//!
//! An unknown option, a bad value, a second host, another scheme, `ca`, `cert` or `key`
//! without TLS, or `cert` without `key` (or the reverse) is
//! [`LockError::InvalidConfig`](dlock_core::LockError::InvalidConfig) before any network I/O.
//! So is a `ca`, `cert` or `key` file that cannot be read, holds no PEM certificate or key,
//! or a key that is not the certificate's: the files are read when the client is built,
//! and the errors name the option and the path, never the files' contents.
//!
//! # TLS
//!
//! `rediss://` (feature `tls`, on by default) verifies the server's certificate against the
//! `ca` file, or else the system's root certificates, and checks that it names the host of
//! the URL (an IP address must be in the certificate's subject alternative names). There is
//! no option to skip verification. A server that is not trusted, or that wants a client
//! certificate the client lacks or refuses the one it has, is a
//! [`LockError::Backend`](dlock_core::LockError::Backend) error saying `TLS failed`, at
//! once: not a timeout, and not retried as `Unavailable`. A mix-up of ports is not
//! recognised as such: a plain Redis server never answers a TLS hello (it waits for the
//! end of a command line), so `rediss://` to a plain port fails after `connect_timeout`,
//! and `redis://` to a TLS port is reset at once; both are `Unavailable`.
//!
//! **Crypto provider.** The client library (redis-rs) builds its rustls configuration on
//! every connect from rustls's *process-default* crypto provider, and takes no
//! configuration or provider from us. Left alone, rustls picks that default from its crate
//! features, and panics when they name none or more than one: a binary where another
//! dependency enables rustls's `aws-lc-rs` beside the `ring` this crate uses (or
//! `custom-provider`) would panic on its first `rediss://` connect. So before the first TLS
//! client is built, this crate installs rustls's `ring` provider as the process default,
//! **unless one is installed already**: an application that wants another provider (FIPS
//! `aws-lc-rs`, say) installs it with `CryptoProvider::install_default` before connecting,
//! and every TLS connection of this crate uses it. An application that installs its own
//! *after* the first `rediss://` client gets an error from `install_default` (one default
//! per process), as it would after redis-rs had installed one itself.
//!
//! # Failure modes
//!
//! - **Partition or black-holed server**: every request fails after the response timeout
//!   (`Unavailable`); the watchdog keeps retrying renewals and fires `lost()` a safety margin
//!   (ttl/10 + 2 ms) before the key can expire on the server, so the holder hears of the loss
//!   before another client can take the key. A waiting acquire returns `Unavailable`.
//! - **Connection killed** (`CLIENT KILL`, a server restart, a reset): the next request opens
//!   a new connection; a renewal in between is retried, so the lease survives if the server
//!   still has the key. Waiters re-subscribe on a new subscriber connection and re-try.
//! - **Server restart without persistence**: held keys vanish, so the next renewal answers
//!   "not ours" and `lost()` fires (another client may already hold the key: that is what the
//!   fencing token is for). The fence counter is gone too; tokens stay increasing through the
//!   clock floor.
//! - **Holder crash**: nothing releases the key; it frees when its ttl runs out, and a waiter
//!   is woken at that moment by its PTTL timer.
//! - **Failover to a replica** (Sentinel, managed Redis): replication is asynchronous, so a
//!   lock acquired just before the failover can be granted again. Use the fencing token, or
//!   Redlock over independent servers.

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod config;
mod error;
mod gather;
mod lock;
mod node;
mod renew;
mod scripts;
mod subscriber;
#[cfg(feature = "tls")]
mod tls;
mod wait;

pub mod server;

use dlock_core::Result;
use dlock_core::raw::LockClient;

pub use config::RedisConfig;
pub use lock::RedisBackend;

/// The Redis lock: a [`LockClient`] of a [`RedisBackend`].
pub type RedisLock = LockClient<RedisBackend>;

/// URL schemes this backend serves: `redis://` and `rediss://` (TLS).
pub const SCHEMES: &[&str] = &["redis", "rediss"];

pub(crate) const NAME: &str = "redis";

/// Connect to the server a `redis://` or `rediss://` URL names (grammar in the crate docs).
///
/// The whole URL is parsed and checked before any network I/O; then the command connection
/// opens, bounded by the connect timeout.
///
/// # Errors
/// [`LockError::InvalidConfig`](dlock_core::LockError::InvalidConfig) for a bad URL,
/// [`LockError::Unavailable`](dlock_core::LockError::Unavailable) when the server cannot be
/// reached, [`LockError::Backend`](dlock_core::LockError::Backend) when it refuses (wrong
/// password, not a Redis server).
pub async fn from_url(url: &str) -> Result<RedisLock> {
    let config = RedisConfig::from_url(url)?;
    Ok(LockClient::new(RedisBackend::connect(config).await?))
}
