//! A TCP proxy that can black-hole its traffic or make it late: the network faults behind
//! the partition scenarios and the torture run's slow links. A cut proxy keeps every
//! connection open but forwards nothing, as a real partition does (no reset, no FIN), so
//! clients find out by their own timeouts.
//!
//! While cut, the proxy swallows what clients send and counts it
//! ([`Proxy::traffic_while_cut`]): a scenario can tell whether a client tried to reach the
//! server at all, although nothing got through.
//!
//! A delayed proxy ([`Proxy::delay`]) holds every chunk it reads, in each direction, for a
//! base delay plus a random jitter before it writes it on, in order: application-level
//! latency, standing in for `tc netem delay … jitter …` where the kernel has no netem.
//! Only the bytes are late: both TCP connections stay fast (acknowledgements,
//! retransmissions and keepalives see loopback).
//!
//! The proxy also times the server ([`Proxy::server_clock`]): how long requests waited for
//! its answer, so a test that counts round trips by duration can leave the server's own
//! time (a log write on a busy machine) out of the count.

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// How late a delayed proxy delivers each chunk: `base` plus a uniformly random share of
/// `jitter`, and never before the chunk read ahead of it in the same direction (a stream
/// stays in order; a late chunk holds up the ones behind it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Delay {
    /// The least delay of every chunk.
    pub base: Duration,
    /// The most added to `base`, drawn anew for each chunk.
    pub jitter: Duration,
}

impl Delay {
    fn draw(self) -> Duration {
        let extra = match self.jitter.as_nanos() {
            0 => 0,
            n => rand::rng().random_range(0..=n.min(u128::from(u64::MAX)) as u64),
        };
        self.base + Duration::from_nanos(extra)
    }
}

/// How long, in all, the server behind a [`Proxy`] has had a request to answer: on each
/// connection, from the proxy's write of a chunk to the server until it reads the server's
/// next chunk, counted once while several connections wait at the same time. On a delayed
/// proxy this is the server's own time (and loopback's), none of the delay.
#[derive(Debug, Clone, Default)]
pub struct ServerClock(Arc<Mutex<Busy>>);

#[derive(Debug, Default)]
struct Busy {
    /// Connections whose server has a request to answer.
    waiting: usize,
    /// Since when one has (meaningful while `waiting > 0`).
    since: Option<Instant>,
    /// The time before `since`.
    total: Duration,
}

impl ServerClock {
    /// The server's time so far, the current wait included.
    pub fn elapsed(&self) -> Duration {
        let busy = self.0.lock().unwrap_or_else(|e| e.into_inner());
        busy.total + busy.since.map_or(Duration::ZERO, |since| since.elapsed())
    }

    fn asked(&self) {
        let mut busy = self.0.lock().unwrap_or_else(|e| e.into_inner());
        busy.waiting += 1;
        if busy.waiting == 1 {
            busy.since = Some(Instant::now());
        }
    }

    fn answered(&self) {
        let mut busy = self.0.lock().unwrap_or_else(|e| e.into_inner());
        busy.waiting = busy.waiting.saturating_sub(1);
        if busy.waiting == 0
            && let Some(since) = busy.since.take()
        {
            busy.total += since.elapsed();
        }
    }
}

/// A proxy on 127.0.0.1 in front of one server.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<watch::Sender<bool>>,
    delay: Arc<watch::Sender<Delay>>,
    traffic: Arc<AtomicU64>,
    server: ServerClock,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Start a proxy on a free loopback port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(watch::Sender::new(false));
        let delay = Arc::new(watch::Sender::new(Delay::default()));
        let traffic = Arc::new(AtomicU64::new(0));
        let server = ServerClock::default();
        let accept = tokio::spawn({
            let (cut, delay, traffic) = (cut.clone(), delay.clone(), traffic.clone());
            let server = server.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    let link = Link {
                        cut: cut.subscribe(),
                        delay: delay.subscribe(),
                        traffic: traffic.clone(),
                        server: server.clone(),
                    };
                    tokio::spawn(forward(client, upstream, link));
                }
            }
        });
        Ok(Self {
            addr,
            cut,
            delay,
            traffic,
            server,
            accept,
        })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop forwarding, in both directions, on every connection, new ones included. Starts
    /// [`traffic_while_cut`](Self::traffic_while_cut) from zero.
    pub fn cut(&self) {
        self.traffic.store(0, Ordering::SeqCst);
        self.cut.send_replace(true);
    }

    /// Forward again. Bytes sent during the cut are lost with the connections that carried
    /// them: connections open during a cut are closed when it heals.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }

    /// Deliver every chunk late from now on, in both directions, on every connection: see
    /// [`Delay`]. `Delay::default()` delivers at once again (chunks already held keep their
    /// time).
    pub fn delay(&self, delay: Delay) {
        self.delay.send_replace(delay);
    }

    /// What clients tried to send since the last [`cut`](Self::cut), none of which reached
    /// the server: every byte written, plus one for every connection opened (a client may
    /// send nothing on a new connection until the server speaks first, as MySQL's do).
    /// Zero means no client of this proxy tried to reach the server during the cut.
    pub fn traffic_while_cut(&self) -> u64 {
        self.traffic.load(Ordering::SeqCst)
    }

    /// The server's time, over every connection since the proxy started: see
    /// [`ServerClock`]. The handle follows the proxy's connections while any is open.
    pub fn server_clock(&self) -> ServerClock {
        self.server.clone()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Ends every connection's forwarding loop.
        self.cut.send_replace(true);
    }
}

