//! `bench`: measures txgate against either store, one subcommand per
//! question (`bench --help` lists them):
//!
//! - `protocol` (the default): the commit protocol, for transactions of
//!   k = 1, 2, 5, 10 `update` members: latency, throughput with and
//!   without conflicts, store writes per transaction, a raw baseline, then
//!   hook delivery (`protocol.rs`, `hooks.rs`);
//! - `scale`: idle CPU, latency and memory as the data grows; `soak`:
//!   sustained commits for minutes (`scale.rs`);
//! - `events`: change events under load (`events.rs`); `ttl`: expiry
//!   under load (`ttl.rs`);
//! - `durability`: restart after a crash, the cost of a synced write, the
//!   power-loss sweep (`durability.rs`);
//! - `wire`: what a request waits for on a remote MongoDB, through a
//!   proxy that delays every byte (`wire.rs`);
//! - `queries`: an index built online under writes, pages and counts at
//!   a million documents (`queries.rs`; `queries-postgres` the same in
//!   PostgreSQL);
//! - `peer`: the workloads `scripts/bench --peer postgres` runs beside
//!   PostgreSQL (`peer.rs`); `peer-postgres`, with the `peer` feature,
//!   runs them against PostgreSQL from this binary (`peer_pg.rs`);
//!   `peer` and `queries` print what a request costs the process in
//!   processor time, beside the bare HTTP floor (`cost.rs`).
//!
//! ```sh
//! cargo run --release --bin bench                        # embedded store in a temp dir
//! cargo run --release --bin bench -- --mongodb-uri mongodb://127.0.0.1:27017 protocol --k 2
//! scripts/bench                                          # both stores, a MongoDB-wire server started for it
//! ```

mod bank;
mod cost;
mod durability;
mod events;
mod hooks;
mod live;
mod pages;
mod peer;
#[cfg(feature = "peer")]
mod peer_pg;
mod protocol;
mod queries;
mod ruled_streams;
mod rules;
mod scale;
mod schemas;
mod ttl;
mod wire;
mod workload;

use std::time::Duration;

use clap::{Parser, Subcommand};
use txgate::config::StoreConfig;

/// The same allocator as the `txgate` binary, so the gateway measured here
/// is the one that runs.
#[cfg(not(feature = "alloc-count"))]
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// With `alloc-count`: the same allocator, each allocation counted
/// ([`cost::Spent::allocs`]).
#[cfg(feature = "alloc-count")]
#[global_allocator]
static ALLOC: stats_alloc::StatsAlloc<mimalloc::MiMalloc> = stats_alloc::StatsAlloc::new(mimalloc::MiMalloc);

