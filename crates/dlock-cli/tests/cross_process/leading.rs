//! `dlock elect` and `dlock leader` against a real backend, across processes.

use super::*;

/// The lines a child prints on stdout, as they come, read by a thread of their own.
pub(super) fn lines_of(child: &mut Child) -> std::sync::mpsc::Receiver<String> {
    let stdout = BufReader::new(child.stdout.take().expect("stdout is piped"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in stdout.lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// `dlock elect` with `value`, its command printing `$DLOCK_VALUE $DLOCK_TERM`, then
/// sleeping until it is stopped.
pub(super) fn spawn_elect(url: &str, key: &str, value: &str) -> Child {
    Command::new(DLOCK)
        .args([
            "elect", "--url", url, "--key", key, "--value", value, "--ttl", "2s",
        ])
        .args([
            "--",
            "sh",
            "-c",
            "echo \"$DLOCK_VALUE $DLOCK_TERM\"; exec sleep 60",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn dlock elect")
}

/// The term in a `VALUE TERM` line of [`spawn_elect`]'s command, checking the value.
pub(super) fn term_of(line: &str, value: &str) -> u64 {
    line.strip_prefix(&format!("{value} "))
        .and_then(|term| term.parse().ok())
        .unwrap_or_else(|| panic!("expected \"{value} <term>\", got {line:?}"))
}

/// `dlock elect` runs its command only while leading, one leader at a time, and hands
/// over when the leader stops; `dlock leader` shows the leader, and `--watch` follows it.
pub(super) fn elect_runs_one_leader_and_leader_follows_it(url: &str) {
    let key = unique("elect");
    let wait = Duration::from_secs(30);
    let mut first = spawn_elect(url, &key, "first");
    let first_lines = lines_of(&mut first);
    let term = term_of(
        &first_lines.recv_timeout(wait).expect("first leads"),
        "first",
    );
    let shown = dlock(&["leader", "--url", url, "--key", &key]);
    assert_eq!(
        String::from_utf8_lossy(&shown.stdout).trim(),
        format!("leader: first term={term}"),
        "{shown:?}"
    );
    let mut watcher = Command::new(DLOCK)
        .args(["leader", "--url", url, "--key", &key, "--watch", "--json"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn dlock leader --watch");
    let watched = lines_of(&mut watcher);
    assert_eq!(
        watched
            .recv_timeout(wait)
            .expect("the watcher prints the leader"),
        format!(r#"{{"key":"{key}","leader":{{"value":"first","term":{term}}}}}"#)
    );
    let mut second = spawn_elect(url, &key, "second");
    let second_lines = lines_of(&mut second);
    assert!(
        second_lines.recv_timeout(Duration::from_secs(1)).is_err(),
        "the second candidate ran its command while the first led"
    );
    common::sigterm(&first);
    assert_eq!(first.wait().unwrap().code(), Some(128 + 15));
    let next = term_of(
        &second_lines.recv_timeout(wait).expect("second leads"),
        "second",
    );
    assert!(next != term, "a new leader has a new term");
    let expected = format!(r#"{{"key":"{key}","leader":{{"value":"second","term":{next}}}}}"#);
    let mut seen = Vec::new();
    while seen.last() != Some(&expected) {
        match watched.recv_timeout(wait) {
            Ok(line) => seen.push(line),
            Err(_) => panic!("the watcher never showed the second leader: {seen:?}"),
        }
    }
    common::sigterm(&second);
    assert_eq!(second.wait().unwrap().code(), Some(128 + 15));
    common::sigterm(&watcher);
    assert!(watcher.wait().unwrap().success());
}
