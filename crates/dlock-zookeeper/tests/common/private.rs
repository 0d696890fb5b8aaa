//! A private ZooKeeper server for the TLS and auth tests: Debian's ZooKeeper 3.8 jars run by
//! `java`, its own ports and data directory. Two client ports: TLS with client certificates
//! required (a test CA made with `openssl`), and plain TCP; both accept digest auth and SASL
//! `DIGEST-MD5` (a JAAS `Server` section with [`USER`] and [`OTHER_USER`], and ZooKeeper's
//! SASL authentication provider). The shared servers run neither TLS nor auth.
//!
//! The JVM runs under a small `sh` guard that reads its stdin: when the owner drops the
//! server, or the test process dies in any way, the pipe closes and the guard kills the JVM
//! and removes the directory. So no server outlives its test run, even the one
//! [`shared`] keeps in a `static` (statics are never dropped).
//!
//! The conformance suite re-runs the test binary as a child process to hold a key; such a
//! child finds its parent's shared server through the parent's directory, named after the
//! parent's process id.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use zookeeper_client as zk;

/// The digest user every test client of the private server authenticates as.
pub const USER: &str = "dlock";
/// Its password (digest and SASL).
pub const PASSWORD: &str = "s3cret-zk-pw";
/// Another SASL user the server knows: a client of the same server with valid credentials
/// of its own.
pub const OTHER_USER: &str = "other";
/// Its password.
pub const OTHER_PASSWORD: &str = "0ther-zk-pw";
/// The base path the SASL tests use on the shared server, created with the ACL
/// `sasl:`[`USER`] only.
pub const SASL_ROOT: &str = "/dlock-sasl";

/// How long the server may take to start (a JVM on 2 busy cores takes 1 to 3 s).
const STARTUP: Duration = Duration::from_secs(30);

/// Debian's ZooKeeper and its logging backend. `zookeeper.jar`'s manifest `Class-Path`
/// brings netty's buffer, common, handler and transport jars but not `netty-codec.jar`,
/// which the TLS handler needs (`io.netty.handler.codec.ByteToMessageDecoder`): without
/// it every TLS connection is closed with `NoClassDefFoundError`.
const JARS: &[&str] = &[
    "/usr/share/java/zookeeper.jar",
    "/usr/share/java/zookeeper-jute.jar",
    "/usr/share/java/netty-codec.jar",
    "/usr/share/java/slf4j-log4j12.jar",
    "/usr/share/java/log4j-1.2.jar",
];

/// Where a private server listens and keeps its files.
#[derive(Debug, Clone)]
pub struct Server {
    dir: PathBuf,
    port: u16,
    plain_port: u16,
}

/// A running private server; stopped and its files removed when dropped.
#[derive(Debug)]
pub struct PrivateZk {
    server: Server,
    /// Closing it ends the guard's `cat`: the guard kills the JVM and removes the directory.
    guard_stdin: Option<ChildStdin>,
    guard: Option<Child>,
}

impl Drop for PrivateZk {
    fn drop(&mut self) {
        drop(self.guard_stdin.take());
        if let Some(mut guard) = self.guard.take() {
            let _ = guard.wait();
        }
        let _ = std::fs::remove_dir_all(&self.server.dir);
    }
}

impl std::ops::Deref for PrivateZk {
    type Target = Server;

    fn deref(&self) -> &Server {
        &self.server
    }
}

/// The directory of the shared server of process `pid`.
fn shared_dir(pid: u32) -> PathBuf {
    std::env::temp_dir().join(format!("dlock-zk-tls-{pid}-shared"))
}

