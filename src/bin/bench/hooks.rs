//! The delivery benchmark: deliveries per second to a healthy local
//! receiver (a backlog of committed hooks drained by one delivery worker),
//! and the lag from commit to arrival while transactions with hooks are
//! committed at a steady rate.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txgate::testing::hooks::HookConfig;
use txgate::testing::hooks::guard::HookGuard;
use txgate::testing::hooks::net::Clients;
use txgate::testing::hooks::send::Sender;
use txgate::testing::metrics::Metrics;
use txgate::testing::txn::{Transactions, TxnConfig};
use txgate::testing::worker::Worker;
use txgate_store::DynStore;

use super::workload::{plan, seed, wait_idle};
use super::{ms, percentile};

/// What the receiver saw.
#[derive(Default)]
struct Seen {
    count: AtomicUsize,
    /// Arrival time minus the transaction's `committed_at`.
    lags: Mutex<Vec<Duration>>,
}

async fn receiver(seen: Arc<Seen>) -> String {
    async fn handle(
        axum::extract::State(seen): axum::extract::State<Arc<Seen>>,
        body: axum::body::Bytes,
    ) -> &'static str {
        let arrived = time::OffsetDateTime::now_utc();
        let committed = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| {
            let at = v["committed_at"].as_str()?.to_owned();
            time::OffsetDateTime::parse(&at, &time::format_description::well_known::Rfc3339).ok()
        });
        if let Some(committed) = committed {
            let lag = (arrived - committed).max(time::Duration::ZERO);
            seen.lags.lock().unwrap().push(Duration::from_nanos(lag.whole_nanoseconds() as u64));
        }
        seen.count.fetch_add(1, Ordering::Relaxed);
        "ok"
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("receiver binds");
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let router = axum::Router::new().route("/hook", axum::routing::post(handle)).with_state(seen);
    tokio::spawn(async move { axum::serve(listener, router).await });
    url
}

/// Commit one single-member transaction with one hook per id, `clients`
/// at a time.
async fn commit_all(engine: &Arc<Transactions>, coll: &str, ids: Vec<String>, hook: &str, clients: usize) {
    let next = Arc::new(AtomicUsize::new(0));
    let ids = Arc::new(ids);
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (engine, next, ids, coll, hook) =
                (Arc::clone(engine), Arc::clone(&next), Arc::clone(&ids), coll.to_owned(), hook.to_owned());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(id) = ids.get(i) else { return };
                    engine.execute(&with_hook(&coll, id, &hook), None).await.expect("transaction commits");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("client");
    }
}

fn with_hook(coll: &str, id: &str, hook: &str) -> txgate::testing::txn::plan::Plan {
    let mut p = plan(coll, &[id.to_owned()]);
    p.request = serde_json::json!({"hooks": [{"url": hook}]}).to_string();
    p.hooks = txgate::testing::hooks::hooks_of(&p.request);
    p
}

async fn until_count(seen: &Seen, n: usize, limit: Duration) -> bool {
    let started = Instant::now();
    while seen.count.load(Ordering::Relaxed) < n {
        if started.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

pub struct Figures {
    pub backlog: usize,
    pub per_sec: f64,
    pub offered_rate: f64,
    pub achieved_rate: f64,
    pub p50: Duration,
    pub p99: Duration,
}

pub async fn run(store: DynStore, backlog: usize, rate: f64, seconds: f64, clients: usize) -> Option<Figures> {
    let (engine, hooks) = txgate::transactions(Arc::clone(&store), TxnConfig::default(), Arc::new(Metrics::default()));
    let seen = Arc::new(Seen::default());
    let hook = receiver(Arc::clone(&seen)).await;
    let coll = "hookbench";
    let steady = ((rate * seconds).ceil() as usize).max(1);
    seed(&store, coll, backlog + steady).await;
    let ids: Vec<String> = (0..backlog + steady).map(|i| format!("d{i:05}")).collect();

    // 1. A backlog of committed hooks, then one worker drains it.
    super::progress(&format!("hooks: committing {backlog} transactions with a hook each"));
    commit_all(&engine, coll, ids[..backlog].to_vec(), &hook, clients).await;
    wait_idle(&engine).await;
    let guard = Arc::new(HookGuard::new("127.0.0.1:*").expect("allow pattern"));
    let cfg = HookConfig::default();
    let sender = Sender::new(hooks, cfg.clone(), Clients::new(guard, cfg.timeout).expect("clients"));
    let stop = tokio_util::sync::CancellationToken::new();
    super::progress("hooks: draining them");
    let started = Instant::now();
    let worker = tokio::spawn(Arc::clone(&sender).run(stop.clone()));
    if !until_count(&seen, backlog, Duration::from_secs(600)).await {
        eprintln!("the backlog was not drained within 10 minutes");
        return None;
    }
    let per_sec = backlog as f64 / started.elapsed().as_secs_f64();

    // 2. Steady commits at `rate`, at most `clients` in flight.
    super::progress(&format!("hooks: {steady} transactions at {rate} per second"));
    seen.lags.lock().unwrap().clear();
    let before = seen.count.load(Ordering::Relaxed);
    let in_flight = Arc::new(tokio::sync::Semaphore::new(clients));
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for id in &ids[backlog..] {
        ticker.tick().await;
        let permit = Arc::clone(&in_flight).acquire_owned().await.expect("semaphore");
        let (engine, p) = (Arc::clone(&engine), with_hook(coll, id, &hook));
        tasks.push(tokio::spawn(async move {
            engine.execute(&p, None).await.expect("transaction commits");
            drop(permit);
        }));
    }
    for t in tasks {
        t.await.expect("client");
    }
    let achieved_rate = steady as f64 / started.elapsed().as_secs_f64();
    if !until_count(&seen, before + steady, Duration::from_secs(600)).await {
        eprintln!("the steady-rate deliveries did not all arrive within 10 minutes");
        return None;
    }
    stop.cancel();
    let _ = worker.await;
    let mut lags = seen.lags.lock().unwrap().clone();
    lags.sort();
    Some(Figures {
        backlog,
        per_sec,
        offered_rate: rate,
        achieved_rate,
        p50: percentile(&lags, 0.5),
        p99: percentile(&lags, 0.99),
    })
}

pub fn print(f: &Figures) {
    println!("hook deliveries to a healthy local receiver (one delivery worker, 64 attempts in flight):");
    println!("  drain of {} committed hooks: {:.0} deliveries/s (target >= 1000)", f.backlog, f.per_sec);
    println!(
        "  commit -> arrival lag at {:.0} tx/s offered ({:.0} achieved), one hook each: p50 {:.1} ms, p99 {:.1} ms (target p99 < 250 ms)",
        f.offered_rate,
        f.achieved_rate,
        ms(f.p50),
        ms(f.p99)
    );
}

/// A local receiver that counts what it gets.
pub struct Counting {
    pub url: String,
    seen: Arc<Seen>,
}

impl Counting {
    pub fn count(&self) -> usize {
        self.seen.count.load(Ordering::Relaxed)
    }
}

pub async fn counting_receiver() -> Counting {
    let seen = Arc::new(Seen::default());
    Counting { url: receiver(Arc::clone(&seen)).await, seen }
}
