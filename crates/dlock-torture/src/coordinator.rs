//! The coordinator: spawns the workers, serves the fenced store, injects the faults, waits
//! for recovery after each, and checks everything at the end.
//!
//! [`run`] tells the whole story; the parts live in `plan` (which units and faults),
//! `fleet` (the worker processes), `injector` (the fault loop) and `final_check` (the keys
//! free and nothing left on the servers once the workers are gone).

mod final_check;
mod fleet;
mod injector;
mod plan;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use dlock_conformance::{Delay, Proxy};
use dlock_core::{Capabilities, Expiry};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::check::{self, Violation};
use crate::clock::{now_ns, ns};
use crate::faults::{FaultKind, FaultSet};
use crate::key_sets;
use crate::netns;
use crate::report::Report;
use crate::servers::{self, ServerCtl, Target, UnitLocks};
use crate::store::{self, Recorder};
use final_check::{check_residue, final_check};
use fleet::{Fleet, Slot};
use injector::Injector;
use plan::{FaultPlan, units_of};

/// What the command line asked for.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) url: String,
    pub(crate) duration: Duration,
    pub(crate) workers: usize,
    pub(crate) tasks: usize,
    pub(crate) clients: usize,
    pub(crate) keys: usize,
    pub(crate) ttl: Duration,
    pub(crate) faults: FaultSet,
    pub(crate) max_faults: Option<usize>,
    pub(crate) seed: u64,
    pub(crate) units: Vec<String>,
    pub(crate) backends_script: Option<PathBuf>,
    /// Accept memory:// (each worker then has a lock of its own): the self-test that the
    /// checks catch a lock that does not exclude.
    pub(crate) allow_memory: bool,
    /// The share of holds taken shared where the backend declares shared holds.
    pub(crate) read_share: f64,
    /// Every hold one of this many permits (the semaphore workload).
    pub(crate) permits: Option<u32>,
    /// Every hold a set of 2 to this many distinct keys (the key-set workload).
    pub(crate) key_sets: Option<usize>,
    /// Every hold a campaign in the key's election (the election workload).
    pub(crate) election: bool,
    /// Every hold reentrant, entered again and left lease by lease (the reentry workload).
    pub(crate) reentry: bool,
}

/// Timings derived from the backend's expiry and the ttl.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timings {
    /// How long a silent holder keeps its key at most (ttl or session timeout).
    pub(crate) silence: Duration,
    /// How long a pause or partition lasts: well beyond `silence`.
    pub(crate) fault_hold: Duration,
    /// How long members stay down: beyond a lease, so a Redis node comes back after the
    /// keys it held have expired elsewhere (Redlock's delayed restart).
    pub(crate) member_down: Duration,
    /// How long after a fault ends its effects may still show.
    pub(crate) grace: Duration,
    /// How long after a fault every key must have been acquired again.
    pub(crate) recovery_limit: Duration,
    /// How long a worker's acquire waits.
    pub(crate) wait: Duration,
    /// How late a `delay` fault makes each byte each way: a tenth of `silence`, plus up to
    /// a fifth more, so a round trip takes up to 60 % of a lease (renewals arrive late but
    /// mostly in time; the holder's deadline arithmetic is what is tried).
    pub(crate) late: Delay,
}

impl Timings {
    fn new(caps: &Capabilities, ttl: Duration) -> Self {
        let silence = match caps.expiry {
            Expiry::Ttl => ttl,
            Expiry::Session { timeout } => timeout,
        };
        let longest = silence.max(ttl);
        Self {
            silence,
            fault_hold: silence + (silence / 2).max(Duration::from_secs(1)),
            member_down: longest + Duration::from_secs(1),
            grace: 2 * longest + Duration::from_secs(2),
            recovery_limit: 2 * longest + Duration::from_secs(30),
            wait: 3 * longest,
            late: Delay {
                base: silence / 10,
                jitter: silence / 5,
            },
        }
    }
}

