//! The shared conformance suite: one scenario per promise of the dlock contract, run by
//! every backend against its real server.
//!
//! ```text
//! // crates/dlock-redis/tests/conformance.rs
//! dlock_conformance::conformance!(redis, RedisHarness::from_env());
//! ```
//!
//! The macro stamps every scenario as its own `#[tokio::test]` in a module named after the
//! backend, so a failure reads `redis::mutual_exclusion` and names the backend and the
//! promise. The list inside the macro is the only list of scenarios.
//!
//! A backend hands the suite a [`Harness`]: fresh independent clients (separate
//! connections), a client whose network can be cut, a way to break a lease as an operator
//! or a fault would, and a residue check of what is left on the server. Crashes are real:
//! the suite re-runs the test binary as a child process that holds a key, and SIGKILLs it
//! (see [`holder`]). Scenarios read [`Capabilities`](dlock_core::Capabilities) and check the
//! declared behaviour (FIFO order when fair, exclusion otherwise); nothing is skipped.
//!
//! An unreachable server fails the test with a message naming the server and the command
//! that starts it (`scripts/backends up <setup>`).

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

pub mod history;
pub mod holder;
pub mod proxy;
pub mod scenarios;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::{BoxError, DistributedLock, ErrorKind, Result};

pub use history::{History, Hold, Violation};
pub use holder::{ChildHolder, Holder};
pub use proxy::Proxy;

/// How long one scenario may run before it fails as hung.
pub const SCENARIO_LIMIT: Duration = Duration::from_secs(180);

