//! `bench bank`: the contended bank through one gateway process and
//! through several on one MongoDB database, in one run. 20 accounts, 16
//! clients, each transfer a transaction of two `inc` updates sent to the
//! gateways in turn and retried on a retryable 409 until it commits. Prints
//! commits per second and a transfer's p50 and p99 (from its first send to
//! its commit, retries included) for each, and the ratios of several to
//! one. On one host the gateways and the server share the processors, so
//! several instances must not cost throughput (docs/benchmarks.md).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::json;

use super::events::Child;
use super::{ms, percentile};

const ACCOUNTS: usize = 20;
const CLIENTS: usize = 16;

pub struct BankArgs {
    pub mongodb_uri: String,
    pub instances: usize,
    pub seconds: f64,
}

struct Outcome {
    per_sec: f64,
    p50: Duration,
    p99: Duration,
    retries: usize,
}

async fn bank(uri: &str, instances: usize, seconds: f64) -> Outcome {
    let database = format!("bench_bank_{}", uuid::Uuid::now_v7().simple());
    let mut gateways = Vec::new();
    for _ in 0..instances {
        gateways.push(Child::start_on(Some((uri, database.as_str()))).await);
    }
    let bases: Arc<Vec<String>> = Arc::new(gateways.iter().map(|g| g.base.clone()).collect());
    let client = reqwest::Client::builder().pool_max_idle_per_host(CLIENTS).build().unwrap();
    for i in 0..ACCOUNTS {
        let res = client
            .post(format!("{}/v1/collections/bank/documents", bases[i % bases.len()]))
            .json(&json!({"_id": format!("a{i:02}"), "balance": 1000}))
            .send()
            .await
            .expect("an account is created");
        assert_eq!(res.status(), 201, "account {i}");
    }
    let retries = Arc::new(AtomicUsize::new(0));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (client, bases, retries) = (client.clone(), Arc::clone(&bases), Arc::clone(&retries));
            tokio::spawn(async move {
                let mut took = Vec::new();
                let mut turn = c;
                while Instant::now() < until {
                    let (a, b) = {
                        let mut rng = rand::rng();
                        let a = rng.random_range(0..ACCOUNTS);
                        (a, (a + rng.random_range(1..ACCOUNTS)) % ACCOUNTS)
                    };
                    let body = json!({"actions": [
                        {"op": "update", "collection": "bank", "id": format!("a{a:02}"), "inc": {"balance": -1}},
                        {"op": "update", "collection": "bank", "id": format!("a{b:02}"), "inc": {"balance": 1}},
                    ]});
                    let start = Instant::now();
                    loop {
                        turn += 1;
                        let base = &bases[turn % bases.len()];
                        let res = client.post(format!("{base}/v1/transactions")).json(&body).send().await;
                        match res.map(|r| r.status().as_u16()) {
                            Ok(200) => break,
                            Ok(409 | 503 | 429) => {
                                retries.fetch_add(1, Ordering::Relaxed);
                            }
                            other => panic!("bank transfer answered {other:?}"),
                        }
                    }
                    took.push(start.elapsed());
                }
                took
            })
        })
        .collect();
    let started = Instant::now();
    let mut took = Vec::new();
    for t in tasks {
        took.extend(t.await.expect("a bank client"));
    }
    let elapsed = started.elapsed().as_secs_f64();
    took.sort();
    drop(gateways);
    if let Ok(store) = txgate_store::mongo::MongoStore::connect(uri, &database).await {
        let _ = store.drop_database().await;
    }
    Outcome {
        per_sec: took.len() as f64 / elapsed,
        p50: percentile(&took, 0.50),
        p99: percentile(&took, 0.99),
        retries: retries.load(Ordering::Relaxed),
    }
}

pub async fn run(args: BankArgs) {
    let one = bank(&args.mongodb_uri, 1, args.seconds).await;
    let several = bank(&args.mongodb_uri, args.instances, args.seconds).await;
    for (n, o) in [(1, &one), (args.instances, &several)] {
        println!(
            "bank instances={n} commits_per_sec {:.0} transfer_p50_ms {:.2} transfer_p99_ms {:.2} (409s retried: {})",
            o.per_sec,
            ms(o.p50),
            ms(o.p99),
            o.retries
        );
    }
    println!(
        "bank {} instances / 1: throughput {:.2}x (target >= 0.8x), transfer p99 {:.2}x (target <= 2x)",
        args.instances,
        several.per_sec / one.per_sec,
        ms(several.p99) / ms(one.p99)
    );
}
