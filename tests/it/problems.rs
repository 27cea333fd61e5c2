//! Problem bodies as clients see them, one or more of every family, kept
//! in `tests/fixtures/problems.json`: a change to how problems are built
//! must answer the same bodies (members compared as JSON, in any order;
//! times and generated ids written as `<time>` and `<id>`). After a change
//! of the contract itself, write the file again with
//! `TXGATE_BLESS_PROBLEMS=1 cargo test --test it problems::`.

use reqwest::Method;
use serde_json::{Map, Value, json};

use crate::support::{Backend, TestApp};

const D: &str = "/v1/collections/p/documents";

/// `value` with times and generated ids replaced by placeholders.
fn normalized(value: Value) -> Value {
    match value {
        Value::String(s) => {
            let time = s.len() >= 20 && s.as_bytes()[4] == b'-' && s.as_bytes()[10] == b'T';
            let id = uuid::Uuid::parse_str(&s).is_ok();
            Value::String(if time {
                "<time>".into()
            } else if id {
                "<id>".into()
            } else {
                s
            })
        }
        Value::Array(items) => Value::Array(items.into_iter().map(normalized).collect()),
        Value::Object(map) => Value::Object(map.into_iter().map(|(k, v)| (k, normalized(v))).collect()),
        other => other,
    }
}

async fn answer(res: reqwest::Response) -> Value {
    let status = res.status().as_u16();
    let body: Value = res.json().await.expect("a JSON body");
    assert!(status >= 400, "a problem: {status} {body}");
    json!({"status": status, "body": normalized(body)})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_of_problem_answers_its_recorded_body() {
    let app = TestApp::spawn_with(Backend::Embedded, |c| {
        c.api_keys =
            txgate::testing::keys::parse_keys("admin-key-0123456789:admin, reader-key-0123456789:read@p").unwrap();
    })
    .await
    .expect("an embedded gateway");
    let admin = |method: Method, path: &str| app.request(method, path).bearer_auth("admin-key-0123456789");
    let mut got = Map::new();
    let mut record = async |name: &str, res: reqwest::Response| {
        got.insert(name.to_owned(), answer(res).await);
    };
    for (id, n) in [("a", 1), ("b", 2), ("gone", 3)] {
        let res = admin(Method::POST, D).json(&json!({"_id": id, "n": n, "email": format!("{id}@example.com")}));
        assert_eq!(res.send().await.unwrap().status(), 201);
    }
    assert_eq!(admin(Method::DELETE, &format!("{D}/gone")).send().await.unwrap().status(), 204);
    let put = admin(Method::PUT, "/v1/collections/p/indexes/email").json(&json!({"fields": ["email"], "unique": true}));
    assert_eq!(put.send().await.unwrap().status(), 201);
    app.advance(txgate::testing::indexes::GRACE);
    app.run_once("index_builds").await;
    let index: Value =
        admin(Method::GET, "/v1/collections/p/indexes/email").send().await.unwrap().json().await.unwrap();
    assert_eq!(index["state"], "ready", "{index}");

    let body = |text: &str| admin(Method::POST, D).header("content-type", "application/json").body(text.to_owned());
    record("validation_failed: a member twice", body(r#"{"a": 1, "a": 2}"#).send().await.unwrap()).await;
    record("validation_failed: not an object", body("[1]").send().await.unwrap()).await;
    record("not_found", admin(Method::GET, &format!("{D}/missing")).send().await.unwrap()).await;
    record("deleted", admin(Method::GET, &format!("{D}/gone")).send().await.unwrap()).await;
    record("already_exists", admin(Method::POST, D).json(&json!({"_id": "a"})).send().await.unwrap()).await;
    let stale = admin(Method::PUT, &format!("{D}/a")).header("if-match", "\"9\"").json(&json!({"n": 5}));
    record("version_conflict, explained", stale.send().await.unwrap()).await;
    let minimal = admin(Method::PUT, &format!("{D}/a"))
        .header("if-match", "\"9\"")
        .header("prefer", "return=minimal")
        .json(&json!({"n": 5}));
    record("version_conflict, minimal", minimal.send().await.unwrap()).await;
    record("duplicate", admin(Method::POST, D).json(&json!({"email": "a@example.com"})).send().await.unwrap()).await;
    let unserved = admin(Method::POST, "/v1/collections/p/query").json(&json!({"filter": {"n": 1}}));
    record("index_required", unserved.send().await.unwrap()).await;
    let bad_filter = admin(Method::GET, D).query(&[("filter", r#"{"n": {"$where": 1}}"#)]);
    record("invalid_filter", bad_filter.send().await.unwrap()).await;
    let txn = |actions: Value| admin(Method::POST, "/v1/transactions").json(&json!({ "actions": actions }));
    let missing = json!([{"op": "update", "collection": "p", "id": "a", "set": {"n": 3}},
                         {"op": "update", "collection": "p", "id": "nobody", "set": {"n": 3}}]);
    record("aborted: not_found", txn(missing).send().await.unwrap()).await;
    let twice = json!([{"op": "update", "collection": "p", "id": "a", "set": {"n": 3}},
                       {"op": "delete", "collection": "p", "id": "a"}]);
    record("duplicate_member", txn(twice).send().await.unwrap()).await;
    let taken = json!([{"op": "insert", "collection": "p", "data": {"email": "b@example.com"}}]);
    record("duplicate in a transaction", txn(taken).send().await.unwrap()).await;
    let hook = admin(Method::POST, "/v1/transactions").json(&json!({
        "actions": [{"op": "update", "collection": "p", "id": "a", "set": {"n": 3}}],
        "hooks": [{"url": "http://10.0.0.1/hook"}],
    }));
    record("hook_not_allowed", hook.send().await.unwrap()).await;
    let reader = |method: Method, path: &str| app.request(method, path).bearer_auth("reader-key-0123456789");
    record("forbidden: a collection", reader(Method::POST, D).json(&json!({})).send().await.unwrap()).await;
    record("forbidden: every collection", reader(Method::GET, "/v1/deliveries").send().await.unwrap()).await;
    record("unauthorized", app.request(Method::GET, D).send().await.unwrap()).await;
    let batch = admin(Method::POST, "/v1/reads").json(&json!({"documents": [{"collection": "p", "id": "nobody"}]}));
    let batch = batch.send().await.unwrap();
    assert_eq!(batch.status(), 200);
    let batch: Value = batch.json().await.unwrap();
    got.insert("a batch read's member".into(), normalized(batch));
    app.stop().await;

    let got = Value::Object(got);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/problems.json");
    if std::env::var_os("TXGATE_BLESS_PROBLEMS").is_some() {
        std::fs::write(&path, serde_json::to_string_pretty(&got).unwrap() + "\n").unwrap();
        return;
    }
    let want: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("the recorded bodies")).unwrap();
    for (name, body) in want.as_object().unwrap() {
        assert_eq!(got.get(name), Some(body), "{name}");
    }
    assert_eq!(got, want);
}
