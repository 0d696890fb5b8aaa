//! Sentinel: which master the sentinels name (the newest configuration epoch among a
//! majority of them and the watched one), the connection to it, and the watch on a
//! sentinel's `+switch-master` channel.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Value};

use super::{MIN_ATTEMPT, share};
use crate::config::{RedisConfig, SentinelConfig, Topology};
use crate::error::Error;

/// The sentinels of one master, and how to reach the master they name.
pub(crate) struct Sentinels {
    master: String,
    sentinels: Vec<(Arc<str>, Client)>,
    /// The data nodes' settings (credentials, TLS, timeouts); host and port are replaced
    /// by the master's.
    config: RedisConfig,
    backend: &'static str,
    /// What the connections and the watch share.
    shared: Arc<Shared>,
}

/// What a node's connections and its watch share.
struct Shared {
    /// The master the last successful connect used, as the sentinels named it.
    current: Mutex<Option<Named>>,
    /// The index of the sentinel the watch listens on (`usize::MAX`: none yet): every
    /// lookup waits for its answer, since it is the one that announced the last switch.
    watched: AtomicUsize,
}

/// A master as one sentinel names it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Named {
    host: String,
    port: u16,
    /// The configuration epoch of the sentinel's answer (`SENTINEL MASTER`'s
    /// `config-epoch`); `None` from a sentinel that answered only
    /// `get-master-addr-by-name`, which ranks below every epoch.
    epoch: Option<u64>,
}

impl Named {
    fn same_address(&self, other: &Self) -> bool {
        self.host == other.host && self.port == other.port
    }
}

impl Sentinels {
    /// The sentinels of `sentinel`, each with the data nodes' TLS settings and the
    /// sentinels' own credentials. No network I/O.
    pub(crate) fn new(
        config: &RedisConfig,
        sentinel: &SentinelConfig,
        backend: &'static str,
    ) -> dlock_core::Result<Self> {
        Ok(Self {
            master: sentinel.master.clone(),
            sentinels: sentinel
                .sentinels
                .iter()
                .map(|host| {
                    let at = sentinel_config(config, sentinel, &host.name, host.port);
                    Ok((
                        Arc::from(host.to_string()),
                        crate::node::client_for(&at, backend)?,
                    ))
                })
                .collect::<dlock_core::Result<_>>()?,
            config: config.clone(),
            backend,
            shared: Arc::new(Shared {
                current: Mutex::new(None),
                watched: AtomicUsize::new(usize::MAX),
            }),
        })
    }

    /// What the watch task needs (cheap clones of the sentinels' clients).
    pub(crate) fn watch(&self) -> Watch {
        Watch {
            master: self.master.clone(),
            sentinels: self.sentinels.clone(),
            connect_timeout: self.config.connect_timeout,
            shared: self.shared.clone(),
        }
    }

    /// Ask the sentinels which is the master (see [`Self::named`]), connect to it and check
    /// with `ROLE` that it is a master. Returns a client of the master, its address and
    /// the open connection.
    pub(crate) async fn master(
        &self,
        addr: &Arc<str>,
        config: &AsyncConnectionConfig,
    ) -> Result<(Client, Arc<str>, MultiplexedConnection), Error> {
        let named = self.named(addr).await?;
        let (host, port) = self.config.dial(&named.host, named.port);
        let at = RedisConfig {
            topology: Topology::Server,
            ..self.config.at(host, port)
        };
        let master: Arc<str> = Arc::from(at.addr());
        let client = crate::node::client_for(&at, self.backend).map_err(|_| Error::NoMaster {
            op: "connect",
            addr: addr.clone(),
            why: format!("the sentinels name {master}, which is not a usable address"),
        })?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(config)
            .await
            .map_err(|e| Error::redis("connect", &master, e))?;
        match redis::cmd("ROLE")
            .query_async::<Vec<Value>>(&mut conn)
            .await
        {
            Ok(role) => {
                let is_master = matches!(role.first(), Some(Value::BulkString(r)) if r == b"master")
                    || matches!(role.first(), Some(Value::SimpleString(r)) if r == "master");
                if !is_master {
                    return Err(Error::NoMaster {
                        op: "connect",
                        addr: addr.clone(),
                        why: format!(
                            "the sentinels name {master} as master {:?}, but it is not a \
                             master (a failover under way?)",
                            self.master
                        ),
                    });
                }
            }
            // `ROLE` is an `@admin` command: a least-privilege user may not run it. Then
            // the sentinels' answer is trusted; a demoted master still refuses writes
            // (READONLY), which drops the connection and asks again.
            Err(e) if e.code() == Some("NOPERM") => {
                tracing::debug!(master = %master, "the user may not run ROLE: trusting the sentinels");
            }
            Err(e) => return Err(Error::redis("connect", &master, e)),
        }
        tracing::debug!(master = %master, name = %self.master, epoch = ?named.epoch, "sentinels named the master");
        *self
            .shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(named);
        Ok((client, master, conn))
    }

