//! A dlock backend for Redlock: one lock over several independent Redis nodes.
//!
//! ```no_run
//! # async fn demo() -> dlock_core::Result<()> {
//! use std::time::Duration;
//! use dlock_core::{DistributedLock, LockOptions, Wait};
//!
//! let lock = dlock_redlock::from_url("redlock://10.0.0.1:6379,10.0.0.2:6379,10.0.0.3:6379").await?;
//! let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
//! let lease = lock.acquire("reports/nightly", &opts).await?;
//! // ... work; pass lease.fencing_token() to storage that checks it; stop on lease.lost() ...
//! lease.release().await
//! # }
//! ```
//!
//! The nodes are independent Redis servers (no replication between them, not a cluster):
//! a key is held when a majority of them hold it, so the lock survives the loss of a
//! minority of the nodes. Each node runs the protocol of [`dlock_redis`] (same key names,
//! same scripts, same connection handling); this crate adds the quorum.
//!
//! # Algorithm
//!
//! `N` nodes (odd, at least 3), quorum `Q = N/2 + 1`. Each node's answer must arrive within
//! the per-node timeout, 5 % of the ttl (at least 50 ms, at most the response timeout); a
//! node that errs or is late is a vote against, never an abort.
//!
//! 1. **Round**: note `t1` (monotonic clock), then on every node in parallel the
//!    `dlock-redis` acquire script: `SET key token NX PX ttl` when nobody waits there or
//!    we are the first live waiter in the node's queue; otherwise, for a caller that will
//!    wait, join that queue. Each granting node issues a fencing token
//!    `max(counter + 1, floor, node clock - 1 s)`, where `floor` is this client's clock in
//!    µs, proposed alike to every node. The round wins when at least `Q` nodes granted the
//!    key and the validity `ttl - (now - t1) - (ttl/100 + 2 ms)` (saturating) is still
//!    positive. It is decided as soon as `Q` nodes granted with the same fence (the
//!    common case, below), without waiting for the others: a slow node then costs
//!    nothing, not its per-node timeout. Their requests still run, in a background
//!    clean-up task (`dlock_core::settle` waits for it), and a node that grants later
//!    holds the key for this lease too, renewed and released with it; the release, or a
//!    give-back, waits on each such node for the acquire still running there (at most
//!    until its per-node timeout), so the node runs the two in order; a give-back runs in
//!    a clean-up task, so it does even if the acquire is dropped meanwhile (a permit's
//!    then leaves the queue instead of rejoining it, step 3). A round whose
//!    grants differ in fence, one that does not reach `Q` grants (its waiting needs every
//!    node's view) and an owner's round (reentrant holds) wait for every node.
//! 2. **Fence write-back**: the fencing token is the highest token the granting nodes
//!    issued; the nodes whose counter is behind it are raised to it (compare-and-set, only
//!    where the key is ours) until `Q` nodes hold it. Only then is the lease reported, so
//!    any later holder's majority shares a node with this one and gets a greater token.
//!    Nodes whose counters were behind the floor all issued the floor, so this step costs
//!    nothing in the common case; it runs when counters are ahead of this client's clock
//!    (a client whose clock is behind, a node that issued later tokens).
//!    The lease's `sent_at` is `t1`: the core's watchdog fires `lost()` `ttl/10 + 2 ms`
//!    before `t1 + ttl`, which is before the validity ends.
//! 3. **Failed round**: give the key back (compare-and-delete) on every node that granted
//!    it or did not answer, calling the next waiter there only if the round had `Q`
//!    grants (others may wait on us). A permit's give-back always calls the waiter whose
//!    turn it makes (permits call their waiters one turn at a time, so a turn nobody
//!    announces would wait for that waiter's refresh, about 1 s: measured in 3 or 4 of
//!    1,900 semaphore waits at 32 clients before); a waiting round's permit also rejoins
//!    that node's queue with its ticket in the same script (taking it had left the
//!    queue), so the permit stays its own turn unless a waiter with an earlier ticket
//!    joined meanwhile, and no waiter behind takes it while the round backs off.
//!    If fewer than `Q` nodes answered at all, try once more, then
//!    fail with [`LockError::Unavailable`](dlock_core::LockError::Unavailable) naming each
//!    node's error.
//! 4. **Wait** (when the deadline allows): the waiter joined each node's queue in its round,
//!    with one **ticket** for all nodes, its clock in µs when the acquire began (ties:
//!    the token), so every node orders the waiters alike. It subscribes to the key's call
//!    channel on every node (confirmed), then runs another round, so no call in between is
//!    missed. It sleeps until a majority of nodes called it by its token (a release, a
//!    waiter giving up or an expired waiter dropped: each node calls its first live waiter;
//!    the calls of five nodes wake the waiter once), or, where it is first, until the
//!    holder's ttls run out, and runs a round. Every second it refreshes its entry on every
//!    node, which also tells it where the key is free and its turn (a release nobody
//!    announced). If nobody has a majority (a **split vote**: contenders that joined the
//!    queues at once, or a waiter whose entry is on too few nodes yet), it runs the next
//!    round after a random pause of up to four rounds' time (at most 100 ms); after 8
//!    split votes in a row, it waits as above.
//! 5. **Extend** (the watchdog, every ttl/3 less a jitter): compare-and-`PEXPIRE` on every
//!    node in parallel. The client's renewals are coalesced over the cluster: each extend
//!    is one request to the client's renewal task, which sends what queued meanwhile (the
//!    leases the watchdog woke in the same tick) to every node as one script call per node
//!    (one status per key), each call bounded by the per-node timeout (a late or failed
//!    call is a vote against for each of its keys), and answers each extend once with
//!    every node's vote. Batches run side by side, so a slow node never delays the next
//!    one. With `Q` or more extended, the lease is kept, and nodes that lost the key
//!    (restarted empty) get it back with `SET NX` and the fence (a node held by someone
//!    else is left alone). If a majority answered "not ours", the lease is lost (`NotHeld`);
//!    otherwise the outcome is unknown and the watchdog retries until `lost()` must fire.
//!    An election's leader renews on its own, one script per node that also re-sets the
//!    fence counter's lifetime (see *Elections*).
//! 6. **Release**: compare-and-delete on every node in parallel, leaving the node's queue
//!    and calling its first live waiter; done once as many nodes released as the grant
//!    needed, the majority or a permit's quorum (the other nodes' requests go on in the
//!    background, after this lease's acquires still running there, as in step 1; a
//!    leader's release waits for every node, whose observers it tells); `NotHeld` if a
//!    majority answered "not ours". A process that exits right after a release without
//!    `dlock_core::settle` may leave the key until its ttl on the nodes the release was
//!    decided without.
//! 7. **Giving up**: a waiter whose deadline passes, whose acquire fails or whose future is
//!    dropped leaves every node's queue in the background; if an acquire future is dropped
//!    during a round, the key is given back on every node too.
//!
//! **Order, progress and exclusion.** Exclusion is Redlock's: a grant still needs `Q`
//! nodes' `SET NX`; the queues only restrict who may take a free node. Because every node
//! orders the same tickets alike, the first live waiter is first on every node that has its
//! entry, and each round puts the entry on every node that answers: with a minority of
//! nodes lost, it is first on all `Q` or more that remain, takes each as it frees, and
//! wins. Nobody else can take those nodes meanwhile, so two waiters cannot split the
//! nodes' first places. Waiters are served in the order of their tickets, that is of
//! their clients' clocks when they began to wait (clients on different machines: as far
//! as those clocks agree). A waiter that crashed or was cut off is dropped 3 s after its
//! last refresh, and the next refresh of another waiter (at most 1 s later) calls the
//! next one: an abandoned waiter holds the line up at most 4 s. The queue keys vanish
//! with the last waiter or expire 3 s after the last write to them.
//!
//! **Shared holds** ([`LockOptions::shared`](dlock_core::LockOptions::shared)). Each node
//! runs the reader protocol of [`dlock_redis`] (readers as a sorted set at the lock key,
//! one queue for readers and writers, a reader's token starting with `r`), and a reader's
//! round, renewal, fence write-back and release are the writer's with a reader's token: a
//! reader holds the key when `Q` nodes admitted it within its validity. *Why quorums keep
//! readers and writers apart*, with any minority of nodes lost: a reader's grant needs `Q`
//! nodes on which no writer holds the key (the node's script admits a reader only then),
//! a writer's needs `Q` nodes on which the key did not exist (`SET NX`: no reader, no
//! writer). Two sets of `Q > N/2` nodes share at least one node, and on that node the
//! script refuses whichever hold comes second, so at most one of the two quorums can be
//! complete at a time (under Redlock's usual timing assumptions, below). Readers do not
//! exclude readers, so any number of reader quorums coexist. Fencing: a reader's token
//! comes from the same per-node counters and is written back to a majority like a
//! writer's, so it is greater than every earlier writer's, and a writer's is greater than
//! every earlier token, reader or writer. Waiting: a release calls, on each node, the
//! first waiter and the run of readers right behind it; each reader wakes once a majority
//! of nodes called it, so a release that admits k readers costs k wake-ups.
//!
//! **Permits** ([`LockOptions::permits`](dlock_core::LockOptions::permits), a counting
//! semaphore of `N` permits). Each node runs the permit protocol of [`dlock_redis`]
//! (permit holders as members of the sorted set at the lock key, each node admitting while
//! its live entries and the waiters before the caller are fewer than `N`; a release calls
//! the waiter whose turn it makes), and a permit's round, fence write-back, renewal and
//! release are the writer's with a permit's token, except that a permit needs
//! `q = floor(M N / (N + 1)) + 1` nodes instead of the majority, for the grant and for
//! each extension (fewer than `q` extended within the validity: the permit is lost).
//! *Why*: `H` holders acknowledged by `q` nodes each, on nodes holding at most `N` each,
//! give `H q <= M N`; `(N + 1) q > M N` rules out `N + 1` holders, and one acknowledgement
//! fewer lets a round-robin placement of `N + 1` holders fit (the proof is next to the
//! code, in `permits.rs`). A node gives a lost permit back (extension) only where one is
//! free. With `N = 1` that is the majority. *Availability*: with 5 nodes, `N = 1` survives
//! 2 nodes down, `N = 2, 3` (`q = 4`) one, and `N >= 4` (`q = 5`) none: with a node down,
//! such an acquire fails with `Unavailable` ("only 4 of 5 nodes answered, 5 needed") and a
//! held permit's extensions fail until `lost()` fires. A permit round in which some nodes
//! granted and fewer than `q` did is a split vote (retried after a random pause, as for the
//! mutex). Round trips: those of the writer below.
//!
//! *Clients must agree on `N`* here, more than anywhere else: the proof counts every holder
//! against one `N`. With mixed limits each acquire's quorum comes from its own limit, and
//! the quorums need not overlap enough: on 5 nodes, one `Permits(1)` (3 nodes) and three
//! `Permits(3)` (4 nodes each) can all win at once, 4 holders where the largest limit is 3.
//! And a permit's token is the highest counter among the nodes of its own round, so two
//! permits held at the same time can carry the same token (Redlock's fencing is best
//! effort).
//!
//! Round trips (one round trip = a parallel request to all of them; a grant and a release
//! wait for the quorum-th fastest node, everything else for the slowest):
//!
//! | operation | round trips |
//! |---|---|
//! | `try_acquire`, key free | 1: the round (the fence write-back, a second, only when node counters are ahead of this client's clock) |
//! | `try_acquire`, key held | 1: the round; 2 when some nodes granted it (a split), to give them back |
//! | `acquire` that waits | a round (joins the queues), subscribing on every node, another round; then a round per wake-up, and 1 refresh per second while waiting |
//! | `extend` | 1 (2 when a node lost the key and gets it back), shared with the client's renewals queued with it: N held keys cost about N / batch size requests per node per renewal round, not 5 N |
//! | `release` | 1 |
//! | contended hand-off | the release (1), the calls, the waiter's round (1) |
//! | `inspect` | 1 (one read-only script per node) |
//! | `list` | 1 per `SCAN` page (1000 names) and 1 pipelined `TYPE`, on every node |
//!
//! Measured (lockbench `--backends redlock`, ttl 30 s, 5 × Redis 7.0.15 on loopback sharing
//! 2 busy cores, five runs alternating with the code that waited for every node): an
//! uncontended acquire + release took 1.33–1.76× raw `SET NX PX` + `DEL` on every node
//! (median 1.45×), against 1.65–2.23× (median 1.79×) waiting for every node's answer. On
//! five servers sharing two cores the last two answers come late; on separate machines a
//! round costs its median node instead of its slowest.
//!
//! # What Redlock does not promise
//!
//! Redlock's exclusion rests on timing: the nodes expire keys by their own clocks, and a
//! holder is only safe while its validity lasts. A node clock that jumps forward (an NTP
//! step, an operator), a holder paused longer than its lease (GC, swap, a stopped VM) or a
//! node restarted without persistence within a ttl can let two clients hold the key at
//! once. Use the two signals this crate gives you:
//!
//! - [`Lease::lost`](dlock_core::Lease::lost) fires before the validity ends when the
//!   lease cannot be kept: stop working on it;
//! - the [fencing token](dlock_core::Lease::fencing_token): a storage that remembers the
//!   highest token it has seen and refuses older ones rejects a paused holder's late
//!   writes. Tokens are written back to a majority, so they increase across holders while
//!   the nodes keep their memory.
//!
//! Run the nodes with persistence (`appendfsync always`), or keep a crashed node down for
//! longer than the largest ttl before restarting it empty.
//!
//! # Key sets
//!
//! A set of keys taken as one hold ([`LockExt::acquire_all`](dlock_core::LockExt::acquire_all))
//! is taken key by key, in ascending byte order, each key with the protocol above: a
//! quorum round per key on every node, so N free keys cost N rounds of parallel requests,
//! and each key has its own token. While a set is being taken, its keys taken so far are
//! held like any key: a waiter on one of them queues on that key's node queues and is called
//! when the set releases the key, or gives it back because a later key stayed busy (before
//! `acquire_all` returns).
//!
//! # Inspecting
//!
//! [`inspect`](dlock_core::DistributedLock::inspect) reads every node in parallel with
//! [`dlock_redis`]'s read-only inspect script (one round trip: each node's holders with
//! their remaining ttls, a writer's fence counter, and its live waiters in queue order;
//! see *Inspecting* there), each node's answer bounded by the response timeout, since no
//! ttl sets a per-node timeout here. Fewer than a quorum of answers is
//! [`LockError::Unavailable`](dlock_core::LockError::Unavailable). It shows what a quorum
//! of the nodes agrees on, counting every node, answering or not:
//!
//! - **holders**: a token held on as many nodes as its grant needs (the majority for a
//!   writer or a reader, a permit's `floor(M N / (N + 1)) + 1`); a hold on fewer nodes (a
//!   split vote in progress, a grant being given back) is not shown. Its `ttl_left` is how
//!   long that many nodes still keep it (the needed-th longest of its ttls). A writer's
//!   fencing token is the fence counter a majority of its nodes show (the token is written
//!   back to a majority before the lease is reported); readers and permits show none.
//! - **who**: the holder's `NAME@HOST:PID`, which its token carries (the same token on
//!   every node), at no extra cost and with owner checks unchanged (they compare the
//!   token's random part). Tokens are counted per holder by that random part, so a
//!   leader whose nodes carry different values (a proclaim that reached only some of
//!   them) is one holder, showing the value most of its nodes carry.
//! - **waiters** (`WaiterView::Queue`): the tokens queued on a majority of the nodes, in
//!   ticket order. A waiter proposes one ticket (its client's clock in µs when it began to
//!   wait) to every node, so every node orders its waiters alike; `since` is that ticket,
//!   by the waiter's clock.
//!
//! [`list`](dlock_core::DistributedLock::list) runs [`dlock_redis`]'s `SCAN` and `TYPE`
//! on every node in parallel (each request bounded by the response timeout) and keeps the
//! keys that a majority of the nodes list, sorted: a key on a minority only (a round
//! being given back, a node that kept a key its holder lost) is not held.
//!
//! # Elections
//!
//! An [`Election`](dlock_core::Election) on a key is the mutex above, with the candidate's
//! value where a plain hold carries its holder's `NAME@HOST:PID`: in the token stored at
//! the lock key on every node (32 random hex digits, a space, the value). Every script
//! treats it as a writer's token (owner checks compare its random part: see below), and
//! [`inspect`](dlock_core::DistributedLock::inspect) shows the value as the holder's `who`
//! (all of it after the first space; Redis strings are binary-safe and the core refuses
//! control characters, so any value round-trips as it is, spaces and quotes included).
//! Observers listen on the channel `{<lock key>}:leader` on every node.
//!
//! | operation | round trips |
//! |---|---|
//! | `campaign` | those of `acquire` (the same rounds, queue, fence write-back and term: the fencing token); then, in the background, a `PUBLISH` on every node announces the grant |
//! | `proclaim` | 1: on every node a script swaps our token for one with the same random part and the new value where the node holds ours (a token with our random part), keeping its ttl (`SET … KEEPTTL`), and publishes on the channel. A majority swapped: the hold carries the new token from then on (a node the proclaim missed keeps the old one until its ttl). Otherwise the nodes that swapped or did not answer are swapped back (a second round trip) and the answer is `NotHeld` (a majority answered "not ours") or `Unavailable` |
//! | renewal | a leader's: 1 script per node of its own (not in the batch), owner-checked, which re-sets the key's ttl and the fence counter's lifetime (ttl + 1 h), so the term `leader()` reads does not expire under a leader that leads for more than an hour |
//! | `resign` | the release (1); then, in the background, a `PUBLISH` on each node that released |
//! | `leader` | 1: `inspect`, the holder whose token (its random part) a majority of the nodes holds, its value and fencing token (the term). Right after a grant, while the fence write-back is under way, the counters may not agree on a majority yet: `leader` then reads once more (25 ms later), and if they still disagree answers the highest fence a majority of the leader's nodes reached (the grant's token once the write-back is complete, never above it), rather than fail and end every observer |
//! | `observe` | subscribing on every node (confirmed, a quorum of them needed), before the first read; then 1 read (`inspect`) per wake-up: the notices that arrive together are one wake-up, so a change costs 1 to `N` reads |
//!
//! **What wakes observers**: a grant to a candidate (announced once the fence is written
//! back, so the read after it shows the new leader and term, even when the candidate was
//! waiting and took over from a resigning leader), a proclaim, a leader's release. Not an
//! expiry (a crashed leader) nor an announcement a node could not deliver (a node down, a
//! subscriber connection broken and re-subscribed at the next notice): observers read the
//! leader again after 1 s without a notice (`Observe::Woken { recheck: 1 s }`), which costs
//! one round trip per observer per second and is well within the ttl a crashed leader
//! takes to be replaced anyway. An observer that keeps fewer than a quorum of live
//! subscriptions ends its stream with `Unavailable` (follow again). Another Redlock library
//! sees a candidate's hold as a busy key whose value is the token; it has no election of its
//! own to be compatible with.
//!
//! **A lost answer or a cancelled proclaim cannot end a held leadership.** Every owner check
//! on the nodes (renewal, release, the claim that gives the key back to a node, proclaim)
//! compares only the token's *owner part*, its 32 random hex digits before the first
//! space, which a proclaim never changes. Whatever a proclaim left on each node (the new
//! value where its swap ran, even when the answer timed out or the future was dropped
//! after the scripts were sent; the old value where it did not or was put back), every
//! node of the hold still holds a token of its owner: renewals and the release count it
//! as ours there, and `leader()` counts the nodes by owner too (showing the value most of
//! them carry). Only the published value is then unknown to the caller, and the next
//! proclaim sets it on every node either way.
//!
//! # Reentrant holds
//!
//! An acquire with an owner ([`LockOptions::owner`](dlock_core::LockOptions::owner)) takes
//! an exclusive hold that the owner can enter again, from any client or process. Declared
//! as [`Reentry::AnyLease`](dlock_core::Reentry::AnyLease): Redis has no session to tie a
//! hold to, so the hold lives under the key's ttl on the nodes, and every lease of the
//! owner, wherever it runs, keeps it alive.
//!
//! **Where it lives.** On every node, the lock key holds the hold's token (a writer's
//! token, as for a plain hold: plain acquires, waiters, `inspect` and `list` see an
//! ordinary exclusive holder), and beside it the **hold record** `{<lock key>}:reentry`, a
//! hash of `owner`, `token` (the lock key's value), `fence` (the hold's fencing token) and
//! one field per lease that counts (`l:` and 128 random bits made for each grant): the hold
//! count is the number of lease fields. The record always has the lock key's expiry (every
//! script that sets one sets both). A record whose token is not the lock key's value (its
//! hold expired, was deleted by an operator, or another holder has the key) is stale: every
//! owner script deletes it when it meets it, and it never counts. Every owner check is the
//! record's: the owner, the hold (the record is the key's current one) and the lease's
//! field, so a lease of an earlier hold, whose field is in no later record, never lowers a
//! later hold's count (`NotHeld`). Under an empty prefix, or one starting with `{`, a key
//! that would name another lock's record is refused, as the other side keys are.
//!
//! **Per operation** (one script per node per operation; round trips as above):
//!
//! | operation | round trips |
//! |---|---|
//! | first acquire (key free) | 1: on every node the take-or-re-enter script takes the key as `dlock-redis`'s acquire script does (queue, fence floor) and writes the record with the lease's field, in the same call; the fence write-back (also into the records) only as for a plain grant |
//! | re-entry | 1: on every node where the key's current hold is the owner's, the script adds the lease's field, keeps the hold alive for at least the ttl (never shortening it) and answers the hold's token and recorded fence. A majority of re-entries **of one hold** within the validity is a grant at once, whoever waits, with the highest fence those nodes recorded: the hold's token (rule and why next to the code, in `reentry`). Nodes that took the key afresh or re-entered another hold get the field back (a second round trip, only then) |
//! | no majority (another owner or a plain holder has the key) | the round's give-back takes back exactly the field this acquire added, where it added one or the answer was lost; then waiting as for any acquire (same queue, calls, deadline, cancel safety: a dropped acquire takes its field back in the background), except that an owner's waiter also runs a round at least every second without a call: no call announces that its owner took the key meanwhile (another of its processes, a waiter ahead of it), and that round re-enters |
//! | `release` | 1: on every node the lease's field goes; with the last field the key and record are deleted and the next waiter called. `NotHeld` when a majority do not count the lease |
//! | renewal | 1 owner-checked script per node per lease (not batched with the client's plain renewals: it renews the record with the key), `PEXPIRE` only where the new ttl exceeds the key's `PTTL`; 2 when nodes did not count the lease (restarted empty, or missed its re-entry): they get the hold back, with the lease and the fence, unless another holder has the key there |
//!
//! **A restarted process with the same owner id** re-enters the hold its previous run left,
//! with the same token, as long as the hold lives (on a majority, within a ttl of any
//! lease's last renewal). It cannot release the previous run's leases (their fields were
//! that run's secret), so once it has released its own, the key stays held until a ttl
//! after its last renewal, then frees. After that the owner's next acquire takes a new hold
//! with a new, higher token.
//!
//! The take-or-re-enter and release scripts carry a copy of `dlock-redis`'s queue helpers
//! (private to it), so an owner's acquire prunes, joins and calls the key's queue as every
//! other script does.
//!
//! # Capabilities
//!
//! | capability | value | why |
//! |---|---|---|
//! | fair | yes | one queue per key on every node, ordered alike by the waiters' tickets (their clients' clocks when they began to wait); a waiter that stops refreshing its entry for 3 s loses its place |
//! | fencing | best effort | tokens are written back to a majority; a node restarted without persistence can break the order (each node's counter is floored by the acquiring client's clock and the node's clock less 1 s, which keeps it unless clocks step back or disagree) |
//! | expiry | ttl | a silent holder's keys expire `ttl` after its last extension |
//! | releases on disconnect | no | keys are not tied to connections |
//! | wake-up | notification, one per release | each node calls its first live waiter by token; that waiter wakes once a majority called it (split-vote retries are part of that one wake-up), the others ignore the calls. A release that admits several readers calls each (one wake-up each) |
//! | shared | yes | every node keeps dlock-redis's reader set; a reader quorum and a writer quorum share a node, which refuses the second (see *Shared holds*) |
//! | permits | yes | every node counts the key's permit holders; a permit needs `floor(M N / (N + 1)) + 1` nodes (all 5 of 5 from `N = 4`), so `N + 1` holders cannot all have theirs (see *Permits*) |
//! | inspect: who | yes | each token carries its holder's `NAME@HOST:PID` |
//! | inspect: waiters | queue | waiters queued on a majority, in the order of the one ticket each proposed to every node |
//! | inspect: list | yes | the keys a majority of the nodes' `SCAN`s list |
//! | elections | woken, recheck 1 s | grants to candidates, proclaims and a leader's release publish on the key's `{<lock key>}:leader` channel on every node; expiries do not, so observers re-read after 1 s without a notice (see *Elections*) |
//! | reentrant | any lease | the owner's hold record lives beside the key under its ttl, renewed by every lease of the owner in any client or process (see *Reentrant holds*) |
//! | max key length | 1024 bytes | the core's default |
//!
//! # URL
//!
//! ```text
//! redlock://[user[:password]@]host:port,host:port,host:port[/db][?option=value&…]
//! redlocks://…                              (TLS on every node, as rediss://)
//! ```
//!
//! The credentials, database and options apply to every node; the options are those of
//! [`dlock_redis`]: `prefix` (default `dlock:`, may be empty), `connect_timeout` (default
//! `5s`), `response_timeout` (default `2s`), and with `redlocks://` `ca` (PEM file of the
//! CA to trust instead of the system's roots) and `cert` with `key` (a PEM client
//! certificate and key), so one CA must have signed every node's certificate. An even
//! number of nodes, fewer than 3, a node named twice, an unknown option, a bad value, a TLS
//! option without `redlocks://`, or a `ca`, `cert` or `key` file that cannot be read or
//! used is [`LockError::InvalidConfig`](dlock_core::LockError::InvalidConfig) before any
//! network I/O. TLS works as in `dlock-redis`, including its choice of rustls crypto
//! provider (`ring`, unless the application installed one). Keys on each node are named
//! as in `dlock-redis`.
//!
//! # Failure modes
//!
//! - **A minority of nodes down, slow or partitioned away**: locks work on the rest. A
//!   grant or a release does not wait for them; a round that loses, an extension and
//!   `inspect` wait for each node's answer, up to its per-node timeout (a dead node's
//!   request is refused at once). Leases give the key back to a node when it returns
//!   empty.
//! - **A majority unreachable**: acquire fails with `Unavailable` naming every node's
//!   error; a held lease's extensions fail and `lost()` fires before its validity ends,
//!   that is before another client can take the key.
//! - **Holder crash**: its keys expire after the ttl; the first waiter wakes at that moment
//!   (one that became first later, at its next refresh, within 1 s).
//! - **Waiter crash or partition**: its entries expire 3 s after its last refresh; the
//!   waiters behind it are held up at most 4 s.
//! - **Node restart without persistence**: see above: a majority of restarted nodes within
//!   a ttl breaks exclusion.

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

