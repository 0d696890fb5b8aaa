//! A private MariaDB server with TLS, for the tests that need one (the shared servers run
//! no TLS): a test CA made with openssl, a server certificate that names `127.0.0.1` and
//! nothing else, and users that `REQUIRE SSL` (`dlock`, and `dlock_admin`, which may change
//! the server's global settings) and `REQUIRE X509` (`dlock_x509`, a client certificate
//! signed by the test CA).
//!
//! The server runs under a small `sh` supervisor whose stdin is a pipe from the test
//! process: when the pipe closes (the [`TlsMariadb`] is dropped, or the test process ends in
//! any way, even SIGKILL) the supervisor kills the server and removes its directory. So the
//! per-process [`TlsMariadb::shared`] server, a static that is never dropped, is cleaned up
//! too. Every wait is bounded.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The password of both test users.
pub const PASSWORD: &str = "tls-s3cret-pw";

/// How long the server may take to start.
const START_LIMIT: Duration = Duration::from_secs(30);

/// What to install when a program is missing.
const PACKAGES: &str = "apt-get install mariadb-server openssl";

/// The environment variable the conformance suite sets in its holder child processes
/// (`dlock_conformance::holder`): a child uses its parent's server instead of starting one.
const HOLD_VAR: &str = "DLOCK_CONFORMANCE_HOLD";

/// A private MariaDB server with TLS; stopped and its files removed when dropped.
#[derive(Debug)]
pub struct TlsMariadb {
    dir: PathBuf,
    port: u16,
    /// The `sh` supervisor and the write end of its stdin: closing it stops the server.
    supervisor: Option<(Child, ChildStdin)>,
}

impl Drop for TlsMariadb {
    fn drop(&mut self) {
        let Some((mut child, stdin)) = self.supervisor.take() else {
            return;
        };
        drop(stdin);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // The supervisor did not finish: stop it and the server the hard way.
        let _ = child.kill();
        let _ = child.wait();
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("mariadbd.pid")) {
            let _ = Command::new("kill").args(["-KILL", pid.trim()]).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TlsMariadb {
    /// The server every test of this process shares (started by the first caller). In a
    /// holder child of the conformance suite, the parent's server.
    pub fn shared() -> &'static Self {
        static SHARED: OnceLock<TlsMariadb> = OnceLock::new();
        SHARED.get_or_init(|| {
            if std::env::var_os(HOLD_VAR).is_some() {
                return Self::of_parent();
            }
            Self::start_in(shared_dir(std::process::id()))
        })
    }

    /// A server of its own, stopped and removed when dropped.
    pub fn start() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        Self::start_in(
            std::env::temp_dir().join(format!("dlock-mysql-tls-{}-{n}", std::process::id())),
        )
    }