    /// Ask every sentinel at once; once a majority of them (and the watched one, which
    /// announced the last switch) answered, or all are done, the answer with the newest
    /// configuration epoch wins (ties: the first in the URL). A sentinel learns of a
    /// switch from the others only every couple of seconds, so the first to answer may
    /// still name the old master.
    async fn named(&self, addr: &Arc<str>) -> Result<Named, Error> {
        let n = self.sentinels.len();
        let majority = n / 2 + 1;
        let watched = self.shared.watched.load(Ordering::Relaxed);
        let each = (self.config.connect_timeout / 2).max(MIN_ATTEMPT);
        let mut asks: FuturesUnordered<_> = self
            .sentinels
            .iter()
            .enumerate()
            .map(|(i, (sentinel, client))| async move {
                (i, ask(&self.master, sentinel, client, each).await)
            })
            .collect();
        let mut best: Option<(usize, Named)> = None;
        let mut answered = 0;
        let mut heard_watched = watched >= n;
        let mut last = None;
        while let Some((i, answer)) = asks.next().await {
            heard_watched |= i == watched;
            let sentinel = &self.sentinels[i].0;
            match answer {
                Ok(Some(named)) => {
                    answered += 1;
                    let better = best.as_ref().is_none_or(|(j, b)| {
                        named.epoch > b.epoch || (named.epoch == b.epoch && i < *j)
                    });
                    if better {
                        best = Some((i, named));
                    }
                }
                Ok(None) => {
                    answered += 1;
                    last = Some(Error::NoMaster {
                        op: "connect",
                        addr: addr.clone(),
                        why: format!("sentinel {sentinel} knows no master by that name"),
                    });
                }
                Err(e) => {
                    tracing::debug!(sentinel = %sentinel, error = %e, "sentinel did not answer");
                    last = Some(e);
                }
            }
            if best.is_some() && answered >= majority && heard_watched {
                break;
            }
        }
        best.map(|(_, named)| named).ok_or_else(|| {
            last.unwrap_or_else(|| Error::NoMaster {
                op: "connect",
                addr: addr.clone(),
                why: "no sentinel".into(),
            })
        })
    }
}

/// What one sentinel names as `master`: `SENTINEL MASTER` (address and configuration
/// epoch); from a sentinel that refuses that (an old one, or a user without the right),
/// `SENTINEL get-master-addr-by-name` (no epoch). `None` when it knows no such master.
async fn ask(
    master: &str,
    sentinel: &Arc<str>,
    client: &Client,
    limit: Duration,
) -> Result<Option<Named>, Error> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(limit))
        .set_response_timeout(Some(limit));
    let ask = async {
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        let full = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(master)
            .query_async::<std::collections::HashMap<String, String>>(&mut conn)
            .await;
        match full {
            Ok(fields) => {
                let field = |name: &str| fields.get(name).map(String::as_str);
                let port = field("port").and_then(|p| p.parse().ok());
                match (field("ip"), port) {
                    (Some(host), Some(port)) => Ok(Some(Named {
                        host: host.to_owned(),
                        port,
                        epoch: field("config-epoch").and_then(|e| e.parse().ok()),
                    })),
                    _ => Err(redis::RedisError::from((
                        redis::ErrorKind::Parse,
                        "SENTINEL MASTER without ip and port",
                    ))),
                }
            }
            Err(e) if e.detail().is_some_and(|d| d.contains("No such master")) => Ok(None),
            Err(e) if e.kind() != redis::ErrorKind::Io && e.code().is_some() => {
                tracing::debug!(sentinel = %sentinel, error = %e, "SENTINEL MASTER refused: asking for the address only");
                let at = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(master)
                    .query_async::<Option<(String, u16)>>(&mut conn)
                    .await?;
                Ok(at.map(|(host, port)| Named {
                    host,
                    port,
                    epoch: None,
                }))
            }
            Err(e) => Err(e),
        }
    };
    match tokio::time::timeout(limit, ask).await {
        Ok(answer) => answer.map_err(|e| Error::redis("connect", sentinel, e)),
        Err(_) => Err(Error::timed_out("connect", sentinel, limit)),
    }
}

/// What the Sentinel watch needs: the master's name, the sentinels, and what it shares
/// with the node's connections.
pub(crate) struct Watch {
    master: String,
    sentinels: Vec<(Arc<str>, Client)>,
    connect_timeout: Duration,
    shared: Arc<Shared>,
}

/// How long the watch waits before it asks the sentinels again when none accepted its
/// subscription (or its connection broke).
const WATCH_RETRY: Duration = Duration::from_secs(1);

