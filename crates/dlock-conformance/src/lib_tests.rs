//! Unit tests of the harness URL helpers and messages.

use super::*;

/// A harness that only has a URL.
struct UrlOnly(&'static str);

#[async_trait]
impl Harness for UrlOnly {
    fn name(&self) -> &'static str {
        "test"
    }
    fn url(&self) -> String {
        self.0.to_owned()
    }
    async fn connect(&self, _url: &str) -> Result<Arc<dyn DistributedLock>> {
        unreachable!("not connected in these tests")
    }
    fn bad_urls(&self) -> Vec<(String, ErrorKind)> {
        Vec::new()
    }
    async fn break_lease(&self, _key: &str) -> Result<(), BoxError> {
        Ok(())
    }
    async fn residue(&self, _prefix: &str) -> Result<Vec<String>, BoxError> {
        Ok(Vec::new())
    }
}

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("a socket address")
}

#[test]
fn server_addrs_reads_every_host_with_the_default_port() {
    let redlock = UrlOnly("redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003");
    assert_eq!(
        redlock.server_addrs(),
        [
            addr("127.0.0.1:7001"),
            addr("127.0.0.1:7002"),
            addr("127.0.0.1:7003")
        ]
    );
    let mysql = UrlOnly("mysql://dlock:pw@127.0.0.1/dlock");
    assert_eq!(mysql.server_addrs(), [addr("127.0.0.1:3306")]);
    let zk = UrlOnly("zk://[::1]:2181/chroot?session_timeout=2000ms");
    assert_eq!(zk.server_addrs(), [addr("[::1]:2181")]);
}

#[test]
fn url_with_addrs_replaces_the_hosts_and_keeps_the_rest() {
    let cases = [
        (
            "redis://127.0.0.1:6379",
            vec!["127.0.0.1:1"],
            "redis://127.0.0.1:1",
        ),
        (
            "zk://127.0.0.1:2181,127.0.0.1:2182/chroot?session_timeout=2000ms",
            vec!["127.0.0.1:1", "127.0.0.1:2"],
            "zk://127.0.0.1:1,127.0.0.1:2/chroot?session_timeout=2000ms",
        ),
        (
            "mysql://dlock:p%40ss@127.0.0.1:3306/dlock?table=t",
            vec!["127.0.0.1:1"],
            "mysql://dlock:p%40ss@127.0.0.1:1/dlock?table=t",
        ),
        ("etcd://127.0.0.1:2379", vec!["[::1]:1"], "etcd://[::1]:1"),
    ];
    for (url, addrs, expected) in cases {
        let addrs: Vec<_> = addrs.into_iter().map(addr).collect();
        assert_eq!(UrlOnly(url).url_with_addrs(&addrs), expected, "{url}");
    }
}

#[test]
fn the_unreachable_message_names_the_server_and_the_setup_but_no_password() {
    let message = UrlOnly("mysql://dlock:sekrit@127.0.0.1/dlock")
        .unreachable("mysql://dlock:sekrit@127.0.0.1/dlock", &"refused");
    assert_eq!(
        message,
        "cannot use the test server at mysql://dlock:***@127.0.0.1:3306/dlock: refused\n  \
         start it with: scripts/backends up test"
    );
}
