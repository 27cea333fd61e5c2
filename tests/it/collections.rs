//! Collections: TTL policies by age, by count and both, applied by the
//! sweeper of every instance through the locking rules, each expiry a
//! tombstone and exactly one `document.expired` event; live counts kept
//! exact as documents come and go.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use txgate::testing::txn::record::Status;
use txgate_store::doc;

use crate::support::{Backend, SseStream, TestApp, all_events, expect, expect_problem, txn_record};

crate::on_both_backends!(
    policies_are_set_read_listed_and_checked,
    counts_follow_creates_deletes_and_transactions,
    documents_expire_by_age_with_one_event_and_a_tombstone_each,
    documents_beyond_the_newest_max_count_expire,
    both_limits_apply_at_once,
    a_changed_or_removed_policy_applies_from_the_next_sweep,
    a_locked_document_is_skipped_until_its_transaction_ends,
    two_instances_never_expire_more_than_the_policy_says,
    an_expiry_or_a_count_cut_off_at_any_step_is_finished_once,
);

const WAIT: Duration = Duration::from_secs(20);

/// A gateway whose sweeps the test drives (`TestApp::run_once("ttl")`),
/// with its clock moved on by the test (`TestApp::advance`).
async fn app(backend: Backend) -> Option<TestApp> {
    TestApp::spawn_with(backend, |c| c.ttl_interval = Duration::from_secs(3600)).await
}

/// Sweeps a test runs at most to reach what it expects.
const PASSES: usize = 5;

/// `n` sweeps of `app`'s collections, now.
async fn sweep(app: &TestApp, n: usize) {
    for _ in 0..n {
        app.run_once("ttl").await;
    }
}

fn coll_path(coll: &str) -> String {
    format!("/v1/collections/{coll}")
}

fn doc_path(coll: &str, id: &str) -> String {
    format!("/v1/collections/{coll}/documents/{id}")
}

async fn put_ttl(app: &TestApp, coll: &str, ttl: Value) -> Value {
    expect(app.send_json(Method::PUT, &coll_path(coll), &json!({ "ttl": ttl })).await, 200).await
}

async fn collection(app: &TestApp, coll: &str) -> Value {
    expect(app.get(&coll_path(coll)).await, 200).await
}

async fn count(app: &TestApp, coll: &str) -> u64 {
    collection(app, coll).await["count"].as_u64().expect("count")
}

async fn create(app: &TestApp, coll: &str, id: &str) -> Value {
    expect(app.post(&format!("/v1/collections/{coll}/documents"), &json!({"_id": id, "n": 1})).await, 201).await
}

/// `ids` created in `coll` in turn, each in its own millisecond of the
/// test's clock: documents that tie at a count's cut all stay (see
/// `collections::ttl`), which is not what the tests using this are about.
async fn create_apart(app: &TestApp, coll: &str, ids: impl IntoIterator<Item = String>) {
    for id in ids {
        create(app, coll, &id).await;
        app.advance(Duration::from_millis(2));
    }
}

/// Ids of the live documents of `coll`, read through the document list.
async fn live_ids(app: &TestApp, coll: &str) -> BTreeSet<String> {
    let page = expect(app.get(&format!("/v1/collections/{coll}/documents?limit=1000")).await, 200).await;
    assert!(page["next"].is_null(), "one page holds them all");
    page["items"].as_array().unwrap().iter().map(|d| d["id"].as_str().unwrap().to_owned()).collect()
}

/// Sweep until `coll`'s live count is `n` (at most [`PASSES`] sweeps).
async fn until_count(app: &TestApp, coll: &str, n: u64) {
    app.settled().await;
    for _ in 0..PASSES {
        if count(app, coll).await == n {
            return;
        }
        app.run_once("ttl").await;
    }
    assert_eq!(count(app, coll).await, n, "{coll} after {PASSES} sweeps");
}

