//! After the run, once every worker is gone: every key free for a fresh client, and
//! nothing of the run left on the servers.

use std::sync::Arc;
use std::time::Duration;

use dlock::{DistributedLock, LockOptions, Wait};

use super::Timings;
use crate::check::Violation;
use crate::clock::{ms, now_ns};
use crate::report::FinalCheck;

/// After the run: every key is free for a fresh client at once.
pub(super) async fn final_check(
    url: &str,
    keys: &[String],
    timings: &Timings,
    ttl: Duration,
    violations: &mut Vec<Violation>,
) -> FinalCheck {
    let mut out = FinalCheck {
        keys: keys.len(),
        ..FinalCheck::default()
    };
    let client: Arc<dyn DistributedLock> = match dlock::connect(url).await {
        Ok(c) => c,
        Err(e) => {
            violations.push(Violation::new(
                "final check",
                format!("a fresh client cannot connect: {e}"),
            ));
            return out;
        }
    };
    let opts = LockOptions::new().ttl(ttl);
    for key in keys {
        let started = now_ns();
        match client.try_acquire(key, &opts).await {
            Ok(Some(lease)) => {
                out.free_at_once += 1;
                if let Err(e) = lease.release().await {
                    violations.push(Violation::new(
                        "final check",
                        format!("{key}: release: {e}"),
                    ));
                }
            }
            Ok(None) => {
                let wait = opts.wait(Wait::For(2 * timings.silence + Duration::from_secs(2)));
                let freed = match client.acquire(key, &wait).await {
                    Ok(lease) => {
                        let _ = lease.release().await;
                        format!("free {:.0} ms later", ms(now_ns() - started))
                    }
                    Err(e) => format!("still not free: {e}"),
                };
                violations.push(Violation::new(
                    "left held",
                    format!("{key} was held after every worker had released and exited ({freed})"),
                ));
            }
            Err(e) => violations.push(Violation::new(
                "final check",
                format!("{key}: try_acquire: {e}"),
            )),
        }
    }
    out
}

/// After the run: nothing under the run's key stem is left on the servers (records the
/// residue in `out`, a violation per item).
pub(super) async fn check_residue(
    url: &str,
    stem: &str,
    out: &mut FinalCheck,
    violations: &mut Vec<Violation>,
) {
    match crate::residue::residue(url, stem).await {
        Ok(left) => {
            out.residue_checked = true;
            for item in &left {
                violations.push(Violation::new(
                    "residue",
                    format!("left on the server: {item}"),
                ));
            }
            out.residue = left;
        }
        Err(e) => violations.push(Violation::new(
            "residue check",
            format!("could not read the servers' lock state: {e}"),
        )),
    }
}
