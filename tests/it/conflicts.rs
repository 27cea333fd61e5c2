//! Conflicts that explain themselves, over real HTTP on both backends: a
//! `version_conflict` carries the document now and the changes since the
//! version expected (who made them, what they changed), for single writes
//! and transaction members, one and thirty versions behind and after the
//! log was purged; `Prefer: return=minimal` leaves them out; the merge
//! helper merges disjoint, overlapping and nested changes and answers for
//! deleted and re-created documents, writing nothing.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use txgate::config::Config;
use txgate::testing::keys::parse_keys;

use crate::support::{Backend, TestApp, expect, expect_problem};

crate::on_both_backends!(
    a_stale_single_write_is_told_what_changed_and_by_whom,
    a_stale_transaction_member_is_told_what_changed,
    thirty_versions_behind_lists_thirty_changes,
    changes_the_log_no_longer_holds_are_marked_truncated,
    large_documents_explain_their_latest_changes_within_a_bounded_read,
    the_merge_helper_merges_and_writes_nothing,
    the_merge_helper_answers_for_deleted_and_recreated_documents,
);

const ALICE: &str = "alice-key-0123456789abcdef";
const BOB: &str = "bob-key-0123456789abcdef";
const NOREAD: &str = "other-key-0123456789abcdef";

fn keys(c: &mut Config) {
    c.api_keys =
        parse_keys(&format!("{ALICE}:write+name=alice,{BOB}:write+name=bob,{NOREAD}:write@elsewhere")).unwrap();
}

fn doc_url(id: &str) -> String {
    format!("/v1/collections/orders/documents/{id}")
}

async fn send(
    app: &TestApp,
    key: &str,
    method: Method,
    path: impl AsRef<str>,
    body: Option<Value>,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = app.request(method, path.as_ref()).bearer_auth(key);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(body) = body {
        req = req.json(&body);
    }
    req.send().await.unwrap()
}

async fn patch(app: &TestApp, key: &str, id: &str, set: Value) -> Value {
    expect(send(app, key, Method::PATCH, doc_url(id), Some(json!({"set": set})), &[]).await, 200).await
}

async fn a_stale_single_write_is_told_what_changed_and_by_whom(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, keys).await else { return };
    let body = json!({"_id": "o1", "status": "new", "total": 10, "addr": {"city": "Oslo"}});
    expect(send(&app, ALICE, Method::POST, "/v1/collections/orders/documents", Some(body), &[]).await, 201).await;
    // Bob changes it twice: a nested field added and one changed, then one removed.
    patch(&app, BOB, "o1", json!({"status": "paid", "addr.zip": "0150"})).await;
    expect(send(&app, BOB, Method::PATCH, doc_url("o1"), Some(json!({"unset": ["total"]})), &[]).await, 200).await;
    // Alice saves from version 1.
    let stale =
        send(&app, ALICE, Method::PUT, doc_url("o1"), Some(json!({"status": "cancelled"})), &[("if-match", "\"1\"")]);
    let problem = expect_problem(stale.await, 409, "version_conflict").await;
    assert_eq!((&problem["expected"], &problem["actual"]), (&json!(1), &json!(3)));
    let current = &problem["current"];
    assert_eq!(current["version"], 3);
    assert_eq!(current["data"], json!({"status": "paid", "addr": {"city": "Oslo", "zip": "0150"}}));
    let changes = problem["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 2, "{problem}");
    assert_eq!(problem["changes_truncated"], false);
    assert_eq!(changes[0]["version"], 2);
    assert_eq!(changes[0]["key"], "bob");
    assert_eq!(changes[0]["transaction"], Value::Null);
    assert_eq!(changes[0]["type"], "document.updated");
    assert_eq!(changes[0]["added"], json!(["addr.zip"]));
    assert_eq!(changes[0]["changed"], json!(["status"]));
    assert_eq!(changes[0]["removed"], json!([]));
    assert_eq!(changes[1]["version"], 3);
    assert_eq!(changes[1]["removed"], json!(["total"]));
    assert!(changes[1]["at"].as_str().is_some_and(|at| at.ends_with('Z')));
    // Nothing was written.
    let now = expect(send(&app, ALICE, Method::GET, doc_url("o1"), None, &[]).await, 200).await;
    assert_eq!(now["version"], 3);
    // The events record the key too.
    let events = expect(
        send(&app, ALICE, Method::GET, "/v1/events?after=0", None, &[("accept", "application/json")]).await,
        200,
    )
    .await;
    let keys: Vec<&Value> = events["items"].as_array().unwrap().iter().map(|e| &e["key"]).collect();
    assert_eq!(keys, [&json!("alice"), &json!("bob"), &json!("bob")]);
    // A minimal answer, as asked (RFC 7240), for every write kind.
    for (method, body) in [
        (Method::PUT, Some(json!({"status": "x"}))),
        (Method::PATCH, Some(json!({"set": {"status": "x"}}))),
        (Method::DELETE, None),
    ] {
        let res = send(
            &app,
            ALICE,
            method.clone(),
            doc_url("o1"),
            body,
            &[("if-match", "\"2\""), ("prefer", "return=minimal")],
        );
        let problem = expect_problem(res.await, 409, "version_conflict").await;
        assert!(problem.get("current").is_none() && problem.get("changes").is_none(), "{method}: {problem}");
        assert_eq!((&problem["expected"], &problem["actual"]), (&json!(2), &json!(3)));
    }
    // Without Prefer, a delete's and a patch's conflicts explain themselves too.
    let res = send(&app, ALICE, Method::DELETE, doc_url("o1"), None, &[("if-match", "\"2\"")]);
    let problem = expect_problem(res.await, 409, "version_conflict").await;
    assert_eq!(problem["changes"].as_array().unwrap().len(), 1);
    assert_eq!(problem["current"]["version"], 3);
}

