//! The coordinator: spawns the workers, serves the fenced store, injects the faults, waits
//! for recovery after each, and checks everything at the end.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock::{DistributedLock, LockOptions, Wait};
use dlock_conformance::Proxy;
use dlock_core::{Capabilities, Expiry};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

use crate::check::{self, Violation};
use crate::clock::{ms, now_ns, ns};
use crate::faults::{FaultKind, FaultRec, FaultSet, Victim};
use crate::report::{FinalCheck, Report};
use crate::servers::{self, SHARED_UNITS, ServerCtl, Target, UnitLocks};
use crate::store::{self, Recorder};

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
    let units = units_of(&cfg, script.as_deref(), &addrs);
    let hint = if units.is_empty() {
        "start it".to_owned()
    } else {
        format!("scripts/backends up {}", units.join(" "))
    };

    let plan = FaultPlan::new(&cfg.faults, script.is_some(), &addrs, &units)?;
    let (selected, not_injected) = (plan.selected, plan.not_injected);
    // Hold the units for the whole run (even with no server fault selected: another run's
    // restart would break this one's history).
    let _locks = if plan.server_control {
        Some(UnitLocks::take(&units, Duration::from_secs(30 * 60)).await?)
    } else {
        None
    };
    let ctl = script.filter(|_| plan.server_control).map(ServerCtl::new);
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
        exe: std::env::current_exe().map_err(|e| format!("own executable: {e}"))?,
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
        .collect(),
    };
    for _ in 0..cfg.workers.max(1) {
        let mut proxies = Vec::new();
        for addr in &addrs {
            proxies.push(
                Proxy::start(*addr)
                    .await
                    .map_err(|e| format!("proxy: {e}"))?,
            );
        }
        let proxied: Vec<_> = proxies.iter().map(Proxy::addr).collect();
        fleet.slots.push(Slot {
            url: target.with_addrs(&proxied),
            proxies,
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
    if let Err(e) = outcome {
        fleet.kill_all();
        return Err(e);
    }

    // Calm down: every worker finishes its hold, releases, and exits.
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
    match crate::residue::residue(&cfg.url, &stem).await {
        Ok(left) => {
            final_check.residue_checked = true;
            for item in &left {
                violations.push(Violation::new(
                    "residue",
                    format!("left on the server: {item}"),
                ));
            }
            final_check.residue = left;
        }
        Err(e) => violations.push(Violation::new(
            "residue check",
            format!("could not read the servers' lock state: {e}"),
        )),
    }

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
    let analysis = check::analyse(&check::Input {
        holds: &holds,
        log: &state.log,
        faults: &faults,
        caps,
        grace: ns(timings.grace),
        run_end,
        t0,
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
        not_injected: &not_injected,
        final_check,
        violations,
        t0,
        run_end,
    }))
}

/// The `scripts/backends` units behind the URL's servers: `--units`, or each address's port
/// looked up in the script's port table. Empty when not every server is a unit.
fn units_of(
    cfg: &Config,
    script: Option<&std::path::Path>,
    addrs: &[std::net::SocketAddr],
) -> Vec<String> {
    if !cfg.units.is_empty() {
        return cfg.units.clone();
    }
    let table = script
        .and_then(|s| std::fs::read_to_string(s).ok())
        .map(|s| servers::port_table(&s))
        .unwrap_or_default();
    let units: Vec<String> = addrs
        .iter()
        .filter_map(|a| {
            table
                .iter()
                .find(|(_, p)| *p == a.port())
                .map(|(u, _)| u.clone())
        })
        .collect();
    if units.len() == addrs.len() {
        units
    } else {
        Vec::new()
    }
}

/// Which faults a run injects, and why the others are not.
struct FaultPlan {
    selected: Vec<FaultKind>,
    not_injected: Vec<(FaultKind, String)>,
    /// Whether the run may stop and start the servers.
    server_control: bool,
}

impl FaultPlan {
    fn new(
        asked: &FaultSet,
        have_script: bool,
        addrs: &[std::net::SocketAddr],
        units: &[String],
    ) -> Result<Self, String> {
        let server_control = if addrs.is_empty() {
            Err("no server".to_owned())
        } else if !have_script {
            Err("scripts/backends not found (--backends-script)".to_owned())
        } else if units.is_empty() {
            Err("the servers are not scripts/backends units (--units)".to_owned())
        } else if let Some(u) = units.iter().find(|u| SHARED_UNITS.contains(&u.as_str())) {
            Err(format!(
                "{u} is a shared test server that other tests use; it is never stopped"
            ))
        } else {
            Ok(())
        };
        let mut available = vec![FaultKind::Kill, FaultKind::Pause];
        let mut not_injected = Vec::new();
        if addrs.is_empty() {
            not_injected.push((FaultKind::Partition, "no server".to_owned()));
        } else {
            available.push(FaultKind::Partition);
        }
        match &server_control {
            Ok(()) => available.push(FaultKind::Restart),
            Err(why) => not_injected.push((FaultKind::Restart, why.clone())),
        }
        match (&server_control, units.len()) {
            (Ok(()), n) if n >= 3 => available.push(FaultKind::Member),
            (Ok(()), _) => not_injected.push((
                FaultKind::Member,
                "one server: no minority of members to stop".to_owned(),
            )),
            (Err(why), _) => not_injected.push((FaultKind::Member, why.clone())),
        }
        let selected = match asked {
            FaultSet::All => available,
            FaultSet::Only(kinds) => {
                if let Some(kind) = kinds.iter().find(|k| !available.contains(k)) {
                    let why = not_injected
                        .iter()
                        .find(|(k, _)| k == kind)
                        .map_or("", |(_, w)| w.as_str());
                    return Err(format!("cannot inject {kind} here: {why}"));
                }
                not_injected.clear();
                kinds.clone()
            }
        };
        Ok(Self {
            selected,
            not_injected,
            server_control: server_control.is_ok(),
        })
    }
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

/// One worker slot: its proxies (one per server) and its current process.
struct Slot {
    proxies: Vec<Proxy>,
    url: String,
    running: Option<Running>,
}

struct Running {
    process: u32,
    pid: Pid,
    /// [`RUNNING`], or why the coordinator signalled it ([`KILLED`], [`STOPPING`]).
    expected: Arc<AtomicU8>,
    /// Resolves to the instant the process was reaped.
    reaped: JoinHandle<u64>,
}

const RUNNING: u8 = 0;
const KILLED: u8 = 1;
const STOPPING: u8 = 2;

struct Fleet {
    slots: Vec<Slot>,
    next_process: u32,
    recorder: Arc<Recorder>,
    problems: Arc<Mutex<Vec<Violation>>>,
    exe: PathBuf,
    common: Vec<String>,
}

impl Fleet {
    fn spawn(&mut self, slot: usize) -> Result<(), String> {
        let process = self.next_process;
        self.next_process += 1;
        let mut child = tokio::process::Command::new(&self.exe)
            .arg("worker")
            .arg(format!("--url={}", self.slots[slot].url))
            .arg(format!("--process={process}"))
            .args(&self.common)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("spawn a worker: {e}"))?;
        let pid = Pid::from_raw(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .ok_or("a spawned worker has no pid")?,
        );
        let expected = Arc::new(AtomicU8::new(RUNNING));
        let reaped = tokio::spawn({
            let expected = expected.clone();
            let recorder = self.recorder.clone();
            let problems = self.problems.clone();
            async move {
                let status = child.wait().await;
                let at = now_ns();
                let why = expected.load(Ordering::SeqCst);
                let how = match why {
                    KILLED => "killed",
                    STOPPING => "stopped",
                    _ => "exited",
                };
                recorder.process_ended(process, at, how);
                let clean = matches!(&status, Ok(s) if s.success());
                let problem = match why {
                    RUNNING => Some(format!(
                        "worker process {process} ended by itself: {status:?}"
                    )),
                    STOPPING if !clean => Some(format!(
                        "worker process {process} failed while stopping: {status:?}"
                    )),
                    _ => None,
                };
                if let Some(problem) = problem {
                    problems
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Violation::new("worker died", problem));
                }
                at
            }
        });
        self.slots[slot].running = Some(Running {
            process,
            pid,
            expected,
            reaped,
        });
        Ok(())
    }

    fn running(&self, slot: usize) -> Option<&Running> {
        self.slots[slot].running.as_ref()
    }

    fn signal(&self, slot: usize, sig: Signal) {
        if let Some(r) = self.running(slot) {
            let _ = kill(r.pid, sig);
        }
    }

    /// SIGKILL the slot's process; when it was reaped.
    async fn kill(&mut self, slot: usize) -> Result<u64, String> {
        let running = self.slots[slot].running.take().ok_or("no worker to kill")?;
        running.expected.store(KILLED, Ordering::SeqCst);
        let _ = kill(running.pid, Signal::SIGKILL);
        running
            .reaped
            .await
            .map_err(|e| format!("reaping worker {}: {e}", running.process))
    }

    /// SIGTERM every worker and wait for each to finish its hold and exit.
    async fn stop_all(&mut self, limit: Duration) -> Vec<Violation> {
        let mut problems = Vec::new();
        for slot in &self.slots {
            if let Some(r) = &slot.running {
                r.expected.store(STOPPING, Ordering::SeqCst);
                let _ = kill(r.pid, Signal::SIGCONT);
                let _ = kill(r.pid, Signal::SIGTERM);
            }
        }
        for slot in &mut self.slots {
            let Some(r) = slot.running.take() else {
                continue;
            };
            let mut reaped = r.reaped;
            if tokio::time::timeout(limit, &mut reaped).await.is_err() {
                problems.push(Violation::new(
                    "worker hung",
                    format!(
                        "worker process {} did not stop within {limit:?} of SIGTERM",
                        r.process
                    ),
                ));
                let _ = kill(r.pid, Signal::SIGKILL);
                let _ = reaped.await;
            }
        }
        problems
    }

    fn kill_all(&mut self) {
        for slot in &mut self.slots {
            if let Some(r) = slot.running.take() {
                r.expected.store(KILLED, Ordering::SeqCst);
                let _ = kill(r.pid, Signal::SIGKILL);
            }
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.kill_all();
    }
}

struct Injector<'a> {
    cfg: &'a Config,
    timings: Timings,
    keys: &'a [String],
    fleet: &'a mut Fleet,
    ctl: Option<&'a ServerCtl>,
    units: &'a [String],
    recorder: &'a Recorder,
    rng: StdRng,
    t0: u64,
}

