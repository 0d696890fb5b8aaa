//! `dlock hold`: acquire the lock (its keys, all or none) and hold it until --for elapses
//! or a signal comes, printing what happens on stdout.

use dlock::LockError;

use crate::args::HoldArgs;
use crate::exit;
use crate::output::{out, shown_key};
use crate::take::{Signals, take};

pub(crate) async fn hold(args: HoldArgs) -> Result<u8, LockError> {
    let url = args.lock.url()?;
    let mut signals = Signals::install();
    let set = match take(&args.lock, &url, &mut signals).await? {
        Ok(set) => set,
        Err(code) => return Ok(code),
    };
    for lease in set.leases() {
        out!(
            "acquired key={} token={}",
            shown_key(lease.key()),
            lease.fencing_token()
        );
    }
    let elapsed = async {
        match args.hold_for {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        (key, reason) = set.lost() => {
            match args.lock.several_keys() {
                true => out!("lost: key={}: {reason}", shown_key(key)),
                false => out!("lost: {reason}"),
            }
            let _ = set.release().await;
            return Ok(exit::SOFTWARE);
        }
        _ = elapsed => {}
        _ = signals.next() => {}
    }
    set.release().await?;
    out!("released");
    Ok(0)
}