/// One server for the whole test process, started on first use, its base path `/dlock`
/// created with [`USER`]'s digest ACL (and [`SASL_ROOT`] with its SASL ACL); in a holder
/// child process, the parent's.
pub fn shared() -> &'static Server {
    static SHARED: std::sync::OnceLock<Server> = std::sync::OnceLock::new();
    static OWNED: std::sync::OnceLock<PrivateZk> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        let parent = shared_dir(std::os::unix::process::parent_id());
        if let Ok(ports) = std::fs::read_to_string(parent.join("port")) {
            let (port, plain_port) = ports.trim().split_once(' ').expect("the parent's ports");
            return Server {
                dir: parent,
                port: port.parse().expect("the parent's TLS port"),
                plain_port: plain_port.parse().expect("the parent's plain port"),
            };
        }
        let dir = shared_dir(std::process::id());
        let _ = std::fs::remove_dir_all(&dir);
        let owned = OWNED.get_or_init(|| PrivateZk::start_in(dir));
        block_on(async {
            let client = owned.raw(true).await.expect("an authenticated raw client");
            let acl = [zk::Acl::new(
                zk::Permission::ALL,
                zk::AuthId::new("digest", &digest_id()),
            )];
            let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acl));
            client
                .create("/dlock", &[], &options)
                .await
                .expect("create /dlock");
            #[cfg(feature = "sasl")]
            {
                let client = owned
                    .raw_plain(Some((USER, PASSWORD)))
                    .await
                    .expect("a raw SASL client");
                let acl = [zk::Acl::new(
                    zk::Permission::ALL,
                    zk::AuthId::new("sasl", USER),
                )];
                let options = zk::CreateMode::Persistent.with_acls(zk::Acls::new(&acl));
                client
                    .create(SASL_ROOT, &[], &options)
                    .await
                    .expect("create the SASL base path");
            }
        });
        let ports = format!("{} {}", owned.port, owned.plain_port);
        std::fs::write(owned.dir.join("port"), ports).expect("write the port file");
        owned.server.clone()
    })
}

/// [`USER`]'s digest id, as dlock computes it.
pub fn digest_id() -> String {
    dlock_zookeeper::Digest::new(USER, PASSWORD)
        .expect("test credentials")
        .id()
}

/// Run `f` to completion on a thread of its own with its own runtime: works from inside a
/// runtime (a harness is built in one) and outside.
pub fn block_on<F: std::future::Future + Send>(f: F) -> F::Output
where
    F::Output: Send,
{
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime")
                    .block_on(f)
            })
            .join()
            .expect("the blocking thread")
    })
}

impl PrivateZk {
    /// Make the certificates, write the configuration, start the server and wait (at most
    /// [`STARTUP`]) until it accepts TLS sessions.
    ///
    /// # Panics
    /// With a message naming the missing package when `java`, Debian's ZooKeeper jars or
    /// `openssl` are missing, and with the server's log when it does not start in time.
    pub fn start() -> Self {
        Self::start_in(std::env::temp_dir().join(format!(
            "dlock-zk-tls-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        )))
    }

    fn start_in(dir: PathBuf) -> Self {
        require_tools();
        std::fs::create_dir_all(dir.join("data")).expect("create the server's directory");
        certificates(&dir);
        let port = free_port();
        let plain_port = std::iter::repeat_with(free_port)
            .find(|p| *p != port)
            .expect("a second port");
        std::fs::write(dir.join("zoo.cfg"), zoo_cfg(&dir, port, plain_port))
            .expect("write zoo.cfg");
        std::fs::write(dir.join("log4j.properties"), LOG4J).expect("write log4j.properties");
        std::fs::write(dir.join("jaas.conf"), jaas_conf()).expect("write jaas.conf");
        let classpath = std::iter::once(dir.display().to_string())
            .chain(JARS.iter().map(|j| (*j).to_owned()))
            .collect::<Vec<_>>()
            .join(":");
        // The guard: start the JVM, wait for stdin to close, then stop it and clean up.
        let script = r#"
            java -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
              -Djava.net.preferIPv4Stack=true -Dzookeeper.log.dir="$1" \
              -Dlog4j.configuration="file:$1/log4j.properties" -Dzookeeper.jmx.log4j.disable=true \
              -Djava.security.auth.login.config="$1/jaas.conf" \
              -cp "$2" org.apache.zookeeper.server.quorum.QuorumPeerMain "$1/zoo.cfg" \
              >"$1/server.log" 2>&1 </dev/null &
            pid=$!
            echo "$pid" >"$1/server.pid"
            cat >/dev/null
            kill "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            rm -rf "$1"
        "#;
        let mut guard = Command::new("sh")
            .args(["-c", script, "zk-guard"])
            .arg(&dir)
            .arg(&classpath)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run sh");
        let server = Self {
            server: Server {
                dir,
                port,
                plain_port,
            },
            guard_stdin: guard.stdin.take(),
            guard: Some(guard),
        };
        server.wait_until_serving();
        server
    }

    /// The JVM's process id.
    pub fn pid(&self) -> u32 {
        std::fs::read_to_string(self.dir.join("server.pid"))
            .expect("the guard writes server.pid")
            .trim()
            .parse()
            .expect("a pid")
    }
}

impl Server {
    /// The TLS client port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The plain (no TLS) client port on 127.0.0.1, for the SASL tests.
    pub fn plain_port(&self) -> u16 {
        self.plain_port
    }

    /// The plain port's address.
    pub fn plain_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.plain_port))
    }