impl Injector<'_> {
    fn rel(&self, t: u64) -> f64 {
        ms(t.saturating_sub(self.t0)) / 1000.0
    }

    /// Warm up, inject faults one at a time until the duration is over and every kind was
    /// injected once (waiting for recovery after each), then let the rest of the duration
    /// run calm.
    async fn run(&mut self, kinds: &[FaultKind], faults: &mut Vec<FaultRec>) -> Result<(), String> {
        let end = self.t0 + ns(self.cfg.duration);
        let warm = self
            .wait_all_acquired(self.t0, self.t0 + ns(self.timings.recovery_limit))
            .await;
        if warm.is_none() {
            return Err(format!(
                "the workers did not acquire every key within {:?} of starting: is the server up?",
                self.timings.recovery_limit
            ));
        }
        let most = self.cfg.max_faults.unwrap_or_else(|| {
            kinds
                .len()
                .max(usize::try_from(self.cfg.duration.as_secs() / 6).unwrap_or(usize::MAX))
        });
        let mut order: Vec<FaultKind> = Vec::new();
        while faults.len() < most && !kinds.is_empty() {
            let gap = Duration::from_millis(self.rng.random_range(1000..3000));
            let all_seen = kinds.iter().all(|k| faults.iter().any(|f| f.kind == *k));
            if all_seen && now_ns() + ns(gap) >= end {
                break;
            }
            tokio::time::sleep(gap).await;
            if order.is_empty() {
                order = kinds.to_vec();
                order.shuffle(&mut self.rng);
            }
            let kind = order.pop().expect("refilled above");
            let mut fault = self.inject(kind).await?;
            fault.recovered = self
                .wait_all_acquired(fault.end, fault.end + ns(self.timings.recovery_limit))
                .await;
            eprintln!(
                "torture: {:>7.2}s {:<9} {:<28} lasted {:>6.0} ms, every key acquired again {}",
                self.rel(fault.start),
                kind.name(),
                describe_target(&fault),
                ms(fault.end - fault.start),
                fault.recovered.map_or_else(
                    || "NEVER".to_owned(),
                    |t| format!("{:.0} ms later", ms(t - fault.end))
                )
            );
            faults.push(fault);
        }
        let left = end.saturating_sub(now_ns());
        tokio::time::sleep(Duration::from_nanos(left)).await;
        Ok(())
    }

    /// Wait until every key was acquired at or after `since`; when the last one was.
    async fn wait_all_acquired(&self, since: u64, until: u64) -> Option<u64> {
        loop {
            let notified = self.recorder.acquired.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let firsts = self.recorder.first_acquired_since(self.keys, since);
            if firsts.iter().all(Option::is_some) {
                return firsts.into_iter().flatten().max();
            }
            let now = now_ns();
            if now >= until {
                return None;
            }
            let _ = tokio::time::timeout(Duration::from_nanos(until - now), notified).await;
        }
    }

    /// A worker slot to hit: one whose process holds a key right now, if any.
    fn pick_victim(&mut self) -> Result<Victim, String> {
        let slots: Vec<(usize, u32)> = (0..self.fleet.slots.len())
            .filter_map(|s| self.fleet.running(s).map(|r| (s, r.process)))
            .collect();
        let holding: Vec<(usize, u32)> = slots
            .iter()
            .copied()
            .filter(|(_, p)| !self.recorder.held_by(*p).is_empty())
            .collect();
        let &(slot, process) = holding
            .choose(&mut self.rng)
            .or_else(|| slots.choose(&mut self.rng))
            .ok_or("no running worker")?;
        Ok(Victim {
            slot,
            process,
            held: self.recorder.held_by(process),
        })
    }

    async fn inject(&mut self, kind: FaultKind) -> Result<FaultRec, String> {
        let mut fault = FaultRec {
            kind,
            victim: None,
            units: Vec::new(),
            start: 0,
            end: 0,
            recovered: None,
            first_acquire: None,
            takeovers: Vec::new(),
        };
        match kind {
            FaultKind::Kill => {
                let victim = self.pick_victim()?;
                fault.start = now_ns();
                fault.end = self.fleet.kill(victim.slot).await?;
                self.fleet.spawn(victim.slot)?;
                fault.victim = Some(victim);
            }
            FaultKind::Pause => {
                let victim = self.pick_victim()?;
                fault.start = now_ns();
                self.fleet.signal(victim.slot, Signal::SIGSTOP);
                tokio::time::sleep(self.timings.fault_hold).await;
                self.fleet.signal(victim.slot, Signal::SIGCONT);
                fault.end = now_ns();
                fault.victim = Some(victim);
            }
            FaultKind::Partition => {
                let victim = self.pick_victim()?;
                let proxies = &self.fleet.slots[victim.slot].proxies;
                fault.start = now_ns();
                proxies.iter().for_each(Proxy::cut);
                tokio::time::sleep(self.timings.fault_hold).await;
                proxies.iter().for_each(Proxy::heal);
                fault.end = now_ns();
                fault.victim = Some(victim);
            }
            FaultKind::Restart => {
                let ctl = self.ctl.ok_or("no server control")?;
                fault.units = self.units.to_vec();
                fault.start = now_ns();
                ctl.stop(&fault.units).await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
                ctl.start(&fault.units).await?;
                fault.end = now_ns();
            }
            FaultKind::Member => {
                let ctl = self.ctl.ok_or("no server control")?;
                let minority = (self.units.len() - 1) / 2;
                fault.units = self
                    .units
                    .choose_multiple(&mut self.rng, minority)
                    .cloned()
                    .collect();
                fault.units.sort();
                fault.start = now_ns();
                ctl.stop(&fault.units).await?;
                tokio::time::sleep(self.timings.member_down).await;
                ctl.start(&fault.units).await?;
                fault.end = now_ns();
            }
        }
        Ok(fault)
    }
}

