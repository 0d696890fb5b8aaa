//! The servers behind a lock URL: their addresses (to put a proxy per worker in front of
//! them), and the `scripts/backends` units that run them (to stop and start them).

use std::collections::BTreeSet;

use dlock_core::raw::url::{self, Host, LockUrl};
use std::fs::File;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Units that other tests use all the time: never stopped by a torture run.
pub(crate) const SHARED_UNITS: &[&str] = &["redis", "zookeeper", "etcd", "mariadb", "postgres"];

/// A lock URL taken apart by dlock-core's URL layer, to find its servers and to point it at
/// proxies in front of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    url: LockUrl,
}

impl Target {
    pub(crate) fn parse(url: &str) -> Result<Self, String> {
        let scheme = url.split_once("://").map_or("", |(s, _)| s);
        let default_port = url::default_port(&scheme.to_ascii_lowercase()).unwrap_or(0);
        let url =
            LockUrl::parse("dlock-torture", url, &[], default_port).map_err(|e| e.to_string())?;
        if url.hosts().is_empty() {
            return Err(format!("{}:// URL without a host", url.scheme()));
        }
        Ok(Self { url })
    }

    pub(crate) fn scheme(&self) -> &str {
        self.url.scheme()
    }

    /// The server addresses, in URL order.
    pub(crate) fn addrs(&self) -> Result<Vec<SocketAddr>, String> {
        self.url
            .hosts()
            .iter()
            .map(|host| {
                if host.port == 0 {
                    return Err(format!(
                        "{}: no port and no default port for {}://",
                        host.name,
                        self.scheme()
                    ));
                }
                (host.name.as_str(), host.port)
                    .to_socket_addrs()
                    .map_err(|e| format!("cannot resolve {host}: {e}"))?
                    .next()
                    .ok_or_else(|| format!("{host} resolves to no address"))
            })
            .collect()
    }

    /// The URL with its hosts replaced by `addrs` (same order; the rest kept).
    pub(crate) fn with_addrs(&self, addrs: &[SocketAddr]) -> String {
        let hosts = addrs
            .iter()
            .map(|a| Host::new(a.ip().to_string(), a.port()))
            .collect();
        self.url.with_hosts(hosts).expose()
    }

    /// The URL without its password, for reports.
    pub(crate) fn redacted(&self) -> String {
        self.url.to_string()
    }
}

/// The `[unit]=PORT` table between the `# BEGIN CLIENT PORTS` / `# END CLIENT PORTS` lines of
/// `scripts/backends`.
pub(crate) fn port_table(script: &str) -> Vec<(String, u16)> {
    let Some(start) = script.find("# BEGIN CLIENT PORTS") else {
        return Vec::new();
    };
    let rest = &script[start..];
    let end = rest.find("# END CLIENT PORTS").unwrap_or(rest.len());
    rest[..end]
        .lines()
        .filter_map(|line| {
            let (unit, port) = line.trim().strip_prefix('[')?.split_once("]=")?;
            Some((unit.to_owned(), port.trim().parse().ok()?))
        })
        .collect()
}

/// `scripts/backends`: from `explicit`, else the first found walking up from the current
/// directory, else the one of the checkout this binary was built from.
pub(crate) fn find_script(explicit: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = explicit {
        return Some(path.to_owned());
    }
    let mut dir = std::env::current_dir().ok();
    while let Some(d) = dir {
        let candidate = d.join("scripts/backends");
        if candidate.is_file() {
            return Some(candidate);
        }
        dir = d.parent().map(Path::to_owned);
    }
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/backends");
    built.is_file().then_some(built)
}

/// Exclusive locks on units, held for a whole run, so two torture runs never stop each
/// other's servers (a restart the other run did not inject would look like an overlap in
/// calm weather). The lock files live beside the units' state, in `scripts/backends`' folder.
#[derive(Debug)]
pub(crate) struct UnitLocks {
    _held: Vec<Flock<File>>,
}

impl UnitLocks {
    /// Lock every unit (in name order, so two runs cannot deadlock), waiting up to `limit`.
    pub(crate) async fn take(units: &[String], limit: Duration) -> Result<Self, String> {
        let base = std::env::var_os("DLOCK_BACKENDS_DIR")
            .map_or_else(|| PathBuf::from("/var/tmp/dlock-backends"), PathBuf::from);
        let mut sorted = units.to_vec();
        sorted.sort();
        sorted.dedup();
        let until = tokio::time::Instant::now() + limit;
        let mut held = Vec::new();
        for unit in sorted {
            let dir = base.join(&unit);
            std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let path = dir.join("torture.lock");
            let mut said = false;
            loop {
                let file = File::options()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                    Ok(lock) => {
                        held.push(lock);
                        break;
                    }
                    Err((_, Errno::EWOULDBLOCK)) if tokio::time::Instant::now() < until => {
                        if !said {
                            eprintln!("torture: waiting for another torture run on {unit} to end");
                            said = true;
                        }
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err((_, Errno::EWOULDBLOCK)) => {
                        return Err(format!(
                            "another torture run has been using {unit} for over {limit:?}"
                        ));
                    }
                    Err((_, e)) => return Err(format!("lock {}: {e}", path.display())),
                }
            }
        }
        Ok(Self { _held: held })
    }
}

