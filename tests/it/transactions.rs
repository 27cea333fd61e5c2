//! The transaction API and the §3 guarantees over real HTTP, on both
//! backends: atomicity, no lost updates (bank test), wound-wait, the 409
//! contract, idempotency and the operator endpoints.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use txgate::testing::document::{Staged, StagedOp, StoredDoc};
use txgate::testing::txn::record::{Status, TXNS, TxnRecord};
use txgate_store::{Update, doc};

use crate::support::{Backend, TestApp, expect, expect_problem, txn_record};

crate::on_both_backends!(
    duplicate_member_names_are_refused_on_every_body,
    commit_applies_every_kind_of_action,
    failed_precondition_aborts_with_nothing_applied,
    invalid_change_is_422_and_nothing_applied,
    malformed_transactions_are_refused_before_anything_is_written,
    idempotency_key_replays_the_outcome,
    records_can_be_read_listed_and_aborted,
    bank_transfers_conserve_money_and_count_versions,
    older_transaction_wounds_a_younger_holder,
    younger_transaction_waits_for_an_older_holder_then_409,
    opposite_lock_orders_never_deadlock,
    a_waiting_transaction_holds_only_locks_below_the_one_it_waits_for,
    a_wounded_transaction_is_retried_with_its_age,
);

const T: &str = "/v1/transactions";

fn doc_url(coll: &str, id: &str) -> String {
    format!("/v1/collections/{coll}/documents/{id}")
}

pub(crate) async fn seed(app: &TestApp, coll: &str, id: &str, data: Value) {
    let mut body = data;
    body["_id"] = json!(id);
    expect(app.post(&format!("/v1/collections/{coll}/documents"), &body).await, 201).await;
}

async fn read(app: &TestApp, coll: &str, id: &str) -> (u16, Value) {
    let res = app.get(&doc_url(coll, id)).await;
    let status = res.status().as_u16();
    (status, res.json().await.unwrap_or(Value::Null))
}

/// No document of `ids` in `coll` is left locked (checked in the store).
async fn assert_unlocked(app: &TestApp, coll: &str, ids: &[&str]) {
    app.until(&format!("documents of {coll} {ids:?} unlocked"), async || {
        for id in ids {
            if let Some(rec) = app.store.get(coll, id).await.unwrap() {
                if StoredDoc::from_record(rec).unwrap().meta.txn.is_some() {
                    return false;
                }
            }
        }
        true
    })
    .await;
}

async fn commit_applies_every_kind_of_action(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    seed(&app, "acc", "a", json!({"owner": "ann", "balance": 100, "tmp": 1})).await;
    seed(&app, "acc", "b", json!({"owner": "bob", "balance": 5})).await;
    seed(&app, "acc", "c", json!({"x": 1})).await;
    seed(&app, "limits", "l", json!({"max": 10})).await;
    let body = json!({"actions": [
        {"op": "insert", "collection": "acc", "id": "new", "data": {"owner": "cy", "balance": 0}},
        {"op": "update", "collection": "acc", "id": "a", "if_version": 1, "set": {"owner": "Ann"}, "unset": ["tmp"], "inc": {"balance": -10}},
        {"op": "replace", "collection": "acc", "id": "b", "data": {"owner": "bob", "balance": 15}},
        {"op": "delete", "collection": "acc", "id": "c", "if_version": 1},
        {"op": "check", "collection": "limits", "id": "l", "if_version": 1},
        {"op": "insert", "collection": "ledger", "data": {"amount": 10}},
    ]});
    let out = expect(app.post(T, &body).await, 200).await;
    assert_eq!(out["status"], "committed");
    assert!(out["committed_at"].is_string());
    let versions: Vec<i64> =
        out["results"].as_array().unwrap().iter().map(|r| r["version"].as_i64().unwrap()).collect();
    assert_eq!(versions, [1, 2, 2, 2, 1, 1]);
    let generated = out["results"][5]["id"].as_str().unwrap();
    assert_eq!(uuid::Uuid::parse_str(generated).unwrap().get_version_num(), 7);
    // Read-your-writes right after the 200.
    assert_eq!(read(&app, "acc", "new").await, (200, read(&app, "acc", "new").await.1));
    let (_, a) = read(&app, "acc", "a").await;
    assert_eq!((a["version"].as_i64(), &a["data"]), (Some(2), &json!({"owner": "Ann", "balance": 90})));
    let (_, b) = read(&app, "acc", "b").await;
    assert_eq!(b["data"], json!({"owner": "bob", "balance": 15}));
    let (status, c) = read(&app, "acc", "c").await;
    assert_eq!((status, c["version"].as_i64()), (410, Some(2)));
    let (_, l) = read(&app, "limits", "l").await;
    assert_eq!(l["version"], 1, "check does not change the version");
    assert_eq!(read(&app, "ledger", generated).await.0, 200);
    assert_unlocked(&app, "acc", &["new", "a", "b", "c"]).await;
    // Re-create over the tombstone in a transaction: the version continues.
    let out = expect(
        app.post(T, &json!({"actions": [{"op": "insert", "collection": "acc", "id": "c", "data": {"y": 2}}]})).await,
        200,
    )
    .await;
    assert_eq!(out["results"][0]["version"], 3);
    app.stop().await;
}

