//! Scale figures: what a gateway costs as its data grows, and whether the
//! collections it keeps for a while stay bounded under sustained load.
//!
//! `bench scale`: a gateway (in this process, over real HTTP) on an empty
//! store: idle CPU; then with 10,000 documents: p50/p99 of a k = 2
//! transaction and of a single-document read; then with `--docs`
//! documents (default 1,000,000) and `--txns` finished transactions
//! (default 100,000): the same latencies, idle CPU again, and the
//! process's resident memory.
//!
//! `bench soak --secs N`: N seconds of k = 2 transactions (each with an
//! `Idempotency-Key` and one hook to a local receiver) from 32 clients as
//! fast as the gateway takes them, with retentions of one minute, printing
//! the sizes of `_txns`, `_idem` and `_deliveries` every minute.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::json;
use tokio_util::sync::CancellationToken;
use txgate::config::{Config, StoreConfig};
use txgate::testing::document::StoredDoc;
use txgate::testing::txn::Status;
use txgate_store::scans::{DELIVERIES, TXNS};
use txgate_store::{DateTime, DynStore, doc};

use super::{ms, percentile, progress};

/// The collection the documents go to.
const COLL: &str = "scale";

/// A gateway serving in this process.
pub struct Gateway {
    pub base: String,
    pub store: DynStore,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

impl Gateway {
    pub async fn start(config: Config) -> Self {
        let store = txgate::open_store(&config.store).await.expect("store opens");
        Self::start_with(config, store).await
    }

    /// Serve `store` (opened from `config.store`, perhaps wrapped).
    pub async fn start_with(config: Config, store: DynStore) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let base = format!("http://{}", listener.local_addr().expect("addr"));
        let shutdown = CancellationToken::new();
        let server = {
            let (store, shutdown) = (Arc::clone(&store), shutdown.clone());
            tokio::spawn(async move {
                txgate::run_with_store(config, store, listener, shutdown).await.expect("gateway runs");
            })
        };
        let client = reqwest::Client::new();
        while client.get(format!("{base}/readyz")).send().await.map(|r| r.status().as_u16()).unwrap_or(0) != 200 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Self { base, store, shutdown, server }
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.server.await;
    }
}

/// CPU time process `pid` (`self`: this one) has used (all threads, dead
/// ones included).
pub fn cpu_time(pid: &str) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces): utime is the
    // 14th field of the line, stime the 15th; both in clock ticks (100/s).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<u64> = rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
    let ticks = fields.get(11).copied().unwrap_or(0) + fields.get(12).copied().unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Resident and peak resident memory of this process, in MiB.
fn rss_mib() -> (f64, f64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = |key: &str| {
        status
            .lines()
            .find(|l| l.starts_with(key))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (kib("VmRSS:") / 1024.0, kib("VmHWM:") / 1024.0)
}

/// Share of one core used while nothing happens for `secs`: by this
/// process (the gateway) and by process `server` (the database), if given.
async fn idle_cpu(secs: f64, server: &[u32]) -> (f64, Option<f64>) {
    // Let work a load left behind settle first.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = (cpu_time("self"), tree_cpu_time(server), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    let wall = before.2.elapsed().as_secs_f64();
    let share = |now: Duration, then: Duration| (now.saturating_sub(then)).as_secs_f64() / wall * 100.0;
    let server_share = (!server.is_empty()).then(|| share(tree_cpu_time(server), before.1));
    (share(cpu_time("self"), before.0), server_share)
}

/// CPU time of processes `roots` and of every process under them (a
/// PostgreSQL server's backends and workers under its postmaster), as
/// they are now: a child that ended between two readings takes its time
/// with it, so the difference of two readings is a lower bound.
fn tree_cpu_time(roots: &[u32]) -> Duration {
    if roots.is_empty() {
        return Duration::ZERO;
    }
    let mut parent = std::collections::HashMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // The parent is the second field after the command name.
        let ppid = stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().nth(1)?.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            parent.insert(pid, ppid);
        }
    }
    let under = |mut pid: u32| loop {
        if roots.contains(&pid) {
            return true;
        }
        match parent.get(&pid) {
            Some(&p) if p != pid && p > 1 => pid = p,
            _ => return false,
        }
    };
    parent.keys().filter(|&&pid| under(pid)).map(|pid| cpu_time(&pid.to_string())).sum()
}

