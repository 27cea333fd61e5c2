//! A real `kill -9` of a gateway process on the embedded store, at random
//! moments under concurrent transactions and single-document writes, then a
//! restart on the same data. The embedded store syncs only what a client is
//! told (docs/design.md §1), so this is where a wrong mark would show: every
//! answered write and commit must be there, nothing answered as failed
//! applied, money conserved, and no lock left once recovery is done.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{Value, json};
use txgate_store::Store;

const ACCOUNTS: usize = 12;
const START: i64 = 100;
const COUNTERS: usize = 4;
const TRANSFER_CLIENTS: usize = 6;

/// A gateway process.
struct Gateway {
    child: Child,
    base: String,
}

impl Gateway {
    fn start(dir: &Path) -> Self {
        let env = [("TXGATE_LEASE_MS", "300"), ("TXGATE_RECOVERY_INTERVAL_MS", "100")];
        let (child, base) = crate::restart::start_with(dir, &env);
        Self { child, base }
    }

    /// SIGKILL: nothing is flushed, nothing is finished.
    fn kill(mut self) {
        self.child.kill().expect("kill -9");
        self.child.wait().expect("reaped");
    }

    /// SIGTERM, and wait for the graceful exit.
    fn stop(mut self) {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status().expect("kill -TERM");
        let status = self.child.wait().expect("reaped");
        assert!(status.success(), "graceful shutdown exits 0, got {status}");
    }
}

/// What clients were told.
#[derive(Default)]
struct Told {
    /// Transfer id -> (from, to, amount, answered committed?).
    transfers: HashMap<String, (usize, usize, i64, Option<bool>)>,
    /// Counter -> the highest version answered.
    counters: HashMap<usize, i64>,
}

async fn transfer_client(http: reqwest::Client, base: String, told: Arc<Mutex<Told>>, until: Instant) {
    while Instant::now() < until {
        let (from, to, amount, id) = {
            let mut rng = rand::rng();
            let from = rng.random_range(0..ACCOUNTS);
            let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
            (from, to, rng.random_range(1..=10), uuid::Uuid::now_v7().to_string())
        };
        told.lock().unwrap().transfers.insert(id.clone(), (from, to, amount, None));
        let body = json!({"actions": [
            {"op": "update", "collection": "bank", "id": format!("a{from}"), "inc": {"balance": -amount}},
            {"op": "update", "collection": "bank", "id": format!("a{to}"), "inc": {"balance": amount}},
            {"op": "insert", "collection": "transfers", "id": id, "data": {"from": from, "to": to, "amount": amount}},
        ]});
        let Ok(res) = http.post(format!("{base}/v1/transactions")).json(&body).send().await else { return };
        let committed = match res.status().as_u16() {
            200 => Some(true),
            409 | 422 => Some(false),
            _ => None,
        };
        // Only a whole answer counts as told.
        if res.bytes().await.is_ok() {
            told.lock().unwrap().transfers.get_mut(&id).expect("recorded").3 = committed;
        }
    }
}

