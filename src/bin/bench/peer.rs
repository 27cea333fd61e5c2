//! `bench peer`: the four workloads `scripts/bench --peer
//! postgres` runs against txgate and PostgreSQL in the same run, here
//! against a gateway serving in this process, over HTTP with keep-alive:
//!
//! - one single-document update (`PATCH` with `inc`), one client, p50;
//! - a k = 2 and a k = 10 update transaction, one client, p50;
//! - a contended bank: 16 clients moving money between 100 accounts with
//!   k = 2 transactions, committed transactions per second.
//!
//! - what one request costs this process in processor time, for a read,
//!   a single update and a k = 2 transaction, beside the `/healthz`
//!   floor ([`super::cost`]).
//!
//! Each result is also printed as a `peer txgate <name> <value>` line for
//! the script to put beside PostgreSQL's. Syncs (fsyncs) per k = 2
//! transaction are counted by the embedded store's writer, as is where its
//! time goes (`writer` lines).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{Value, json};
use txgate::config::{Config, StoreConfig};
use txgate_store::embedded::EmbeddedStore;
use txgate_store::{Durability, DynStore, Update, Write, doc};

use super::protocol::Counting;
use super::{ms, percentile};

/// Accounts of the contended bank (as in the PostgreSQL script).
const BANK_ACCOUNTS: usize = 100;
/// Clients of the contended bank.
const BANK_CLIENTS: usize = 16;
/// Documents the uncontended workloads rotate over.
const POOL: usize = 2000;

struct Served {
    gateway: super::scale::Gateway,
    counting: Arc<txgate_store::layer::Layered<Counting>>,
    embedded: Arc<EmbeddedStore>,
}

async fn serve(store: StoreConfig) -> Served {
    let embedded = super::open_embedded(&store).expect("the peer workloads run on the embedded store");
    // The gateway puts its stack (templates included) over the counter.
    let raw: DynStore = Arc::clone(&embedded) as DynStore;
    let config = Config { store, ..Config::default() };
    let counting = Arc::new(Counting::over(raw));
    let gateway = super::scale::Gateway::start_with(config, Arc::clone(&counting) as DynStore).await;
    Served { gateway, counting, embedded }
}

/// The embedded store's writer thread at one moment.
#[derive(Clone, Copy)]
struct WriterAt {
    at: Instant,
    commits: u64,
    syncs: u64,
    checkpoints: u64,
    seals: u64,
    writes: u64,
    busy: u64,
    synced: u64,
    /// Apply, journal, sync, commit, checkpoint (see `WriterStats`).
    phases: [u64; 5],
}

impl WriterAt {
    fn now(store: &EmbeddedStore) -> Self {
        let s = store.stats();
        Self {
            at: Instant::now(),
            commits: s.commits.load(Ordering::Relaxed),
            syncs: s.syncs.load(Ordering::Relaxed),
            checkpoints: s.checkpoints.load(Ordering::Relaxed),
            seals: s.seals.load(Ordering::Relaxed),
            writes: s.writes.load(Ordering::Relaxed),
            busy: s.busy_nanos.load(Ordering::Relaxed),
            synced: s.synced_nanos.load(Ordering::Relaxed),
            phases: [&s.apply_nanos, &s.journal_nanos, &s.sync_nanos, &s.commit_nanos, &s.checkpoint_nanos]
                .map(|c| c.load(Ordering::Relaxed)),
        }
    }

    /// Where the writer's time went since `self`, per unit of work done.
    fn report(self, store: &EmbeddedStore, name: &str, done: usize) {
        let now = Self::now(store);
        let per = |n: u64| n as f64 / done.max(1) as f64;
        let syncs = now.syncs - self.syncs;
        println!(
            "writer {name}: {:.2} commits, {:.2} syncs and {:.2} writes per unit, {} checkpoints, {} seals; busy {:.0}% of the time; a batch that syncs takes {:.3} ms on average",
            per(now.commits - self.commits),
            per(syncs),
            per(now.writes - self.writes),
            now.checkpoints - self.checkpoints,
            now.seals - self.seals,
            100.0 * (now.busy - self.busy) as f64 / (now.at - self.at).as_nanos() as f64,
            (now.synced - self.synced) as f64 / syncs.max(1) as f64 / 1e6,
        );
        let us = |i: usize| per(now.phases[i] - self.phases[i]) / 1e3;
        println!(
            "writer {name}, busy time per unit: apply {:.1} us, journal write {:.1} us, journal sync {:.1} us, redb commit {:.1} us, checkpoints {:.1} us",
            us(0),
            us(1),
            us(2),
            us(3),
            us(4),
        );
    }
}

async fn create(client: &reqwest::Client, base: &str, coll: &str, id: String, data: Value) {
    let mut body = data;
    body["_id"] = json!(id);
    let res = client.post(format!("{base}/v1/collections/{coll}/documents")).json(&body).send().await.unwrap();
    assert_eq!(res.status(), 201, "seeding {coll}");
}

