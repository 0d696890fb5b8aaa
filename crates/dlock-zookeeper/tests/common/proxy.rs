//! A TCP proxy that delays each direction, so an operation's duration counts its round
//! trips, and a timer for one operation.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

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

/// A proxy to `upstream` that delays every byte by `delay` in each direction, keeping order.
pub async fn delaying_proxy(upstream: SocketAddr, delay: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (client_rx, client_tx) = client.into_split();
                let (server_rx, server_tx) = server.into_split();
                tokio::select! {
                    () = delayed(client_rx, server_tx, delay) => {}
                    () = delayed(server_rx, client_tx, delay) => {}
                }
            });
        }
    });
    addr
}

async fn delayed(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((at, bytes)) = rx.recv().await {
            sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                return;
            }
        }
    };
    tokio::join!(writer, reader);
}