/// The log holds an event of each (type, document) of `coll`, once what
/// the gateway's requests left for after their answers is done.
async fn until_logged(app: &TestApp, coll: &str, wanted: &[(&str, &str)]) {
    app.settled().await;
    let (events, _) = all_events(app, 0, &format!("&collections={coll}")).await;
    let missing: Vec<_> =
        wanted.iter().filter(|(kind, id)| !events.iter().any(|e| e["type"] == *kind && e["document"] == *id)).collect();
    assert!(missing.is_empty(), "never logged in {coll}: {missing:?}");
}

/// `document.expired` events of `coll` in the log, by document.
async fn expired_events(app: &TestApp, coll: &str) -> BTreeMap<String, Vec<Value>> {
    let (events, _) = all_events(app, 0, &format!("&collections={coll}&types=document.expired")).await;
    let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for e in events {
        assert_eq!(e["type"], "document.expired");
        assert!(e["transaction"].is_null() && e.get("data").is_none(), "{e}");
        out.entry(e["document"].as_str().unwrap().to_owned()).or_default().push(e);
    }
    out
}

/// Each of `ids` is a tombstone (410) whose version is its expired event's.
async fn assert_expired_once(app: &TestApp, coll: &str, ids: &[String]) {
    let events = expired_events(app, coll).await;
    let got: BTreeSet<&String> = events.keys().collect();
    let want: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(got, want, "exactly these documents expired");
    for id in ids {
        let list = &events[id];
        assert_eq!(list.len(), 1, "one document.expired event for {id}: {list:?}");
        let gone = expect_problem(app.get(&doc_path(coll, id)).await, 410, "deleted").await;
        assert_eq!(gone["version"], list[0]["version"], "the tombstone is the expired version");
    }
}

async fn policies_are_set_read_listed_and_checked(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    // Nothing written yet: empty, no policy.
    assert_eq!(collection(&app, "orders").await, json!({"name": "orders", "ttl": null, "count": 0}));
    let out = put_ttl(&app, "orders", json!({"max_age_seconds": 3600, "max_count": 1000})).await;
    assert_eq!(out, json!({"name": "orders", "ttl": {"max_age_seconds": 3600, "max_count": 1000}, "count": 0}));
    assert_eq!(collection(&app, "orders").await, out);
    // A PUT replaces the policy: a limit left out is no limit.
    let out = put_ttl(&app, "orders", json!({"max_count": 5.0})).await;
    assert_eq!(out["ttl"], json!({"max_age_seconds": null, "max_count": 5}));
    let out = put_ttl(&app, "orders", json!({"max_age_seconds": 60, "max_count": null})).await;
    assert_eq!(out["ttl"], json!({"max_age_seconds": 60, "max_count": null}));
    assert_eq!(put_ttl(&app, "orders", json!(null)).await["ttl"], Value::Null);
    assert_eq!(put_ttl(&app, "logs", json!({"max_age_seconds": null})).await["ttl"], Value::Null);
    put_ttl(&app, "logs", json!({"max_age_seconds": 10})).await;

    // Bad input: 422 with a pointer, nothing changed.
    let bad = [
        json!({}),
        json!({"ttl": {"max_age_seconds": 0}}),
        json!({"ttl": {"max_age_seconds": -5}}),
        json!({"ttl": {"max_age_seconds": 1.5}}),
        json!({"ttl": {"max_age_seconds": "60"}}),
        json!({"ttl": {"max_age_seconds": 3_153_600_001_u64}}),
        json!({"ttl": {"max_count": 0}}),
        json!({"ttl": {"max_count": 1_000_000_000_001_u64}}),
        json!({"ttl": {"maxCount": 5}}),
        json!({"ttl": 5}),
        json!({"ttl": [null, null]}),
        json!([null]),
        json!({"ttl": {"max_count": 5}, "extra": true}),
        json!([]),
    ];
    for body in &bad {
        let res = app.send_json(Method::PUT, &coll_path("logs"), body).await;
        expect_problem(res, 422, "validation_failed").await;
    }
    let res = app.send_json(Method::PUT, &coll_path("_txns"), &json!({"ttl": {"max_count": 1}})).await;
    expect_problem(res, 422, "validation_failed").await;
    expect_problem(app.get(&coll_path("9lives")).await, 422, "validation_failed").await;
    let res = app.request(Method::PUT, &coll_path("logs")).header("content-type", "application/json").body("{").send();
    expect_problem(res.await.unwrap(), 400, "invalid_json").await;
    assert_eq!(collection(&app, "logs").await["ttl"], json!({"max_age_seconds": 10, "max_count": null}));

    // Listed by name, a page at a time.
    create(&app, "audit", "a1").await;
    let all = expect(app.get("/v1/collections").await, 200).await;
    let names: Vec<&str> = all["items"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["audit", "logs", "orders"]);
    assert_eq!(all["items"][0], json!({"name": "audit", "ttl": null, "count": 1}));
    let first = expect(app.get("/v1/collections?limit=2").await, 200).await;
    assert_eq!(first["items"].as_array().unwrap().len(), 2);
    let next = first["next"].as_str().expect("a next page");
    let second = expect(app.get(&format!("/v1/collections?limit=2&after={next}")).await, 200).await;
    assert_eq!(second["items"][0]["name"], "orders");
    assert!(second["next"].is_null());
    expect_problem(app.get("/v1/collections?limit=0").await, 422, "validation_failed").await;
    let long = "QQQQ".repeat(1100);
    expect_problem(app.get(&format!("/v1/collections?after={long}")).await, 422, "validation_failed").await;
    app.stop().await;
}

