//! [`RedlockConfig`]: the nodes, and the options they share.

use std::collections::HashSet;

use dlock_core::raw::url::LockUrl;
use dlock_core::{LockError, Result};
use dlock_redis::RedisConfig;

use crate::NAME;

/// The independent Redis nodes of one Redlock, each with the same options (key prefix,
/// credentials, database, TLS, timeouts).
///
/// Built from a URL with [`RedlockConfig::from_url`], or from node configs with
/// [`RedlockConfig::new`]. `Debug` never shows a password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedlockConfig {
    /// The nodes, in URL order. An odd number, at least 3.
    pub nodes: Vec<RedisConfig>,
}

impl RedlockConfig {
    /// A Redlock over `nodes`.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] unless there is an odd number of at least 3 distinct
    /// nodes sharing one key prefix.
    pub fn new(nodes: Vec<RedisConfig>) -> Result<Self> {
        let config = Self { nodes };
        config.validate()?;
        Ok(config)
    }

    /// Parse `redlock://[user:pass@]host:port,host:port,host:port[/db][?option=value&…]`
    /// (or `redlocks://` for TLS). The options are those of a `redis://` URL (`prefix`,
    /// `connect_timeout`, `response_timeout`, and for TLS `ca`, `cert`, `key`) and apply to
    /// every node. No network I/O (the TLS files are read by `connect`).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is wrong: the scheme, a host or port, the
    /// number of nodes, an unknown option or a bad value.
    pub fn from_url(url: &str) -> Result<Self> {
        let url = LockUrl::parse(NAME, url, crate::SCHEMES, RedisConfig::DEFAULT_PORT)?;
        if url.hosts().is_empty() {
            return Err(LockError::invalid_config(
                NAME,
                "the URL names no server (expected redlock://host:port,host:port,host:port)",
            ));
        }
        Self::new(
            url.hosts()
                .iter()
                .map(|host| RedisConfig::for_host(NAME, &url, host))
                .collect::<Result<_>>()?,
        )
    }

