//! The namespaced topology of `scripts/netns` (issue #24): servers each in a network
//! namespace of their own, on 10.77.0.0/24, whose links the run cuts between members,
//! slows, makes lossy, and whose Redis nodes' wall clocks it shifts. Every fault is undone
//! by the run (and when the run ends or is dropped, whatever it left is healed).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

/// The members of the namespaced topology behind `addrs` (`etcd-2`, `zk-1`, `redlock-5`),
/// in order; `None` unless every address is one of its members.
pub(crate) fn members_of(addrs: &[SocketAddr]) -> Option<Vec<String>> {
    if addrs.is_empty() {
        return None;
    }
    addrs
        .iter()
        .map(|addr| match addr.ip() {
            IpAddr::V4(ip) => member_at(ip),
            IpAddr::V6(_) => None,
        })
        .collect()
}

/// The member at `ip` (the address plan of `scripts/netns`).
fn member_at(ip: Ipv4Addr) -> Option<String> {
    let [10, 77, 0, last] = ip.octets() else {
        return None;
    };
    let (group, first, count) = match last {
        11..=13 => ("etcd", 11, 3),
        21..=23 => ("zk", 21, 3),
        31..=35 => ("redlock", 31, 5),
        _ => return None,
    };
    let n = last - first + 1;
    (n <= count).then(|| format!("{group}-{n}"))
}

/// A member's group: `etcd`, `zk` or `redlock`.
pub(crate) fn group_of(member: &str) -> &str {
    member.rsplit_once('-').map_or(member, |(group, _)| group)
}

/// `scripts/netns` beside the `scripts/backends` the run found.
pub(crate) fn script_beside(backends: &std::path::Path) -> Option<PathBuf> {
    let netns = backends.with_file_name("netns");
    netns.is_file().then_some(netns)
}

/// The clock preload that `scripts/netns shim` builds (needs `cc`, not root): a process
/// run with `LD_PRELOAD` of it and `DLK_TIMESHIFT_FILE=F` reads its wall clock as real time
/// plus the offset in `F` (`+5`, `-5`), its monotonic clock untouched. `None` when it
/// cannot be built.
pub(crate) async fn clock_shim(netns: &std::path::Path) -> Option<PathBuf> {
    match crate::servers::run_script(netns, &["shim"]).await {
        Ok(out) => Some(PathBuf::from(out.trim())).filter(|p| p.is_file()),
        Err(e) => {
            tracing::warn!(error = %e, "no clock preload for the workers");
            None
        }
    }
}

/// Runs `scripts/netns` fault commands, and remembers what is in force so that it is
/// always undone ([`Netns::restore`], also on drop).
#[derive(Debug)]
pub(crate) struct Netns {
    script: PathBuf,
    /// Members whose clock was shifted and not reset yet.
    shifted: Mutex<Vec<String>>,
    /// Whether a cut, loss or rate limit may be in force.
    faulted: Mutex<bool>,
}

impl Netns {
    pub(crate) fn new(script: PathBuf) -> Self {
        Self {
            script,
            shifted: Mutex::default(),
            faulted: Mutex::default(),
        }
    }

    /// The member of `group` (`etcd`, `zk`) that leads now.
    pub(crate) async fn leader(&self, group: &str) -> Result<String, String> {
        let out = self.run(&["leader", group]).await?;
        out.split_whitespace()
            .next()
            .map(str::to_owned)
            .ok_or_else(|| format!("scripts/netns leader {group}: no member named"))
    }

    /// Cut `member` off from every other member of its group (the clients still reach it).
    pub(crate) async fn isolate(&self, member: &str) -> Result<(), String> {
        *self.faulted.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.run(&["isolate", member]).await.map(drop)
    }

    /// Rate-limit `member`'s link both ways (`scripts/netns slow`'s defaults: 1 mbit).
    pub(crate) async fn slow(&self, member: &str) -> Result<(), String> {
        *self.faulted.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.run(&["slow", member]).await.map(drop)
    }

    /// Drop `percent` of `member`'s packets, each way.
    pub(crate) async fn loss(&self, member: &str, percent: u32) -> Result<(), String> {
        *self.faulted.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.run(&["loss", member, &percent.to_string()])
            .await
            .map(drop)
    }

    /// Undo every cut, loss and rate limit.
    pub(crate) async fn heal(&self) -> Result<(), String> {
        self.run(&["heal"]).await?;
        *self.faulted.lock().unwrap_or_else(|e| e.into_inner()) = false;
        Ok(())
    }

    /// Shift `member`'s wall clock to real time + `by` (a Redis node of the `redlock`
    /// group; whole seconds, rounded up).
    pub(crate) async fn shift_clock(&self, member: &str, by: Duration) -> Result<(), String> {
        self.shifted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(member.to_owned());
        let seconds = by.as_secs() + u64::from(by.subsec_nanos() > 0);
        self.run(&["clock", member, &format!("+{seconds}")])
            .await
            .map(drop)
    }

    /// Set `member`'s wall clock back to real time.
    pub(crate) async fn reset_clock(&self, member: &str) -> Result<(), String> {
        self.run(&["clock", member, "reset"]).await?;
        self.shifted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|m| m != member);
        Ok(())
    }

    async fn run(&self, args: &[&str]) -> Result<String, String> {
        crate::servers::run_script(&self.script, args).await
    }

    /// Undo whatever fault this run left in force (blocking).
    pub(crate) fn restore(&self) {
        let mut commands: Vec<Vec<String>> = Vec::new();
        if std::mem::take(&mut *self.faulted.lock().unwrap_or_else(|e| e.into_inner())) {
            commands.push(vec!["heal".into()]);
        }
        for member in std::mem::take(&mut *self.shifted.lock().unwrap_or_else(|e| e.into_inner())) {
            commands.push(vec!["clock".into(), member, "reset".into()]);
        }
        for args in commands {
            let status = std::process::Command::new(&self.script)
                .args(&args)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .status();
            if !matches!(status, Ok(s) if s.success()) {
                eprintln!(
                    "torture: {} {} failed ({status:?}); run it by hand",
                    self.script.display(),
                    args.join(" ")
                );
            }
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_named_by_the_address_plan() {
        let addrs: Vec<SocketAddr> = ["10.77.0.11:2379", "10.77.0.13:2379"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        assert_eq!(
            members_of(&addrs),
            Some(vec!["etcd-1".into(), "etcd-3".into()])
        );
        let redlock: SocketAddr = "10.77.0.35:6379".parse().unwrap();
        assert_eq!(members_of(&[redlock]), Some(vec!["redlock-5".into()]));
        let loopback: SocketAddr = "127.0.0.1:2379".parse().unwrap();
        assert_eq!(members_of(&[redlock, loopback]), None);
        let client: SocketAddr = "10.77.0.41:2379".parse().unwrap();
        assert_eq!(
            members_of(&[client]),
            None,
            "a client namespace runs no server"
        );
        assert_eq!(group_of("redlock-5"), "redlock");
    }
}
