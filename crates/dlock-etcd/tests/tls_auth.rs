//! The `etcds://` form and etcd's user/password auth, end to end, against a private etcd
//! member this test starts: TLS with a test CA and client certificates, auth enabled with
//! a 2 s token ttl. The shared servers run neither TLS nor auth.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use dlock_core::{DistributedLock, ErrorKind, LockOptions};
use tokio::time::{Instant, sleep};

const PASSWORD: &str = "s3cret-pw";

/// A private TLS etcd member; killed and its files removed when dropped.
struct TlsEtcd {
    dir: PathBuf,
    port: u16,
    child: Child,
}

impl Drop for TlsEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn run(dir: &Path, program: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// A test CA, a server certificate for 127.0.0.1 and a client certificate.
fn certificates(dir: &Path) {
    let script = r#"
        set -e
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 1 -subj /CN=dlock-test-ca
        for who in server client; do
          openssl req -newkey rsa:2048 -nodes -keyout $who.key -out $who.csr -subj /CN=dlock-$who
          printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > $who.ext
          openssl x509 -req -in $who.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $who.pem -days 1 -extfile $who.ext
        done
    "#;
    run(dir, "sh", &["-c", script]);
}

impl TlsEtcd {
    async fn start() -> Self {
        let dir =
            std::env::temp_dir().join(format!("dlock-etcd-tls-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        certificates(&dir);
        let (port, peer) = (free_port(), free_port());
        let client_url = format!("https://127.0.0.1:{port}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .current_dir(&dir)
            .args(["--name", "tls", "--data-dir", "data"])
            .args([
                "--listen-client-urls",
                &client_url,
                "--advertise-client-urls",
                &client_url,
            ])
            .args([
                "--listen-peer-urls",
                &peer_url,
                "--initial-advertise-peer-urls",
                &peer_url,
            ])
            .args(["--initial-cluster", &format!("tls={peer_url}")])
            .args(["--cert-file", "server.pem", "--key-file", "server.key"])
            .args(["--trusted-ca-file", "ca.pem", "--client-cert-auth"])
            .args(["--auth-token", "simple", "--auth-token-ttl", "2"])
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run etcd (Debian package etcd-server)");
        let etcd = Self { dir, port, child };
        let started = Instant::now();
        while !etcd.ctl(&["endpoint", "health"]).status.success() {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the TLS etcd did not start"
            );
            sleep(Duration::from_millis(200)).await;
        }
        for args in [
            &["user", "add", &format!("root:{PASSWORD}")][..],
            &["user", "grant-role", "root", "root"],
            &["auth", "enable"],
        ] {
            let out = etcd.ctl(args);
            assert!(
                out.status.success(),
                "etcdctl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        etcd
    }

    fn ctl(&self, args: &[&str]) -> std::process::Output {
        Command::new("etcdctl")
            .current_dir(&self.dir)
            .arg(format!("--endpoints=https://127.0.0.1:{}", self.port))
            .args(["--cacert=ca.pem", "--cert=client.pem", "--key=client.key"])
            .args(args)
            .output()
            .expect("run etcdctl")
    }

    fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    fn url(&self, userinfo: &str, certs: bool) -> String {
        let mut url = format!(
            "etcds://{userinfo}127.0.0.1:{}?ca={}",
            self.port,
            self.file("ca.pem")
        );
        if certs {
            url += &format!(
                "&cert={}&key={}",
                self.file("client.pem"),
                self.file("client.key")
            );
        }
        url
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates_and_password_auth() {
    let etcd = TlsEtcd::start().await;
    let key = "dlock-tls/k";
    let opts = LockOptions::new().ttl(Duration::from_secs(5));

    let lock = dlock_etcd::from_url(&etcd.url(&format!("root:{PASSWORD}@"), true))
        .await
        .expect("connect over TLS with a client certificate and a password");
    let lease = lock
        .try_acquire(key, &opts)
        .await
        .expect("try_acquire over TLS")
        .expect("free");
    let other = dlock_etcd::from_url(&etcd.url(&format!("root:{PASSWORD}@"), true))
        .await
        .expect("a second client");
    assert!(other.try_acquire(key, &opts).await.expect("try").is_none());
    lease.release().await.expect("release over TLS");

    // The server's tokens live 2 s; after 4 idle seconds a client without refresh is refused,
    // ours authenticates again and carries on.
    let mut plain = etcd_client::Client::connect(
        [format!("https://127.0.0.1:{}", etcd.port)],
        Some(
            etcd_client::ConnectOptions::new()
                .with_user("root", PASSWORD)
                .with_tls(
                    etcd_client::TlsOptions::new()
                        .ca_certificate(etcd_client::Certificate::from_pem(
                            std::fs::read(etcd.file("ca.pem")).expect("ca"),
                        ))
                        .identity(etcd_client::Identity::from_pem(
                            std::fs::read(etcd.file("client.pem")).expect("cert"),
                            std::fs::read(etcd.file("client.key")).expect("key"),
                        )),
                ),
        ),
    )
    .await
    .expect("a raw client");
    sleep(Duration::from_secs(4)).await;
    let stale = plain.get("x", None).await.expect_err("the token expired");
    assert!(stale.to_string().contains("invalid auth token"), "{stale}");
    let lease = lock
        .try_acquire(key, &opts)
        .await
        .expect("our client refreshes its token")
        .expect("free");
    lease.release().await.expect("release");

    // Wrong password: refused, and the password is nowhere in the error.
    let err = dlock_etcd::from_url(&etcd.url("root:wrong-secret-pw@", true))
        .await
        .expect_err("a wrong password");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");
    for text in [err.to_string(), format!("{err:?}")] {
        assert!(!text.contains("wrong-secret-pw"), "{text}");
    }

    // No password with auth on: the client certificate's name is no user, so a lock
    // request is refused.
    let anonymous = dlock_etcd::from_url(&etcd.url("", true))
        .await
        .expect("connects: Status needs no user");
    let err = anonymous
        .try_acquire(key, &opts)
        .await
        .expect_err("no user");
    assert_eq!(err.kind(), ErrorKind::Backend, "{err}");

    // Plain text against a TLS server, and TLS without the client certificate it requires.
    for url in [
        format!("etcd://root:{PASSWORD}@127.0.0.1:{}", etcd.port),
        etcd.url(&format!("root:{PASSWORD}@"), false),
    ] {
        let err = dlock_etcd::from_url(&url).await.expect_err(&url);
        assert_eq!(err.kind(), ErrorKind::Backend, "{url}: {err}");
        assert!(!format!("{err} {err:?}").contains(PASSWORD), "{err:?}");
    }
}
