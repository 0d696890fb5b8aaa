//! A TCP proxy that delays each direction, so an operation's duration counts its round
//! trips, and a timer for one operation.

use std::net::SocketAddr;
use std::time::Duration;

use dlock_conformance::{Delay, Proxy};
use tokio::time::Instant;

/// `op`'s output and how long it took.
pub async fn timed<T>(op: impl Future<Output = T>) -> (T, Duration) {
    let started = Instant::now();
    let out = op.await;
    (out, started.elapsed())
}

/// Round trips counted through a [`delaying_proxy`], each recorded for the printed table.
pub struct RoundTrips {
    rtt: Duration,
    measured: Vec<String>,
}

impl RoundTrips {
    /// Counting in round trips of `rtt` (the proxy's delay, both ways).
    pub fn new(rtt: Duration) -> Self {
        Self {
            rtt,
            measured: Vec::new(),
        }
    }

    /// Assert that `what`, which took `took`, needed `expected` round trips. Each costs at
    /// least `rtt` through the proxy, so the count is `took / rtt` rounded down: it never
    /// counts one too few, and the server's own time (ZooKeeper's log writes, slow on a busy
    /// machine) counts one too many only past a whole `rtt` per operation.
    pub fn check(&mut self, what: &str, took: Duration, expected: u32) {
        let rounds = (took.as_secs_f64() / self.rtt.as_secs_f64()).floor() as u32;
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