async fn failed_precondition_aborts_with_nothing_applied(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    seed(&app, "acc", "a", json!({"n": 1})).await;
    seed(&app, "acc", "b", json!({"n": 1})).await;
    seed(&app, "acc", "gone", json!({"n": 1})).await;
    assert_eq!(app.request(Method::DELETE, &doc_url("acc", "gone")).send().await.unwrap().status(), 204);
    let cases = [
        (
            json!({"op": "update", "collection": "acc", "id": "b", "if_version": 7, "inc": {"n": 1}}),
            "version_conflict",
            Some(7),
            Some(1),
        ),
        (json!({"op": "update", "collection": "acc", "id": "zz", "inc": {"n": 1}}), "not_found", None, None),
        (json!({"op": "delete", "collection": "acc", "id": "gone"}), "deleted", None, Some(2)),
        (json!({"op": "insert", "collection": "acc", "id": "b", "data": {}}), "already_exists", None, Some(1)),
        (json!({"op": "check", "collection": "acc", "id": "b", "if_version": 2}), "version_conflict", Some(2), Some(1)),
    ];
    for (failing, code, expected, actual) in cases {
        let body = json!({"actions": [
            {"op": "update", "collection": "acc", "id": "a", "inc": {"n": 100}},
            {"op": "insert", "collection": "acc", "id": "fresh", "data": {"n": 1}},
            failing,
        ]});
        let res = app.post(T, &body).await;
        // Not retryable: retrying after a while cannot help, so no Retry-After.
        assert!(!res.headers().contains_key("retry-after"), "{:?}", res.headers());
        let p = expect_problem(res, 409, code).await;
        assert_eq!(p["action"], 2, "{p}");
        assert_eq!(p["retryable"], false);
        assert_eq!(p["collection"], "acc");
        assert_eq!(p["expected"].as_i64(), expected, "{p}");
        assert_eq!(p["actual"].as_i64(), actual, "{p}");
        let txn = p["transaction"].as_str().unwrap().to_owned();
        // Nothing applied: "a" unchanged, "fresh" never visible.
        let (_, a) = read(&app, "acc", "a").await;
        assert_eq!((a["version"].as_i64(), &a["data"]["n"]), (Some(1), &json!(1)));
        assert_eq!(read(&app, "acc", "fresh").await.0, 404);
        let rec = expect(app.get(&format!("{T}/{txn}")).await, 200).await;
        assert!(matches!(rec["status"].as_str(), Some("aborted" | "rolled_back")), "{rec}");
        assert_eq!(rec["failure"]["code"], code);
        assert_eq!(rec["actions"][2]["outcome"], "failed");
    }
    assert_unlocked(&app, "acc", &["a", "b", "fresh"]).await;
    assert!(app.store.get("acc", "fresh").await.unwrap().is_none(), "placeholder removed");
    app.stop().await;
}

