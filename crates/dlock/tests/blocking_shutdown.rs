//! Dropping the last blocking client stops its runtime thread. A test binary of its own:
//! the threads of a process are counted, and no other test may start clients meanwhile.

use std::time::Duration;

use dlock::LockOptions;

/// Threads of this process named as the blocking runtime names its thread (Linux: /proc).
fn runtime_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("these tests need /proc (Linux)")
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "dlock-blocking")
        .count()
}

/// Whether `threads(runtime_threads())` holds within a generous bound (a new thread sets
/// its name when it starts running; a stopped one leaves /proc when it has exited).
fn soon(threads: impl Fn(usize) -> bool) -> bool {
    let until = std::time::Instant::now() + Duration::from_secs(5);
    while !threads(runtime_threads()) {
        if std::time::Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    true
}

#[test]
fn dropping_the_last_client_stops_its_thread() {
    let lock = dlock::blocking::connect("memory://blocking-shutdown").expect("connect");
    let lease = lock.acquire("k", &LockOptions::new()).expect("acquire");
    assert!(soon(|n| n >= 1), "the runtime runs on a thread of its own");
    let clone = lock.clone();
    drop(lock);
    drop(clone);
    // A lease keeps the runtime alive: it still renews.
    assert!(runtime_threads() >= 1);
    assert!(!lease.is_lost());
    drop(lease);
    assert!(soon(|n| n == 0), "the runtime thread stops");
    let again = dlock::blocking::connect("memory://blocking-shutdown").expect("connect");
    let lease = again
        .try_acquire("k", &LockOptions::new().ttl(Duration::from_secs(30)))
        .expect("try_acquire")
        .expect("the dropped lease was released before the runtime stopped");
    lease.release().expect("release");
}
