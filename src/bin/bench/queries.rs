//! `bench queries`: queries over a declared index at a realistic size, on
//! a gateway serving in this process over HTTP with keep-alive (the
//! client: reqwest), beside PostgreSQL in `scripts/bench --peer postgres
//! --queries` (`queries-postgres`, the same data and queries from this
//! binary through tokio-postgres):
//!
//! - the online build of an index on (`status`, `-amount`) over DOCS
//!   documents while 1,000 writes per second go on: the writes' p50/p99
//!   before and during the build, and how long it took;
//! - a page of 50 of one status below a random amount, newest amount
//!   first: p50/p99, and the records the store decoded per page (at most
//!   52: the page, the one after it, and nothing else); beside it, the
//!   floor under any such answer: one page's bytes from a bare server,
//!   decoded the same way;
//! - the count of one status (a tenth of the documents): p50/p99; the same
//!   documents counted through a range on the next field (`amount >= 0`),
//!   and about half of them (`amount >= 500000`): p50;
//! - a unique index built over up to 200,000 other documents, each
//!   holding its own value: how long from its declaration to ready;
//! - a per-document rule's cost on the page and on a single write, beside
//!   the same requests with an API key (`rules.rs`).
//!
//! Each figure is also printed as a `queries txgate <name> <value>` line
//! for the script to put beside PostgreSQL's.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rand::Rng;
use serde_json::{Value, json};
use txgate::config::{Config, StoreConfig};
use txgate::testing::document::StoredDoc;
use txgate_store::{Bson, DateTime, DynStore, Edge, IndexQuery, Interval, doc};

use super::{ms, percentile, progress};

/// The statuses, one document in ten each.
pub const STATUSES: [&str; 10] = ["open", "paid", "shipped", "void", "held", "new", "late", "lost", "done", "kept"];
pub(super) const COLL: &str = "orders";

/// Document `i` of the data both sides load: its id, status, amount and
/// customer.
pub fn row(i: usize) -> (String, &'static str, i64, String) {
    (format!("d{i:07}"), STATUSES[i % 10], ((i as i64) * 7919) % 1_000_003, format!("c{}", i % 1000))
}

/// A row of a page as both sides' clients decode it (txgate's from its
/// JSON, PostgreSQL's from its rows): every row of every page is decoded
/// into one of these before the page counts as read.
#[derive(Debug, serde::Deserialize)]
pub struct Order {
    pub id: String,
    pub status: String,
    pub amount: i64,
    pub customer: String,
}

/// A page of `POST /query` as a typed client reads it (what a generated
/// SDK does): the envelope's id and the data's fields.
#[derive(serde::Deserialize)]
pub(super) struct Page {
    items: Vec<PageItem>,
}

#[derive(serde::Deserialize)]
struct PageItem {
    id: String,
    data: OrderData,
}

#[derive(serde::Deserialize)]
struct OrderData {
    status: String,
    amount: i64,
    customer: String,
}

impl Page {
    pub(super) fn orders(self) -> Vec<Order> {
        self.items
            .into_iter()
            .map(|i| Order { id: i.id, status: i.data.status, amount: i.data.amount, customer: i.data.customer })
            .collect()
    }
}

/// A tenth of `samples` counts (at least 20) over HTTP, of the filter
/// `filter` gives for each status in turn: their latencies and the last
/// count.
async fn counts(
    client: &reqwest::Client,
    base: &str,
    samples: usize,
    filter: impl Fn(&str) -> Value,
) -> (Vec<Duration>, u64) {
    let mut lat = Vec::new();
    let mut counted = 0;
    for i in 0..(samples / 10).max(20) {
        let t = Instant::now();
        let body: Value = client
            .get(format!("{base}/v1/collections/{COLL}/count"))
            .query(&[("filter", filter(STATUSES[i % 10]).to_string())])
            .send()
            .await
            .expect("count")
            .json()
            .await
            .expect("count");
        lat.push(t.elapsed());
        counted = body["count"].as_u64().expect("a count");
    }
    (lat, counted)
}

