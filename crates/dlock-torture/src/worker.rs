//! A worker process: tasks that contend for a few keys through `dlock::connect`, write to
//! the coordinator's fenced store under each lease, and report every hold.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Args;
use dlock::{DistributedLock, LeaseSet, LockExt as _, LockOptions, LostSignal, Mode, Wait};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Mutex, watch};

use crate::clock::now_ns;
use crate::wire::{Msg, WriteReply};

/// Arguments the coordinator passes to each worker process.
#[derive(Debug, Clone, Args)]
pub(crate) struct WorkerArgs {
    /// Lock URL (through this worker's proxies).
    #[arg(long)]
    pub(crate) url: String,
    /// The coordinator's store address.
    #[arg(long)]
    pub(crate) store: SocketAddr,
    /// This process's number in the run.
    #[arg(long)]
    pub(crate) process: u32,
    /// Contending tasks.
    #[arg(long)]
    pub(crate) tasks: usize,
    /// Lock clients (connections) the tasks share.
    #[arg(long)]
    pub(crate) clients: usize,
    /// The keys, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub(crate) keys: Vec<String>,
    /// Lease ttl.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) ttl: Duration,
    /// How long an acquire may wait.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) wait: Duration,
    #[arg(long)]
    pub(crate) seed: u64,
    /// The share of holds taken shared (read), where the backend declares shared holds.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) read_share: f64,
    /// Every hold one of this many permits (then no reads and no writes).
    #[arg(long)]
    pub(crate) permits: Option<u32>,
    /// Every hold a set of 2 to this many distinct keys, taken with `acquire_all`.
    #[arg(long)]
    pub(crate) key_sets: Option<usize>,
    /// Every hold a campaign in the key's election, publishing this task's name.
    #[arg(long)]
    pub(crate) election: bool,
    /// Every hold reentrant: taken under this task's own owner id, entered again once or
    /// twice, and given back lease by lease in a random order.
    #[arg(long)]
    pub(crate) reentry: bool,
}

/// How long a worker keeps trying to connect (the server may be down when it is spawned).
const CONNECT_FOR: Duration = Duration::from_secs(120);

pub(crate) async fn run(args: WorkerArgs) -> Result<(), String> {
    // Die with the coordinator, whatever happens to it.
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| format!("prctl(PR_SET_PDEATHSIG): {e}"))?;
    let (stop_tx, stop) = watch::channel(false);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| format!("SIGTERM handler: {e}"))?;
    tokio::spawn(async move {
        term.recv().await;
        stop_tx.send_replace(true);
    });

    let mut clients = Vec::new();
    for _ in 0..args.clients.max(1) {
        clients.push(connect(&args.url).await?);
    }
    let args = Arc::new(args);
    let ids = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for task in 0..args.tasks {
        let client = clients[task % clients.len()].clone();
        let rng =
            StdRng::seed_from_u64(args.seed ^ ((u64::from(args.process) << 32) | task as u64));
        tasks.push(tokio::spawn(contend(
            args.clone(),
            client,
            rng,
            ids.clone(),
            stop.clone(),
        )));
    }
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(e) => return Err(format!("a task panicked: {e}")),
        }
    }
    // A timed-out acquire leaves its waiting key (and a dropped client its idle leases) to
    // background clean-up, which returning from `main` would cut short: the final check
    // would then find the key held until its ttl ran out.
    drop(clients);
    if !dlock::settle(SETTLE_FOR).await {
        return Err(format!(
            "background clean-up still running {SETTLE_FOR:?} after the last release"
        ));
    }
    Ok(())
}

/// How long a stopping worker waits for its background clean-up.
const SETTLE_FOR: Duration = Duration::from_secs(10);

async fn connect(url: &str) -> Result<Arc<dyn DistributedLock>, String> {
    let until = tokio::time::Instant::now() + CONNECT_FOR;
    loop {
        match dlock::connect(url).await {
            Ok(client) => return Ok(client),
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("connect: {e}")),
        }
    }
}

/// One task's connection to the coordinator; the task and its lost-watcher share it.
struct Store {
    lines: Mutex<(Lines<BufReader<OwnedReadHalf>>, OwnedWriteHalf)>,
}

impl Store {
    async fn connect(addr: SocketAddr, process: u32) -> Result<Arc<Self>, String> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to the coordinator at {addr}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (read, mut write) = stream.into_split();
        write
            .write_all(format!("{process}\n").as_bytes())
            .await
            .map_err(|e| format!("coordinator: {e}"))?;
        Ok(Arc::new(Self {
            lines: Mutex::new((BufReader::new(read).lines(), write)),
        }))
    }

    async fn send(&self, msg: &Msg) -> Result<(), String> {
        let mut line = serde_json::to_vec(msg).expect("a message serializes");
        line.push(b'\n');
        let mut conn = self.lines.lock().await;
        conn.1
            .write_all(&line)
            .await
            .map_err(|e| format!("coordinator gone: {e}"))
    }

    /// A write to the fenced store: whether it was accepted.
    async fn write(&self, hold: u64, key: &str, token: u64) -> Result<bool, String> {
        let msg = Msg::Write {
            hold,
            key: key.to_owned(),
            token,
        };
        let mut line = serde_json::to_vec(&msg).expect("a message serializes");
        line.push(b'\n');
        let mut conn = self.lines.lock().await;
        conn.1
            .write_all(&line)
            .await
            .map_err(|e| format!("coordinator gone: {e}"))?;
        let reply = conn
            .0
            .next_line()
            .await
            .map_err(|e| format!("coordinator gone: {e}"))?
            .ok_or("coordinator gone")?;
        let reply: WriteReply =
            serde_json::from_str(&reply).map_err(|e| format!("bad reply {reply:?}: {e}"))?;
        Ok(reply.accepted)
    }
}

