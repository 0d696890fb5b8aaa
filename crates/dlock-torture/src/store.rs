//! The coordinator's side of the workers' connections: the fenced store and the record of
//! every hold, built from the workers' messages.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

use crate::clock::now_ns;
use crate::wire::{Msg, WriteReply};

/// One hold as the coordinator knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldRec {
    pub(crate) id: u64,
    /// The worker process (a new number for every spawn).
    pub(crate) process: u32,
    pub(crate) key: String,
    pub(crate) token: u64,
    /// A shared (read) hold, which may overlap other shared holds.
    pub(crate) shared: bool,
    /// One of this many permits: it may overlap fewer than that many other permit holds.
    pub(crate) permits: Option<u32>,
    /// Taken as one key of a set (`acquire_all`, `--key-sets`): the set's id.
    pub(crate) set: Option<u64>,
    /// When `acquire` (or `acquire_all`) was called.
    pub(crate) requested: u64,
    /// When `acquire` (or `acquire_all`) returned.
    pub(crate) start: u64,
    /// When the holder stopped relying on the lease: it called `release`, or its process
    /// died (then: when the coordinator reaped it).
    pub(crate) end: Option<u64>,
    /// When the holder learnt the lease was lost.
    pub(crate) lost_at: Option<u64>,
    pub(crate) lost_reason: Option<String>,
    /// What `release` answered; `killed` or `exited` when the process died holding it.
    pub(crate) outcome: Option<String>,
}

impl HoldRec {
    /// Whether the hold may overlap others of its kind (a reader, a permit).
    pub(crate) fn shares(&self) -> bool {
        self.shared || self.permits.is_some()
    }

    /// The hold's mode, as the conformance checker counts it.
    pub(crate) fn mode(&self) -> dlock_core::Mode {
        match (self.permits, self.shared) {
            (Some(n), _) => dlock_core::Mode::Permits(n),
            (None, true) => dlock_core::Mode::Shared,
            (None, false) => dlock_core::Mode::Exclusive,
        }
    }

    /// The last instant the holder could rightly believe it held the key.
    pub(crate) fn trusted_until(&self, fallback_end: u64) -> u64 {
        let end = self.end.unwrap_or(fallback_end);
        self.lost_at.map_or(end, |lost| lost.min(end))
    }
}

/// One write the fenced store decided on, in the order it decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriteRec {
    pub(crate) seq: u64,
    pub(crate) key: String,
    pub(crate) hold: u64,
    pub(crate) token: u64,
    pub(crate) at: u64,
    pub(crate) accepted: bool,
}

#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) holds: BTreeMap<u64, HoldRec>,
    /// Per key, the highest token accepted so far.
    high: HashMap<String, u64>,
    pub(crate) log: Vec<WriteRec>,
    pub(crate) acquire_errors: BTreeMap<String, u64>,
    pub(crate) release_outcomes: BTreeMap<String, u64>,
    /// Re-entries into reentrant holds that kept the hold's token.
    pub(crate) reentries: u64,
    /// When each dead worker process was reaped, and how it ended.
    exits: HashMap<u32, (u64, &'static str)>,
    /// The first few acquire error messages of each kind, for the report.
    pub(crate) error_samples: BTreeMap<String, String>,
}

impl State {
    /// The fenced store: accept a write unless a greater token was accepted for the key.
    fn write(&mut self, key: String, hold: u64, token: u64) -> bool {
        let high = self.high.entry(key.clone()).or_insert(0);
        let accepted = token >= *high;
        if accepted {
            *high = token;
        }
        let seq = self.log.len() as u64;
        self.log.push(WriteRec {
            seq,
            key,
            hold,
            token,
            at: now_ns(),
            accepted,
        });
        accepted
    }

    fn apply(&mut self, process: u32, msg: Msg) -> Option<WriteReply> {
        match msg {
            Msg::Acquired {
                hold,
                key,
                token,
                requested,
                at,
                shared,
                permits,
                set,
            } => {
                // A message that was on its way when the process died ends at its death.
                let exit = self.exits.get(&process).copied();
                self.holds.insert(
                    hold,
                    HoldRec {
                        id: hold,
                        process,
                        key,
                        token,
                        shared,
                        permits,
                        set,
                        requested,
                        start: at,
                        end: exit.map(|(t, _)| t),
                        lost_at: None,
                        lost_reason: None,
                        outcome: exit.map(|(_, how)| how.to_owned()),
                    },
                );
            }
            Msg::Reentered { .. } => self.reentries += 1,
            Msg::Write { hold, key, token } => {
                return Some(WriteReply {
                    accepted: self.write(key, hold, token),
                });
            }
            Msg::Lost { hold, at, reason } => {
                if let Some(h) = self.holds.get_mut(&hold) {
                    h.lost_at = Some(h.lost_at.map_or(at, |t| t.min(at)));
                    h.lost_reason.get_or_insert(reason);
                }
            }
            Msg::Releasing { hold, at } => {
                if let Some(h) = self.holds.get_mut(&hold) {
                    h.end = Some(h.end.map_or(at, |t| t.min(at)));
                }
            }
            Msg::Released { hold, outcome } => {
                *self.release_outcomes.entry(outcome.clone()).or_default() += 1;
                if let Some(h) = self.holds.get_mut(&hold) {
                    h.outcome = Some(outcome);
                }
            }
            Msg::AcquireFailed { kind, error } => {
                *self.acquire_errors.entry(kind.clone()).or_default() += 1;
                self.error_samples.entry(kind).or_insert(error);
            }
        }
        None
    }
}

