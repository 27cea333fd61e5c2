//! Clients and stores that misbehave must not wedge the gateway: clients
//! that hang up mid-transaction, a commit whose outcome cannot be read back,
//! an Idempotency-Key taken over from a stalled request, records recovery
//! cannot handle, store calls that never answer, and many writers on the
//! same documents at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::Rng;
use reqwest::Method;
use serde_json::{Value, json};
use txgate::config::Config;
use txgate::testing::document::{Staged, StagedOp, StoredDoc};
use txgate::testing::txn::record::{Status, TXNS, TxnRecord};
use txgate_store::{DynStore, doc};

use crate::faulty::{Act, Op, rigged_app};
use crate::support::{Backend, TestApp, expect, expect_problem, test_config, txn_record};

crate::on_both_backends!(
    clients_that_hang_up_leave_nothing_pending,
    an_unknown_outcome_keeps_the_idempotency_key,
    a_key_taken_over_from_a_stalled_request_fences_it,
    recovery_skips_records_it_cannot_handle,
    a_hung_store_call_answers_503_and_the_record_serves_again,
    hung_reads_answer_503_and_pages_counts_and_batches_serve_again,
    a_transaction_past_its_maximum_duration_aborts_itself,
    mixed_writers_apply_every_acknowledged_change_once,
);

const D: &str = "/v1/collections/f/documents";
const T: &str = "/v1/transactions";

/// Fast protocol timings, so the bounds are checked in about a second.
fn fast(config: &mut Config) {
    config.txn.lease = Duration::from_millis(600);
    config.txn.clock_skew = Duration::from_millis(100);
    config.txn.recovery_interval = Duration::from_millis(100);
    config.txn.lock_wait = Duration::from_millis(300);
}

/// lease + skew + two recovery intervals: no lock may outlive its
/// transaction by more.
fn bound(config: &Config) -> Duration {
    config.txn.lease + config.txn.clock_skew + 2 * config.txn.recovery_interval
}

async fn seed(app: &TestApp, id: &str, n: i64) {
    expect(app.post(D, &json!({"_id": id, "n": n})).await, 201).await;
}

async fn read(app: &TestApp, id: &str) -> (i64, i64) {
    let body = expect(app.get(&format!("{D}/{id}")).await, 200).await;
    (body["data"]["n"].as_i64().unwrap(), body["version"].as_i64().unwrap())
}

fn inc_txn(ids: &[&str]) -> Value {
    let actions: Vec<Value> =
        ids.iter().map(|id| json!({"op": "update", "collection": "f", "id": id, "inc": {"n": 1}})).collect();
    json!({ "actions": actions })
}

/// Every document accepts an If-Match write and nothing is pending.
async fn nothing_wedged(app: &TestApp, ids: &[String]) -> Result<(), String> {
    let res = app.get(&format!("{T}?status=pending&limit=1000")).await;
    if res.status() != 200 {
        return Err(format!("listing answered {}", res.status()));
    }
    let pending: Value = res.json().await.unwrap();
    let n = pending["items"].as_array().unwrap().len();
    if n > 0 {
        let now = txgate::testing::clock::rfc3339(txgate_store::DateTime::now());
        let first = &pending["items"][0];
        return Err(format!(
            "{n} transactions still pending at {now}, e.g. {} started {} lease until {}",
            first["id"], first["started_at"], first["expires_at"]
        ));
    }
    for id in ids {
        let res = app.get(&format!("{D}/{id}")).await;
        if res.status() != 200 {
            return Err(format!("{id}: read answered {}", res.status()));
        }
        let etag = res.headers()["etag"].to_str().unwrap().to_owned();
        let res = app
            .request(Method::PATCH, &format!("{D}/{id}"))
            .header("if-match", etag)
            .json(&json!({"set": {"probe": true}}))
            .send()
            .await
            .unwrap();
        if res.status() != 200 {
            return Err(format!("{id}: If-Match write answered {}: {}", res.status(), res.text().await.unwrap()));
        }
    }
    Ok(())
}