async fn counts_follow_creates_deletes_and_transactions(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    for i in 0..6 {
        create(&app, "items", &format!("i{i}")).await;
    }
    assert_eq!(count(&app, "items").await, 6);
    expect(app.request(Method::DELETE, &doc_path("items", "i0")).send().await.unwrap(), 204).await;
    // Updates leave the count alone; a re-created tombstone counts again.
    let res = app.send_json(Method::PATCH, &doc_path("items", "i1"), &json!({"set": {"n": 2}})).await;
    expect(res, 200).await;
    assert_eq!(count(&app, "items").await, 5);
    create(&app, "items", "i0").await;
    assert_eq!(count(&app, "items").await, 6);
    // A transaction: two inserts, one delete, one update, across two
    // collections.
    let txn = json!({"actions": [
        {"op": "insert", "collection": "items", "id": "t1", "data": {"n": 1}},
        {"op": "insert", "collection": "other", "id": "t2", "data": {"n": 1}},
        {"op": "delete", "collection": "items", "id": "i2"},
        {"op": "update", "collection": "items", "id": "i3", "set": {"n": 9}},
    ]});
    expect(app.post("/v1/transactions", &txn).await, 200).await;
    // Counted once its changes' events are logged (the roll-forward, which
    // may log them one at a time: the items count is 6 before and after,
    // so wait for its two events rather than for the count).
    until_logged(&app, "items", &[("document.created", "t1"), ("document.deleted", "i2")]).await;
    assert_eq!(count(&app, "items").await, 6);
    until_count(&app, "other", 1).await;
    // A failed transaction changes nothing.
    let txn = json!({"actions": [
        {"op": "insert", "collection": "items", "id": "t3", "data": {"n": 1}},
        {"op": "insert", "collection": "items", "id": "i4", "data": {"n": 1}},
    ]});
    expect_problem(app.post("/v1/transactions", &txn).await, 409, "already_exists").await;
    assert_eq!(count(&app, "items").await, 6);
    assert_eq!(count(&app, "items").await as usize, live_ids(&app, "items").await.len());
    app.stop().await;
}

