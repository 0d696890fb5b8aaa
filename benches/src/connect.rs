//! Connecting the raw clients of lockbench to each server, and asking each server its
//! version for the report.

use std::time::Duration;

use crate::backends::{Kind, Parts};
#[cfg(any(feature = "redis", feature = "redlock"))]
use crate::raw::redis_connect;
#[allow(unused_imports)] // unused when every server backend is compiled out
use crate::raw::{bounded, err};

#[cfg(feature = "zookeeper")]
pub(crate) async fn zk_connect(
    parts: &Parts,
    timeout: Duration,
) -> Result<zookeeper_client::Client, String> {
    if parts.hosts.is_empty() {
        return Err("no host in the URL".into());
    }
    let cluster = parts.hosts.join(",");
    bounded(
        timeout,
        "zookeeper connect",
        zookeeper_client::Client::connector()
            .with_session_timeout(Duration::from_secs(6))
            .with_fail_eagerly()
            .connect(&cluster),
    )
    .await
}

#[cfg(feature = "etcd")]
pub(crate) async fn etcd_connect(
    parts: &Parts,
    timeout: Duration,
) -> Result<etcd_client::Client, String> {
    if parts.hosts.is_empty() {
        return Err("no host in the URL".into());
    }
    let prefix = if parts.scheme == "etcds" {
        "https://"
    } else {
        "http://"
    };
    let endpoints: Vec<String> = parts.hosts.iter().map(|h| format!("{prefix}{h}")).collect();
    let options = etcd_client::ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_timeout(timeout);
    bounded(
        timeout,
        "etcd connect",
        etcd_client::Client::connect(endpoints, Some(options)),
    )
    .await
}

#[cfg(feature = "mysql")]
pub(crate) async fn mysql_connect(
    parts: &Parts,
    timeout: Duration,
) -> Result<sqlx::MySqlConnection, String> {
    use sqlx::Connection as _;
    let host = parts.hosts.first().ok_or("no host in the URL")?;
    let url = parts.single("mysql", host, true);
    bounded(
        timeout,
        "mysql connect",
        sqlx::MySqlConnection::connect(&url),
    )
    .await
}

#[cfg(feature = "postgres")]
pub(crate) async fn pg_connect(
    parts: &Parts,
    timeout: Duration,
) -> Result<sqlx::PgConnection, String> {
    use sqlx::Connection as _;
    let host = parts.hosts.first().ok_or("no host in the URL")?;
    let url = parts.single("postgres", host, true);
    bounded(
        timeout,
        "postgres connect",
        sqlx::PgConnection::connect(&url),
    )
    .await
}

/// The server's version, as the server reports it.
pub(crate) async fn server_version(
    kind: Kind,
    url: &str,
    timeout: Duration,
) -> Result<String, String> {
    let parts = Parts::parse(url)?;
    let _ = (&parts, timeout);
    match kind {
        Kind::Memory => Ok("in-process (dlock-memory)".to_owned()),
        #[cfg(any(feature = "redis", feature = "redlock"))]
        Kind::Redis | Kind::RedisSentinel | Kind::RedisCluster | Kind::Redlock => {
            let urls = crate::raw::redis_data_urls(kind, &parts, timeout).await?;
            let mut versions = Vec::new();
            for url in &urls {
                let mut con = redis_connect(url, timeout).await?;
                let info: String = bounded(
                    timeout,
                    "INFO server",
                    redis::cmd("INFO").arg("server").query_async(&mut con),
                )
                .await?;
                let version = info
                    .lines()
                    .find_map(|l| l.strip_prefix("redis_version:"))
                    .unwrap_or("unknown")
                    .trim()
                    .to_owned();
                versions.push(version);
            }
            versions.dedup();
            let nodes = if urls.len() > 1 {
                format!(" ×{}", urls.len())
            } else {
                String::new()
            };
            Ok(format!("Redis {}{nodes}", versions.join("/")))
        }
        #[cfg(feature = "zookeeper")]
        Kind::Zookeeper => {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            let host = parts.hosts.first().ok_or("no host in the URL")?;
            let answer = bounded(timeout, "zookeeper srvr", async {
                let mut s = tokio::net::TcpStream::connect(host.as_str()).await?;
                s.write_all(b"srvr").await?;
                let mut out = String::new();
                s.read_to_string(&mut out).await?;
                Ok::<_, std::io::Error>(out)
            })
            .await?;
            let version = answer
                .lines()
                .find_map(|l| l.strip_prefix("Zookeeper version: "))
                .map(|v| v.split([',', '-']).next().unwrap_or(v).trim().to_owned())
                .unwrap_or_else(|| "unknown (the srvr command is not whitelisted)".to_owned());
            Ok(format!("ZooKeeper {version}"))
        }
        #[cfg(feature = "etcd")]
        Kind::Etcd => {
            let mut client = etcd_connect(&parts, timeout).await?;
            let status = bounded(timeout, "etcd status", client.status()).await?;
            Ok(format!("etcd {}", status.version()))
        }
        #[cfg(feature = "mysql")]
        Kind::Mysql => {
            use sqlx::Connection as _;
            let mut conn = mysql_connect(&parts, timeout).await?;
            let version: String = sqlx::query_scalar("SELECT VERSION()")
                .fetch_one(&mut conn)
                .await
                .map_err(err)?;
            let _ = conn.close().await;
            let flavour = if version.to_ascii_lowercase().contains("mariadb") {
                "MariaDB"
            } else {
                "MySQL"
            };
            let number = version.split('-').next().unwrap_or(&version);
            Ok(format!("{flavour} {number}"))
        }
        #[cfg(feature = "postgres")]
        Kind::Postgres => {
            use sqlx::Connection as _;
            let mut conn = pg_connect(&parts, timeout).await?;
            let version: String = sqlx::query_scalar("SHOW server_version")
                .fetch_one(&mut conn)
                .await
                .map_err(err)?;
            let _ = conn.close().await;
            let number = version.split_whitespace().next().unwrap_or(&version);
            Ok(format!("PostgreSQL {number}"))
        }
        #[allow(unreachable_patterns)]
        other => Err(format!("lockbench was built without its `{other}` feature")),
    }
}
