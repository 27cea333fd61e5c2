//! `bench durability`: what a crash costs the embedded store, and what
//! making a write durable costs it.
//!
//! - Restart after a crash: a child process (this binary again) fills a
//!   store with N documents and ends without closing it, as a crash does
//!   (its journal holds the writes since the last checkpoint, redb its
//!   unsynced commits); then the store is opened here and timed until it
//!   is ready, with the checkpoints made by two-phase commits that save
//!   redb's allocator state (quick repair) and without (redb repairs the
//!   whole file at open, as before). A clean stop's restart beside it.
//! - The writer's cost per synced batch (one synced single-document write
//!   at a time: apply, journal write, journal sync, unsynced redb commit)
//!   beside redb's own synced commit of the same record, one-phase and
//!   two-phase, measured in the same run on the same disk.
//! - With `--power`: the power-loss sweep of `txgate_store::powerloss`
//!   with many survivor images per crash point and a two-crash sequence at
//!   every point (the test suite runs a bounded sample).

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use txgate_store::disk::DirDisk;
use txgate_store::embedded::{EmbeddedStore, Options};
use txgate_store::{Durability, Store, Write, doc};

/// A directory of its own under the temp dir, removed when dropped.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new() -> Self {
        let dir = super::tempfile_dir();
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Documents in flight while filling.
const IN_FLIGHT: usize = 256;

fn options(quick_repair: bool) -> Options {
    Options { quick_repair, ..Options::default() }
}

fn record(i: usize) -> txgate_store::Record {
    doc! {
        "_id": format!("d{i:08}"),
        "data": {"status": "open", "total": i as i64, "note": "x".repeat(200)},
        "_meta": {"v": 1_i64, "sv": 1_i64},
    }
}