/// Insert documents `from..to` of the scale collection straight into the
/// store, many at a time.
async fn load_docs(store: &DynStore, from: usize, to: usize) {
    let now = DateTime::now();
    let done = AtomicU64::new(0);
    let started = Instant::now();
    futures::stream::iter(from..to)
        .map(|i| {
            let d = StoredDoc::new_live(id(i), doc! {"n": 0_i64, "owner": format!("user {i}")}, 1, 1, now);
            let (store, done) = (Arc::clone(store), &done);
            async move {
                store.insert(COLL, d.to_record()).await.expect("insert");
                let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                if n % 100_000 == 0 {
                    progress(&format!(
                        "{} documents loaded ({:.0}/s)",
                        from as u64 + n,
                        n as f64 / started.elapsed().as_secs_f64()
                    ));
                }
            }
        })
        .buffer_unordered(1024)
        .collect::<Vec<()>>()
        .await;
}

/// Insert `n` finished transaction records.
async fn load_txns(store: &DynStore, n: usize) {
    let now = DateTime::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let store = Arc::clone(store);
            async move {
                let rec = doc! {
                    "_id": format!("0000-old-{i:08}"), "status": Status::Done.as_str(), "started_at": now,
                    "expires_at": now, "committed_at": now, "finished_at": now, "request": "{}",
                    "members": [], "results": [], "hook_count": 0_i64,
                };
                store.insert("_txns", rec).await.expect("insert");
            }
        })
        .buffer_unordered(1024)
        .collect::<Vec<()>>()
        .await;
}

fn id(i: usize) -> String {
    format!("d{i:08}")
}

/// p50/p99 of k = 2 transactions and of single-document reads over `docs`
/// (`n` of each; none when `n` is 0).
async fn latencies(base: &str, docs: usize, n: usize) -> [Duration; 4] {
    if n == 0 {
        return [Duration::ZERO; 4];
    }
    use rand::Rng;
    let client = reqwest::Client::new();
    let mut txn = Vec::with_capacity(n);
    let mut read = Vec::with_capacity(n);
    for _ in 0..n {
        let (a, b) = {
            let mut rng = rand::rng();
            let a = rng.random_range(0..docs);
            let mut b = rng.random_range(0..docs);
            while b == a {
                b = rng.random_range(0..docs);
            }
            (a, b)
        };
        let body = json!({"actions": [
            {"op": "update", "collection": COLL, "id": id(a), "inc": {"n": 1}},
            {"op": "update", "collection": COLL, "id": id(b), "inc": {"n": -1}},
        ]});
        let t = Instant::now();
        let res = client.post(format!("{base}/v1/transactions")).json(&body).send().await.expect("send");
        assert_eq!(res.status().as_u16(), 200, "{}", res.text().await.unwrap_or_default());
        let _ = res.bytes().await;
        txn.push(t.elapsed());
        let t = Instant::now();
        let res = client.get(format!("{base}/v1/collections/{COLL}/documents/{}", id(a))).send().await.expect("send");
        assert_eq!(res.status().as_u16(), 200);
        let _ = res.bytes().await;
        read.push(t.elapsed());
    }
    txn.sort();
    read.sort();
    [percentile(&txn, 0.5), percentile(&txn, 0.99), percentile(&read, 0.5), percentile(&read, 0.99)]
}

pub struct ScaleArgs {
    pub store: StoreConfig,
    pub docs: usize,
    pub txns: usize,
    pub idle_secs: f64,
    pub samples: usize,
    /// The database server's processes, to report their idle CPU (with
    /// their children's) too.
    pub server_pids: Vec<u32>,
}

pub async fn run(args: ScaleArgs) {
    let config = Config { store: args.store.clone(), ..Config::default() };
    let gw = Gateway::start(config).await;
    progress("idle, empty");
    let idle_empty = idle_cpu(args.idle_secs, &args.server_pids).await;
    let small = 10_000.min(args.docs);
    progress(&format!("loading {small} documents"));
    load_docs(&gw.store, 0, small).await;
    progress("latency at the small size");
    let at_small = latencies(&gw.base, small, args.samples).await;
    progress(&format!("loading up to {} documents and {} finished transactions", args.docs, args.txns));
    let started = Instant::now();
    load_docs(&gw.store, small, args.docs).await;
    load_txns(&gw.store, args.txns).await;
    progress(&format!("loaded in {:.0} s", started.elapsed().as_secs_f64()));
    progress("latency at the large size");
    let at_large = latencies(&gw.base, args.docs, args.samples).await;
    progress("idle, large");
    let idle_large = idle_cpu(args.idle_secs, &args.server_pids).await;
    let (rss, peak) = rss_mib();
    gw.stop().await;

    println!(
        "scale: {} store, idle CPU over {} s, {} samples per latency",
        backend(&args.store),
        args.idle_secs,
        args.samples
    );
    println!();
    println!("{:<44} {:>12} {:>12} {:>7}", "", format!("{small} docs"), format!("{} docs", args.docs), "ratio");
    let row = |what: &str, a: Duration, b: Duration| {
        let (a_ms, b_ms) = (format!("{:.2}ms", ms(a)), format!("{:.2}ms", ms(b)));
        println!("{what:<44} {a_ms:>12} {b_ms:>12} {:>6.2}x", b.as_secs_f64() / a.as_secs_f64().max(1e-9));
    };
    if args.samples > 0 {
        row("k=2 transaction p50", at_small[0], at_large[0]);
        row("k=2 transaction p99", at_small[1], at_large[1]);
        row("single-document read p50", at_small[2], at_large[2]);
        row("single-document read p99", at_small[3], at_large[3]);
        println!();
    }
    let server = |s: Option<f64>| s.map_or(String::new(), |s| format!("; database server {s:.2}%"));
    println!("idle CPU, empty store: gateway {:.2}% of one core{}", idle_empty.0, server(idle_empty.1));
    println!(
        "idle CPU, {} documents + {} finished txns: gateway {:.2}% of one core{} (target < 2%)",
        args.docs,
        args.txns,
        idle_large.0,
        server(idle_large.1)
    );
    println!("resident memory after loading: {rss:.0} MiB (peak {peak:.0} MiB)");
}