async fn invalid_change_is_422_and_nothing_applied(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    seed(&app, "acc", "a", json!({"n": 1, "s": "x"})).await;
    seed(&app, "acc", "b", json!({"n": 1})).await;
    let body = json!({"actions": [
        {"op": "update", "collection": "acc", "id": "b", "inc": {"n": 1}},
        {"op": "update", "collection": "acc", "id": "a", "inc": {"s": 1}},
    ]});
    let p = expect_problem(app.post(T, &body).await, 422, "invalid_change").await;
    assert_eq!(p["action"], 1);
    assert_eq!(read(&app, "acc", "b").await.1["version"], 1);
    assert_unlocked(&app, "acc", &["a", "b"]).await;
    app.stop().await;
}

async fn malformed_transactions_are_refused_before_anything_is_written(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let u = |id: &str| json!({"op": "update", "collection": "acc", "id": id, "inc": {"n": 1}});
    let too_many: Vec<Value> = (0..1001).map(|i| u(&format!("d{i}"))).collect();
    let cases = [
        (json!({"actions": []}), "validation_failed"),
        (json!({"actions": too_many}), "validation_failed"),
        (json!({"actions": [{"op": "upsert", "collection": "acc", "id": "a"}]}), "validation_failed"),
        (
            json!({"actions": [{"op": "update", "collection": "_txns", "id": "a", "inc": {"n": 1}}]}),
            "validation_failed",
        ),
        (json!({"actions": [{"op": "insert", "collection": "acc", "data": {"_meta": 1}}]}), "validation_failed"),
        (json!({"actions": [{"op": "update", "collection": "acc", "id": "a", "set": null}]}), "validation_failed"),
        (json!({"actions": [{"op": "delete", "collection": "acc", "id": "a", "bogus": 1}]}), "validation_failed"),
        (json!({"actions": [u("a")], "extra": true}), "validation_failed"),
        (json!({"actions": [u("a"), u("a")]}), "duplicate_member"),
        (json!({"actions": [u("a")], "hooks": [{"url": "ftp://example.com/x"}]}), "validation_failed"),
        (
            json!({"actions": [u("a")], "hooks": [{"url": "https://example.com/x", "method": "TRACE"}]}),
            "validation_failed",
        ),
        (json!({"actions": [u("a")], "hooks": vec![json!({"url": "https://example.com/"}); 17]}), "validation_failed"),
        (json!([1]), "validation_failed"),
        // A struct is an object, never an array read by position.
        (json!([[u("a")]]), "validation_failed"),
        (json!({"actions": [u("a")], "hooks": [["POST", "https://example.com/x"]]}), "validation_failed"),
    ];
    for (body, code) in cases {
        expect_problem(app.post(T, &body).await, 422, code).await;
    }
    // Each refusal points at the member of the action refused.
    let pointed = [
        (json!({"op": "upsert", "collection": "acc", "id": "a"}), "/actions/1/op"),
        (json!({"op": 5, "collection": "acc", "id": "a"}), "/actions/1/op"),
        (json!({"collection": "acc", "id": "a"}), "/actions/1/op"),
        (json!({"op": "update", "collection": 5, "id": "a", "inc": {"n": 1}}), "/actions/1/collection"),
        (json!({"op": "update", "collection": "acc", "inc": {"n": 1}}), "/actions/1/id"),
        (json!({"op": "update", "collection": "acc", "id": "a", "unset": ["n", 3]}), "/actions/1/unset/1"),
        (json!({"op": "delete", "collection": "acc", "id": "a", "bogus": 1}), "/actions/1/bogus"),
        (json!({"op": "insert", "collection": "acc", "data": [1]}), "/actions/1/data"),
        (json!({"op": "check", "collection": "acc", "id": "a", "if_version": "1"}), "/actions/1/if_version"),
    ];
    for (action, pointer) in pointed {
        let body = json!({"actions": [u("a"), action]});
        let p = expect_problem(app.post(T, &body).await, 422, "validation_failed").await;
        assert_eq!(p["errors"][0]["pointer"], pointer, "{body}: {p}");
        let detail = p["detail"].as_str().unwrap();
        assert!(detail.starts_with(&format!("{pointer}: ")), "{detail}");
        assert!(!detail.contains('\u{1e}'), "{detail}");
    }
    let res = app
        .request(Method::POST, T)
        .header("content-type", "application/json")
        .body("{\"actions\":")
        .send()
        .await
        .unwrap();
    expect_problem(res, 400, "invalid_json").await;
    let listed = expect(app.get(T).await, 200).await;
    assert_eq!(listed["items"], json!([]), "no transaction record was written");
    app.stop().await;
}