async fn a_stale_transaction_member_is_told_what_changed(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, keys).await else { return };
    for id in ["a", "b"] {
        let body = json!({"_id": id, "n": 0});
        expect(send(&app, ALICE, Method::POST, "/v1/collections/orders/documents", Some(body), &[]).await, 201).await;
    }
    // Bob changes b in a transaction.
    let txn = json!({"actions": [{"op": "update", "collection": "orders", "id": "b", "set": {"n": 5, "note": "bob"}}]});
    let committed = expect(send(&app, BOB, Method::POST, "/v1/transactions", Some(txn), &[]).await, 200).await;
    let bobs = committed["id"].as_str().unwrap().to_owned();
    let txn = json!({"actions": [
        {"op": "update", "collection": "orders", "id": "a", "if_version": 1, "set": {"n": 1}},
        {"op": "update", "collection": "orders", "id": "b", "if_version": 1, "set": {"n": 1}},
    ]});
    let problem = expect_problem(
        send(&app, ALICE, Method::POST, "/v1/transactions", Some(txn.clone()), &[]).await,
        409,
        "version_conflict",
    )
    .await;
    assert_eq!((&problem["action"], &problem["id"]), (&json!(1), &json!("b")));
    assert_eq!(problem["current"]["data"], json!({"n": 5, "note": "bob"}));
    let changes = problem["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{problem}");
    assert_eq!(changes[0]["transaction"], json!(bobs));
    assert_eq!(changes[0]["key"], "bob");
    assert_eq!(changes[0]["added"], json!(["note"]));
    assert_eq!(changes[0]["changed"], json!(["n"]));
    let res = send(&app, ALICE, Method::POST, "/v1/transactions", Some(txn.clone()), &[("prefer", "return=minimal")]);
    let problem = expect_problem(res.await, 409, "version_conflict").await;
    assert!(problem.get("current").is_none() && problem.get("changes").is_none(), "{problem}");
    // Nothing of it was written.
    let a = expect(send(&app, ALICE, Method::GET, doc_url("a"), None, &[]).await, 200).await;
    assert_eq!(a["version"], 1);
}

