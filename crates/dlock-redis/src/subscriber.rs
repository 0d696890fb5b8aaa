//! Calls to waiters: one subscriber connection per client (per server), multiplexing every
//! channel its waiters listen on.
//!
//! A waiter subscribes (and waits for the server's confirmation) *before* it re-tries the
//! key, so a call between its failed attempt and the subscription is never missed: the
//! re-try sees it. Every message (the token of the waiter whose turn it is) is forwarded to each listener of the
//! channel as a [`Notice`] tagged with the listener's node index. When the connection
//! breaks, every listener gets [`Event::Broken`] and its subscription reports itself dead,
//! so the waiter subscribes again (on a new connection) and re-tries.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use redis::AsyncConnectionConfig;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, watch};

use crate::error::Error;
use crate::node::{Connecting, Endpoint};

pub(crate) struct Subscriber {
    endpoint: Arc<Endpoint>,
    addr: Arc<str>,
    connection_config: AsyncConnectionConfig,
    connect_timeout: Duration,
    response_timeout: Duration,
    state: Arc<Mutex<State>>,
}

#[derive(Default)]
struct State {
    next_id: u64,
    next_listener: u64,
    link: Option<Connecting<Link>>,
    channels: HashMap<String, Channel>,
}

#[derive(Default)]
struct Channel {
    listeners: HashMap<u64, Listener>,
}

struct Listener {
    tag: usize,
    notices: mpsc::Sender<Notice>,
}

impl Channel {
    fn tell(&self, event: &Event) {
        for listener in self.listeners.values() {
            let notice = Notice {
                node: listener.tag,
                event: event.clone(),
            };
            if let Err(mpsc::error::TrySendError::Full(_)) = listener.notices.try_send(notice) {
                // The waiter reads between attempts; one this far behind wakes at its
                // next queue refresh instead of this call.
                tracing::debug!(
                    backlog = NOTICE_BACKLOG,
                    "a waiter's backlog of announcements is full; this one is dropped"
                );
            }
        }
    }
}

/// Most announcements one waiter keeps unread. A waiter drains them before each attempt
/// and reads them while it sleeps, so the backlog only fills if far more releases than this
/// happen on its key during one attempt; what comes beyond it is dropped (the waiter then
/// wakes by its fallback timer), so a stalled waiter cannot grow memory without bound.
pub(crate) const NOTICE_BACKLOG: usize = 1024;

/// Something a waiter hears from one node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    /// The tag the subscription was made with (the node's index).
    pub node: usize,
    /// What happened.
    pub event: Event,
}

/// What a [`Notice`] says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// The server called the waiter with this token: the key is free and its turn.
    Called(String),
    /// The subscriber connection broke: announcements may have been missed; subscribe
    /// again and re-try.
    Broken,
}

/// One subscriber connection: requests go to its controller task in order.
#[derive(Clone)]
struct Link {
    id: u64,
    requests: mpsc::UnboundedSender<Request>,
    health: Arc<Health>,
}

struct Health {
    alive: AtomicBool,
    killed: watch::Sender<bool>,
}

enum Request {
    Subscribe(String, oneshot::Sender<Result<(), Error>>),
    Unsubscribe(String),
}

/// A confirmed subscription to one channel. Dropping it unsubscribes once no other waiter
/// of this client listens on the channel.
pub struct Subscription {
    state: Arc<Mutex<State>>,
    channel: String,
    listener: u64,
    health: Arc<Health>,
}

impl Subscription {
    /// Whether the connection carrying this subscription still works. A dead subscription
    /// hears nothing more: subscribe again.
    pub fn is_alive(&self) -> bool {
        self.health.alive.load(Ordering::SeqCst)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut state = lock(&self.state);
        let Some(channel) = state.channels.get_mut(&self.channel) else {
            return;
        };
        channel.listeners.remove(&self.listener);
        if channel.listeners.is_empty() {
            state.channels.remove(&self.channel);
            if let Some(link) = state.live_link() {
                let _ = link
                    .requests
                    .send(Request::Unsubscribe(std::mem::take(&mut self.channel)));
            }
        }
    }
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("channel", &self.channel)
            .field("alive", &self.is_alive())
            .finish()
    }
}