mod cluster;
mod config;
mod election;
mod error;
mod held;
mod inspect;
mod lock;
mod permits;
mod reentry;
mod renew;
mod round;

use dlock_core::Result;
use dlock_core::raw::LockClient;

pub use config::RedlockConfig;
pub use lock::RedlockBackend;

/// The Redlock lock: a [`LockClient`] of a [`RedlockBackend`].
pub type RedlockLock = LockClient<RedlockBackend>;

/// URL schemes this backend serves: `redlock://` and `redlocks://` (TLS).
pub const SCHEMES: &[&str] = &["redlock", "redlocks"];

pub(crate) const NAME: &str = "redlock";

/// Connect to the nodes a `redlock://` or `redlocks://` URL names (grammar in the crate
/// docs).
///
/// The whole URL is parsed and checked before any network I/O; then every node is
/// connected in parallel, bounded by the connect timeout, and a quorum must answer.
///
/// # Errors
/// [`LockError::InvalidConfig`](dlock_core::LockError::InvalidConfig) for a bad URL (an
/// even number of nodes, fewer than 3, a node named twice),
/// [`LockError::Unavailable`](dlock_core::LockError::Unavailable) when fewer than a quorum
/// of nodes can be reached, [`LockError::Backend`](dlock_core::LockError::Backend) when they
/// refuse (wrong password, not Redis servers).
pub async fn from_url(url: &str) -> Result<RedlockLock> {
    let config = RedlockConfig::from_url(url)?;
    Ok(LockClient::new(RedlockBackend::connect(config).await?))
}