async fn idempotency_key_replays_the_outcome(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    seed(&app, "acc", "a", json!({"n": 1})).await;
    let post =
        |key: &'static str, body: Value| app.request(Method::POST, T).header("Idempotency-Key", key).json(&body).send();
    let body = json!({"actions": [{"op": "update", "collection": "acc", "id": "a", "if_version": 1, "inc": {"n": 1}}]});
    let first = expect(post("k-1", body.clone()).await.unwrap(), 200).await;
    let res = post("k-1", body.clone()).await.unwrap();
    assert_eq!(res.headers()["idempotent-replayed"], "true");
    assert_eq!(expect(res, 200).await, first, "same key, same body: same outcome");
    assert_eq!(read(&app, "acc", "a").await.1["version"], 2, "applied once");
    let other = json!({"actions": [{"op": "check", "collection": "acc", "id": "a"}]});
    expect_problem(post("k-1", other).await.unwrap(), 422, "idempotency_key_reused").await;
    // A non-retryable failure is stored too.
    let stale =
        json!({"actions": [{"op": "update", "collection": "acc", "id": "a", "if_version": 1, "inc": {"n": 1}}]});
    let p1 = expect_problem(post("k-2", stale.clone()).await.unwrap(), 409, "version_conflict").await;
    let p2 = expect_problem(post("k-2", stale).await.unwrap(), 409, "version_conflict").await;
    assert_eq!(p1["transaction"], p2["transaction"]);
    // A retryable failure frees the key.
    let holder = txn_id_at(-3600); // older: the new transaction must wait, not wound
    app.store.insert(TXNS, held_record(&holder, &["a"]).to_record()).await.unwrap();
    lock(&app, "acc", "a", &holder).await;
    let body = json!({"actions": [{"op": "update", "collection": "acc", "id": "a", "inc": {"n": 1}}]});
    let p = expect_problem(post("k-3", body.clone()).await.unwrap(), 409, "locked").await;
    assert_eq!(p["retryable"], true);
    expect(app.request(Method::POST, &format!("{T}/{holder}/abort")).send().await.unwrap(), 200).await;
    expect(post("k-3", body).await.unwrap(), 200).await;
    // Malformed key.
    let long = "k".repeat(256);
    let res = app
        .request(Method::POST, T)
        .header("Idempotency-Key", long)
        .json(&json!({"actions": []}))
        .send()
        .await
        .unwrap();
    expect_problem(res, 400, "invalid_header").await;
    app.stop().await;
}

/// A pending record for `id` whose lease lasts an hour.
pub(crate) fn held_record(id: &str, members: &[&str]) -> TxnRecord {
    txn_record(id, Status::Pending, 3_600_000, "acc", members)
}

/// Lock `coll/id` for `holder` with a staged `n: 999`.
pub(crate) async fn lock(app: &TestApp, coll: &str, id: &str, holder: &str) {
    let mut d = StoredDoc::from_record(app.store.get(coll, id).await.unwrap().unwrap()).unwrap();
    d.meta.txn = Some(holder.into());
    d.meta.pending = Some(Staged { op: StagedOp::Update, data: Some(doc! {"n": 999_i64}), sv: 1 });
    let v = d.meta.v;
    assert!(app.store.replace(coll, id, doc! {"_meta.v": v}, d.to_record()).await.unwrap());
}

/// A UUIDv7 transaction id `offset_secs` from now (negative: older).
pub(crate) fn txn_id_at(offset_secs: i64) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let ts = uuid::Timestamp::from_unix(uuid::NoContext, (now + offset_secs) as u64, 0);
    uuid::Uuid::new_v7(ts).to_string()
}

