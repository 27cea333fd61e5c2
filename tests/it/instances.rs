//! Several gateway instances on one MongoDB-wire server: three real
//! `txgate` processes on one database, checked for the guarantees one
//! process has (docs/operating.md, "Several instances on one MongoDB").
//! These hold only on a server that applies a filtered single-document
//! write atomically (MongoDB 6+, FerretDB 2.7 with DocumentDB); on
//! FerretDB 1.x, where such a write is a read and then a separate write,
//! the bank below loses or makes money.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::process::Child;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rand::Rng;
use serde_json::{Value, json};

use crate::support::{SseStream, TestReceiver, mongodb_uri};

/// One gateway process.
struct Node {
    child: Child,
    base: String,
    _dir: tempfile::TempDir,
}

/// Three (or `n`) gateway processes on one fresh database.
struct Cluster {
    uri: String,
    database: String,
    env: Vec<(String, String)>,
    nodes: Vec<Option<Node>>,
    /// The base URL of each running node, for clients (`None` while down).
    bases: Arc<RwLock<Vec<Option<String>>>>,
}

impl Cluster {
    /// `n` processes on a fresh database, each with `env` on top of the
    /// MongoDB settings.
    fn start(n: usize, env: &[(&str, &str)]) -> Option<Self> {
        let uri = mongodb_uri()?;
        let database = format!("multi_{}", uuid::Uuid::now_v7().simple());
        let env = env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        let mut cluster = Self {
            uri,
            database,
            env,
            nodes: (0..n).map(|_| None).collect(),
            bases: Arc::new(RwLock::new(vec![None; n])),
        };
        // One after another: the first applies the migrations, the others
        // find them applied (as a rolling deploy starts them).
        for i in 0..n {
            cluster.up(i);
        }
        Some(cluster)
    }