/// A subscription's dispatcher reads the log at its head, a batch at a
/// time, and what it read is kept for other readers: a count read right
/// after the client's own writes still holds all of them, however many
/// the batch held. On the embedded store only: the log's readers are the
/// gateway's own whatever the store, and a MongoDB-wire server answers
/// the 500 inserts' roll-forward command by command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_holds_the_clients_own_writes_while_a_subscription_reads_the_log() {
    let Some(app) = app(Backend::Embedded).await else { return };
    let rx = crate::support::TestReceiver::start().await;
    expect(app.post("/v1/subscriptions", &json!({"url": rx.url("/x"), "collections": ["elsewhere"]})).await, 201).await;
    let mut want = 0;
    for (round, n) in [499, 501, 1000, 999].into_iter().enumerate() {
        let actions: Vec<Value> = (0..n)
            .map(|i| json!({"op": "insert", "collection": "big", "id": format!("r{round}-{i}"), "data": {"n": i}}))
            .collect();
        expect(app.post("/v1/transactions", &json!({ "actions": actions })).await, 200).await;
        want += n;
        assert_eq!(count(&app, "big").await, want, "right after a transaction of {n} inserts");
        let listed = expect(app.get("/v1/collections?limit=1000").await, 200).await;
        let big = listed["items"].as_array().unwrap().iter().find(|c| c["name"] == "big").cloned();
        assert_eq!(big.map(|c| c["count"].clone()), Some(json!(want)), "in the list: {listed}");
        // One more write, alone.
        create(&app, "big", &format!("one{round}")).await;
        want += 1;
        assert_eq!(count(&app, "big").await, want, "right after one more insert");
    }
    app.stop().await;
}

async fn documents_expire_by_age_with_one_event_and_a_tombstone_each(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    let mut stream = SseStream::open(&app, "/v1/events?types=document.expired", None).await;
    put_ttl(&app, "sessions", json!({"max_age_seconds": 2})).await;
    let mut created = BTreeMap::new();
    for i in 0..5 {
        let id = format!("s{i}");
        let doc = create(&app, "sessions", &id).await;
        created.insert(id, doc["created_at"].as_str().unwrap().to_owned());
    }
    // Another collection without a policy keeps its documents.
    create(&app, "keep", "k1").await;
    // Not due yet: still there (and updated, which does not make it younger).
    let res = app.send_json(Method::PATCH, &doc_path("sessions", "s0"), &json!({"set": {"n": 2}})).await;
    expect(res, 200).await;
    assert_eq!(count(&app, "sessions").await, 5);
    sweep(&app, 1).await;
    assert_eq!(count(&app, "sessions").await, 5, "none before its time");
    app.advance(Duration::from_millis(2500));
    sweep(&app, 1).await;
    // Every expiry arrives on the stream, none before its time.
    let mut seen = BTreeSet::new();
    while seen.len() < 5 {
        let e = stream.next(WAIT).await.expect("a document.expired event");
        let event = e.data;
        assert_eq!(
            (event["type"].as_str(), event["collection"].as_str()),
            (Some("document.expired"), Some("sessions"))
        );
        let id = event["document"].as_str().unwrap().to_owned();
        let at =
            time::OffsetDateTime::parse(event["at"].as_str().unwrap(), &time::format_description::well_known::Rfc3339)
                .unwrap();
        let born = time::OffsetDateTime::parse(&created[&id], &time::format_description::well_known::Rfc3339).unwrap();
        assert!(at - born >= time::Duration::seconds(2), "{id} expired {} after its creation", at - born);
        assert!(seen.insert(id), "one event per document");
    }
    assert_eq!(count(&app, "sessions").await, 0);
    let ids: Vec<String> = created.keys().cloned().collect();
    assert_expired_once(&app, "sessions", &ids).await;
    expect(app.get(&doc_path("keep", "k1")).await, 200).await;
    // A tombstone of an expired document can be created again, and lives
    // its own age.
    create(&app, "sessions", "s0").await;
    assert_eq!(count(&app, "sessions").await, 1);
    app.stop().await;
}

