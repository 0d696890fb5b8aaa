//! What each server costs by itself: the minimal round trips a lock needs, made with the
//! same client crate the backend uses, so lock figures can be shown as ratios to them.
//!
//! | backend | ping | cycle |
//! |---|---|---|
//! | memory | — | uncontended `tokio::sync::Mutex` lock + unlock |
//! | redis | `PING` | `SET key v NX PX 30000` + `DEL key` |
//! | redis-sentinel | `PING` to the master Sentinel names | as redis, on that master |
//! | redis-cluster | `PING` (a cluster connection) | as redis, through the cluster connection (to the key's master) |
//! | redlock | `PING` to every node in parallel | `SET NX PX` on every node in parallel, then `DEL` on every node |
//! | zookeeper | `exists /` | `create` ephemeral node + `delete` |
//! | etcd | `get key` (linearizable read) | `put key` if absent (a transaction comparing its create revision to 0), on a lease granted once, + `delete key` |
//! | mysql | `SELECT 1` | `BEGIN` / `SELECT … FOR UPDATE` / `COMMIT` on a row of a temporary table |
//! | postgres | `SELECT 1` | `pg_advisory_lock` + `pg_advisory_unlock` on one connection |
//!
//! Each cycle is the least lock its server offers: a write that fails when another client
//! holds the key (or a lock call that waits), and an unconditional give-back. etcd's put
//! always succeeds, so its cycle puts only if the key is absent, as `SET NX` does on
//! Redis; the lease plays the part of Redis's `PX` and, like it, costs no request per cycle.

use std::sync::Arc;
use std::time::Duration;

#[allow(unused_imports)] // unused when Redis and Redlock are compiled out
use futures::future::join_all;

use crate::backends::{Kind, Parts};
#[cfg(feature = "etcd")]
use crate::connect::etcd_connect;
#[cfg(feature = "mysql")]
use crate::connect::mysql_connect;
#[cfg(feature = "postgres")]
use crate::connect::pg_connect;
#[cfg(feature = "zookeeper")]
use crate::connect::zk_connect;

/// One raw client on its own connection, owning one key.
pub(crate) enum RawConn {
    Memory(Arc<tokio::sync::Mutex<()>>),
    #[cfg(feature = "redis")]
    Redis {
        con: redis::aio::MultiplexedConnection,
        key: String,
    },
    #[cfg(feature = "redis")]
    RedisCluster {
        con: redis::cluster_async::ClusterConnection,
        key: String,
    },
    #[cfg(feature = "redlock")]
    Redlock {
        nodes: Vec<redis::aio::MultiplexedConnection>,
        key: String,
    },
    #[cfg(feature = "zookeeper")]
    Zookeeper {
        client: zookeeper_client::Client,
        path: String,
    },
    #[cfg(feature = "etcd")]
    Etcd {
        client: Box<etcd_client::Client>,
        key: String,
        /// Granted at connect and revoked at close: the keys' expiry.
        lease: i64,
    },
    #[cfg(feature = "mysql")]
    Mysql {
        conn: sqlx::MySqlConnection,
        key: String,
    },
    #[cfg(feature = "postgres")]
    Postgres {
        conn: sqlx::PgConnection,
        /// The advisory lock's two numbers.
        id: (i32, i32),
    },
}

impl std::fmt::Debug for RawConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RawConn")
    }
}

/// What "ping" and "cycle" mean for a backend, for the output.
pub(crate) fn describe(kind: Kind) -> (Option<&'static str>, &'static str) {
    match kind {
        Kind::Memory => (None, "tokio Mutex lock+unlock"),
        Kind::Redis => (Some("PING"), "SET NX PX + DEL"),
        Kind::RedisSentinel => (Some("PING (master)"), "SET NX PX + DEL on the master"),
        Kind::RedisCluster => (Some("PING (cluster)"), "SET NX PX + DEL (cluster client)"),
        Kind::Redlock => (Some("PING ×N nodes"), "SET NX PX ×N + DEL ×N"),
        Kind::Zookeeper => (Some("exists /"), "create ephemeral + delete"),
        Kind::Etcd => (Some("get"), "put if absent + delete"),
        Kind::Mysql => (Some("SELECT 1"), "BEGIN; SELECT … FOR UPDATE; COMMIT"),
        Kind::Postgres => (Some("SELECT 1"), "pg_advisory_lock + pg_advisory_unlock"),
    }
}

#[allow(dead_code)] // unused when every networked backend is compiled out
pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

