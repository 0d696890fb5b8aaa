//! What holding costs, read from outside the lock: this process's CPU time, and each
//! server's own count of the requests it handled.
//!
//! | backend | counter (server-wide) |
//! |---|---|
//! | memory | — |
//! | redis, redlock | `INFO stats` `total_commands_processed`, summed over the nodes |
//! | zookeeper | `mntr` `zk_packets_received` (four-letter word), else `srvr` `Received:` |
//! | etcd | `/metrics` on the client port: `grpc_server_msg_received_total`, all methods (keep-alive stream messages included), summed over the members |
//! | mysql | `SHOW GLOBAL STATUS LIKE 'Questions'` |
//! | postgres | `pg_stat_database` `xact_commit + xact_rollback` of the database |
//!
//! Every counter is server-wide: other clients of the same server are counted too. The
//! counter's own reads are subtracted where they count themselves.

use std::time::Duration;

use crate::backends::{Kind, Parts};
#[allow(unused_imports)] // unused when every networked backend is compiled out
use crate::raw::{bounded, err};

/// This process's user + system CPU time so far (`getrusage(RUSAGE_SELF)`), all threads.
pub(crate) fn cpu_time() -> Option<Duration> {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let of = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec().max(0) as u64)
            + Duration::from_micros(t.tv_usec().max(0) as u64)
    };
    Some(of(usage.user_time()) + of(usage.system_time()))
}

/// A reader of one server's request counter.
pub(crate) enum Counter {
    #[cfg(any(feature = "redis", feature = "redlock"))]
    Redis(Vec<redis::aio::MultiplexedConnection>),
    #[cfg(feature = "zookeeper")]
    Zookeeper(String),
    #[cfg(feature = "etcd")]
    Etcd(Vec<String>),
    #[cfg(feature = "mysql")]
    Mysql(sqlx::MySqlConnection),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgConnection),
    /// Keeps the type inhabited when every networked backend is compiled out.
    #[allow(dead_code)]
    Never(std::convert::Infallible),
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Counter")
    }
}

impl Counter {
    /// A reader for `kind`'s server at `url`; `None` where the server cannot tell (memory).
    #[allow(unreachable_code)] // with every networked backend compiled out
    pub(crate) async fn open(
        kind: Kind,
        url: &str,
        timeout: Duration,
    ) -> Result<Option<Counter>, String> {
        let parts = Parts::parse(url)?;
        let _ = (&parts, timeout);
        Ok(Some(match kind {
            Kind::Memory => return Ok(None),
            #[cfg(any(feature = "redis", feature = "redlock"))]
            Kind::Redis | Kind::RedisSentinel | Kind::RedisCluster | Kind::Redlock => {
                let mut nodes = Vec::new();
                for node in crate::raw::redis_data_urls(kind, &parts, timeout).await? {
                    nodes.push(crate::raw::redis_connect(&node, timeout).await?);
                }
                Counter::Redis(nodes)
            }
            #[cfg(feature = "zookeeper")]
            Kind::Zookeeper => {
                Counter::Zookeeper(parts.hosts.first().ok_or("no host in the URL")?.clone())
            }
            #[cfg(feature = "etcd")]
            Kind::Etcd => Counter::Etcd(parts.hosts.clone()),
            #[cfg(feature = "mysql")]
            Kind::Mysql => Counter::Mysql(crate::connect::mysql_connect(&parts, timeout).await?),
            #[cfg(feature = "postgres")]
            Kind::Postgres => Counter::Postgres(crate::connect::pg_connect(&parts, timeout).await?),
            #[allow(unreachable_patterns)]
            other => return Err(format!("lockbench was built without its `{other}` feature")),
        }))
    }

