//! The PostgreSQL harness: clients of the server `DLOCK_POSTGRES_URL` names (default
//! `postgres://dlock:dlock@127.0.0.1:5432/dlock`), and the raw access the suite's fault
//! hooks and the backend's own tests need.

#![allow(dead_code, unreachable_pub)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::Harness;
use dlock_core::{BoxError, DistributedLock, ErrorKind, Result};
use dlock_postgres::PostgresConfig;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Row};

pub mod reentry;

/// SQL: lock `l`'s first number is the namespace `$2` or one of the permit slots after it
/// (`namespace + s` for s < `Mode::MAX_PERMITS`, wrapping as unsigned 32-bit numbers).
pub const SLOT_CLASS: &str = "((l.classid::bigint - (($2::int)::bigint + 4294967296) % 4294967296 \
     + 4294967296) % 4294967296) < 10000";

pub const DEFAULT_URL: &str = "postgres://dlock:dlock@127.0.0.1:5432/dlock";

pub struct PostgresHarness {
    url: String,
    config: PostgresConfig,
}

impl PostgresHarness {
    pub fn from_env() -> Self {
        dlock_conformance::init_tracing();
        let url = dlock_conformance::env_url("DLOCK_POSTGRES_URL", DEFAULT_URL);
        let config = PostgresConfig::from_url(&url)
            .unwrap_or_else(|e| panic!("DLOCK_POSTGRES_URL={url:?} is not usable: {e}"));
        Self { url, config }
    }