/// Acquire a random key (or, with `--key-sets`, a random set of keys), write under it,
/// release; until told to stop.
async fn contend(
    args: Arc<WorkerArgs>,
    client: Arc<dyn DistributedLock>,
    mut rng: StdRng,
    ids: Arc<AtomicU64>,
    stop: watch::Receiver<bool>,
) -> Result<(), String> {
    let store = Store::connect(args.store, args.process).await?;
    let opts = LockOptions::new().ttl(args.ttl).wait(Wait::For(args.wait));
    let read_share = if client.capabilities().shared && !args.election && !args.reentry {
        args.read_share.clamp(0.0, 1.0)
    } else {
        0.0
    };
    let new_hold = || (u64::from(args.process) << 32) | ids.fetch_add(1, Ordering::Relaxed);
    // Each task its own owner: two tasks sharing one would share their holds.
    let owner = format!("torture-{}", new_hold());
    let opts = match args.reentry {
        true => opts.owner(&owner),
        false => opts,
    };
    while !*stop.borrow() {
        // The draws in the order the single-key workload has always made them.
        let keys: Vec<String> = if let Some(most) = args.key_sets {
            // 2..=most distinct keys, named in a random order (`acquire_all` sorts them).
            let mut keys = args.keys.clone();
            keys.shuffle(&mut rng);
            keys.truncate(rng.random_range(2..=most.clamp(2, args.keys.len())));
            keys
        } else {
            vec![args.keys[rng.random_range(0..args.keys.len())].clone()]
        };
        let shared = args.permits.is_none() && rng.random_bool(read_share);
        let mode = match (args.permits, shared) {
            (Some(n), _) => Mode::Permits(n),
            (None, true) => Mode::Shared,
            (None, false) => Mode::Exclusive,
        };
        let requested = now_ns();
        let taken = if args.key_sets.is_some() {
            client
                .acquire_all(&keys, &opts.mode(mode))
                .await
                .map(Taken::Set)
        } else if args.election {
            // A candidate's value names it, as a service would publish its address.
            let value = format!("worker-{}-{}", args.process, new_hold());
            client
                .campaign(&keys[0], &value, &opts)
                .await
                .map(Taken::One)
        } else {
            client
                .acquire(&keys[0], &opts.mode(mode))
                .await
                .map(Taken::One)
        };
        let taken = match taken {
            Ok(Taken::Set(set)) if set.is_lost() => {
                // A key was lost while the set's later keys were still being waited for:
                // the set was never whole, so the holder gives it back without relying on
                // it (and without reporting holds that another client may have taken over
                // before `acquire_all` returned).
                let lost: Vec<&str> = set
                    .leases()
                    .iter()
                    .filter(|l| l.is_lost())
                    .map(|l| l.key())
                    .collect();
                let error = format!("acquire_all returned a set with {lost:?} already lost");
                let _ = set.release().await;
                store
                    .send(&Msg::AcquireFailed {
                        kind: "SetLostOnArrival".to_owned(),
                        error,
                    })
                    .await?;
                continue;
            }
            Ok(taken) => taken,
            Err(e) => {
                store
                    .send(&Msg::AcquireFailed {
                        kind: format!("{:?}", e.kind()),
                        error: e.to_string(),
                    })
                    .await?;
                tokio::time::sleep(Duration::from_millis(rng.random_range(50..250))).await;
                continue;
            }
        };
        let at = now_ns();
        let mut taken = taken;
        let plan = Plan::draw(&mut rng, args.ttl);
        // One hold per key (a set's keys in the order they were taken), each with its token.
        let leases = match &taken {
            Taken::One(lease) => std::slice::from_ref(lease),
            Taken::Set(set) => set.leases(),
        };
        let mut holds = Vec::with_capacity(leases.len());
        let mut set_id = None;
        for lease in leases {
            let hold = new_hold();
            if matches!(taken, Taken::Set(_)) {
                set_id.get_or_insert(hold);
            }
            holds.push((hold, lease.key().to_owned(), lease.fencing_token()));
        }
        for (hold, key, token) in &holds {
            store
                .send(&Msg::Acquired {
                    hold: *hold,
                    key: key.clone(),
                    token: *token,
                    requested,
                    at,
                    shared,
                    permits: args.permits,
                    set: set_id,
                })
                .await?;
        }
        // A set is watched key by key: its `lost()` is the first of its leases' signals,
        // and each key's hold is told of its own loss.
        let mut watchers: Vec<_> = leases
            .iter()
            .zip(&holds)
            .map(|(lease, (hold, ..))| watch_lost(lease.lost_signal(), store.clone(), *hold))
            .collect();
        let mut entries = Vec::new();
        if let (true, Taken::One(first)) = (args.reentry, &mut taken) {
            entries = enter_again(&*client, first, &opts, &mut rng).await;
            for _ in &entries {
                store.send(&Msg::Reentered { hold: holds[0].0 }).await?;
            }
            // Half the time the first lease goes first: the hold is not the first lease's.
            // The lease left for last is watched too (an owner's leases in one client are
            // lost together; the first one's watch ends with its release).
            if let Some(entry) = entries.first_mut()
                && rng.random_bool(0.5)
            {
                std::mem::swap(first, entry);
                watchers.push(watch_lost(first.lost_signal(), store.clone(), holds[0].0));
            }
        }
        // The critical section: a few writes (a reader or a permit holder only waits), a
        // little apart; each write of a set goes to every key of the set, with that key's
        // token. The holder stops at the first loss of any key or rejected write.
        let writer = mode == Mode::Exclusive;
        'section: for _ in 0..plan.writes {
            tokio::time::sleep(plan.gap.mul_f64(rng.random_range(0.0..1.0))).await;
            for (hold, key, token) in &holds {
                if taken.is_lost() || (writer && !store.write(*hold, key, *token).await?) {
                    break 'section;
                }
            }
        }
        if let Some((hold, key, token)) = holds.first() {
            leave_early(entries, &taken, &store, (*hold, key, *token)).await?;
        }
        let at = now_ns();
        for (hold, ..) in &holds {
            store.send(&Msg::Releasing { hold: *hold, at }).await?;
        }
        let outcome = match taken.release().await {
            Ok(()) => "ok".to_owned(),
            Err(e) => format!("{:?}", e.kind()),
        };
        for watcher in watchers {
            let _ = watcher.await;
        }
        for (hold, ..) in &holds {
            store
                .send(&Msg::Released {
                    hold: *hold,
                    outcome: outcome.clone(),
                })
                .await?;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..=20))).await;
    }
    Ok(())
}