async fn records_can_be_read_listed_and_aborted(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    seed(&app, "acc", "a", json!({"n": 1})).await;
    seed(&app, "acc", "b", json!({"n": 1})).await;
    let raw = r#"{"actions": [{"op": "update", "collection": "acc", "id": "a", "inc": {"n": 1}}], "hooks": [{"url": "http://127.0.0.1:9/h"}]}"#;
    let res = app.request(Method::POST, T).header("content-type", "application/json").body(raw).send().await.unwrap();
    let out = expect(res, 200).await;
    let id = out["id"].as_str().unwrap();
    assert_eq!(out["hooks"], json!([{"id": format!("{id}:0"), "status": "pending"}]));
    let rec = expect(app.get(&format!("{T}/{id}")).await, 200).await;
    assert!(matches!(rec["status"].as_str(), Some("committed" | "done")));
    assert_eq!(rec["request"], serde_json::from_str::<Value>(raw).unwrap(), "the request as sent");
    assert_eq!(rec["actions"][0]["outcome"], "committed");
    assert_eq!(rec["actions"][0]["version"], 2);
    expect_problem(app.get(&format!("{T}/nope")).await, 404, "not_found").await;

    let holder = txn_id_at(0);
    app.store.insert(TXNS, held_record(&holder, &["b"]).to_record()).await.unwrap();
    lock(&app, "acc", "b", &holder).await;
    let pending = expect(app.get(&format!("{T}?status=pending")).await, 200).await;
    assert_eq!(pending["items"].as_array().unwrap().len(), 1);
    assert_eq!(pending["items"][0]["id"], holder);
    let aborted = expect(app.request(Method::POST, &format!("{T}/{holder}/abort")).send().await.unwrap(), 200).await;
    assert_eq!(aborted["status"], "aborted");
    assert_eq!(aborted["abort_reason"], "operator");
    assert_unlocked(&app, "acc", &["b"]).await;
    assert_eq!(read(&app, "acc", "b").await.1["data"]["n"], 1, "the aborted change was never applied");
    expect(app.request(Method::POST, &format!("{T}/{holder}/abort")).send().await.unwrap(), 200).await;
    expect_problem(
        app.request(Method::POST, &format!("{T}/{id}/abort")).send().await.unwrap(),
        409,
        "already_committed",
    )
    .await;
    let page = expect(app.get(&format!("{T}?limit=1")).await, 200).await;
    let next = page["next"].as_str().unwrap();
    let page2 = expect(app.get(&format!("{T}?limit=1&after={next}")).await, 200).await;
    assert_eq!(page2["items"].as_array().unwrap().len(), 1);
    assert_ne!(page["items"][0]["id"], page2["items"][0]["id"]);
    expect_problem(app.get(&format!("{T}?status=weird")).await, 422, "validation_failed").await;
    app.stop().await;
}

async fn bank_transfers_conserve_money_and_count_versions(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| c.txn.lock_wait = Duration::from_millis(500)).await else {
        return;
    };
    const ACCOUNTS: usize = 12;
    const WORKERS: usize = 6;
    const TRANSFERS: usize = 10;
    for i in 0..ACCOUNTS {
        seed(&app, "bank", &format!("acc-{i}"), json!({"balance": 100})).await;
    }
    let app = Arc::new(app);
    let commits = Arc::new(std::sync::Mutex::new(HashMap::<String, i64>::new()));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let (app, commits) = (Arc::clone(&app), Arc::clone(&commits));
        workers.push(tokio::spawn(async move {
            let mut seed = (w as u64 + 1) * 7919;
            let mut next = move || {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (seed >> 33) as usize
            };
            for _ in 0..TRANSFERS {
                let from = format!("acc-{}", next() % ACCOUNTS);
                let mut to = format!("acc-{}", next() % ACCOUNTS);
                while to == from {
                    to = format!("acc-{}", next() % ACCOUNTS);
                }
                let amount = (next() % 20) as i64 + 1;
                for attempt in 0.. {
                    assert!(attempt < 200, "transfer never committed");
                    let (_, f) = read(&app, "bank", &from).await;
                    let (_, t) = read(&app, "bank", &to).await;
                    let body = json!({"actions": [
                        {"op": "update", "collection": "bank", "id": from, "if_version": f["version"], "inc": {"balance": -amount}},
                        {"op": "update", "collection": "bank", "id": to, "if_version": t["version"], "inc": {"balance": amount}},
                    ]});
                    let res = app.post(T, &body).await;
                    match res.status().as_u16() {
                        200 => {
                            let mut c = commits.lock().unwrap();
                            *c.entry(from.clone()).or_default() += 1;
                            *c.entry(to.clone()).or_default() += 1;
                            break;
                        }
                        409 => {
                            let p: Value = res.json().await.unwrap();
                            assert!(
                                p["retryable"] == true || p["code"] == "version_conflict",
                                "unexpected failure {p}"
                            );
                        }
                        other => panic!("unexpected status {other}: {}", res.text().await.unwrap()),
                    }
                }
            }
        }));
    }
    for w in workers {
        tokio::time::timeout(Duration::from_secs(240), w).await.expect("no deadlock: every worker finishes").unwrap();
    }
    let commits = commits.lock().unwrap().clone();
    let mut total = 0;
    for i in 0..ACCOUNTS {
        let id = format!("acc-{i}");
        let (_, acc) = read(&app, "bank", &id).await;
        total += acc["data"]["balance"].as_i64().unwrap();
        let touched = commits.get(&id).copied().unwrap_or(0);
        assert_eq!(
            acc["version"].as_i64(),
            Some(1 + touched),
            "{id}: version = 1 + committed transactions touching it"
        );
    }
    assert_eq!(total, 100 * ACCOUNTS as i64, "money is conserved");
    let ids: Vec<String> = (0..ACCOUNTS).map(|i| format!("acc-{i}")).collect();
    assert_unlocked(&app, "bank", &ids.iter().map(String::as_str).collect::<Vec<_>>()).await;
}