async fn counter_client(http: reqwest::Client, base: String, told: Arc<Mutex<Told>>, counter: usize, until: Instant) {
    let url = format!("{base}/v1/collections/counters/documents/c{counter}");
    while Instant::now() < until {
        let Ok(res) =
            http.patch(&url).header("content-type", "application/json").body(r#"{"inc":{"n":1}}"#).send().await
        else {
            return;
        };
        if res.status() != 200 {
            continue;
        }
        let Ok(body) = res.json::<Value>().await else { return };
        let version = body["version"].as_i64().expect("a version");
        let mut told = told.lock().unwrap();
        let top = told.counters.entry(counter).or_default();
        *top = (*top).max(version);
    }
}

async fn get(http: &reqwest::Client, url: &str) -> Value {
    let res = http.get(url).send().await.expect("GET answers");
    res.json().await.expect("JSON")
}

/// Wait until no transaction is pending or committed-but-unfinished.
async fn quiesce(http: &reqwest::Client, base: &str) {
    let started = Instant::now();
    loop {
        let pending = get(http, &format!("{base}/v1/transactions?status=pending&limit=1")).await;
        let committed = get(http, &format!("{base}/v1/transactions?status=committed&limit=1")).await;
        if pending["items"].as_array().unwrap().is_empty() && committed["items"].as_array().unwrap().is_empty() {
            return;
        }
        assert!(started.elapsed() < Duration::from_secs(20), "recovery did not finish: {pending} {committed}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every id in collection `coll` (its live documents).
pub(crate) async fn ids(http: &reqwest::Client, base: &str, coll: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = format!("{base}/v1/collections/{coll}/documents?limit=1000");
        if let Some(a) = &after {
            url.push_str(&format!("&after={a}"));
        }
        let page = get(http, &url).await;
        for item in page["items"].as_array().unwrap() {
            out.insert(item["id"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return out,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_load_keeps_every_answer() {
    let dir = tempfile::tempdir().unwrap();
    let http = reqwest::Client::new();
    let told = Arc::new(Mutex::new(Told::default()));

    let gw = Gateway::start(dir.path());
    for i in 0..ACCOUNTS {
        let res = http
            .post(format!("{}/v1/collections/bank/documents", gw.base))
            .json(&json!({"_id": format!("a{i}"), "balance": START}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
    }
    for c in 0..COUNTERS {
        let res = http
            .post(format!("{}/v1/collections/counters/documents", gw.base))
            .json(&json!({"_id": format!("c{c}"), "n": 0}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 201);
        told.lock().unwrap().counters.insert(c, 1);
    }
    let mut gw = Some(gw);

    for round in 0..3 {
        let g = gw.take().unwrap_or_else(|| Gateway::start(dir.path()));
        let until = Instant::now() + Duration::from_secs(30);
        let mut load = tokio::task::JoinSet::new();
        for _ in 0..TRANSFER_CLIENTS {
            load.spawn(transfer_client(http.clone(), g.base.clone(), Arc::clone(&told), until));
        }
        for c in 0..COUNTERS {
            load.spawn(counter_client(http.clone(), g.base.clone(), Arc::clone(&told), c, until));
        }
        let run_for = Duration::from_millis(rand::rng().random_range(300..1500));
        tokio::time::sleep(run_for).await;
        g.kill();
        // The clients see their connections drop and stop.
        while load.join_next().await.is_some() {}
        let answered = told.lock().unwrap().transfers.values().filter(|t| t.3.is_some()).count();
        assert!(answered > 0, "round {round}: the load ran before the kill");
    }

    // Restart, let recovery finish, and compare with what was told.
    let g = Gateway::start(dir.path());
    quiesce(&http, &g.base).await;
    let present = ids(&http, &g.base, "transfers").await;
    let told = std::mem::take(&mut *told.lock().unwrap());
    let mut balances = [START; ACCOUNTS];
    for (id, (from, to, amount, answer)) in &told.transfers {
        let applied = present.contains(id);
        match answer {
            Some(true) => assert!(applied, "transfer {id} was answered committed but is not there"),
            Some(false) => assert!(!applied, "transfer {id} was answered as failed but is applied"),
            None => {}
        }
        if applied {
            balances[*from] -= amount;
            balances[*to] += amount;
        }
    }
    let mut total = 0;
    for (i, expected) in balances.iter().enumerate() {
        let doc = get(&http, &format!("{}/v1/collections/bank/documents/a{i}", g.base)).await;
        let balance = doc["data"]["balance"].as_i64().expect("a balance");
        assert_eq!(balance, *expected, "account a{i}: the committed transfers say {expected}");
        total += balance;
    }
    assert_eq!(total, START * ACCOUNTS as i64, "money is conserved");
    for (c, acked) in &told.counters {
        let doc = get(&http, &format!("{}/v1/collections/counters/documents/c{c}", g.base)).await;
        let version = doc["version"].as_i64().unwrap();
        assert!(version >= *acked, "counter c{c} was answered at version {acked}, is at {version}");
        assert_eq!(doc["data"]["n"].as_i64().unwrap(), version - 1, "counter c{c}: one increment per version");
    }
    g.stop();

    // No lock survives recovery (lock holders are transaction ids: every
    // string).
    let store = txgate_store::embedded::EmbeddedStore::open(dir.path()).unwrap();
    for coll in ["bank", "counters", "transfers"] {
        let scan = txgate_store::scans::DOCS_LOCKED
            .scan(vec![])
            .from(txgate_store::Bound::Included(txgate_store::Bson::String(String::new())))
            .limit(10);
        let locked = store.scan(coll, scan).await.unwrap();
        assert!(locked.is_empty(), "{coll}: locks left after recovery: {locked:?}");
    }
}
