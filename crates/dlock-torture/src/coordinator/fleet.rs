//! The worker processes: each slot's proxies and current process, spawned, signalled,
//! killed, reaped and stopped.

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_conformance::Proxy;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::task::JoinHandle;

use crate::check::Violation;
use crate::clock::now_ns;
use crate::store::Recorder;

/// One worker slot: its proxies (one per server) and its current process.
pub(super) struct Slot {
    pub(super) proxies: Vec<Proxy>,
    pub(super) url: String,
    /// The file of its workers' wall-clock offset (read by the clock preload, when the
    /// fleet runs under it).
    pub(super) clock: PathBuf,
    pub(super) running: Option<Running>,
}

/// A slot's live worker process.
pub(super) struct Running {
    pub(super) process: u32,
    pid: Pid,
    /// When the coordinator sent it SIGKILL (0: never): its holds end then, not when it is
    /// reaped (a server that frees a dead client's lock at once, as MySQL does when the
    /// connection closes, may grant the key again before the reap).
    killed_at: Arc<AtomicU64>,
    /// [`RUNNING`], or why the coordinator signalled it ([`KILLED`], [`STOPPING`]).
    expected: Arc<AtomicU8>,
    /// Resolves to the instant the process was reaped.
    reaped: JoinHandle<u64>,
}

const RUNNING: u8 = 0;
const KILLED: u8 = 1;
const STOPPING: u8 = 2;

/// The worker processes: one slot each, respawned after a kill.
pub(super) struct Fleet {
    pub(super) slots: Vec<Slot>,
    pub(super) next_process: u32,
    pub(super) recorder: Arc<Recorder>,
    /// Workers that ended unexpectedly, found when they were reaped.
    pub(super) problems: Arc<Mutex<Vec<Violation>>>,
    pub(super) exe: PathBuf,
    /// The clock preload (`scripts/netns shim`) the workers run under, if any.
    pub(super) shim: Option<PathBuf>,
    /// The arguments every worker gets.
    pub(super) common: Vec<String>,
}

impl Fleet {
    pub(super) fn spawn(&mut self, slot: usize) -> Result<(), String> {
        let process = self.next_process;
        self.next_process += 1;
        let mut command = tokio::process::Command::new(&self.exe);
        command
            .arg("worker")
            .arg(format!("--url={}", self.slots[slot].url))
            .arg(format!("--process={process}"))
            .args(&self.common)
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        if let Some(shim) = &self.shim {
            command
                .env("LD_PRELOAD", shim)
                .env("DLK_TIMESHIFT_FILE", &self.slots[slot].clock);
        }
        let mut child = command
            .spawn()
            .map_err(|e| format!("spawn a worker: {e}"))?;
        let pid = Pid::from_raw(
            child
                .id()
                .and_then(|id| i32::try_from(id).ok())
                .ok_or("a spawned worker has no pid")?,
        );
        let expected = Arc::new(AtomicU8::new(RUNNING));
        let killed_at = Arc::new(AtomicU64::new(0));
        let reaped = tokio::spawn({
            let expected = expected.clone();
            let killed_at = killed_at.clone();
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
                let ended = match (why, killed_at.load(Ordering::SeqCst)) {
                    (KILLED, sent) if sent > 0 => sent.min(at),
                    _ => at,
                };
                recorder.process_ended(process, ended, how);
                // A worker stops cleanly on SIGTERM, or dies of it when the signal came
                // before its handler was installed, first thing at start-up: before any
                // client connected, so it held nothing (a slow start on a loaded machine).
                let clean = matches!(&status, Ok(s) if s.success() || s.signal() == Some(15));
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
            killed_at,
            expected,
            reaped,
        });
        Ok(())
    }

    pub(super) fn running(&self, slot: usize) -> Option<&Running> {
        self.slots[slot].running.as_ref()
    }

    pub(super) fn signal(&self, slot: usize, sig: Signal) {
        if let Some(r) = self.running(slot) {
            let _ = kill(r.pid, sig);
        }
    }

    /// SIGKILL the slot's process; when it was reaped.
    pub(super) async fn kill(&mut self, slot: usize) -> Result<u64, String> {
        let running = self.slots[slot].running.take().ok_or("no worker to kill")?;
        running.expected.store(KILLED, Ordering::SeqCst);
        running.killed_at.store(now_ns(), Ordering::SeqCst);
        let _ = kill(running.pid, Signal::SIGKILL);
        running
            .reaped
            .await
            .map_err(|e| format!("reaping worker {}: {e}", running.process))
    }

    /// SIGTERM every worker and wait for each to finish its hold and exit.
    pub(super) async fn stop_all(&mut self, limit: Duration) -> Vec<Violation> {
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

    pub(super) fn kill_all(&mut self) {
        for slot in &mut self.slots {
            if let Some(r) = slot.running.take() {
                r.expected.store(KILLED, Ordering::SeqCst);
                r.killed_at.store(now_ns(), Ordering::SeqCst);
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