/// Declared index `name` of `coll`, as `GET …/indexes/{name}` answers.
pub(super) async fn index_of(client: &reqwest::Client, base: &str, coll: &str, name: &str) -> Value {
    let resp = client.get(format!("{base}/v1/collections/{coll}/indexes/{name}")).send().await.expect("get index");
    resp.json().await.expect("index")
}

/// Sorted latencies, as `p50/p99` in ms.
pub(super) fn p50_p99(lat: &mut [Duration]) -> (f64, f64) {
    lat.sort();
    (ms(percentile(lat, 0.5)), ms(percentile(lat, 0.99)))
}

pub(super) async fn load(store: &DynStore, docs: usize) {
    let now = DateTime::now();
    let started = Instant::now();
    let unsynced = store.unsynced();
    futures::stream::iter(0..docs)
        .map(|i| {
            let (id, status, amount, customer) = row(i);
            let d = StoredDoc::new_live(id, doc! {"status": status, "amount": amount, "customer": customer}, 1, 1, now);
            let unsynced = &unsynced;
            async move {
                unsynced.insert(COLL, d.to_record()).await.expect("insert");
                if (i + 1) % 200_000 == 0 {
                    progress(&format!(
                        "{} documents loaded ({:.0}/s)",
                        i + 1,
                        (i + 1) as f64 / started.elapsed().as_secs_f64()
                    ));
                }
            }
        })
        .buffer_unordered(1024)
        .collect::<Vec<()>>()
        .await;
    store.sync().await.expect("sync");
}