/// Deadline of one store call (generous: a contended run on a slow server
/// should measure, not time out).
const STORE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Parser)]
#[command(about = "Benchmark txgate")]
struct Cli {
    /// Benchmark the mongodb backend at this URI (default: embedded store).
    #[arg(long, env = "TXGATE_MONGODB_URI", global = true)]
    mongodb_uri: Option<String>,
    /// Page cache of the embedded store, in MiB.
    #[arg(long, env = "TXGATE_CACHE_MB", global = true, default_value_t = txgate::config::DEFAULT_CACHE_MB)]
    cache_mb: u64,
    /// The embedded store's checkpoint interval, in milliseconds (the
    /// gateway's `TXGATE_CHECKPOINT_INTERVAL_MS`).
    #[arg(long, env = "TXGATE_CHECKPOINT_INTERVAL_MS", global = true, default_value_t = txgate::config::DEFAULT_CHECKPOINT_INTERVAL.as_millis() as u64)]
    checkpoint_interval_ms: u64,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The commit protocol: latency, throughput with and without
    /// conflicts, writes per transaction, hook delivery (the default).
    Protocol(protocol::ProtocolArgs),
    /// The contended bank through one gateway process and through
    /// several on one MongoDB database (needs --mongodb-uri).
    Bank {
        /// Gateway processes of the second run.
        #[arg(long, default_value_t = 3)]
        instances: usize,
        /// Seconds each run lasts.
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
    },
    /// A page of 50 and a count along a declared index on MongoDB, beside
    /// one raw find and one raw count of the same (needs --mongodb-uri).
    Pages {
        /// Documents loaded.
        #[arg(long, default_value_t = 1_000_000)]
        docs: usize,
        /// Pages measured.
        #[arg(long, default_value_t = 1000)]
        samples: usize,
    },
    /// Idle CPU, latency and memory as the data grows.
    Scale {
        /// Documents of the large size (default: 1,000,000 on the embedded
        /// store, 100,000 on mongodb).
        #[arg(long)]
        docs: Option<usize>,
        /// Finished transaction records added at the large size (default:
        /// a tenth of the documents).
        #[arg(long)]
        txns: Option<usize>,
        /// Seconds each idle CPU measurement lasts.
        #[arg(long, default_value_t = 20.0)]
        idle_secs: f64,
        /// Requests per latency figure (0: idle CPU and memory only).
        #[arg(long, default_value_t = 2000)]
        samples: usize,
        /// The database server's processes, comma-separated: their idle
        /// CPU, and that of their children, is reported too (scripts/bench
        /// sets FerretDB's and PostgreSQL's postmaster).
        #[arg(long = "server-pid", env = "TXGATE_BENCH_SERVER_PID", value_delimiter = ',')]
        server_pids: Vec<u32>,
    },
    /// Sustained commits for SECS seconds, collection sizes every minute.
    Soak {
        /// How long the soak lasts, in seconds.
        #[arg(long, default_value_t = 600.0)]
        secs: f64,
        /// Concurrent clients.
        #[arg(long, default_value_t = 32)]
        clients: usize,
    },
    /// The workloads `scripts/bench --peer postgres` compares with
    /// PostgreSQL, over HTTP.
    Peer {
        /// Seconds each workload runs.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// The same workloads against PostgreSQL, from this binary (built with
    /// the `peer` feature).
    #[cfg(feature = "peer")]
    PeerPostgres {
        /// The PostgreSQL connection string (`host=... port=... user=...`).
        #[arg(long)]
        url: String,
        /// Seconds each workload runs.
        #[arg(long, default_value_t = 3.0)]
        seconds: f64,
    },
    /// Queries over a declared index: its online build under writes, pages
    /// of 50 and counts, at DOCS documents (embedded store).
    Queries {
        /// Documents loaded.
        #[arg(long, default_value_t = 1_000_000)]
        docs: usize,
        /// Pages timed (counts: a tenth as many).
        #[arg(long, default_value_t = 2000)]
        samples: usize,
        /// Writes per second during the build.
        #[arg(long, default_value_t = 1000.0)]
        rate: f64,
    },
    /// The same data and queries against PostgreSQL, from this binary
    /// (built with the `peer` feature).
    #[cfg(feature = "peer")]
    QueriesPostgres {
        /// The PostgreSQL connection string.
        #[arg(long)]
        url: String,
        #[arg(long, default_value_t = 1_000_000)]
        docs: usize,
        #[arg(long, default_value_t = 2000)]
        samples: usize,
    },
    /// Change events under load: throughput with and without streams,
    /// stream lag, a paused stream's cost, subscription deliveries. Runs
    /// the `txgate` binary beside this one as the gateway.
    Events {
        /// Event streams attached.
        #[arg(long, default_value_t = 100)]
        streams: usize,
        /// Commits per second of the lag and pause runs.
        #[arg(long, default_value_t = 1000.0)]
        rate: f64,
        /// Seconds each throughput and lag run lasts.
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
        /// Seconds the paused stream reads nothing.
        #[arg(long, default_value_t = 60.0)]
        pause_secs: f64,
        /// Events sent to a subscription (0: skip).
        #[arg(long, default_value_t = 5000)]
        deliveries: usize,
        /// Concurrent clients of the throughput runs.
        #[arg(long, default_value_t = 32)]
        clients: usize,
    },
    /// Filtered live views under load: VIEWS clients each following the
    /// changes of a filtered set while PATCHes move documents in and out
    /// of it; commit -> view update lag and the gateway's CPU per change
    /// per view. Runs the `txgate` binary beside this one as the gateway.
    Live {
        /// Clients each keeping a live view.
        #[arg(long, default_value_t = 100)]
        views: usize,
        /// Writes per second.
        #[arg(long, default_value_t = 1000.0)]
        rate: f64,
        /// Seconds the writes last.
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
    },
    /// Validation's cost: a check in process, the worst accepted case,
    /// and a single write with and without a schema of 20 properties.
    Schemas {
        /// Writes of each kind timed on each collection.
        #[arg(long, default_value_t = 2000)]
        samples: usize,
    },
    /// Event streams of many different users under a per-document rule:
    /// commit -> arrival lag, with a gateway in its own process.
    RuledStreams {
        /// Users, each with one stream open.
        #[arg(long, default_value_t = 1000)]
        users: usize,
        /// Commits per second offered.
        #[arg(long, default_value_t = 200.0)]
        rate: f64,
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
    },
    /// TTL under load: expiry lag by age, the live count under
    /// `max_count`, the sweeper's CPU at rest over many documents.
    Ttl {
        /// Inserts per second of the insert runs.
        #[arg(long, default_value_t = 1000.0)]
        rate: f64,
        /// Seconds each insert run lasts.
        #[arg(long, default_value_t = 60.0)]
        seconds: f64,
        /// The maximum age of the lag run, in seconds.
        #[arg(long, default_value_t = 5)]
        max_age: u64,
        /// The maximum count of the count run.
        #[arg(long, default_value_t = 10_000)]
        max_count: u64,
        /// Live documents under the sweeper at rest (default: 1,000,000 on
        /// the embedded store, 20,000 on mongodb).
        #[arg(long)]
        docs: Option<usize>,
        /// Seconds the idle CPU measurement lasts.
        #[arg(long, default_value_t = 20.0)]
        idle_secs: f64,
    },
    /// What a request waits for on a remote MongoDB: through a proxy that
    /// delays every byte, latency, commands and their dependent depth of a
    /// single update and of k-member transactions (needs --mongodb-uri).
    Wire(wire::WireArgs),
    /// The embedded store's durability: restart after a crash, the cost of
    /// a synced write beside redb's own synced commit, and with `--power`
    /// the exhaustive power-loss sweep.
    Durability(durability::DurabilityArgs),
    /// Internal: the child of `durability` that fills a store and ends
    /// without closing it (`crash`) or after (`close`).
    #[command(hide = true)]
    DurabilityFill {
        dir: std::path::PathBuf,
        docs: usize,
        #[arg(action = clap::ArgAction::Set)]
        quick_repair: bool,
        end: String,
    },
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or_else(|| Command::Protocol(protocol::ProtocolArgs::default()));
    match &command {
        Command::DurabilityFill { dir, docs, quick_repair, end } => {
            durability::fill(dir, *docs, *quick_repair, end == "close").await;
        }
        Command::Durability(args) => return durability::run(args).await,
        Command::Wire(args) => {
            let uri = cli.mongodb_uri.as_deref().expect("bench wire needs --mongodb-uri (a MongoDB-wire server)");
            return wire::run(uri, args).await;
        }
        _ => {}
    }
    let dir = tempfile_dir();
    let mongo = cli.mongodb_uri.is_some();
    let (config, label) = match &cli.mongodb_uri {
        Some(uri) => (
            StoreConfig::Mongodb { uri: uri.clone(), database: format!("bench_{}", uuid::Uuid::now_v7().simple()) },
            "mongodb",
        ),
        None => (
            StoreConfig::Embedded {
                data_dir: dir.clone(),
                cache_mb: cli.cache_mb,
                sync_interval: txgate::config::DEFAULT_SYNC_INTERVAL,
                checkpoint_interval: std::time::Duration::from_millis(cli.checkpoint_interval_ms.max(1)),
            },
            "embedded",
        ),
    };
    match command {
        Command::Protocol(args) => protocol::run(&args, &config, label).await,
        Command::Scale { docs, txns, idle_secs, samples, server_pids } => {
            let docs = docs.unwrap_or(if mongo { 100_000 } else { 1_000_000 });
            let txns = txns.unwrap_or(docs / 10);
            scale::run(scale::ScaleArgs { store: config.clone(), docs, txns, idle_secs, samples, server_pids }).await;
        }
        Command::Soak { secs, clients } => scale::soak(config.clone(), secs, clients).await,
        Command::Peer { seconds } => peer::run(config.clone(), seconds).await,
        #[cfg(feature = "peer")]
        Command::PeerPostgres { url, seconds } => peer_pg::run(&url, seconds).await,
        Command::Queries { docs, samples, rate } => {
            let (store, raw) = queries::run(config.clone(), docs, samples, rate).await;
            // The same data behind a gateway with keys and users: a rule's cost.
            rules::run(store, raw, docs, samples).await;
        }
        #[cfg(feature = "peer")]
        Command::QueriesPostgres { url, docs, samples } => peer_pg::queries(&url, docs, samples).await,
        Command::Pages { docs, samples } => {
            let uri = cli.mongodb_uri.clone().expect("bench pages needs --mongodb-uri");
            pages::run(&uri, docs, samples).await;
        }
        Command::Bank { instances, seconds } => {
            let mongodb_uri = cli.mongodb_uri.clone().expect("bench bank needs --mongodb-uri");
            bank::run(bank::BankArgs { mongodb_uri, instances, seconds }).await;
        }
        Command::Events { streams, rate, seconds, pause_secs, deliveries, clients } => {
            let mongodb_uri = cli.mongodb_uri.clone();
            let args =
                events::EventArgs { mongodb_uri, streams, rate, seconds, pause: pause_secs, clients, deliveries };
            events::run(args).await;
        }
        Command::Live { views, rate, seconds } => {
            let mongodb_uri = cli.mongodb_uri.clone();
            live::run(live::LiveArgs { mongodb_uri, views, rate, seconds }).await;
        }
        Command::RuledStreams { users, rate, seconds } => {
            let mongodb_uri = cli.mongodb_uri.clone();
            ruled_streams::run(ruled_streams::RuledStreamsArgs { mongodb_uri, users, rate, seconds }).await;
        }
        Command::Schemas { samples } => schemas::run(config.clone(), samples).await,
        Command::Ttl { rate, seconds, max_age, max_count, docs, idle_secs } => {
            let docs = docs.unwrap_or(if mongo { 20_000 } else { 1_000_000 });
            let args = ttl::TtlArgs { store: config.clone(), rate, seconds, max_age, max_count, docs, idle: idle_secs };
            ttl::run(args).await;
        }
        Command::Durability(_) | Command::DurabilityFill { .. } | Command::Wire(_) => unreachable!("run above"),
    }
    cleanup(&config, &dir).await;
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Drop the benchmark's database or data directory.
async fn cleanup(config: &StoreConfig, dir: &std::path::Path) {
    if let StoreConfig::Mongodb { uri, database } = config
        && let Ok(store) = txgate_store::mongo::MongoStore::connect(uri, database).await
    {
        let _ = store.drop_database().await;
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// A progress line on stderr (the figures go to stdout).
fn progress(what: &str) {
    eprintln!("  .. {what}");
}

/// The embedded store `store` names, opened as the gateway opens it, or
/// `None` for another store.
fn open_embedded(store: &StoreConfig) -> Option<std::sync::Arc<txgate_store::embedded::EmbeddedStore>> {
    let (dir, options) = store.embedded()?;
    let store = txgate_store::embedded::EmbeddedStore::open_dir(dir, &options).expect("the store opens");
    Some(std::sync::Arc::new(store))
}

fn tempfile_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("txgate-bench-{}", uuid::Uuid::now_v7().simple()))
}