async fn thirty_versions_behind_lists_thirty_changes(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, keys).await else { return };
    let body = json!({"_id": "c", "n": 0});
    expect(send(&app, ALICE, Method::POST, "/v1/collections/orders/documents", Some(body), &[]).await, 201).await;
    for i in 1..=30 {
        let key = if i % 2 == 0 { ALICE } else { BOB };
        patch(&app, key, "c", json!({"n": i, format!("f{i}"): true})).await;
    }
    let stale =
        send(&app, ALICE, Method::PATCH, doc_url("c"), Some(json!({"set": {"n": -1}})), &[("if-match", "\"1\"")]);
    let problem = expect_problem(stale.await, 409, "version_conflict").await;
    let changes = problem["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 30);
    assert_eq!(problem["changes_truncated"], false);
    for (i, change) in changes.iter().enumerate() {
        let i = i + 1;
        assert_eq!(change["version"], json!(i + 1));
        assert_eq!(change["key"], if i % 2 == 0 { "alice" } else { "bob" });
        assert_eq!(change["added"], json!([format!("f{i}")]));
        assert_eq!(change["changed"], json!(["n"]));
    }
    // A key that may not read the collection is told no more than before.
    let res = send(&app, NOREAD, Method::GET, doc_url("c"), None, &[]).await;
    assert_eq!(res.status(), 403);
    // More than 50 versions behind: the latest 50, marked truncated.
    for i in 31..=60 {
        patch(&app, BOB, "c", json!({"n": i})).await;
    }
    let stale =
        send(&app, ALICE, Method::PATCH, doc_url("c"), Some(json!({"set": {"n": -1}})), &[("if-match", "\"1\"")]);
    let problem = expect_problem(stale.await, 409, "version_conflict").await;
    let changes = problem["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 50);
    assert_eq!(problem["changes_truncated"], true);
    assert_eq!(changes[0]["version"], 12);
    assert_eq!(changes[49]["version"], 61);
}

/// A stale write to a large document with many versions is explained by
/// its latest changes only, as many as 16 MiB of the log's events hold:
/// the explanation's work does not grow with size times versions.
async fn large_documents_explain_their_latest_changes_within_a_bounded_read(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| {
        keys(c);
        c.max_body_bytes = 4 << 20;
    })
    .await
    else {
        return;
    };
    let pad = "x".repeat(2_000_000);
    let body = json!({"_id": "big", "n": 0, "pad": pad});
    expect(send(&app, ALICE, Method::POST, "/v1/collections/orders/documents", Some(body), &[]).await, 201).await;
    for i in 1..=12 {
        patch(&app, BOB, "big", json!({"n": i})).await;
    }
    let stale =
        send(&app, ALICE, Method::PATCH, doc_url("big"), Some(json!({"set": {"n": -1}})), &[("if-match", "\"1\"")]);
    let problem = expect_problem(stale.await, 409, "version_conflict").await;
    assert_eq!(problem["changes_truncated"], true, "{}", problem["changes"]);
    let changes = problem["changes"].as_array().unwrap();
    // 16 MiB of events of 2 MB each: eight read, the latest seven changes
    // told (each needs the version before it).
    assert!(!changes.is_empty() && changes.len() <= 8, "{} changes", changes.len());
    let versions: Vec<i64> = changes.iter().map(|c| c["version"].as_i64().unwrap()).collect();
    let latest: Vec<i64> = (14 - versions.len() as i64..=13).collect();
    assert_eq!(versions, latest, "the latest, in order");
    for change in changes {
        assert_eq!(change["changed"], json!(["n"]), "{change}");
    }
    // A few versions behind, within the bound: every change, not truncated.
    let stale =
        send(&app, ALICE, Method::PATCH, doc_url("big"), Some(json!({"set": {"n": -1}})), &[("if-match", "\"10\"")]);
    let problem = expect_problem(stale.await, 409, "version_conflict").await;
    assert_eq!(problem["changes_truncated"], false);
    let versions: Vec<i64> =
        problem["changes"].as_array().unwrap().iter().map(|c| c["version"].as_i64().unwrap()).collect();
    assert_eq!(versions, [11, 12, 13]);
}

