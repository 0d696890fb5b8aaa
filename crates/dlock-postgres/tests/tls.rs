//! TLS against a private PostgreSQL server (the shared one runs without TLS): a test CA
//! made with openssl, a server certificate that names `127.0.0.1` only, and a `pg_hba.conf`
//! that accepts TCP logins over TLS only (`hostssl`). The server is stopped and its files
//! removed when the test ends (also when it fails).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dlock_core::{DistributedLock, ErrorKind, LockOptions};

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";
const PASSWORD: &str = "tls-s3cret-pw";

/// Whether this process is root, which PostgreSQL refuses to run as.
fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// `program args…`, as the `postgres` OS user when we are root.
fn as_pg(program: &str, args: &[&str]) -> Command {
    if is_root() {
        let mut c = Command::new("setpriv");
        c.args([
            "--reuid=postgres",
            "--regid=postgres",
            "--init-groups",
            "--",
        ]);
        c.arg(program).args(args);
        c
    } else {
        let mut c = Command::new(program);
        c.args(args);
        c
    }
}

fn run(mut cmd: Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

struct TlsPostgres {
    dir: PathBuf,
    port: u16,
    server: Option<Child>,
}

impl Drop for TlsPostgres {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            // Fast shutdown (SIGINT), then the hard way.
            let _ = Command::new("kill")
                .args(["-INT", &server.id().to_string()])
                .status();
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(10) {
                if let Ok(Some(_)) = server.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = server.kill();
            let _ = server.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl TlsPostgres {
    fn start() -> Self {
        for program in ["openssl", "setpriv"] {
            assert!(
                Command::new(program).arg("--version").output().is_ok(),
                "{program} is missing (apt-get install openssl util-linux)"
            );
        }
        assert!(
            Path::new(PG_BIN).join("postgres").exists(),
            "PostgreSQL 15 is missing: scripts/backends up postgres installs it"
        );
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let dir = std::env::temp_dir().join(format!("dlock-pg-tls-{}-{port}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut me = Self {
            dir: dir.clone(),
            port,
            server: None,
        };
        certificates(&dir);
        if is_root() {
            run(
                {
                    let mut c = Command::new("chown");
                    c.args(["-R", "postgres:postgres"]).arg(&dir);
                    c
                },
                "chown",
            );
        }
        let data = dir.join("data");
        let d = |p: &Path| p.display().to_string();
        run(
            as_pg(
                &format!("{PG_BIN}/initdb"),
                &[
                    "-D",
                    &d(&data),
                    "-U",
                    "postgres",
                    "--auth-local=trust",
                    "-E",
                    "UTF8",
                ],
            ),
            "initdb",
        );
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 scram-sha-256\n",
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("log")).unwrap();
        let server = as_pg(
            &format!("{PG_BIN}/postgres"),
            &[
                "-D",
                &d(&data),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                &format!("port={port}"),
                "-c",
                &format!("unix_socket_directories={}", d(&dir)),
                "-c",
                "ssl=on",
                "-c",
                &format!("ssl_cert_file={}", d(&dir.join("server.pem"))),
                "-c",
                &format!("ssl_key_file={}", d(&dir.join("server.key"))),
            ],
        )
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("start postgres");
        me.server = Some(server);
        let role = format!("CREATE ROLE dlock LOGIN PASSWORD '{PASSWORD}'");
        let started = Instant::now();
        loop {
            let ok = as_pg(
                &format!("{PG_BIN}/psql"),
                &[
                    "-X",
                    "-q",
                    "-h",
                    &d(&dir),
                    "-p",
                    &port.to_string(),
                    "-U",
                    "postgres",
                ],
            )
            .args(["-d", "postgres", "-c", "SELECT 1"])
            .output()
            .is_ok_and(|o| o.status.success());
            if ok {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the TLS server did not start: {}",
                std::fs::read_to_string(dir.join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let psql = |sql: &str| {
            let mut c = as_pg(
                &format!("{PG_BIN}/psql"),
                &[
                    "-X",
                    "-q",
                    "-h",
                    &d(&dir),
                    "-p",
                    &port.to_string(),
                    "-U",
                    "postgres",
                ],
            );
            c.args(["-d", "postgres", "-v", "ON_ERROR_STOP=1", "-c", sql]);
            run(c, sql);
        };
        psql(&role);
        psql("CREATE DATABASE dlock OWNER dlock");
        me
    }

    fn url(&self, host: &str, query: &str) -> String {
        format!(
            "postgres://dlock:{PASSWORD}@{host}:{}/dlock?{query}",
            self.port
        )
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }
}

/// A CA, a server certificate it signs for `IP:127.0.0.1` only, and another CA.
fn certificates(dir: &Path) {
    let ssl = |args: &[&str]| {
        let mut c = Command::new("openssl");
        c.current_dir(dir).args(args);
        run(c, &format!("openssl {}", args.join(" ")));
    };
    for ca in ["ca", "other-ca"] {
        ssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=dlock test {ca}"),
            "-keyout",
            &format!("{ca}.key"),
            "-out",
            &format!("{ca}.pem"),
        ]);
    }
    ssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    ssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.ext",
        "-out",
        "server.pem",
    ]);
    run(
        {
            let mut c = Command::new("chmod");
            c.arg("600").arg(dir.join("server.key"));
            c
        },
        "chmod",
    );
}

async fn refused(url: &str, kind: ErrorKind, names: &str) {
    let err = dlock_postgres::from_url(url)
        .await
        .map(|_| ())
        .expect_err(url);
    assert_eq!(err.kind(), kind, "{url}: {err}");
    assert!(err.to_string().contains(names), "{url}: {err}");
    assert!(!format!("{err} {err:?}").contains(PASSWORD), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_verified_and_refusals_are_backend_errors() {
    let server = TlsPostgres::start();
    // Verified: the CA signed the certificate, which names the host.
    let url = server.url(
        "127.0.0.1",
        &format!("sslrootcert={}", server.file("ca.pem")),
    );
    let lock = dlock_postgres::from_url(&url).await.expect("verified TLS");
    let lease = lock
        .try_acquire("tls/k", &LockOptions::new())
        .await
        .unwrap()
        .expect("free");
    lease.release().await.unwrap();
    // sslmode=require: encrypted, not checked: accepted.
    let url = server.url("127.0.0.1", "sslmode=require");
    dlock_postgres::from_url(&url).await.expect("require");
    // Another CA: refused at the handshake, at once.
    let started = Instant::now();
    let other = server.url(
        "127.0.0.1",
        &format!("sslrootcert={}", server.file("other-ca.pem")),
    );
    refused(&other, ErrorKind::Backend, "TLS").await;
    assert!(started.elapsed() < Duration::from_secs(3));
    // A name the certificate does not hold.
    let wrong_name = server.url(
        "localhost",
        &format!("sslrootcert={}", server.file("ca.pem")),
    );
    refused(&wrong_name, ErrorKind::Backend, "TLS").await;
    // Plain text, which pg_hba.conf refuses (hostssl only).
    refused(
        &server.url("127.0.0.1", "sslmode=disable"),
        ErrorKind::Backend,
        "",
    )
    .await;
}
