//! The command side of a Redis Cluster: redis-rs's cluster connection with its re-sends
//! replaced by ours (see [`ClusterCommands`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::SingleNodeRoutingInfo;
use redis::{Cmd, Value};

use crate::scripts;

/// The command side of a Redis Cluster: redis-rs's cluster connection (one multiplexed
/// connection per node, reconnected per node), with redis-rs's own retries off. A request
/// is sent again only after an answer that proves it did not run (`MOVED`, `TRYAGAIN`,
/// `CLUSTERDOWN`, `MASTERDOWN`, `LOADING`, no connection to send it on), after a short
/// growing pause, within the response timeout; an I/O error or a timeout is returned as it
/// is (the outcome is unknown: a script must not run twice). Two answers are followed at
/// once instead:
/// - `ASK` (the key's slot is being migrated and the key is not on the source yet): the
///   request goes to the node named, after `ASKING`, both in one write on that node's
///   connection so that nothing else can take the `ASKING`;
/// - `NOSCRIPT` (a promoted replica, a restart): a script's `EVALSHA` is sent again as
///   `EVAL` to the same node, which runs it and caches it there.
///
/// A request that gets no answer at all (a master that hangs or is cut off without a
/// reset: redis-rs would keep routing its slots to it, as no answer ever says `MOVED`)
/// has the connection replaced in the background by a fresh one, with a fresh slot map,
/// at most once a second: once the cluster has promoted the lost master's
/// replica, requests go there.
#[derive(Clone)]
pub struct ClusterCommands {
    shared: Arc<Remapped>,
    /// How long one request may take with its re-sends (the response timeout).
    budget: Duration,
}

/// The cluster connection in use, and what replaces it.
struct Remapped {
    conn: std::sync::Mutex<ClusterConnection>,
    client: ClusterClient,
    /// Bounds a replacement connection's connect.
    connect_timeout: Duration,
    /// Whether a replacement is being made (or the pause after one is running).
    remapping: AtomicBool,
}

impl std::fmt::Debug for ClusterCommands {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCommands")
            .field("budget", &self.budget)
            .finish_non_exhaustive()
    }
}

/// The least time between two replacements of a cluster connection.
pub(crate) const REMAP_PAUSE: Duration = Duration::from_secs(1);

impl ClusterCommands {
    /// Commands over `conn`, replaced by a fresh connection of `client` (within
    /// `connect_timeout`) after a request gets no answer; each request within `budget`.
    pub(super) fn new(
        conn: ClusterConnection,
        client: ClusterClient,
        connect_timeout: Duration,
        budget: Duration,
    ) -> Self {
        Self {
            shared: Arc::new(Remapped {
                conn: std::sync::Mutex::new(conn),
                client,
                connect_timeout,
                remapping: AtomicBool::new(false),
            }),
            budget,
        }
    }

    /// redis-rs's cluster connection in use now (no re-sends, no `ASK` or `NOSCRIPT`
    /// handling); a clone, sharing its node connections.
    pub fn inner(&self) -> ClusterConnection {
        self.shared
            .conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Replace the connection in use by a fresh one in the background, unless one is being
    /// made or was made less than [`REMAP_PAUSE`] ago.
    fn remap(&self) {
        if self.shared.remapping.swap(true, Ordering::SeqCst) {
            return;
        }
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let fresh =
                tokio::time::timeout(shared.connect_timeout, shared.client.get_async_connection())
                    .await;
            match fresh {
                Ok(Ok(conn)) => {
                    tracing::debug!(
                        "a cluster request got no answer: a fresh cluster connection (and slot map) is in use"
                    );
                    *shared.conn.lock().unwrap_or_else(PoisonError::into_inner) = conn;
                }
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "a cluster request got no answer; no fresh cluster connection either");
                }
                Err(_) => {
                    tracing::debug!(
                        "a cluster request got no answer; no fresh cluster connection within the connect timeout"
                    );
                }
            }
            tokio::time::sleep(REMAP_PAUSE).await;
            shared.remapping.store(false, Ordering::SeqCst);
        });
    }

    /// Send `cmd`, again as long as the answer proves it did not run, to the node an `ASK`
    /// names, and as `EVAL` after a `NOSCRIPT` (see the type's docs).
    pub(super) async fn request(&mut self, cmd: &Cmd) -> redis::RedisResult<Value> {
        let started = tokio::time::Instant::now();
        let mut pause = FIRST_PAUSE;
        let mut eval: Option<Cmd> = None;
        let mut asked: Option<SingleNodeRoutingInfo> = None;
        loop {
            let left = self.budget.saturating_sub(started.elapsed());
            let sending = eval.as_ref().unwrap_or(cmd);
            let mut conn = self.inner();
            let send = async {
                match asked.take() {
                    Some(node) => {
                        let mut pipe = redis::pipe();
                        pipe.cmd("ASKING").add_command(sending.clone());
                        let mut answers = conn.route_pipeline(pipe, 1, 1, node).await?;
                        answers.pop().ok_or_else(|| {
                            redis::RedisError::from((
                                redis::ErrorKind::Parse,
                                "no answer after ASKING",
                            ))
                        })
                    }
                    None => conn.req_packed_command(sending).await,
                }
            };
            let answer = match tokio::time::timeout(left, send).await {
                Ok(answer) => answer,
                Err(_) => {
                    self.remap();
                    return Err(timed_out());
                }
            };
            let error = match answer {
                Ok(Value::ServerError(e)) => redis::RedisError::from(e),
                Err(e) => e,
                ok => return ok,
            };
            match classify(&error) {
                Resend::ToAsked => match asked_node(&error) {
                    Some(node) if started.elapsed() < self.budget => {
                        tracing::debug!(error = %error, "the key's slot is being migrated: asking the node named");
                        asked = Some(node);
                    }
                    _ => return Err(still_redirected(error, self.budget)),
                },
                Resend::AsEval if eval.is_none() => match as_eval(cmd) {
                    Some(e) => {
                        tracing::debug!("a cluster node lacks a script: sending it as EVAL");
                        eval = Some(e);
                    }
                    None => return Err(error),
                },
                Resend::AfterPause if started.elapsed() + pause < self.budget => {
                    tracing::debug!(error = %error, "the cluster did not run a request: sending it again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(MAX_PAUSE);
                }
                Resend::AfterPause => return Err(still_redirected(error, self.budget)),
                _ => {
                    if error.is_timeout() {
                        self.remap();
                    }
                    return Err(error);
                }
            }
        }
    }
}

