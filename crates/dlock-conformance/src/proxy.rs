//! A TCP proxy that can black-hole its traffic: the network fault behind the partition
//! scenarios. A cut proxy keeps every connection open but forwards nothing, as a real
//! partition does (no reset, no FIN), so clients find out by their own timeouts.
//!
//! While cut, the proxy swallows what clients send and counts it
//! ([`Proxy::traffic_while_cut`]): a scenario can tell whether a client tried to reach the
//! server at all, although nothing got through.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A proxy on 127.0.0.1 in front of one server.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<watch::Sender<bool>>,
    traffic: Arc<AtomicU64>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Start a proxy on a free loopback port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(watch::Sender::new(false));
        let traffic = Arc::new(AtomicU64::new(0));
        let accept = tokio::spawn({
            let (cut, traffic) = (cut.clone(), traffic.clone());
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(forward(client, upstream, cut.subscribe(), traffic.clone()));
                }
            }
        });
        Ok(Self {
            addr,
            cut,
            traffic,
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

    /// What clients tried to send since the last [`cut`](Self::cut), none of which reached
    /// the server: every byte written, plus one for every connection opened (a client may
    /// send nothing on a new connection until the server speaks first, as MySQL's do).
    /// Zero means no client of this proxy tried to reach the server during the cut.
    pub fn traffic_while_cut(&self) -> u64 {
        self.traffic.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Ends every connection's forwarding loop.
        self.cut.send_replace(true);
    }
}

async fn forward(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut cut: watch::Receiver<bool>,
    traffic: Arc<AtomicU64>,
) {
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
    let mut up = [0u8; 16 * 1024];
    let mut down = [0u8; 16 * 1024];
    loop {
        let mut on_cut = cut.clone();
        tokio::select! {
            n = cr.read(&mut up) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => if sw.write_all(&up[..n]).await.is_err() { return },
            },
            n = sr.read(&mut down) => match n {
                Ok(0) | Err(_) => return,
                Ok(n) => if cw.write_all(&down[..n]).await.is_err() { return },
            },
            _ = until(&mut on_cut, true) => {
                // Hold both sockets silently until healed, then close them. The server
                // hears nothing, not even the client closing its end.
                swallow(&mut cr, &mut cut, &traffic).await;
                return;
            }
        }
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