async fn changes_the_log_no_longer_holds_are_marked_truncated(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| {
        keys(c);
        c.events.retention = Duration::from_secs(1);
    })
    .await
    else {
        return;
    };
    let body = json!({"_id": "p", "n": 0});
    expect(send(&app, ALICE, Method::POST, "/v1/collections/orders/documents", Some(body), &[]).await, 201).await;
    patch(&app, BOB, "p", json!({"n": 1})).await;
    app.settled().await;
    app.advance(Duration::from_millis(1300));
    patch(&app, BOB, "p", json!({"n": 2, "late": true})).await;
    // The purge of the first two events (once the log's changes are counted).
    app.run_once("ttl").await;
    app.run_once("event_purge").await;
    let res = send(&app, ALICE, Method::GET, "/v1/events?after=0", None, &[("accept", "application/json")]).await;
    assert_eq!(res.status(), 410, "old events were not purged");
    let stale =
        send(&app, ALICE, Method::PATCH, doc_url("p"), Some(json!({"set": {"n": -1}})), &[("if-match", "\"1\"")]);
    let problem = expect_problem(stale.await, 409, "version_conflict").await;
    assert_eq!(problem["changes_truncated"], true, "{problem}");
    let changes = problem["changes"].as_array().unwrap();
    // Version 2's event is gone; version 3's is there, but what it changed
    // cannot be told without version 2's.
    assert_eq!(changes.len(), 1, "{problem}");
    assert_eq!(changes[0]["version"], 3);
    assert_eq!(changes[0]["key"], "bob");
    assert_eq!(changes[0]["added"], Value::Null);
    assert_eq!(problem["current"]["data"], json!({"n": 2, "late": true}));
    // The merge helper cannot start from a version the log lost.
    let res = send(
        &app,
        ALICE,
        Method::POST,
        format!("{}/merge", doc_url("p")),
        Some(json!({"base_version": 1, "mine": {"n": 9}})),
        &[],
    );
    expect_problem(res.await, 410, "base_unavailable").await;
}

async fn merge(app: &TestApp, id: &str, base: i64, mine: Value) -> Value {
    let body = json!({"base_version": base, "mine": mine});
    expect(send(app, ALICE, Method::POST, format!("{}/merge", doc_url(id)), Some(body), &[]).await, 200).await
}

async fn the_merge_helper_merges_and_writes_nothing(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, keys).await else { return };
    let base = json!({"_id": "m", "title": "t", "qty": 1, "addr": {"city": "Oslo", "zip": "1"}, "tags": ["a"]});
    expect(send(&app, ALICE, Method::POST, "/v1/collections/orders/documents", Some(base), &[]).await, 201).await;
    patch(&app, BOB, "m", json!({"qty": 2, "addr.zip": "2", "tags": ["b"]})).await;
    // Disjoint and nested: mine changes the city and the title.
    let mine = json!({"title": "T", "qty": 1, "addr": {"city": "Bergen", "zip": "1"}, "tags": ["a"]});
    let merged = merge(&app, "m", 1, mine).await;
    assert_eq!(merged["version"], 2);
    assert_eq!(merged["deleted"], false);
    assert_eq!(
        merged["merged"],
        json!({"title": "T", "qty": 2, "addr": {"city": "Bergen", "zip": "2"}, "tags": ["b"]})
    );
    assert_eq!(merged["mine"], json!(["addr.city", "title"]));
    assert_eq!(merged["theirs"], json!(["addr.zip", "qty", "tags"]));
    assert_eq!(merged["conflicts"], json!([]));
    // Overlapping: both changed qty and tags (arrays are whole values).
    let mine = json!({"title": "t", "qty": 7, "addr": {"city": "Oslo", "zip": "1"}, "tags": ["a", "c"]});
    let merged = merge(&app, "m", 1, mine).await;
    assert_eq!(
        merged["conflicts"],
        json!([
            {"path": "qty", "base": 1, "mine": 7, "theirs": 2},
            {"path": "tags", "base": ["a"], "mine": ["a", "c"], "theirs": ["b"]},
        ])
    );
    assert_eq!(merged["merged"]["qty"], 2, "a conflict keeps the current value");
    // Nothing was written; the merged data saves at the current version.
    let now = expect(send(&app, ALICE, Method::GET, doc_url("m"), None, &[]).await, 200).await;
    assert_eq!(now["version"], 2);
    let mut data = merged["merged"].clone();
    data["qty"] = json!(7);
    let saved = send(&app, ALICE, Method::PUT, doc_url("m"), Some(data.clone()), &[("if-match", "\"2\"")]);
    let saved = expect(saved.await, 200).await;
    assert_eq!((&saved["version"], &saved["data"]), (&json!(3), &data));
    // JSON has one number type: an integral 1.0 is the version 1.
    let body = json!({"base_version": 1.0, "mine": {"title": "t", "qty": 7}});
    let same = expect(send(&app, ALICE, Method::POST, format!("{}/merge", doc_url("m")), Some(body), &[]).await, 200);
    assert_eq!(same.await["base_version"], 1);
    // Bad requests.
    for body in [
        json!({"base_version": -1, "mine": {}}),
        json!({"base_version": 1.5, "mine": {}}),
        json!({"base_version": null, "mine": {}}),
        json!({"base_version": 1}),
        json!({"base_version": 1, "mine": {"_x": 1}}),
    ] {
        let res = send(&app, ALICE, Method::POST, format!("{}/merge", doc_url("m")), Some(body), &[]).await;
        expect_problem(res, 422, "validation_failed").await;
    }
    // A base after the current version: the client's version is not the document's.
    let body = json!({"base_version": 9, "mine": {}});
    let res = send(&app, ALICE, Method::POST, format!("{}/merge", doc_url("m")), Some(body), &[]).await;
    let ahead = expect_problem(res, 409, "version_conflict").await;
    assert_eq!((&ahead["expected"], &ahead["actual"]), (&json!(9), &json!(3)));
    let res = send(
        &app,
        ALICE,
        Method::POST,
        format!("{}/merge", doc_url("nope")),
        Some(json!({"base_version": 1, "mine": {}})),
        &[],
    );
    expect_problem(res.await, 404, "not_found").await;
    let res = send(
        &app,
        NOREAD,
        Method::POST,
        format!("{}/merge", doc_url("m")),
        Some(json!({"base_version": 1, "mine": {}})),
        &[],
    );
    assert_eq!(res.await.status(), 403);
}

