//! What dlock's client side costs on top of the server: key encoding, lease bookkeeping
//! (the lease, its watchdog task and the lost signal), and the process-local gate, measured
//! against the in-memory backend so no network is involved.
//!
//! `cargo bench -p lockbench --bench client_overhead` (a few seconds per group).

// `criterion_group!` generates an undocumented `pub fn`.
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
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

fn quick() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .sample_size(20)
}

criterion_group! {
    name = benches;
    config = quick();
    targets = key_encoding, lease_bookkeeping, local_gate
}
criterion_main!(benches);
