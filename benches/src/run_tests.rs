//! Tests of the measurements.

use super::*;

/// The short plan the workloads' tests run with.
pub(crate) fn plan() -> Plan {
    Plan {
        duration: Duration::from_millis(300),
        warmup: Duration::from_millis(50),
        hold: Duration::ZERO,
        connect_timeout: Duration::from_secs(10),
        ttl: Duration::from_secs(30),
        prefix: format!("lbtest{:08x}", rand::random::<u32>()),
    }
}

#[tokio::test]
async fn raw_measurements_count_operations_on_every_server() {
    let plan = plan();
    for kind in crate::backends::test_backends() {
        let url = kind.url();
        for (op, clients) in [(RawOp::Ping, 1), (RawOp::Cycle, 1), (RawOp::Cycle, 3)] {
            let m = raw(kind, &url, clients, op, &plan)
                .await
                .unwrap_or_else(|e| panic!("{kind} {op:?} ×{clients}: {e}"));
            assert!(
                m.ops > 0 && m.latency.quantile(0.5).is_some(),
                "{kind} {op:?}"
            );
            eprintln!(
                "{kind} {op:?} ×{clients}: {:.0}/s p50 {:?}",
                m.per_sec,
                m.latency.quantile(0.5).unwrap()
            );
        }
    }
}

/// A backend that grants every request, held or not, campaigns included (the key-set and
/// election tests use it too).
#[derive(Debug, Default)]
pub(crate) struct AlwaysGrants(std::sync::atomic::AtomicU64);

#[derive(Debug)]
struct Nothing;

#[async_trait::async_trait]
impl dlock_core::raw::Held for Nothing {
    async fn extend(&mut self, _ttl: Duration) -> dlock::Result<()> {
        Ok(())
    }
    async fn release(&mut self) -> dlock::Result<()> {
        Ok(())
    }
}

#[async_trait::async_trait]
impl dlock_core::raw::Backend for AlwaysGrants {
    const NAME: &'static str = "broken";
    fn capabilities(&self) -> dlock::Capabilities {
        // It declares permits and elections, so that a permit request and a campaign reach
        // it; nobody leads as `inspect` shows it, so observers poll and see no one.
        dlock::Capabilities {
            permits: true,
            election: dlock::Observe::Polled {
                every: Duration::from_millis(5),
            },
            ..Default::default()
        }
    }
    async fn inspect(&self, key: &str) -> dlock::Result<dlock::KeyStatus> {
        Ok(dlock::KeyStatus::new(key, false))
    }
    async fn list(&self, _prefix: &str) -> dlock::Result<Vec<String>> {
        Err(dlock::LockError::Unsupported {
            backend: Self::NAME,
            what: "listing held keys",
        })
    }
    async fn acquire(
        &self,
        _key: &str,
        _opts: &LockOptions,
        _deadline: dlock_core::raw::Deadline,
    ) -> dlock::Result<Option<dlock_core::raw::Grant>> {
        let token = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Ok(Some(dlock_core::raw::Grant::new(
            token,
            Box::new(Nothing),
            Instant::now(),
        )))
    }
    async fn campaign(
        &self,
        key: &str,
        _value: &str,
        opts: &LockOptions,
        deadline: dlock_core::raw::Deadline,
    ) -> dlock::Result<Option<dlock_core::raw::Grant>> {
        self.acquire(key, opts, deadline).await
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overlap_is_a_failure_not_a_number() {
    let plan = Plan {
        hold: Duration::from_millis(2),
        ..plan()
    };
    let clients: Vec<Arc<dyn DistributedLock>> = (0..3)
        .map(|_| {
            Arc::new(dlock_core::raw::LockClient::new(AlwaysGrants::default()))
                as Arc<dyn DistributedLock>
        })
        .collect();
    let failure = lock_with(clients, Workload::Contended, &plan)
        .await
        .expect_err("three clients holding one key at once must fail");
    assert!(failure.overlaps > 0, "{}", failure.error);
    assert!(failure.error.contains("overlap"), "{}", failure.error);
}

#[tokio::test]
async fn lock_workloads_check_their_history() {
    let plan = plan();
    for (workload, clients) in [
        (Workload::Uncontended, 1),
        (Workload::Contended, 3),
        (Workload::Spread, 3),
    ] {
        let m = lock("memory://lockbench-test", workload, clients, &plan)
            .await
            .unwrap_or_else(|f| panic!("{workload:?}: {}", f.error));
        assert!(
            m.count > 0 && m.holds_checked as u64 >= m.count,
            "{workload:?}"
        );
        assert_eq!(m.per_client.len(), clients);
        assert_eq!(m.per_client.iter().sum::<u64>(), m.count);
        if workload == Workload::Contended {
            assert!(m.handoff.count() > 0);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_run_reaches_its_cap_and_no_more() {
    let m = lock("memory://lockbench-test", Workload::Semaphore, 8, &plan())
        .await
        .unwrap_or_else(|f| panic!("{}", f.error));
    assert_eq!(Workload::Semaphore.permits(8), Some(2));
    assert_eq!(m.most_at_once, 2);
    assert!(m.count > 0 && m.wait.count() > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_over_its_cap_is_a_failure_not_a_number() {
    let clients: Vec<Arc<dyn DistributedLock>> = (0..8)
        .map(|_| {
            Arc::new(dlock_core::raw::LockClient::new(AlwaysGrants::default()))
                as Arc<dyn DistributedLock>
        })
        .collect();
    let failure = lock_with(clients, Workload::Semaphore, &plan())
        .await
        .expect_err("eight holders of two permits at once must fail");
    assert!(failure.overlaps > 0, "{}", failure.error);
    assert!(
        failure.error.contains("too many holders"),
        "{}",
        failure.error
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrant_run_re_enters_one_hold() {
    let m = lock("memory://lockbench-test", Workload::Reentrant, 1, &plan())
        .await
        .unwrap_or_else(|f| panic!("{}", f.error));
    assert!(m.count > 0 && m.cycle.count() > 0);
    assert_eq!(m.most_at_once, 1, "re-entries follow each other");
}
