//! The fault injection loop: warm up, one fault at a time on a worker or the servers, and
//! the wait for every key to be acquired again after each.

use std::time::Duration;

use dlock_conformance::{Delay, Proxy};
use nix::sys::signal::Signal;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::{IndexedRandom, SliceRandom};

use super::fleet::Fleet;
use super::{Config, Timings};
use crate::clock::{ms, now_ns, ns};
use crate::faults::{FaultKind, FaultRec, Victim};
use crate::netns::{self, Netns};
use crate::servers::ServerCtl;
use crate::store::Recorder;

/// The share of a member's packets a `loss` fault drops, each way.
const LOSS_PERCENT: u32 = 30;

/// The fault schedule of a run, carried out on the fleet and the servers.
pub(super) struct Injector<'a> {
    pub(super) cfg: &'a Config,
    pub(super) timings: Timings,
    pub(super) keys: &'a [String],
    pub(super) fleet: &'a mut Fleet,
    pub(super) ctl: Option<&'a ServerCtl>,
    /// The namespaced topology's faults, when the servers are its members (`units`).
    pub(super) netns: Option<&'a Netns>,
    pub(super) units: &'a [String],
    pub(super) recorder: &'a Recorder,
    pub(super) rng: StdRng,
    pub(super) t0: u64,
}

impl Injector<'_> {
    fn rel(&self, t: u64) -> f64 {
        ms(t.saturating_sub(self.t0)) / 1000.0
    }

    /// A random server (the index of each slot's proxy to it) and a random half of the
    /// worker slots, rounded up, in order.
    fn server_and_half_the_slots(&mut self) -> (usize, Vec<usize>) {
        let servers = self.fleet.slots.first().map_or(0, |s| s.proxies.len());
        let server = self.rng.random_range(0..servers.max(1));
        let mut slots: Vec<usize> = (0..self.fleet.slots.len()).collect();
        slots.shuffle(&mut self.rng);
        slots.truncate(self.fleet.slots.len().div_ceil(2));
        slots.sort_unstable();
        (server, slots)
    }

    /// The unit name of the server behind each slot's `index`th proxy, or its index.
    fn server_name(&self, index: usize) -> String {
        self.units
            .get(index)
            .map_or_else(|| index.to_string(), Clone::clone)
    }

    /// Warm up, inject faults one at a time until the duration is over and every kind was
    /// injected once (waiting for recovery after each), then let the rest of the duration
    /// run calm.
    pub(super) async fn run(
        &mut self,
        kinds: &[FaultKind],
        faults: &mut Vec<FaultRec>,
    ) -> Result<(), String> {
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

    /// The member whose links a fault hits: the leader of an etcd or ZooKeeper group (the
    /// member whose loss of its majority matters), any node of a Redlock group.
    async fn link_target(&mut self, netns: &Netns) -> Result<String, String> {
        let group = self.units.first().map_or("", |m| netns::group_of(m));
        match group {
            "etcd" | "zk" => netns.leader(group).await,
            _ => self
                .units
                .choose(&mut self.rng)
                .cloned()
                .ok_or_else(|| "no member".to_owned()),
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
            FaultKind::Failover => {
                let ctl = self.ctl.ok_or("no server control")?;
                let group = self.units.first().ok_or("no replicated topology")?;
                fault.units = vec![group.clone()];
                fault.start = now_ns();
                ctl.failover(group).await?;
                fault.end = now_ns();
            }
            FaultKind::Cut | FaultKind::Slow | FaultKind::Loss => {
                let netns = self.netns.ok_or("not the namespaced topology")?;
                let member = self.link_target(netns).await?;
                fault.start = now_ns();
                match kind {
                    FaultKind::Cut => netns.isolate(&member).await?,
                    FaultKind::Slow => netns.slow(&member).await?,
                    _ => netns.loss(&member, LOSS_PERCENT).await?,
                }
                tokio::time::sleep(self.timings.fault_hold).await;
                netns.heal().await?;
                fault.end = now_ns();
                fault.units = vec![member];
            }
            FaultKind::Delay => {
                // Half of the workers: a late holder's stale belief shows against a prompt
                // taker, whose start is not recorded late too.
                let (server, slots) = self.server_and_half_the_slots();
                let late = |fleet: &Fleet, delay: Delay| {
                    for &slot in &slots {
                        fleet.slots[slot].proxies[server].delay(delay);
                    }
                };
                fault.start = now_ns();
                late(self.fleet, self.timings.late);
                tokio::time::sleep(self.timings.fault_hold).await;
                late(self.fleet, Delay::default());
                fault.end = now_ns();
                let who = slots.iter().map(ToString::to_string).collect::<Vec<_>>();
                fault.units = vec![format!(
                    "server {} late by {:?} + up to {:?} each way for worker slots {}",
                    self.server_name(server),
                    self.timings.late.base,
                    self.timings.late.jitter,
                    who.join(",")
                )];
            }
            FaultKind::Split => {
                let (server, slots) = self.server_and_half_the_slots();
                let cut = |fleet: &Fleet, heal: bool| {
                    for &slot in &slots {
                        let proxy = &fleet.slots[slot].proxies[server];
                        if heal { proxy.heal() } else { proxy.cut() }
                    }
                };
                fault.start = now_ns();
                cut(self.fleet, false);
                tokio::time::sleep(self.timings.fault_hold).await;
                cut(self.fleet, true);
                fault.end = now_ns();
                let who = slots.iter().map(ToString::to_string).collect::<Vec<_>>();
                fault.units = vec![format!(
                    "server {} from worker slots {}",
                    self.server_name(server),
                    who.join(",")
                )];
            }
            FaultKind::ClientClock => {
                let victim = self.pick_victim()?;
                let file = &self.fleet.slots[victim.slot].clock;
                let by = (2 * self.cfg.ttl + Duration::from_secs(1)).as_secs();
                let offset = match self.rng.random_bool(0.5) {
                    true => format!("+{by}"),
                    false => format!("-{by}"),
                };
                fault.start = now_ns();
                set_offset(file, &offset)?;
                tokio::time::sleep(self.timings.fault_hold).await;
                set_offset(file, "+0")?;
                fault.end = now_ns();
                fault.units = vec![format!("wall clock {offset} s")];
                fault.victim = Some(victim);
            }
            FaultKind::Clock => {
                let netns = self.netns.ok_or("not the namespaced topology")?;
                let member = self.units.choose(&mut self.rng).ok_or("no member")?.clone();
                fault.start = now_ns();
                netns
                    .shift_clock(&member, 2 * self.cfg.ttl + Duration::from_secs(1))
                    .await?;
                tokio::time::sleep(self.timings.fault_hold).await;
                netns.reset_clock(&member).await?;
                fault.end = now_ns();
                fault.units = vec![member];
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

/// Write a worker's wall-clock offset (whole at once: the preload reads it on every call).
fn set_offset(file: &std::path::Path, offset: &str) -> Result<(), String> {
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, offset)
        .and_then(|()| std::fs::rename(&tmp, file))
        .map_err(|e| format!("{}: {e}", file.display()))
}