impl State {
    fn live_link(&self) -> Option<Link> {
        match self.link.as_ref()?.peek()? {
            Ok(link) if link.health.alive.load(Ordering::SeqCst) => Some(link.clone()),
            _ => None,
        }
    }
}

impl Subscriber {
    pub(crate) fn new(
        endpoint: Arc<Endpoint>,
        addr: Arc<str>,
        connection_config: AsyncConnectionConfig,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        Self {
            endpoint,
            addr,
            connection_config,
            connect_timeout,
            response_timeout,
            state: Arc::default(),
        }
    }

    pub(crate) async fn subscribe(
        &self,
        channel: &str,
        tag: usize,
        notices: mpsc::Sender<Notice>,
    ) -> Result<Subscription, Error> {
        let link = self.link().await?;
        let (reply, confirmed) = oneshot::channel();
        let subscription = {
            let mut state = lock(&self.state);
            state.next_listener += 1;
            let listener = state.next_listener;
            state
                .channels
                .entry(channel.to_owned())
                .or_default()
                .listeners
                .insert(listener, Listener { tag, notices });
            // Sent under the lock, so requests reach the server in the order the channel
            // map changed (an earlier waiter's unsubscribe cannot overtake this).
            let _ = link
                .requests
                .send(Request::Subscribe(channel.to_owned(), reply));
            Subscription {
                state: self.state.clone(),
                channel: channel.to_owned(),
                listener,
                health: link.health.clone(),
            }
        };
        match confirmed.await {
            Ok(Ok(())) => Ok(subscription),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::closed(
                "subscribe",
                &self.addr,
                "the subscriber connection closed",
            )),
        }
    }

    /// Close the subscriber connection as if it broke (the master changed): every waiter
    /// hears [`Event::Broken`], subscribes again on a new connection and re-tries.
    pub(crate) fn reset(&self) {
        let link = lock(&self.state).live_link();
        if let Some(link) = link {
            LinkTask {
                id: link.id,
                state: Arc::downgrade(&self.state),
                health: link.health,
                addr: self.addr.clone(),
            }
            .kill();
        }
    }

    /// The subscriber connection, opening it if there is none (or it broke).
    async fn link(&self) -> Result<Link, Error> {
        let connecting = {
            let mut state = lock(&self.state);
            let usable = match state.link.as_ref().and_then(|l| l.peek()) {
                None => state.link.is_some(),
                Some(Ok(link)) => link.health.alive.load(Ordering::SeqCst),
                Some(Err(_)) => false,
            };
            if !usable {
                state.next_id += 1;
                state.link = Some(self.open(state.next_id).boxed().shared());
            }
            state.link.clone().expect("just set")
        };
        connecting.await
    }

    fn open(&self, id: u64) -> impl Future<Output = Result<Link, Error>> + Send + 'static {
        let endpoint = self.endpoint.clone();
        let config = self.connection_config.clone();
        let addr = self.addr.clone();
        let (connect_timeout, response_timeout) = (self.connect_timeout, self.response_timeout);
        let state = Arc::downgrade(&self.state);
        async move {
            // The server, the master the sentinels name now, or a reachable seed node of
            // a cluster (every node hears every PUBLISH).
            let opening = endpoint.pubsub(&addr, &config, connect_timeout);
            let pubsub = match tokio::time::timeout(connect_timeout, opening).await {
                Ok(Ok(pubsub)) => pubsub,
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Error::timed_out("subscribe", &addr, connect_timeout)),
            };
            let (sink, stream) = pubsub.split();
            let (requests, incoming) = mpsc::unbounded_channel();
            let (stop, stopped) = oneshot::channel();
            let health = Arc::new(Health {
                alive: AtomicBool::new(true),
                killed: watch::Sender::new(false),
            });
            let link = LinkTask {
                id,
                state,
                health: health.clone(),
                addr,
            };
            tokio::spawn(link.clone().dispatch(stream, stopped));
            tokio::spawn(link.control(sink, incoming, response_timeout, stop));
            Ok(Link {
                id,
                requests,
                health,
            })
        }
    }
}

