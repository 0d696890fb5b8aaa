//! What a run left on the servers, read with each server's own client: lock keys, nodes
//! rows and advisory locks whose name starts with the run's key stem. Fence counters, which outlive
//! holders by design, are not residue, nor are ZooKeeper's empty key directories and a
//! semaphore's empty `locks` and `leases` directories (container nodes left for the server's
//! reaper; see dlock-zookeeper's Release and Permits).

use std::time::Duration;

use dlock_redis::RedisConfig;

/// How long one server may take to answer the residue check.
const LIMIT: Duration = Duration::from_secs(15);

/// Lock state under `stem` on the servers of `url`, one line per leftover.
pub(crate) async fn residue(url: &str, stem: &str) -> Result<Vec<String>, String> {
    let scheme = url
        .split_once("://")
        .map_or("", |(s, _)| s)
        .to_ascii_lowercase();
    let check = async {
        match scheme.as_str() {
            "redis" | "rediss" => {
                let config = RedisConfig::from_url(url).map_err(|e| e.to_string())?;
                redis_keys(&[config], stem).await
            }
            "redlock" | "redlocks" => {
                let config =
                    dlock_redlock::RedlockConfig::from_url(url).map_err(|e| e.to_string())?;
                redis_keys(&config.nodes, stem).await
            }
            "zk" | "zookeeper" => zookeeper_nodes(url, stem).await,
            "etcd" | "etcds" => etcd_keys(url, stem).await,
            "mysql" | "mariadb" => mysql_rows(url, stem).await,
            "postgres" | "postgresql" => postgres_locks(url, stem).await,
            // In-process: nothing on a server.
            _ => Ok(Vec::new()),
        }
    };
    tokio::time::timeout(LIMIT, check)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {LIMIT:?}")))
}

async fn redis_keys(nodes: &[RedisConfig], stem: &str) -> Result<Vec<String>, String> {
    let mut left = Vec::new();
    for node in nodes {
        let scheme = if node.tls { "rediss" } else { "redis" };
        let mut url = url::Url::parse(&format!("{scheme}://{}/{}", node.addr(), node.db))
            .map_err(|e| format!("{}: {e}", node.addr()))?;
        if let Some(user) = &node.username {
            let _ = url.set_username(user);
        }
        if let Some(password) = &node.password {
            let _ = url.set_password(Some(password.expose()));
        }
        let client =
            redis::Client::open(url.as_str()).map_err(|e| format!("{}: {e}", node.addr()))?;
        let mut con = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("{}: {e}", node.addr()))?;
        // Lock keys are `<prefix><key>`; fence keys `{<prefix><key>}:fence` do not match.
        let pattern = format!("{}{stem}*", node.prefix);
        let mut cursor = 0u64;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut con)
                .await
                .map_err(|e| format!("{}: SCAN: {e}", node.addr()))?;
            left.extend(
                keys.into_iter()
                    .map(|k| format!("{}: key {k}", node.addr())),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(left)
}

async fn zookeeper_nodes(url: &str, stem: &str) -> Result<Vec<String>, String> {
    let config = dlock_zookeeper::ZookeeperConfig::from_url(url).map_err(|e| e.to_string())?;
    let zk = zookeeper_client::Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(&config.hosts.join(","))
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let dirs = match zk.list_children(&config.base).await {
        Ok(dirs) => dirs,
        Err(zookeeper_client::Error::NoNode) => return Ok(Vec::new()),
        Err(e) => return Err(format!("list {}: {e}", config.base)),
    };
    let mut left = Vec::new();
    for dir in dirs.into_iter().filter(|d| d.starts_with(stem)) {
        let path = format!("{}/{dir}", config.base);
        for child in zookeeper_children(&zk, &path).await? {
            // A semaphore's `locks` and `leases` containers are left to the reaper like the
            // key directory; what is inside them is residue.
            if child == "locks" || child == "leases" {
                let inner = format!("{path}/{child}");
                let nodes = zookeeper_children(&zk, &inner).await?;
                left.extend(nodes.into_iter().map(|c| format!("node {inner}/{c}")));
            } else {
                left.push(format!("node {path}/{child}"));
            }
        }
    }
    Ok(left)
}

/// The children of `path`; none when it is gone (reaped meanwhile).
async fn zookeeper_children(
    zk: &zookeeper_client::Client,
    path: &str,
) -> Result<Vec<String>, String> {
    match zk.list_children(path).await {
        Ok(children) => Ok(children),
        Err(zookeeper_client::Error::NoNode) => Ok(Vec::new()),
        Err(e) => Err(format!("list {path}: {e}")),
    }
}

async fn etcd_keys(url: &str, stem: &str) -> Result<Vec<String>, String> {
    let config = dlock_etcd::EtcdConfig::from_url(url).map_err(|e| e.to_string())?;
    let mut client = etcd_client::Client::connect(config.endpoints(), None)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let keys = client
        .get(
            config.lock_name(stem),
            Some(
                etcd_client::GetOptions::new()
                    .with_prefix()
                    .with_keys_only(),
            ),
        )
        .await
        .map_err(|e| format!("get: {e}"))?;
    Ok(keys
        .kvs()
        .iter()
        .map(|kv| format!("key {}", String::from_utf8_lossy(kv.key())))
        .collect())
}