    /// Wait until no session holds or waits for `key` (up to 5 s); fail naming who does.
    pub async fn assert_no_session_on(&self, key: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            let held = self.sessions_on(key, true).await.expect("pg_locks");
            let waiting = self.sessions_on(key, false).await.expect("pg_locks");
            if held.is_empty() && waiting.is_empty() {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{key}: held by {held:?}, waited for by {waiting:?}"
            );
            // The poll's interval, until the deadline.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A client of the test server; a server that cannot be used fails the test, naming
    /// it and the command that starts it.
    pub async fn must_client(&self) -> std::sync::Arc<dyn dlock_core::DistributedLock> {
        self.client().await.unwrap_or_else(|e| {
            panic!(
                "cannot use the PostgreSQL server at {}: {e}\n  start it with: scripts/backends up postgres",
                self.config().addr()
            )
        })
    }

    pub fn config(&self) -> &PostgresConfig {
        &self.config
    }

    /// A raw connection to the server, for fault hooks and checks.
    pub async fn admin(&self) -> Result<PgConnection, BoxError> {
        let mut options = PgConnectOptions::new_without_pgpass()
            .host(&self.config.host)
            .port(self.config.port)
            .username(&self.config.user)
            .database(&self.config.database)
            .disable_statement_logging();
        if let Some(password) = &self.config.password {
            options = options.password(password.expose());
        }
        Ok(tokio::time::timeout(Duration::from_secs(5), options.connect()).await??)
    }

    /// The lock id the key table gives `key`, if any.
    pub async fn id_of(&self, key: &str) -> Result<Option<i32>, BoxError> {
        let mut admin = self.admin().await?;
        let sql = format!("SELECT id FROM {} WHERE name = $1", self.config.table);
        let row = sqlx::query(&sql)
            .bind(key)
            .fetch_optional(&mut admin)
            .await?;
        Ok(row.map(|r| r.try_get::<i32, _>(0)).transpose()?)
    }

    /// Backend pids holding (`granted`) or waiting for `key`'s advisory lock.
    pub async fn sessions_on(&self, key: &str, granted: bool) -> Result<Vec<i32>, BoxError> {
        let mut admin = self.admin().await?;
        let sql = format!(
            "SELECT l.pid FROM pg_locks l JOIN {} k \
             ON l.locktype = 'advisory' AND l.objsubid = 2 \
             AND {SLOT_CLASS} AND l.objid = k.id::oid \
             WHERE k.name = $1 AND l.granted = $3 AND l.database = \
             (SELECT oid FROM pg_database WHERE datname = current_database())",
            self.config.table
        );
        let rows = sqlx::query(&sql)
            .bind(key)
            .bind(self.config.namespace)
            .bind(granted)
            .fetch_all(&mut admin)
            .await?;
        Ok(rows
            .iter()
            .map(|r| r.try_get::<i32, _>(0))
            .collect::<std::result::Result<_, _>>()?)
    }

    /// The permit slots of `key` held now, as (backend pid, slot), by slot.
    pub async fn slots_of(&self, key: &str) -> Result<Vec<(i32, i64)>, BoxError> {
        let mut admin = self.admin().await?;
        let sql = format!(
            "SELECT l.pid, (l.classid::bigint - (($2::int)::bigint + 4294967296) % 4294967296 \
               + 4294967296) % 4294967296 AS slot \
             FROM pg_locks l JOIN {} k \
             ON l.locktype = 'advisory' AND l.objsubid = 2 \
             AND {SLOT_CLASS} AND l.objid = k.id::oid \
             WHERE k.name = $1 AND l.granted ORDER BY slot",
            self.config.table
        );
        let rows = sqlx::query(&sql)
            .bind(key)
            .bind(self.config.namespace)
            .fetch_all(&mut admin)
            .await?;
        Ok(rows
            .iter()
            .map(|r| Ok((r.try_get::<i32, _>(0)?, r.try_get::<i64, _>(1)?)))
            .collect::<std::result::Result<_, sqlx::Error>>()?)
    }

    /// Whether backend `pid` still exists.
    pub async fn session_exists(&self, pid: i32) -> Result<bool, BoxError> {
        let mut admin = self.admin().await?;
        let row = sqlx::query("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(&mut admin)
            .await?;
        Ok(row.try_get::<i64, _>(0)? > 0)
    }

    /// The last statement backend `pid` ran (or runs), as `pg_stat_activity` shows it.
    pub async fn last_statement(&self, pid: i32) -> Result<String, BoxError> {
        let mut admin = self.admin().await?;
        let row = sqlx::query("SELECT coalesce(query, '') FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(&mut admin)
            .await?;
        Ok(row.try_get::<String, _>(0)?)
    }

    /// `pg_terminate_backend(pid)` and wait until the session is gone (its locks freed).
    pub async fn kill_session(&self, pid: i32) -> Result<(), BoxError> {
        let mut admin = self.admin().await?;
        sqlx::query("SELECT pg_terminate_backend($1)")
            .bind(pid)
            .execute(&mut admin)
            .await?;
        admin.close().await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.session_exists(pid).await? {
            if tokio::time::Instant::now() > deadline {
                return Err(format!("session {pid} still exists 10 s after termination").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

#[async_trait]
impl Harness for PostgresHarness {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(dlock_postgres::from_url(url).await?))
    }

    fn bad_urls(&self) -> Vec<(String, ErrorKind)> {
        let c = &self.config;
        let at = format!("{}:{}", c.host, c.port);
        vec![
            (
                format!("postgres://{}:wrong-password@{at}/{}", c.user, c.database),
                ErrorKind::Backend,
            ),
            (
                format!("postgres://{}:dlock@{at}/no_such_database", c.user),
                ErrorKind::Backend,
            ),
            (
                format!("postgres://{}:dlock@{at}", c.user),
                ErrorKind::InvalidConfig,
            ),
            (
                format!(
                    "postgres://{}:dlock@{at}/{}?table=bad-name",
                    c.user, c.database
                ),
                ErrorKind::InvalidConfig,
            ),
            (
                format!(
                    "postgres://{}:dlock@{at}/{}?colour=blue",
                    c.user, c.database
                ),
                ErrorKind::InvalidConfig,
            ),
            (
                format!(
                    "postgres://{}:dlock@{at}/{}?sslmode=require",
                    c.user, c.database
                ),
                ErrorKind::Backend,
            ),
            (
                "postgres://dlock:secret-pw@/dlock".to_owned(),
                ErrorKind::InvalidConfig,
            ),
            (
                "mysql://127.0.0.1:3306/x".to_owned(),
                ErrorKind::InvalidConfig,
            ),
            ("not a url".to_owned(), ErrorKind::InvalidConfig),
            // A server of another kind (Redis) answers the startup message with text that
            // is not the PostgreSQL protocol.
            (
                "postgres://dlock:secret-pw@127.0.0.1:6379/dlock?connect_timeout=1s".to_owned(),
                ErrorKind::Unavailable,
            ),
        ]
    }

    async fn break_lease(&self, key: &str) -> Result<(), BoxError> {
        let holders = self.sessions_on(key, true).await?;
        let [pid] = holders[..] else {
            return Err(format!("{key:?} has holders {holders:?}, expected one").into());
        };
        self.kill_session(pid).await
    }

    async fn residue(&self, prefix: &str) -> Result<Vec<String>, BoxError> {
        let mut admin = self.admin().await?;
        let sql = format!(
            "SELECT k.name || CASE WHEN l.granted THEN ' (held)' ELSE ' (waited for)' END \
             FROM pg_locks l JOIN {} k \
             ON l.locktype = 'advisory' AND l.objsubid = 2 \
             AND {SLOT_CLASS} AND l.objid = k.id::oid \
             WHERE left(k.name, length($1)) = $1",
            self.config.table
        );
        let rows = sqlx::query(&sql)
            .bind(prefix)
            .bind(self.config.namespace)
            .fetch_all(&mut admin)
            .await?;
        let mut left: Vec<String> = rows
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<std::result::Result<_, _>>()?;
        left.extend(self.owner_rows(prefix, false).await?);
        Ok(left)
    }
}

impl PostgresHarness {
    /// The owner table's rows (reentrant holds' counts) of the keys starting with `prefix`,
    /// as `name (owner row: OWNER, count N)`. Without `stale`, a row whose session has
    /// ended (a crashed or killed holder: ignored by the backend, replaced by the key's
    /// next owner hold, deleted at the next connect) is left out; every other row is a
    /// hold's, live or left behind.
    pub async fn owner_rows(&self, prefix: &str, stale: bool) -> Result<Vec<String>, BoxError> {
        let mut admin = self.admin().await?;
        let owners = format!("{}_owner", self.config.table);
        let exists: bool =
            sqlx::query_scalar(&format!("SELECT to_regclass('{owners}') IS NOT NULL"))
                .fetch_one(&mut admin)
                .await?;
        if !exists {
            return Ok(Vec::new());
        }
        let sql = format!(
            "SELECT k.name || ' (owner row: ' || o.owner || ', count ' || o.holds || ')' \
             FROM {owners} o JOIN {table} k ON k.id = o.id \
             WHERE o.ns = $2 AND left(k.name, length($1)) = $1 \
             AND ($3 OR (o.started = pg_postmaster_start_time() \
               AND EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = o.pid))) \
             ORDER BY k.name",
            table = self.config.table
        );
        let rows = sqlx::query(&sql)
            .bind(prefix)
            .bind(self.config.namespace)
            .bind(stale)
            .fetch_all(&mut admin)
            .await?;
        Ok(rows
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<std::result::Result<_, _>>()?)
    }
}
