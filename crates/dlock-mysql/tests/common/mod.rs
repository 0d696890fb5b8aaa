//! The MySQL / MariaDB harness: clients of the server `DLOCK_MYSQL_URL` names (default
//! `mysql://dlock:dlock@127.0.0.1:3306/dlock`), or of a private TLS server ([`tls`]), and
//! the raw access the suite's fault hooks and the backend's own tests need.

#![allow(dead_code, unreachable_pub)]

pub mod tls;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use dlock_conformance::Harness;
use dlock_core::raw::key;
use dlock_core::{BoxError, DistributedLock, ErrorKind, Result};
use dlock_mysql::{LockMode, MysqlConfig};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection, MySqlSslMode};
use sqlx::{ConnectOptions, Executor, Row};

pub const DEFAULT_URL: &str = "mysql://dlock:dlock@127.0.0.1:3306/dlock";

pub struct MysqlHarness {
    url: String,
    config: MysqlConfig,
    /// The private TLS server's directory (its CA), when the harness tests that server.
    tls: Option<std::path::PathBuf>,
}

impl MysqlHarness {
    pub fn from_env() -> Self {
        dlock_conformance::init_tracing();
        let url = dlock_conformance::env_url("DLOCK_MYSQL_URL", DEFAULT_URL);
        let config = MysqlConfig::from_url(&url)
            .unwrap_or_else(|e| panic!("DLOCK_MYSQL_URL={url:?} is not usable: {e}"));
        Self {
            url,
            config,
            tls: None,
        }
    }

    /// Clients of the same server in named-lock mode (`mode=named` added to the URL).
    pub fn named() -> Self {
        let mut harness = Self::from_env();
        let sep = if harness.url.contains('?') { '&' } else { '?' };
        harness.url = format!("{}{sep}mode=named", harness.url);
        harness.config = MysqlConfig::from_url(&harness.url).expect("the named-mode URL parses");
        harness
    }

    /// Clients of this process's private TLS server ([`tls::TlsMariadb::shared`], started
    /// on first use), verified against its test CA (`ssl-mode=verify_identity`).
    pub fn tls() -> Self {
        dlock_conformance::init_tracing();
        let server = tls::TlsMariadb::shared();
        let url = server.verified_url();
        let config = MysqlConfig::from_url(&url).expect("the TLS URL parses");
        Self {
            url,
            config,
            tls: Some(server.dir().to_owned()),
        }
    }

    /// A client of the test server; a server that cannot be used fails the test, naming
    /// it and the command that starts it.
    pub async fn must_client(&self) -> std::sync::Arc<dyn dlock_core::DistributedLock> {
        self.client().await.unwrap_or_else(|e| {
            panic!(
                "cannot use the MySQL/MariaDB server at {}: {e}\n  start it with: scripts/backends up mariadb",
                self.config().addr()
            )
        })
    }

    pub fn config(&self) -> &MysqlConfig {
        &self.config
    }

    /// A raw connection to the server, for fault hooks and checks.
    pub async fn admin(&self) -> Result<MySqlConnection, BoxError> {
        let mut options = MySqlConnectOptions::new()
            .host(&self.config.host)
            .port(self.config.port)
            .username(&self.config.user)
            .database(&self.config.database)
            .disable_statement_logging();
        if let Some(password) = &self.config.password {
            options = options.password(password.expose());
        }
        if let Some(dir) = &self.tls {
            options = options
                .ssl_mode(MySqlSslMode::VerifyIdentity)
                .ssl_ca(dir.join("ca.pem"));
        }
        Ok(tokio::time::timeout(Duration::from_secs(5), options.connect()).await??)
    }

    /// The connection id that holds `key`: in named mode as the backend records it in the
    /// fence table (the latest holder), in row mode the session whose transaction locks
    /// the row, if any (see [`Self::row_holder`]).
    pub async fn holder_of(&self, key: &str) -> Result<Option<u64>, BoxError> {
        if self.config.mode == LockMode::Row {
            return self.row_holder(key).await;
        }
        let mut admin = self.admin().await?;
        let sql = format!(
            "SELECT holder FROM `{}` WHERE name = {}",
            self.config.fence_table(),
            literal(&row_name(key))
        );
        let row = admin.fetch_optional(sql.as_str()).await?;
        Ok(row.map(|r| r.try_get::<u64, _>(0)).transpose()?)
    }