async fn mysql_rows(url: &str, stem: &str) -> Result<Vec<String>, String> {
    use sqlx::Connection;
    let config = dlock_mysql::MysqlConfig::from_url(url).map_err(|e| e.to_string())?;
    let mut options = sqlx::mysql::MySqlConnectOptions::new()
        .host(&config.host)
        .port(config.port)
        .username(&config.user)
        .database(&config.database);
    if let Some(password) = &config.password {
        options = options.password(password.expose());
    }
    let mut conn = sqlx::mysql::MySqlConnection::connect_with(&options)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let sql = format!(
        "SELECT CAST(name AS CHAR) FROM `{}` WHERE name LIKE ?",
        config.table
    );
    let pattern = format!("{stem}%");
    let all: Vec<String> = sqlx::query_scalar(&sql)
        .bind(&pattern)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| format!("{sql}: {e}"))?;
    // Rows nobody locks stay for the key's next use: only locked rows are residue.
    let free_sql = format!("{sql} FOR UPDATE SKIP LOCKED");
    sqlx::query("BEGIN")
        .execute(&mut conn)
        .await
        .map_err(|e| format!("BEGIN: {e}"))?;
    let free: Vec<String> = sqlx::query_scalar(&free_sql)
        .bind(&pattern)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| format!("{free_sql}: {e}"))?;
    let _ = conn.close().await;
    Ok(all
        .into_iter()
        .filter(|r| !free.contains(r))
        .map(|r| format!("row {r}"))
        .collect())
}

/// Advisory locks held or waited for on keys under `stem` (the key table's rows, one per
/// key ever locked, stay by design and are not residue).
async fn postgres_locks(url: &str, stem: &str) -> Result<Vec<String>, String> {
    use sqlx::Connection;
    let config = dlock_postgres::PostgresConfig::from_url(url).map_err(|e| e.to_string())?;
    let mut options = sqlx::postgres::PgConnectOptions::new_without_pgpass()
        .host(&config.host)
        .port(config.port)
        .username(&config.user)
        .database(&config.database);
    if let Some(password) = &config.password {
        options = options.password(password.expose());
    }
    let mut conn = sqlx::postgres::PgConnection::connect_with(&options)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let sql = format!(
        "SELECT k.name || CASE WHEN l.granted THEN ' (held)' ELSE ' (waited for)' END \
         FROM pg_locks l JOIN {} k ON l.locktype = 'advisory' AND l.objsubid = 2 \
         AND l.classid = ($2::int)::oid AND l.objid = k.id::oid \
         WHERE left(k.name, length($1)) = $1",
        config.table
    );
    let rows: Vec<String> = sqlx::query_scalar(&sql)
        .bind(stem)
        .bind(config.namespace)
        .fetch_all(&mut conn)
        .await
        .map_err(|e| format!("{sql}: {e}"))?;
    let _ = conn.close().await;
    Ok(rows.into_iter().map(|r| format!("lock {r}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock::LockOptions;

    /// A held key shows as residue on each backend's server, and nothing once released.
    /// (Redlock reads its nodes as Redis does; it is left out here because fault tests stop
    /// its nodes at any time. The torture runs read it.)
    #[tokio::test]
    async fn a_held_key_is_found_and_a_released_one_is_not() {
        let servers = [
            ("DLOCK_REDIS_URL", "redis://127.0.0.1:6379", "redis"),
            ("DLOCK_ZK_URL", "zk://127.0.0.1:2181", "zookeeper"),
            ("DLOCK_ETCD_URL", "etcd://127.0.0.1:2379", "etcd"),
            (
                "DLOCK_MYSQL_URL",
                "mysql://dlock:dlock@127.0.0.1:3306/dlock",
                "mariadb",
            ),
            (
                "DLOCK_POSTGRES_URL",
                "postgres://dlock:dlock@127.0.0.1:5432/dlock",
                "postgres",
            ),
        ];
        for (var, default, setup) in servers {
            let url = std::env::var(var).unwrap_or_else(|_| default.to_owned());
            let stem = format!("torture-test{:08x}-", rand::random::<u32>());
            let lock = dlock::connect(&url).await.unwrap_or_else(|e| {
                panic!("cannot reach {url}: {e}; start it with scripts/backends up {setup}")
            });
            let lease = lock
                .try_acquire(&format!("{stem}k0"), &LockOptions::new())
                .await
                .expect("try_acquire")
                .expect("a fresh key is free");
            let held = residue(&url, &stem).await.expect("read the server");
            assert!(!held.is_empty(), "{setup}: a held key is not seen");
            assert!(held.iter().all(|l| l.contains(&stem)), "{setup}: {held:?}");
            lease.release().await.expect("release");
            let left = residue(&url, &stem).await.expect("read the server");
            assert!(left.is_empty(), "{setup}: left after release: {left:?}");
        }
    }
}
