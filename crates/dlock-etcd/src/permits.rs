//! A permit attempt's wait ([`Attempt::wait_for_permit`]): the keys older than ours in the
//! permits' range are counted against our limit, and each deletion among them, delivered
//! by a watch on the range, is counted off locally until fewer than the limit are left.
//! No read per release: the names of the older keys are known, and no key can become older
//! than ours.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use dlock_core::{LockError, Result};
use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchResponse, WatchStream};

use crate::NAME;
use crate::acquire::{Attempt, Outcome, WATCH_BREAKS};
use crate::error::{Error, lease_lost};
use crate::lease::KeyLease;

/// The watch ids a permit waiter puts on the permits' range, on one stream. Two watches
/// for the reason the lock's waiter watches its predecessor twice: etcd sometimes files a
/// watch from now in its slow (100 ms) catch-up group; each deletion is counted once
/// however many watches deliver it.
const PERMIT_WATCHES: [i64; 2] = [1, 2];

/// What a watch response means to a permit waiter.
enum Heard {
    /// Our own key was deleted.
    OwnDeleted,
    /// Older keys were deleted; the revision of the last.
    Freed(i64),
    /// The server canceled a watch.
    Canceled(String),
    Nothing,
}

impl Attempt<'_> {
    /// Wait until fewer than `limit` permit keys are older than ours (created at `rev`),
    /// keeping our lease alive meanwhile.
    ///
    /// Both watches are created (from the current revision, served at once) before the
    /// read that names the older keys, and that read covers every revision up to their
    /// start: a deletion before it is missing from the read, one after it arrives on each
    /// watch, in revision order, with our own key's deletion among them (the range holds
    /// our key too). So once the count drops below the limit at an event's revision, our
    /// key lived until then, and the hold's watch can take over from there.
    pub(crate) async fn wait_for_permit(
        &self,
        lease: &mut KeyLease,
        rev: i64,
        limit: u32,
    ) -> Result<Outcome> {
        const OP: &str = "acquire";
        let limit = limit as usize;
        let mut breaks = 0;
        loop {
            let (mut stream, floor) = self.watch_permits().await?;
            let (older, seen) = self.read_older(rev, floor, false).await?;
            let mut older: HashSet<Vec<u8>> = older
                .into_iter()
                .flatten()
                .map(|kv| kv.key().to_vec())
                .collect();
            if older.len() < limit {
                return Ok(Outcome::Held {
                    rev,
                    seen,
                    watch: None,
                    waited: true,
                });
            }
            let why = loop {
                let response = tokio::select! {
                    message = stream.message() => match message {
                        Ok(Some(response)) => response,
                        Ok(None) => break (false, "the watch stream ended".to_owned()),
                        Err(e) => break (false, e.to_string()),
                    },
                    () = lease.needs_tending() => {
                        lease.tend(self.key).await?;
                        continue;
                    }
                };
                match self.hear(&response, &mut older) {
                    Heard::OwnDeleted => {
                        return Err(lease_lost(
                            self.key,
                            "our waiting key was deleted (its lease expired or was revoked)",
                        ));
                    }
                    Heard::Freed(at) => {
                        // A permit ahead of us freed: one wake-up, no request.
                        self.conn.shared.wakeups.fetch_add(1, Ordering::Relaxed);
                        breaks = 0;
                        if older.len() < limit {
                            return Ok(Outcome::Held {
                                rev,
                                seen: at,
                                watch: None,
                                waited: true,
                            });
                        }
                    }
                    Heard::Canceled(why) => break (true, why),
                    Heard::Nothing => {}
                }
            };
            breaks += 1;
            tracing::debug!(
                backend = NAME,
                key = self.key,
                why = why.1,
                "a permit waiter's watch broke; counting again"
            );
            if breaks > WATCH_BREAKS {
                return Err(match why {
                    (true, why) => LockError::backend(NAME, OP, why),
                    (false, why) => LockError::unavailable(NAME, OP, why),
                });
            }
        }
    }

    /// Count the deletions in `response` off `older`. Every event of the response is
    /// looked at before answering, so our key's deletion is never passed over.
    fn hear(&self, response: &WatchResponse, older: &mut HashSet<Vec<u8>>) -> Heard {
        if response.canceled() {
            return Heard::Canceled(format!(
                "the server canceled the watch: {}",
                response.cancel_reason()
            ));
        }
        let mut freed = None;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            if event.event_type() != EventType::Delete {
                continue;
            }
            if kv.key() == self.my_key.as_bytes() {
                return Heard::OwnDeleted;
            }
            if older.remove(kv.key()) {
                freed = Some(kv.mod_revision());
            }
        }
        freed.map_or(Heard::Nothing, Heard::Freed)
    }

    /// One watch stream with [`PERMIT_WATCHES`] on the deletions in the permits' range,
    /// from the current revision, and the revision a read must cover: the newest of the
    /// watches' starts and of any event delivered before both were created.
    async fn watch_permits(&self) -> Result<(WatchStream, i64), Error> {
        const OP: &str = "acquire";
        let (start, end) = self.ranges().into_iter().next().ok_or(Error::Protocol {
            op: OP,
            what: "a permit attempt without a range",
        })?;
        let options = |id: i64| {
            WatchOptions::new()
                .with_range(end.as_str())
                .with_filters([WatchFilterType::NoPut])
                .with_watch_id(id)
        };
        let open = || {
            let mut client = self.conn.client.watch_client();
            let (start, first) = (start.clone(), options(PERMIT_WATCHES[0]));
            let others: Vec<WatchOptions> =
                PERMIT_WATCHES[1..].iter().map(|&id| options(id)).collect();
            async move {
                let mut stream = client.watch(start.as_str(), Some(first)).await?;
                for options in others {
                    stream.watch(start.as_str(), Some(options)).await?;
                }
                let (mut created, mut floor) = (0, 0);
                while created < PERMIT_WATCHES.len() {
                    let response = stream.message().await?.ok_or_else(|| {
                        etcd_client::Error::WatchError(
                            "the watch stream ended before the watch was created".into(),
                        )
                    })?;
                    if response.canceled() {
                        return Err(etcd_client::Error::WatchError(format!(
                            "the server did not create the watch: {}",
                            response.cancel_reason()
                        )));
                    }
                    created += usize::from(response.created());
                    floor = response
                        .events()
                        .iter()
                        .filter_map(|e| e.kv().map(|kv| kv.mod_revision()))
                        .chain(response.header().map(|h| h.revision()))
                        .fold(floor, i64::max);
                }
                Ok((stream, floor))
            }
        };
        self.conn.call(OP, open).await
    }
}
