//! `torture`: many processes contend for a few keys on a real lock server while faults
//! are injected (killed and paused holders, partitions, server and member restarts); every
//! hold and every fenced write is recorded and checked at the end.
//!
//! ```text
//! torture --backend redis://127.0.0.1:6380 --duration 60s
//! ```
//!
//! See `crates/dlock-torture/README.md` for the checks, the faults, and what each backend
//! declares about them.

mod check;
mod clock;
mod coordinator;
mod faults;
mod key_sets;
mod netns;
mod permits;
mod report;
mod residue;
mod servers;
mod store;
mod wire;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};

use crate::faults::FaultSet;

const AFTER_HELP: &str = "\
Exit status: 0 when every check passed, 1 on any violation or missing recovery, 2 when the
run could not be carried out (bad arguments, server unreachable).

Examples:
  torture --backend redis://127.0.0.1:6380 --duration 60s
  torture --backend redis://127.0.0.1:6380 --duration 60s --permits 3
  torture --backend redis://127.0.0.1:6380 --duration 60s --keys 4 --key-sets 3
  torture --backend zk://127.0.0.1:2182,127.0.0.1:2183,127.0.0.1:2184?session_timeout=3s --faults kill,member
  torture --backend etcd://127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793 --duration 10m --report etcd.json";

/// Fault injection against a dlock backend, with a checked history.
#[derive(Debug, Parser)]
#[command(name = "torture", after_help = AFTER_HELP, subcommand_negates_reqs = true)]
struct Cli {
    /// Lock URL of the backend under test (any `dlock::connect` URL but memory://).
    #[arg(long, required = true)]
    backend: Option<String>,
    /// How long to run.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Worker processes.
    #[arg(long, default_value_t = 3)]
    workers: usize,
    /// Contending tasks per worker.
    #[arg(long, default_value_t = 8)]
    tasks: usize,
    /// Lock clients (connections) per worker, shared by its tasks.
    #[arg(long, default_value_t = 2)]
    clients: usize,
    /// Keys the tasks contend for.
    #[arg(long, default_value_t = 3)]
    keys: usize,
    /// Lease ttl.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Faults to inject: all (every kind the topology allows), none, or a list of kill,
    /// pause, partition, restart, member, failover, split, cut, slow, loss, delay, clock,
    /// client-clock.
    #[arg(long, default_value = "all")]
    faults: FaultSet,
    /// At most this many faults (default: one per 6 s of duration, at least one of each kind).
    #[arg(long)]
    max_faults: Option<usize>,
    /// Seed of the fault schedule and the workload (default: random, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// Write the report as JSON to this file too.
    #[arg(long)]
    report: Option<PathBuf>,
    /// The scripts/backends units behind the URL's servers (default: looked up by port).
    #[arg(long, value_delimiter = ',')]
    units: Vec<String>,
    /// scripts/backends, which stops and starts servers (default: found from the current
    /// directory up, or in the checkout this was built from).
    #[arg(long)]
    backends_script: Option<PathBuf>,
    /// Accept memory://, where each worker has a lock of its own: a run that must fail
    /// (the self-test of the checks).
    #[arg(long, hide = true)]
    allow_memory: bool,
    /// The share of holds taken shared (read), from 0 to 1, on a backend that declares
    /// shared holds (`Capabilities::shared`); elsewhere every hold is exclusive.
    #[arg(long, default_value_t = 0.5)]
    read_share: f64,
    /// A semaphore workload: every hold is one of N permits (no reads, no writes to the
    /// fenced store), and the check counts the holders of each key at once. The backend must
    /// declare permits (`Capabilities::permits`).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=i64::from(dlock_core::Mode::MAX_PERMITS)))]
    permits: Option<u32>,
    /// A key-set workload: every hold takes a random set of 2 to K distinct keys of the
    /// run's (K at most --keys), named in a random order, as one hold with `acquire_all`,
    /// writes to the fenced store under each key with that key's token, and releases the
    /// set. Shared sets follow --read-share; not with --permits.
    #[arg(long, value_name = "K", conflicts_with = "permits", value_parser = clap::value_parser!(u64).range(2..=64))]
    key_sets: Option<u64>,
    /// An election workload: every hold is a campaign in the key's election (`Election`,
    /// each candidate publishing its own name), the term its fencing token; the checks are
    /// the lock's (never two leaders of a key at once outside a declared fenced fault). The
    /// backend must declare elections (`Capabilities::election`); not with --permits or
    /// --key-sets, and no shared holds.
    #[arg(long, conflicts_with_all = ["permits", "key_sets"])]
    election: bool,
    /// A reentrant workload: every hold is taken under the task's own owner id
    /// (`LockOptions::owner`), entered again once or twice (each re-entry must get the
    /// hold's token), and given back lease by lease in a random order with a fenced write
    /// after each, so a key freed before its last lease shows as two holders. The backend
    /// must declare reentrant holds (`Capabilities::reentrant`); exclusive holds only.
    #[arg(long, conflicts_with_all = ["permits", "key_sets", "election"])]
    reentry: bool,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// One worker process (started by the coordinator).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TORTURE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("torture: cannot start a runtime: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Cmd::Worker(args)) = cli.command {
        let process = args.process;
        return match runtime.block_on(worker::run(args)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("torture worker {process}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if !(0.0..=1.0).contains(&cli.read_share) {
        eprintln!("torture: --read-share must be between 0 and 1");
        return ExitCode::from(2);
    }
    let key_sets = cli
        .key_sets
        .map(|k| usize::try_from(k).unwrap_or(usize::MAX));
    if key_sets.is_some_and(|k| k > cli.keys) {
        Cli::command()
            .error(
                clap::error::ErrorKind::ValueValidation,
                format!(
                    "--key-sets {} takes sets of up to that many distinct keys, but the run has --keys {}",
                    key_sets.unwrap_or_default(),
                    cli.keys
                ),
            )
            .exit();
    }
    let seed = cli.seed.unwrap_or_else(rand::random);
    let cfg = coordinator::Config {
        url: cli.backend.expect("clap requires --backend"),
        duration: cli.duration,
        workers: cli.workers,
        tasks: cli.tasks,
        clients: cli.clients,
        keys: cli.keys,
        ttl: cli.ttl,
        faults: cli.faults,
        max_faults: cli.max_faults,
        seed,
        units: cli.units,
        backends_script: cli.backends_script,
        allow_memory: cli.allow_memory,
        read_share: cli.read_share,
        permits: cli.permits,
        key_sets,
        election: cli.election,
        reentry: cli.reentry,
    };
    let report = match runtime.block_on(coordinator::run(cfg)) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("torture: {e}");
            return ExitCode::from(2);
        }
    };
    // Workers' leftover tasks and proxies go with the runtime.
    runtime.shutdown_timeout(Duration::from_secs(1));
    println!("{}", report.markdown());
    if let Some(path) = cli.report {
        let json = serde_json::to_string_pretty(&report).expect("the report serializes");
        if let Err(e) = std::fs::write(&path, json) {
            eprintln!("torture: cannot write {}: {e}", path.display());
            return ExitCode::from(2);
        }
    }
    if report.passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