    fn up(&mut self, i: usize) {
        assert!(self.nodes[i].is_none(), "node {i} is running");
        let dir = tempfile::tempdir().unwrap();
        let mut env: Vec<(&str, &str)> =
            vec![("TXGATE_MONGODB_URI", &self.uri), ("TXGATE_MONGODB_DATABASE", &self.database)];
        env.extend(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let (child, base) = crate::restart::start_with(dir.path(), &env);
        self.bases.write().unwrap()[i] = Some(base.clone());
        self.nodes[i] = Some(Node { child, base, _dir: dir });
    }

    /// `kill -9`: nothing is flushed, nothing is finished.
    fn kill(&mut self, i: usize) {
        self.bases.write().unwrap()[i] = None;
        if let Some(mut node) = self.nodes[i].take() {
            node.child.kill().expect("kill -9");
            node.child.wait().expect("reaped");
        }
    }

    fn base(&self, i: usize) -> &str {
        &self.nodes[i].as_ref().expect("node running").base
    }

    async fn stop(mut self) {
        for i in 0..self.nodes.len() {
            self.kill(i);
        }
        if let Ok(store) = txgate_store::mongo::MongoStore::connect(&self.uri, &self.database).await {
            let _ = store.drop_database().await;
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in self.nodes.iter_mut().filter_map(Option::take) {
            let mut child = node.child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A running node's base URL, chosen at random (waits while all are down).
async fn any_base(bases: &RwLock<Vec<Option<String>>>) -> String {
    loop {
        let up: Vec<String> = bases.read().unwrap().iter().flatten().cloned().collect();
        if !up.is_empty() {
            return up[rand::rng().random_range(0..up.len())].clone();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn json_of(res: reqwest::Response, status: u16) -> Value {
    let got = res.status().as_u16();
    let body = res.text().await.unwrap_or_default();
    assert_eq!(got, status, "{body}");
    serde_json::from_str(&body).unwrap_or(Value::Null)
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(20)).pool_max_idle_per_host(4).build().unwrap()
}

const ACCOUNTS: usize = 20;
const START: i64 = 1000;
const BANK_CLIENTS: usize = 16;

/// One transfer as the client sent it and the commit it was answered.
#[derive(Clone, Debug)]
struct Transfer {
    from: usize,
    to: usize,
    amount: i64,
    txn: String,
    hook: String,
    /// Transactions answered 503 `outcome_unknown` before the commit.
    unknown: Vec<String>,
}

/// Sends `body` with `key` to running nodes until it is answered
/// committed (a dead node, a retryable 409, a 503 or a 429 is tried again,
/// on any node), and returns the answer and the transactions answers
/// named without an outcome (503 `outcome_unknown`): a retry runs the
/// request anew only when such a one did not commit, which the test
/// checks at the end.
async fn transfer_until_committed(
    http: &reqwest::Client,
    bases: &RwLock<Vec<Option<String>>>,
    key: &str,
    body: &Value,
    give_up: Instant,
) -> (Value, Vec<String>) {
    let mut unknown = Vec::new();
    loop {
        assert!(Instant::now() < give_up, "transfer {key} was never answered committed");
        let base = any_base(bases).await;
        let res =
            match http.post(format!("{base}/v1/transactions")).header("idempotency-key", key).json(body).send().await {
                Ok(res) => res,
                Err(_) => {
                    // The node died under the request: the outcome is unknown
                    // until the key is asked again.
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    continue;
                }
            };
        let status = res.status().as_u16();
        let text = match res.text().await {
            Ok(text) => text,
            Err(_) => continue,
        };
        let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        match status {
            200 => {
                assert_eq!(answer["status"], "committed", "{key}: {answer}");
                return (answer, unknown);
            }
            409 | 503 | 429 if answer["retryable"] != false => {
                if status == 503
                    && let Some(txn) = answer["transaction"].as_str()
                {
                    unknown.push(txn.to_owned());
                }
                let pause = rand::rng().random_range(5..40);
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            _ => panic!("transfer {key}: {status} {text}"),
        }
    }
}

/// A contended bank through three instances, each killed with `kill -9`
/// and restarted at random during the run: money is conserved, each
/// account's version is 1 + the transfers that touched it, nothing is left
/// pending once the survivors have recovered, every Idempotency-Key is
/// answered as one transaction, and every committed transfer's hook is
/// delivered (no hook of work that did not commit ever is).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bank_through_three_instances_killed_at_random_stays_exact() {
    let rx = TestReceiver::start().await;
    let run = Duration::from_secs(seconds("TXGATE_TEST_MULTI_BANK_SECS", 30));
    let env = [
        ("TXGATE_LEASE_MS", "500"),
        ("TXGATE_RECOVERY_INTERVAL_MS", "100"),
        ("TXGATE_HOOK_ALLOW", "127.0.0.1:*"),
        ("TXGATE_TTL_INTERVAL_MS", "200"),
    ];
    let Some(mut cluster) = Cluster::start(3, &env) else { return };
    let http = http();
    let accounts = |i: usize| format!("acc-{i:02}");
    for i in 0..ACCOUNTS {
        let res = http
            .post(format!("{}/v1/collections/accounts/documents", cluster.base(i % 3)))
            .json(&json!({"_id": accounts(i), "balance": START}))
            .send()
            .await
            .unwrap();
        json_of(res, 201).await;
    }

    let done: Arc<Mutex<BTreeMap<String, Transfer>>> = Arc::default();
    let started = Instant::now();
    let give_up = started + run + Duration::from_secs(90);
    let hook_url = rx.url("/bank");
    let clients: Vec<_> = (0..BANK_CLIENTS)
        .map(|c| {
            let (http, bases, done, hook_url) =
                (http.clone(), Arc::clone(&cluster.bases), Arc::clone(&done), hook_url.clone());
            tokio::spawn(async move {
                let mut n = 0;
                while started.elapsed() < run {
                    let (from, to, amount) = {
                        let mut rng = rand::rng();
                        let from = rng.random_range(0..ACCOUNTS);
                        let to = (from + rng.random_range(1..ACCOUNTS)) % ACCOUNTS;
                        (from, to, rng.random_range(1..=50_i64))
                    };
                    let key = format!("c{c:02}-{n:05}");
                    n += 1;
                    let body = json!({
                        "actions": [
                            {"op": "update", "collection": "accounts", "id": accounts(from), "inc": {"balance": -amount}},
                            {"op": "update", "collection": "accounts", "id": accounts(to), "inc": {"balance": amount}},
                        ],
                        "hooks": [{"url": hook_url, "body": {"key": key}}],
                    });
                    let (answer, unknown) = transfer_until_committed(&http, &bases, &key, &body, give_up).await;
                    let txn = answer["id"].as_str().unwrap().to_owned();
                    let hook = answer["hooks"][0]["id"].as_str().expect("the hook's id").to_owned();
                    done.lock().unwrap().insert(key, Transfer { from, to, amount, txn, hook, unknown });
                }
            })
        })
        .collect();

    // The killer: one node at a time, every 3 to 6 s, back after 0.2 to 1 s.
    let mut kills = 0;
    while started.elapsed() + Duration::from_secs(4) < run {
        let wait = rand::rng().random_range(3000..6000);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        let i = rand::rng().random_range(0..3);
        cluster.kill(i);
        kills += 1;
        let down = rand::rng().random_range(200..1000);
        tokio::time::sleep(Duration::from_millis(down)).await;
        cluster.up(i);
    }
    for client in clients {
        client.await.expect("a bank client failed");
    }
    let done = done.lock().unwrap().clone();
    assert!(kills >= 2 || run < Duration::from_secs(20), "the run killed {kills} nodes");
    assert!(done.len() > 50, "only {} transfers committed in {run:?}", done.len());

    // Recovery by the survivors: nothing stays pending.
    let base = cluster.base(0).to_owned();
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let page = json_of(http.get(format!("{base}/v1/transactions?status=pending")).send().await.unwrap(), 200).await;
        if page["items"].as_array().unwrap().is_empty() {
            break;
        }
        assert!(Instant::now() < until, "transactions still pending 30 s after the run: {page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A transaction answered without an outcome either is the key's one
    // commit or never committed.
    for (key, t) in &done {
        for txn in t.unknown.iter().filter(|txn| **txn != t.txn) {
            let record = json_of(http.get(format!("{base}/v1/transactions/{txn}")).send().await.unwrap(), 200).await;
            let status = record["status"].as_str().unwrap_or_default();
            assert!(!matches!(status, "committed" | "done"), "{key} committed twice: {txn} ({status}) and {}", t.txn);
        }
    }

    // Balances and versions are exactly what the committed transfers made.
    let mut balance = [START; ACCOUNTS];
    let mut version = [1_i64; ACCOUNTS];
    for t in done.values() {
        balance[t.from] -= t.amount;
        balance[t.to] += t.amount;
        version[t.from] += 1;
        version[t.to] += 1;
    }
    let mut total = 0;
    let mut wrong = Vec::new();
    for i in 0..ACCOUNTS {
        let url = format!("{}/v1/collections/accounts/documents/{}", cluster.base(i % 3), accounts(i));
        let doc = json_of(http.get(url).send().await.unwrap(), 200).await;
        let (b, v) = (doc["data"]["balance"].as_i64().unwrap(), doc["version"].as_i64().unwrap());
        total += b;
        if (b, v) != (balance[i], version[i]) {
            wrong.push(format!("{}: balance {b} version {v}, expected {} and {}", accounts(i), balance[i], version[i]));
        }
    }
    assert_eq!(total, START * ACCOUNTS as i64, "money was not conserved; wrong accounts: {wrong:?}");
    assert!(wrong.is_empty(), "{} transfers, {kills} kills; wrong accounts: {wrong:?}", done.len());

    // Every key, asked again on any node, replays its one transaction.
    let sample: Vec<(&String, &Transfer)> = done.iter().collect();
    for chunk in sample.chunks(64) {
        let asks = chunk.iter().map(|(key, t)| {
            let (http, bases, hook_url) = (http.clone(), Arc::clone(&cluster.bases), hook_url.clone());
            async move {
                let base = any_base(&bases).await;
                let body = json!({
                    "actions": [
                        {"op": "update", "collection": "accounts", "id": accounts(t.from), "inc": {"balance": -t.amount}},
                        {"op": "update", "collection": "accounts", "id": accounts(t.to), "inc": {"balance": t.amount}},
                    ],
                    "hooks": [{"url": hook_url, "body": {"key": key}}],
                });
                let res = http
                    .post(format!("{base}/v1/transactions"))
                    .header("idempotency-key", key.as_str())
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                let replayed = res.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap().to_owned());
                let answer = json_of(res, 200).await;
                assert_eq!(replayed.as_deref(), Some("true"), "{key}");
                assert_eq!(answer["id"].as_str(), Some(t.txn.as_str()), "{key} replayed another transaction");
            }
        });
        futures::future::join_all(asks).await;
    }

    // Hooks: every committed transfer's at least once; none of work that
    // did not commit.
    let committed: HashSet<&str> = done.values().map(|t| t.hook.as_str()).collect();
    let mut delivered: HashMap<String, usize> = HashMap::new();
    let until = Instant::now() + Duration::from_secs(60);
    while delivered.len() < committed.len() && Instant::now() < until {
        for got in rx.collect_for(Duration::from_millis(500)).await {
            let id = got.header("webhook-id").to_owned();
            assert!(committed.contains(id.as_str()), "a hook of work that did not commit was sent: {id}");
            *delivered.entry(id).or_default() += 1;
        }
    }
    let missing: Vec<&&str> = committed.iter().filter(|id| !delivered.contains_key(**id)).take(10).collect();
    assert!(
        missing.is_empty(),
        "{} of {} committed hooks never delivered, e.g. {missing:?}",
        committed.len() - delivered.len(),
        committed.len()
    );
    eprintln!(
        "bank: {} transfers committed through 3 instances in {run:?}, {kills} kill -9s, {} hooks delivered ({} more than once)",
        done.len(),
        delivered.len(),
        delivered.values().filter(|n| **n > 1).count()
    );
    cluster.stop().await;
}

fn seconds(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Without crashes, each hook and each subscription event is delivered
/// exactly once across three instances that all send.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hooks_and_subscriptions_are_delivered_exactly_once_across_instances() {
    let rx = TestReceiver::start().await;
    let env = [("TXGATE_HOOK_ALLOW", "127.0.0.1:*")];
    let Some(cluster) = Cluster::start(3, &env) else { return };
    let http = http();
    let sub = json_of(
        http.post(format!("{}/v1/subscriptions", cluster.base(1)))
            .json(&json!({"url": rx.url("/sub"), "collections": ["orders"], "types": ["document.created", "document.updated"]}))
            .send()
            .await
            .unwrap(),
        201,
    )
    .await;
    let sub_id = sub["id"].as_str().unwrap().to_owned();

    const N: usize = 90;
    let sends = (0..N).map(|i| {
        let http = http.clone();
        let base = cluster.base(i % 3).to_owned();
        let other = cluster.base((i + 1) % 3).to_owned();
        let url = rx.url("/hook");
        async move {
            let body = json!({
                "actions": [{"op": "insert", "collection": "orders", "id": format!("o-{i:03}"), "data": {"i": i}}],
                "hooks": [{"url": url}],
            });
            let out =
                json_of(http.post(format!("{base}/v1/transactions")).json(&body).send().await.unwrap(), 200).await;
            // Then an update through another instance: a second event of
            // the same document, which the subscription sends after the first.
            let res = http
                .patch(format!("{other}/v1/collections/orders/documents/o-{i:03}"))
                .json(&json!({"set": {"paid": true}}))
                .send()
                .await
                .unwrap();
            json_of(res, 200).await;
            out["hooks"][0]["id"].as_str().unwrap().to_owned()
        }
    });
    let hooks: HashSet<String> = futures::future::join_all(sends).await.into_iter().collect();
    assert_eq!(hooks.len(), N);

    let mut got_hooks: HashMap<String, usize> = HashMap::new();
    let mut got_events: HashMap<String, usize> = HashMap::new();
    let mut order: HashMap<String, Vec<i64>> = HashMap::new();
    let until = Instant::now() + Duration::from_secs(60);
    while (got_hooks.len() < N || got_events.len() < 2 * N) && Instant::now() < until {
        for r in rx.collect_for(Duration::from_millis(300)).await {
            let id = r.header("webhook-id").to_owned();
            if r.path == "/hook" {
                assert!(hooks.contains(&id), "unknown hook {id}");
                *got_hooks.entry(id).or_default() += 1;
            } else {
                assert_eq!(r.header("txgate-subscription"), sub_id);
                let event = r.json();
                order
                    .entry(event["document"].as_str().unwrap().to_owned())
                    .or_default()
                    .push(event["version"].as_i64().unwrap());
                *got_events.entry(id).or_default() += 1;
            }
        }
    }
    // Anything sent twice would arrive within a few more passes.
    for r in rx.collect_for(Duration::from_secs(3)).await {
        let id = r.header("webhook-id").to_owned();
        *(if r.path == "/hook" { got_hooks.entry(id) } else { got_events.entry(id) }).or_default() += 1;
    }
    assert_eq!(got_hooks.len(), N, "hooks delivered");
    assert_eq!(got_events.len(), 2 * N, "subscription events delivered");
    let twice: Vec<_> = got_hooks.iter().chain(got_events.iter()).filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once across instances: {twice:?}");
    for (doc, versions) in order {
        assert_eq!(versions, vec![1, 2], "{doc}'s events out of version order");
    }
    cluster.stop().await;
}

/// TTL by count with three sweepers: never more expired than the policy
/// allows (the newest `max_count` stay), each document expired once, and
/// the count reached within the documented lag.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ttl_by_count_with_three_sweepers_expires_exactly_the_oldest() {
    let env = [("TXGATE_TTL_INTERVAL_MS", "100")];
    let Some(cluster) = Cluster::start(3, &env) else { return };
    let http = http();
    const KEEP: usize = 40;
    let res = http
        .put(format!("{}/v1/collections/sessions", cluster.base(0)))
        .json(&json!({"ttl": {"max_count": KEEP}}))
        .send()
        .await
        .unwrap();
    json_of(res, 200).await;

    let mut created = Vec::new();
    let mut kept = 0;
    for round in 0..3 {
        // 80 creates a round, spread over the three instances.
        let creates = (0..80).map(|k| {
            let http = http.clone();
            let base = cluster.base(k % 3).to_owned();
            async move {
                let id = format!("s-{round}-{k:03}");
                let res = http
                    .post(format!("{base}/v1/collections/sessions/documents"))
                    .json(&json!({"_id": id}))
                    .send()
                    .await
                    .unwrap();
                let doc = json_of(res, 201).await;
                (doc["created_at"].as_str().unwrap().to_owned(), id)
            }
        });
        created.extend(futures::future::join_all(creates).await);
        // Within the lag, the live documents are exactly those created no
        // earlier than the KEEP-th newest (documents created in its
        // millisecond stay with it): never fewer than KEEP.
        let mut by_age = created.clone();
        by_age.sort();
        let boundary = by_age[by_age.len() - KEEP].0.clone();
        let want: HashSet<String> = by_age.iter().filter(|(at, _)| *at >= boundary).map(|(_, id)| id.clone()).collect();
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let live = crate::kill::ids(&http, cluster.base(round % 3), "sessions").await;
            assert!(live.len() >= KEEP, "round {round}: {} live, fewer than the policy's {KEEP}", live.len());
            assert!(want.is_subset(&live), "round {round}: one of the newest {KEEP} expired");
            if live == want {
                break;
            }
            assert!(
                Instant::now() < until,
                "round {round}: {} live 5 s after the creates, want {}",
                live.len(),
                want.len()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            let c =
                json_of(http.get(format!("{}/v1/collections/sessions", cluster.base(2))).send().await.unwrap(), 200)
                    .await;
            if c["count"].as_u64() == Some(want.len() as u64) {
                break;
            }
            assert!(Instant::now() < until, "round {round}: the count is {}, {} live", c["count"], want.len());
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        kept = want.len();
    }
    // One document.expired event per expired document.
    let expired = all_events(&http, cluster.base(1), "collections=sessions&types=document.expired").await;
    let ids: Vec<&str> = expired.iter().map(|e| e["document"].as_str().unwrap()).collect();
    let distinct: HashSet<&&str> = ids.iter().collect();
    assert_eq!(distinct.len(), ids.len(), "a document expired twice");
    assert_eq!(ids.len(), 240 - kept, "expired documents");
    cluster.stop().await;
}

async fn all_events(http: &reqwest::Client, base: &str, filter: &str) -> Vec<Value> {
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let url = format!("{base}/v1/events?after={after}&limit=500&{filter}");
        let page = json_of(http.get(url).header("accept", "application/json").send().await.unwrap(), 200).await;
        let items = page["items"].as_array().unwrap();
        if items.is_empty() {
            return out;
        }
        out.extend(items.iter().cloned());
        after = page["next"].as_u64().unwrap();
    }
}

/// A unique index built online by one instance while the other two write,
/// moving values between documents and taking new ones: once it is ready,
/// no value is held twice, each document holds what its writer was last
/// told, and the index finds each value's holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_unique_index_built_online_while_two_instances_write_ends_exact() {
    let Some(cluster) = Cluster::start(3, &[]) else { return };
    let http = http();
    const DOCS: usize = 60;
    const POOL: usize = 30;
    for i in 0..DOCS {
        let res = http
            .post(format!("{}/v1/collections/users/documents", cluster.base(i % 3)))
            .json(&json!({"_id": format!("u-{i:02}"), "email": format!("init-{i}")}))
            .send()
            .await
            .unwrap();
        json_of(res, 201).await;
    }
    let declared_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Writer w owns the documents i with i % 2 == w, and writes through
    // instance w + 1.
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let (http, base) = (http.clone(), cluster.base(w + 1).to_owned());
            let (declared_at, stop) = (Arc::clone(&declared_at), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut last: HashMap<usize, String> =
                    (0..DOCS).filter(|i| i % 2 == w).map(|i| (i, format!("init-{i}"))).collect();
                let (mut moved, mut refused, mut n) = (0, 0, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    // A contested value only once every instance applies
                    // the index (its cache is at most a second old).
                    let contested =
                        declared_at.lock().unwrap().is_some_and(|at| at.elapsed() > Duration::from_millis(1500));
                    let (i, value) = {
                        let mut rng = rand::rng();
                        let i = 2 * rng.random_range(0..DOCS / 2) + w;
                        let value = if contested && rng.random_bool(0.7) {
                            format!("pool-{}", rng.random_range(0..POOL))
                        } else {
                            format!("w{w}-{n}")
                        };
                        (i, value)
                    };
                    let res = http
                        .patch(format!("{base}/v1/collections/users/documents/u-{i:02}"))
                        .json(&json!({"set": {"email": value}}))
                        .send()
                        .await
                        .unwrap();
                    match res.status().as_u16() {
                        200 => {
                            last.insert(i, value);
                            moved += 1;
                        }
                        409 => {
                            let body: Value = res.json().await.unwrap();
                            assert!(contested, "refused before any value was contested: {body}");
                            assert_eq!(body["code"], "duplicate", "{body}");
                            refused += 1;
                        }
                        s => panic!("writer {w}: {s} {}", res.text().await.unwrap()),
                    }
                }
                (last, moved, refused)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let res = http
        .put(format!("{}/v1/collections/users/indexes/email", cluster.base(0)))
        .json(&json!({"fields": ["email"], "unique": true}))
        .send()
        .await
        .unwrap();
    assert!(res.status().is_success(), "{}", res.text().await.unwrap());
    *declared_at.lock().unwrap() = Some(Instant::now());
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let index = json_of(
            http.get(format!("{}/v1/collections/users/indexes/email", cluster.base(0))).send().await.unwrap(),
            200,
        )
        .await;
        match index["state"].as_str() {
            Some("ready") => break,
            Some("failed") => panic!("the build failed: {index}"),
            _ => {}
        }
        assert!(Instant::now() < until, "the index is not ready within 60 s: {index}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Writes go on a while against the ready index.
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut told: HashMap<usize, String> = HashMap::new();
    let (mut moved, mut refused) = (0, 0);
    for w in writers {
        let (last, m, r) = w.await.expect("a writer failed");
        told.extend(last);
        moved += m;
        refused += r;
    }
    assert!(refused > 0, "no write was refused a taken value ({moved} moved)");

    let mut holders: HashMap<String, Vec<usize>> = HashMap::new();
    for i in 0..DOCS {
        let doc = json_of(
            http.get(format!("{}/v1/collections/users/documents/u-{i:02}", cluster.base(i % 3))).send().await.unwrap(),
            200,
        )
        .await;
        let email = doc["data"]["email"].as_str().unwrap().to_owned();
        assert_eq!(email, told[&i], "u-{i:02} does not hold what its writer was last told");
        holders.entry(email).or_default().push(i);
    }
    let shared: Vec<_> = holders.iter().filter(|(_, h)| h.len() > 1).collect();
    assert!(shared.is_empty(), "values held twice under a unique index: {shared:?}");
    for (value, holder) in &holders {
        for n in 0..3 {
            let url = format!(
                "{}/v1/collections/users/documents?filter={}",
                cluster.base(n),
                urlencode(&json!({"email": value}).to_string())
            );
            let page = json_of(http.get(url).send().await.unwrap(), 200).await;
            let found: Vec<&str> =
                page["items"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap()).collect();
            assert_eq!(found, vec![format!("u-{:02}", holder[0])], "the index's answer for {value} on instance {n}");
        }
        let res = http
            .post(format!("{}/v1/collections/users/documents", cluster.base(2)))
            .json(&json!({"email": value}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 409, "a create took {value}, which u-{:02} holds", holder[0]);
    }
    eprintln!("unique build: {moved} writes moved values, {refused} refused");
    cluster.stop().await;
}

fn urlencode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// A stream from each instance sees every event once, in position order,
/// with each document's versions in order, while all three write.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_on_each_instance_sees_every_event_once_in_order() {
    let Some(cluster) = Cluster::start(3, &[]) else { return };
    let http = http();
    let mut streams = Vec::new();
    for n in 0..3 {
        let url = format!("{}/v1/events?collections=notes&types=document.created,document.updated", cluster.base(n));
        streams.push(SseStream::open_url(&url, None).await);
    }
    const DOCS: usize = 12;
    const VERSIONS: usize = 8;
    // Each document is written through every instance in turn; documents
    // are written side by side.
    let writes = (0..DOCS).map(|d| {
        let http = http.clone();
        let bases: Vec<String> = (0..3).map(|n| cluster.base(n).to_owned()).collect();
        async move {
            let id = format!("n-{d:02}");
            let res = http
                .post(format!("{}/v1/collections/notes/documents", bases[d % 3]))
                .json(&json!({"_id": id, "v": 1}))
                .send()
                .await
                .unwrap();
            json_of(res, 201).await;
            for v in 2..=VERSIONS {
                let base = &bases[(d + v) % 3];
                let res = if v % 3 == 0 {
                    let body = json!({"actions": [{"op": "update", "collection": "notes", "id": id, "set": {"v": v}}]});
                    http.post(format!("{base}/v1/transactions")).json(&body).send().await.unwrap()
                } else {
                    http.patch(format!("{base}/v1/collections/notes/documents/{id}"))
                        .json(&json!({"set": {"v": v}}))
                        .send()
                        .await
                        .unwrap()
                };
                json_of(res, 200).await;
            }
        }
    });
    futures::future::join_all(writes).await;
    let want = DOCS * VERSIONS;
    let mut seen_by = Vec::new();
    for (n, stream) in streams.iter_mut().enumerate() {
        let events = stream.take(want, Duration::from_secs(30)).await;
        assert_eq!(events.len(), want, "instance {n}'s stream");
        let extra = stream.next(Duration::from_secs(1)).await;
        assert!(extra.is_none(), "instance {n}'s stream sent more: {extra:?}");
        let seqs: Vec<u64> = events.iter().map(|e| e.data["seq"].as_u64().unwrap()).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "instance {n}: not in position order: {seqs:?}");
        let mut versions: HashMap<String, Vec<i64>> = HashMap::new();
        for e in &events {
            versions
                .entry(e.data["document"].as_str().unwrap().to_owned())
                .or_default()
                .push(e.data["version"].as_i64().unwrap());
        }
        for (doc, v) in versions {
            assert_eq!(v, (1..=VERSIONS as i64).collect::<Vec<_>>(), "instance {n}: {doc}'s versions");
        }
        seen_by.push(seqs);
    }
    assert_eq!(seen_by[0], seen_by[1]);
    assert_eq!(seen_by[1], seen_by[2]);
    cluster.stop().await;
}

/// Three instances racing their first appends to a fresh database's event
/// log: the log's position counter is created once (an insert that
/// tolerates a duplicate, no upsert), no position is handed out twice, and
/// no event is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_instances_racing_their_first_appends_lose_no_event() {
    let Some(cluster) = Cluster::start(3, &[]) else { return };
    let http = http();
    let barrier = Arc::new(tokio::sync::Barrier::new(30));
    let creates = (0..30).map(|k| {
        let (http, barrier) = (http.clone(), Arc::clone(&barrier));
        let base = cluster.base(k % 3).to_owned();
        async move {
            barrier.wait().await;
            let res = http
                .post(format!("{base}/v1/collections/race-{}/documents", k % 5))
                .json(&json!({"_id": format!("r-{k:02}")}))
                .send()
                .await
                .unwrap();
            json_of(res, 201).await;
        }
    });
    futures::future::join_all(creates).await;
    let until = Instant::now() + Duration::from_secs(10);
    let events = loop {
        let events = all_events(&http, cluster.base(0), "types=document.created").await;
        if events.len() >= 30 || Instant::now() > until {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let docs: HashSet<&str> = events.iter().map(|e| e["document"].as_str().unwrap()).collect();
    assert_eq!((events.len(), docs.len()), (30, 30), "created events: {events:?}");
    let seqs: HashSet<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs.len(), 30, "a position was handed out twice");
    let store = txgate_store::mongo::MongoStore::connect(&cluster.uri, &cluster.database).await.unwrap();
    use txgate_store::Store;
    let counter = store.get("_counters", "_events").await.unwrap().expect("the counter");
    let n = counter.get_i64("n").unwrap();
    assert!(n >= *seqs.iter().max().unwrap() as i64, "the counter ({n}) is behind the log");
    cluster.stop().await;
}