async fn documents_beyond_the_newest_max_count_expire(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    create_apart(&app, "feed", (0..10).map(|i| format!("f{i:02}"))).await;
    put_ttl(&app, "feed", json!({"max_count": 3})).await;
    until_count(&app, "feed", 3).await;
    // A few more sweeps: nothing more goes.
    sweep(&app, 3).await;
    assert_eq!(live_ids(&app, "feed").await, BTreeSet::from(["f07".into(), "f08".into(), "f09".into()]));
    let gone: Vec<String> = (0..7).map(|i| format!("f{i:02}")).collect();
    assert_expired_once(&app, "feed", &gone).await;
    // New documents push the oldest out, one for one.
    create_apart(&app, "feed", (10..14).map(|i| format!("f{i:02}"))).await;
    until_count(&app, "feed", 3).await;
    sweep(&app, 3).await;
    assert_eq!(live_ids(&app, "feed").await, BTreeSet::from(["f11".into(), "f12".into(), "f13".into()]));
    app.stop().await;
}

async fn both_limits_apply_at_once(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    put_ttl(&app, "both", json!({"max_age_seconds": 3, "max_count": 4})).await;
    create_apart(&app, "both", (0..7).map(|i| format!("b{i}"))).await;
    until_count(&app, "both", 4).await;
    assert_eq!(live_ids(&app, "both").await, (3..7).map(|i| format!("b{i}")).collect());
    // Then age takes the rest.
    app.advance(Duration::from_secs(4));
    until_count(&app, "both", 0).await;
    let all: Vec<String> = (0..7).map(|i| format!("b{i}")).collect();
    assert_expired_once(&app, "both", &all).await;
    app.stop().await;
}

async fn a_changed_or_removed_policy_applies_from_the_next_sweep(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    create_apart(&app, "c", (0..8).map(|i| format!("c{i}"))).await;
    // Nothing is due under a long maximum age...
    put_ttl(&app, "c", json!({"max_age_seconds": 3600})).await;
    sweep(&app, 2).await;
    assert_eq!(count(&app, "c").await, 8);
    // ... a count makes some due, a lower one more.
    put_ttl(&app, "c", json!({"max_count": 6})).await;
    until_count(&app, "c", 6).await;
    put_ttl(&app, "c", json!({"max_count": 2})).await;
    until_count(&app, "c", 2).await;
    // Removed: documents stay, however many.
    put_ttl(&app, "c", json!(null)).await;
    for i in 8..12 {
        create(&app, "c", &format!("c{i}")).await;
    }
    sweep(&app, 2).await;
    assert_eq!(count(&app, "c").await, 6);
    // A maximum age shortened below the documents' age takes them all.
    app.advance(Duration::from_millis(1500));
    put_ttl(&app, "c", json!({"max_age_seconds": 1})).await;
    until_count(&app, "c", 0).await;
    let all: Vec<String> = (0..12).map(|i| format!("c{i}")).collect();
    assert_expired_once(&app, "c", &all).await;
    app.stop().await;
}

async fn a_locked_document_is_skipped_until_its_transaction_ends(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    for id in ["a", "b"] {
        create(&app, "held", id).await;
    }
    // "a" is held by a running transaction (its lease a minute long).
    let txn = "T-holds-a";
    app.store.insert("_txns", txn_record(txn, Status::Pending, 60_000, "held", &["a"]).to_record()).await.unwrap();
    let rec = app.store.get("held", "a").await.unwrap().unwrap();
    let mut d = txgate::testing::document::StoredDoc::from_record(rec).unwrap();
    d.meta.txn = Some(txn.into());
    let staged = txgate::testing::document::Staged {
        op: txgate::testing::document::StagedOp::Update,
        data: Some(doc! {"n": 5_i64}),
        sv: 1,
    };
    d.meta.pending = Some(staged);
    assert!(app.store.replace("held", "a", doc! {"_meta.v": 1_i64}, d.to_record()).await.unwrap());
    put_ttl(&app, "held", json!({"max_age_seconds": 1})).await;
    app.advance(Duration::from_secs(2));
    until_count(&app, "held", 1).await;
    // Several sweeps later the held document is still there.
    sweep(&app, 3).await;
    let a = expect(app.get(&doc_path("held", "a")).await, 200).await;
    assert_eq!(a["version"], 1);
    assert_eq!(live_ids(&app, "held").await, BTreeSet::from(["a".to_owned()]));
    // The transaction ends (aborted by an operator): then it expires.
    expect(app.request(Method::POST, &format!("/v1/transactions/{txn}/abort")).send().await.unwrap(), 200).await;
    until_count(&app, "held", 0).await;
    assert_expired_once(&app, "held", &["a".to_owned(), "b".to_owned()]).await;
    app.stop().await;
}