/// Clients that disconnect while their transaction waits for a lock or
/// commits: afterwards, within the lock bound, nothing is pending and every
/// document takes an If-Match write.
async fn clients_that_hang_up_leave_nothing_pending(backend: Backend) {
    // Every transaction ends within its hard cap, however slow the store:
    // past the cap and the lock bound, anything pending is wedged.
    let tweak = |c: &mut Config| {
        fast(c);
        c.txn.max_duration = Duration::from_secs(3);
    };
    let Some(app) = TestApp::spawn_with(backend, tweak).await else { return };
    let ids: Vec<String> = (0..6).map(|i| format!("h{i}")).collect();
    for id in &ids {
        seed(&app, id, 0).await;
    }
    // A MongoDB-wire server shared with the other tests answers each
    // command in milliseconds: fewer, slower clients keep the work they
    // leave behind within what it can finish meanwhile.
    let (clients, run_for, pause) = if backend == Backend::Embedded { (24, 1500, 0) } else { (2, 1500, 100) };
    let base = app.base.clone();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let (base, ids) = (base.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_millis(run_for);
            let mut sent = 0;
            while Instant::now() < until {
                let (a, b, hang_up) = {
                    let mut rng = rand::rng();
                    let a = rng.random_range(0..ids.len());
                    let b = (a + rng.random_range(1..ids.len())) % ids.len();
                    (a, b, rng.random_range(2..=20))
                };
                // A client that gives up after 2–20 ms and closes the connection.
                let client = reqwest::Client::builder().timeout(Duration::from_millis(hang_up)).build().unwrap();
                let _ =
                    client.post(format!("{base}{T}")).json(&inc_txn(&[ids[a].as_str(), ids[b].as_str()])).send().await;
                sent += 1;
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
            sent
        }));
    }
    let mut sent = 0;
    for t in tasks {
        sent += t.await.unwrap();
    }
    let hung_up = Instant::now();
    assert!(sent > clients, "the clients sent {sent} requests");
    // Transactions still running when their client left end within their
    // hard cap (their final writes within the store deadline); then the
    // lock bound applies.
    let cap = app.config.txn.max_duration + app.config.txn.store_timeout;
    let ended = tokio::time::timeout(cap + Duration::from_secs(1), app.settled()).await;
    assert!(ended.is_ok(), "transactions ran on {:?} after the last client left", hung_up.elapsed());
    // Past the lock bound (by the gateway's clock), a pass of recovery.
    app.advance(bound(&app.config));
    app.run_once("recovery").await;
    if let Err(why) = nothing_wedged(&app, &ids).await {
        panic!("{why}, past the lock bound after the last client left");
    }
    app.stop().await;
}

fn sets_status(op: &Op, status: &str) -> bool {
    op.set.and_then(|s| s.get_str("status").ok()) == Some(status)
}

