//! The commit protocol benchmark (`bench protocol`, the default): for
//! transactions of k update members, latency back to back and on the
//! critical path alone, a raw baseline of the same k updates straight to
//! the store, throughput without and with conflicts, store writes per
//! transaction; then hook delivery (see `hooks.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use txgate::config::StoreConfig;
use txgate::testing::metrics::Metrics;
use txgate::testing::txn::commit::TxnError;
use txgate::testing::txn::{Transactions, TxnConfig};
use txgate_store::layer::{Layer, Layered, Op};
use txgate_store::{Durability, DynStore, Store, StoreResult, Update, doc};

use super::workload::{plan, seed, wait_idle};
use super::{STORE_TIMEOUT, hooks, ms, percentile, progress};

/// What `bench protocol` measures.
#[derive(clap::Args, Clone)]
pub struct ProtocolArgs {
    /// Seconds each measurement runs.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Member counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,5,10")]
    pub k: Vec<usize>,
    /// Concurrent clients for the throughput runs.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Print the engine's counters (commits, wounds, retries) and mean
    /// durations after each contended run.
    #[arg(long)]
    pub counters: bool,
    /// Accounts the contended run spreads over.
    #[arg(long, default_value_t = 100)]
    pub accounts: usize,
    /// Committed hooks the delivery worker drains for the throughput
    /// figure (0: skip the hook benchmark).
    #[arg(long, default_value_t = 5000)]
    pub hook_backlog: usize,
    /// Transactions per second (one hook each) of the lag measurement.
    #[arg(long, default_value_t = 1000.0)]
    pub hook_rate: f64,
}

impl Default for ProtocolArgs {
    fn default() -> Self {
        use clap::Parser;
        #[derive(Parser)]
        struct Defaults {
            #[command(flatten)]
            args: ProtocolArgs,
        }
        Defaults::parse_from(["bench"]).args
    }
}

/// Counts store writes (and reads) passing through, as a layer of the
/// store stack (so it forwards every operation the gateway uses, chains
/// and batch appends included).
pub struct Counting {
    /// Document and record writes (the protocol's), appends aside.
    pub writes: AtomicU64,
    /// Appends to a log (the change events a commit outputs).
    pub appends: AtomicU64,
    /// Requests that had to be durable before they returned: a synced
    /// write, or a synced chain where the store applies a chain in one
    /// commit (it waits for one sync).
    pub synced: AtomicU64,
    pub reads: AtomicU64,
    /// Whether the store below commits a chain at once.
    cheap_chains: bool,
}

impl Counting {
    pub fn over(inner: DynStore) -> Layered<Self> {
        let cheap_chains = inner.capabilities().cheap_chains;
        let counting = Self {
            writes: AtomicU64::new(0),
            appends: AtomicU64::new(0),
            synced: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            cheap_chains,
        };
        Layered::new(inner, counting)
    }
}

impl Layer for Counting {
    fn around<T: Send>(
        &self,
        _: &dyn Store,
        op: &Op<'_>,
        run: impl Future<Output = StoreResult<T>> + Send,
    ) -> impl Future<Output = StoreResult<T>> + Send {
        match op.name {
            "get" | "scan" | "get_many" => {
                self.reads.fetch_add(1, Ordering::Relaxed);
            }
            _ if op.writes > 0 => {
                let n = op.writes as u64;
                self.writes.fetch_add(n - op.appends as u64, Ordering::Relaxed);
                self.appends.fetch_add(op.appends as u64, Ordering::Relaxed);
                if op.durability == Some(Durability::Synced) {
                    let chain = op.name == "write_in_order";
                    self.synced.fetch_add(if chain && !self.cheap_chains { n } else { 1 }, Ordering::Relaxed);
                }
            }
            _ => {}
        }
        run
    }
}

struct Throughput {
    committed: usize,
    aborted: usize,
    /// Transactions that took longer than [`SLOW`] (still finished).
    slow: usize,
    /// Transactions that did not finish within [`STUCK`].
    deadlocks: usize,
    per_sec: f64,
}