/// Enter the key of `first` under its owner once or twice more, at once: the leases of
/// the re-entries that kept the hold's token. One with another token is a new hold after
/// the first was lost unseen (a fault): given back, not used.
async fn enter_again(
    client: &dyn DistributedLock,
    first: &dlock::Lease,
    opts: &LockOptions,
    rng: &mut StdRng,
) -> Vec<dlock::Lease> {
    let mut entries = Vec::new();
    for _ in 0..rng.random_range(1..=2) {
        match client.acquire(first.key(), &opts.wait(Wait::No)).await {
            Ok(lease) if lease.fencing_token() == first.fencing_token() => entries.push(lease),
            Ok(other) => {
                let _ = other.release().await;
                break;
            }
            Err(_) => break,
        }
    }
    entries
}

/// Give back the hold's re-entries one by one, writing under its token after each while
/// no lease of the hold was told it is lost: the hold must stay exclusive until its last
/// lease (`last`) goes.
async fn leave_early(
    entries: Vec<dlock::Lease>,
    last: &Taken,
    store: &Store,
    (hold, key, token): (u64, &str, u64),
) -> Result<(), String> {
    for entry in entries {
        let lost = entry.is_lost();
        let _ = entry.release().await;
        if lost || last.is_lost() || !store.write(hold, key, token).await? {
            break;
        }
    }
    Ok(())
}

/// What one round of a task holds: a lease, or a set of them.
enum Taken {
    One(dlock::Lease),
    Set(LeaseSet),
}

impl Taken {
    fn is_lost(&self) -> bool {
        match self {
            Taken::One(lease) => lease.is_lost(),
            Taken::Set(set) => set.is_lost(),
        }
    }

    async fn release(self) -> dlock::Result<()> {
        match self {
            Taken::One(lease) => lease.release().await,
            Taken::Set(set) => set.release().await,
        }
    }
}

/// How long a hold lasts: a few writes a little apart; one hold in eight is long (half a
/// ttl to two ttls), so that faults find holders that renew.
struct Plan {
    writes: u32,
    gap: Duration,
}

impl Plan {
    fn draw(rng: &mut StdRng, ttl: Duration) -> Self {
        if rng.random_ratio(1, 8) {
            let span = ttl.mul_f64(rng.random_range(0.5..2.0));
            Self {
                writes: 5,
                gap: span / 5,
            }
        } else {
            Self {
                writes: rng.random_range(1..=3),
                gap: Duration::from_millis(40),
            }
        }
    }
}

/// Report `hold` lost when its lease's signal fires; ends when the lease is released.
fn watch_lost(mut signal: LostSignal, store: Arc<Store>, hold: u64) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        if let Some(reason) = signal.lost().await {
            let at = now_ns();
            let _ = store
                .send(&Msg::Lost {
                    hold,
                    at,
                    reason: reason.to_string(),
                })
                .await;
        }
    })
}