/// The record of a run, shared by the connection tasks and the coordinator.
#[derive(Debug, Default)]
pub(crate) struct Recorder {
    state: Mutex<State>,
    /// Notified on every acquisition (the coordinator waits for recovery on it).
    pub(crate) acquired: Notify,
}

impl Recorder {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Apply one message from worker process `process`.
    pub(crate) fn apply(&self, process: u32, msg: Msg) -> Option<WriteReply> {
        let acquired = matches!(msg, Msg::Acquired { .. });
        let reply = self.state().apply(process, msg);
        if acquired {
            self.acquired.notify_waiters();
        }
        reply
    }

    /// Worker process `process` died (was reaped) at `at`: its open holds end there.
    pub(crate) fn process_ended(&self, process: u32, at: u64, how: &'static str) {
        let mut state = self.state();
        state.exits.insert(process, (at, how));
        for hold in state.holds.values_mut() {
            if hold.process == process && hold.end.is_none() {
                hold.end = Some(at);
                hold.outcome = Some(how.to_owned());
            }
        }
    }

    /// Keys held right now by worker process `process`.
    pub(crate) fn held_by(&self, process: u32) -> Vec<String> {
        let state = self.state();
        let mut keys: Vec<String> = state
            .holds
            .values()
            .filter(|h| h.process == process && h.end.is_none() && h.lost_at.is_none())
            .map(|h| h.key.clone())
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Per key, the first acquisition at or after `since` (its `start`), if any.
    pub(crate) fn first_acquired_since(&self, keys: &[String], since: u64) -> Vec<Option<u64>> {
        let state = self.state();
        keys.iter()
            .map(|key| {
                state
                    .holds
                    .values()
                    .filter(|h| &h.key == key && h.start >= since)
                    .map(|h| h.start)
                    .min()
            })
            .collect()
    }

    /// The first acquisition of `key` at or after `since` by a process other than
    /// `not_by`.
    pub(crate) fn taken_over(&self, key: &str, since: u64, not_by: u32) -> Option<u64> {
        self.state()
            .holds
            .values()
            .filter(|h| h.key == key && h.start >= since && h.process != not_by)
            .map(|h| h.start)
            .min()
    }
}

/// Listen on a loopback port for worker connections; each connection's first line is the
/// worker process number.
pub(crate) async fn serve(recorder: Arc<Recorder>) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(connection(stream, recorder.clone()));
        }
    });
    Ok(addr)
}

async fn connection(stream: TcpStream, recorder: Arc<Recorder>) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    let Ok(Some(first)) = lines.next_line().await else {
        return;
    };
    let Ok(process) = first.trim().parse::<u32>() else {
        tracing::error!(line = %first, "a worker connection must start with its process number");
        return;
    };
    while let Ok(Some(line)) = lines.next_line().await {
        let msg: Msg = match serde_json::from_str(&line) {
            Ok(msg) => msg,
            Err(e) => {
                tracing::error!(%line, error = %e, "bad message from a worker");
                return;
            }
        };
        if let Some(reply) = recorder.apply(process, msg) {
            let mut out = serde_json::to_vec(&reply).expect("a reply serializes");
            out.push(b'\n');
            if write.write_all(&out).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_rejects_lower_tokens_only() {
        let mut s = State::default();
        assert!(s.write("k".into(), 1, 5));
        assert!(
            s.write("k".into(), 1, 5),
            "the same token again is accepted"
        );
        assert!(!s.write("k".into(), 2, 4), "a lower token is rejected");
        assert!(s.write("k".into(), 3, 6));
        assert!(s.write("other".into(), 4, 1), "keys are fenced separately");
        let accepted: Vec<bool> = s.log.iter().map(|w| w.accepted).collect();
        assert_eq!(accepted, [true, true, false, true, true]);
        assert_eq!(
            s.log.iter().map(|w| w.seq).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
    }

    #[test]
    fn a_dead_process_ends_its_holds_and_late_messages_keep_the_earliest_end() {
        let r = Recorder::default();
        let acquired = |hold, at| Msg::Acquired {
            hold,
            key: "k".into(),
            token: hold,
            requested: at - 1,
            at,
            shared: false,
            permits: None,
            set: None,
        };
        r.apply(1, acquired(10, 100));
        assert_eq!(r.held_by(1), ["k"]);
        r.process_ended(1, 500, "killed");
        assert!(r.held_by(1).is_empty());
        // Sent before the death, read after it.
        r.apply(1, Msg::Releasing { hold: 10, at: 400 });
        r.apply(1, acquired(11, 450));
        let state = r.state();
        assert_eq!(state.holds[&10].end, Some(400));
        assert_eq!(state.holds[&11].end, Some(500));
        assert_eq!(state.holds[&11].outcome.as_deref(), Some("killed"));
    }
}