#[allow(dead_code)] // unused when every networked backend is compiled out
pub(crate) async fn bounded<T, E: std::fmt::Display>(
    timeout: Duration,
    what: &str,
    f: impl Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(timeout, f).await {
        Ok(r) => r.map_err(|e| format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer within {timeout:?}")),
    }
}

#[cfg(any(feature = "redis", feature = "redlock"))]
pub(crate) async fn redis_connect(
    url: &str,
    timeout: Duration,
) -> Result<redis::aio::MultiplexedConnection, String> {
    let client = redis::Client::open(url).map_err(err)?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    bounded(
        timeout,
        "redis connect",
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await
}

/// `SET key v NX PX 30000`, which must succeed.
#[cfg(any(feature = "redis", feature = "redlock"))]
async fn redis_set(mut con: impl redis::aio::ConnectionLike, key: &str) -> Result<(), String> {
    let set: Option<String> = redis::cmd("SET")
        .arg(key)
        .arg("lockbench")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut con)
        .await
        .map_err(err)?;
    set.map(drop)
        .ok_or_else(|| format!("SET NX on {key:?} found the key already set"))
}

/// `DEL key`, which must delete it.
#[cfg(any(feature = "redis", feature = "redlock"))]
async fn redis_del(mut con: impl redis::aio::ConnectionLike, key: &str) -> Result<(), String> {
    let deleted: i64 = redis::cmd("DEL")
        .arg(key)
        .query_async(&mut con)
        .await
        .map_err(err)?;
    if deleted != 1 {
        return Err(format!("DEL {key:?} deleted {deleted} keys"));
    }
    Ok(())
}

#[cfg(any(feature = "redis", feature = "redlock"))]
async fn redis_ping(con: &mut impl redis::aio::ConnectionLike) -> Result<(), String> {
    let pong: String = redis::cmd("PING").query_async(con).await.map_err(err)?;
    if pong != "PONG" {
        return Err(format!("PING answered {pong:?}"));
    }
    Ok(())
}

#[cfg(any(feature = "redis", feature = "redlock"))]
pub(crate) fn redis_node_urls(parts: &Parts) -> Vec<String> {
    let scheme = if parts.scheme == "rediss" || parts.scheme == "redlocks" {
        "rediss"
    } else {
        "redis"
    };
    let single = parts.scheme == "redis" || parts.scheme == "rediss";
    parts
        .hosts
        .iter()
        .map(|h| parts.single(scheme, h, single))
        .collect()
}

/// The master a Sentinel URL's sentinels name now (`SENTINEL get-master-addr-by-name`, asked
/// of each sentinel in turn), as a `redis://` URL with the URL's user and password.
#[cfg(feature = "redis")]
pub(crate) async fn sentinel_master_url(
    parts: &Parts,
    timeout: Duration,
) -> Result<String, String> {
    let master = parts.path();
    if master.is_empty() {
        return Err("a Sentinel URL names its master: redis+sentinel://host:port/MASTER".into());
    }
    let mut last = "no sentinel in the URL".to_owned();
    for host in &parts.hosts {
        let asked = async {
            let mut con = redis_connect(&format!("redis://{host}"), timeout).await?;
            let addr: Option<(String, u16)> = bounded(
                timeout,
                "SENTINEL get-master-addr-by-name",
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(master)
                    .query_async(&mut con),
            )
            .await?;
            addr.ok_or_else(|| format!("sentinel {host} does not know master {master:?}"))
        };
        match asked.await {
            Ok((ip, port)) => return Ok(parts.single("redis", &format!("{ip}:{port}"), false)),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The masters of a Redis Cluster (`CLUSTER NODES` of the first seed that answers), as
/// `redis://` URLs with the URL's user and password.
#[cfg(feature = "redis")]
pub(crate) async fn cluster_master_urls(
    parts: &Parts,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let mut last = "no node in the URL".to_owned();
    for host in &parts.hosts {
        let asked = async {
            let mut con = redis_connect(&parts.single("redis", host, false), timeout).await?;
            bounded::<String, _>(
                timeout,
                "CLUSTER NODES",
                redis::cmd("CLUSTER").arg("NODES").query_async(&mut con),
            )
            .await
        };
        match asked.await {
            Ok(nodes) => {
                // `<id> <ip:port@bus> <flags> …`: the masters that are not failing.
                let masters: Vec<String> = nodes
                    .lines()
                    .filter_map(|line| {
                        let mut fields = line.split_whitespace();
                        let addr = fields.nth(1)?.split('@').next()?;
                        let flags = fields.next()?;
                        (flags.split(',').any(|f| f == "master") && !flags.contains("fail"))
                            .then(|| parts.single("redis", addr, false))
                    })
                    .collect();
                if masters.is_empty() {
                    return Err(format!("{host}: CLUSTER NODES lists no master"));
                }
                return Ok(masters);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// A cluster connection over a Cluster URL's seed nodes.
#[cfg(feature = "redis")]
async fn redis_cluster_connect(
    parts: &Parts,
    timeout: Duration,
) -> Result<redis::cluster_async::ClusterConnection, String> {
    let seeds: Vec<String> = parts
        .hosts
        .iter()
        .map(|h| parts.single("redis", h, false))
        .collect();
    let client = redis::cluster::ClusterClientBuilder::new(seeds)
        .connection_timeout(timeout)
        .response_timeout(timeout)
        .build()
        .map_err(err)?;
    bounded(
        timeout,
        "redis cluster connect",
        client.get_async_connection(),
    )
    .await
}

/// The URL of every data node of a Redis URL of any kind: the one server, each Redlock
/// node, the master Sentinel names, a Cluster's masters.
#[cfg(any(feature = "redis", feature = "redlock"))]
pub(crate) async fn redis_data_urls(
    kind: Kind,
    parts: &Parts,
    timeout: Duration,
) -> Result<Vec<String>, String> {
    let _ = timeout;
    match kind {
        #[cfg(feature = "redis")]
        Kind::RedisSentinel => Ok(vec![sentinel_master_url(parts, timeout).await?]),
        #[cfg(feature = "redis")]
        Kind::RedisCluster => cluster_master_urls(parts, timeout).await,
        _ => Ok(redis_node_urls(parts)),
    }
}

impl RawConn {
    /// Open a raw client of `kind`'s server at `url` (a dlock URL), owning `key`.
    pub(crate) async fn connect(
        kind: Kind,
        url: &str,
        key: &str,
        timeout: Duration,
    ) -> Result<RawConn, String> {
        let parts = Parts::parse(url)?;
        // Every arm but memory's may be compiled out.
        let _ = (&parts, key, timeout);
        match kind {
            Kind::Memory => Ok(RawConn::Memory(Arc::default())),
            #[cfg(feature = "redis")]
            Kind::Redis => {
                let url = redis_node_urls(&parts)
                    .into_iter()
                    .next()
                    .ok_or("no host in the URL")?;
                Ok(RawConn::Redis {
                    con: redis_connect(&url, timeout).await?,
                    key: format!("lockbench:{key}"),
                })
            }
            #[cfg(feature = "redis")]
            Kind::RedisSentinel => Ok(RawConn::Redis {
                con: redis_connect(&sentinel_master_url(&parts, timeout).await?, timeout).await?,
                key: format!("lockbench:{key}"),
            }),
            #[cfg(feature = "redis")]
            Kind::RedisCluster => Ok(RawConn::RedisCluster {
                con: redis_cluster_connect(&parts, timeout).await?,
                key: format!("lockbench:{key}"),
            }),
            #[cfg(feature = "redlock")]
            Kind::Redlock => {
                let urls = redis_node_urls(&parts);
                if urls.is_empty() {
                    return Err("no host in the URL".into());
                }
                let nodes = join_all(urls.iter().map(|u| redis_connect(u, timeout)))
                    .await
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(RawConn::Redlock {
                    nodes,
                    key: format!("lockbench:{key}"),
                })
            }
            #[cfg(feature = "zookeeper")]
            Kind::Zookeeper => {
                let client = zk_connect(&parts, timeout).await?;
                Ok(RawConn::Zookeeper {
                    client,
                    path: format!("/lockbench-{key}"),
                })
            }
            #[cfg(feature = "etcd")]
            Kind::Etcd => {
                let mut client = Box::new(etcd_connect(&parts, timeout).await?);
                // Longer than any run's measurement with this connection.
                let lease = client.lease_grant(600, None).await.map_err(err)?.id();
                Ok(RawConn::Etcd {
                    client,
                    key: format!("lockbench/{key}"),
                    lease,
                })
            }
            #[cfg(feature = "mysql")]
            Kind::Mysql => {
                use sqlx::Executor as _;
                let mut conn = mysql_connect(&parts, timeout).await?;
                let key = key.to_owned();
                conn.execute(
                    "CREATE TEMPORARY TABLE lockbench_raw (name VARCHAR(191) PRIMARY KEY) ENGINE=InnoDB",
                )
                .await
                .map_err(err)?;
                sqlx::query("INSERT INTO lockbench_raw (name) VALUES (?)")
                    .bind(&key)
                    .execute(&mut conn)
                    .await
                    .map_err(err)?;
                Ok(RawConn::Mysql { conn, key })
            }
            #[cfg(feature = "postgres")]
            Kind::Postgres => {
                let conn = pg_connect(&parts, timeout).await?;
                // A namespace of lockbench's own ("lbnc"), apart from dlock's, and an id
                // from the key.
                let id = key
                    .bytes()
                    .fold(0i32, |h, b| h.wrapping_mul(31).wrapping_add(b.into()));
                Ok(RawConn::Postgres {
                    conn,
                    id: (0x6c62_6e63, id),
                })
            }
            #[allow(unreachable_patterns)]
            other => Err(format!("lockbench was built without its `{other}` feature")),
        }
    }

    /// One minimal request.
    pub(crate) async fn ping(&mut self) -> Result<(), String> {
        match self {
            RawConn::Memory(_) => Ok(()),
            #[cfg(feature = "redis")]
            RawConn::Redis { con, .. } => redis_ping(con).await,
            #[cfg(feature = "redis")]
            RawConn::RedisCluster { con, .. } => redis_ping(con).await,
            #[cfg(feature = "redlock")]
            RawConn::Redlock { nodes, .. } => join_all(nodes.iter_mut().map(redis_ping))
                .await
                .into_iter()
                .collect(),
            #[cfg(feature = "zookeeper")]
            RawConn::Zookeeper { client, .. } => {
                client.check_stat("/").await.map_err(err)?;
                Ok(())
            }
            #[cfg(feature = "etcd")]
            RawConn::Etcd { client, key, .. } => {
                client.get(key.as_str(), None).await.map_err(err)?;
                Ok(())
            }
            #[cfg(feature = "mysql")]
            RawConn::Mysql { conn, .. } => {
                let one: i64 = sqlx::query_scalar("SELECT 1")
                    .fetch_one(conn)
                    .await
                    .map_err(err)?;
                if one != 1 {
                    return Err(format!("SELECT 1 answered {one}"));
                }
                Ok(())
            }
            #[cfg(feature = "postgres")]
            RawConn::Postgres { conn, .. } => {
                use sqlx::{Executor as _, Row as _};
                let row = conn.fetch_one("SELECT 1").await.map_err(err)?;
                let one: i32 = row.try_get(0).map_err(err)?;
                if one != 1 {
                    return Err(format!("SELECT 1 answered {one}"));
                }
                Ok(())
            }
        }
    }

    /// The server's minimal take-and-give-back of one key.
    pub(crate) async fn cycle(&mut self) -> Result<(), String> {
        match self {
            RawConn::Memory(m) => {
                drop(m.lock().await);
                Ok(())
            }
            #[cfg(feature = "redis")]
            RawConn::Redis { con, key } => {
                redis_set(con.clone(), key).await?;
                redis_del(con.clone(), key).await
            }
            #[cfg(feature = "redis")]
            RawConn::RedisCluster { con, key } => {
                redis_set(con.clone(), key).await?;
                redis_del(con.clone(), key).await
            }
            #[cfg(feature = "redlock")]
            RawConn::Redlock { nodes, key } => {
                let sets = join_all(nodes.iter().map(|con| redis_set(con.clone(), key))).await;
                let dels = join_all(nodes.iter().map(|con| redis_del(con.clone(), key))).await;
                sets.into_iter().chain(dels).collect()
            }
            #[cfg(feature = "zookeeper")]
            RawConn::Zookeeper { client, path } => {
                use zookeeper_client::{Acls, CreateMode};
                let options = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
                client.create(path, b"", &options).await.map_err(err)?;
                client.delete(path, None).await.map_err(err)
            }
            #[cfg(feature = "etcd")]
            RawConn::Etcd { client, key, lease } => {
                use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
                let put = TxnOp::put(
                    key.as_str(),
                    "lockbench",
                    Some(PutOptions::new().with_lease(*lease)),
                );
                let txn = Txn::new()
                    .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
                    .and_then([put]);
                if !client.txn(txn).await.map_err(err)?.succeeded() {
                    return Err(format!("{key:?} was not absent"));
                }
                let deleted = client.delete(key.as_str(), None).await.map_err(err)?;
                if deleted.deleted() != 1 {
                    return Err(format!("delete {key:?} removed {} keys", deleted.deleted()));
                }
                Ok(())
            }
            #[cfg(feature = "mysql")]
            RawConn::Mysql { conn, key } => {
                use sqlx::Connection as _;
                let mut tx = conn.begin().await.map_err(err)?;
                let row: Option<String> =
                    sqlx::query_scalar("SELECT name FROM lockbench_raw WHERE name = ? FOR UPDATE")
                        .bind(key.as_str())
                        .fetch_optional(&mut *tx)
                        .await
                        .map_err(err)?;
                if row.is_none() {
                    return Err(format!("row {key:?} is missing"));
                }
                tx.commit().await.map_err(err)
            }
            #[cfg(feature = "postgres")]
            RawConn::Postgres { conn, id } => {
                // Text queries (the simple protocol, one message each way), as the backend
                // sends them.
                use sqlx::{Executor as _, Row as _};
                let (ns, id) = *id;
                conn.execute(format!("SELECT pg_advisory_lock({ns}, {id})").as_str())
                    .await
                    .map_err(err)?;
                let row = conn
                    .fetch_one(format!("SELECT pg_advisory_unlock({ns}, {id})").as_str())
                    .await
                    .map_err(err)?;
                if !row.try_get::<bool, _>(0).map_err(err)? {
                    return Err(format!("pg_advisory_unlock({ns}, {id}) found it not held"));
                }
                Ok(())
            }
        }
    }

    /// Remove what this client made and close its connection.
    pub(crate) async fn close(self) {
        match self {
            RawConn::Memory(_) => {}
            #[cfg(feature = "redis")]
            RawConn::Redis { mut con, key } => {
                let _: Result<i64, _> = redis::cmd("DEL").arg(&key).query_async(&mut con).await;
            }
            #[cfg(feature = "redis")]
            RawConn::RedisCluster { mut con, key } => {
                let _: Result<i64, _> = redis::cmd("DEL").arg(&key).query_async(&mut con).await;
            }
            #[cfg(feature = "redlock")]
            RawConn::Redlock { mut nodes, key } => {
                for con in &mut nodes {
                    let _: Result<i64, _> = redis::cmd("DEL").arg(&key).query_async(con).await;
                }
            }
            #[cfg(feature = "zookeeper")]
            RawConn::Zookeeper { client, path } => {
                let _ = client.delete(&path, None).await;
            }
            #[cfg(feature = "etcd")]
            RawConn::Etcd {
                mut client,
                key,
                lease,
            } => {
                let _ = client.delete(key.as_str(), None).await;
                let _ = client.lease_revoke(lease).await;
            }
            #[cfg(feature = "mysql")]
            RawConn::Mysql { conn, .. } => {
                use sqlx::Connection as _;
                // The temporary table goes with the session.
                let _ = conn.close().await;
            }
            #[cfg(feature = "postgres")]
            RawConn::Postgres { conn, .. } => {
                use sqlx::Connection as _;
                // Session locks go with the session.
                let _ = conn.close().await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::server_version;

    #[tokio::test]
    async fn raw_clients_round_trip_and_leave_nothing() {
        let timeout = Duration::from_secs(10);
        let key = format!("rawtest{:08x}", rand::random::<u32>());
        for kind in crate::backends::test_backends() {
            let url = kind.url();
            let start = kind.start_command().unwrap_or_default();
            let mut conn = RawConn::connect(kind, &url, &key, timeout)
                .await
                .unwrap_or_else(|e| panic!("{kind} unreachable ({e}); start it with `{start}`"));
            for _ in 0..3 {
                conn.ping()
                    .await
                    .unwrap_or_else(|e| panic!("{kind} ping: {e}"));
                conn.cycle()
                    .await
                    .unwrap_or_else(|e| panic!("{kind} cycle: {e}"));
            }
            conn.close().await;
            // A second client on the same key: the cycle would fail on a leftover key or node.
            let mut again = RawConn::connect(kind, &url, &key, timeout).await.unwrap();
            again
                .cycle()
                .await
                .unwrap_or_else(|e| panic!("{kind} after close: {e}"));
            again.close().await;
            let version = server_version(kind, &url, timeout)
                .await
                .unwrap_or_else(|e| panic!("{kind} version: {e}"));
            assert!(
                kind == Kind::Memory
                    || (version.chars().any(|c| c.is_ascii_digit())
                        && !version.contains("unknown")),
                "{kind}: {version}"
            );
            eprintln!("{kind}: {version}");
        }
    }
}