/// What a backend gives the suite.
#[async_trait]
pub trait Harness: Send + Sync + 'static {
    /// The backend's name as in test names, e.g. `"redis"`.
    fn name(&self) -> &'static str;

    /// The `scripts/backends` setup that starts the server under test.
    fn setup(&self) -> &'static str {
        self.name()
    }

    /// The URL of the server under test (from the environment, with the default address).
    fn url(&self) -> String;

    /// A new client built from `url`.
    async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>>;

    /// A new client of the server under test, on its own connection(s).
    async fn client(&self) -> Result<Arc<dyn DistributedLock>> {
        self.connect(&self.url()).await
    }

    /// The server addresses `url()` names, so the suite can put proxies in front of them.
    fn server_addrs(&self) -> Vec<SocketAddr> {
        Vec::new()
    }

    /// `url()` with its server addresses replaced by `addrs` (same order).
    fn url_with_addrs(&self, _addrs: &[SocketAddr]) -> String {
        self.url()
    }

    /// A client whose network the test can cut, connected while the network is whole.
    /// Scenarios need one from every backend (the partition scenarios, and the check that
    /// bad keys are refused before any I/O); an `Err` fails them. By default: one
    /// [`Proxy`] per server address.
    async fn partitioned_client(&self) -> Result<(Arc<dyn DistributedLock>, Box<dyn Partition>)> {
        let mut proxies = Vec::new();
        for addr in self.server_addrs() {
            proxies.push(Proxy::start(addr).await.expect("start a loopback proxy"));
        }
        assert!(
            !proxies.is_empty(),
            "{}: the harness names no server address to proxy",
            self.name()
        );
        let addrs: Vec<_> = proxies.iter().map(Proxy::addr).collect();
        let client = self.connect(&self.url_with_addrs(&addrs)).await?;
        Ok((client, Box::new(proxies)))
    }

    /// A client of a server that does not answer: `Err` is accepted if it is
    /// [`Unavailable`](dlock_core::LockError::Unavailable). By default: every address
    /// replaced by a loopback port with nothing behind it.
    async fn unreachable_client(&self) -> Result<Arc<dyn DistributedLock>> {
        let mut dead = Vec::new();
        for _ in self.server_addrs() {
            let listener =
                std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
            dead.push(listener.local_addr().expect("local addr"));
        }
        self.connect(&self.url_with_addrs(&dead)).await
    }

    /// URLs that must be refused, with the kind of error each must give.
    fn bad_urls(&self) -> Vec<(String, ErrorKind)>;

    /// Remove `key`'s lock from the server as an operator or a fault would (delete the key
    /// or node, revoke the lease, kill the holding connection), without telling the holder.
    async fn break_lease(&self, key: &str) -> Result<(), BoxError>;

    /// Lock state left on the server for keys starting with `prefix` (keys, nodes, rows,
    /// leases). Fence counters that must outlive holders by design are not residue.
    async fn residue(&self, prefix: &str) -> Result<Vec<String>, BoxError>;

    /// Start a holder of `key` that the suite can kill. By default a child process running
    /// test `test` of this binary (see [`holder`]).
    async fn spawn_holder(
        &self,
        test: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<Box<dyn Holder>, BoxError> {
        Ok(Box::new(ChildHolder::spawn(test, key, ttl).await?))
    }

    /// The ttl timing scenarios use. Default 2 s.
    fn ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    /// The longest a waiter may take to acquire after a release (generous: it catches a
    /// polling sleep, not a slow machine). Default 1 s.
    fn handoff_bound(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// A network cut the test controls.
pub trait Partition: Send + Sync {
    /// Stop all traffic between the client and the server(s), silently. Starts
    /// [`traffic_while_cut`](Self::traffic_while_cut) from zero.
    fn cut(&self);
    /// Let traffic through again.
    fn heal(&self);
    /// How much the client tried to send to the server(s) since the last
    /// [`cut`](Self::cut), none of which arrived (for a [`Proxy`]: bytes written plus
    /// connections opened). Zero means the client did not try to reach the server; any
    /// request the client makes while cut must show here.
    fn traffic_while_cut(&self) -> u64;
}

impl Partition for Vec<Proxy> {
    fn cut(&self) {
        self.iter().for_each(Proxy::cut);
    }
    fn heal(&self) {
        self.iter().for_each(Proxy::heal);
    }
    fn traffic_while_cut(&self) -> u64 {
        self.iter().map(Proxy::traffic_while_cut).sum()
    }
}

/// A running scenario: the harness, the test's name and its own key prefix.
#[derive(Clone)]
pub struct Ctx {
    harness: Arc<dyn Harness>,
    test: &'static str,
    prefix: String,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("test", &self.test)
            .field("prefix", &self.prefix)
            .finish()
    }
}

impl Ctx {
    /// A context for `test` with a fresh random key prefix.
    pub fn new(harness: Arc<dyn Harness>, test: &'static str) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Self {
            harness,
            test,
            prefix: format!("conf-{}/", &id[..12]),
        }
    }

    /// The harness.
    pub fn harness(&self) -> &dyn Harness {
        &*self.harness
    }

    /// The full test name, e.g. `redis::crash_release`.
    pub fn test(&self) -> &'static str {
        self.test
    }

    /// This scenario's key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// A key under this scenario's prefix.
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// A new independent client; an unreachable server fails the test with a message
    /// naming the server and the command that starts it.
    pub async fn client(&self) -> Arc<dyn DistributedLock> {
        match self.harness.client().await {
            Ok(client) => client,
            Err(e) => panic!("{}", self.unreachable_message(&e)),
        }
    }

    /// The failure message for an unreachable server.
    pub fn unreachable_message(&self, e: &dyn std::fmt::Display) -> String {
        format!(
            "{}: cannot use the {} server at {}: {e}\n  start it with: scripts/backends up {}",
            self.test,
            self.harness.name(),
            self.harness.url(),
            self.harness.setup()
        )
    }

    /// Check nothing this scenario created is left on the server, waiting up to
    /// `ttl + 5 s` for what expires on its own (dropped leases, crashed holders).
    pub async fn finish(self) {
        let bound = self.harness.ttl() + Duration::from_secs(5);
        let started = tokio::time::Instant::now();
        loop {
            let left = self
                .harness
                .residue(&self.prefix)
                .await
                .unwrap_or_else(|e| panic!("{}", self.unreachable_message(&e)));
            if left.is_empty() {
                return;
            }
            if started.elapsed() > bound {
                panic!(
                    "{}: left on the server after {bound:?}: {left:?}",
                    self.test
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Run one scenario (what the [`conformance!`] macro's tests call). In a holder child
/// process it holds a key instead (see [`holder`]).
pub async fn run<H, F, Fut>(harness: H, test: &'static str, scenario: F)
where
    H: Harness,
    F: FnOnce(Ctx) -> Fut,
    Fut: Future<Output = ()>,
{
    let harness: Arc<dyn Harness> = Arc::new(harness);
    if holder::serve_if_child(&*harness).await {
        return;
    }
    let cx = Ctx::new(harness, test);
    if tokio::time::timeout(SCENARIO_LIMIT, scenario(cx))
        .await
        .is_err()
    {
        panic!("{test}: the scenario hung for {SCENARIO_LIMIT:?}");
    }
}

/// Stamp every scenario as a `#[tokio::test]` in a module named `$name`.
///
/// `$harness` is evaluated once per test, inside the module (`use super::*` is in scope).
#[macro_export]
macro_rules! conformance {
    ($name:ident, $harness:expr) => {
        mod $name {
            #[allow(unused_imports)]
            use super::*;
            $crate::__scenarios!($name, $harness;
                mutual_exclusion,
                try_acquire_answers_at_once,
                acquire_times_out_near_deadline,
                waiter_is_woken_on_release,
                stale_lease_cannot_release_or_extend,
                crash_release,
                fencing_monotonic_after_crash,
                renewal_keeps_lease,
                key_frees_after_ttl_without_renewal,
                manual_extend_moves_the_deadline,
                lost_fires_when_lease_broken,
                lost_fires_before_partitioned_lease_is_taken,
                fencing_tokens_increase,
                independent_keys,
                fairness,
                no_herd,
                cancelled_acquire_leaves_nothing,
                bad_keys_are_rejected_before_io,
                bad_options_are_rejected,
                bad_urls_are_rejected,
                unavailable_server,
                black_holed_server_does_not_hang,
                dropped_leases_leave_nothing,
                shared_client,
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __scenarios {
    ($name:ident, $harness:expr; $($scenario:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $scenario() {
                $crate::run(
                    $harness,
                    concat!(stringify!($name), "::", stringify!($scenario)),
                    $crate::scenarios::$scenario,
                )
                .await;
            }
        )*

        /// The scenarios this module runs.
        #[allow(dead_code)]
        pub const SCENARIOS: &[&str] = &[$(stringify!($scenario)),*];
    };
}