    /// A raw client over plain TCP, authenticated with SASL `DIGEST-MD5` as `sasl`'s
    /// `(user, password)` when given.
    pub async fn raw_plain(&self, sasl: Option<(&str, &str)>) -> Result<zk::Client, zk::Error> {
        #[allow(unused_mut)]
        let mut connector = zk::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .with_fail_eagerly();
        match sasl {
            #[cfg(feature = "sasl")]
            Some((user, password)) => {
                connector = connector.with_sasl(zk::SaslOptions::digest_md5(
                    user.to_owned(),
                    password.to_owned(),
                ));
            }
            #[cfg(not(feature = "sasl"))]
            Some(_) => panic!("SASL needs dlock-zookeeper's `sasl` feature"),
            None => {}
        }
        let addr = self.plain_addr().to_string();
        // SASL's first packet can race the connect answer, which the client library then
        // reports as NoHosts (see `dlock_zookeeper`'s `auth::sasl_retries`): try again, as
        // the library does.
        let attempts = if sasl.is_some() { 9 } else { 1 };
        let mut answer = Err(zk::Error::NoHosts);
        for _ in 0..attempts {
            answer = tokio::time::timeout(Duration::from_secs(5), connector.clone().connect(&addr))
                .await
                .unwrap_or(Err(zk::Error::Timeout));
            if !matches!(answer, Err(zk::Error::NoHosts)) {
                break;
            }
        }
        answer
    }