async fn two_instances_never_expire_more_than_the_policy_says(backend: Backend) {
    // Both instances sweep on their own, every 100 ms, while both write.
    let Some(a) = TestApp::spawn_with(backend, |c| c.ttl_interval = Duration::from_millis(100)).await else { return };
    let b = TestApp::on_store(a.config.clone(), Arc::clone(&a.store), None).await;
    const KEEP: usize = 5;
    put_ttl(&a, "shared", json!({"max_count": KEEP})).await;
    let created = AtomicUsize::new(0);
    let created_at: std::sync::Mutex<Vec<(String, String)>> = Default::default();
    let writers = [&a, &b].into_iter().enumerate().map(|(w, app)| {
        let (created, created_at) = (&created, &created_at);
        async move {
            for i in 0..30 {
                // Ids sort in creation order within one writer.
                let id = format!("w{w}-{i:02}");
                let doc = create(app, "shared", &id).await;
                created_at.lock().unwrap().push((doc["created_at"].as_str().unwrap().to_owned(), id));
                let before = created.fetch_add(1, Ordering::SeqCst) + 1;
                // A sweep of this instance (the other's writes and sweeps go
                // on meanwhile); then the live documents are never below the
                // limit (or below what exists).
                app.run_once("ttl").await;
                let live = live_ids(app, "shared").await.len();
                assert!(live >= before.min(KEEP), "{live} live documents after {before} created");
            }
        }
    });
    futures::future::join_all(writers).await;
    // What stays: the documents created no earlier than the KEEP-th newest
    // (two instances can create documents in one millisecond; those tied
    // with it stay with it, docs/guides/collections.md).
    let mut by_age = created_at.into_inner().unwrap();
    by_age.sort();
    let boundary = by_age[by_age.len() - KEEP].0.clone();
    let want: BTreeSet<String> = by_age.iter().filter(|(at, _)| *at >= boundary).map(|(_, id)| id.clone()).collect();
    until_count(&a, "shared", want.len() as u64).await;
    // More sweeps of both: nothing more goes.
    sweep(&a, 2).await;
    sweep(&b, 2).await;
    let live = live_ids(&b, "shared").await;
    assert_eq!(live, want, "the documents created no earlier than the {KEEP}-th newest stay");
    assert_eq!(count(&b, "shared").await, want.len() as u64);
    // Exactly the others expired, each once.
    let gone: Vec<String> =
        (0..2).flat_map(|w| (0..30).map(move |i| format!("w{w}-{i:02}"))).filter(|id| !live.contains(id)).collect();
    assert_eq!(gone.len(), 60 - want.len());
    assert_expired_once(&a, "shared", &gone).await;
    b.stop().await;
    a.stop().await;
}

