//! Helpers for a backend's own tests beyond the shared suite: unique keys, a server of the
//! wrong kind on a port, and hand-off and latency measurements on any
//! [`DistributedLock`].

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use dlock_core::{DistributedLock, Lease, LockOptions, Wait};
use tokio::time::Instant;

/// A key no other test uses.
pub fn unique_key(name: &str) -> String {
    format!("test-{name}-{:016x}", rand::random::<u64>())
}

/// `try_acquire` that must succeed.
pub async fn must_take(lock: &dyn DistributedLock, key: &str, opts: &LockOptions) -> Lease {
    lock.try_acquire(key, opts)
        .await
        .unwrap_or_else(|e| panic!("try_acquire({key}): {e}"))
        .unwrap_or_else(|| panic!("{key} should be free"))
}

/// [`must_take`] for each of `keys`, one after another.
pub async fn must_take_all(
    lock: &dyn DistributedLock,
    keys: &[String],
    opts: &LockOptions,
) -> Vec<Lease> {
    let mut leases = Vec::with_capacity(keys.len());
    for key in keys {
        leases.push(must_take(lock, key, opts).await);
    }
    leases
}

/// A loopback server that answers every connection with an HTTP error: a server of the
/// wrong kind on the port. Each call starts a new one.
pub fn wrong_kind_of_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let addr = listener.local_addr().expect("local addr");
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            });
        }
    });
    addr
}

/// `rounds` hand-offs of `key` from `holder` to `waiter`: each round the holder takes the
/// key (30 s ttl, so only the release can wake the waiter), the waiter starts waiting,
/// `listening` returns once the waiter listens for the release, and the holder releases.
/// Returns the times from the release call to the waiter holding the key, sorted.
pub async fn hand_offs<F, Fut>(
    holder: Arc<dyn DistributedLock>,
    waiter: Arc<dyn DistributedLock>,
    key: &str,
    rounds: usize,
    listening: F,
) -> Vec<Duration>
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()>,
{
    let long = LockOptions::new().ttl(Duration::from_secs(30));
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let lease = holder.acquire(key, &long).await.expect("holder acquires");
        let task = {
            let (waiter, key) = (waiter.clone(), key.to_owned());
            tokio::spawn(async move {
                let opts = long.wait(Wait::For(Duration::from_secs(20)));
                let lease = waiter.acquire(&key, &opts).await.expect("waiter acquires");
                (Instant::now(), lease)
            })
        };
        listening().await;
        // Let the waiter's re-try after subscribing fail first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let released = Instant::now();
        lease.release().await.expect("release");
        let (acquired, lease) = task.await.expect("waiter task");
        times.push(acquired.saturating_duration_since(released));
        lease.release().await.expect("waiter releases");
    }
    times.sort();
    times
}

/// `cycles` uncontended `try_acquire` + `release` of `key`, sorted by duration.
pub async fn uncontended(lock: &dyn DistributedLock, key: &str, cycles: usize) -> Vec<Duration> {
    let mut times = Vec::with_capacity(cycles);
    for _ in 0..cycles {
        let started = Instant::now();
        must_take(lock, key, &LockOptions::new())
            .await
            .release()
            .await
            .expect("release");
        times.push(started.elapsed());
    }
    times.sort();
    times
}

/// The median of sorted `times`, and a line to print saying `what` was measured: count,
/// median, minimum and p99.
pub fn summary(what: &str, times: &[Duration]) -> (Duration, String) {
    let median = times[times.len() / 2];
    let line = format!(
        "{what} over {}: median {median:?}, min {:?}, p99 {:?}",
        times.len(),
        times[0],
        times[(times.len() * 99 / 100).min(times.len() - 1)]
    );
    (median, line)
}

/// Run `f` on a fresh current-thread runtime while capturing what it logs at `WARN` and
/// above (plain text, no colours); returns the log and `f`'s output. For tests that check
/// what a backend warns about, and that the warning shows no secret.
pub fn warnings_of<T, Fut>(f: impl FnOnce() -> Fut) -> (String, T)
where
    Fut: Future<Output = T>,
{
    #[derive(Clone, Default)]
    struct Log(Arc<std::sync::Mutex<Vec<u8>>>);
    impl Write for Log {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let log = Log::default();
    let writer = log.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let out = tracing::subscriber::with_default(subscriber, || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime")
            .block_on(f())
    });
    let text =
        String::from_utf8_lossy(&log.0.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    (text, out)
}