/// The commit CAS lands but its answer is lost and the record cannot be
/// read back: 503, and a retry with the same key learns the commit from the
/// record instead of running the transaction again.
async fn an_unknown_outcome_keeps_the_idempotency_key(backend: Backend) {
    // Once the commit CAS has landed, reads of `_txns` fail until the test
    // says (`Some(false)`).
    let blind_state: Arc<Mutex<Option<bool>>> = Arc::default();
    let blind = Arc::clone(&blind_state);
    let rule = move |op: &Op| {
        let mut blind = blind.lock().unwrap();
        if op.coll == TXNS && op.kind == "update" && sets_status(op, "committed") && blind.is_none() {
            *blind = Some(true);
            return Act::FailAfter;
        }
        match *blind {
            Some(true) if op.coll == TXNS && matches!(op.kind, "get" | "get_many") => Act::FailBefore,
            _ => Act::Pass,
        }
    };
    let Some(app) = rigged_app(backend, |c| c.txn.store_timeout = Duration::from_millis(1000), rule).await else {
        return;
    };
    seed(&app, "u1", 0).await;
    let body = json!({"actions": [
        {"op": "update", "collection": "f", "id": "u1", "inc": {"n": 1}},
        {"op": "insert", "collection": "g", "data": {"k": 1}},
    ]});
    let send = || app.request(Method::POST, T).header("idempotency-key", "unknown-1").json(&body).send();
    let first = expect_problem(send().await.unwrap(), 503, "outcome_unknown").await;
    let txn = first["transaction"].as_str().unwrap().to_owned();
    // While reads still fail, a retry cannot learn the outcome either.
    let early = send().await.unwrap();
    assert_ne!(early.status(), 200, "answered before the outcome could be read");
    // Reads of the record serve again.
    *blind_state.lock().unwrap() = Some(false);
    let res = send().await.unwrap();
    assert_eq!(res.headers().get("idempotent-replayed").map(|v| v.to_str().unwrap()), Some("true"));
    let replay = expect(res, 200).await;
    assert_eq!(replay["id"], txn, "the retry answers the first attempt's commit");
    assert_eq!(read(&app, "u1").await, (1, 2), "the increment is applied once");
    let listed = expect(app.get("/v1/collections/g/documents").await, 200).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "the insert without id happened once: {listed}");
    app.stop().await;
}

/// A request whose first write stalls past the takeover age loses its key
/// to a retry; when the stalled write lands, the original must not run.
async fn a_key_taken_over_from_a_stalled_request_fences_it(backend: Backend) {
    let (mut stalled, gate) = (false, crate::faulty::Gate::new());
    let held = Arc::clone(&gate);
    let rule = move |op: &Op| {
        if op.coll == TXNS && op.kind == "insert" && !stalled {
            stalled = true;
            return Act::Hold(Arc::clone(&held));
        }
        Act::Pass
    };
    let tweak = |c: &mut Config| {
        fast(c);
        c.txn.lease = Duration::from_millis(200);
    };
    let Some(app) = rigged_app(backend, tweak, rule).await else { return };
    let app = Arc::new(app);
    seed(&app, "k1", 0).await;
    let body = inc_txn(&["k1"]);
    let send = {
        let (app, body) = (Arc::clone(&app), body.clone());
        move || {
            let (app, body) = (Arc::clone(&app), body.clone());
            async move { app.request(Method::POST, T).header("idempotency-key", "stall-1").json(&body).send().await }
        }
    };
    let original = tokio::spawn(send());
    // The original's first write stalls; past two leases with no record
    // (by the gateway's clock) the key may be taken over.
    tokio::time::timeout(Duration::from_secs(20), gate.reached()).await.expect("the original's write stalls");
    app.advance(2 * app.config.txn.lease + app.config.txn.clock_skew + Duration::from_millis(1));
    let retry = expect(send().await.unwrap(), 200).await;
    // Then the stalled write lands.
    gate.open();
    let original = original.await.unwrap().unwrap();
    let status = original.status();
    let text = original.text().await.unwrap();
    assert_eq!(status, 409, "the fenced original is refused: {text}");
    let problem: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(problem["code"], "aborted", "{problem}");
    assert_eq!(problem["reason"], "superseded", "{problem}");
    assert_eq!(read(&app, "k1").await, (1, 2), "the increment is applied once");
    let original_id = problem["transaction"].as_str().unwrap();
    let rec = expect(app.get(&format!("{T}/{original_id}")).await, 200).await;
    assert!(matches!(rec["status"].as_str(), Some("aborted" | "rolled_back")), "{rec}");
    // The key now answers the retry's outcome.
    let again = expect(send().await.unwrap(), 200).await;
    assert_eq!(again["id"], retry["id"]);
    drop(send);
    Arc::try_unwrap(app).ok().expect("no other handle").stop().await;
}