    /// The session whose transaction locks `key`'s row. MySQL 8 lists granted row locks in
    /// `performance_schema.data_locks`; MariaDB shows a lock only while someone waits for
    /// it, so a probe transaction waits for the row (at most 1 s) while another connection
    /// reads who blocks it. `None` when the probe gets the row (nobody holds it).
    pub async fn row_holder(&self, key: &str) -> Result<Option<u64>, BoxError> {
        let name = row_name(key);
        let mut watch = self.admin().await?;
        let mysql = format!(
            "SELECT CAST(t.PROCESSLIST_ID AS UNSIGNED) FROM performance_schema.data_locks l \
             JOIN performance_schema.threads t ON t.THREAD_ID = l.THREAD_ID \
             WHERE l.OBJECT_SCHEMA = '{}' AND l.OBJECT_NAME = '{}' AND l.LOCK_TYPE = 'RECORD' \
               AND l.LOCK_STATUS = 'GRANTED' AND l.LOCK_DATA = '{}'",
            self.config.database,
            self.config.table,
            hex_data(&name)
        );
        if let Ok(row) = watch.fetch_optional(mysql.as_str()).await {
            return Ok(row.map(|r| r.try_get::<u64, _>(0)).transpose()?);
        }
        let mut probe = self.admin().await?;
        let probe_id: u64 = probe
            .fetch_one("SELECT CAST(CONNECTION_ID() AS UNSIGNED)")
            .await?
            .try_get(0)?;
        probe
            .execute("SET SESSION innodb_lock_wait_timeout = 1")
            .await?;
        probe.execute("BEGIN").await?;
        let lock = format!(
            "SELECT 1 FROM `{}` WHERE name = {} FOR UPDATE",
            self.config.table,
            literal(&name)
        );
        let blocker = format!(
            "SELECT CAST(b.trx_mysql_thread_id AS UNSIGNED) \
             FROM information_schema.INNODB_LOCK_WAITS w \
             JOIN information_schema.INNODB_TRX r ON r.trx_id = w.requesting_trx_id \
             JOIN information_schema.INNODB_TRX b ON b.trx_id = w.blocking_trx_id \
             WHERE r.trx_mysql_thread_id = {probe_id}"
        );
        let found = {
            let waiting = probe.fetch_optional(lock.as_str());
            tokio::pin!(waiting);
            loop {
                tokio::select! {
                    // The probe got the row (nobody holds it) or gave up.
                    _ = &mut waiting => break None,
                    // MariaDB refreshes its lock tables at most every 0.1 s.
                    () = tokio::time::sleep(Duration::from_millis(120)) => {
                        if let Some(row) = watch.fetch_optional(blocker.as_str()).await? {
                            break Some(row.try_get::<u64, _>(0)?);
                        }
                    }
                }
            }
        };
        // Closing the probe's connection rolls back its wait (or its lock).
        drop(probe);
        Ok(found)
    }

    /// Poll (up to 3 s) until exactly `n` sessions wait for `key`'s row lock.
    pub async fn wait_for_waiters(&self, key: &str, n: u64) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
        while self.waiters_on(key).await.expect("lock waits") != n {
            if tokio::time::Instant::now() > deadline {
                return false;
            }
            // Longer than MariaDB's 0.1 s refresh of its lock tables (see `waiters_on`).
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        true
    }