    /// The parent process's shared server (this process is a holder child it spawned).
    fn of_parent() -> Self {
        let dir = shared_dir(std::os::unix::process::parent_id());
        let port = std::fs::read_to_string(dir.join("port"))
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| {
                panic!(
                    "holder child: no TLS server of the parent in {}",
                    dir.display()
                )
            });
        Self {
            dir,
            port,
            supervisor: None,
        }
    }

    fn start_in(dir: PathBuf) -> Self {
        let started = Instant::now();
        let programs = Programs::find();
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("tmp")).expect("create the server's directory");
        certificates(&dir, &programs.openssl);
        let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
        // mariadbd refuses to run as root unless told to.
        let user: &[&str] = if root { &["--user=root"] } else { &[] };
        // Small InnoDB log and data files: a throwaway server (the defaults write ~110 MB).
        let small = ["--innodb-log-file-size=8M", "--innodb-buffer-pool-size=32M"];
        let data = dir.join("data");
        run(
            &dir,
            &programs.install_db,
            &[
                &[
                    "--no-defaults",
                    &format!("--datadir={}", data.display()),
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                ][..],
                user,
                &small,
            ]
            .concat(),
        );
        std::fs::write(
            dir.join("init.sql"),
            INIT_SQL.replace("{PASSWORD}", PASSWORD),
        )
        .expect("write init.sql");

        let port = free_port();
        let path = |name: &str| dir.join(name).display().to_string();
        let mut server = vec![
            programs.mariadbd.display().to_string(),
            "--no-defaults".into(),
            format!("--datadir={}", data.display()),
            format!("--socket={}", path("mysqld.sock")),
            format!("--pid-file={}", path("mariadbd.pid")),
            format!("--tmpdir={}", path("tmp")),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--skip-name-resolve".into(),
            "--max-connections=1000".into(),
            "--max-connect-errors=1000000".into(),
            "--innodb-flush-log-at-trx-commit=2".into(),
            format!("--ssl-ca={}", path("ca.pem")),
            format!("--ssl-cert={}", path("server.pem")),
            format!("--ssl-key={}", path("server.key")),
            format!("--init-file={}", path("init.sql")),
        ];
        server.extend(user.iter().chain(&small).map(|s| (*s).to_owned()));
        // The supervisor: the server in the background, then wait for stdin to close (or
        // the server to exit), kill it, remove the directory, and print the log's tail.
        let script = r#"
            dir=$1; shift
            "$@" >"$dir/server.log" 2>&1 </dev/null &
            pid=$!
            exec 3<&0
            ( cat <&3; kill -KILL "$pid" ) >/dev/null 2>&1 &
            watcher=$!
            wait "$pid"
            status=$?
            kill "$watcher" 2>/dev/null
            tail=$(tail -n 25 "$dir/server.log" 2>/dev/null)
            rm -rf "$dir"
            printf 'mariadbd exited (status %s); the end of its log:\n%s\n' "$status" "$tail"
        "#;
        let mut child = Command::new("sh")
            .args(["-c", script, "sh"])
            .arg(&dir)
            .args(&server)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run sh");
        let stdin = child.stdin.take().expect("stdin is piped");
        let mut this = Self {
            dir,
            port,
            supervisor: Some((child, stdin)),
        };
        this.wait_ready(started);
        std::fs::write(this.dir.join("port"), port.to_string()).expect("write the port file");
        tracing::info!(port, took = ?started.elapsed(), "private TLS MariaDB is up");
        this
    }

    /// Wait until the server logs that it accepts connections (after running init.sql).
    fn wait_ready(&mut self, started: Instant) {
        let log = self.dir.join("server.log");
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("ready for connections") {
                return;
            }
            let (child, _) = self.supervisor.as_mut().expect("a started server");
            if let Ok(Some(_)) = child.try_wait() {
                let mut out = String::new();
                if let Some(mut stdout) = child.stdout.take() {
                    let _ = std::io::Read::read_to_string(&mut stdout, &mut out);
                }
                panic!("the private TLS MariaDB did not start: {out}");
            }
            assert!(
                started.elapsed() < START_LIMIT,
                "the private TLS MariaDB did not start within {START_LIMIT:?}; its log:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The server's TCP port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's directory (certificates, data, log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// A file of the server's directory: `ca.pem` (the CA that signed the server's and the
    /// client's certificates), `other-ca.pem` (a CA that signed neither), `client.pem`,
    /// `client.key`.
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// `mysql://{user}:{PASSWORD}@{host}:{port}/dlock?{query}`.
    pub fn url(&self, user: &str, host: &str, query: &str) -> String {
        format!(
            "mysql://{user}:{PASSWORD}@{host}:{}/dlock?{query}",
            self.port
        )
    }

    /// The URL of a verified connection as `dlock`: `verify_identity` against the test CA.
    pub fn verified_url(&self) -> String {
        self.url(
            "dlock",
            "127.0.0.1",
            &format!("ssl-mode=verify_identity&ssl-ca={}", self.file("ca.pem")),
        )
    }
}

const INIT_SQL: &str = "
CREATE DATABASE dlock;
CREATE USER 'dlock'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}' REQUIRE SSL;
GRANT ALL PRIVILEGES ON dlock.* TO 'dlock'@'127.0.0.1';
GRANT PROCESS, CONNECTION ADMIN ON *.* TO 'dlock'@'127.0.0.1';
CREATE USER 'dlock_admin'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}' REQUIRE SSL;
GRANT SUPER ON *.* TO 'dlock_admin'@'127.0.0.1';
GRANT SELECT ON dlock.* TO 'dlock_admin'@'127.0.0.1';
CREATE USER 'dlock_x509'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}' REQUIRE X509;
GRANT ALL PRIVILEGES ON dlock.* TO 'dlock_x509'@'127.0.0.1';
";

fn shared_dir(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("dlock-mysql-tls-{pid}-shared"))
}

/// The programs the server needs, found on `PATH` or in the sbin directories (`mariadbd`
/// is in `/usr/sbin`, often not on a user's `PATH`).
struct Programs {
    mariadbd: PathBuf,
    install_db: PathBuf,
    openssl: PathBuf,
}

impl Programs {
    fn find() -> Self {
        let mut missing = Vec::new();
        let mut find = |names: &[&str]| {
            let found = find_program(names);
            if found.is_none() {
                missing.push(names.join(" or "));
            }
            found.unwrap_or_default()
        };
        let programs = Self {
            mariadbd: find(&["mariadbd", "mysqld"]),
            install_db: find(&["mariadb-install-db", "mysql_install_db"]),
            openssl: find(&["openssl"]),
        };
        assert!(
            missing.is_empty(),
            "the MySQL TLS tests start a private MariaDB server with a test CA, and cannot \
             find {} (looked on PATH and in /usr/sbin, /usr/local/sbin, /sbin); install them \
             with: {PACKAGES}",
            missing.join(", ")
        );
        programs
    }
}

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .collect::<Vec<_>>();
    names.iter().find_map(|name| {
        dirs.iter()
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    })
}

fn run(dir: &Path, program: &Path, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e} ({PACKAGES})", program.display()));
    assert!(
        out.status.success(),
        "{} {args:?} failed:\n{}{}",
        program.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A test CA; a server certificate it signs for `IP:127.0.0.1` only (so `localhost` is a
/// name the certificate does not name); a client certificate it signs; and another CA
/// that signs nothing here.
fn certificates(dir: &Path, openssl: &Path) {
    let script = r#"
        set -e
        openssl=$1
        for ca in ca other-ca; do
          "$openssl" req -x509 -newkey rsa:2048 -nodes -keyout $ca.key -out $ca.pem -days 1 \
            -subj /CN=dlock-test-$ca
        done
        printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
        printf 'extendedKeyUsage=clientAuth\n' > client.ext
        for who in server client; do
          "$openssl" req -newkey rsa:2048 -nodes -keyout $who.key -out $who.csr \
            -subj /CN=dlock-test-$who
          "$openssl" x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
            -out $who.pem -days 1 -extfile $who.ext
        done
    "#;
    let openssl = openssl.display().to_string();
    run(dir, Path::new("sh"), &["-c", script, "sh", &openssl]);
}
