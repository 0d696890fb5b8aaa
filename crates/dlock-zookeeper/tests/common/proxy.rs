//! A TCP proxy that delays each direction, so an operation's duration counts its round
//! trips, and the count.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use dlock_conformance::{Delay, Proxy, ServerClock};
use tokio::time::Instant;

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
        }
    }
}

/// How long something took, and how much of that the server spent answering.
#[derive(Clone, Copy)]
pub struct Took {
    total: Duration,
    server: Duration,
}

impl fmt::Debug for Took {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} ({:?} in the server)", self.total, self.server)
    }
}

/// Round trips counted through a [`delaying_proxy`], each recorded for the printed table.
pub struct RoundTrips {
    rtt: Duration,
    clock: ServerClock,
    measured: Vec<String>,
}

impl RoundTrips {
    /// Counting in round trips of `rtt` (`proxy`'s delay, both ways).
    pub fn new(rtt: Duration, proxy: &Proxy) -> Self {
        Self {
            rtt,
            clock: proxy.server_clock(),
            measured: Vec::new(),
        }
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
        let started = self.mark();
        let out = op.await;
        (out, started.until(self.mark()))
    }

    /// Assert that `what`, which took `took`, needed `expected` round trips: the time
    /// outside the server, in round trips, to the nearest. The server's own time (a
    /// ZooKeeper log write can take a second on a busy machine) is left out; the client's
    /// (its scheduling, loopback) stays within half a round trip.
    pub fn check(&mut self, what: &str, took: Took, expected: u32) {
        let outside = took.total.saturating_sub(took.server);
        let rounds = (outside.as_secs_f64() / self.rtt.as_secs_f64()).round() as u32;
        self.measured.push(format!("{what}: {rounds} ({took:?})"));
        assert_eq!(rounds, expected, "{what} took {took:?}");
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