    /// Sessions waiting for the row lock of `key` (MariaDB's `information_schema` lock
    /// tables, or MySQL 8's `performance_schema.data_locks`).
    ///
    /// MariaDB refreshes its `INNODB_*` tables only when they were not read for 0.1 s:
    /// callers that poll must wait longer than that between calls.
    pub async fn waiters_on(&self, key: &str) -> Result<u64, BoxError> {
        let mut admin = self.admin().await?;
        let table = format!("`{}`.`{}`", self.config.database, self.config.table);
        let data = hex_data(&row_name(key));
        let mariadb = format!(
            "SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS w \
             JOIN information_schema.INNODB_LOCKS l ON l.lock_id = w.requested_lock_id \
             WHERE l.lock_table = '{table}' AND l.lock_data = '{data}'"
        );
        let count = match admin.fetch_one(mariadb.as_str()).await {
            Ok(row) => row.try_get::<i64, _>(0)?,
            Err(_) => {
                let mysql = format!(
                    "SELECT COUNT(*) FROM performance_schema.data_locks \
                     WHERE OBJECT_SCHEMA = '{}' AND OBJECT_NAME = '{}' \
                     AND LOCK_STATUS = 'WAITING' AND LOCK_DATA = '{data}'",
                    self.config.database, self.config.table
                );
                admin
                    .fetch_one(mysql.as_str())
                    .await?
                    .try_get::<i64, _>(0)?
            }
        };
        Ok(u64::try_from(count)?)
    }

    /// Whether session `id` still exists on the server.
    pub async fn session_exists(&self, id: u64) -> Result<bool, BoxError> {
        let mut admin = self.admin().await?;
        let sql = format!("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE ID = {id}");
        Ok(admin.fetch_one(sql.as_str()).await?.try_get::<i64, _>(0)? > 0)
    }

