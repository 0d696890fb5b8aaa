//! The watch on held keys: one watch stream per client carries one watch per held key
//! ([`Conn::watch_held`]), so a hold costs one message to watch (no round trip, no stream
//! of its own) and nothing per renewal. A deletion fires that hold's lost signal. The
//! watch starts [`WATCH_AFTER`] into the hold, from the revision the hold was won at, so
//! a short hold costs no watch at all and a deletion meanwhile is still seen. The holds
//! whose watch is not due yet wait in one queue, which one task of the client starts
//! ([`Due`]): a hold costs no task or timer of its own.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use etcd_client::{
    Client, EventType, GetOptions, WatchFilterType, WatchOptions, WatchRequestSender, WatchResponse,
};
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::NAME;
use crate::connection::Conn;

/// How long into a hold its watch starts. Under load a watch costs the server (and this
/// client) a create, a cancel and a catch-up from a past revision, about as much as the
/// lock's put: measured, holds of 0 ms on 8 and 32 keys at once cycled 1.5 to 1.6 times
/// faster without it. The watch starts at the revision the hold was won at, so a
/// deletion before it is still delivered: `lost()` fires at most this much later (etcd
/// catches a watch from the past up every 100 ms anyway).
const WATCH_AFTER: Duration = Duration::from_millis(100);

/// How much earlier than due the starter may start a watch, so that under a steady stream
/// of holds it wakes at most once per this much time, not once per hold (a hold shorter
/// than `WATCH_AFTER - START_EARLY` still costs no watch).
const START_EARLY: Duration = Duration::from_millis(10);

/// How long to wait before opening the stream again after it broke.
const REOPEN_AFTER: Duration = Duration::from_millis(200);

/// The client's watch stream on held keys, started with the first hold.
#[derive(Debug, Default)]
pub(crate) struct HeldKeys {
    commands: OnceLock<mpsc::UnboundedSender<Command>>,
    next_id: AtomicI64,
    due: Arc<Due>,
}

/// The holds whose watch is not sent yet, oldest first. Every hold waits the same
/// [`WATCH_AFTER`], so the order they were made in is the order they fall due; one task
/// (started with the first hold, ended with the client) sends them, and is woken by a hold
/// only when the queue was empty.
#[derive(Debug, Default)]
struct Due {
    queue: Mutex<VecDeque<Queued>>,
    wake: Arc<Notify>,
}

/// A hold's watch in [`Due`]: when it falls due, the watch, and the hold's phase.
type Queued = (Instant, Watched, Arc<Mutex<Phase>>);

impl Due {
    /// Queue `watched`, due [`WATCH_AFTER`] from now (taken under the queue's lock, so the
    /// queue stays in due order).
    fn push(&self, watched: Watched, phase: Arc<Mutex<Phase>>) {
        let mut queue = lock(&self.queue);
        let was_empty = queue.is_empty();
        queue.push_back((Instant::now() + WATCH_AFTER, watched, phase));
        drop(queue);
        if was_empty {
            self.wake.notify_one();
        }
    }

    /// Send every watch due by now or within [`START_EARLY`] whose hold still holds;
    /// answer when the next one falls due (at least `START_EARLY` away), `None` when none
    /// waits.
    fn send_due(&self, commands: &mpsc::WeakUnboundedSender<Command>) -> Option<Instant> {
        let horizon = Instant::now() + START_EARLY;
        let mut queue = lock(&self.queue);
        while let Some((at, ..)) = queue.front() {
            if *at > horizon {
                return Some(*at);
            }
            let (_, watched, phase) = queue.pop_front().expect("a front");
            let mut phase = lock(&phase);
            if *phase == Phase::Pending {
                if let Some(tx) = commands.upgrade() {
                    let _ = tx.send(Command::Watch(watched));
                }
                *phase = Phase::Started;
            }
        }
        None
    }
}

impl Drop for Due {
    fn drop(&mut self) {
        // Lets the starter see the client gone.
        self.wake.notify_one();
    }
}