/// The node an `ASK` answer names.
pub(super) fn asked_node(error: &redis::RedisError) -> Option<SingleNodeRoutingInfo> {
    let (addr, _slot) = error.redirect_node()?;
    let (host, port) = addr.rsplit_once(':')?;
    Some(SingleNodeRoutingInfo::ByAddress {
        host: host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        port: port.parse().ok()?,
    })
}

/// The error for a request that the cluster still redirected (`MOVED`, `ASK`) when its
/// budget ran out: unavailable, like a timeout (a single server that answers `MOVED` is
/// another matter: a misconfiguration, left as the server's error).
pub(super) fn still_redirected(error: redis::RedisError, budget: Duration) -> redis::RedisError {
    use redis::{ErrorKind, ServerErrorKind};
    match error.kind() {
        ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the cluster still redirected the request after {budget:?}: {error}"),
        )
        .into(),
        _ => error,
    }
}

/// The first pause before a request the cluster did not run is sent again; each next
/// pause doubles, up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
/// The longest pause between re-sends.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// What to do after a cluster answered a request with an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// The answer proves the request did not run (a `MOVED`, a slot being migrated or
    /// without a master, a node loading its data, no connection to send it on): send it
    /// again after a pause.
    AfterPause,
    /// `ASK`: the request did not run; send it to the node named, after `ASKING`.
    ToAsked,
    /// `NOSCRIPT`: the script did not run; send it as `EVAL`.
    AsEval,
    /// It may have run (an I/O error, a timeout) or failed for good: return the error.
    Never,
}

/// How a cluster's error answer is handled (see [`Resend`]).
pub(crate) fn classify(error: &redis::RedisError) -> Resend {
    use redis::{ErrorKind, ServerErrorKind};
    match error.kind() {
        ErrorKind::Server(
            ServerErrorKind::Moved
            | ServerErrorKind::TryAgain
            | ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::BusyLoading,
        )
        | ErrorKind::ClusterConnectionNotFound => Resend::AfterPause,
        ErrorKind::Server(ServerErrorKind::Ask) => Resend::ToAsked,
        ErrorKind::Server(ServerErrorKind::NoScript) => Resend::AsEval,
        _ => Resend::Never,
    }
}

/// The error of a cluster request that got no answer within its budget.
fn timed_out() -> redis::RedisError {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer from the cluster within the response timeout",
    )
    .into()
}

/// `EVALSHA sha n keys… args…` as `EVAL source n keys… args…`, for a script of this
/// crate; `None` for any other command.
pub(super) fn as_eval(cmd: &Cmd) -> Option<Cmd> {
    let mut args = cmd.args_iter();
    let (Some(redis::Arg::Simple(name)), Some(redis::Arg::Simple(sha))) =
        (args.next(), args.next())
    else {
        return None;
    };
    if !name.eq_ignore_ascii_case(b"EVALSHA") {
        return None;
    }
    let source = scripts::source_of(std::str::from_utf8(sha).ok()?)?;
    let mut eval = redis::cmd("EVAL");
    eval.arg(source);
    for arg in args {
        match arg {
            redis::Arg::Simple(arg) => eval.arg(arg),
            _ => return None,
        };
    }
    Some(eval)
}