/// Lock `id` in collection `f` for `holder`, staging `n: staged`.
async fn lock_for(store: &DynStore, id: &str, holder: &str, staged: i64) {
    let mut d = StoredDoc::from_record(store.get("f", id).await.unwrap().unwrap()).unwrap();
    d.meta.txn = Some(holder.into());
    d.meta.pending = Some(Staged { op: StagedOp::Update, data: Some(doc! {"n": staged}), sv: 1 });
    let v = d.meta.v;
    assert!(store.replace("f", id, doc! {"_meta.v": v}, d.to_record()).await.unwrap());
}

/// An undecodable transaction record and a member document whose `_meta`
/// another tool removed: recovery reports them and still recovers the rest
/// within the bound.
async fn recovery_skips_records_it_cannot_handle(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast).await else { return };
    let store = Arc::clone(&app.store);
    for id in ["a", "b", "c", "d", "e"] {
        seed(&app, id, 0).await;
    }
    let id = |s: i64| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, (now + s) as u64, 0)).to_string()
    };
    // Poison: a `_txns` record recovery cannot decode, sorting first.
    let past = txgate_store::DateTime::from_millis(0);
    store.insert(TXNS, doc! {"_id": "0-poison", "status": "pending", "expires_at": past}).await.unwrap();
    // T committed over a, b, c; b's `_meta` is then removed by hand.
    let t = id(-30);
    store.insert(TXNS, txn_record(&t, Status::Committed, -10_000, "f", &["a", "b", "c"]).to_record()).await.unwrap();
    for m in ["a", "b", "c"] {
        lock_for(&store, m, &t, 7).await;
    }
    let mut broken = store.get("f", "b").await.unwrap().unwrap();
    broken.remove("_meta");
    store.replace("f", "b", doc! {}, broken).await.unwrap();
    // U pending with an expired lease over d; V committed over e.
    let u = id(-20);
    store.insert(TXNS, txn_record(&u, Status::Pending, -10_000, "f", &["d"]).to_record()).await.unwrap();
    lock_for(&store, "d", &u, 9).await;
    let v = id(-10);
    store.insert(TXNS, txn_record(&v, Status::Committed, -10_000, "f", &["e"]).to_record()).await.unwrap();
    lock_for(&store, "e", &v, 5).await;

    let status = |txn: String| {
        let store = Arc::clone(&store);
        async move { TxnRecord::from_record(store.get(TXNS, &txn).await.unwrap().unwrap()).unwrap().status }
    };
    let unlocked = |id: &'static str| {
        let store = Arc::clone(&store);
        async move {
            let d = StoredDoc::from_record(store.get("f", id).await.unwrap().unwrap()).unwrap();
            (d.meta.txn.is_none(), d.data.get_i64("n").unwrap())
        }
    };
    // Past the bound (by the gateway's clock): within two passes of recovery.
    app.advance(bound(&app.config));
    let mut passes = 0;
    loop {
        let done = status(u.clone()).await == Status::RolledBack
            && status(v.clone()).await == Status::Done
            && unlocked("a").await == (true, 7)
            && unlocked("c").await == (true, 7)
            && unlocked("d").await == (true, 0)
            && unlocked("e").await == (true, 5);
        if done {
            break;
        }
        assert!(
            passes < 2,
            "recovery stalled behind the poison records for {passes} passes: {:?}",
            (
                status(u.clone()).await,
                status(v.clone()).await,
                unlocked("a").await,
                unlocked("c").await,
                unlocked("d").await,
                unlocked("e").await
            )
        );
        app.run_once("recovery").await;
        passes += 1;
    }
    // T stays committed (its member b cannot be finished) and is reported.
    assert_eq!(status(t).await, Status::Committed);
    app.stop().await;
}

