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
//!
//! What every backend's harness would otherwise repeat is here: the URL from the
//! environment ([`env_url`]), the server addresses in it and the same URL through proxies
//! (the provided [`Harness::server_addrs`] and [`Harness::url_with_addrs`], which read
//! any URL of the one dlock grammar), the unreachable-server message
//! ([`Harness::unreachable`], [`Harness::or_unreachable`]), a dead port ([`dead_addr`]),
//! a URL option ([`url_with_option`]) and test logging ([`init_tracing`]).

#![doc(test(attr(deny(warnings), allow(dead_code, unused_variables))))]

pub mod figures;
pub mod history;
pub mod holder;
pub mod proxy;
pub mod scenarios;
pub mod testkit;
pub mod urls;

use std::fmt::Display;
use std::future::Future;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_core::raw::url::{Host, LockUrl, default_port, redact};
use dlock_core::{BoxError, DistributedLock, ErrorKind, LockOptions, Result};

pub use history::{History, Hold, Violation};
pub use holder::{ChildHolder, Holder, OWNER_ENTRIES, take_entries};
pub use proxy::{Delay, Proxy, ServerClock};

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
    /// By default: each host of the URL (read with [`LockUrl`], the scheme's default port
    /// where it has none), resolved to its first address. A host that does not resolve
    /// fails the test.
    fn server_addrs(&self) -> Vec<SocketAddr> {
        let url = self.url();
        harness_url(self.name(), &url)
            .hosts()
            .iter()
            .map(|host| {
                (host.name.as_str(), host.port)
                    .to_socket_addrs()
                    .ok()
                    .and_then(|mut addrs| addrs.next())
                    .unwrap_or_else(|| {
                        panic!(
                            "{}: the server {host} of {} does not resolve",
                            self.name(),
                            redact(&url)
                        )
                    })
            })
            .collect()
    }

    /// `url()` with its server addresses replaced by `addrs` (same order). By default the
    /// URL's host list is replaced and everything else (credentials, path, options) kept.
    fn url_with_addrs(&self, addrs: &[SocketAddr]) -> String {
        let hosts = addrs
            .iter()
            .map(|addr| Host::new(addr.ip().to_string(), addr.port()))
            .collect();
        harness_url(self.name(), &self.url())
            .with_hosts(hosts)
            .expose()
    }

    /// The failure message for a server of this harness at `url` that cannot be used:
    /// what went wrong, the server (its password hidden) and the command that starts it.
    fn unreachable(&self, url: &str, e: &dyn Display) -> String {
        format!(
            "cannot use the {} server at {}: {e}\n  start it with: scripts/backends up {}",
            self.name(),
            redact(url),
            self.setup()
        )
    }

    /// `result`'s value, or a test failure with the [`unreachable`](Self::unreachable)
    /// message for `url`.
    fn or_unreachable<T, E: Display>(&self, url: &str, result: Result<T, E>) -> T
    where
        Self: Sized,
    {
        result.unwrap_or_else(|e| panic!("{}", self.unreachable(url, &e)))
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
        let dead: Vec<_> = self.server_addrs().iter().map(|_| dead_addr()).collect();
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

    /// Start a holder of `key` that the suite can kill, taking it with `opts` (its ttl and
    /// mode; with an owner, [`OWNER_ENTRIES`] times, see [`take_entries`]). A `key` of several lines names a set: the holder takes every line's key as
    /// one hold ([`LockExt::acquire_all`](dlock_core::LockExt::acquire_all)). By default a child process running test `test` of this binary (see
    /// [`holder`]).
    async fn spawn_holder(
        &self,
        test: &str,
        key: &str,
        opts: &LockOptions,
    ) -> Result<Box<dyn Holder>, BoxError> {
        Ok(Box::new(ChildHolder::spawn(test, key, opts).await?))
    }

    /// Start a leader of `key`'s election publishing `value` (with `opts`' ttl) that the
    /// suite can kill; it reports its term as its token. By default a child process, as
    /// [`spawn_holder`](Self::spawn_holder).
    async fn spawn_leader(
        &self,
        test: &str,
        key: &str,
        value: &str,
        opts: &LockOptions,
    ) -> Result<Box<dyn Holder>, BoxError> {
        Ok(Box::new(
            ChildHolder::spawn_leader(test, key, value, opts).await?,
        ))
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

/// `url` taken apart with the one URL grammar, for the provided [`Harness`] methods.
fn harness_url(name: &'static str, url: &str) -> LockUrl {
    let scheme = url
        .split_once("://")
        .map(|(scheme, _)| scheme.to_ascii_lowercase())
        .unwrap_or_default();
    LockUrl::parse(name, url, &[], default_port(&scheme).unwrap_or(0))
        .unwrap_or_else(|e| panic!("{name}: the harness URL {} is not usable: {e}", redact(url)))
}

/// The URL in the environment variable `var`, or `default` when it is not set.
pub fn env_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// `url` with one more query option (`name=value`).
///
/// ```
/// assert_eq!(dlock_conformance::url_with_option("zk://h", "a=1"), "zk://h?a=1");
/// assert_eq!(dlock_conformance::url_with_option("zk://h?a=1", "b=2"), "zk://h?a=1&b=2");
/// ```
pub fn url_with_option(url: &str, option: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{option}")
}

/// A loopback address with nothing listening behind it (a port that was free a moment ago).
pub fn dead_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    listener.local_addr().expect("local addr")
}

/// Send the test's `tracing` output to the test writer, filtered by `RUST_LOG` (e.g.
/// `RUST_LOG=dlock_conformance=info` shows each no_herd figure). Every scenario calls it;
/// calling it again does nothing.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
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

    /// The failure message for an unreachable server (see [`Harness::unreachable`]).
    pub fn unreachable_message(&self, e: &dyn Display) -> String {
        format!(
            "{}: {}",
            self.test,
            self.harness.unreachable(&self.harness.url(), e)
        )
    }

    /// Check nothing this scenario created is left on the server, waiting up to
    /// `ttl + 5 s` for what expires on its own (dropped leases, crashed holders). A read
    /// of the server's state that fails is tried again within the same bound (a fresh
    /// connection on a loaded machine may miss its timeout once).
    pub async fn finish(self) {
        let bound = self.harness.ttl() + Duration::from_secs(5);
        let started = tokio::time::Instant::now();
        loop {
            // A failed read counts as "not yet", within the same bound.
            let left = self.harness.residue(&self.prefix).await;
            match &left {
                Ok(left) if left.is_empty() => return,
                _ if started.elapsed() <= bound => {}
                Ok(left) => panic!(
                    "{}: left on the server after {bound:?}: {left:?}",
                    self.test
                ),
                Err(e) => panic!("{}", self.unreachable_message(e)),
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
    init_tracing();
    figures::Figures::installed();
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
                many_holds_at_once,
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
                shared_mode_is_declared,
                readers_share,
                writer_excludes_readers_and_writers,
                writer_not_starved_by_readers,
                shared_try_acquire_answers_at_once,
                shared_timeout_and_cancellation_leave_nothing,
                crashed_reader_and_writer_free_the_key,
                permits_are_declared,
                permits_admit_up_to_the_limit,
                permits_cap_holders_under_contention,
                freed_permit_lets_one_waiter_in,
                permit_timeout_and_cancellation_leave_nothing,
                crashed_permit_holder_gives_its_permit_back,
                one_permit_is_a_mutex,
                disagreeing_limits_count_against_their_own,
                key_sets_never_deadlock_or_overlap,
                key_set_with_a_busy_key_leaves_the_others_free,
                crashed_key_set_holder_frees_every_key,
                cancelled_key_set_leaves_nothing,
                bad_key_in_a_set_is_refused_before_any_key_is_taken,
                key_set_lost_fires_when_any_key_is_lost,
                inspect_shows_the_holder_and_the_queue,
                inspect_shows_every_shared_holder_and_permit,
                list_shows_held_keys_under_a_prefix,
                figures_are_recorded,
                election_is_declared,
                leader_shows_the_campaign_value_and_term,
                one_leader_at_a_time_and_terms_increase,
                resign_hands_over_promptly,
                observers_see_every_leader_in_order,
                proclaim_is_refused_after_loss,
                cancelled_campaign_leaves_nothing,
                crashed_leader_is_replaced_within_the_crash_bound,
                bad_election_values_are_refused_before_io,
                reentry_is_declared,
                reentry_succeeds_at_once_with_the_same_token,
                reentry_keeps_the_key_until_the_last_release,
                another_owner_waits_then_gets_a_higher_token,
                reentry_from_a_second_client,
                reentry_from_a_second_process,
                crashed_owner_frees_the_key_whatever_its_count,
                stale_owner_lease_is_not_held,
                lost_fires_on_every_lease_of_the_owner,
                bad_owners_are_refused_before_io,
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

#[cfg(test)]
#[path = "lib_tests.rs"]
mod tests;
