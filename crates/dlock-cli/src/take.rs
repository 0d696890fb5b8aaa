//! Taking the lock: acquire its keys unless one of the signals dlock catches comes first,
//! and those signals, caught from before the acquire to the end.

use dlock::{LeaseSet, LockError, LockExt as _};
use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

use crate::args::LockArgs;
use crate::output::say;

/// Connect to `url` and take the keys of `args`, all or none
/// ([`acquire_all`](dlock::LockExt::acquire_all)), unless SIGINT, SIGTERM, SIGHUP or
/// SIGQUIT comes first: then give the wait up and answer `Err(exit code)` (128 + the
/// signal's number).
pub(crate) async fn take(
    args: &LockArgs,
    url: &str,
    signals: &mut Signals,
) -> Result<Result<LeaseSet, u8>, LockError> {
    let acquire = async {
        let lock = dlock::connect(url).await?;
        lock.acquire_all(&args.key, &args.options()).await
    };
    let sig = tokio::select! {
        taken = acquire => return Ok(Ok(taken?)),
        sig = signals.next() => sig,
    };
    say!(
        "dlock: {sig} while waiting for {}: gave up the wait",
        waited_for(&args.key)
    );
    Ok(Err(128 + sig as u8))
}

/// The keys a wait was for, as messages name them: `"k"`, or the set in the order it is
/// taken (ascending, each key once), `"a", "b"`.
fn waited_for(keys: &[String]) -> String {
    let mut keys: Vec<&String> = keys.iter().collect();
    keys.sort_unstable();
    keys.dedup();
    keys.iter()
        .map(|key| format!("{key:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The signals dlock catches from before the acquire to the end: SIGINT, SIGTERM, SIGHUP
/// (the terminal went away) and SIGQUIT.
pub(crate) struct Signals([(Signal, Option<tokio::signal::unix::Signal>); 4]);

impl Signals {
    pub(crate) fn install() -> Self {
        let catch = |sig, kind| (sig, signal(kind).ok());
        Self([
            catch(Signal::SIGINT, SignalKind::interrupt()),
            catch(Signal::SIGTERM, SignalKind::terminate()),
            catch(Signal::SIGHUP, SignalKind::hangup()),
            catch(Signal::SIGQUIT, SignalKind::quit()),
        ])
    }

    /// The next of these signals.
    pub(crate) async fn next(&mut self) -> Signal {
        async fn recv(caught: &mut (Signal, Option<tokio::signal::unix::Signal>)) -> Signal {
            let received = match &mut caught.1 {
                Some(stream) => stream.recv().await.is_some(),
                None => false,
            };
            if !received {
                std::future::pending::<()>().await;
            }
            caught.0
        }
        let [int, term, hup, quit] = &mut self.0;
        tokio::select! {
            sig = recv(int) => sig,
            sig = recv(term) => sig,
            sig = recv(hup) => sig,
            sig = recv(quit) => sig,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_names_its_keys_in_the_order_they_are_taken() {
        let keys = |ks: &[&str]| ks.iter().map(|k| (*k).to_owned()).collect::<Vec<_>>();
        assert_eq!(waited_for(&keys(&["k"])), r#""k""#);
        assert_eq!(waited_for(&keys(&["b", "a\nx", "b"])), r#""a\nx", "b""#);
    }
}