/// A store call that never answers: the request gets 503
/// `store_unavailable` with Retry-After within the store deadline, and
/// once the store answers again the same record serves without a restart.
async fn a_hung_store_call_answers_503_and_the_record_serves_again(backend: Backend) {
    let hang: Arc<Mutex<bool>> = Arc::default();
    let hanging = Arc::clone(&hang);
    let rule = move |op: &Op| {
        if *hanging.lock().unwrap() && op.coll == "f" && op.id == Some("s1") { Act::Hang } else { Act::Pass }
    };
    let timeout = Duration::from_millis(800);
    let Some(app) = rigged_app(backend, |c| c.txn.store_timeout = timeout, rule).await else { return };
    seed(&app, "s1", 0).await;
    *hang.lock().unwrap() = true;
    let started = Instant::now();
    let res = app.request(Method::PATCH, &format!("{D}/s1")).json(&json!({"inc": {"n": 1}})).send().await.unwrap();
    let elapsed = started.elapsed();
    assert!(res.headers().contains_key("retry-after"), "503 carries Retry-After");
    expect_problem(res, 503, "store_unavailable").await;
    assert!(elapsed < timeout + Duration::from_millis(700), "answered after {elapsed:?}");
    let started = Instant::now();
    let res = app.post(T, &inc_txn(&["s1"])).await;
    let elapsed = started.elapsed();
    expect_problem(res, 503, "store_unavailable").await;
    assert!(elapsed < 2 * timeout + Duration::from_millis(700), "transaction answered after {elapsed:?}");
    *hang.lock().unwrap() = false;
    // The same record serves again: a write and a transaction on it, once
    // whatever the failed transaction left is past the lock bound.
    app.advance(bound(&app.config));
    app.run_once("recovery").await;
    let res = app.request(Method::PATCH, &format!("{D}/s1")).json(&json!({"inc": {"n": 1}})).send().await.unwrap();
    assert_eq!(res.status(), 200, "the record serves again: {}", res.text().await.unwrap());
    expect(app.post(T, &inc_txn(&["s1"])).await, 200).await;
    assert_eq!(read(&app, "s1").await.0, 2);
    app.stop().await;
}

/// Every read a page, a query, a count or a batch read makes (each bounded
/// by bytes or count) is one store call under the store deadline: while
/// the collection's reads hang, each answers 503 `store_unavailable` in
/// time and writes nothing; once they answer again, the same requests
/// serve without a restart.
async fn hung_reads_answer_503_and_pages_counts_and_batches_serve_again(backend: Backend) {
    let hang: Arc<Mutex<bool>> = Arc::default();
    let hanging = Arc::clone(&hang);
    let rule = move |op: &Op| {
        let read = matches!(op.kind, "query" | "scan" | "count" | "get_many" | "get");
        if *hanging.lock().unwrap() && op.coll == "f" && read { Act::Hang } else { Act::Pass }
    };
    let timeout = Duration::from_millis(800);
    let Some(app) = rigged_app(backend, |c| c.txn.store_timeout = timeout, rule).await else { return };
    for i in 0..6 {
        seed(&app, &format!("r{i}"), i).await;
    }
    crate::queries::ready_index(&app, "f", "by_n", &["n"]).await;
    let query = json!({"filter": {"n": {"$gte": 2}}, "sort": ["-n"], "limit": 3});
    let batch = json!({"documents": [{"collection": "f", "id": "r1"}, {"collection": "f", "id": "r4"}]});
    let count = "/v1/collections/f/count?filter=%7B%22n%22%3A%7B%22%24gte%22%3A2%7D%7D";
    let requests = || {
        [
            app.request(Method::GET, &format!("{D}?limit=4")),
            app.request(Method::POST, "/v1/collections/f/query").json(&query),
            app.request(Method::GET, count),
            app.request(Method::POST, "/v1/reads").json(&batch),
        ]
    };
    let (_, head) = crate::support::all_events(&app, 0, "").await;
    *hang.lock().unwrap() = true;
    for req in requests() {
        let started = Instant::now();
        let res = req.send().await.unwrap();
        let elapsed = started.elapsed();
        let url = res.url().to_string();
        assert!(res.headers().contains_key("retry-after"), "{url}: 503 carries Retry-After");
        expect_problem(res, 503, "store_unavailable").await;
        assert!(elapsed < 2 * timeout + Duration::from_millis(700), "{url} answered after {elapsed:?}");
    }
    *hang.lock().unwrap() = false;
    let (_, after) = crate::support::all_events(&app, 0, "").await;
    assert_eq!(head, after, "a hung read wrote an event");
    let [page, found, counted, read] = requests();
    let page = expect(page.send().await.unwrap(), 200).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 4, "{page}");
    let found = expect(found.send().await.unwrap(), 200).await;
    let ns: Vec<i64> = found["items"].as_array().unwrap().iter().map(|d| d["data"]["n"].as_i64().unwrap()).collect();
    assert_eq!(ns, [5, 4, 3]);
    assert_eq!(expect(counted.send().await.unwrap(), 200).await["count"], 4);
    let read = expect(read.send().await.unwrap(), 200).await;
    assert_eq!(read["documents"][1]["document"]["data"]["n"], 4);
    app.stop().await;
}