async fn the_merge_helper_answers_for_deleted_and_recreated_documents(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, keys).await else { return };
    let body = json!({"_id": "d", "a": 1, "b": 1});
    expect(send(&app, ALICE, Method::POST, "/v1/collections/orders/documents", Some(body), &[]).await, 201).await;
    expect(send(&app, BOB, Method::DELETE, doc_url("d"), None, &[]).await, 204).await;
    let merged = merge(&app, "d", 1, json!({"a": 2, "b": 1})).await;
    assert_eq!((&merged["deleted"], &merged["version"], &merged["current"]), (&json!(true), &json!(2), &Value::Null));
    assert_eq!(merged["conflicts"], json!([{"path": "a", "base": 1, "mine": 2}]));
    assert_eq!(merged["theirs"], json!(["b"]));
    // A stale write to the deleted document is 410, as before.
    let res = send(&app, ALICE, Method::PUT, doc_url("d"), Some(json!({"a": 2})), &[("if-match", "\"1\"")]);
    expect_problem(res.await, 410, "deleted").await;
    // Re-created by Bob: the merge is against the new document.
    let body = json!({"_id": "d", "a": 1, "c": 3});
    expect(send(&app, BOB, Method::POST, "/v1/collections/orders/documents", Some(body), &[]).await, 201).await;
    let merged = merge(&app, "d", 1, json!({"a": 2, "b": 1})).await;
    assert_eq!((&merged["deleted"], &merged["version"]), (&json!(false), &json!(3)));
    // b: unchanged by mine, gone from theirs; c: new in theirs.
    assert_eq!(merged["merged"], json!({"a": 2, "c": 3}));
    assert_eq!((&merged["mine"], &merged["theirs"]), (&json!(["a"]), &json!(["b", "c"])));
    // And a write from version 1 is told about the delete and the re-creation.
    let res = send(&app, ALICE, Method::PUT, doc_url("d"), Some(json!({"a": 2})), &[("if-match", "\"1\"")]);
    let problem = expect_problem(res.await, 409, "version_conflict").await;
    let changes = problem["changes"].as_array().unwrap();
    let kinds: Vec<&str> = changes.iter().map(|c| c["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["document.deleted", "document.created"]);
    assert_eq!(changes[0]["removed"], json!(["a", "b"]));
    assert_eq!(changes[1]["added"], json!(["a", "c"]));
}
