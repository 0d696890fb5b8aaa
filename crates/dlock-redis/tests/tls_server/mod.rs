//! Private TLS Redis servers for the `rediss://` and `redlocks://` tests (dlock-redlock
//! includes this file by path): a test CA made with `openssl`, and `redis-server`s that
//! speak only TLS, each killed and its files removed when dropped. The shared servers of
//! `scripts/backends` run no TLS.

#![allow(dead_code, unreachable_pub)]

use std::fs::File;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a server may take to listen.
const STARTUP: Duration = Duration::from_secs(10);

/// Fail (never skip) when a program the tests need is missing, naming its Debian package
/// and how to install it.
fn require(program: &str, package: &str, install: &str) {
    match Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
    {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => panic!(
            "the TLS tests of dlock-redis and dlock-redlock need `{program}` (Debian package \
             {package}; {install}), and it is not on PATH"
        ),
        Err(e) => panic!("the TLS tests cannot run `{program}` (Debian package {package}): {e}"),
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A directory of test certificates, removed when dropped:
///
/// - `ca.pem`: the test CA; `server.pem`/`server.key`: for 127.0.0.1 and localhost, signed
///   by it; `client.pem`/`client.key`: a client certificate signed by it;
/// - `other-ca.pem`: an unrelated CA; `other-client.pem`/`other-client.key`: a client
///   certificate signed by that one.
#[derive(Debug)]
pub struct Certificates {
    dir: PathBuf,
}

impl Certificates {
    pub fn new() -> Self {
        require("openssl", "openssl", "apt-get install openssl");
        let dir = std::env::temp_dir().join(format!(
            "dlock-redis-tls-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let certificates = Self { dir };
        // EC keys: quick to make, and both rustls (ring) and Redis's OpenSSL take them.
        let script = r#"
            set -e
            key() { openssl ecparam -name prime256v1 -genkey -noout -out "$1.key"; }
            ca() {
              key "$1"
              openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 1 -subj "/CN=dlock-test-$1"
            }
            signed() { # name ca usage
              key "$1"
              openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=dlock-$1"
              printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=%s\n' "$3" > "$1.ext"
              openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial \
                -out "$1.pem" -days 1 -extfile "$1.ext" 2>/dev/null
            }
            ca ca
            ca other-ca
            signed server ca serverAuth
            signed client ca clientAuth
            signed other-client other-ca clientAuth
        "#;
        let out = Command::new("sh")
            .args(["-c", script])
            .current_dir(&certificates.dir)
            .output()
            .expect("run sh");
        assert!(
            out.status.success(),
            "making the test certificates with openssl failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        certificates
    }

    /// The path of a file in the directory, as a URL option value.
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether the server checks client certificates (`--tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client may present a certificate signed by the CA, or none.
    Optional,
    /// A client must present a certificate signed by the CA.
    Required,
}

/// A `redis-server` on 127.0.0.1 that speaks only TLS (`--port 0`), with the test CA's
/// server certificate; killed when dropped.
#[derive(Debug)]
pub struct TlsRedis {
    pub port: u16,
    child: Child,
    log: PathBuf,
}

impl TlsRedis {
    /// Start one and wait (at most 10 s) until it listens.
    pub fn start(certs: &Certificates, auth: ClientAuth) -> Self {
        Self::start_with(certs, auth, &[])
    }

    /// A one-node Redis Cluster over TLS (`tls-cluster yes`, its bus on a port of its own)
    /// that serves every slot once [`CLUSTER ADDSLOTSRANGE 0 16383`] is sent to it.
    pub fn start_cluster_node(certs: &Certificates) -> Self {
        let bus = free_port();
        Self::start_with(
            certs,
            ClientAuth::Optional,
            &[
                "--cluster-enabled".into(),
                "yes".into(),
                "--tls-cluster".into(),
                "yes".into(),
                "--cluster-port".into(),
                bus.to_string(),
                "--cluster-config-file".into(),
                format!("nodes-{bus}.conf"),
            ],
        )
    }

    /// A Sentinel over TLS (`redis-server CONF --sentinel`) watching the TLS master at
    /// `master_port` under the name `name` (quorum 1).
    pub fn start_sentinel(certs: &Certificates, name: &str, master_port: u16) -> Self {
        let port = free_port();
        let conf = certs.dir().join(format!("sentinel-{port}.conf"));
        std::fs::write(
            &conf,
            format!(
                "bind 127.0.0.1\nport 0\ntls-port {port}\ntls-cert-file server.pem\n\
                 tls-key-file server.key\ntls-ca-cert-file ca.pem\ntls-replication yes\n\
                 tls-auth-clients optional\nsentinel monitor {name} 127.0.0.1 {master_port} 1\n"
            ),
        )
        .expect("write the sentinel's config");
        Self::spawn(
            certs,
            port,
            Command::new("redis-server")
                .current_dir(certs.dir())
                .arg(&conf)
                .arg("--sentinel"),
        )
    }

    /// [`start`](Self::start) with more `redis-server` arguments.
    pub fn start_with(certs: &Certificates, auth: ClientAuth, extra: &[String]) -> Self {
        let port = free_port();
        Self::spawn(
            certs,
            port,
            Command::new("redis-server")
                .current_dir(certs.dir())
                .args(["--bind", "127.0.0.1", "--port", "0"])
                .args(["--tls-port", &port.to_string()])
                .args([
                    "--tls-cert-file",
                    "server.pem",
                    "--tls-key-file",
                    "server.key",
                ])
                .args(["--tls-ca-cert-file", "ca.pem"])
                .args([
                    "--tls-auth-clients",
                    match auth {
                        ClientAuth::Optional => "optional",
                        ClientAuth::Required => "yes",
                    },
                ])
                .args(["--save", "", "--appendonly", "no"])
                .args(["--dbfilename", &format!("dump-{port}.rdb")])
                .args(extra),
        )
    }

    /// Spawn `command` (a `redis-server` that will listen on `port`, logging to standard
    /// output) and wait until it listens.
    fn spawn(certs: &Certificates, port: u16, command: &mut Command) -> Self {
        require(
            "redis-server",
            "redis-server",
            "scripts/backends up redis installs it, or apt-get install redis-server",
        );
        let log = certs.dir().join(format!("redis-{port}.log"));
        let child = command
            .stdin(Stdio::null())
            .stdout(File::create(&log).expect("a log file"))
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start redis-server (Debian package redis-server): {e}")
            });
        let mut server = Self { port, child, log };
        server.wait_listening();
        server
    }

    fn wait_listening(&mut self) {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "the TLS redis-server on port {} exited ({status}); its log:\n{}",
                    self.port,
                    std::fs::read_to_string(&self.log).unwrap_or_default()
                );
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            assert!(
                started.elapsed() < STARTUP,
                "the TLS redis-server on port {} did not listen within {STARTUP:?}; its log:\n{}",
                self.port,
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `host:port` of the server.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