/// A transaction slower than `TXGATE_TXN_MAX_MS` aborts itself (409
/// `aborted`, reason `timeout`) with nothing applied, even while every
/// single store call stays within its deadline.
async fn a_transaction_past_its_maximum_duration_aborts_itself(backend: Backend) {
    let mut slowed = false;
    let rule = move |op: &Op| {
        if op.coll == "f" && op.kind == "get_many" && !slowed {
            slowed = true;
            return Act::Delay(Duration::from_millis(1200));
        }
        Act::Pass
    };
    let tweak = |c: &mut Config| {
        fast(c);
        c.txn.max_duration = Duration::from_millis(400);
    };
    let Some(app) = rigged_app(backend, tweak, rule).await else { return };
    seed(&app, "m1", 0).await;
    let started = Instant::now();
    let res = app.post(T, &inc_txn(&["m1"])).await;
    let elapsed = started.elapsed();
    let problem = expect_problem(res, 409, "aborted").await;
    assert_eq!(problem["reason"], "timeout", "{problem}");
    assert!(elapsed < Duration::from_millis(1100), "answered after {elapsed:?}");
    let txn = problem["transaction"].as_str().unwrap();
    let rec = expect(app.get(&format!("{T}/{txn}")).await, 200).await;
    assert!(matches!(rec["status"].as_str(), Some("aborted" | "rolled_back")), "{rec}");
    assert_eq!(read(&app, "m1").await, (0, 1));
    expect(app.post(T, &inc_txn(&["m1"])).await, 200).await;
    assert_eq!(read(&app, "m1").await, (1, 2));
    app.stop().await;
}

#[derive(Default, Debug, Clone, Copy)]
struct Acked {
    /// Acknowledged increments of `n`.
    incs: i64,
    /// Acknowledged changes (each moves the version by one).
    changes: i64,
}