fn describe_target(f: &FaultRec) -> String {
    match &f.victim {
        Some(v) if v.held.is_empty() => format!("worker {} (holding nothing)", v.process),
        Some(v) => format!("worker {} holding {}", v.process, v.held.len()),
        None => f.units.join(","),
    }
}

/// After the run: every key is free for a fresh client at once.
async fn final_check(
    url: &str,
    keys: &[String],
    timings: &Timings,
    ttl: Duration,
    violations: &mut Vec<Violation>,
) -> FinalCheck {
    let mut out = FinalCheck {
        keys: keys.len(),
        ..FinalCheck::default()
    };
    let client: std::sync::Arc<dyn DistributedLock> = match dlock::connect(url).await {
        Ok(c) => c,
        Err(e) => {
            violations.push(Violation::new(
                "final check",
                format!("a fresh client cannot connect: {e}"),
            ));
            return out;
        }
    };
    let opts = LockOptions::new().ttl(ttl);
    for key in keys {
        let started = now_ns();
        match client.try_acquire(key, &opts).await {
            Ok(Some(lease)) => {
                out.free_at_once += 1;
                if let Err(e) = lease.release().await {
                    violations.push(Violation::new(
                        "final check",
                        format!("{key}: release: {e}"),
                    ));
                }
            }
            Ok(None) => {
                let wait = opts.wait(Wait::For(2 * timings.silence + Duration::from_secs(2)));
                let freed = match client.acquire(key, &wait).await {
                    Ok(lease) => {
                        let _ = lease.release().await;
                        format!("free {:.0} ms later", ms(now_ns() - started))
                    }
                    Err(e) => format!("still not free: {e}"),
                };
                violations.push(Violation::new(
                    "left held",
                    format!("{key} was held after every worker had released and exited ({freed})"),
                ));
            }
            Err(e) => violations.push(Violation::new(
                "final check",
                format!("{key}: try_acquire: {e}"),
            )),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addrs(n: u16) -> Vec<std::net::SocketAddr> {
        (0..n).map(|i| ([127, 0, 0, 1], 7001 + i).into()).collect()
    }

    fn units(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_topology_decides_which_faults_are_possible() {
        let one =
            FaultPlan::new(&FaultSet::All, true, &addrs(1), &units(&["torture-redis"])).unwrap();
        assert_eq!(
            one.selected,
            [
                FaultKind::Kill,
                FaultKind::Pause,
                FaultKind::Partition,
                FaultKind::Restart
            ]
        );
        assert_eq!(one.not_injected[0].0, FaultKind::Member);
        assert!(one.server_control);

        let five = units(&[
            "redlock-1",
            "redlock-2",
            "redlock-3",
            "redlock-4",
            "redlock-5",
        ]);
        let many = FaultPlan::new(&FaultSet::All, true, &addrs(5), &five).unwrap();
        assert_eq!(many.selected.len(), 5);
        assert!(many.not_injected.is_empty());

        let shared = FaultPlan::new(&FaultSet::All, true, &addrs(1), &units(&["redis"])).unwrap();
        assert!(
            !shared.server_control,
            "the shared servers are never stopped"
        );
        assert!(!shared.selected.contains(&FaultKind::Restart));

        let memory = FaultPlan::new(&FaultSet::All, true, &[], &[]).unwrap();
        assert_eq!(memory.selected, [FaultKind::Kill, FaultKind::Pause]);

        let unknown = FaultPlan::new(&FaultSet::All, true, &addrs(1), &[]).unwrap();
        assert!(!unknown.server_control);

        let asked = "member".parse().unwrap();
        let err = FaultPlan::new(&asked, true, &addrs(1), &units(&["torture-redis"]))
            .err()
            .unwrap();
        assert!(err.contains("no minority"), "{err}");
    }
}