async fn older_transaction_wounds_a_younger_holder(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    seed(&app, "acc", "a", json!({"n": 1})).await;
    seed(&app, "acc", "b", json!({"n": 1})).await;
    let younger = txn_id_at(3600);
    app.store.insert(TXNS, held_record(&younger, &["b"]).to_record()).await.unwrap();
    lock(&app, "acc", "b", &younger).await;
    let body = json!({"actions": [
        {"op": "update", "collection": "acc", "id": "a", "inc": {"n": 1}},
        {"op": "update", "collection": "acc", "id": "b", "inc": {"n": 1}},
    ]});
    expect(app.post(T, &body).await, 200).await;
    let rec = TxnRecord::from_record(app.store.get(TXNS, &younger).await.unwrap().unwrap()).unwrap();
    assert!(matches!(rec.status, Status::Aborted | Status::RolledBack));
    assert_eq!(rec.abort_reason.as_deref(), Some("wounded"));
    let (_, b) = read(&app, "acc", "b").await;
    assert_eq!((b["version"].as_i64(), &b["data"]["n"]), (Some(2), &json!(2)), "the wounded change never applied");
    app.stop().await;
}

async fn younger_transaction_waits_for_an_older_holder_then_409(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    seed(&app, "acc", "a", json!({"n": 1})).await;
    let older = txn_id_at(-3600);
    app.store.insert(TXNS, held_record(&older, &["a"]).to_record()).await.unwrap();
    lock(&app, "acc", "a", &older).await;
    let body = json!({"actions": [{"op": "update", "collection": "acc", "id": "a", "inc": {"n": 1}}]});
    let started = std::time::Instant::now();
    let res = app.post(T, &body).await;
    assert_eq!(res.headers().get("retry-after").map(|v| v.to_str().unwrap()), Some("1"), "retryable: Retry-After");
    let p = expect_problem(res, 409, "locked").await;
    assert!(started.elapsed() >= app.config.txn.lock_wait, "waited for the lock first");
    assert_eq!(p["retryable"], true);
    assert_eq!(p["holder"], older);
    let rec = TxnRecord::from_record(app.store.get(TXNS, &older).await.unwrap().unwrap()).unwrap();
    assert_eq!(rec.status, Status::Pending, "the older holder is never wounded by a younger one");
    app.stop().await;
}