/// Transactions and single-document PATCH, PUT and DELETE (+ re-create) on
/// the same few documents at once: every acknowledged change is applied
/// exactly once, and versions count them.
async fn mixed_writers_apply_every_acknowledged_change_once(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, fast).await else { return };
    let app = Arc::new(app);
    let ids: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
    for id in &ids {
        seed(&app, id, 0).await;
    }
    let acked: Arc<Mutex<HashMap<String, Acked>>> = Arc::default();
    let (workers, run_for) = if backend == Backend::Embedded { (8, 2000) } else { (6, 3000) };
    let mut tasks = Vec::new();
    for w in 0..workers {
        let (app, ids, acked) = (Arc::clone(&app), ids.clone(), Arc::clone(&acked));
        tasks.push(tokio::spawn(async move {
            let until = Instant::now() + Duration::from_millis(run_for);
            let mut n_ops = 0;
            while Instant::now() < until {
                let (kind, a, b) = {
                    let mut rng = rand::rng();
                    let a = rng.random_range(0..ids.len());
                    (rng.random_range(0..4), a, (a + rng.random_range(1..ids.len())) % ids.len())
                };
                let ack = |id: &str, incs: i64, changes: i64| {
                    let mut m = acked.lock().unwrap();
                    let e = m.entry(id.to_owned()).or_default();
                    e.incs += incs;
                    e.changes += changes;
                };
                let path = format!("{D}/{}", ids[a]);
                match (kind + w) % 4 {
                    0 => {
                        let res = app.post(T, &inc_txn(&[ids[a].as_str(), ids[b].as_str()])).await;
                        match res.status().as_u16() {
                            200 => {
                                ack(&ids[a], 1, 1);
                                ack(&ids[b], 1, 1);
                            }
                            409 => {}
                            s => panic!("transaction answered {s}: {}", res.text().await.unwrap()),
                        }
                    }
                    1 => {
                        let res =
                            app.request(Method::PATCH, &path).json(&json!({"inc": {"n": 1}})).send().await.unwrap();
                        match res.status().as_u16() {
                            200 => ack(&ids[a], 1, 1),
                            409 | 410 => {}
                            s => panic!("PATCH answered {s}: {}", res.text().await.unwrap()),
                        }
                    }
                    2 | 3 => {
                        let res = app.get(&path).await;
                        if res.status() != 200 {
                            continue;
                        }
                        let etag = res.headers()["etag"].to_str().unwrap().to_owned();
                        let n = res.json::<Value>().await.unwrap()["data"]["n"].as_i64().unwrap();
                        if (kind + w) % 4 == 2 {
                            let res = app
                                .request(Method::PUT, &path)
                                .header("if-match", etag)
                                .json(&json!({"n": n + 1}))
                                .send()
                                .await
                                .unwrap();
                            match res.status().as_u16() {
                                200 => ack(&ids[a], 1, 1),
                                409 | 410 => {}
                                s => panic!("PUT answered {s}: {}", res.text().await.unwrap()),
                            }
                        } else {
                            let res = app.request(Method::DELETE, &path).header("if-match", etag).send().await.unwrap();
                            match res.status().as_u16() {
                                204 => {
                                    // Only the deleter re-creates; it carries n over, plus one.
                                    ack(&ids[a], 0, 1);
                                    let give_up = Instant::now() + Duration::from_secs(5);
                                    loop {
                                        let res = app.post(D, &json!({"_id": ids[a], "n": n + 1})).await;
                                        match res.status().as_u16() {
                                            201 => break,
                                            409 if Instant::now() < give_up => {
                                                tokio::time::sleep(Duration::from_millis(5)).await;
                                            }
                                            s => panic!("re-create answered {s}: {}", res.text().await.unwrap()),
                                        }
                                    }
                                    ack(&ids[a], 1, 1);
                                }
                                409 | 410 => {}
                                s => panic!("DELETE answered {s}: {}", res.text().await.unwrap()),
                            }
                        }
                    }
                    _ => unreachable!(),
                }
                n_ops += 1;
            }
            n_ops
        }));
    }
    let mut ops = 0;
    for t in tasks {
        ops += t.await.unwrap();
    }
    assert!(ops > workers * 5, "only {ops} operations ran");
    let acked = acked.lock().unwrap().clone();
    let total: i64 = acked.values().map(|a| a.changes).sum();
    assert!(total > 10, "only {total} changes were acknowledged");
    for id in &ids {
        let a = acked.get(id).copied().unwrap_or_default();
        let (n, v) = read(&app, id).await;
        assert_eq!(n, a.incs, "{id}: n counts every acknowledged increment once ({a:?})");
        assert_eq!(v, 1 + a.changes, "{id}: the version counts every acknowledged change ({a:?})");
    }
    // Nothing left locked: the store holds no lock on these documents
    // once recovery's bound has passed (by the gateway's clock).
    app.settled().await;
    app.advance(bound(&app.config));
    app.run_once("recovery").await;
    for id in &ids {
        let d = StoredDoc::from_record(app.store.get("f", id).await.unwrap().unwrap()).unwrap();
        assert_eq!(d.meta.txn, None::<String>, "{id} still locked");
    }
    Arc::try_unwrap(app).ok().expect("no other handle").stop().await;
}

