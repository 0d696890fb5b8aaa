//! A TCP proxy that can black-hole its traffic: the network fault behind the partition
//! scenarios. A cut proxy keeps every connection open but forwards nothing, as a real
//! partition does (no reset, no FIN), so clients find out by their own timeouts.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A proxy on 127.0.0.1 in front of one server.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    cut: Arc<watch::Sender<bool>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Start a proxy on a free loopback port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(watch::Sender::new(false));
        let accept = tokio::spawn({
            let cut = cut.clone();
            async move {
                while let Ok((client, _)) = listener.accept().await {
                    tokio::spawn(forward(client, upstream, cut.subscribe()));
                }
            }
        });
        Ok(Self { addr, cut, accept })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop forwarding, in both directions, on every connection, new ones included.
    pub fn cut(&self) {
        self.cut.send_replace(true);
    }

    /// Forward again. Bytes sent during the cut are lost with the connections that carried
    /// them: connections open during a cut are closed when it heals.
    pub fn heal(&self) {
        self.cut.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        // Ends every connection's forwarding loop.
        self.cut.send_replace(true);
    }
}

async fn forward(mut client: TcpStream, upstream: SocketAddr, mut cut: watch::Receiver<bool>) {
    if *cut.borrow_and_update() {
        // Black hole: hold the connection, never answer, until healed or dropped.
        until(&mut cut, false).await;
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
                // Hold both sockets silently until healed, then close them.
                until(&mut cut, false).await;
                return;
            }
        }
    }
}

/// Wait until the cut flag is `cut` (or the proxy is gone).
async fn until(flag: &mut watch::Receiver<bool>, cut: bool) {
    let _ = flag.wait_for(|c| *c == cut).await.map(|_| ());
}