/// Store failures at each step of an expiry (the tombstone's CAS landed but
/// unanswered, the event's append, the outbox's clearing) and of the count
/// fold (a collection's count, the shared position): every document still
/// expires exactly once, with one event, and the count is exact.
async fn an_expiry_or_a_count_cut_off_at_any_step_is_finished_once(backend: Backend) {
    use crate::faulty::{Act, Op};
    let mut clears_of_e3 = 0;
    let fired: Arc<std::sync::Mutex<BTreeSet<&'static str>>> = Arc::default();
    let faults = Arc::clone(&fired);
    let rule = move |op: &Op| {
        let once = |name: &'static str, act: Act| if faults.lock().unwrap().insert(name) { act } else { Act::Pass };
        match (op.kind, op.coll, op.id) {
            ("replace", "ttl", Some("e1")) => once("tombstone", Act::FailAfter),
            ("append", "_events", Some("ttl/e2/2")) => once("append", Act::FailBefore),
            ("update", "ttl", Some("e3")) => {
                clears_of_e3 += 1;
                // The first clears the creation's outbox; the second the expiry's.
                if clears_of_e3 == 2 { once("clear", Act::FailBefore) } else { Act::Pass }
            }
            ("update", "_collections", Some("ttl")) if op.set.is_some_and(|s| s.contains_key("count")) => {
                once("count", Act::FailBefore)
            }
            ("update", "_counters", Some("_collections.counted")) => once("position", Act::FailAfter),
            _ => Act::Pass,
        }
    };
    let tweak = |c: &mut txgate::config::Config| c.ttl_interval = Duration::from_millis(100);
    let Some(app) = crate::faulty::rigged_app(backend, tweak, rule).await else { return };
    put_ttl(&app, "ttl", json!({"max_age_seconds": 1})).await;
    let ids: Vec<String> = (1..=5).map(|i| format!("e{i}")).collect();
    for id in &ids {
        create(&app, "ttl", id).await;
    }
    // Past the age; what a crash left in an outbox (5 s old or more) is
    // moved to the log by the recovery worker's outbox sweep. A sweep a
    // fault cuts short is done again by the next.
    app.settled().await;
    app.advance(Duration::from_secs(6));
    for _ in 0..PASSES {
        let _ = app.try_run_once("ttl").await;
        // An outbox this sweep left is old enough for recovery's.
        app.advance(Duration::from_secs(6));
        app.run_once("recovery").await;
    }
    let expired = expired_events(&app, "ttl").await;
    assert_eq!(expired.len(), ids.len(), "expired: {:?}", expired.keys());
    assert_eq!(count(&app, "ttl").await, 0);
    assert_expired_once(&app, "ttl", &ids).await;
    assert!(live_ids(&app, "ttl").await.is_empty());
    let fired: Vec<&str> = fired.lock().unwrap().iter().copied().collect();
    assert_eq!(fired, ["append", "clear", "count", "position", "tombstone"], "every fault was injected");
    // Counting goes on exactly from there.
    put_ttl(&app, "ttl", json!(null)).await;
    create(&app, "ttl", "after").await;
    assert_eq!(count(&app, "ttl").await, 1);
    app.stop().await;
}

/// Records another tool left in a collection, older than its documents and
/// more than a sweep reads at once, that are not documents (their version
/// is a string): the sweep by age skips them and reaches the documents
/// behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_records_of_another_shape_do_not_keep_the_age_sweep_from_the_documents_behind_them() {
    use txgate_store::{Bson, DateTime};
    let Some(app) = app(Backend::Mongodb).await else { return };
    let old = Bson::DateTime(DateTime::from_millis(946_684_800_000));
    for i in 0..205 {
        let meta = doc! {"v": "one", "sv": 1_i64, "txn": null, "pending": null, "deleted": false,
        "deleting": false, "created_at": old.clone(), "updated_at": old.clone(), "deleted_at": null};
        let record = doc! {"_id": format!("planted{i:03}"), "n": 1_i64, "_meta": meta};
        app.store.insert("aged", record).await.expect("planted below the API");
    }
    for id in ["s0", "s1", "s2"] {
        create(&app, "aged", id).await;
    }
    put_ttl(&app, "aged", json!({"max_age_seconds": 1})).await;
    app.advance(Duration::from_secs(2));
    until_count(&app, "aged", 0).await;
    for id in ["s0", "s1", "s2"] {
        expect_problem(app.get(&doc_path("aged", id)).await, 410, "deleted").await;
    }
    expect(app.get("/healthz").await, 200).await;
    app.stop().await;
}
