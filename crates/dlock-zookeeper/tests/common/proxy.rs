//! A TCP proxy that delays each direction, so an operation's duration counts its round
//! trips, and the count.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use dlock_conformance::{Delay, Proxy, ServerClock};
use tokio::time::Instant;
use zookeeper_client as zk;

/// A moment of a test: the time, and the server's time behind the proxy so far.
#[derive(Debug, Clone, Copy)]
pub struct Mark {
    at: Instant,
    server: Duration,
}

impl Mark {
    /// Now, by `clock`.
    pub fn now(clock: &ServerClock) -> Self {
        Self {
            at: Instant::now(),
            server: clock.elapsed(),
        }
    }

    /// From this mark to `end`.
    pub fn until(self, end: Mark) -> Took {
        Took {
            total: end.at - self.at,
            server: end.server.saturating_sub(self.server),
            remade: 0,
        }
    }
}

/// How long something took, how much of that the server spent answering, and how many
/// watched directories it had to make again (see [`RoundTrips::watch`]).
#[derive(Clone, Copy)]
pub struct Took {
    total: Duration,
    server: Duration,
    remade: u32,
}

impl fmt::Debug for Took {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({:?} in the server", self.total, self.server)?;
        match self.remade {
            0 => write!(f, ")"),
            n => write!(f, ", {n} reaped directories made again)"),
        }
    }
}

/// Directories the server's container reaper may remove while they are empty (a key's
/// directory between a release and the next acquire; a semaphore's `locks` and `leases`).
struct Watched {
    zk: zk::Client,
    paths: Vec<String>,
    /// The last creation seen of each: one seen before and different now was reaped and
    /// made again (one never seen yet is new, and its operation's count includes it).
    known: std::sync::Mutex<Vec<Option<i64>>>,
}

impl Watched {
    /// Each directory's creation (its `czxid`), or `None` where it is missing.
    async fn generations(&self) -> Vec<Option<i64>> {
        let mut out = Vec::new();
        for path in &self.paths {
            let stat = self
                .zk
                .check_stat(path)
                .await
                .expect("stat a watched directory");
            out.push(stat.map(|stat| stat.czxid));
        }
        out
    }

    /// How many of `now`'s directories were made again since last seen; remember `now`.
    fn remade(&self, now: &[Option<i64>]) -> u32 {
        let mut known = self.known.lock().expect("known generations");
        let mut remade = 0;
        for (known, now) in known.iter_mut().zip(now) {
            if let Some(now) = now {
                remade += u32::from(known.is_some_and(|k| k != *now));
                *known = Some(*now);
            }
        }
        remade
    }
}

/// Round trips counted through a [`delaying_proxy`], each recorded for the printed table.
pub struct RoundTrips {
    rtt: Duration,
    clock: ServerClock,
    watched: Option<Watched>,
    measured: Vec<String>,
}

impl RoundTrips {
    /// Counting in round trips of `rtt` (`proxy`'s delay, both ways).
    pub fn new(rtt: Duration, proxy: &Proxy) -> Self {
        Self {
            rtt,
            clock: proxy.server_clock(),
            watched: None,
            measured: Vec::new(),
        }
    }

    /// Watch `paths` (read with `zk`, a client that bypasses the proxy) around each
    /// [`timed`](Self::timed) operation: the server's container reaper removes an empty
    /// key directory (or a semaphore's `locks` or `leases`) on its own schedule, every
    /// 60 s, so an operation may find one gone since the last and make it again, one
    /// round trip more each (the crate docs' "directory missing" rows). Such an
    /// operation is expected to take that many more.
    pub fn watch(&mut self, zk: zk::Client, paths: Vec<String>) {
        let known = std::sync::Mutex::new(vec![None; paths.len()]);
        self.watched = Some(Watched { zk, paths, known });
    }

    /// The proxy's server clock, for a [`Mark`] taken in another task.
    pub fn clock(&self) -> ServerClock {
        self.clock.clone()
    }

    /// Now.
    pub fn mark(&self) -> Mark {
        Mark::now(&self.clock)
    }

    /// `op`'s output and how long it took.
    pub async fn timed<T>(&self, op: impl Future<Output = T>) -> (T, Took) {
        if let Some(watched) = &self.watched {
            // What exists now (made by steps not timed, too), so that the operation's
            // making one of them again counts, and its making one first does not.
            watched.remade(&watched.generations().await);
        }
        let started = self.mark();
        let out = op.await;
        let mut took = started.until(self.mark());
        if let Some(watched) = &self.watched {
            took.remade = watched.remade(&watched.generations().await);
        }
        (out, took)
    }

    /// Assert that `what`, which took `took`, needed `expected` round trips, read two ways,
    /// either of which may be off by one in its own direction only on a busy machine:
    /// - the whole duration, rounded down: never too few (each round trip costs at least
    ///   `rtt`), one too many when the server's and the client's own time (a ZooKeeper
    ///   log write can take a second) reach a whole round trip;
    /// - the duration less the server's time ([`ServerClock`]), to the nearest: one too
    ///   many when the client's own delays or server time the clock missed (a connection's
    ///   first answer stops its clock) reach half a round trip, one too few when another
    ///   connection's wait at the server (an idle client's ping behind a log write) fell
    ///   while this operation's bytes were in the delay, for half a round trip.
    ///
    /// The count is right when either reading gives it: a round trip more or fewer than
    /// expected moves both.
    pub fn check(&mut self, what: &str, took: Took, expected: u32) {
        let expected = expected + took.remade;
        let rtt = self.rtt.as_secs_f64();
        let whole = (took.total.as_secs_f64() / rtt).floor() as u32;
        let outside = took.total.saturating_sub(took.server);
        let net = (outside.as_secs_f64() / rtt).round() as u32;
        self.measured
            .push(format!("{what}: {whole} whole, {net} net ({took:?})"));
        assert!(
            whole == expected || net == expected,
            "{what} took {took:?}: {whole} round trips rounded down, {net} net of the \
             server's time, expected {expected}"
        );
    }

    /// Print every count, under `title`.
    pub fn print(&self, title: &str) {
        eprintln!("{title}:\n  {}", self.measured.join("\n  "));
    }
}

/// A proxy to `upstream` that delays every byte by `delay` in each direction, keeping
/// order (the conformance proxy's delay, without jitter). Forwarding stops when it drops.
pub async fn delaying_proxy(upstream: SocketAddr, delay: Duration) -> Proxy {
    let proxy = Proxy::start(upstream).await.expect("start the proxy");
    proxy.delay(Delay {
        base: delay,
        jitter: Duration::ZERO,
    });
    proxy
}