/// Run the torture; the report, whether it passed or not.
pub(crate) async fn run(cfg: Config) -> Result<Report, String> {
    let target = Target::parse(&cfg.url)?;
    let addrs = if target.scheme() != "memory" {
        target.addrs()?
    } else if cfg.allow_memory {
        Vec::new()
    } else {
        return Err("memory:// lives inside one process; the torture run needs a lock server shared by processes".into());
    };
    let script = servers::find_script(cfg.backends_script.as_deref());
    let group = plan::failover_group(target.scheme());
    // The namespaced topology of `scripts/netns`: its members, named by their addresses.
    let members = netns::members_of(&addrs);
    let netns_script = script.as_deref().and_then(netns::script_beside);
    // A replicated Redis topology is one `scripts/backends` group, locked and failed over
    // as a whole; the namespaced topology's units are its members.
    let units = match (group, &members) {
        (Some(group), _) => vec![group.to_owned()],
        (None, Some(members)) => members.clone(),
        (None, None) => units_of(&cfg, script.as_deref(), &addrs),
    };
    let hint = if units.is_empty() {
        "start it".to_owned()
    } else {
        format!("scripts/backends up {}", units.join(" "))
    };

    // The clock preload the workers run under, so that a worker's wall clock can jump.
    let shim = match &netns_script {
        Some(netns) => netns::clock_shim(netns).await,
        None => None,
    };
    let shimmed = shim.is_some();
    let plan = match (group, &members) {
        (Some(group), _) => FaultPlan::replicated(&cfg.faults, script.is_some(), group, shimmed)?,
        (None, Some(members)) => {
            FaultPlan::namespaced(&cfg.faults, netns_script.is_some(), members, shimmed)?
        }
        (None, None) => FaultPlan::new(&cfg.faults, script.is_some(), &addrs, &units, shimmed)?,
    };
    let (selected, not_injected) = (plan.selected, plan.not_injected);
    let fails_over = selected.contains(&FaultKind::Failover);
    let netns_faults = selected.iter().any(|k| FaultKind::NETNS.contains(k));
    // Hold the units for the whole run (even with no server fault selected: another run's
    // restart would break this one's history).
    let _locks = if plan.server_control || fails_over {
        Some(UnitLocks::take(&units, Duration::from_secs(30 * 60)).await?)
    } else if netns_faults {
        let locked: Vec<String> = units.iter().map(|m| format!("netns-{m}")).collect();
        Some(UnitLocks::take(&locked, Duration::from_secs(30 * 60)).await?)
    } else {
        None
    };
    let netns = netns_script.filter(|_| netns_faults).map(netns::Netns::new);
    let ctl = script
        .filter(|_| plan.server_control || fails_over)
        .map(ServerCtl::new);
    // Probe once the units are ours: another run may be restarting them until then.
    let probe = dlock::connect(&cfg.url)
        .await
        .map_err(|e| format!("cannot connect to {}: {e} ({hint})", target.redacted()))?;
    let caps = probe.capabilities();
    let backend = probe.backend_name();
    drop(probe);
    if cfg.permits.is_some() && !caps.permits {
        return Err(format!(
            "{backend} does not declare permits (Capabilities::permits): the semaphore workload (--permits) cannot run on it"
        ));
    }
    let timings = Timings::new(&caps, cfg.ttl);

    let run_id = uuid::Uuid::new_v4().simple().to_string();
    // Characters no backend escapes, so the residue check finds the keys by this stem.
    let stem = format!("torture-{}-", &run_id[..10]);
    let keys: Vec<String> = (0..cfg.keys.max(1))
        .map(|i| format!("{stem}k{i}"))
        .collect();
    let recorder = Arc::new(Recorder::default());
    let store_addr = store::serve(recorder.clone())
        .await
        .map_err(|e| format!("cannot listen on loopback: {e}"))?;
    let mut fleet = Fleet {
        slots: Vec::new(),
        next_process: 0,
        recorder: recorder.clone(),
        problems: Arc::default(),
        exe: own_executable()?,
        shim: shim
            .clone()
            .filter(|_| selected.contains(&FaultKind::ClientClock)),
        common: vec![
            format!("--store={store_addr}"),
            format!("--tasks={}", cfg.tasks),
            format!("--clients={}", cfg.clients),
            format!("--keys={}", keys.join(",")),
            format!("--ttl={}ms", cfg.ttl.as_millis()),
            format!("--wait={}ms", timings.wait.as_millis()),
            format!("--seed={}", cfg.seed),
            format!("--read-share={}", cfg.read_share),
        ]
        .into_iter()
        .chain(cfg.permits.map(|n| format!("--permits={n}")))
        .chain(cfg.key_sets.map(|k| format!("--key-sets={k}")))
        .chain(cfg.election.then(|| "--election".to_owned()))
        .chain(cfg.reentry.then(|| "--reentry".to_owned()))
        .collect(),
    };
    // Each slot's wall-clock offset, read by the preload on every call (`+0` until a
    // client-clock fault writes it).
    let clocks = tempfile_dir(&run_id)?;
    for slot in 0..cfg.workers.max(1) {
        let mut proxies = Vec::new();
        for addr in &addrs {
            proxies.push(
                Proxy::start(*addr)
                    .await
                    .map_err(|e| format!("proxy: {e}"))?,
            );
        }
        let proxied: Vec<_> = proxies.iter().map(Proxy::addr).collect();
        let clock = clocks.path().join(format!("worker-{slot}.offset"));
        std::fs::write(&clock, "+0").map_err(|e| format!("{}: {e}", clock.display()))?;
        fleet.slots.push(Slot {
            url: target.with_addrs(&proxied),
            proxies,
            clock,
            running: None,
        });
    }

    let t0 = now_ns();
    eprintln!(
        "torture: {backend} at {} · {} workers × {} tasks · keys {} · ttl {:?} · faults {} · seed {}",
        target.redacted(),
        cfg.workers,
        cfg.tasks,
        keys.join(","),
        cfg.ttl,
        selected
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(","),
        cfg.seed
    );
    for slot in 0..fleet.slots.len() {
        fleet.spawn(slot)?;
    }

    let mut violations = Vec::new();
    let mut faults = Vec::new();
    let outcome = {
        let mut injector = Injector {
            cfg: &cfg,
            timings,
            keys: &keys,
            fleet: &mut fleet,
            ctl: ctl.as_ref(),
            netns: netns.as_ref(),
            units: &units,
            recorder: &recorder,
            rng: StdRng::seed_from_u64(cfg.seed),
            t0,
        };
        tokio::select! {
            r = injector.run(&selected, &mut faults) => r,
            _ = interrupted() => Err("interrupted".to_owned()),
        }
    };
    if let Some(ctl) = &ctl {
        ctl.restore();
    }
    if let Some(netns) = &netns {
        netns.restore();
    }
    if let Err(e) = outcome {
        fleet.kill_all();
        return Err(e);
    }

    // Calm down: every worker finishes its hold, releases, and exits.
    let calm_end = now_ns();
    let stop_limit = timings.wait + Duration::from_secs(30);
    violations.extend(fleet.stop_all(stop_limit).await);
    let run_end = now_ns();
    violations.extend(
        fleet
            .problems
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..),
    );
    let mut final_check = final_check(&cfg.url, &keys, &timings, cfg.ttl, &mut violations).await;
    check_residue(&cfg.url, &stem, &mut final_check, &mut violations).await;

    for fault in &mut faults {
        fault.first_acquire = recorder
            .first_acquired_since(&keys, fault.end)
            .into_iter()
            .flatten()
            .min();
        if let Some(victim) = &fault.victim {
            fault.takeovers = victim
                .held
                .iter()
                .map(|k| {
                    (
                        k.clone(),
                        recorder.taken_over(k, fault.start, victim.process),
                    )
                })
                .collect();
        }
    }
    let state = recorder.state();
    let holds: Vec<_> = state.holds.values().cloned().collect();
    let input = check::Input {
        holds: &holds,
        log: &state.log,
        faults: &faults,
        caps,
        grace: ns(timings.grace),
        run_end,
        t0,
    };
    let analysis = check::analyse(&input);
    // Sets must keep being granted until the workers are told to stop: a stall longer than
    // a fault and the recovery after it is a deadlock (or a wait that never ends).
    let sets = cfg.key_sets.map(|_| {
        let sweep = key_sets::sweep(&holds, t0, calm_end);
        let longest_fault = faults.iter().map(|f| f.end - f.start).max().unwrap_or(0);
        let limit = ns(timings.recovery_limit) + longest_fault;
        violations.extend(key_sets::progress(&input, &sweep, limit));
        sweep
    });
    if analysis.holds == 0 {
        violations.push(Violation::new("no holds", "not a single lock was acquired"));
    }
    violations.extend(analysis.violations.iter().cloned());
    Ok(Report::build(crate::report::Inputs {
        backend,
        url: target.redacted(),
        cfg: &cfg,
        caps: &caps,
        timings: &timings,
        state: &state,
        holds: &holds,
        faults: &faults,
        analysis: &analysis,
        sets: sets.as_ref(),
        not_injected: &not_injected,
        final_check,
        violations,
        t0,
        run_end,
    }))
}

async fn interrupted() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
}

/// A folder for the run's files (the workers' clock offsets), removed when dropped.
fn tempfile_dir(run_id: &str) -> Result<RunDir, String> {
    let path = std::env::temp_dir().join(format!("dlock-torture-{run_id}"));
    std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(RunDir(path))
}

/// A folder removed with everything in it when dropped.
struct RunDir(PathBuf);

impl RunDir {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// This binary, for the workers: on Linux `/proc/self/exe`, which a forked child executes
/// as the running binary even after a rebuild replaced the file at its path (the path that
/// `current_exe` reads then ends in " (deleted)", and spawning from it fails).
fn own_executable() -> Result<std::path::PathBuf, String> {
    let proc_self = std::path::Path::new("/proc/self/exe");
    if proc_self.exists() {
        return Ok(proc_self.to_path_buf());
    }
    std::env::current_exe().map_err(|e| format!("own executable: {e}"))
}
