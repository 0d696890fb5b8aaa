//! A dlock backend for Redis: one server, a master found through Sentinel, or a Redis
//! Cluster (see *Topologies*).
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
//! connections to the server (on a cluster, the command side is one connection per node): one multiplexed connection for every request of every task,
//! and one subscriber connection (opened when an acquire first has to wait, or an election
//! is first observed) on which its waiters are called and its election observers woken. Holding keeps no subscription and no task per key in this crate:
//! one renewal task per server serves every held key.
//!
//! # Protocol
//!
//! Keys on the server (`<prefix>` defaults to `dlock:`):
//!
//! | what | name | value |
//! |---|---|---|
//! | lock | `<prefix><key>` | the holder's token: 128 random bits, hex, a space and the holder's `NAME@HOST:PID` (see *Inspecting*); ttl = the lease's |
//! | lock, held shared | `<prefix><key>` | sorted set: reader token (`r` + a writer's token) by when its entry expires (server clock, µs); the key's ttl = the longest entry's |
//! | lock, held by permits | `<prefix><key>` | the same sorted set of permit tokens (`p` + the limit + `.` + a writer's token) |
//! | fence counter | `{<prefix><key>}:fence` | the last fencing token; expires 1 h after the last grant's ttl |
//! | waiters' queue | `{<prefix><key>}:queue` | sorted set: waiter token by enqueue ticket (server clock, µs) |
//! | waiters' expiries | `{<prefix><key>}:waiters` | sorted set: waiter token by when its entry expires (server clock, µs) |
//! | call channel | `{<prefix><key>}:released` | (pub/sub) each message is the token of the waiter whose turn it is, or `!leader` for election observers (see *Elections*) |
//! | an owner's hold | `{<prefix><key>}:hold` | hash: the owner id, the hold's random part, its fencing token, one `+<random part>` field per entry (see *Reentrant holds*); the lock key's ttl |
//!
//! Every step that reads and writes is one Lua script, run atomically by the server as
//! `EVALSHA` (the scripts are loaded when a connection opens; after a server restart or
//! `SCRIPT FLUSH` a `NOSCRIPT` answer makes the call load the script and run it again).
//! Every script that reads the queue first drops the waiters whose entries expired; if
//! that drops the first waiter while the key is free, it calls the next one.
//!
//! 1. **Acquire**: `SET lock token NX PX ttl`, but only when nobody waits or the caller is
//!    the first live waiter (taking the key leaves the queue). When it is set, the fencing
//!    token is `max(counter + 1, server time in µs)`, stored back in the fence counter and
//!    returned. Otherwise the script returns the holder's `PTTL` and token (or, for a free
//!    key that is another waiter's turn, that waiter's token) and whether the caller is
//!    first in line; a caller that will wait joins the queue in the same script (ticket:
//!    the server clock in µs; the entry expires [`server::WAITER_LEASE`], 3 s, after its
//!    last refresh, and so does the queue after the last write to it). `try_acquire`
//!    never joins, and takes a free key only when nobody waits. When nobody waits (the
//!    queue key exists only while someone does), the script reads no queue: one `EXISTS`,
//!    the `SET`, the server's `TIME` and one `SET … GET` of the fence counter (which writes
//!    the candidate token and answers the last one; a second `SET` only when the clock is
//!    not ahead of the counter); the reply is the bare token. That path runs first in the
//!    script, before the helpers the other paths need are defined, and the release of a
//!    writer's own token with nobody waiting does the same (`GET`, `DEL`, `EXISTS`).
//! 2. **Wait** (only when the deadline allows): subscribe to the key's call channel and
//!    wait for the server's confirmation, *then* try again, so a call between the failed
//!    try and the subscription is seen by the re-try. Then sleep until the server calls
//!    this waiter by its token (a release, a waiter giving up, an expired waiter
//!    dropped: the script publishes the token of the first live waiter, so one release
//!    wakes one waiter, and the others ignore a message that is not theirs), and try again.
//!    The first waiter also wakes when the holder's PTTL runs out (a crashed holder calls
//!    nobody). Every [`server::TOUCH_EVERY`] (1 s) a waiter refreshes its entry; the
//!    refresh answers whether the key is free and the caller first, and if so the waiter
//!    tries again: that is how a release nobody announced (another library's lock, an
//!    operator's `DEL`, a key without expiry) is noticed, within 1 s. A refresh that finds
//!    nothing wakes nobody (it is not counted as a wake-up).
//! 3. **Extend** (the watchdog, every ttl/3 less a jitter): `PEXPIRE lock ttl` if the lock
//!    still holds our token; otherwise [`LockError::NotHeld`](dlock_core::LockError::NotHeld)
//!    and `lost()`. Renewals are coalesced per server: every extend of the client goes to
//!    one queue, and one task sends whatever has queued (up to 512 keys) as one script call,
//!    `KEYS` = the lock keys, `ARGV` = each key's token and ttl, answering one status per
//!    key, so a key that is not ours fails only its own lease. There is no timer: a lone
//!    extend goes out at once, and a batch is what queued while the previous one was in
//!    flight. A batch that fails (timeout, broken connection) fails each of its extends,
//!    which the watchdog retries as before.
//! 4. **Release**: `DEL lock` if it still holds our token; then, only if anyone waits,
//!    leave the queue and `PUBLISH channel <first waiter's token>`. A key that is not ours
//!    is left alone and the release reports `NotHeld`.
//! 5. **Giving up**: a waiter whose deadline passes, whose acquire fails or whose future
//!    is dropped leaves the queue in the background (the release script with its token,
//!    which calls the next waiter if it was first). If an acquire future is dropped while
//!    its request is in flight, the same call removes the key it may have taken.
//!
//! **Shared holds** (readers, [`LockOptions::shared`](dlock_core::LockOptions::shared)).
//! Readers hold the lock key itself as a sorted set, so a plain `SET key val NX` client
//! (and the exclusive acquire, unchanged) sees the key busy while any reader holds it, and
//! a reader sees it busy while a writer or another library's lock holds it. A reader's
//! token starts with `r`: every script tells the modes apart by the token, and a writer
//! and a reader share the one queue, ordered by ticket.
//!
//! - *Acquire shared*: one script. It drops reader entries whose expiry passed; if no
//!   writer holds the key and nobody waits, it adds the reader (`ZADD`, expiry now + ttl),
//!   sets the key's `PEXPIRE` to the longest entry and returns a fencing token from the
//!   key's one counter (so a read token is greater than every earlier writer's, and a
//!   write token greater than every earlier reader's). A caller that will wait and finds
//!   a queue joins it first, and joins the readers only when no *writer* waits before it:
//!   readers that arrive behind a waiting writer queue behind it, and the run of readers
//!   a release calls all get in. `try_acquire` joins only when nobody waits.
//! - *Extend*: the reader's entry gets expiry now + ttl and the key the longest entry's
//!   (in the same batched renewal script: each key is checked by its token's mode).
//!   An entry that expired is not renewed: `NotHeld`.
//! - *Release*: `ZREM` the reader, drop expired entries, re-set the key's ttl (the key
//!   vanishes with its last entry). A writer's release and the last reader's call the
//!   waiters that may now go: the first one, and when it is a reader every reader right
//!   behind it up to the first writer, each by its own message (each is one wake-up).
//!   A release that leaves readers holding calls nobody.
//! - *Crashed reader*: its entry expires on its own, and with it the key when it was the
//!   longest-lived; the first waiter (and every reader before the first writer) wakes
//!   at the key's PTTL, as for a crashed writer.
//!
//! **Permits** (a counting semaphore, [`LockOptions::permits`](dlock_core::LockOptions::permits)).
//! A permit's token is `p`, its limit `N` in decimal, `.` and a writer's token, so
//! every script reads each holder's and waiter's limit from its token. Permit holders are
//! members of the sorted set at the lock key, as readers are (token by when its entry
//! expires; the key lives as long as its longest entry), and share the one queue.
//!
//! - *Acquire permit*: one script. It drops expired entries and waiters; a caller that
//!   will wait and finds a queue joins it first. The caller takes a permit when
//!   `held + rank < N`: `held` the live entries, `rank` the waiters before it in the queue
//!   (all of them for a caller not in it, `try_acquire` included). So the first `N - held`
//!   waiters may go at once and a newcomer never takes a permit promised to a waiter.
//!   Taking it adds the entry, leaves the queue and draws a fencing token from the key's
//!   one counter (unique and increasing on the key). Otherwise the caller joins the queue
//!   (if it waits) and the answer is the soonest-expiring entry's PTTL, with `first` set
//!   for the waiter to which that permit would go.
//! - *Extend*: the member's entry gets expiry now + ttl, as a reader's.
//! - *Release*: `ZREM` the entry, then call the one waiter whose turn that makes (rank
//!   `N - held - 1` after the release), by its token. A waiter that gives up does the same
//!   for the waiter its leaving moves up. Taking a permit changes nobody's turn (`held`
//!   grows as the ranks behind shrink), so it calls nobody. When a script drops expired
//!   entries or waiters, it calls every waiter whose turn it is.
//! - *Crashed holder*: its entry expires `ttl` after its last renewal; the waiter it was
//!   promised to wakes at that entry's PTTL (not the key's, which is the longest entry's)
//!   and its attempt drops it. A refresh (every 1 s) also answers whether the waiter's turn
//!   came.
//! - Clients that disagree on `N` each count the holders against their own (Curator's
//!   rule, see [`Mode::Permits`](dlock_core::Mode::Permits)); permits, shared and
//!   exclusive holds of one key are not checked against each other.
//!
//! A permit costs the round trips of a reader: acquire 1 (free) or 1 + `SUBSCRIBE` + 1
//! and 1 per call while waiting, extend 1 (batched), release 1, a contended hand-off
//! about 1.5 RTT. The scripts read the queue up to the caller (bounded by the waiting
//! clients, 1000 at most per script).
//!
//! The round trips are those of the exclusive lock below. The exclusive acquire and its
//! uncontended cost are unchanged (its release and renewal check the key with a `GET`
//! that tolerates a sorted set); a reader pays a `ZRANGE` for the key's longest entry
//! more, and the queue scripts a `TYPE` and, when waiters queue behind readers, a read of
//! the queue ahead of the caller (bounded by the number of waiting clients).
//!
//! **Order and bounds.** Waiting clients are served in the order they joined the queue
//! (the per-process gate orders one client's tasks, so each client has at most one waiter
//! per key). A waiter that crashed or was cut off stops refreshing its entry: the entry
//! expires 3 s after its last refresh and the next script to run (a refresh of any other
//! waiter, at most 1 s later) drops it and calls the next waiter, so an abandoned waiter
//! holds the line up at most 4 s (`WAITER_LEASE + TOUCH_EVERY`). A waiter whose refreshes
//! fail for longer than 3 s loses its place and re-joins at the back. The queue keys
//! vanish with the last waiter (an emptied sorted set is deleted) or expire 3 s after the
//! last write to them; nothing stays behind a finished lock but the fence counter.
//!
//! Round trips (RTT = one request and its answer):
//!
//! | operation | round trips |
//! |---|---|
//! | `try_acquire`, key free | 1 |
//! | `try_acquire`, key held | 1 |
//! | `acquire` that waits | 1 try (joins the queue), 1 `SUBSCRIBE` (on the subscriber connection, opened once per client), 1 re-try; then 1 re-try per call, and 1 refresh per second while waiting |
//! | `extend` (each renewal) | 1, shared with the renewals queued with it: N held keys cost about N / batch size requests (one server command each) per renewal round |
//! | `release` | 1 (the call of the next waiter is inside the script) |
//! | contended hand-off | the release (1), the server pushes the call to one waiter, which re-tries (1): about 1.5 RTT from the release call to the next holder |
//! | `inspect` | 1 (one read-only script) |
//! | `list` | 1 per `SCAN` page (1000 names), then 1 pipelined `TYPE` |
//! | first use of a client | connect, then 1 pipelined `SCRIPT LOAD` of all scripts |
//!
//! Measured (lockbench, one client, ttl 30 s with auto-renew, Redis 7.0.15 on loopback, 2
//! shared and busy cores): an uncontended acquire + release takes 51–55 µs (p50) against
//! 35–37 µs for a raw `SET NX PX` + `DEL`, 1.44–1.55× (1.47–1.61× before the acquire
//! script skipped an empty queue, in alternating runs). The server runs the uncontended
//! acquire script at about the rate of a plain `SET NX PX` (33–37 k against 36–39 k per
//! second, 32 clients); what remains is the fence counter's read and write, the server's
//! `TIME` and the script call itself (about 5 µs of server time per cycle), and the core's
//! per-lease work (the local gate, the lease, its watchdog task: about 4 µs).
//!
//! # Key sets
//!
//! A set of keys taken as one hold ([`LockExt::acquire_all`](dlock_core::LockExt::acquire_all))
//! is taken key by key, in ascending byte order, each key with the protocol above: one
//! acquire script per key, so N free keys cost N round trips, and each key has its own token
//! and fence counter. Not one script for the whole set: a script cannot wait, and taking the
//! keys in one order while holding the earlier ones is what keeps overlapping sets from
//! deadlocking. While a set is being taken, its keys taken so far are held like any key: a
//! waiter on one of them queues in that key's waiter queue and is called when the set
//! releases the key, or gives it back because a later key stayed busy (before `acquire_all`
//! returns).
//!
//! # Reentrant holds
//!
//! An acquire with an owner ([`LockOptions::owner`](dlock_core::LockOptions::owner)) takes
//! the key as any exclusive acquire does: the lock key holds the first acquire's token, so
//! plain clients, other libraries' locks and `inspect` see one writer. Beside it, in the
//! same hash slot, the hash `{<prefix><key>}:hold` keeps the owner id, the *hold id* (the
//! random part of the lock key's token: which continuous hold the hash is of), the hold's
//! fencing token, and one field `+<random part>` per *entry*, named by the token each
//! owner's acquire sends: the hold's count is the number of entries. The hash gets the
//! lock key's `PEXPIRE` in the same script every time, so the two expire together, and
//! the last entry's release deletes both. Every step reads the hash only when its hold id
//! is the lock key's: a hash that outlived its key (the key expired or was deleted, and
//! someone else may hold it now) is ignored, and the next first acquire overwrites it.
//!
//! - **Acquire** (1 round trip, the acquire script with the hold hash as a fifth key and
//!   the owner id): when the key is held under the owner (by any client or process), add
//!   the caller's entry, raise the hold's ttl to the caller's if that is longer (never
//!   shorter), leave the queue if the caller waits in it, and answer the hold's fencing
//!   token and token *at once*, however many wait. Otherwise it is the exclusive acquire
//!   above, and a grant writes the hash with the caller's one entry. A plain acquire of a
//!   key held under an owner, and an owner's acquire of a key held plainly or under another
//!   owner, wait as for any holder. An owner's waiter's refresh (every 1 s) also answers
//!   whether the key is now held under its owner (another client of the owner was first in
//!   line), and then it re-tries and enters at once.
//! - **Renewal** (1 round trip, batched with the client's other renewals): the entry's
//!   token goes in the batch with a `+` in front and the hold hash among the keys; the
//!   entry is renewed while it is in the key's current hold, and the key and the hash get
//!   `PEXPIRE ttl` only when `ttl` exceeds the key's `PTTL`, so entries with different
//!   ttls renew one hold without ever shortening it. An entry that is gone (the hold
//!   expired or was broken, or a later hold replaced it) is `NotHeld`, so every lease of
//!   a lost hold hears `lost()` at its next renewal (ttl/3) at the latest.
//! - **Release** (1 round trip, the release script with the hold hash and the owner id):
//!   `HDEL` the entry if the hash is of the key's current hold under this owner; when it
//!   was the last entry, `DEL` the key and the hash, and only then call the next waiter
//!   (and publish for observers). An entry that is not in the current hold (released
//!   already, or of an earlier hold of the same owner) is `NotHeld` and changes nothing:
//!   a lease of an earlier hold never lowers a later hold's count. A cancelled owner's
//!   acquire drops the entry its token may have made in the background, as a cancelled
//!   acquire releases the key it may have taken.
//! - **Inspect** (1 round trip): one exclusive holder with the hold's fencing token; its
//!   `who` reads `<owner> (held <n> times; <NAME@HOST:PID of the first entry>)`.
//!
//! Entries are named by 128-bit random tokens, so concurrent re-entries and releases of
//! one owner, in one client or many, never stand on each other, and the client keeps no
//! per-key state: several leases of one hold in one client are independent handles.
//!
//! Declared [`Reentry::AnyLease`](dlock_core::Reentry::AnyLease): no connection or session
//! owns the key or the hold; they live under a ttl that any entry's renewal keeps up, in
//! whichever client or process. The key frees at the last release, or a ttl after the last
//! renewal when some entry is never released (its process crashed): a crashed holder's
//! key frees within its ttl whatever its count. A restarted process with the same owner id
//! can re-enter a hold its previous run left while the hold lives (within the ttl of its
//! last renewal): its acquire gets the same fencing token and its own entry, which it
//! renews and releases. It cannot release the previous run's entries (they are named by
//! tokens it never saw), so the hold then ends a ttl after the last renewal, not at the
//! new run's last release; once the hold expired, its acquire starts a new hold with a
//! higher token.
//!
//! Plain holds pay nothing for this: their scripts read no hold hash. An owner's first
//! acquire costs a `GET` and an `HMGET` more than a plain one, and writing the hash.
//!
//! # Elections
//!
//! An [`Election`](dlock_core::Election) is the exclusive lock above, with the candidate's
//! value where a plain hold keeps its holder description: the token of a campaign is 128
//! random bits in hex, a space and the value, so `inspect` shows the value as the holder's
//! `who` and [`leader`](dlock_core::Election::leader) reads it with the term (the fence
//! counter, as for any writer). No escaping is needed: the core admits only values without
//! control characters (1 to 256 bytes), the value is everything after the token's *first*
//! space (so spaces, colons and any Unicode come back as they went), and the scripts
//! store and compare tokens as bytes. Every owner check of a writer's token (renewal,
//! release, proclaim, the Redlock claim) compares only its *owner part*, the 32 random
//! hex digits before the first space, so the hold is the same whatever value follows
//! them (a value that is not one of our tokens matches only itself). Any client can read the leader with a `GET` of the
//! lock key. There is no standard Redis election recipe to be compatible with; with an
//! empty prefix, another library's lock of the same name excludes candidates as it
//! excludes holders.
//!
//! - **Campaign**: the acquire script with one more argument, which makes a grant
//!   `PUBLISH` `!leader` on the key's channel (no token starts with `!`, so waiters
//!   ignore it). Round trips as an acquire: 1 when the key is free; a waiting candidate
//!   queues, is called and re-tries as any waiter. Plain acquires pass no such argument
//!   and publish nothing.
//! - **Proclaim**: one script (1 round trip): if the key holds the leader's token, `SET`
//!   it to the same random bits with the new value, `KEEPTTL` (Redis 6.0 or later), and
//!   `PUBLISH !leader`; otherwise `NotHeld` and nothing changes. The owner identity (the
//!   random bits) stays, and the handle checks with the new token from then on.
//!   **A lost answer or a cancelled proclaim cannot end a held leadership**: the script
//!   either ran or did not, and either way the key holds a token with the leader's random
//!   bits, which is all the owner checks of its renewals, its release and its next
//!   proclaim compare. So a proclaim whose answer timed out, or whose future was dropped
//!   after the script was sent, leaves the hold renewed and released as before; only the
//!   published value is then unknown to the caller (an error, or no answer), and the next
//!   proclaim sets it either way.
//! - **Renewal** of a leader: 1 round trip of its own (not in the batch), which also
//!   re-sets the fence counter's lifetime (ttl + 1 h), so the term `leader()` reads does
//!   not expire under a leader that leads for more than an hour.
//! - **Resign** (or a dropped leadership): the release script, which `PUBLISH`es
//!   `!leader` even when nobody waits (1 round trip), then calls the next candidate.
//! - **Leader**: the inspect script, 1 round trip.
//! - **Observe**: one `SUBSCRIBE` to the key's channel on the client's subscriber
//!   connection (shared with its waiters and other observers, opened once per client),
//!   confirmed before the first read; then one read of the leader per message (the
//!   messages queued meanwhile are answered by the same read), and one every 500 ms when
//!   nothing came ([`Observe::Woken`](dlock_core::Observe::Woken), `recheck` 500 ms).
//!   Every change this crate makes publishes: a campaign's grant (a waiting candidate's
//!   included, so an observer never has to catch the moment between a release and the
//!   next grant), a proclaim, a leader's release. What publishes nothing, and what the
//!   recheck bounds, is a leader's key *expiring* (a crashed or cut-off leader with no
//!   candidate waiting; a waiting one takes the key at its PTTL and its grant publishes)
//!   or another client's `DEL`. A broken subscriber connection (messages may be lost)
//!   ends the stream with `Unavailable`.
//!
//! # Inspecting
//!
//! [`inspect`](dlock_core::DistributedLock::inspect) runs one read-only script (one round
//! trip, `EVALSHA`) that changes nothing: it drops no expired entry and calls no waiter.
//! It reads the lock key's `TYPE`, then for a writer its value, its `PTTL` and the fence
//! counter, for readers and permits the sorted set's entries whose expiry is still ahead
//! (`ZRANGEBYSCORE`), and the queue in ticket order (`ZRANGE`), keeping the waiters whose
//! entry in the expiries set is still live (`ZSCORE` each; the first 1000, as every
//! script reads). It shows:
//!
//! - **holders**: a writer (or another library's lock, as an exclusive holder), or every
//!   live reader or permit (`Permits(N)` with the limit its token carries), each with its
//!   remaining ttl (`PTTL`; an entry's expiry less the server's `TIME`). The fencing token
//!   is shown for a writer only: it is the fence counter, which no grant changes while a
//!   writer holds the key. Readers and permits show none (the counter keeps only the last
//!   of their tokens), nor does another library's lock. `since` is not stored: `None`.
//! - **who**: every token carries its holder's
//!   [`holder_description`](dlock_core::holder_description) (`NAME@HOST:PID`) after its 128
//!   random bits and a space. The description rides in the value the scripts store anyway,
//!   so it costs no request, and every owner check still compares the 128 random bits
//!   (a writer's compares those alone: see *Elections*).
//! - **waiters** (`WaiterView::Queue`): the live waiters first in line first, each with the
//!   mode and `who` its token carries and `since`, its ticket (the server clock when it
//!   joined).
//!
//! [`list`](dlock_core::DistributedLock::list) `SCAN`s (1000 a page, so the server is not
//! blocked) the names matching `<prefix><list prefix>*` (the URL's `prefix`, glob
//! characters escaped), drops the names no lock key can have (another lock's fence counter
//! or queue, which only an empty prefix or one starting with `{` can match), and sends one
//! pipelined `TYPE` of the rest, keeping strings and sorted sets: round trips, one per
//! `SCAN` page and one. Keys are stored verbatim after the prefix, so each name decodes to
//! its key. With an empty prefix the namespace is the whole database, and a string or
//! sorted set that is not a lock (another program's data) is listed too.
//!
//! # Capabilities
//!
//! | capability | value | why |
//! |---|---|---|
//! | fair | yes | one queue per key on the server, served in order of arrival; a waiter that stops refreshing its entry for 3 s loses its place |
//! | fencing | best effort | the counter lives in the server's memory; tokens are floored by the server clock (µs), so they keep increasing across a restart without persistence or a failover unless the server clock steps back |
//! | expiry | ttl | a silent holder's key expires `ttl` after its last renewal |
//! | releases on disconnect | no | the key is not tied to a connection: a killed holder's key frees after its ttl |
//! | wake-up | notification, one per release | a release calls the first live waiter by its token; the others ignore the message. A release that admits several readers calls each of them (one wake-up each) |
//! | shared | yes | readers are a sorted set at the lock key; one queue orders readers and writers, so a waiting writer is not starved by later readers |
//! | permits | yes | permit holders are members of that sorted set, admitted while the live entries and the waiters before the caller are fewer than its limit; a release calls the one waiter whose turn it makes (FIFO); a crashed holder's permit comes back `ttl` after its last renewal |
//! | inspect: who | yes | each token carries its holder's `NAME@HOST:PID` |
//! | inspect: waiters | queue | one sorted set per key by ticket, each waiter's mode in its token |
//! | inspect: list | yes | a `SCAN` over the key prefix; lock keys are the key verbatim after it |
//! | elections | woken, recheck 500 ms | a campaign's grant, a proclaim and a leader's release publish on the key's channel; an expired leader is seen at the next recheck |
//! | reentrant | any lease | the hold and its entries live beside the key under its ttl, which every entry's renewal keeps up; no session owns them (see *Reentrant holds*) |
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
//! | `sentinel_user`, `sentinel_password` | none | `redis+sentinel://` only: the sentinels' own credentials (the URL's user and password are the data nodes') |
//!
//! `redis+sentinel://` and `redis+cluster://` URLs (see *Topologies*) take the same
//! options. A Sentinel URL names one or more sentinels (default port 26379) and the master
//! as its path (`/mymaster`, no database: 0); a cluster URL one or more seed nodes and no
//! path (a cluster has database 0 only).
//!
//! An unknown option, a bad value, a second host (for `redis://`), another scheme, `ca`,
//! `cert` or `key` without TLS, `cert` without `key` (or the reverse), a Sentinel URL
//! without a master name, a cluster URL with a path, or a `sentinel_…` option on another
//! scheme is
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
#![doc = include_str!("topologies.md")]
//!
//! # Failure modes
//!
//! - **Partition or black-holed server**: every request fails after the response timeout
//!   (`Unavailable`); the watchdog keeps retrying renewals and fires `lost()` a safety margin
//!   (ttl/10 + 2 ms) before the key can expire on the server, so the holder hears of the loss
//!   before another client can take the key. A waiting acquire returns `Unavailable`.
//! - **Connection killed** (`CLIENT KILL`, a server restart, a reset): the next request opens
//!   a new connection; a renewal in between is retried, so the lease survives if the server
//!   still has the key. Waiters re-subscribe on a new subscriber connection and re-try;
//!   a call lost meanwhile is made up by the next refresh.
//! - **Server restart without persistence**: held keys vanish, so the next renewal answers
//!   "not ours" and `lost()` fires (another client may already hold the key: that is what the
//!   fencing token is for). The fence counter is gone too; tokens stay increasing through the
//!   clock floor.
//! - **Holder crash**: nothing releases the key; it frees when its ttl runs out, and the
//!   first waiter is woken at that moment by its PTTL timer (a waiter that became first
//!   later notices it at its next refresh, within 1 s).
//! - **Waiter crash or partition**: its queue entry expires 3 s after its last refresh;
//!   the waiters behind it are held up at most 4 s.
//! - **Failover to a replica** (Sentinel, a cluster, managed Redis): replication is
//!   asynchronous, so a lock acquired just before the failover can be granted again. Use
//!   the fencing token, or Redlock over independent servers (see *Topologies*).

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod config;
mod error;
mod gather;
mod inspect;
mod lock;
mod node;
mod reentry;
mod renew;
mod scripts;
mod subscriber;
#[cfg(feature = "tls")]
mod tls;
mod token;
mod wait;

pub mod server;

use dlock_core::Result;
use dlock_core::raw::LockClient;

pub use config::{RedisConfig, SentinelConfig, Topology};
pub use lock::RedisBackend;

/// The Redis lock: a [`LockClient`] of a [`RedisBackend`].
pub type RedisLock = LockClient<RedisBackend>;

/// URL schemes this backend serves: `redis://` (one server), `redis+sentinel://` (the master
/// Sentinel names), `redis+cluster://` (a Redis Cluster), each with an `s` for TLS.
pub const SCHEMES: &[&str] = &[
    "redis",
    "rediss",
    "redis+sentinel",
    "rediss+sentinel",
    "redis+cluster",
    "rediss+cluster",
];

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