/// Listen on a sentinel's `+switch-master` channel; when the sentinels announce a new
/// master for our name, drop the node's connections, so requests and waiters reach the new
/// master at once, not only when the old one is demoted (which Sentinel does seconds
/// later, and until which the old master would still take writes). The next connect waits
/// for this sentinel's answer, which names the announced master with its new epoch.
/// After every (re)subscription the master this sentinel names is compared with the one in
/// use (a switch announced while the watch was reconnecting is not missed). Falls over to
/// the next sentinel when the connection breaks or the sentinel stops answering a `PING`
/// (sent every [`WATCH_RETRY`]); ends once the node is gone.
pub(crate) async fn watch_switches(
    watch: Watch,
    addr: Arc<str>,
    node: std::sync::Weak<crate::node::Inner>,
) {
    let n = watch.sentinels.len();
    let each = share(watch.connect_timeout, n);
    let mut next = 0;
    while node.strong_count() > 0 {
        let index = next % n;
        let (sentinel, client) = &watch.sentinels[index];
        next += 1;
        let subscribed = tokio::time::timeout(each, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe("+switch-master").await?;
            redis::RedisResult::Ok(pubsub)
        })
        .await;
        let pubsub = match subscribed {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(e)) => {
                tracing::debug!(sentinel = %sentinel, error = %e, "cannot watch this sentinel for a new master");
                tokio::time::sleep(WATCH_RETRY).await;
                continue;
            }
            Err(_) => {
                tracing::debug!(sentinel = %sentinel, "no answer to the watch for a new master");
                continue;
            }
        };
        watch.shared.watched.store(index, Ordering::Relaxed);
        // A switch announced while we were not subscribed: compare now.
        match ask(&watch.master, sentinel, client, each).await {
            Ok(Some(named)) => {
                let stale = watch
                    .shared
                    .current
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .is_some_and(|current| {
                        !current.same_address(&named) && named.epoch >= current.epoch
                    });
                if stale {
                    let Some(inner) = node.upgrade() else { return };
                    tracing::debug!(server = %addr, sentinel = %sentinel, "the watched sentinel names another master than the one in use");
                    crate::node::Node::from_inner(inner).reset_connections();
                }
            }
            Ok(None) => {}
            Err(e) => {
                tracing::debug!(sentinel = %sentinel, error = %e, "cannot ask the watched sentinel for the master");
            }
        }
        let (mut sink, mut messages) = pubsub.split();
        let mut alive = tokio::time::interval(WATCH_RETRY);
        loop {
            tokio::select! {
                message = messages.next() => {
                    let Some(message) = message else { break };
                    // "<name> <old ip> <old port> <new ip> <new port>"
                    let text = String::from_utf8_lossy(message.get_payload_bytes()).into_owned();
                    let parts: Vec<&str> = text.split(' ').collect();
                    if parts.first() != Some(&watch.master.as_str()) {
                        continue;
                    }
                    let there = match (parts.get(3), parts.get(4).and_then(|p| p.parse::<u16>().ok())) {
                        (Some(host), Some(port)) => watch
                            .shared
                            .current
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .as_ref()
                            .is_some_and(|c| c.host == *host && c.port == port),
                        _ => false,
                    };
                    if there {
                        continue;
                    }
                    let Some(inner) = node.upgrade() else { return };
                    tracing::debug!(server = %addr, switch = %text, "the sentinels announced a new master");
                    crate::node::Node::from_inner(inner).reset_connections();
                }
                _ = alive.tick() => {
                    if node.strong_count() == 0 {
                        return;
                    }
                    // A sentinel that hangs or is cut off without a reset never closes
                    // the subscription: without an answer to PING, watch another one.
                    match tokio::time::timeout(each, sink.ping::<redis::Value>()).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => {
                            tracing::debug!(sentinel = %sentinel, error = %e, "the watched sentinel failed a PING; watching the next one");
                            break;
                        }
                        Err(_) => {
                            tracing::debug!(sentinel = %sentinel, "no answer to PING from the watched sentinel; watching the next one");
                            break;
                        }
                    }
                }
            }
        }
        tracing::debug!(sentinel = %sentinel, "the sentinel watch connection closed");
    }
}

/// The settings of the sentinel at `host:port`: the data nodes' TLS settings, the
/// sentinels' own credentials, database 0.
fn sentinel_config(
    config: &RedisConfig,
    sentinel: &SentinelConfig,
    host: &str,
    port: u16,
) -> RedisConfig {
    RedisConfig {
        username: sentinel.username.clone(),
        password: sentinel.password.clone(),
        db: 0,
        topology: Topology::Server,
        ..config.at(host, port)
    }
}

#[cfg(test)]
mod tests {
    use super::Named;

    #[test]
    fn unknown_epochs_rank_below_every_epoch() {
        let named = |epoch| Named {
            host: "127.0.0.1".into(),
            port: 6379,
            epoch,
        };
        assert!(named(Some(0)).epoch > named(None).epoch);
        assert!(named(Some(12)).epoch > named(Some(11)).epoch);
        assert!(named(None).same_address(&named(Some(3))));
    }
}
