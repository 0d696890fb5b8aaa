//! What dlock's client side costs on top of the server: key encoding, lease bookkeeping
//! (the lease, its watchdog task and the lost signal), the process-local gate, measured
//! against the in-memory backend so no network is involved, and the SQL backends' holder
//! connection task (a carrier) around a session that answers at once.
//!
//! `cargo bench -p lockbench --bench client_overhead` (a few seconds per group).

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use dlock_core::raw::carrier::{Afterwards, Carriers, Failure, Session};
use dlock_core::raw::key;
use dlock_core::{DistributedLock, LockOptions, Wait};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn zk_safe(c: char) -> bool {
    c.is_ascii_alphanumeric() || "-_:@.".contains(c)
}

/// `key::validate`, `key::escape`, and `key::shorten` of the escaped key, on short, escaped and long keys.
fn key_encoding(c: &mut Criterion) {
    let mut group = c.benchmark_group("key");
    let long = format!("tenants/{}/reports/nightly", "x".repeat(400));
    let keys = [
        ("plain", "invoices-2026-11".to_owned()),
        ("slashes", "tenants/42/invoices/2026-11".to_owned()),
        ("unicode", "rapports/été/über".to_owned()),
        ("long", long),
    ];
    for (name, k) in &keys {
        group.bench_with_input(BenchmarkId::new("validate", name), k, |b, k| {
            b.iter(|| key::validate(std::hint::black_box(k), 1024))
        });
        group.bench_with_input(BenchmarkId::new("escape", name), k, |b, k| {
            b.iter(|| key::escape(std::hint::black_box(k), zk_safe))
        });
        let escaped = key::escape(k, zk_safe);
        group.bench_with_input(BenchmarkId::new("shorten", name), &escaped, |b, e| {
            b.iter(|| key::shorten(std::hint::black_box(e), 200))
        });
    }
    group.finish();
}

/// One uncontended acquire + release: the baseline server work (a `tokio::sync::Mutex`)
/// against the memory backend with and without the renewal watchdog.
fn lease_bookkeeping(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("lease");
    let mutex = Arc::new(tokio::sync::Mutex::new(()));
    group.bench_function("tokio_mutex_baseline", |b| {
        b.to_async(&rt).iter(|| async { drop(mutex.lock().await) })
    });
    let lock = dlock_memory::from_url("memory://criterion-lease").expect("memory client");
    for (name, auto_renew) in [("try_acquire+release", false), ("with_watchdog", true)] {
        let opts = LockOptions::new().auto_renew(auto_renew);
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let lease = lock
                    .try_acquire("bench/lease", &opts)
                    .await
                    .expect("memory backend")
                    .expect("uncontended key is free");
                lease.release().await.expect("release")
            })
        });
    }
    let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
    group.bench_function("acquire+release", |b| {
        b.to_async(&rt).iter(|| async {
            let lease = lock.acquire("bench/lease", &opts).await.expect("acquire");
            lease.release().await.expect("release")
        })
    });
    group.finish();
}

/// Two tasks taking turns on one key: through one client (the local gate queues the second
/// task in process) and through two clients (both go to the server).
fn local_gate(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("gate");
    let opts = LockOptions::new().wait(Wait::For(Duration::from_secs(5)));
    let handoffs = |clients: [Arc<dyn DistributedLock>; 2], key: &'static str, iters: u64| {
        rt.block_on(async {
            let start = Instant::now();
            let tasks: Vec<_> = clients
                .into_iter()
                .map(|lock| {
                    tokio::spawn(async move {
                        for _ in 0..iters.div_ceil(2) {
                            let lease = lock.acquire(key, &opts).await.expect("acquire");
                            lease.release().await.expect("release");
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
            start.elapsed()
        })
    };
    group.bench_function("two_tasks_one_client", |b| {
        let one: Arc<dyn DistributedLock> =
            Arc::new(dlock_memory::from_url("memory://criterion-gate").expect("client"));
        b.iter_custom(|iters| handoffs([one.clone(), one.clone()], "bench/gate", iters))
    });
    group.bench_function("two_clients", |b| {
        let client = || -> Arc<dyn DistributedLock> {
            Arc::new(dlock_memory::from_url("memory://criterion-gate").expect("client"))
        };
        b.iter_custom(|iters| handoffs([client(), client()], "bench/clients", iters))
    });
    group.finish();
}

/// A session that answers every request at once: what a carrier adds around a backend's
/// requests, with no server behind them.
#[derive(Default)]
struct Answering {
    next: u64,
}

#[async_trait::async_trait]
impl Session for Answering {
    type Lock = u32;
    type Call = std::convert::Infallible;
    type Answer = ();

    async fn try_lock(&mut self, _: &u32, _: Duration) -> Result<Option<u64>, Failure> {
        self.next += 1;
        Ok(Some(self.next))
    }
    async fn unlock(&mut self, _: &u32, _: Afterwards) -> Result<bool, Failure> {
        Ok(true)
    }
    fn lingering(&mut self) {}
    async fn rest(&mut self) -> Result<(), Failure> {
        Ok(())
    }
    async fn keep(&mut self, _: Option<Duration>) -> Result<(), Failure> {
        Ok(())
    }
    fn id(&self) -> u64 {
        1
    }
    fn retire(self) {}
    async fn call(&mut self, _: &u32, call: Self::Call) -> Result<(), Failure> {
        match call {}
    }
}

/// One take and release through a client's carriers (as PostgreSQL's: up to 8 per group, a
/// lingering one kept between holds), against the same two requests made on the session
/// directly: the carrier's own cost per cycle, the message to its task and the answer back
/// included. Both loops run in a task of the runtime, as a caller's would.
fn carrier(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("carrier");
    let ttl = Duration::from_secs(30);
    group.bench_function("session_direct", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async move {
                tokio::spawn(async move {
                    let mut session = Answering::default();
                    let start = Instant::now();
                    for _ in 0..iters {
                        let token = session.try_lock(&1, ttl).await.expect("take");
                        std::hint::black_box(token);
                        let given = session.unlock(&1, Afterwards::Lingering).await;
                        std::hint::black_box(given.expect("give"));
                    }
                    start.elapsed()
                })
                .await
                .expect("task")
            })
        })
    });
    let carriers = Arc::new(
        Carriers::<Answering>::new("bench")
            .open_while_busy(8)
            .linger(),
    );
    group.bench_function("try_take+release", |b| {
        b.iter_custom(|iters| {
            let carriers = carriers.clone();
            rt.block_on(async move {
                tokio::spawn(async move {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let open = || async { Ok(Answering::default()) };
                        let mut grant = carriers
                            .try_take("bench/carrier", 1, ttl, true, open)
                            .await
                            .expect("take")
                            .expect("the key is free");
                        grant.held.release().await.expect("release");
                    }
                    start.elapsed()
                })
                .await
                .expect("task")
            })
        })
    });
    group.finish();
}

fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = quick();
    targets = key_encoding, lease_bookkeeping, local_gate, carrier
}
criterion_main!(benches);
