//! The test proxy's faults, against a local echo server: a delay makes every round trip
//! late by at least twice the base (once each way) and keeps the stream in order; a cut
//! forwards nothing until healed; the server clock counts the server's time, not the delay.

use std::net::SocketAddr;
use std::time::Duration;

use dlock_conformance::{Delay, Proxy};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// An echo server on a free loopback port.
async fn echo() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = conn.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    addr
}

/// An echo server on a free loopback port that answers each read `after` it.
async fn slow_echo(after: Duration) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = conn.read(&mut buf).await {
                    tokio::time::sleep(after).await;
                    if conn.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Send `data` and read back as many bytes.
async fn round_trip(conn: &mut TcpStream, data: &[u8]) -> Vec<u8> {
    conn.write_all(data).await.expect("write");
    let mut back = vec![0; data.len()];
    tokio::time::timeout(Duration::from_secs(10), conn.read_exact(&mut back))
        .await
        .expect("the echo within 10 s")
        .expect("read");
    back
}

#[tokio::test]
async fn a_delayed_link_is_late_both_ways_and_keeps_its_order() {
    let proxy = Proxy::start(echo().await).await.expect("proxy");
    let mut conn = TcpStream::connect(proxy.addr()).await.expect("connect");
    round_trip(&mut conn, b"warm").await;
    let base = Duration::from_millis(150);
    proxy.delay(Delay {
        base,
        jitter: Duration::from_millis(100),
    });
    let started = Instant::now();
    round_trip(&mut conn, b"late").await;
    assert!(started.elapsed() >= 2 * base, "{:?}", started.elapsed());

    // Many small writes, each drawn its own jitter: they come back as they were sent.
    let (mut r, mut w) = conn.into_split();
    let reader = tokio::spawn(async move {
        let mut back = vec![0; 200 * 4];
        r.read_exact(&mut back).await.map(|_| back)
    });
    let mut sent = Vec::new();
    for i in 0..200u32 {
        let bytes = i.to_be_bytes();
        w.write_all(&bytes).await.expect("write");
        sent.extend_from_slice(&bytes);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let back = tokio::time::timeout(Duration::from_secs(20), reader)
        .await
        .expect("every byte back within 20 s")
        .expect("the reader")
        .expect("read");
    assert_eq!(back, sent);
}

#[tokio::test]
async fn a_delay_ends_when_set_back_to_none() {
    let proxy = Proxy::start(echo().await).await.expect("proxy");
    proxy.delay(Delay {
        base: Duration::from_secs(5),
        jitter: Duration::ZERO,
    });
    proxy.delay(Delay::default());
    let mut conn = TcpStream::connect(proxy.addr()).await.expect("connect");
    let started = Instant::now();
    round_trip(&mut conn, b"prompt").await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_cut_link_forwards_nothing_until_healed() {
    let proxy = Proxy::start(echo().await).await.expect("proxy");
    let mut conn = TcpStream::connect(proxy.addr()).await.expect("connect");
    round_trip(&mut conn, b"before").await;
    proxy.cut();
    conn.write_all(b"during").await.expect("write");
    let mut buf = [0u8; 6];
    let during = tokio::time::timeout(Duration::from_millis(500), conn.read(&mut buf)).await;
    assert!(during.is_err(), "nothing comes back while cut: {during:?}");
    assert!(proxy.traffic_while_cut() >= 6);
    proxy.heal();
    let mut fresh = TcpStream::connect(proxy.addr()).await.expect("connect");
    assert_eq!(round_trip(&mut fresh, b"after").await, b"after");
}

#[tokio::test]
async fn the_server_clock_counts_the_servers_time_and_none_of_the_delay() {
    let answer_after = Duration::from_millis(300);
    let proxy = Proxy::start(slow_echo(answer_after).await)
        .await
        .expect("proxy");
    let base = Duration::from_millis(200);
    proxy.delay(Delay {
        base,
        jitter: Duration::ZERO,
    });
    let clock = proxy.server_clock();
    let mut a = TcpStream::connect(proxy.addr()).await.expect("connect");
    let mut b = TcpStream::connect(proxy.addr()).await.expect("connect");
    let before = clock.elapsed();
    let started = Instant::now();
    // Two connections waiting on the server at once count once.
    tokio::join!(round_trip(&mut a, b"one"), round_trip(&mut b, b"two"));
    let (took, server) = (started.elapsed(), clock.elapsed() - before);
    assert!(took >= 2 * base + answer_after, "{took:?}");
    assert!(server >= answer_after, "{server:?} of {took:?}");
    // Generous: what is left over is loopback and this machine's scheduling.
    assert!(server < answer_after + base, "{server:?} of {took:?}");
}
