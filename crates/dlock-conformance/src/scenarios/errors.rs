//! What must be refused or reported: bad keys, options and URLs, and servers that cannot be
//! reached or never answer.

use std::time::Duration;

use dlock_core::{DistributedLock, ErrorKind, LockOptions};
use tokio::time::{Instant, sleep, timeout};

use super::{must_take, opts, waiting};
use crate::Ctx;

/// Promise 13a: Empty, over-long and NUL-bearing keys are rejected with `InvalidKey` before any
/// network I/O, leaving nothing on the server, by `try_acquire`, `acquire` and `inspect` (and
/// by `list` as a prefix, where one is too long or holds a NUL).
///
/// "Before any I/O" is checked on every backend: a client connected through a network the
/// test then cuts must still refuse the bad keys at once, and must not even try to send
/// anything for them ([`Partition::traffic_while_cut`](crate::Partition)). Background
/// traffic (a heartbeat, a reconnect) may fall into one look; a request made for the bad
/// keys falls into every look. Then a valid key on the same cut client must show as
/// traffic: a count that cannot see the client fails the test instead of passing it.
pub async fn bad_keys_are_rejected_before_io(cx: Ctx) {
    const LOOKS: usize = 5;
    let a = cx.client().await;
    let keys = bad_keys(&cx, a.capabilities().max_key_len);
    for key in &keys {
        refused_at_once(&*a, key, &opts(&cx)).await;
    }
    let (cut_client, cut) = cx
        .harness()
        .partitioned_client()
        .await
        .unwrap_or_else(|e| panic!("{}", cx.unreachable_message(&e)));
    // Connected and settled: one valid acquire opens whatever the client opens lazily.
    must_take(&*cut_client, &cx.key("warm-up"), &opts(&cx))
        .await
        .release()
        .await
        .expect("release");
    // A fixed pause, not a poll: the warm-up's background traffic has no end to wait for.
    sleep(Duration::from_millis(200)).await;
    cut.cut();
    let mut looks = Vec::new();
    for _ in 0..LOOKS {
        let before = cut.traffic_while_cut();
        for key in &keys {
            refused_at_once(&*cut_client, key, &opts(&cx)).await;
        }
        // A fixed pause, not a poll (silence is what is checked): long enough for a request
        // handed to another task to reach the wire.
        sleep(Duration::from_millis(100)).await;
        looks.push(cut.traffic_while_cut() - before);
        if looks.last() == Some(&0) {
            break;
        }
    }
    assert!(
        looks.last() == Some(&0),
        "the client tried to reach the server for bad keys: traffic into the cut network \
         in each of {LOOKS} looks: {looks:?}"
    );
    // The count sees this client: a valid key does try the server.
    let before = cut.traffic_while_cut();
    let probe = (cx.key("probe"), opts(&cx));
    let tried = async {
        while cut.traffic_while_cut() == before {
            // The poll's interval.
            sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::select! {
        () = tried => {}
        answer = cut_client.try_acquire(&probe.0, &probe.1) => {
            assert!(
                !matches!(answer, Ok(Some(_))),
                "acquired a key through a cut network"
            );
            assert!(
                cut.traffic_while_cut() > before,
                "a valid try_acquire on a cut network ended ({answer:?}) without trying \
                 the server: the traffic count does not see this client"
            );
        }
        () = sleep(Duration::from_secs(10)) => panic!(
            "a valid try_acquire sent nothing into the cut network within 10 s: the \
             traffic count does not see this client"
        ),
    }
    cut.heal();
    drop(cut_client);
    cx.finish().await;
}

/// The keys every backend must refuse: empty, with a NUL byte, one byte too long.
fn bad_keys(cx: &Ctx, max_key_len: usize) -> Vec<String> {
    let too_long = cx.key(&"x".repeat(max_key_len.saturating_sub(cx.prefix().len()) + 1));
    assert_eq!(too_long.len(), max_key_len + 1);
    vec![String::new(), cx.key("nul\0byte"), too_long]
}

/// Both `try_acquire` and `acquire` of `key` answer `InvalidKey`, within a second.
async fn refused_at_once(client: &dyn DistributedLock, key: &str, opts: &LockOptions) {
    let shown = format!(
        "{:?} ({} bytes)",
        key.chars().take(40).collect::<String>(),
        key.len()
    );
    let started = Instant::now();
    let limit = Duration::from_secs(5);
    // `list` takes any prefix but one with a NUL byte or longer than a key.
    let bad_prefix = key.contains('\0') || key.len() > client.capabilities().max_key_len;
    let listed = match bad_prefix {
        true => timeout(limit, client.list(key))
            .await
            .map(|r| r.map(|_| ())),
        false => Ok(Err(dlock_core::LockError::invalid_key(
            key,
            "not a bad prefix",
        ))),
    };
    let answers = [
        timeout(limit, client.try_acquire(key, opts))
            .await
            .map(|r| r.map(|_| ())),
        timeout(limit, client.acquire(key, opts))
            .await
            .map(|r| r.map(|_| ())),
        timeout(limit, client.inspect(key))
            .await
            .map(|r| r.map(|_| ())),
        listed,
    ];
    let calls = ["try_acquire", "acquire", "inspect", "list"];
    for (call, answer) in calls.into_iter().zip(answers) {
        match answer {
            Err(_) => {
                panic!("{call}({shown}) did not answer within {limit:?}: it waits on the network")
            }
            Ok(Ok(())) => panic!("{call}({shown}) accepted a bad key"),
            Ok(Err(e)) => assert_eq!(e.kind(), ErrorKind::InvalidKey, "{call}({shown}): {e}"),
        }
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(1),
        "refusing {shown} took {took:?}: not before any network I/O"
    );
}

/// Promise 13b: Out-of-range options are rejected with `InvalidConfig`.
pub async fn bad_options_are_rejected(cx: Ctx) {
    let a = cx.client().await;
    let key = cx.key("k");
    for ttl in [Duration::ZERO, Duration::from_secs(3 * 24 * 3600)] {
        let err = a
            .try_acquire(&key, &opts(&cx).ttl(ttl))
            .await
            .expect_err("bad ttl");
        assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    }
    let lease = must_take(&*a, &key, &opts(&cx)).await;
    let err = lease.extend(Duration::ZERO).await.expect_err("bad ttl");
    assert_eq!(err.kind(), ErrorKind::InvalidConfig, "{err}");
    lease
        .release()
        .await
        .expect("a lease survives a refused extend");
    cx.finish().await;
}

/// Promise 13c: Bad URLs, wrong credentials and a server of the wrong kind give the declared typed
/// error within a bound, and no error shows a password.
pub async fn bad_urls_are_rejected(cx: Ctx) {
    let key = cx.key("k");
    let cases = cx.harness().bad_urls();
    assert!(!cases.is_empty(), "the harness lists no bad URLs");
    for (url, kind) in cases {
        let attempt = async {
            let client = cx.harness().connect(&url).await?;
            client.try_acquire(&key, &opts(&cx)).await.map(|_| ())
        };
        let err = match timeout(Duration::from_secs(20), attempt).await {
            Ok(Ok(())) => panic!("{url}: accepted, expected {kind}"),
            Ok(Err(e)) => e,
            Err(_) => panic!("{url}: no answer within 20 s, expected {kind}"),
        };
        assert_eq!(err.kind(), kind, "{url}: {err}");
        if let Some(password) = password_of(&url) {
            for text in [err.to_string(), format!("{err:?}")] {
                assert!(
                    !text.contains(password),
                    "{url}: the error shows the password: {text}"
                );
            }
        }
    }
    cx.finish().await;
}

fn password_of(url: &str) -> Option<&str> {
    let authority = url.split_once("://")?.1.split('/').next()?;
    let userinfo = authority.rsplit_once('@')?.0;
    let password = userinfo.split_once(':')?.1;
    (password.len() >= 3).then_some(password)
}

/// Promise 14: With nothing behind the address, acquire fails with `Unavailable` within the connect
/// timeout.
pub async fn unavailable_server(cx: Ctx) {
    let started = Instant::now();
    let attempt = async {
        let client = cx.harness().unreachable_client().await?;
        client
            .acquire(&cx.key("k"), &waiting(&cx, Duration::from_secs(2)))
            .await
            .map(|_| ())
    };
    let err = match timeout(Duration::from_secs(20), attempt).await {
        Ok(Ok(())) => panic!("acquired from a server that does not exist"),
        Ok(Err(e)) => e,
        Err(_) => panic!("no answer within 20 s from an unreachable server"),
    };
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    tracing::info!(test = cx.test(), took = ?started.elapsed(), "unreachable server reported");
    cx.finish().await;
}

/// Promise 14b: A server that accepts connections but never answers does not make acquire hang:
/// it ends (`Unavailable` or `Timeout`) within its wait plus the connect timeout.
pub async fn black_holed_server_does_not_hang(cx: Ctx) {
    let (a, cut) = cx
        .harness()
        .partitioned_client()
        .await
        .unwrap_or_else(|e| panic!("{}", cx.unreachable_message(&e)));
    cut.cut();
    let (key, opts) = (cx.key("k"), waiting(&cx, Duration::from_secs(2)));
    let attempt = a.acquire(&key, &opts);
    match timeout(Duration::from_secs(20), attempt).await {
        Ok(Ok(_)) => panic!("acquired through a cut network"),
        Ok(Err(e)) => assert!(
            matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Timeout),
            "{e}"
        ),
        Err(_) => panic!("acquire hung for 20 s on a black-holed server"),
    }
    cut.heal();
    cx.finish().await;
}