pub(super) fn backend(store: &StoreConfig) -> &'static str {
    match store {
        StoreConfig::Embedded { .. } => "embedded",
        StoreConfig::Mongodb { .. } => "mongodb",
    }
}

/// How many records `coll` holds (read once a minute: a full count).
async fn size(store: &DynStore, coll: &str) -> usize {
    let decl = match coll {
        "_txns" => &TXNS,
        "_deliveries" => &DELIVERIES,
        _ => &txgate_store::scans::IDEM,
    };
    store.scan(coll, decl.scan(Vec::new())).await.map_or(0, |r| r.len())
}

pub async fn soak(store: StoreConfig, secs: f64, clients: usize) {
    let mut config = Config { store: store.clone(), ..Config::default() };
    config.txn.retention = Duration::from_secs(60);
    config.txn.idempotency_retention = Duration::from_secs(60);
    config.hooks.retention = Duration::from_secs(60);
    config.hook_guard = txgate::testing::hooks::guard::HookGuard::new("127.0.0.1:*").expect("allow pattern");
    let gw = Gateway::start(config).await;
    let hook = super::hooks::counting_receiver().await;
    load_docs(&gw.store, 0, 10_000).await;
    println!(
        "soak: {} store, {clients} clients, k = 2 transactions with an Idempotency-Key and one hook each,",
        backend(&store)
    );
    println!("retention of transactions, idempotency keys and deliveries: 60 s; sizes every minute");
    println!();
    println!(
        "{:>6} {:>10} {:>10} {:>10} {:>12} {:>9}",
        "minute", "commits/s", "_txns", "_idem", "_deliveries", "delivered"
    );
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (base, stop, committed, hook) =
            (gw.base.clone(), Arc::clone(&stop), Arc::clone(&committed), hook.url.clone());
        tasks.push(tokio::spawn(async move {
            use rand::Rng;
            let client = reqwest::Client::new();
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let (a, b) = {
                    let mut rng = rand::rng();
                    (rng.random_range(0..10_000), rng.random_range(0..10_000))
                };
                if a == b {
                    continue;
                }
                let body = json!({
                    "actions": [
                        {"op": "update", "collection": COLL, "id": id(a), "inc": {"n": 1}},
                        {"op": "update", "collection": COLL, "id": id(b), "inc": {"n": -1}},
                    ],
                    "hooks": [{"url": hook}],
                });
                let res = client
                    .post(format!("{base}/v1/transactions"))
                    .header("Idempotency-Key", format!("soak-{c}-{i}"))
                    .json(&body)
                    .send()
                    .await;
                if let Ok(res) = res {
                    if res.status().as_u16() == 200 {
                        committed.fetch_add(1, Ordering::Relaxed);
                    }
                    let _ = res.bytes().await;
                }
            }
        }));
    }
    let started = Instant::now();
    let mut last = (0u64, Instant::now());
    let mut minute = 0;
    while started.elapsed().as_secs_f64() < secs {
        let next = Duration::from_secs(60 * (minute + 1)).min(Duration::from_secs_f64(secs));
        tokio::time::sleep(next.saturating_sub(started.elapsed())).await;
        minute += 1;
        let now = committed.load(Ordering::Relaxed);
        let rate = (now - last.0) as f64 / last.1.elapsed().as_secs_f64();
        last = (now, Instant::now());
        println!(
            "{minute:>6} {rate:>10.0} {:>10} {:>10} {:>12} {:>9}",
            size(&gw.store, "_txns").await,
            size(&gw.store, "_idem").await,
            size(&gw.store, "_deliveries").await,
            hook.count()
        );
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }
    gw.stop().await;
}