/// The starter: sends the watches of [`Due`] as they fall due, until the client is gone.
/// Started with the watch stream's task, by the client's first hold.
async fn start_when_due(
    due: Weak<Due>,
    wake: Arc<Notify>,
    commands: mpsc::WeakUnboundedSender<Command>,
) {
    loop {
        let next = match due.upgrade() {
            Some(due) => due.send_due(&commands),
            None => return,
        };
        match next {
            Some(at) => tokio::time::sleep_until(at).await,
            None => wake.notified().await,
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

#[derive(Debug)]
enum Command {
    Watch(Watched),
    Cancel(i64),
    /// A response read on the stream of that generation.
    Response(u64, WatchResponse),
    /// The stream of that generation ended or failed.
    Broken(u64),
    Reopen,
}

#[derive(Debug)]
struct Watched {
    id: i64,
    key: String,
    /// The key's create revision: a key of that name with another one is not ours.
    rev: i64,
    /// The first revision to watch from.
    from: i64,
    deleted: oneshot::Sender<()>,
}

/// A hold's watch: the watch is canceled when this is dropped (or never made).
#[derive(Debug)]
pub(crate) struct HeldWatch {
    id: i64,
    commands: mpsc::UnboundedSender<Command>,
    /// `Started` once the watch was sent; `Dropped` keeps a late start from sending it.
    phase: Arc<Mutex<Phase>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Pending,
    Started,
    Dropped,
}

impl Drop for HeldWatch {
    fn drop(&mut self) {
        let mut phase = lock(&self.phase);
        if *phase == Phase::Started {
            let _ = self.commands.send(Command::Cancel(self.id));
        }
        *phase = Phase::Dropped;
    }
}

impl Conn {
    /// Watch the deletion of `key` (create revision `rev`) from revision `from` on. The
    /// receiver resolves when it is deleted; it fails when the watch is canceled.
    pub(crate) fn watch_held(
        &self,
        key: &str,
        rev: i64,
        from: i64,
    ) -> (HeldWatch, oneshot::Receiver<()>) {
        let keys = &self.shared.keys;
        let commands = keys
            .commands
            .get_or_init(|| {
                let (tx, rx) = mpsc::unbounded_channel();
                tokio::spawn(run(self.client.clone(), self.timeout, tx.downgrade(), rx));
                let due = &keys.due;
                tokio::spawn(start_when_due(
                    Arc::downgrade(due),
                    due.wake.clone(),
                    tx.downgrade(),
                ));
                tx
            })
            .clone();
        let id = keys.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (deleted, fired) = oneshot::channel();
        let watched = Watched {
            id,
            key: key.to_owned(),
            rev,
            from,
            deleted,
        };
        let phase = Arc::new(Mutex::new(Phase::Pending));
        keys.due.push(watched, phase.clone());
        (
            HeldWatch {
                id,
                commands,
                phase,
            },
            fired,
        )
    }
}

fn options(w: &Watched) -> WatchOptions {
    WatchOptions::new()
        .with_start_revision(w.from)
        .with_filters([WatchFilterType::NoPut])
        .with_watch_id(w.id)
}

/// The stream's task: the requests go out from here; a reader task forwards the responses.
/// It ends when every sender (the client and its holds) is gone.
async fn run(
    client: Arc<Client>,
    timeout: Duration,
    me: mpsc::WeakUnboundedSender<Command>,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut watched: HashMap<i64, Watched> = HashMap::new();
    let mut stream: Option<WatchRequestSender> = None;
    let mut generation = 0u64;
    let mut reopening = false;
    while let Some(command) = commands.recv().await {
        match command {
            Command::Watch(w) => {
                if let Some(sender) = &mut stream {
                    let sent = sender.watch(w.key.as_str(), Some(options(&w))).await;
                    watched.insert(w.id, w);
                    if sent.is_err() {
                        // Reopened with every watch, this one included.
                        let _ = me.upgrade().map(|tx| tx.send(Command::Broken(generation)));
                    }
                } else {
                    watched.insert(w.id, w);
                    reopening = true;
                    let _ = me.upgrade().map(|tx| tx.send(Command::Reopen));
                }
            }
            Command::Cancel(id) => {
                if watched.remove(&id).is_some()
                    && let Some(sender) = &mut stream
                {
                    let _ = sender.cancel(id).await;
                }
            }
            Command::Response(g, response) if g == generation => {
                handle(&client, timeout, &mut watched, &mut stream, response).await;
            }
            Command::Broken(g) if g == generation => {
                stream = None;
                if !reopening {
                    reopening = true;
                    let me = me.clone();
                    tokio::spawn(async move {
                        tokio::time::sleep(REOPEN_AFTER).await;
                        let _ = me.upgrade().map(|tx| tx.send(Command::Reopen));
                    });
                }
            }
            Command::Reopen => {
                reopening = false;
                if stream.is_some() || watched.is_empty() {
                    continue;
                }
                generation += 1;
                match open(&client, timeout, &watched, generation, me.clone()).await {
                    Ok(sender) => stream = Some(sender),
                    Err(e) => {
                        tracing::debug!(backend = NAME, error = %e, "cannot open the watch on held keys; retrying");
                        let _ = me.upgrade().map(|tx| tx.send(Command::Broken(generation)));
                    }
                }
            }
            Command::Response(..) | Command::Broken(_) => {} // from an old stream
        }
    }
}

/// Open a stream carrying a watch for each of `watched`, and its reader task.
async fn open(
    client: &Client,
    timeout: Duration,
    watched: &HashMap<i64, Watched>,
    generation: u64,
    me: mpsc::WeakUnboundedSender<Command>,
) -> Result<WatchRequestSender, String> {
    let mut all = watched.values();
    let Some(first) = all.next() else {
        return Err("nothing to watch".into());
    };
    let mut watch_client = client.watch_client();
    let opened = watch_client.watch(first.key.as_str(), Some(options(first)));
    let (mut sender, mut responses) = match tokio::time::timeout(timeout, opened).await {
        Ok(Ok(stream)) => stream.split(),
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no answer within {timeout:?}")),
    };
    tokio::spawn(async move {
        loop {
            let command = match responses.message().await {
                Ok(Some(response)) => Command::Response(generation, response),
                Ok(None) | Err(_) => Command::Broken(generation),
            };
            let broken = matches!(command, Command::Broken(_));
            match me.upgrade() {
                Some(tx) if tx.send(command).is_ok() && !broken => {}
                _ => return,
            }
        }
    });
    for w in all {
        sender
            .watch(w.key.as_str(), Some(options(w)))
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(sender)
}

/// A deletion fires its hold's signal. A watch the server canceled (its start revision
/// was compacted) is replaced by one read of the key and a watch from that read on.
async fn handle(
    client: &Client,
    timeout: Duration,
    watched: &mut HashMap<i64, Watched>,
    stream: &mut Option<WatchRequestSender>,
    response: WatchResponse,
) {
    let id = response.watch_id();
    if response.canceled() {
        let Some(mut w) = watched.remove(&id) else {
            return;
        };
        let mut kv = client.kv_client();
        let read = kv.get(w.key.as_str(), Some(GetOptions::new().with_keys_only()));
        match tokio::time::timeout(timeout, read).await {
            Ok(Ok(answer)) => {
                let ours = answer.kvs().first().map(|kv| kv.create_revision()) == Some(w.rev);
                if !ours {
                    let _ = w.deleted.send(());
                    return;
                }
                w.from = answer.header().map_or(w.from, |h| h.revision() + 1);
                if let Some(sender) = stream
                    && sender
                        .watch(w.key.as_str(), Some(options(&w)))
                        .await
                        .is_err()
                {
                    *stream = None;
                }
                watched.insert(id, w);
            }
            // The key stays unwatched: its loss is then found at release.
            _ => tracing::debug!(backend = NAME, key = w.key, "cannot re-watch a held key"),
        }
        return;
    }
    let deleted = response
        .events()
        .iter()
        .any(|e| e.event_type() == EventType::Delete);
    if deleted && let Some(w) = watched.remove(&id) {
        let _ = w.deleted.send(());
        if let Some(sender) = stream {
            let _ = sender.cancel(id).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(due: &Due, id: i64) -> Arc<Mutex<Phase>> {
        let (deleted, _) = oneshot::channel();
        let watched = Watched {
            id,
            key: format!("k{id}"),
            rev: 1,
            from: 2,
            deleted,
        };
        let phase = Arc::new(Mutex::new(Phase::Pending));
        due.push(watched, phase.clone());
        phase
    }

    fn sent(rx: &mut mpsc::UnboundedReceiver<Command>) -> Vec<i64> {
        let mut ids = Vec::new();
        while let Ok(command) = rx.try_recv() {
            match command {
                Command::Watch(w) => ids.push(w.id),
                other => panic!("only watches are sent: {other:?}"),
            }
        }
        ids
    }

    /// Let the starter run at the current (paused) instant.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn watches_start_when_due_in_batches_and_never_for_a_dropped_hold() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let due = Arc::new(Due::default());
        tokio::spawn(start_when_due(
            Arc::downgrade(&due),
            due.wake.clone(),
            tx.downgrade(),
        ));
        queued(&due, 1);
        tokio::time::advance(Duration::from_millis(5)).await;
        let dropped = queued(&due, 2);
        *dropped.lock().unwrap() = Phase::Dropped;
        queued(&due, 3);
        tokio::time::advance(Duration::from_millis(50)).await;
        queued(&due, 4);
        settle().await;
        assert!(sent(&mut rx).is_empty(), "nothing is due yet");
        tokio::time::advance(Duration::from_millis(40)).await;
        settle().await;
        assert!(sent(&mut rx).is_empty(), "none before the first is due");
        tokio::time::advance(Duration::from_millis(5)).await; // 100 ms: the first is due
        settle().await;
        assert_eq!(
            sent(&mut rx),
            [1, 3],
            "with the first, those due within 10 ms"
        );
        assert_eq!(*dropped.lock().unwrap(), Phase::Dropped);
        tokio::time::advance(Duration::from_millis(54)).await;
        settle().await;
        assert!(sent(&mut rx).is_empty(), "the last is due at 155 ms");
        tokio::time::advance(Duration::from_millis(1)).await;
        settle().await;
        assert_eq!(sent(&mut rx), [4]);
        // The queue ran empty: a new hold wakes the starter again.
        queued(&due, 5);
        tokio::time::advance(WATCH_AFTER).await;
        settle().await;
        assert_eq!(sent(&mut rx), [5]);
    }
}