    /// `KILL` session `id` and wait until the server has ended it (its transaction rolled
    /// back).
    pub async fn kill_session(&self, id: u64) -> Result<(), BoxError> {
        let mut admin = self.admin().await?;
        admin.execute(format!("KILL {id}").as_str()).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while self.session_exists(id).await? {
            if tokio::time::Instant::now() > deadline {
                return Err(format!("session {id} still exists 10 s after KILL").into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }
}

/// The backend's row name for `key` (its `sql::row_name`, which is private): readable
/// characters kept, the rest percent-escaped, long names shortened with a digest.
pub fn row_name(k: &str) -> String {
    let readable = |c: char| c.is_ascii_alphanumeric() || "-_./:@+=,~".contains(c);
    key::shorten(&key::escape(k, readable), 255)
}

/// The smallest name greater than every name starting with `prefix` (row names are
/// ASCII), or `None` when there is none.
fn upper_bound(prefix: &str) -> Option<String> {
    let mut bytes = prefix.as_bytes().to_vec();
    while let Some(last) = bytes.pop() {
        if last < 0x7F {
            bytes.push(last + 1);
            return String::from_utf8(bytes).ok();
        }
    }
    None
}

/// The SQL literal of a row name, as the backend writes it (`X'…'`).
pub fn literal(name: &str) -> String {
    format!("X'{}'", hex(name))
}

fn hex(name: &str) -> String {
    name.bytes().map(|b| format!("{b:02X}")).collect()
}

/// How MariaDB's `INNODB_LOCKS.lock_data` shows a binary key.
fn hex_data(name: &str) -> String {
    format!("0x{}", hex(name))
}

#[async_trait]
impl Harness for MysqlHarness {
    fn name(&self) -> &'static str {
        "mysql"
    }

    fn setup(&self) -> &'static str {
        "mariadb"
    }

    fn url(&self) -> String {
        self.url.clone()
    }

    async fn connect(&self, url: &str) -> Result<Arc<dyn DistributedLock>> {
        Ok(Arc::new(dlock_mysql::from_url(url).await?))
    }

    fn bad_urls(&self) -> Vec<(String, ErrorKind)> {
        let c = &self.config;
        let at = format!("{}:{}", c.host, c.port);
        if let Some(dir) = &self.tls {
            return tls_bad_urls(c, &at, dir);
        }
        vec![
            (
                format!("mysql://{}:wrong-password@{at}/{}", c.user, c.database),
                ErrorKind::Backend,
            ),
            (
                format!("mysql://{}:dlock@{at}", c.user),
                ErrorKind::InvalidConfig,
            ),
            (
                format!(
                    "mysql://{}:dlock@{at}/{}?table=bad-name",
                    c.user, c.database
                ),
                ErrorKind::InvalidConfig,
            ),
            (
                format!("mysql://{}:dlock@{at}/{}?colour=blue", c.user, c.database),
                ErrorKind::InvalidConfig,
            ),
            (
                format!(
                    "mysql://{}:dlock@{at}/{}?ssl-mode=required",
                    c.user, c.database
                ),
                ErrorKind::Backend,
            ),
            (
                "mysql://dlock:secret-pw@/dlock".to_owned(),
                ErrorKind::InvalidConfig,
            ),
            (
                "redis://127.0.0.1:6379".to_owned(),
                ErrorKind::InvalidConfig,
            ),
            ("not a url".to_owned(), ErrorKind::InvalidConfig),
            // A server of another kind (Redis) never greets: nothing answers within the
            // connect timeout.
            (
                "mysql://dlock:secret-pw@127.0.0.1:6379/dlock?connect_timeout=1s".to_owned(),
                ErrorKind::Unavailable,
            ),
        ]
    }

    async fn break_lease(&self, key: &str) -> Result<(), BoxError> {
        let id = self
            .holder_of(key)
            .await?
            .ok_or_else(|| format!("no holder recorded for {key:?}"))?;
        self.kill_session(id).await
    }

    /// Rows of keys, and permit slots (`name#slot`), starting with `prefix` that some
    /// session still locks, named-mode leaders' values (`value:name`) left in
    /// `{table}_value`, and reentrant holds' rows left in `{table}_owner` (see
    /// [`Self::owner_rows`]). Not residue: rows and slots nobody locks, which stay for the
    /// key's next use (one per key or slot ever locked, as the fence counters), and the
    /// fence table and token sequence.
    async fn residue(&self, prefix: &str) -> Result<Vec<String>, BoxError> {
        let mut locked = self.locked_rows(&self.config.table, "name", prefix).await?;
        let slots = "CONCAT(name, '#', slot)";
        locked.extend(
            self.locked_rows(&self.config.slots_table(), slots, prefix)
                .await?,
        );
        let escaped = row_name(prefix);
        let values = format!(
            "SELECT CAST(CONCAT('value:', name) AS CHAR) FROM `{}` WHERE LEFT(name, {}) = {}",
            self.config.value_table(),
            escaped.len(),
            literal(&escaped)
        );
        for row in self.admin().await?.fetch_all(values.as_str()).await? {
            locked.push(row.try_get::<String, _>(0)?);
        }
        locked.extend(self.owner_rows(prefix).await?);
        Ok(locked)
    }
}

impl MysqlHarness {
    /// Reentrant holds' rows (`owner:name entries=n`) of keys starting with `prefix` in
    /// `{table}_owner` whose hold is current (the key is still held) or ended (no entry
    /// left, yet the row stays). Not residue: the row of a hold whose holder crashed
    /// (stale: ignored, and overwritten by the key's next owner hold).
    pub async fn owner_rows(&self, prefix: &str) -> Result<Vec<String>, BoxError> {
        let escaped = row_name(prefix);
        let t = &self.config.table;
        let current = match self.config.mode {
            LockMode::Row => format!(
                "EXISTS (SELECT 1 FROM `{t}_held` h WHERE h.name = o.name AND h.token = o.token)"
            ),
            LockMode::Named => format!(
                "EXISTS (SELECT 1 FROM `{t}_fence` f WHERE f.name = o.name AND f.fence = o.token \
                 AND f.holder = IS_USED_LOCK(CONCAT('dlock:', \
                   LEFT(SHA2(CONCAT('{t}', X'00', o.name), 256), 58))))"
            ),
        };
        let sql = format!(
            "SELECT CAST(CONCAT('owner:', o.name, ' entries=', o.entries) AS CHAR) \
             FROM `{t}_owner` o WHERE LEFT(o.name, {}) = {} AND (o.entries = 0 OR {current})",
            escaped.len(),
            literal(&escaped)
        );
        let mut admin = self.admin().await?;
        admin
            .execute("SET TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
            .await?;
        let rows = admin.fetch_all(sql.as_str()).await?;
        Ok(rows
            .iter()
            .map(|r| r.try_get::<String, _>(0))
            .collect::<std::result::Result<_, _>>()?)
    }

    /// Every row of `{table}_owner` for keys starting with `prefix`, stale ones too:
    /// `(name, owner, token, entries)`.
    pub async fn all_owner_rows(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, String, u64, u32)>, BoxError> {
        let escaped = row_name(prefix);
        let sql = format!(
            "SELECT CAST(name AS CHAR), CAST(owner AS CHAR), token, entries \
             FROM `{}_owner` WHERE LEFT(name, {}) = {} ORDER BY name",
            self.config.table,
            escaped.len(),
            literal(&escaped)
        );
        let rows = self.admin().await?.fetch_all(sql.as_str()).await?;
        rows.iter()
            .map(|r| Ok((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?, r.try_get(3)?)))
            .collect()
    }

    /// `what` of the rows of `table` whose name starts with `prefix`'s row name and that
    /// some session locks.
    async fn locked_rows(
        &self,
        table: &str,
        what: &str,
        prefix: &str,
    ) -> Result<Vec<String>, BoxError> {
        let escaped = row_name(prefix);
        let mut admin = self.admin().await?;
        // A range of the primary key first, so the locking probe below scans (and, for a
        // moment, locks) this prefix's rows only: a full scan would lock other scenarios'
        // free rows too, and a `try_acquire` of one of them at that moment finds it busy.
        let range = match upper_bound(&escaped) {
            Some(upper) => format!(
                "name >= {} AND name < {} AND ",
                literal(&escaped),
                literal(&upper)
            ),
            None => format!("name >= {} AND ", literal(&escaped)),
        };
        let select = format!(
            "SELECT CAST({what} AS CHAR) FROM `{table}` WHERE {range}LEFT(name, {}) = {}",
            escaped.len(),
            literal(&escaped)
        );
        let names = |rows: Vec<sqlx::mysql::MySqlRow>| {
            rows.iter()
                .map(|r| r.try_get::<String, _>(0))
                .collect::<std::result::Result<Vec<_>, _>>()
        };
        let all = names(admin.fetch_all(select.as_str()).await?)?;
        if all.is_empty() {
            return Ok(all);
        }
        // The rows nobody locks, locked for a moment and let go; READ COMMITTED, so a row
        // the range holds but the prefix does not match is let go at once.
        admin
            .execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
            .await?;
        admin.execute("BEGIN").await?;
        let free = admin
            .fetch_all(format!("{select} FOR UPDATE SKIP LOCKED").as_str())
            .await;
        admin.execute("ROLLBACK").await?;
        let free = names(free?)?;
        Ok(all.into_iter().filter(|n| !free.contains(n)).collect())
    }
}

/// The private TLS server's bad URLs: plain text for a user that requires TLS, a CA that
/// did not sign the server's certificate, a host name the certificate does not name, and
/// TLS options that do not go together.
fn tls_bad_urls(c: &MysqlConfig, at: &str, dir: &std::path::Path) -> Vec<(String, ErrorKind)> {
    let (user, db, port) = (&c.user, &c.database, c.port);
    let ca = dir.join("ca.pem").display().to_string();
    let other_ca = dir.join("other-ca.pem").display().to_string();
    let pw = tls::PASSWORD;
    vec![
        (
            format!("mysql://{user}:wrong-password@{at}/{db}?ssl-ca={ca}"),
            ErrorKind::Backend,
        ),
        (
            format!("mysql://{user}:{pw}@{at}/{db}?ssl-mode=disabled"),
            ErrorKind::Backend,
        ),
        (
            format!("mysql://{user}:{pw}@{at}/{db}?ssl-ca={other_ca}"),
            ErrorKind::Backend,
        ),
        (
            format!("mysql://{user}:{pw}@localhost:{port}/{db}?ssl-ca={ca}"),
            ErrorKind::Backend,
        ),
        (
            format!("mysql://{user}:{pw}@{at}/{db}?ssl-mode=required&ssl-ca={ca}"),
            ErrorKind::InvalidConfig,
        ),
        (
            format!(
                "mysql://{user}:{pw}@{at}/{db}?ssl-ca={}",
                dir.join("nope.pem").display()
            ),
            ErrorKind::InvalidConfig,
        ),
        (
            format!("mysql://{user}:{pw}@{at}"),
            ErrorKind::InvalidConfig,
        ),
        ("not a url".to_owned(), ErrorKind::InvalidConfig),
    ]
}