/// Run `script` with `args`; its standard output, or an error naming the command with its
/// status and standard error.
pub(crate) async fn run_script(script: &Path, args: &[&str]) -> Result<String, String> {
    let out = tokio::process::Command::new(script)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("{} {}: {e}", script.display(), args.join(" ")))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{} {}: {}\n{}",
            script.display(),
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Starts and stops `scripts/backends` units, and remembers which are down so that they
/// are always brought back ([`ServerCtl::restore`], also on drop).
#[derive(Debug)]
pub(crate) struct ServerCtl {
    script: PathBuf,
    down: Mutex<BTreeSet<String>>,
}

impl ServerCtl {
    pub(crate) fn new(script: PathBuf) -> Self {
        Self {
            script,
            down: Mutex::default(),
        }
    }

    fn down_set(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.down.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stop `units` (refusing the shared ones).
    pub(crate) async fn stop(&self, units: &[String]) -> Result<(), String> {
        if let Some(shared) = units.iter().find(|u| SHARED_UNITS.contains(&u.as_str())) {
            return Err(format!("refusing to stop the shared server {shared}"));
        }
        self.down_set().extend(units.iter().cloned());
        self.run("down", units).await
    }

    /// Start `units` and wait until they answer.
    pub(crate) async fn start(&self, units: &[String]) -> Result<(), String> {
        self.run("up", units).await?;
        let mut down = self.down_set();
        for unit in units {
            down.remove(unit);
        }
        Ok(())
    }

    /// Fail the primary of `group` over to a replica (`scripts/backends failover GROUP`,
    /// which returns once the new primary serves).
    pub(crate) async fn failover(&self, group: &str) -> Result<(), String> {
        self.run("failover", &[group.to_owned()]).await
    }

    async fn run(&self, op: &str, units: &[String]) -> Result<(), String> {
        let mut args = vec![op];
        args.extend(units.iter().map(String::as_str));
        run_script(&self.script, &args).await.map(drop)
    }

    /// Start whatever this run stopped and has not started again (blocking).
    pub(crate) fn restore(&self) {
        let units: Vec<String> = std::mem::take(&mut *self.down_set()).into_iter().collect();
        if units.is_empty() {
            return;
        }
        eprintln!("torture: bringing back {}", units.join(" "));
        match std::process::Command::new(&self.script)
            .arg("up")
            .args(&units)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .status()
        {
            Ok(status) if status.success() => {}
            Ok(status) => eprintln!(
                "torture: {} up {} failed ({status}); run it by hand",
                self.script.display(),
                units.join(" ")
            ),
            Err(e) => eprintln!("torture: cannot run {}: {e}", self.script.display()),
        }
    }
}

impl Drop for ServerCtl {
    fn drop(&mut self) {
        self.restore();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_around_their_hosts() {
        let cases = [
            (
                "redis://127.0.0.1:6380",
                vec!["127.0.0.1:6380"],
                "redis://127.0.0.1:6380",
            ),
            (
                "zk://127.0.0.1:2182,127.0.0.1:2183/app?session_timeout=3s",
                vec!["127.0.0.1:2182", "127.0.0.1:2183"],
                "zk://127.0.0.1:2182,127.0.0.1:2183/app?session_timeout=3s",
            ),
            (
                "mysql://dlock:secret@127.0.0.1:3307/dlock",
                vec!["127.0.0.1:3307"],
                "mysql://dlock:***@127.0.0.1:3307/dlock",
            ),
            (
                "etcd://127.0.0.1",
                vec!["127.0.0.1:2379"],
                "etcd://127.0.0.1:2379",
            ),
        ];
        for (url, addrs, redacted) in cases {
            let t = Target::parse(url).unwrap();
            let got: Vec<String> = t.addrs().unwrap().iter().map(ToString::to_string).collect();
            assert_eq!(got, addrs, "{url}");
            assert_eq!(t.redacted(), redacted);
        }
        assert!(Target::parse("redis://").is_err());
        assert!(Target::parse("127.0.0.1:6379").is_err());
    }

    #[test]
    fn hosts_are_replaced_and_the_rest_kept() {
        let t = Target::parse("mysql://dlock:pw@127.0.0.1:3307/dlock?response_timeout=2s").unwrap();
        let proxy: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        assert_eq!(
            t.with_addrs(&[proxy]),
            "mysql://dlock:pw@127.0.0.1:40000/dlock?response_timeout=2s"
        );
    }

    #[test]
    fn the_port_table_of_the_script_is_read() {
        let script = std::fs::read_to_string(find_script(None).expect("scripts/backends")).unwrap();
        let table = port_table(&script);
        assert!(
            table.contains(&("torture-redis".to_owned(), 6380)),
            "{table:?}"
        );
        assert!(
            table.contains(&("zk-ensemble-2".to_owned(), 2183)),
            "{table:?}"
        );
    }
}