/// What a connection's forwarding follows: the proxy's cut flag and delay, and the count of
/// what clients sent while cut.
struct Link {
    cut: watch::Receiver<bool>,
    delay: watch::Receiver<Delay>,
    traffic: Arc<AtomicU64>,
    server: ServerClock,
}

async fn forward(mut client: TcpStream, upstream: SocketAddr, link: Link) {
    let Link {
        mut cut,
        delay,
        traffic,
        server: clock,
    } = link;
    if *cut.borrow_and_update() {
        traffic.fetch_add(1, Ordering::SeqCst);
        // Black hole: hold the connection, never answer, until healed or dropped.
        swallow(&mut client, &mut cut, &traffic).await;
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    let (up_tx, up_rx) = mpsc::unbounded_channel();
    let (down_tx, down_rx) = mpsc::unbounded_channel();
    let mut on_cut = cut.clone();
    // Whether the server has a request of this connection to answer.
    let waiting = AtomicBool::new(false);
    let asked = || {
        if !waiting.swap(true, Ordering::SeqCst) {
            clock.asked();
        }
    };
    let answered = || {
        if waiting.swap(false, Ordering::SeqCst) {
            clock.answered();
        }
    };
    // Each direction is a reader that stamps every chunk with its delivery time and a
    // writer that waits for it: late chunks stay in flight together, as on a real link.
    // Either side closing (or failing) ends the connection once its chunks are delivered.
    tokio::select! {
        () = read_stamped(&mut cr, up_tx, delay.clone(), || {}) => {}
        () = write_when_due(up_rx, &mut sw, asked) => {}
        () = read_stamped(&mut sr, down_tx, delay, answered) => {}
        () = write_when_due(down_rx, &mut cw, || {}) => {}
        () = until(&mut on_cut, true) => {
            // Nothing is forwarded from now on: no answer is awaited.
            answered();
            // Hold both sockets silently until healed, then close them. The server
            // hears nothing, not even the client closing its end.
            swallow(&mut cr, &mut cut, &traffic).await;
        }
    }
    answered();
}

/// Read chunks from `from` and queue each with the time it is due, until `from` ends;
/// `read` is told of each chunk as it comes.
async fn read_stamped<R: AsyncRead + Unpin>(
    from: &mut R,
    to: mpsc::UnboundedSender<(Instant, Vec<u8>)>,
    delay: watch::Receiver<Delay>,
    read: impl Fn(),
) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        read();
        // Delivered in order whatever the draw: the writer takes chunks first come first.
        let due = Instant::now() + delay.borrow().draw();
        // An empty chunk is the end, delivered in its turn.
        if to.send((due, buf[..n].to_vec())).is_err() || n == 0 {
            // Wait here: returning would end the connection before the queue drains.
            std::future::pending::<()>().await;
        }
    }
}

/// Write each queued chunk to `to` when it is due, telling `written` of each; return at
/// the end or on an error.
async fn write_when_due<W: AsyncWrite + Unpin>(
    mut from: mpsc::UnboundedReceiver<(Instant, Vec<u8>)>,
    to: &mut W,
    written: impl Fn(),
) {
    while let Some((due, chunk)) = from.recv().await {
        // The timer rounds up to the next millisecond: an undelayed chunk skips it.
        if due > Instant::now() {
            tokio::time::sleep_until(due).await;
        }
        if chunk.is_empty() || to.write_all(&chunk).await.is_err() {
            return;
        }
        written();
    }
}

/// Read and count what the client sends, forwarding nothing, until the cut heals (or the
/// proxy is gone). A client that closes its end is held too: the server must not hear it.
async fn swallow<R: AsyncRead + Unpin>(
    client: &mut R,
    cut: &mut watch::Receiver<bool>,
    traffic: &AtomicU64,
) {
    let mut buf = [0u8; 16 * 1024];
    let mut open = true;
    loop {
        tokio::select! {
            n = client.read(&mut buf), if open => match n {
                Ok(0) | Err(_) => open = false,
                Ok(n) => {
                    traffic.fetch_add(n as u64, Ordering::SeqCst);
                }
            },
            _ = until(cut, false) => return,
        }
    }
}

/// Wait until the cut flag is `cut` (or the proxy is gone).
async fn until(flag: &mut watch::Receiver<bool>, cut: bool) {
    let _ = flag.wait_for(|c| *c == cut).await.map(|_| ());
}