async fn opposite_lock_orders_never_deadlock(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| c.txn.lock_wait = Duration::from_millis(500)).await else {
        return;
    };
    seed(&app, "acc", "x", json!({"n": 0})).await;
    seed(&app, "acc", "y", json!({"n": 0})).await;
    let app = Arc::new(app);
    let mut tasks = Vec::new();
    for i in 0..12 {
        let app = Arc::clone(&app);
        tasks.push(tokio::spawn(async move {
            let (first, second) = if i % 2 == 0 { ("x", "y") } else { ("y", "x") };
            let body = json!({"actions": [
                {"op": "update", "collection": "acc", "id": first, "inc": {"n": 1}},
                {"op": "update", "collection": "acc", "id": second, "inc": {"n": 1}},
            ]});
            for _ in 0..200 {
                let res = app.post(T, &body).await;
                if res.status() == 200 {
                    return;
                }
                let p: Value = res.json().await.unwrap();
                assert_eq!(p["retryable"], true, "{p}");
            }
            panic!("never committed");
        }));
    }
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(120), t).await.expect("no deadlock").unwrap();
    }
    for id in ["x", "y"] {
        let (_, d) = read(&app, "acc", id).await;
        assert_eq!((d["data"]["n"].as_i64(), d["version"].as_i64()), (Some(12), Some(13)));
    }
}

async fn a_waiting_transaction_holds_only_locks_below_the_one_it_waits_for(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| c.txn.lock_wait = Duration::from_secs(10)).await else {
        return;
    };
    for id in ["a", "b", "c"] {
        seed(&app, "acc", id, json!({"n": 1})).await;
    }
    let older = txn_id_at(-3600);
    app.store.insert(TXNS, held_record(&older, &["b"]).to_record()).await.unwrap();
    lock(&app, "acc", "b", &older).await;
    let app = Arc::new(app);
    let body = json!({"actions": [
        {"op": "update", "collection": "acc", "id": "c", "inc": {"n": 1}},
        {"op": "update", "collection": "acc", "id": "b", "inc": {"n": 1}},
        {"op": "update", "collection": "acc", "id": "a", "inc": {"n": 1}},
    ]});
    let client = Arc::clone(&app);
    let txn = tokio::spawn(async move { expect(client.post(T, &body).await, 200).await });
    // While it waits for b: a (below b) stays locked, c (above b) is given back.
    let holder_of = |id: &'static str| {
        let app = Arc::clone(&app);
        async move {
            let rec = app.store.get("acc", id).await.unwrap().unwrap();
            StoredDoc::from_record(rec).unwrap().meta.txn
        }
    };
    app.until("a locked and c free while the transaction waits for b", async || {
        holder_of("a").await.is_some() && holder_of("c").await.is_none()
    })
    .await;
    assert_ne!(holder_of("a").await.as_deref(), Some(older.as_str()));
    assert_eq!(holder_of("b").await.as_deref(), Some(older.as_str()), "the older holder is not wounded");
    // The older holder aborts: the waiter takes b, then c, and commits.
    let set = doc! {"status": "aborted", "abort_reason": "test"};
    assert!(app.store.update(TXNS, &older, doc! {"status": "pending"}, Update::set(set)).await.unwrap());
    let out = tokio::time::timeout(Duration::from_secs(20), txn).await.expect("commits").unwrap();
    assert_eq!(out["status"], "committed");
    for id in ["a", "b", "c"] {
        let (_, d) = read(&app, "acc", id).await;
        assert_eq!((d["data"]["n"].as_i64(), d["version"].as_i64()), (Some(2), Some(2)), "{id}");
    }
    assert_unlocked(&app, "acc", &["a", "b", "c"]).await;
}