/// The `i`th single-document update: `inc` on one of 100 documents.
fn single_update(client: &reqwest::Client, base: &str, i: usize) -> reqwest::RequestBuilder {
    client
        .patch(format!("{base}/v1/collections/peer_single/documents/s{}", i % 100))
        .header("content-type", "application/json")
        .body(r#"{"inc":{"n":1}}"#)
}

/// The `i`th update transaction of `k` members over the pool.
fn k_transaction(client: &reqwest::Client, base: &str, k: usize, i: usize) -> reqwest::RequestBuilder {
    let start = (i * k) % (POOL - k);
    let actions: Vec<Value> = (0..k).map(|j| update("peer_k", start + j, 1)).collect();
    client.post(format!("{base}/v1/transactions")).json(&json!({"actions": actions}))
}

fn update(coll: &str, id: usize, by: i64) -> Value {
    json!({"op": "update", "collection": coll, "id": format!("d{id}"), "inc": {"balance": by}})
}

/// The `i`th conditional update straight to the store (no HTTP, no
/// gateway): one of the pool's documents.
async fn store_update(store: &dyn txgate_store::Store, i: usize, durability: Durability) {
    let id = format!("d{}", i % POOL);
    let update = Update::set(doc! {"touched": i as i64});
    store.write("peer_k", Write::Update { id: &id, filter: doc! {}, update }, durability).await.expect("write");
}

/// Requests whose cost is measured, one after another.
const COSTED: usize = 2000;

/// What `n` sequential requests cost this process, all of them answered
/// 200 (a first 100 before, not counted, warm the paths).
async fn costed(n: usize, mut request: impl FnMut(usize) -> reqwest::RequestBuilder) -> super::cost::Spent {
    for i in 0..100 {
        let res = request(i).send().await.expect("the gateway answers");
        res.bytes().await.expect("body");
    }
    let meter = super::cost::Meter::start();
    for i in 0..n {
        let res = request(100 + i).send().await.expect("the gateway answers");
        assert_eq!(res.status(), 200);
        res.bytes().await.expect("body");
    }
    meter.stop()
}

/// Sequential requests for `seconds`: sorted latencies.
async fn sequential(seconds: f64, mut request: impl FnMut(usize) -> reqwest::RequestBuilder) -> Vec<Duration> {
    let mut lat = Vec::new();
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut i = 0;
    while Instant::now() < until {
        let t = Instant::now();
        let res = request(i).send().await.expect("the gateway answers");
        assert_eq!(res.status(), 200, "{}", res.text().await.unwrap_or_default());
        res.bytes().await.expect("body");
        lat.push(t.elapsed());
        i += 1;
    }
    lat.sort();
    lat
}

pub async fn run(store: StoreConfig, seconds: f64) {
    let served = serve(store).await;
    let base = served.gateway.base.clone();
    let client = reqwest::Client::new();
    println!("peer workloads: txgate over HTTP (keep-alive), embedded store, {seconds} s each");

    // Single-document update.
    for i in 0..100 {
        create(&client, &base, "peer_single", format!("s{i}"), json!({"n": 0})).await;
    }
    let writer = WriterAt::now(&served.embedded);
    let lat = sequential(seconds, |i| single_update(&client, &base, i)).await;
    report("single_update_p50_ms", ms(percentile(&lat, 0.5)), lat.len());
    writer.report(&served.embedded, "single update", lat.len());

    // k = 2 and k = 10 update transactions over a pool of documents.
    for i in 0..POOL {
        create(&client, &base, "peer_k", format!("d{i}"), json!({"balance": 0})).await;
    }
    for k in [2usize, 10] {
        let writer = WriterAt::now(&served.embedded);
        let lat = sequential(seconds, |i| k_transaction(&client, &base, k, i)).await;
        report(&format!("k{k}_txn_p50_ms"), ms(percentile(&lat, 0.5)), lat.len());
        writer.report(&served.embedded, &format!("k={k} transaction"), lat.len());
        let syncs = served.embedded.stats().syncs.load(Ordering::Relaxed) - writer.syncs;
        println!("peer txgate k{k}_syncs_per_txn {:.2}", syncs as f64 / lat.len() as f64);
    }

    // Where the time goes: an HTTP read of a document (no write), a
    // request that reaches no store (`/healthz`: the HTTP stack alone), and one
    // conditional update straight to the store, synced and unsynced.
    let lat =
        sequential(seconds / 2.0, |i| client.get(format!("{base}/v1/collections/peer_k/documents/d{}", i % POOL)))
            .await;
    report("http_read_p50_ms", ms(percentile(&lat, 0.5)), lat.len());
    let lat = sequential(seconds / 2.0, |_| client.get(format!("{base}/healthz"))).await;
    report("http_healthz_p50_ms", ms(percentile(&lat, 0.5)), lat.len());
    for durability in [Durability::Synced, Durability::Unsynced] {
        let store: &dyn txgate_store::Store = served.counting.as_ref();
        let mut lat = Vec::new();
        let until = Instant::now() + Duration::from_secs_f64(seconds / 2.0);
        let mut i = 0;
        while Instant::now() < until {
            let t = Instant::now();
            store_update(store, i, durability).await;
            lat.push(t.elapsed());
            i += 1;
        }
        lat.sort();
        let name =
            if durability == Durability::Synced { "store_synced_write_p50_ms" } else { "store_unsynced_write_p50_ms" };
        report(name, ms(percentile(&lat, 0.5)), lat.len());
    }

    // What one request costs this process (client and gateway) in
    // processor time, the /healthz floor (the HTTP stack and the
    // client alone) first; the gateway's own part is the difference.
    let floor = costed(COSTED, |_| client.get(format!("{base}/healthz"))).await;
    let floor_us = floor.per(COSTED);
    println!("peer txgate healthz_cpu_us {floor_us:.1} ({COSTED} requests)");
    let read = costed(COSTED, |i| client.get(format!("{base}/v1/collections/peer_k/documents/d{}", i % POOL))).await;
    let single = costed(COSTED, |i| single_update(&client, &base, i)).await;
    let k2 = costed(COSTED, |i| k_transaction(&client, &base, 2, i)).await;
    // The store's share of a single update: the same conditional update
    // straight to the store, synced (no HTTP, no gateway).
    let store: &dyn txgate_store::Store = served.counting.as_ref();
    let meter = super::cost::Meter::start();
    for i in 0..COSTED {
        store_update(store, i, Durability::Synced).await;
    }
    let store_write = meter.stop();
    println!("peer txgate store_synced_write_cpu_us {:.1} ({COSTED} writes)", store_write.per(COSTED));
    for (name, spent) in [("read", read), ("single_update", single), ("k2_txn", k2)] {
        let us = spent.per(COSTED);
        println!(
            "peer txgate {name}_cpu_us {us:.1} ({COSTED} requests; the gateway's own part beyond the floor: {:.1} us)",
            us - floor_us
        );
    }
    // Built with `alloc-count`: allocations per request, beside the floor's.
    for (name, spent) in [("healthz", floor), ("read", read), ("single_update", single), ("k2_txn", k2)] {
        if let Some(n) = spent.allocs_per(COSTED) {
            println!("peer txgate {name}_allocs {n:.1} (per request, client included)");
        }
    }
    // And the store's own write (a document's record, no event), for the
    // share of a single update's allocations that is the store's.
    if let Some(n) = store_write.allocs_per(COSTED) {
        println!("peer txgate store_synced_write_allocs {n:.1} (per write, no HTTP)");
    }

    // The contended bank.
    for i in 0..BANK_ACCOUNTS {
        create(&client, &base, "peer_bank", format!("d{i}"), json!({"balance": 1000})).await;
    }
    let committed = Arc::new(AtomicU64::new(0));
    let conflicts = Arc::new(AtomicU64::new(0));
    let writer = WriterAt::now(&served.embedded);
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(seconds);
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..BANK_CLIENTS {
        let (client, base) = (reqwest::Client::new(), base.clone());
        let (committed, conflicts) = (Arc::clone(&committed), Arc::clone(&conflicts));
        clients.spawn(async move {
            while Instant::now() < until {
                let (a, b) = {
                    let mut rng = rand::rng();
                    let a = rng.random_range(0..BANK_ACCOUNTS);
                    (a, (a + rng.random_range(1..BANK_ACCOUNTS)) % BANK_ACCOUNTS)
                };
                let body = json!({"actions": [update("peer_bank", a, -1), update("peer_bank", b, 1)]});
                let res = client.post(format!("{base}/v1/transactions")).json(&body).send().await.expect("answers");
                match res.status().as_u16() {
                    200 => committed.fetch_add(1, Ordering::Relaxed),
                    409 => conflicts.fetch_add(1, Ordering::Relaxed),
                    other => panic!("bank transfer answered {other}"),
                };
                res.bytes().await.expect("body");
            }
        });
    }
    while clients.join_next().await.is_some() {}
    let elapsed = start.elapsed().as_secs_f64();
    let per_sec = committed.load(Ordering::Relaxed) as f64 / elapsed;
    writer.report(&served.embedded, "bank transfer", committed.load(Ordering::Relaxed) as usize);
    println!(
        "peer txgate bank_commits_per_sec {per_sec:.0} ({} committed, {} answered 409 and retried)",
        committed.load(Ordering::Relaxed),
        conflicts.load(Ordering::Relaxed)
    );
    served.gateway.stop().await;
}

fn report(name: &str, value: f64, samples: usize) {
    println!("peer txgate {name} {value:.3} ({samples} samples)");
}