/// A TCP proxy in front of the MongoDB-wire server that can freeze: every
/// connection open at that moment, and every one made while frozen, stops
/// forwarding for good (a server that took a request and never answers).
/// After `thaw`, new connections go through again.
struct FreezingProxy {
    addr: std::net::SocketAddr,
    state: Arc<Mutex<(bool, Vec<Arc<std::sync::atomic::AtomicBool>>)>>,
}

impl FreezingProxy {
    async fn start(upstream: String) -> Self {
        use std::sync::atomic::AtomicBool;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state: Arc<Mutex<(bool, Vec<Arc<AtomicBool>>)>> = Arc::default();
        let shared = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(&upstream).await else { continue };
                let stuck = {
                    let mut s = shared.lock().unwrap();
                    let stuck = Arc::new(AtomicBool::new(s.0));
                    s.1.push(Arc::clone(&stuck));
                    stuck
                };
                let (ir, iw) = inbound.into_split();
                let (or, ow) = outbound.into_split();
                tokio::spawn(Self::forward(ir, ow, Arc::clone(&stuck)));
                tokio::spawn(Self::forward(or, iw, stuck));
            }
        });
        Self { addr, state }
    }

    async fn forward(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        stuck: Arc<std::sync::atomic::AtomicBool>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            if stuck.load(std::sync::atomic::Ordering::SeqCst) {
                return std::future::pending().await;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    fn freeze(&self) {
        let mut s = self.state.lock().unwrap();
        s.0 = true;
        for c in &s.1 {
            c.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn thaw(&self) {
        self.state.lock().unwrap().0 = false;
    }
}

/// Tests that need the mongodb backend's own wire behaviour.
mod mongodb_wire {
    use super::*;
    use txgate::config::StoreConfig;

    /// The MongoDB-wire server stops answering (its connections freeze):
    /// requests answer 503 within the store deadline, and once the server
    /// answers again the same record serves without a restart.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn mongodb_only_a_server_that_stops_answering_gives_503_and_serves_again() {
        let Some(uri) = crate::support::mongodb_uri() else { return };
        let upstream = uri.trim_start_matches("mongodb://").split(['/', '?']).next().unwrap().to_owned();
        let proxy = FreezingProxy::start(upstream).await;
        let database = format!("it_{}", uuid::Uuid::now_v7().simple());
        let proxied = format!("mongodb://{}/?directConnection=true&heartbeatFrequencyMS=500", proxy.addr);
        let timeout = Duration::from_millis(1000);
        let store_config = StoreConfig::Mongodb { uri: proxied, database: database.clone() };
        let store = txgate::open_store(&store_config).await.unwrap();
        let mut config = test_config(store_config);
        fast(&mut config);
        config.txn.store_timeout = timeout;
        let app = TestApp::on_store(config, Arc::clone(&store), None).await;
        seed(&app, "s1", 0).await;

        proxy.freeze();
        let started = Instant::now();
        let res = app.request(Method::PATCH, &format!("{D}/s1")).json(&json!({"inc": {"n": 1}})).send().await.unwrap();
        let elapsed = started.elapsed();
        assert!(res.headers().contains_key("retry-after"));
        expect_problem(res, 503, "store_unavailable").await;
        assert!(elapsed < timeout + Duration::from_millis(700), "answered after {elapsed:?}");

        proxy.thaw();
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let res =
                app.request(Method::PATCH, &format!("{D}/s1")).json(&json!({"inc": {"n": 1}})).send().await.unwrap();
            if res.status() == 200 {
                break;
            }
            assert!(Instant::now() < deadline, "the record never served again: {}", res.text().await.unwrap());
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        expect(app.post(T, &inc_txn(&["s1"])).await, 200).await;
        assert_eq!(read(&app, "s1").await.0, 2);
        app.stop().await;
        let direct = txgate_store::mongo::MongoStore::connect(&uri, &database).await.unwrap();
        direct.drop_database().await.unwrap();
    }
}