/// What the two tasks of one subscriber connection share.
#[derive(Clone)]
struct LinkTask {
    id: u64,
    state: Weak<Mutex<State>>,
    health: Arc<Health>,
    addr: Arc<str>,
}

impl LinkTask {
    /// Route each message to its channel's counter, until the connection ends, is killed,
    /// or the controller stops (the client is gone).
    async fn dispatch(self, mut stream: PubSubStream, mut stopped: oneshot::Receiver<()>) {
        let mut killed = self.health.killed.subscribe();
        loop {
            tokio::select! {
                msg = stream.next() => match msg {
                    Some(msg) => {
                        let Some(state) = self.state.upgrade() else { return };
                        let state = lock(&state);
                        if let Some(channel) = state.channels.get(msg.get_channel_name()) {
                            let token = String::from_utf8_lossy(msg.get_payload_bytes());
                            channel.tell(&Event::Called(token.into_owned()));
                        }
                    }
                    None => {
                        tracing::debug!(server = %self.addr, "subscriber connection closed");
                        self.kill();
                        return;
                    }
                },
                _ = &mut stopped => return,
                _ = killed.wait_for(|k| *k) => return,
            }
        }
    }

    /// Send subscribe and unsubscribe requests one at a time, in order, each bounded by the
    /// response timeout. Ends when the client is gone (every request sender dropped).
    async fn control(
        self,
        mut sink: PubSubSink,
        mut incoming: mpsc::UnboundedReceiver<Request>,
        response_timeout: Duration,
        _stop: oneshot::Sender<()>,
    ) {
        while let Some(request) = incoming.recv().await {
            let (channel, reply, subscribe) = match request {
                Request::Subscribe(channel, reply) => (channel, Some(reply), true),
                Request::Unsubscribe(channel) => {
                    let wanted_again = self
                        .state
                        .upgrade()
                        .is_some_and(|s| lock(&s).channels.contains_key(&channel));
                    if wanted_again {
                        continue;
                    }
                    (channel, None, false)
                }
            };
            let result = if !self.health.alive.load(Ordering::SeqCst) {
                Err(Error::closed(
                    "subscribe",
                    &self.addr,
                    "the subscriber connection broke",
                ))
            } else {
                let request = async {
                    if subscribe {
                        sink.subscribe(&channel).await
                    } else {
                        sink.unsubscribe(&channel).await
                    }
                };
                match tokio::time::timeout(response_timeout, request).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(e)) => Err(Error::redis("subscribe", &self.addr, e)),
                    Err(_) => Err(Error::timed_out("subscribe", &self.addr, response_timeout)),
                }
            };
            if result.as_ref().is_err_and(Error::breaks_connection) {
                self.kill();
            }
            if let Some(reply) = reply {
                let _ = reply.send(result);
            }
        }
    }

    /// Mark the connection dead (once): stop the dispatcher, forget the link, and wake every
    /// waiter so it subscribes again and re-tries.
    fn kill(&self) {
        if !self.health.alive.swap(false, Ordering::SeqCst) {
            return;
        }
        self.health.killed.send_replace(true);
        let Some(state) = self.state.upgrade() else {
            return;
        };
        let mut state = lock(&state);
        let current = state
            .link
            .as_ref()
            .and_then(|l| l.peek())
            .and_then(|l| l.as_ref().ok())
            .map(|l| l.id);
        if current == Some(self.id) {
            state.link = None;
        }
        for channel in state.channels.values() {
            channel.tell(&Event::Broken);
        }
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_that_stops_reading_keeps_a_bounded_backlog() {
        let (notices, heard) = mpsc::channel(NOTICE_BACKLOG);
        let mut channel = Channel::default();
        channel.listeners.insert(1, Listener { tag: 0, notices });
        for i in 0..10 * NOTICE_BACKLOG {
            channel.tell(&Event::Called(format!("token-{i}")));
        }
        assert_eq!(heard.len(), NOTICE_BACKLOG);
    }
}