async fn a_wounded_transaction_is_retried_with_its_age(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| c.txn.lock_wait = Duration::from_secs(10)).await else {
        return;
    };
    seed(&app, "acc", "a", json!({"n": 1})).await;
    let older = txn_id_at(-3600);
    app.store.insert(TXNS, held_record(&older, &["a"]).to_record()).await.unwrap();
    lock(&app, "acc", "a", &older).await;
    let app = Arc::new(app);
    let client = Arc::clone(&app);
    let body = json!({"actions": [{"op": "update", "collection": "acc", "id": "a", "inc": {"n": 1}}]});
    let txn = tokio::spawn(async move { expect(client.post(T, &body).await, 200).await });
    // The transaction waits for the older holder; find its record.
    let pending = async |but: &[&str]| {
        let page = expect(app.get(&format!("{T}?status=pending")).await, 200).await;
        page["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .find(|id| !but.contains(&id.as_str()))
    };
    let mut first = None;
    app.until("the waiting transaction has a pending record", async || {
        first = pending(&[&older]).await;
        first.is_some()
    })
    .await;
    let first = first.expect("found");
    // Another instance's older transaction wounds it (as a store write, so
    // no in-process signal helps).
    let set = doc! {"status": "aborted", "abort_reason": "wounded"};
    assert!(app.store.update(TXNS, &first, doc! {"status": "pending"}, Update::set(set)).await.unwrap());
    // It sees the wound and waits again as a new attempt.
    app.until("the wounded transaction waits again as a new attempt", async || {
        pending(&[&older, &first]).await.is_some()
    })
    .await;
    // Then the holder goes away; the retry commits.
    let set = doc! {"status": "aborted", "abort_reason": "test"};
    assert!(app.store.update(TXNS, &older, doc! {"status": "pending"}, Update::set(set)).await.unwrap());
    let out = tokio::time::timeout(Duration::from_secs(20), txn).await.expect("commits").unwrap();
    let retry = out["id"].as_str().unwrap();
    assert_ne!(retry, first, "a new attempt");
    assert_eq!(
        txgate::testing::txn::age::txn_age(retry).0,
        txgate::testing::txn::age::txn_age(&first).0,
        "with the first attempt's age"
    );
    let (_, a) = read(&app, "acc", "a").await;
    assert_eq!((a["data"]["n"].as_i64(), a["version"].as_i64()), (Some(2), Some(2)));
    let rec = expect(app.get(&format!("{T}/{first}")).await, 200).await;
    assert_eq!(rec["abort_reason"], "wounded");
}

/// A JSON body with a member name twice, anywhere, is 422
/// `validation_failed` naming its pointer, on every endpoint that takes a
/// body, and nothing is written.
async fn duplicate_member_names_are_refused_on_every_body(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    seed(&app, "acc", "a", json!({"n": 1})).await;
    let send = |method: Method, path: String, content_type: &'static str, body: &'static str| {
        app.request(method, &path).header("content-type", content_type).body(body).send()
    };
    let a = doc_url("acc", "a");
    let docs = "/v1/collections/acc/documents".to_owned();
    let cases = [
        (
            Method::POST,
            T.to_owned(),
            "application/json",
            r#"{"actions":[{"op":"update","collection":"acc","id":"a","inc":{"n":1}}],"hooks":[{"url":"http://127.0.0.1:9/x","url":"http://127.0.0.1:9/y"}]}"#,
            "/hooks/0/url",
        ),
        (
            Method::POST,
            T.to_owned(),
            "application/json",
            r#"{"actions":[{"op":"update","collection":"acc","id":"a","inc":{"n":1}}],"hooks":[],"hooks":[{"url":"http://127.0.0.1:9/x"}]}"#,
            "/hooks",
        ),
        (Method::POST, docs.clone(), "application/json", r#"{"_id":"b","n":1,"n":2}"#, "/n"),
        (Method::PUT, a.clone(), "application/json", r#"{"n":{"x":1,"x":2}}"#, "/n/x"),
        (Method::PATCH, a.clone(), "application/json", r#"{"inc":{"n":1},"inc":{"n":5}}"#, "/inc"),
        (Method::PATCH, a.clone(), "application/merge-patch+json", r#"{"n":2,"n":3}"#, "/n"),
    ];
    for (method, path, content_type, body, pointer) in cases {
        let p = expect_problem(
            send(method.clone(), path.clone(), content_type, body).await.unwrap(),
            422,
            "validation_failed",
        )
        .await;
        assert_eq!(p["errors"][0]["pointer"], pointer, "{method} {path}: {p}");
    }
    let (_, a) = read(&app, "acc", "a").await;
    assert_eq!((a["version"].as_i64(), &a["data"]["n"]), (Some(1), &json!(1)), "nothing written");
    assert_eq!(read(&app, "acc", "b").await.0, 404);
    let listed = expect(app.get(T).await, 200).await;
    assert_eq!(listed["items"], json!([]), "no transaction was started");
    app.stop().await;
}