    /// The directory holding the certificates (`ca.pem`, `client.pem`, `client.key`,
    /// `other-ca.pem`, ...), the configuration and the data.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path of one of the server's files, as a string for URLs.
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).display().to_string()
    }

    /// The TLS query options of a client trusting the test CA, with the client
    /// certificate the server requires.
    pub fn tls_query(&self) -> String {
        format!(
            "ca={}&cert={}&key={}",
            self.file("ca.pem"),
            self.file("client.pem"),
            self.file("client.key")
        )
    }

    /// The last lines of the server's log, for failure messages.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// A raw client over TLS with the test CA and client certificate, authenticated as
    /// [`USER`] when `authenticated`: what an operator (or an intruder) would use.
    pub async fn raw(&self, authenticated: bool) -> Result<zk::Client, zk::Error> {
        install_crypto_provider();
        let read = |name: &str| std::fs::read_to_string(self.dir.join(name)).expect("a test file");
        let tls = zk::TlsOptions::new()
            .with_pem_ca(&read("ca.pem"))?
            .with_pem_identity(&read("client.pem"), &read("client.key"))?;
        let connector = zk::Client::connector()
            .with_session_timeout(Duration::from_secs(10))
            .with_fail_eagerly()
            .with_tls(tls);
        let addr = self.addr().to_string();
        // Authenticate once the session is up, as the library does (see `open_session`):
        // over TLS the server sometimes answers an auth packet sent with the connect
        // request first, and the handshake fails (CI saw `NoHosts` here). A failed
        // handshake is `NoHosts` with one host and `fail_eagerly`: two more tries.
        let connect = async {
            let mut answer = Err(zk::Error::NoHosts);
            for _ in 0..3 {
                answer = connector.clone().secure_connect(&addr).await;
                if !matches!(answer, Err(zk::Error::NoHosts)) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let client = answer?;
            if authenticated {
                client
                    .auth("digest", format!("{USER}:{PASSWORD}").as_bytes())
                    .await?;
            }
            Ok(client)
        };
        tokio::time::timeout(Duration::from_secs(15), connect)
            .await
            .unwrap_or(Err(zk::Error::Timeout))
    }

    /// Wait until a session over TLS can be made: the port is bound before the server
    /// serves, so a bound port alone proves little.
    fn wait_until_serving(&self) {
        let ready = block_on(async {
            let started = Instant::now();
            while started.elapsed() < STARTUP {
                if TcpStream::connect_timeout(&self.addr(), Duration::from_millis(200)).is_ok()
                    && self.raw(false).await.is_ok()
                    && self.raw_plain(None).await.is_ok()
                {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            false
        });
        assert!(
            ready,
            "the private ZooKeeper did not serve within {STARTUP:?}; its log ends:\n{}",
            self.log_tail()
        );
    }
}

/// The client library needs a process-wide rustls provider when both `ring` and
/// `aws-lc-rs` are compiled in (dlock installs one when it first connects over TLS; the
/// raw test clients may come first).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Fail with the package to install when a tool is missing: these tests never skip.
fn require_tools() {
    let missing = |what: &str, package: &str| -> ! {
        panic!("the TLS/auth ZooKeeper tests need {what}: install the Debian package(s) {package}")
    };
    if Command::new("java")
        .arg("-version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        missing("java", "default-jre-headless");
    }
    for jar in JARS {
        if !Path::new(jar).exists() {
            missing(
                jar,
                "zookeeper libnetty-java liblog4j1.2-java libslf4j-java",
            );
        }
    }
    if Command::new("openssl")
        .arg("version")
        .stdout(Stdio::null())
        .status()
        .map(|s| !s.success())
        .unwrap_or(true)
    {
        missing("openssl", "openssl");
    }
}

fn run(dir: &Path, script: &str) {
    let out = Command::new("sh")
        .args(["-c", script])
        .current_dir(dir)
        .output()
        .expect("run sh");
    assert!(
        out.status.success(),
        "making the test certificates failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A test CA signing a server certificate for 127.0.0.1 and a client certificate; a second,
/// unrelated CA with its own client certificate. The server's key and certificate go in a
/// PKCS12 key store. Its trust store is a PEM file (`ssl.trustStore.type=PEM`): a PKCS12
/// trust store made by OpenSSL 3.0 holds no certificate Java trusts (Java wants its own
/// trusted-certificate attribute, which `openssl pkcs12 -jdktrust` writes only from 3.2).
fn certificates(dir: &Path) {
    run(
        dir,
        r#"
        set -e
        for ca in ca other-ca; do
          openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
            -keyout $ca.key -out $ca.pem -days 1 \
            -subj /CN=dlock-test-$ca 2>/dev/null
        done
        sign() {
          openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $1.key \
            -out $1.csr -subj /CN=dlock-$1 2>/dev/null
          printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' > $1.ext
          openssl x509 -req -in $1.csr -CA $2.pem -CAkey $2.key -CAcreateserial -out $1.pem \
            -days 1 -extfile $1.ext 2>/dev/null
        }
        sign server ca
        sign client ca
        sign other-client other-ca
        openssl pkcs12 -export -in server.pem -inkey server.key -name server \
          -out server.p12 -passout pass:changeit
        "#,
    );
}

/// The JAAS configuration: the server's SASL `DIGEST-MD5` users and their passwords.
fn jaas_conf() -> String {
    format!(
        "Server {{\n  org.apache.zookeeper.server.auth.DigestLoginModule required\n  \
         user_{USER}=\"{PASSWORD}\"\n  user_{OTHER_USER}=\"{OTHER_PASSWORD}\";\n}};\n"
    )
}

/// TLS on `port`, plain TCP on `plain_port`; SASL through the JAAS file
/// (`-Djava.security.auth.login.config`) and the SASL provider, which turns a SASL login
/// into the session identity `sasl:{user}` that ACLs name. SASL is not required
/// (`enforce.auth.enabled` stays off): the tests need clients without credentials.
fn zoo_cfg(dir: &Path, port: u16, plain_port: u16) -> String {
    let dir = dir.display();
    format!(
        "tickTime=500\n\
         initLimit=20\n\
         syncLimit=10\n\
         dataDir={dir}/data\n\
         secureClientPort={port}\n\
         secureClientPortAddress=127.0.0.1\n\
         clientPort={plain_port}\n\
         clientPortAddress=127.0.0.1\n\
         authProvider.sasl=org.apache.zookeeper.server.auth.SASLAuthenticationProvider\n\
         serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n\
         ssl.keyStore.location={dir}/server.p12\n\
         ssl.keyStore.password=changeit\n\
         ssl.keyStore.type=PKCS12\n\
         ssl.trustStore.location={dir}/ca.pem\n\
         ssl.trustStore.type=PEM\n\
         ssl.clientAuth=need\n\
         maxClientCnxns=0\n\
         minSessionTimeout=1000\n\
         maxSessionTimeout=60000\n\
         admin.enableServer=false\n\
         preAllocSize=4096\n"
    )
}

const LOG4J: &str = "log4j.rootLogger=INFO, CONSOLE
log4j.appender.CONSOLE=org.apache.log4j.ConsoleAppender
log4j.appender.CONSOLE.layout=org.apache.log4j.PatternLayout
log4j.appender.CONSOLE.layout.ConversionPattern=%d{ISO8601} %-5p [%t:%C{1}@%L] - %m%n
";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}
