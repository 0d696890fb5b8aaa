//! The two ways of running the test servers must agree: `scripts/backends`
//! (native processes) and `docker/docker-compose.yml` (Docker) have to serve
//! the same client ports, on 127.0.0.1 only, and the `DLOCK_*_URL` variables
//! that `scripts/backends env` prints have to point at exactly those ports
//! (but for the servers a client finds through others: Redis Cluster nodes
//! beyond the seeds, and the data nodes behind the Sentinels).
//!
//! Needs no servers: it only reads the two files.

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;

/// The topology of the test servers (README, "Servers for development and tests").
const EXPECTED_PORTS: &[u16] = &[
    6379, // Redis
    7001, 7002, 7003, 7004, 7005, // Redlock
    2181, // ZooKeeper standalone
    2182, 2183, 2184, // ZooKeeper ensemble
    2379, // etcd single member
    23791, 23792, 23793, // etcd cluster
    3306,  // MySQL / MariaDB
    5432,  // PostgreSQL
    6380,  // Redis for the torture run (restarted by it)
    3307,  // MySQL / MariaDB for the torture run (restarted by it)
    5433,  // PostgreSQL for the torture run (restarted by it)
    7101, 7102, 7103, 7104, 7105, 7106, // Redis Cluster: 3 masters + 1 replica each
    6391, 6392, // Redis Sentinel's data nodes (master name dlock)
    26391, 26392, 26393, // Redis Sentinel's sentinels
];

/// Served ports that no URL names: a client discovers them. The cluster URL
/// names three seed nodes (the client learns the others from `CLUSTER SLOTS`),
/// the Sentinel URL names the sentinels (they tell where the master is).
const DISCOVERED_PORTS: &[u16] = &[
    7104, 7105, 7106, // Redis Cluster nodes beyond the seeds
    6391, 6392, // Redis Sentinel's data nodes
];

const BEGIN_MARK: &str = "# BEGIN CLIENT PORTS";
const END_MARK: &str = "# END CLIENT PORTS";

fn repo_file(relative: &str) -> (PathBuf, String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative);
    let text =
        fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    (path, text)
}

fn parse_port(s: &str, context: &str) -> u16 {
    s.trim()
        .parse()
        .unwrap_or_else(|e| panic!("bad port {s:?} in {context:?}: {e}"))
}

/// Ports from the `[unit]=PORT` lines between the BEGIN/END CLIENT PORTS
/// markers of scripts/backends.
fn script_ports(script: &str) -> BTreeSet<u16> {
    let start = script
        .find(BEGIN_MARK)
        .unwrap_or_else(|| panic!("scripts/backends has no {BEGIN_MARK:?} line"));
    let rest = &script[start..];
    let end = rest
        .find(END_MARK)
        .unwrap_or_else(|| panic!("scripts/backends has no {END_MARK:?} line"));
    let mut ports = BTreeSet::new();
    for line in rest[..end].lines() {
        let line = line.trim();
        if !line.starts_with('[') {
            continue;
        }
        let (_, port) = line
            .split_once("]=")
            .unwrap_or_else(|| panic!("unexpected line in the port table: {line:?}"));
        assert!(
            ports.insert(parse_port(port, line)),
            "port listed twice in scripts/backends: {line:?}"
        );
    }
    assert!(!ports.is_empty(), "empty port table in scripts/backends");
    ports
}