    /// How many nodes must agree: a strict majority.
    pub fn quorum(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The key prefix the nodes share (empty when there are no nodes).
    pub fn prefix(&self) -> &str {
        self.nodes.first().map_or("", |node| node.prefix.as_str())
    }

    /// Check the node list: an odd number of at least 3 distinct nodes sharing one key
    /// prefix. [`RedlockConfig::new`], [`from_url`](Self::from_url) and the backend's
    /// `connect` call it, so a config built field by field is checked too.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] naming what is wrong.
    pub fn validate(&self) -> Result<()> {
        let n = self.nodes.len();
        if n < 3 || n.is_multiple_of(2) {
            return Err(LockError::invalid_config(
                NAME,
                format!(
                    "Redlock needs an odd number of at least 3 independent nodes, not {n} \
                     (an even number adds a node without adding a tolerated failure)"
                ),
            ));
        }
        let mut seen = HashSet::new();
        for node in &self.nodes {
            if !seen.insert((node.host.to_ascii_lowercase(), node.port)) {
                return Err(LockError::invalid_config(
                    NAME,
                    format!("node {} is named twice", node.addr()),
                ));
            }
            if node.prefix != self.nodes[0].prefix {
                return Err(LockError::invalid_config(
                    NAME,
                    "every node must use the same key prefix",
                ));
            }
            // Each vote is one server's: a Sentinel group or a cluster is not a node.
            if node.topology != dlock_redis::Topology::Server {
                return Err(LockError::invalid_config(
                    NAME,
                    format!(
                        "node {} is a Sentinel group or a Redis Cluster: Redlock's nodes are                          independent single servers",
                        node.addr()
                    ),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use dlock_core::ErrorKind;

    #[test]
    fn good_urls() {
        let config = RedlockConfig::from_url(
            "redlock://127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003,127.0.0.1:7004,127.0.0.1:7005",
        )
        .unwrap();
        assert_eq!(config.nodes.len(), 5);
        assert_eq!(config.quorum(), 3);
        assert_eq!(config.prefix(), "dlock:");
        assert_eq!(config.nodes[4].addr(), "127.0.0.1:7005");

        let config = RedlockConfig::from_url(
            "redlocks://u:p%40ss@a:1,b,c:3/2?prefix=&connect_timeout=1s&response_timeout=250ms",
        )
        .unwrap();
        assert_eq!(config.quorum(), 2);
        for (node, (host, port)) in config.nodes.iter().zip([("a", 1), ("b", 6379), ("c", 3)]) {
            assert_eq!((node.host.as_str(), node.port), (host, port));
            assert!(node.tls);
            assert_eq!(node.username.as_deref(), Some("u"));
            assert_eq!(node.password.as_ref().map(|p| p.expose()), Some("p@ss"));
            assert_eq!(node.db, 2);
            assert_eq!(node.prefix, "");
            assert_eq!(node.connect_timeout, Duration::from_secs(1));
            assert_eq!(node.response_timeout, Duration::from_millis(250));
        }

        let config = RedlockConfig::from_url(
            "redlocks://a:1,b:2,c:3?ca=/tls/ca.pem&cert=/tls/c.pem&key=/tls/c.key",
        )
        .unwrap();
        for node in &config.nodes {
            assert!(node.tls);
            assert_eq!(node.ca.as_deref(), Some("/tls/ca.pem".as_ref()));
            assert_eq!(node.cert.as_deref(), Some("/tls/c.pem".as_ref()));
            assert_eq!(node.key.as_deref(), Some("/tls/c.key".as_ref()));
        }
    }

    #[test]
    fn bad_urls_are_invalid_config_without_the_password() {
        let cases = [
            ("redis://a:1,b:2,c:3", "scheme"),
            ("redlock://a:1", "odd number of at least 3"),
            ("redlock://a:1,b:2", "odd number of at least 3"),
            ("redlock://a:1,b:2,c:3,d:4", "odd number of at least 3"),
            ("redlock://a:1,b:2,a:1", "named twice"),
            ("redlock://a:1,b:x,c:3", "port"),
            ("redlock://a:1,,c:3", "host"),
            ("redlock://a:1,b:2,c:3?bogus=1", "unknown option \"bogus\""),
            ("redlock://a:1,b:2,c:3?ca=/ca.pem", "option ca is for TLS"),
            (
                "redlocks://a:1,b:2,c:3?cert=/c.pem",
                "cert and key go together",
            ),
            (
                "redlock://u:sekrit-pw@a:1,b:2,c:3?connect_timeout=never",
                "connect_timeout",
            ),
            ("redlock://u:sekrit-pw@a:1,b:2", "odd number"),
            ("redlock://", "no server"),
        ];
        for (url, needle) in cases {
            let err = RedlockConfig::from_url(url).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{url}: {err}");
            let text = format!("{err} {err:?}");
            assert!(text.contains(needle), "{url}: {text}");
            assert!(text.contains("redlock"), "{url}: {text}");
            assert!(!text.contains("sekrit"), "{url}: {text}");
        }
        let mixed = vec![
            RedisConfig::new("a", 1),
            RedisConfig::new("b", 1),
            RedisConfig {
                prefix: "other:".into(),
                ..RedisConfig::new("c", 1)
            },
        ];
        assert_eq!(
            RedlockConfig::new(mixed).unwrap_err().kind(),
            ErrorKind::InvalidConfig
        );
    }

    #[tokio::test]
    async fn a_config_built_by_hand_is_checked_before_connecting() {
        let node = |port| RedisConfig::new("127.0.0.1", port);
        for nodes in [
            vec![],
            vec![node(1)],
            vec![node(1), node(2)],
            vec![node(1), node(2), node(1)],
        ] {
            let n = nodes.len();
            let err = crate::RedlockBackend::connect(RedlockConfig { nodes })
                .await
                .expect_err("refused");
            assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{n} nodes: {err}");
        }
        assert_eq!(RedlockConfig { nodes: vec![] }.prefix(), "");
    }

    #[test]
    fn a_sentinel_group_or_a_cluster_is_not_a_node() {
        let mut config = RedlockConfig::from_url("redlock://a:1,b:2,c:3").unwrap();
        config.nodes[1] = dlock_redis::RedisConfig::from_url("redis+cluster://b:2,b:3").unwrap();
        let err = config.validate().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidConfig);
        assert!(
            err.to_string().contains("independent single servers"),
            "{err}"
        );
    }

    #[test]
    fn debug_hides_the_password() {
        let config = RedlockConfig::from_url("redlock://u:sekrit-pw@a:1,b:2,c:3").unwrap();
        assert!(!format!("{config:?}").contains("sekrit"));
    }

    #[test]
    fn the_shared_url_table_passes() {
        dlock_conformance::urls::check_parser(
            |password, host| {
                format!("redlock://app:{password}@{host}:7001,{host}:7002,{host}:7003")
            },
            |url| RedlockConfig::from_url(url).map(|c| format!("{c:?}")),
        );
    }
}