/// A transaction slower than this is counted as slow.
const SLOW: Duration = Duration::from_secs(30);
/// One that has not finished after this is counted as stuck (deadlocked).
const STUCK: Duration = Duration::from_secs(300);

/// `clients` concurrent clients for `seconds`; `pick(client, round)` names
/// the documents of each transaction. Retryable aborts are retried.
async fn throughput(
    engine: &Arc<Transactions>,
    coll: &str,
    clients: usize,
    seconds: f64,
    pick: Arc<dyn Fn(usize, usize) -> Vec<String> + Send + Sync>,
) -> Throughput {
    let committed = Arc::new(AtomicUsize::new(0));
    let aborted = Arc::new(AtomicUsize::new(0));
    let deadlocks = Arc::new(AtomicUsize::new(0));
    let slow = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (engine, coll, pick) = (Arc::clone(engine), coll.to_owned(), Arc::clone(&pick));
        let (committed, aborted, deadlocks) = (Arc::clone(&committed), Arc::clone(&aborted), Arc::clone(&deadlocks));
        let slow = Arc::clone(&slow);
        tasks.push(tokio::spawn(async move {
            let mut round = 0;
            while Instant::now() < until {
                let p = plan(&coll, &pick(c, round));
                round += 1;
                loop {
                    let started = Instant::now();
                    let outcome = tokio::time::timeout(STUCK, engine.execute(&p, None)).await;
                    if started.elapsed() > SLOW {
                        slow.fetch_add(1, Ordering::Relaxed);
                    }
                    match outcome {
                        Err(_) => {
                            deadlocks.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Ok(Ok(_)) => {
                            committed.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Ok(Err(TxnError::Aborted { failure, .. })) if failure.retryable => {
                            aborted.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(Err(e)) => panic!("unexpected failure: {e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let elapsed = started.elapsed().as_secs_f64();
    let committed = committed.load(Ordering::Relaxed);
    Throughput {
        committed,
        aborted: aborted.load(Ordering::Relaxed),
        deadlocks: deadlocks.load(Ordering::Relaxed),
        slow: slow.load(Ordering::Relaxed),
        per_sec: committed as f64 / elapsed,
    }
}

/// Run the protocol benchmark on `config` (a store named `label`).
pub async fn run(args: &ProtocolArgs, config: &StoreConfig, label: &str) {
    let raw = txgate::open_store(config).await.expect("store opens");
    // Counted where the backend is reached, under the gateway's own stack.
    let counting = Arc::new(Counting::over(Arc::clone(&raw)));
    let metrics = Arc::new(Metrics::default());
    let (store, _tap) = txgate::stack(counting.clone(), STORE_TIMEOUT, &metrics);
    txgate::testing::migrate::run(store.as_ref()).await.expect("migrations");
    let engine = txgate::transactions(Arc::clone(&store), TxnConfig::default(), Arc::clone(&metrics)).0;
    let clients = args.clients;
    println!(
        "txgate bench: {label} store, {} s per run, {clients} clients, {} contended accounts",
        args.seconds, args.accounts
    );
    println!();
    println!(
        "{:>3} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>10} {:>10} {:>7} {:>7} {:>5} {:>5}",
        "k",
        "txn p50",
        "txn p99",
        "idle p50",
        "raw p50",
        "raw p99",
        "ratio",
        "idle r.",
        "writes",
        "free tx/s",
        "busy tx/s",
        "busy %",
        "aborts",
        "slow",
        "dead"
    );
    let mut verdicts = Vec::new();
    for &k in &args.k {
        let coll = format!("bench_k{k}");
        let docs = (clients * k).max(args.accounts).max(k * 200);
        progress(&format!("k={k}: seeding {docs} documents"));
        seed(&raw, &coll, docs).await;
        progress(&format!("k={k}: latency"));
        let ids: Vec<String> = (0..docs).map(|i| format!("d{i:05}")).collect();

        // Latency: one client, transactions one after the other.
        let mut lat = Vec::new();
        let writes_before = counting.layer().writes.load(Ordering::Relaxed);
        let synced_before = counting.layer().synced.load(Ordering::Relaxed);
        let appends_before = counting.layer().appends.load(Ordering::Relaxed);
        let until = Instant::now() + Duration::from_secs_f64(args.seconds);
        let mut round = 0;
        while Instant::now() < until {
            let start = (round * k) % (docs - k + 1);
            let p = plan(&coll, &ids[start..start + k]);
            let t = Instant::now();
            engine.execute(&p, None).await.expect("uncontended transaction commits");
            lat.push(t.elapsed());
            round += 1;
        }
        // Let the background roll-forwards finish before counting writes.
        wait_idle(&engine).await;
        let writes = (counting.layer().writes.load(Ordering::Relaxed) - writes_before) as f64 / lat.len() as f64;
        let synced = (counting.layer().synced.load(Ordering::Relaxed) - synced_before) as f64 / lat.len() as f64;
        let appends = (counting.layer().appends.load(Ordering::Relaxed) - appends_before) as f64 / lat.len() as f64;
        lat.sort();

        // The critical path alone: each transaction starts once the
        // previous one's roll-forward has finished.
        let mut idle_lat = Vec::new();
        let until = Instant::now() + Duration::from_secs_f64(args.seconds / 2.0);
        while Instant::now() < until {
            let start = (round * k) % (docs - k + 1);
            let p = plan(&coll, &ids[start..start + k]);
            let t = Instant::now();
            engine.execute(&p, None).await.expect("uncontended transaction commits");
            idle_lat.push(t.elapsed());
            wait_idle(&engine).await;
            round += 1;
        }
        idle_lat.sort();

        // Raw baseline: the same k updates straight to the store.
        let mut raw_lat = Vec::new();
        let until = Instant::now() + Duration::from_secs_f64(args.seconds / 2.0);
        let mut round = 0_i64;
        while Instant::now() < until {
            let start = (round as usize * k) % (docs - k + 1);
            let t = Instant::now();
            for id in &ids[start..start + k] {
                raw.update(&coll, id, doc! {}, Update::set(doc! {"raw": round})).await.expect("raw update");
            }
            raw_lat.push(t.elapsed());
            round += 1;
        }
        raw_lat.sort();

        // Throughput without conflicts: each client its own documents.
        let per_client = docs / clients;
        let free_pick: Arc<dyn Fn(usize, usize) -> Vec<String> + Send + Sync> = {
            let ids = ids.clone();
            Arc::new(move |c, r| {
                let base = c * per_client;
                let off = (r * k) % (per_client - k + 1);
                ids[base + off..base + off + k].to_vec()
            })
        };
        progress(&format!("k={k}: throughput without conflicts"));
        let free = throughput(&engine, &coll, clients, args.seconds, free_pick).await;
        wait_idle(&engine).await;

        // Throughput with conflicts: every client over the same accounts.
        let accounts = args.accounts.min(docs);
        let busy_pick: Arc<dyn Fn(usize, usize) -> Vec<String> + Send + Sync> = {
            let ids = ids.clone();
            let seq = Arc::new(AtomicU64::new(0x9e37_79b9_7f4a_7c15));
            Arc::new(move |_, _| {
                let mut chosen: Vec<String> = Vec::with_capacity(k);
                while chosen.len() < k {
                    let x = seq.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
                    let x = (x ^ (x >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    let id = &ids[(x >> 17) as usize % accounts];
                    if !chosen.contains(id) {
                        chosen.push(id.clone());
                    }
                }
                chosen
            })
        };
        let before = metrics.counters();
        progress(&format!("k={k}: throughput with conflicts"));
        let busy = throughput(&engine, &coll, clients, args.seconds, busy_pick).await;
        wait_idle(&engine).await;
        if args.counters {
            eprintln!("  k={k}, contended run:");
            for (n, l, v) in metrics.counters() {
                let was = before.iter().find(|(n2, l2, _)| *n2 == n && *l2 == l).map_or(0, |x| x.2);
                if v > was {
                    eprintln!("    {n}{{{l}}} {}", v - was);
                }
            }
            for (n, l, sum, count) in metrics.timings() {
                eprintln!("    {n}{{{l}}} mean {:.1}ms over the whole run, n={count}", sum * 1000.0 / count as f64);
            }
        }

        let (p50, p99, r50, r99) =
            (percentile(&lat, 0.5), percentile(&lat, 0.99), percentile(&raw_lat, 0.5), percentile(&raw_lat, 0.99));
        let ratio = ms(p50) / ms(r50).max(1e-9);
        let idle50 = percentile(&idle_lat, 0.5);
        let idle_ratio = ms(idle50) / ms(r50).max(1e-9);
        let busy_share = 100.0 * busy.per_sec / free.per_sec.max(1e-9);
        let abort_rate = 100.0 * busy.aborted as f64 / (busy.aborted + busy.committed).max(1) as f64;
        println!(
            "{k:>3} {:>7.2}ms {:>7.2}ms {:>7.2}ms {:>7.2}ms {:>7.2}ms {:>6.2}x {:>6.2}x {:>7.1} {:>10.0} {:>10.0} {:>6.0}% {:>6.1}% {:>5} {:>5}",
            ms(p50),
            ms(p99),
            ms(idle50),
            ms(r50),
            ms(r99),
            ratio,
            idle_ratio,
            writes,
            free.per_sec,
            busy.per_sec,
            busy_share,
            abort_rate,
            free.slow + busy.slow,
            free.deadlocks + busy.deadlocks,
        );
        verdicts.push(format!(
            "k={k}: writes/txn {writes:.1} (target <= {}; and {appends:.1} event appends), synced requests/txn {synced:.1} (target <= 1){}{}; contended {busy_share:.0}% of uncontended (target >= 50%; \
             at most {:.1} of {clients} random transactions are free of conflicts at once); deadlocks {}",
            2 * k + 3,
            if k == 2 {
                format!("; p50 ratio {ratio:.2}x back to back, {idle_ratio:.2}x critical path (target <= 3.0x)")
            } else {
                String::new()
            },
            if k == 10 {
                format!("; p50 ratio {ratio:.2}x back to back, {idle_ratio:.2}x critical path (target <= 2.4x)")
            } else {
                String::new()
            },
            disjoint_at_once(k, args.accounts, clients),
            free.deadlocks + busy.deadlocks,
        ));
    }
    println!();
    println!("columns: txn = one client's transaction latency, transactions back to back (each overlaps the");
    println!("previous one's roll-forward); idle = the same, each started once the previous roll-forward finished");
    println!("(the critical path alone); raw = the same k updates straight to the store, one after the other;");
    println!("ratio, idle r. = txn p50 / raw p50, idle p50 / raw p50; writes = store writes per transaction");
    println!("(including roll-forward);");
    println!(
        "free/busy tx/s = {clients} clients on disjoint documents / over {} shared accounts; aborts = retried",
        args.accounts
    );
    println!("aborts per attempt in the busy run; slow = attempts that took over 30 s (the store could not keep up),");
    println!("dead = attempts that had not finished after 5 minutes (a deadlock would show here).");
    println!();
    for v in verdicts {
        println!("{v}");
    }
    if args.hook_backlog > 0 {
        println!();
        match hooks::run(Arc::clone(&raw), args.hook_backlog, args.hook_rate, args.seconds, clients).await {
            Some(figures) => hooks::print(&figures),
            None => println!("hook benchmark did not finish"),
        }
    }
}

/// How many of `clients` transactions, each over `k` random accounts of
/// `accounts`, can run at once without sharing a document (taken greedily,
/// averaged over random draws): the parallelism any protocol that
/// serializes conflicting writes has left in the contended run.
fn disjoint_at_once(k: usize, accounts: usize, clients: usize) -> f64 {
    use rand::seq::index::sample;
    let mut rng = rand::rng();
    let trials = 2000;
    let mut total = 0;
    for _ in 0..trials {
        let mut used = vec![false; accounts];
        for _ in 0..clients {
            let picked = sample(&mut rng, accounts, k.min(accounts));
            if picked.iter().all(|i| !used[i]) {
                picked.iter().for_each(|i| used[i] = true);
                total += 1;
            }
        }
    }
    total as f64 / trials as f64
}
