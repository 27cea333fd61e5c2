//! `bench --mongodb-uri URI pages`: a page of 50 and a count along a
//! declared index on MongoDB, beside the same page read by one raw `find`
//! on the same index and the same count by one raw `count`, sent by the
//! official driver from this process, in one run. Target (issue of the
//! faithful test server): a page costs at most the raw `find` plus two
//! round trips (a page reads the log position, the page, and checks after
//! the read: depth at most 3). The round trip R is a `ping`'s p50.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use mongodb::bson::{RawDocumentBuf, doc};
use rand::Rng;
use serde_json::json;
use txgate::config::{Config, StoreConfig};
use txgate_store::DynStore;

use super::progress;
use super::queries::{COLL, Page, STATUSES, index_of, load, p50_p99};

pub async fn run(uri: &str, docs: usize, samples: usize) {
    let database = format!("bench_pages_{}", uuid::Uuid::now_v7().simple());
    let store = StoreConfig::Mongodb { uri: uri.to_owned(), database: database.clone() };
    let raw: DynStore = txgate::open_store(&store).await.expect("store opens");
    let gateway = super::scale::Gateway::start_with(Config { store, ..Config::default() }, Arc::clone(&raw)).await;
    let client = reqwest::Client::new();
    let base = gateway.base.clone();
    println!("pages: {docs} documents, mongodb backend at {uri}, over HTTP (reqwest, keep-alive)");
    let resp =
        client.post(format!("{base}/v1/collections/{COLL}/documents")).json(&json!({"_id": "first"})).send().await;
    assert!(resp.expect("create").status().is_success());
    let t = Instant::now();
    load(&raw, docs).await;
    println!("load: {docs} documents in {:.1} s", t.elapsed().as_secs_f64());
    let put = client
        .put(format!("{base}/v1/collections/{COLL}/indexes/status_amount"))
        .json(&json!({"fields": ["status", "-amount"]}))
        .send()
        .await
        .expect("put index");
    assert_eq!(put.status(), 201);
    let t = Instant::now();
    loop {
        let index = index_of(&client, &base, COLL, "status_amount").await;
        if index["state"] != "building" {
            assert_eq!(index["state"], "ready", "{index}");
            break;
        }
        if let Some(p) = index["progress"].as_object() {
            progress(&format!("build: {} {} of {}", p["phase"], p["done"], p["total"]));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("build: ready {:.1} s after its declaration", t.elapsed().as_secs_f64());
    let physical = raw
        .indexes(COLL)
        .await
        .expect("indexes")
        .into_iter()
        .find(|s| s.name.starts_with("u.status_amount."))
        .expect("the store index")
        .name;

    let driver = mongodb::Client::with_uri_str(uri).await.expect("the driver connects");
    let db = driver.database(&database);
    let coll = db.collection::<RawDocumentBuf>(COLL);
    let (mut page, mut find, mut ping) = (Vec::new(), Vec::new(), Vec::new());
    let (mut count, mut raw_count) = (Vec::new(), Vec::new());
    // In turns, so that the machine's drift meets every kind alike.
    for i in 0..samples {
        let (status, below) = {
            let mut rng = rand::rng();
            (STATUSES[rng.random_range(0..10)], rng.random_range(10_000..1_000_003_i64))
        };
        let t = Instant::now();
        db.run_command(doc! {"ping": 1}).await.expect("ping");
        ping.push(t.elapsed());

        let body = json!({"filter": {"status": status, "amount": {"$lt": below}}, "sort": ["-amount"], "limit": 50});
        let t = Instant::now();
        let resp = client.post(format!("{base}/v1/collections/{COLL}/query")).json(&body).send().await.expect("query");
        let orders = resp.json::<Page>().await.expect("page").orders();
        page.push(t.elapsed());
        assert!(orders.iter().all(|o| o.status == status && o.amount < below));

        let t = Instant::now();
        let rows: Vec<RawDocumentBuf> = coll
            .find(doc! {"_meta.deleted": false, "status": status, "amount": {"$lt": below}})
            .sort(doc! {"_meta.deleted": 1, "status": 1, "amount": -1})
            .hint(mongodb::options::Hint::Name(physical.clone()))
            .limit(50)
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("rows");
        find.push(t.elapsed());
        assert_eq!(rows.len(), orders.len(), "the raw find and the page disagree");

        if i % 5 == 0 {
            let filter = json!({"status": status}).to_string();
            let t = Instant::now();
            let resp = client
                .get(format!("{base}/v1/collections/{COLL}/count"))
                .query(&[("filter", filter.as_str())])
                .send()
                .await
                .expect("count");
            assert!(resp.status().is_success());
            let n = resp.json::<serde_json::Value>().await.expect("count")["count"].as_u64().expect("a count");
            count.push(t.elapsed());
            let t = Instant::now();
            let m = coll
                .count_documents(doc! {"_meta.deleted": false, "status": status})
                .hint(mongodb::options::Hint::Name(physical.clone()))
                .await
                .expect("raw count");
            raw_count.push(t.elapsed());
            assert_eq!(n, m, "the count and the raw count disagree");
        }
    }
    let (p50, p99) = p50_p99(&mut page);
    let (f50, f99) = p50_p99(&mut find);
    let (r50, _) = p50_p99(&mut ping);
    let (c50, c99) = p50_p99(&mut count);
    let (rc50, _) = p50_p99(&mut raw_count);
    println!("page of 50 (status = s, amount < x, by -amount), decoded typed: p50 {p50:.3} ms, p99 {p99:.3} ms");
    println!("  one raw find of the same page on the same index (driver, raw BSON): p50 {f50:.3} ms, p99 {f99:.3} ms");
    println!("  R (a ping): p50 {r50:.3} ms");
    let target = f50 + 2.0 * r50;
    println!(
        "  target: page p50 <= raw find + 2 R = {target:.3} ms: {} ({:.2}x the raw find)",
        if p50 <= target { "met" } else { "not met" },
        p50 / f50
    );
    println!(
        "count of one status ({} documents): p50 {c50:.3} ms, p99 {c99:.3} ms; raw count p50 {rc50:.3} ms",
        docs / 10
    );
    gateway.stop().await;
    let _ = db.drop().await;
}