/// Writes at `rate` per second for `seconds` (or until `until` says
/// stop), each a PATCH of a random document's amount: their latencies.
async fn writes(
    client: &reqwest::Client,
    base: &str,
    docs: usize,
    rate: f64,
    seconds: f64,
    until: impl Fn() -> bool,
) -> Vec<Duration> {
    let lat = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = tokio::task::JoinSet::new();
    let every = Duration::from_secs_f64(1.0 / rate);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let gate = Arc::new(tokio::sync::Semaphore::new(256));
    while Instant::now() < end && !until() {
        tick.tick().await;
        let (i, amount) = {
            let mut rng = rand::rng();
            (rng.random_range(0..docs), rng.random_range(0..1_000_003_i64))
        };
        let url = format!("{base}/v1/collections/{COLL}/documents/{}", row(i).0);
        let (client, lat, permit) = (client.clone(), Arc::clone(&lat), Arc::clone(&gate).acquire_owned().await);
        tasks.spawn(async move {
            let t = Instant::now();
            let resp = client.patch(url).json(&json!({"set": {"amount": amount}})).send().await.expect("patch");
            assert!(resp.status().is_success(), "a write answered {}", resp.status());
            lat.lock().unwrap().push(t.elapsed());
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    Arc::try_unwrap(lat).unwrap().into_inner().unwrap()
}

/// The floor under a page: one real page's bytes, answered to every
/// `POST /q` by a bare axum server in this process (no store, no
/// middleware, nothing computed), so that a page timed against it costs
/// only what any HTTP/JSON answer of that size costs this client: the
/// request written and parsed, the round trip on loopback, the bytes read
/// and decoded into typed rows.
struct Floor {
    url: String,
    bytes: usize,
    shutdown: tokio_util::sync::CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

impl Floor {
    /// Serve a page of 50 of the first status below the largest amount.
    async fn start(client: &reqwest::Client, base: &str) -> Self {
        let body =
            json!({"filter": {"status": STATUSES[0], "amount": {"$lt": 1_000_003}}, "sort": ["-amount"], "limit": 50});
        let resp = client.post(format!("{base}/v1/collections/{COLL}/query")).json(&body).send().await.expect("query");
        assert_eq!(resp.status(), 200);
        let page = resp.bytes().await.expect("page");
        let bytes = page.len();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/q", listener.local_addr().expect("addr"));
        let app = axum::Router::new().route(
            "/q",
            axum::routing::post(move || {
                let page = page.clone();
                async move { ([(axum::http::header::CONTENT_TYPE, "application/json")], page) }
            }),
        );
        let shutdown = tokio_util::sync::CancellationToken::new();
        let server = {
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await.expect("serve");
            })
        };
        Self { url, bytes, shutdown, server }
    }

    /// One request with `body` (which the server does not read), its
    /// answer decoded as a page is: how long it took.
    async fn page(&self, client: &reqwest::Client, body: &Value) -> Duration {
        let t = Instant::now();
        let resp = client.post(&self.url).json(body).send().await.expect("floor");
        let page = resp.json::<Page>().await.expect("floor page").orders();
        let took = t.elapsed();
        assert_eq!(page.len(), 50);
        took
    }

    async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.server.await;
    }
}

/// Its figures; then the store and its data, for `rules.rs`.
pub async fn run(store: StoreConfig, docs: usize, samples: usize, rate: f64) -> (StoreConfig, DynStore) {
    let embedded = super::open_embedded(&store)
        .expect("bench queries runs on the embedded store (its decoded records are counted)");
    let raw: DynStore = Arc::clone(&embedded) as DynStore;
    let gateway =
        super::scale::Gateway::start_with(Config { store: store.clone(), ..Config::default() }, Arc::clone(&raw)).await;
    let client = reqwest::Client::new();
    let base = gateway.base.clone();
    println!("queries: {docs} documents, embedded store, over HTTP (reqwest, keep-alive)");
    // One write through the gateway first: the collection's own indexes.
    let resp =
        client.post(format!("{base}/v1/collections/{COLL}/documents")).json(&json!({"_id": "first"})).send().await;
    assert!(resp.expect("create").status().is_success());
    let t = Instant::now();
    load(&raw, docs).await;
    println!("load: {docs} documents in {:.1} s", t.elapsed().as_secs_f64());

    // Writes alone, then the same writes while the index builds.
    let mut before = writes(&client, &base, docs, rate, 10.0, || false).await;
    let (b50, b99) = p50_p99(&mut before);
    let put = client
        .put(format!("{base}/v1/collections/{COLL}/indexes/status_amount"))
        .json(&json!({"fields": ["status", "-amount"]}))
        .send()
        .await
        .expect("put index");
    assert_eq!(put.status(), 201);
    let started = Instant::now();
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (client, base, ready) = (client.clone(), base.clone(), Arc::clone(&ready));
        tokio::spawn(async move {
            loop {
                let index = index_of(&client, &base, COLL, "status_amount").await;
                if index["state"] != "building" {
                    assert_eq!(index["state"], "ready", "{index}");
                    ready.store(true, std::sync::atomic::Ordering::SeqCst);
                    return started.elapsed();
                }
                if let Some(p) = index["progress"].as_object() {
                    progress(&format!("build: {} {} of {}", p["phase"], p["done"], p["total"]));
                }
                tokio::time::sleep(Duration::from_millis(1000)).await;
            }
        })
    };
    let mut during =
        writes(&client, &base, docs, rate, 3600.0, || ready.load(std::sync::atomic::Ordering::SeqCst)).await;
    let built = watcher.await.expect("watcher");
    let (d50, d99) = p50_p99(&mut during);
    let over = |lat: &[Duration]| lat.iter().filter(|d| **d > Duration::from_millis(50)).count();
    println!("online build over {docs} documents: {:.1} s, with {rate:.0} writes/s going on", built.as_secs_f64());
    println!(
        "  writes before: p50 {b50:.2} ms, p99 {b99:.2} ms, max {:.1} ms ({} writes, {} over 50 ms)",
        ms(*before.last().unwrap_or(&Duration::ZERO)),
        before.len(),
        over(&before)
    );
    println!(
        "  writes during: p50 {d50:.2} ms, p99 {d99:.2} ms, max {:.1} ms ({} writes, {} over 50 ms)",
        ms(*during.last().unwrap_or(&Duration::ZERO)),
        during.len(),
        over(&during)
    );
    println!("queries txgate build_seconds {:.1}", built.as_secs_f64());
    println!("queries txgate writes_before_p99_ms {b99:.2}");
    println!("queries txgate writes_during_p99_ms {d99:.2}");

    // Pages of 50, each decoded into typed rows as PostgreSQL's client
    // decodes its rows (the figure beside PostgreSQL's), taking turns with
    // two references: the same pages decoded into a JSON tree
    // (`serde_json::Value`) instead, and the floor (one page's bytes
    // answered by a bare server, decoded the same way).
    let floor = Floor::start(&client, &base).await;
    let (mut lat, mut lat_tree, mut lat_floor) =
        (Vec::with_capacity(samples), Vec::with_capacity(samples), Vec::with_capacity(samples));
    let mut most = 0;
    let mut items = 0;
    // Reads of the database file the pages caused (redb's page cache
    // missed), beside the records they read.
    let (mut file_reads, mut records) = (0u64, 0u64);
    // What a page and the floor's page cost this process (client included).
    let (mut cost, mut cost_floor) = (super::cost::Spent::default(), super::cost::Spent::default());
    // In turns of 50 requests of each kind, so that the machine's drift
    // over the run meets every kind alike.
    let turn = |i: usize| (i / 50) % 3;
    for i in 0..3 * samples.div_ceil(50) * 50 {
        let (status, below) = {
            let mut rng = rand::rng();
            (STATUSES[rng.random_range(0..10)], rng.random_range(10_000..1_000_003_i64))
        };
        let body = json!({"filter": {"status": status, "amount": {"$lt": below}}, "sort": ["-amount"], "limit": 50});
        if turn(i) == 1 {
            let meter = super::cost::Meter::start();
            lat_floor.push(floor.page(&client, &body).await);
            cost_floor.add(meter.stop());
            continue;
        }
        let decoded = embedded.queried();
        let reads = embedded.file_reads();
        let meter = super::cost::Meter::start();
        let t = Instant::now();
        let resp = client.post(format!("{base}/v1/collections/{COLL}/query")).json(&body).send().await.expect("query");
        if turn(i) == 0 {
            let page = resp.json::<Page>().await.expect("page").orders();
            lat.push(t.elapsed());
            assert!(
                page.iter()
                    .all(|o| o.status == status && o.amount < below && !o.id.is_empty() && !o.customer.is_empty())
            );
            items += page.len();
            cost.add(meter.stop());
        } else {
            let _ = meter.stop();
            let page: Value = resp.json().await.expect("page");
            lat_tree.push(t.elapsed());
            assert!(page["items"].as_array().expect("items").len() <= 50);
        }
        most = most.max(embedded.queried() - decoded);
        records += embedded.queried() - decoded;
        file_reads += embedded.file_reads() - reads;
    }
    let floor_bytes = floor.bytes;
    floor.stop().await;
    let (q50, q99) = p50_p99(&mut lat);
    let (t50, t99) = p50_p99(&mut lat_tree);
    let (f50, f99) = p50_p99(&mut lat_floor);
    println!(
        "page of 50 (status = s, amount < x, by -amount), rows decoded typed: p50 {q50:.3} ms, p99 {q99:.3} ms; at most {most} records decoded per page (target <= 52); {:.1} items per page",
        items as f64 / lat.len() as f64
    );
    println!("  the same pages decoded into a JSON tree (serde_json::Value): p50 {t50:.3} ms, p99 {t99:.3} ms");
    println!(
        "  the floor, one such page's {} bytes from a bare server (axum, no store, no middleware), decoded typed: p50 {f50:.3} ms, p99 {f99:.3} ms",
        floor_bytes
    );
    let (c_us, f_us) = (cost.per(lat.len()), cost_floor.per(lat_floor.len()));
    println!(
        "  what a page costs this process (client included): {c_us:.1} us of processor time; the floor's page {f_us:.1} us; txgate's own part {:.1} us",
        c_us - f_us
    );
    // Each read of the file is at least one page the cache did not hold,
    // counted as a record read that missed (an index or branch page
    // missed too counts against the records).
    let hit = (100.0 * (1.0 - file_reads as f64 / records.max(1) as f64)).max(0.0);
    println!(
        "  redb's page cache ({} MiB): {file_reads} reads of the file for {records} records the pages read: at least {hit:.1}% of record reads hit it (target >= 95% at 100,000 documents)",
        match &store {
            StoreConfig::Embedded { cache_mb, .. } => *cache_mb,
            StoreConfig::Mongodb { .. } => 0,
        }
    );
    println!("queries txgate page_cache_hit_pct {hit:.1}");
    // Built with `alloc-count`: allocations per page and per row, beside
    // the floor's page.
    if let (Some(page), Some(floor)) = (cost.allocs_per(lat.len()), cost_floor.allocs_per(lat_floor.len())) {
        let rows = items as f64 / lat.len().max(1) as f64;
        println!(
            "  allocations per page (client included): {page:.0}; the floor's page {floor:.0}; txgate's own part {:.0}, {:.1} per row",
            page - floor,
            (page - floor) / rows.max(1.0)
        );
        println!("queries txgate page_allocs {page:.1}");
        println!("queries txgate page_floor_allocs {floor:.1}");
    }
    println!("queries txgate page_cpu_us {c_us:.1}");
    println!("queries txgate page_floor_cpu_us {f_us:.1}");
    println!("queries txgate page_p50_ms {q50:.3}");
    println!("queries txgate page_p99_ms {q99:.3}");
    println!("queries txgate page_tree_p50_ms {t50:.3}");
    println!("queries txgate page_floor_p50_ms {f50:.3}");
    println!("queries txgate page_floor_p99_ms {f99:.3}");
    println!("queries txgate page_decoded_max {most}");

    // For reference: the store's share of a page, in this process (the
    // read along the index and 51 records, no HTTP), as pages read them
    // and decoded into documents.
    let spec = raw
        .indexes(COLL)
        .await
        .expect("indexes")
        .into_iter()
        .find(|s| s.name.starts_with("u.status_amount."))
        .expect("the store index");
    let (mut lat, mut lat_raw) = (Vec::with_capacity(samples), Vec::with_capacity(samples));
    for i in 0..samples {
        let (status, below) = {
            let mut rng = rand::rng();
            (STATUSES[rng.random_range(0..10)], rng.random_range(10_000..1_000_003_i64))
        };
        let query = IndexQuery {
            index: spec.name.clone(),
            keys: IndexQuery::keys_of(&spec),
            eq: vec![Bson::Boolean(false), Bson::String(status.into())],
            slot: Some(vec![Interval {
                lower: Edge::Bracket(Bson::Int64(0)),
                upper: Edge::Value { value: Bson::Int64(below), inclusive: false },
            }]),
            reverse: false,
            after: None,
            limit: 51,
            budget: usize::MAX,
        };
        // Both ways, each first half of the time (the first warms the
        // store's cache for the second).
        for way in [i % 2, 1 - i % 2] {
            let t = Instant::now();
            if way == 0 {
                let records = raw.query(COLL, &query).await.expect("query");
                lat.push(t.elapsed());
                assert_eq!(records.records.len(), 51);
            } else {
                // As pages read them: as stored, checked, not built.
                let records = raw.query_raw(COLL, &query).await.expect("query");
                lat_raw.push(t.elapsed());
                assert_eq!(records.records.len(), 51);
            }
        }
    }
    let (s50, s99) = p50_p99(&mut lat);
    let (r50, r99) = p50_p99(&mut lat_raw);
    println!(
        "the store's share, in process (51 records along the index, as stored, as pages read them): p50 {r50:.3} ms, p99 {r99:.3} ms"
    );
    println!("  the same 51 records decoded into documents: p50 {s50:.3} ms, p99 {s99:.3} ms");
    println!("queries txgate store_page_p50_ms {r50:.3}");
    println!("queries txgate store_decoded_p50_ms {s50:.3}");

    // For reference: one document read by id over the same HTTP client.
    let mut lat = Vec::with_capacity(samples);
    for _ in 0..samples {
        let i = rand::rng().random_range(0..docs);
        let t = Instant::now();
        let doc: Value = client
            .get(format!("{base}/v1/collections/{COLL}/documents/{}", row(i).0))
            .send()
            .await
            .expect("get")
            .json()
            .await
            .expect("document");
        lat.push(t.elapsed());
        assert!(doc["id"].is_string());
    }
    let (g50, g99) = p50_p99(&mut lat);
    println!("for reference, one document by id: p50 {g50:.3} ms, p99 {g99:.3} ms");
    println!("queries txgate get_p50_ms {g50:.3}");

    let (mut lat, counted) = counts(&client, &base, samples, |status: &str| json!({ "status": status })).await;
    let (c50, c99) = p50_p99(&mut lat);
    println!("count of one status ({counted} documents): p50 {c50:.2} ms, p99 {c99:.2} ms");
    println!("queries txgate count_p50_ms {c50:.3}");
    println!("queries txgate count_p99_ms {c99:.3}");

    // The same documents counted through a range on the index's next
    // field (every amount is at least 0), then about half of them (the
    // range's entries and the rest of the status's are walked together,
    // four to one, until one side ends).
    for (name, from) in [("count_range", 0_i64), ("count_half", 500_000)] {
        let filter = |status: &str| json!({ "status": status, "amount": {"$gte": from} });
        let (mut lat, counted) = counts(&client, &base, samples, filter).await;
        let (r50, r99) = p50_p99(&mut lat);
        println!(
            "count of one status through a range (amount >= {from}, {counted} documents): p50 {r50:.2} ms, p99 {r99:.2} ms"
        );
        println!("queries txgate {name}_p50_ms {r50:.3}");
    }

    // A unique index built over documents that already hold their values
    // (another collection, up to 200,000 of them): every value is claimed
    // before the index's entries are added.
    let people = docs.min(200_000);
    let resp =
        client.post(format!("{base}/v1/collections/people/documents")).json(&json!({"_id": "first"})).send().await;
    assert!(resp.expect("create").status().is_success());
    let now = DateTime::now();
    futures::stream::iter(0..people)
        .map(|i| {
            let d = StoredDoc::new_live(format!("p{i:07}"), doc! {"email": format!("user{i}@example.com")}, 1, 1, now);
            let raw = &raw;
            async move { raw.unsynced().insert("people", d.to_record()).await.expect("insert") }
        })
        .buffer_unordered(1024)
        .collect::<Vec<bool>>()
        .await;
    raw.sync().await.expect("sync");
    let put = client
        .put(format!("{base}/v1/collections/people/indexes/email"))
        .json(&json!({"fields": ["email"], "unique": true}))
        .send()
        .await
        .expect("put index");
    assert_eq!(put.status(), 201);
    let started = Instant::now();
    loop {
        let index = index_of(&client, &base, "people", "email").await;
        if index["state"] != "building" {
            assert_eq!(index["state"], "ready", "{index}");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total = started.elapsed().as_secs_f64();
    println!(
        "unique index build over {people} documents: {total:.1} s from its declaration, its 3 s wait for other instances to learn of it included ({:.0} documents/s)",
        people as f64 / total
    );
    println!("queries txgate unique_build_seconds {total:.1}");
    gateway.stop().await;
    (store, raw)
}