/// Host ports of every entry of every `ports:` list in the compose file.
/// Each entry must have the form `127.0.0.1:HOST:CONTAINER`.
fn compose_ports(compose: &str) -> BTreeSet<u16> {
    let mut ports = BTreeSet::new();
    let mut ports_indent: Option<usize> = None;
    for raw in compose.lines() {
        let content = raw.split(" #").next().unwrap_or("");
        let trimmed = content.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = raw.len() - raw.trim_start().len();
        if let Some(list_indent) = ports_indent {
            if indent > list_indent || (indent == list_indent && trimmed.starts_with('-')) {
                let entry = trimmed
                    .strip_prefix('-')
                    .unwrap_or_else(|| panic!("unexpected line in a ports list: {raw:?}"))
                    .trim()
                    .trim_matches(|c| c == '"' || c == '\'');
                let fields: Vec<&str> = entry.split(':').collect();
                assert!(
                    fields.len() == 3 && fields[0] == "127.0.0.1",
                    "compose port {entry:?} must be published as \"127.0.0.1:HOST:CONTAINER\""
                );
                let host = parse_port(fields[1], entry);
                parse_port(fields[2], entry);
                assert!(
                    ports.insert(host),
                    "host port {host} published twice in docker-compose.yml"
                );
                continue;
            }
            ports_indent = None;
        }
        if trimmed == "ports:" {
            ports_indent = Some(indent);
        } else {
            assert!(
                !trimmed.starts_with("ports:"),
                "write ports as a block list (one \"127.0.0.1:HOST:CONTAINER\" per line): {raw:?}"
            );
        }
    }
    assert!(!ports.is_empty(), "no ports found in docker-compose.yml");
    ports
}

/// Ports named in the `export DLOCK_..._URL=...` lines of scripts/backends.
fn env_url_ports(script: &str) -> BTreeSet<u16> {
    let mut ports = BTreeSet::new();
    let mut vars = 0;
    for line in script.lines() {
        let Some(assignment) = line.trim().strip_prefix("export DLOCK_") else {
            continue;
        };
        let (_, url) = assignment
            .split_once('=')
            .unwrap_or_else(|| panic!("unexpected export line: {line:?}"));
        vars += 1;
        let mut rest = url;
        while let Some(i) = rest.find("127.0.0.1:") {
            rest = &rest[i + "127.0.0.1:".len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            assert!(!digits.is_empty(), "address without port in {line:?}");
            ports.insert(parse_port(&digits, line));
        }
    }
    assert!(
        vars >= 7,
        "expected the seven DLOCK_*_URL exports, found {vars}"
    );
    ports
}

fn describe(a: &BTreeSet<u16>, a_name: &str, b: &BTreeSet<u16>, b_name: &str) -> String {
    let only_a: Vec<_> = a.difference(b).collect();
    let only_b: Vec<_> = b.difference(a).collect();
    format!("only in {a_name}: {only_a:?}; only in {b_name}: {only_b:?}")
}

#[test]
fn compose_publishes_exactly_the_ports_the_script_serves() {
    let (script_path, script) = repo_file("scripts/backends");
    let (compose_path, compose) = repo_file("docker/docker-compose.yml");
    let served = script_ports(&script);
    let published = compose_ports(&compose);
    assert_eq!(
        served,
        published,
        "{} and {} disagree: {}",
        script_path.display(),
        compose_path.display(),
        describe(
            &served,
            "scripts/backends",
            &published,
            "docker-compose.yml"
        )
    );
}

#[test]
fn script_serves_the_documented_topology() {
    let (_, script) = repo_file("scripts/backends");
    let served = script_ports(&script);
    let expected: BTreeSet<u16> = EXPECTED_PORTS.iter().copied().collect();
    assert_eq!(
        served,
        expected,
        "{}",
        describe(&served, "scripts/backends", &expected, "README topology")
    );
}

#[test]
fn env_urls_point_at_the_served_ports() {
    let (_, script) = repo_file("scripts/backends");
    let served = script_ports(&script);
    let in_urls = env_url_ports(&script);
    let discovered: BTreeSet<u16> = DISCOVERED_PORTS.iter().copied().collect();
    assert!(
        in_urls.is_disjoint(&discovered),
        "a DLOCK_*_URL names a port listed as discovered: {:?}",
        in_urls.intersection(&discovered).collect::<Vec<_>>()
    );
    let reachable: BTreeSet<u16> = in_urls.union(&discovered).copied().collect();
    assert_eq!(
        served,
        reachable,
        "{}",
        describe(
            &served,
            "port table",
            &reachable,
            "DLOCK_*_URL exports + discovered ports"
        )
    );
}