/// The child's part: fill `dir` with `n` documents and end without
/// closing the store (`close`: after closing it, as a clean stop does).
pub async fn fill(dir: &Path, n: usize, quick_repair: bool, close: bool) -> ! {
    let disk = DirDisk::create(dir).expect("data directory");
    let store = EmbeddedStore::open_on(Arc::new(disk), &options(quick_repair)).expect("the store opens");
    let mut next = 0;
    while next < n {
        let upto = (next + IN_FLIGHT).min(n);
        let writes = (next..upto).map(|i| {
            let durability = if i % 1000 == 999 { Durability::Synced } else { Durability::Unsynced };
            store.write("docs", Write::Insert(record(i)), durability)
        });
        for outcome in futures::future::join_all(writes).await {
            assert!(outcome.expect("insert"), "a fresh id");
        }
        next = upto;
    }
    store.sync().await.expect("sync");
    if close {
        store.close().await.expect("close");
    }
    // Without a close: what a crash (or kill -9) leaves.
    std::process::exit(0)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map_or(0, |entries| entries.filter_map(Result::ok).filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
}

/// Fill a new store with `n` documents in a child process that then ends
/// (crashing, or after a clean stop), and time its opening here.
async fn restart(n: usize, quick_repair: bool, clean: bool) -> (Duration, Duration, u64) {
    let dir = TempDir::new();
    let started = Instant::now();
    let status = Command::new(std::env::current_exe().expect("this binary"))
        .args(["durability-fill", &dir.path().display().to_string(), &n.to_string(), &quick_repair.to_string()])
        .arg(if clean { "close" } else { "crash" })
        .status()
        .expect("the filling child runs");
    assert!(status.success(), "the filling child failed: {status}");
    let filled = started.elapsed();
    let size = dir_size(dir.path());
    let opening = Instant::now();
    let disk = DirDisk::create(dir.path()).expect("data directory");
    let store = EmbeddedStore::open_on(Arc::new(disk), &options(quick_repair)).expect("the store opens");
    let ready = opening.elapsed();
    let one = store.get("docs", &format!("d{:08}", n - 1)).await.expect("read");
    assert!(one.is_some(), "the last document is there");
    drop(store);
    (filled, ready, size)
}

/// Restart after a crash at `n` documents, and after a clean stop.
async fn restart_after_crash(n: usize, quick_repair: bool) {
    let (filled, ready, size) = restart(n, quick_repair, false).await;
    let (_, clean, _) = restart(n, quick_repair, true).await;
    println!(
        "restart at {n} documents ({:.0} MB on disk, filled in {:.1} s), quick repair {}: after a crash ready in \
         {:.0} ms; after a clean stop {:.0} ms",
        size as f64 / 1e6,
        filled.as_secs_f64(),
        if quick_repair { "on" } else { "off (as before)" },
        ms(ready),
        ms(clean),
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The writer's cost per synced batch, and redb's synced commit beside it.
async fn synced_cost(writes: usize) {
    let dir = TempDir::new();
    let disk = DirDisk::create(&dir.path().join("store")).expect("data directory");
    let store = EmbeddedStore::open_on(Arc::new(disk), &Options::default()).expect("the store opens");
    let mut latencies = Vec::with_capacity(writes);
    for i in 0..writes {
        let t = Instant::now();
        assert!(store.write("docs", Write::Insert(record(i)), Durability::Synced).await.expect("insert"));
        latencies.push(t.elapsed());
    }
    let stats = store.stats();
    let commits = stats.commits.load(Ordering::Relaxed).max(1);
    let per = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed) as f64 / commits as f64 / 1000.0;
    latencies.sort();
    println!(
        "embedded store, {writes} synced single-document writes one at a time: writer busy {:.1} us per synced batch \
         (apply {:.1}, journal write {:.1}, journal sync {:.1}, redb commit {:.1}, checkpoints {:.1}); write p50 {:.1} us, p99 {:.1} us",
        per(&stats.busy_nanos),
        per(&stats.apply_nanos),
        per(&stats.journal_nanos),
        per(&stats.sync_nanos),
        per(&stats.commit_nanos),
        per(&stats.checkpoint_nanos),
        percentile(&latencies, 0.5).as_secs_f64() * 1e6,
        percentile(&latencies, 0.99).as_secs_f64() * 1e6,
    );
    drop(store);

    const TABLE: redb::TableDefinition<(&str, &str), &[u8]> = redb::TableDefinition::new("records");
    for two_phase in [false, true] {
        let path = dir.path().join(format!("raw-{two_phase}.redb"));
        let db = redb::Database::create(&path).expect("redb");
        let mut times = Vec::with_capacity(writes);
        for i in 0..writes {
            let bytes = {
                let mut out = Vec::new();
                record(i).to_writer(&mut out).expect("encode");
                out
            };
            let t = Instant::now();
            let mut txn = db.begin_write().expect("write txn");
            txn.set_quick_repair(two_phase);
            {
                let mut table = txn.open_table(TABLE).expect("table");
                table.insert(("docs", format!("d{i:08}").as_str()), bytes.as_slice()).expect("insert");
            }
            txn.commit().expect("commit");
            times.push(t.elapsed());
        }
        let mean = times.iter().sum::<Duration>() / writes as u32;
        times.sort();
        println!(
            "redb alone, {writes} synced commits of the same record one at a time ({}): {:.1} us each (p50 {:.1} us)",
            if two_phase { "two-phase, as quick repair makes them" } else { "one-phase with checksums" },
            mean.as_secs_f64() * 1e6,
            percentile(&times, 0.5).as_secs_f64() * 1e6,
        );
        drop(db);
    }
}

/// What `bench durability` measures.
#[derive(clap::Args)]
pub struct DurabilityArgs {
    /// Store sizes at which the store crashes and restarts.
    #[arg(long, value_delimiter = ',', default_value = "10000,1000000")]
    pub crash_docs: Vec<usize>,
    /// Synced writes of the cost run (0: skip).
    #[arg(long, default_value_t = 2000)]
    pub synced_writes: usize,
    /// The power-loss sweep over every crash point.
    #[arg(long)]
    pub power: bool,
    /// Survivor images per crash point of `--power`.
    #[arg(long, default_value_t = 16)]
    pub power_images: usize,
    /// The sweep's seed (default: random, printed).
    #[arg(long)]
    pub power_seed: Option<u64>,
}

pub async fn run(args: &DurabilityArgs) {
    for &n in &args.crash_docs {
        for quick_repair in [false, true] {
            restart_after_crash(n, quick_repair).await;
        }
    }
    if args.synced_writes > 0 {
        synced_cost(args.synced_writes).await;
    }
    if args.power {
        power(args).await;
    }
}

/// The power-loss sweep (`--power`), from the store's test support.
#[cfg(feature = "test-support")]
async fn power(args: &DurabilityArgs) {
    let seed = args.power_seed.unwrap_or_else(rand::random);
    let cfg = txgate_store::powerloss::Sweep {
        seed,
        images_per_point: args.power_images,
        two_crash_every: 1,
        recovery_every: 1,
        progress_every: 50,
    };
    let started = Instant::now();
    match txgate_store::powerloss::sweep(&cfg).await {
        Ok(report) => {
            println!("power loss: {report}, all recovered, in {:.0} s", started.elapsed().as_secs_f64())
        }
        Err(err) => {
            eprintln!("power loss: FAILED: {err}");
            std::process::exit(1);
        }
    }
}

#[cfg(not(feature = "test-support"))]
async fn power(_: &DurabilityArgs) {
    eprintln!("power loss: this bench was built without the `test-support` feature (scripts/bench builds it with it)");
    std::process::exit(2);
}