    /// What is counted, for the output.
    pub(crate) fn describe(&self) -> &'static str {
        match *self {
            #[cfg(any(feature = "redis", feature = "redlock"))]
            Counter::Redis(_) => "INFO stats total_commands_processed",
            #[cfg(feature = "zookeeper")]
            Counter::Zookeeper(_) => "mntr zk_packets_received",
            #[cfg(feature = "etcd")]
            Counter::Etcd(_) => "/metrics grpc_server_msg_received_total",
            #[cfg(feature = "mysql")]
            Counter::Mysql(_) => "SHOW GLOBAL STATUS Questions",
            #[cfg(feature = "postgres")]
            Counter::Postgres(_) => "pg_stat_database xact_commit + xact_rollback",
            Counter::Never(never) => match never {},
        }
    }

    /// How many requests one [`read`](Self::read) adds to the count it reads next.
    pub(crate) fn own_per_read(&self) -> u64 {
        match self {
            #[cfg(any(feature = "redis", feature = "redlock"))]
            Counter::Redis(nodes) => nodes.len() as u64,
            #[cfg(feature = "zookeeper")]
            Counter::Zookeeper(_) => 0,
            #[cfg(feature = "etcd")]
            Counter::Etcd(_) => 0,
            #[cfg(feature = "mysql")]
            Counter::Mysql(_) => 1,
            #[cfg(feature = "postgres")]
            Counter::Postgres(_) => 1,
            Counter::Never(never) => match *never {},
        }
    }

    /// The counter's value now.
    pub(crate) async fn read(&mut self, timeout: Duration) -> Result<u64, String> {
        let _ = timeout;
        match self {
            #[cfg(any(feature = "redis", feature = "redlock"))]
            Counter::Redis(nodes) => {
                let mut sum = 0;
                for con in nodes {
                    let info: String = bounded(
                        timeout,
                        "INFO stats",
                        redis::cmd("INFO").arg("stats").query_async(con),
                    )
                    .await?;
                    sum += field(&info, "total_commands_processed:")?;
                }
                Ok(sum)
            }
            #[cfg(feature = "zookeeper")]
            Counter::Zookeeper(host) => {
                let mntr = four_letter_word(host, "mntr", timeout).await?;
                match field(&mntr, "zk_packets_received") {
                    Ok(n) => Ok(n),
                    Err(_) => field(&four_letter_word(host, "srvr", timeout).await?, "Received:")
                        .map_err(|_| {
                            "neither mntr nor srvr is whitelisted (4lw.commands.whitelist)"
                                .to_owned()
                        }),
                }
            }
            #[cfg(feature = "etcd")]
            Counter::Etcd(hosts) => {
                let mut sum = 0;
                for host in hosts.iter() {
                    let metrics = http_get(host, "/metrics", timeout).await?;
                    sum += metrics
                        .lines()
                        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
                        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                        .sum::<f64>() as u64;
                }
                Ok(sum)
            }
            #[cfg(feature = "mysql")]
            Counter::Mysql(conn) => {
                let (_, value): (String, String) =
                    sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
                        .fetch_one(conn)
                        .await
                        .map_err(err)?;
                value.trim().parse().map_err(err)
            }
            #[cfg(feature = "postgres")]
            Counter::Postgres(conn) => {
                let n: i64 = sqlx::query_scalar(
                    "SELECT (xact_commit + xact_rollback)::bigint FROM pg_stat_database \
                     WHERE datname = current_database()",
                )
                .fetch_one(conn)
                .await
                .map_err(err)?;
                Ok(n.max(0) as u64)
            }
            Counter::Never(never) => match *never {},
        }
    }
}

/// The number after `name` on its line of `text` (`name:value`, `name\tvalue`, `name value`).
#[allow(dead_code)] // unused when every networked backend is compiled out
fn field(text: &str, name: &str) -> Result<u64, String> {
    text.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim_start_matches([':', ' ', '\t']).trim().parse().ok())
        .ok_or_else(|| format!("no {name} in the answer"))
}

/// A ZooKeeper four-letter word's answer.
#[cfg(feature = "zookeeper")]
async fn four_letter_word(host: &str, word: &str, timeout: Duration) -> Result<String, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    bounded(timeout, word, async {
        let mut s = tokio::net::TcpStream::connect(host).await?;
        s.write_all(word.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    })
    .await
}

/// The body of a plain HTTP/1.0 GET (etcd serves `/metrics` on its client port).
#[cfg(feature = "etcd")]
async fn http_get(host: &str, path: &str, timeout: Duration) -> Result<String, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let answer = bounded(timeout, "GET /metrics", async {
        let mut s = tokio::net::TcpStream::connect(host).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
            .await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&out).into_owned())
    })
    .await?;
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or("a malformed HTTP answer")?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!(
            "GET {path}: {}",
            head.lines().next().unwrap_or_default()
        ));
    }
    Ok(body.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_read_from_every_answer_format() {
        assert_eq!(field("a:1\r\ntotal:42\r\n", "total:"), Ok(42));
        assert_eq!(
            field("zk_packets_received\t17\n", "zk_packets_received"),
            Ok(17)
        );
        assert_eq!(field("Received: 9\nSent: 3\n", "Received:"), Ok(9));
        assert!(field("nothing", "total:").is_err());
    }

    #[tokio::test]
    async fn every_server_counter_reads_and_never_goes_back() {
        let timeout = Duration::from_secs(10);
        for kind in crate::backends::test_backends() {
            let start = kind.start_command().unwrap_or_default();
            let counter = Counter::open(kind, &kind.url(), timeout)
                .await
                .unwrap_or_else(|e| panic!("{kind} unreachable ({e}); start it with `{start}`"));
            let Some(mut counter) = counter else {
                assert_eq!(kind, Kind::Memory);
                continue;
            };
            let first = counter
                .read(timeout)
                .await
                .unwrap_or_else(|e| panic!("{kind}: {}: {e}", counter.describe()));
            let second = counter.read(timeout).await.expect("a second read");
            assert!(second >= first, "{kind}: {first} then {second}");
            eprintln!("{kind}: {} = {second}", counter.describe());
        }
    }

    #[test]
    fn cpu_time_grows_with_work() {
        let before = cpu_time().expect("getrusage");
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_time().expect("getrusage") > before);
    }
}
