//! Who holds a key and who waits for it, read from the server without disturbing it
//! ([`DistributedLock::inspect`](crate::DistributedLock::inspect)), and how a holder
//! describes itself there ([`holder_description`]).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use crate::{LockError, Mode, Result};

/// A key as the server shows it at one moment: its holders, and its waiters where the
/// backend can see them ([`Capabilities::inspect`](crate::Capabilities::inspect) says what
/// it shows).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyStatus {
    /// The key inspected.
    pub key: String,
    /// Every hold of the key now: none when it is free, one for a mutex, any number of
    /// shared holds or permits.
    pub holders: Vec<HolderStatus>,
    /// The holds queued for the key, first in line first where the backend keeps an order
    /// ([`WaiterView::Queue`]); `None` where the backend cannot see its waiters
    /// ([`WaiterView::Hidden`]).
    pub waiters: Option<Vec<WaiterStatus>>,
}

impl KeyStatus {
    /// A status of `key` with no holder and, if `waiters_visible`, no waiter.
    pub fn new(key: &str, waiters_visible: bool) -> Self {
        Self {
            key: key.to_owned(),
            holders: Vec::new(),
            waiters: waiters_visible.then(Vec::new),
        }
    }

    /// Whether anyone holds the key.
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }
}

/// One hold of a key, as the server shows it. Fields the backend cannot know are `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderStatus {
    /// Exclusive, shared, or one of N permits (`Permits(0)` where N is not stored on the
    /// server).
    pub mode: Mode,
    /// The hold's fencing token, as its holder got it.
    pub fencing_token: Option<u64>,
    /// When the hold was granted, by the server's clock.
    pub since: Option<SystemTime>,
    /// How long the server keeps the hold without a renewal.
    pub ttl_left: Option<Duration>,
    /// Who holds it: the holder's [`holder_description`], or what the server knows of its
    /// connection (an address, a connection id).
    pub who: Option<String>,
}

impl HolderStatus {
    /// A hold in `mode` of which nothing else is known.
    pub fn new(mode: Mode) -> Self {
        Self {
            mode,
            fencing_token: None,
            since: None,
            ttl_left: None,
            who: None,
        }
    }
}

/// One queued request for a key. Fields the backend cannot know are `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WaiterStatus {
    /// The mode asked for, where the server shows it.
    pub mode: Option<Mode>,
    /// When the request was queued, by the server's clock.
    pub since: Option<SystemTime>,
    /// Who waits, as for [`HolderStatus::who`].
    pub who: Option<String>,
}

impl WaiterStatus {
    /// A waiter of which nothing is known but that it waits.
    pub fn new() -> Self {
        Self {
            mode: None,
            since: None,
            who: None,
        }
    }
}

impl Default for WaiterStatus {
    fn default() -> Self {
        Self::new()
    }
}

/// What [`DistributedLock::inspect`](crate::DistributedLock::inspect) and
/// [`list`](crate::DistributedLock::list) show on a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Inspection {
    /// Each holder's [`who`](HolderStatus::who) names it: the description the holder wrote
    /// ([`holder_description`]), or the server's view of its connection.
    pub who: bool,
    /// What is shown of the waiters.
    pub waiters: WaiterView,
    /// [`list`](crate::DistributedLock::list) enumerates the held keys under a prefix;
    /// without it `list` answers [`LockError::Unsupported`] before any I/O.
    pub list: bool,
}

/// What [`KeyStatus::waiters`] holds on a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WaiterView {
    /// Waiters are not visible on the server: `waiters` is `None`.
    #[default]
    Hidden,
    /// Every waiter is listed, in no particular order.
    Listed,
    /// Every waiter is listed, first in line first.
    Queue,
}

/// The longest name [`set_holder_name`] takes.
pub const MAX_HOLDER_NAME: usize = 64;

static NAME: OnceLock<String> = OnceLock::new();

/// Name this process in its [`holder_description`] (before the first client is connected:
/// some backends hand the description to the server when they connect; the first name set
/// stays): up to [`MAX_HOLDER_NAME`] bytes of ASCII letters, digits, `.`, `_` and `-`.
/// Without it the name is the program's file name.
///
/// # Errors
/// [`LockError::InvalidConfig`] for a name out of that form, or once a name is in use.
pub fn set_holder_name(name: &str) -> Result<()> {
    let valid = !name.is_empty()
        && name.len() <= MAX_HOLDER_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !valid {
        return Err(LockError::invalid_config(
            "dlock",
            format!(
                "holder name {name:?}: 1 to {MAX_HOLDER_NAME} ASCII letters, digits, '.', '_' or '-'"
            ),
        ));
    }
    NAME.set(name.to_owned()).map_err(|_| {
        LockError::invalid_config("dlock", "the holder name is already set (or in use)")
    })
}

/// How this process describes itself to the servers that can carry it (a ZooKeeper node's
/// data, an etcd key's value, a connection's application name): `NAME@HOST:PID`, where
/// `NAME` is [`set_holder_name`]'s (by default the program's file name, in the same form)
/// and `HOST` the host name. [`KeyStatus`] shows it as each holder's `who`.
///
/// ```
/// let me = dlock_core::holder_description();
/// let (name, host_pid) = me.split_once('@').unwrap();
/// assert!(!name.is_empty());
/// assert!(host_pid.ends_with(&format!(":{}", std::process::id())));
/// ```
pub fn holder_description() -> &'static str {
    static DESCRIPTION: OnceLock<String> = OnceLock::new();
    DESCRIPTION.get_or_init(|| {
        let name = NAME.get_or_init(program_name);
        format!("{name}@{}:{}", host_name(), std::process::id())
    })
}

/// The program's file name, in the form of a holder name.
fn program_name() -> String {
    let name: String = std::env::args_os()
        .next()
        .map(std::path::PathBuf::from)
        .and_then(|path| path.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_default()
        .chars()
        .map(|c| match c {
            c if c.is_ascii_alphanumeric() || "._-".contains(c) => c,
            _ => '_',
        })
        .take(MAX_HOLDER_NAME)
        .collect();
    match name.is_empty() {
        true => "dlock".to_owned(),
        false => name,
    }
}

/// This machine's host name (Linux's, else `$HOSTNAME`, else `localhost`), in printable
/// ASCII without `@`, `:` or blanks, so that every server shows it alike.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_graphic() && !"@:".contains(*c))
        .take(253)
        .collect();
    match name.is_empty() {
        true => "localhost".to_owned(),
        false => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_names_are_checked() {
        for bad in [
            "",
            "a b",
            "a@b",
            "a:b",
            "é",
            &"x".repeat(MAX_HOLDER_NAME + 1),
        ] {
            assert!(set_holder_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_description_names_the_program_host_and_pid() {
        let me = holder_description();
        let (name, rest) = me.split_once('@').expect("NAME@HOST:PID");
        let (host, pid) = rest.rsplit_once(':').expect("HOST:PID");
        assert!(!name.is_empty() && !host.is_empty(), "{me}");
        assert_eq!(pid, std::process::id().to_string());
        assert!(!me.contains(char::is_whitespace), "{me}");
    }
}
