//! Per-collection JSON Schemas over HTTP, on both stores: every write path
//! checks the document it would produce and refuses an invalid one with
//! 422 `schema_violation` pointing at each field, writing nothing; a
//! transaction fails whole at its first invalid action; `strict`, `warn`
//! and `moderate` judge a collection already holding invalid documents as
//! documented; a background pass lists those documents; hostile schemas
//! are refused or bounded, never a 5xx; under rules, 403/404 come first.

use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};
use txgate::testing::keys::parse_keys;

use crate::rules::{ADMIN, WRITER, gateway_with, ready_index, send, token};
use crate::support::{Backend, TestApp, TestReceiver, expect, expect_problem};
use crate::users::{Issuer, RSA_A};

crate::on_both_backends!(
    every_write_path_checks_the_document_it_would_produce,
    a_transaction_fails_whole_at_its_first_invalid_action,
    strict_warn_and_moderate_judge_documents_already_invalid,
    the_counters_count_each_write_once_however_often_it_was_checked,
    a_background_pass_lists_the_documents_that_do_not_satisfy_the_schema,
    hostile_schemas_are_refused_or_bounded,
    declarations_are_pending_then_active_and_counted_in_revisions,
    under_rules_refusals_come_first_and_set_fields_are_checked,
    a_declaration_on_one_instance_is_enforced_by_another_once_active,
    the_api_description_types_each_collections_documents,
    a_pass_whose_instance_stopped_is_taken_over_and_a_damaged_record_is_reported,
);

const DOCS: &str = "/v1/collections/orders/documents";

fn order_schema() -> Value {
    json!({
        "type": "object",
        "required": ["customer", "total"],
        "properties": {
            "customer": {"type": "string", "minLength": 1},
            "total": {"type": "number", "minimum": 0},
            "email": {"type": "string", "format": "email"},
            "lines": {"type": "array", "maxItems": 10, "items": {"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"}}}}
        },
        "additionalProperties": false
    })
}

/// Declare `schema` as version `version` of `coll` and let it become active.
async fn declare(app: &TestApp, coll: &str, version: i64, schema: &Value) -> Value {
    let path = format!("/v1/collections/{coll}/schemas/{version}");
    let out = expect(app.send_json(Method::PUT, &path, schema).await, 202).await;
    assert_eq!(out["state"], "pending", "{out}");
    app.advance(Duration::from_millis(2_300));
    let out = expect(app.get(&path).await, 200).await;
    assert_eq!(out["state"], "active", "{out}");
    out
}

fn doc_path(id: &str) -> String {
    format!("{DOCS}/{id}")
}

/// The 422's errors as (pointer, keyword) pairs.
fn errors(problem: &Value) -> Vec<(String, String)> {
    let list = problem["errors"].as_array().unwrap_or_else(|| panic!("errors in {problem}"));
    list.iter()
        .map(|e| {
            assert!(e["detail"].as_str().is_some_and(|d| !d.is_empty()), "{e}");
            (e["pointer"].as_str().unwrap().to_owned(), e["keyword"].as_str().unwrap().to_owned())
        })
        .collect()
}

fn pair(pointer: &str, keyword: &str) -> (String, String) {
    (pointer.to_owned(), keyword.to_owned())
}

async fn refused(response: reqwest::Response) -> Vec<(String, String)> {
    let problem = expect_problem(response, 422, "schema_violation").await;
    assert_eq!(problem["schema_version"], 1, "{problem}");
    errors(&problem)
}

/// The document as stored: its version and data.
async fn stored(app: &TestApp, id: &str) -> (i64, Value) {
    let doc = expect(app.get(&doc_path(id)).await, 200).await;
    (doc["version"].as_i64().unwrap(), doc["data"].clone())
}

async fn every_write_path_checks_the_document_it_would_produce(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    declare(&app, "orders", 1, &order_schema()).await;
    // Create: every error, each at its field.
    let bad = json!({"total": -1, "email": "nope", "lines": [{"sku": "abc"}, {}], "extra": 1});
    let found = refused(app.post(DOCS, &bad).await).await;
    for expected in [
        pair("/customer", "required"),
        pair("/total", "minimum"),
        pair("/email", "format"),
        pair("/lines/0/sku", "pattern"),
        pair("/lines/1/sku", "required"),
        pair("/extra", "additionalProperties"),
    ] {
        assert!(found.contains(&expected), "{expected:?} in {found:?}");
    }
    expect_problem(app.get(&doc_path("nobody")).await, 404, "not_found").await;
    let good = json!({"_id": "o1", "customer": "ada", "total": 10, "lines": [{"sku": "TEA-1"}]});
    expect(app.post(DOCS, &good).await, 201).await;
    let before = stored(&app, "o1").await;
    // Replace, patch (set, unset, inc on the result), merge patch.
    let replace = json!({"customer": "ada"});
    assert_eq!(
        refused(app.send_json(Method::PUT, &doc_path("o1"), &replace).await).await,
        [pair("/total", "required")]
    );
    for (patch, expected) in [
        (json!({"set": {"lines": [{"sku": "x"}]}}), pair("/lines/0/sku", "pattern")),
        (json!({"unset": ["customer"]}), pair("/customer", "required")),
        (json!({"inc": {"total": -11}}), pair("/total", "minimum")),
        (json!({"set": {"note": "hi"}}), pair("/note", "additionalProperties")),
    ] {
        let response = app.send_json(Method::PATCH, &doc_path("o1"), &patch).await;
        assert_eq!(refused(response).await, [expected], "{patch}");
    }
    let merge = app
        .request(Method::PATCH, &doc_path("o1"))
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"customer": null, "email": "nope"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(refused(merge).await, [pair("/customer", "required"), pair("/email", "format")]);
    // Nothing was written by any of them.
    assert_eq!(stored(&app, "o1").await, before);
    // A write of a version with no schema is refused while there are schemas.
    let v2 = app.post(&format!("{DOCS}?schema_version=2"), &json!({"anything": true})).await;
    let problem = expect_problem(v2, 422, "schema_violation").await;
    assert_eq!(errors(&problem), [pair("", "schema_version")]);
    // Valid writes go through, on every path.
    let patched = app.send_json(Method::PATCH, &doc_path("o1"), &json!({"inc": {"total": -10}})).await;
    assert_eq!(expect(patched, 200).await["data"]["total"], 0);
    // The merge helper writes nothing and says what a write of its result would meet.
    let mine = json!({"base_version": 2, "mine": {"customer": "", "total": 0, "lines": [{"sku": "TEA-1"}]}});
    let merged = expect(app.post(&format!("{}/merge", doc_path("o1")), &mine).await, 200).await;
    let schema_errors: Vec<(String, String)> = merged["schema_errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["pointer"].as_str().unwrap().to_owned(), e["keyword"].as_str().unwrap().to_owned()))
        .collect();
    assert_eq!(schema_errors, [pair("/customer", "minLength")]);
    let fine = json!({"base_version": 2, "mine": {"customer": "bo", "total": 0}});
    let merged = expect(app.post(&format!("{}/merge", doc_path("o1")), &fine).await, 200).await;
    assert_eq!(merged["schema_errors"], json!([]));
    // Refusals are counted.
    let metrics = app.get("/metrics").await.text().await.unwrap();
    let refusals = metrics.lines().find(|l| l.starts_with("txgate_schema_refusals_total ")).expect("the counter");
    assert!(refusals.split(' ').nth(1).unwrap().parse::<f64>().unwrap() >= 8.0, "{refusals}");
    app.stop().await;
}

async fn a_transaction_fails_whole_at_its_first_invalid_action(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    declare(&app, "orders", 1, &order_schema()).await;
    expect(app.post(DOCS, &json!({"_id": "o1", "customer": "ada", "total": 5})).await, 201).await;
    let action = |op: &str, id: &str, rest: Value| {
        let mut a = json!({"op": op, "collection": "orders", "id": id});
        a.as_object_mut().unwrap().extend(rest.as_object().unwrap().clone());
        a
    };
    let first_three = [
        action("insert", "t1", json!({"data": {"customer": "bo", "total": 1}})),
        json!({"op": "insert", "collection": "ledger", "id": "l1", "data": {"anything": true}}),
        action("update", "o1", json!({"inc": {"total": 1}})),
    ];
    // The fourth fails as staged (an update whose result is invalid)...
    expect(app.post(DOCS, &json!({"_id": "o2", "customer": "cy", "total": 5})).await, 201).await;
    let mut actions = first_three.to_vec();
    actions.push(action("update", "o2", json!({"inc": {"total": -100}})));
    let problem =
        expect_problem(app.post("/v1/transactions", &json!({"actions": actions})).await, 422, "schema_violation").await;
    assert_eq!((problem["action"].clone(), problem["id"].clone()), (json!(3), json!("o2")), "{problem}");
    assert_eq!(errors(&problem), [pair("/total", "minimum")]);
    // ...and so does an insert, found before anything runs.
    let mut actions = first_three.to_vec();
    actions.push(action("insert", "t4", json!({"data": {"customer": "", "total": 1}})));
    let problem =
        expect_problem(app.post("/v1/transactions", &json!({"actions": actions})).await, 422, "schema_violation").await;
    assert_eq!(problem["action"], 3, "{problem}");
    assert_eq!(errors(&problem), [pair("/customer", "minLength")]);
    // Nothing of either was written.
    app.settled().await;
    for (path, status) in
        [(doc_path("t1"), 404), ("/v1/collections/ledger/documents/l1".to_owned(), 404), (doc_path("t4"), 404)]
    {
        assert_eq!(app.get(&path).await.status(), status, "{path}");
    }
    assert_eq!(stored(&app, "o1").await.0, 1);
    assert_eq!(stored(&app, "o2").await.0, 1);
    // A valid one commits.
    let mut actions = first_three.to_vec();
    actions.push(action("update", "o2", json!({"inc": {"total": -5}})));
    expect(app.post("/v1/transactions", &json!({"actions": actions})).await, 200).await;
    app.settled().await;
    assert_eq!(stored(&app, "o2").await.1["total"], 0);
    app.stop().await;
}

async fn set_validation(app: &TestApp, validation: &str) {
    let body = json!({"validation": validation});
    let out = expect(app.send_json(Method::PUT, "/v1/collections/orders/schema", &body).await, 202).await;
    assert_eq!(out["validation"], validation);
    app.advance(Duration::from_millis(2_300));
    let out = expect(app.get("/v1/collections/orders/schema").await, 200).await;
    assert_eq!((out["validation"].as_str(), out["state"].as_str()), (Some(validation), Some("active")));
}

async fn strict_warn_and_moderate_judge_documents_already_invalid(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    // Written before any schema: nothing is checked retroactively.
    expect(app.post(DOCS, &json!({"_id": "bad", "customer": "", "total": -1})).await, 201).await;
    expect(app.post(DOCS, &json!({"_id": "good", "customer": "ada", "total": 1})).await, 201).await;
    declare(&app, "orders", 1, &order_schema()).await;
    assert_eq!(stored(&app, "bad").await.0, 1, "declaring checks nothing retroactively");
    let touch = async |id: &str| app.send_json(Method::PATCH, &doc_path(id), &json!({"set": {"customer": ""}})).await;
    // Strict (the default): a write to an invalid document must make it valid.
    refused(touch("bad").await).await;
    refused(touch("good").await).await;
    // Moderate: a document invalid already is not checked; a valid one is,
    // and so is every create.
    set_validation(&app, "moderate").await;
    expect(touch("bad").await, 200).await;
    refused(touch("good").await).await;
    refused(app.post(DOCS, &json!({"customer": ""})).await).await;
    let replace = app.send_json(Method::PUT, &doc_path("bad"), &json!({"total": "x"})).await;
    expect(replace, 200).await;
    // Warn: written, counted and logged.
    set_validation(&app, "warn").await;
    expect(touch("good").await, 200).await;
    expect(app.post(DOCS, &json!({"_id": "w", "total": "x"})).await, 201).await;
    let metrics = app.get("/metrics").await.text().await.unwrap();
    let warned = metrics.lines().find(|l| l.starts_with("txgate_schema_warnings_total ")).expect("the counter");
    assert!(warned.split(' ').nth(1).unwrap().parse::<f64>().unwrap() >= 2.0, "{warned}");
    // And in a transaction too.
    let txn = json!({"actions": [{"op": "insert", "collection": "orders", "id": "wt", "data": {"total": -3}}]});
    expect(app.post("/v1/transactions", &txn).await, 200).await;
    set_validation(&app, "strict").await;
    refused(
        app.post(
            "/v1/transactions",
            &json!({"actions": [{"op": "update", "collection": "orders", "id": "good", "set": {"total": 2}}]}),
        )
        .await,
    )
    .await;
    app.stop().await;
}

/// This gateway's `name` counter, as `/metrics` shows it.
async fn counter(app: &TestApp, name: &str) -> u64 {
    let metrics = app.get("/metrics").await.text().await.unwrap();
    let line = metrics.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("{name}"));
    line.split(' ').nth(1).unwrap().parse::<f64>().unwrap() as u64
}

/// Writes that meet others on the same document are checked again on each
/// try; the counters count each write once, by its outcome: a refused
/// transaction member once (checked on the all-at-once try and again under
/// locks), a write let through under `warn` once if it lands, never if
/// it does not.
async fn the_counters_count_each_write_once_however_often_it_was_checked(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let app = std::sync::Arc::new(app);
    const REFUSED: &str = "txgate_schema_refusals_total";
    const WARNED: &str = "txgate_schema_warnings_total";
    declare(&app, "orders", 1, &order_schema()).await;
    expect(app.post(DOCS, &json!({"_id": "hot", "customer": "c", "total": 0})).await, 201).await;
    // A transaction whose member would break the schema: one refusal.
    let bad = json!({"actions": [{"op": "update", "collection": "orders", "id": "hot", "inc": {"total": -5}}]});
    refused(app.post("/v1/transactions", &bad).await).await;
    assert_eq!((counter(&app, REFUSED).await, counter(&app, WARNED).await), (1, 0));
    // Under `warn`, concurrent patches and transactions on one document,
    // each leaving it invalid: as many warnings as writes that landed.
    set_validation(&app, "warn").await;
    let mut writes = Vec::new();
    for i in 0..24 {
        let app = std::sync::Arc::clone(&app);
        writes.push(tokio::spawn(async move {
            let response = if i % 2 == 0 {
                app.send_json(Method::PATCH, &doc_path("hot"), &json!({"inc": {"total": -1}})).await
            } else {
                let txn = json!({"actions": [
                    {"op": "update", "collection": "orders", "id": "hot", "inc": {"total": -1}},
                    {"op": "insert", "collection": "orders", "id": format!("t{i}"), "data": {"total": -1}}
                ]});
                app.post("/v1/transactions", &txn).await
            };
            // A transaction has two invalid members.
            (response.status().as_u16(), if i % 2 == 0 { 1 } else { 2 })
        }));
    }
    let mut landed = 0;
    for write in writes {
        let (status, members) = write.await.unwrap();
        if status == 200 {
            landed += members;
        } else {
            assert!(status == 409 || status == 503, "{status}");
        }
    }
    assert!(landed > 0);
    let total = expect(app.get(&doc_path("hot")).await, 200).await["data"]["total"].as_i64().unwrap();
    assert_eq!(counter(&app, WARNED).await, landed, "the document's total went to {total}");
    assert_eq!(counter(&app, REFUSED).await, 1);
    std::sync::Arc::try_unwrap(app).ok().expect("every write ended").stop().await;
}

async fn a_background_pass_lists_the_documents_that_do_not_satisfy_the_schema(backend: Backend) {
    // The timed pass stays asleep: the test sees each state the pass moves
    // through, and runs the passes itself.
    let slow = |c: &mut txgate::config::Config| c.txn.recovery_interval = Duration::from_secs(3_600);
    let Some(app) = TestApp::spawn_with(backend, slow).await else { return };
    for i in 0..250 {
        let doc = if i % 50 == 7 { json!({"customer": "", "total": i}) } else { json!({"customer": "c", "total": i}) };
        let mut doc = doc;
        doc["_id"] = json!(format!("d{i:03}"));
        expect(app.post(DOCS, &doc).await, 201).await;
    }
    let path = "/v1/collections/orders/schema/violations";
    let none = expect(app.get(path).await, 200).await;
    assert_eq!((none["state"].as_str(), none["invalid"].as_i64()), (Some("done"), Some(0)), "no schema: {none}");
    declare(&app, "orders", 1, &order_schema()).await;
    let waiting = expect(app.get(path).await, 200).await;
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    app.run_once("schema_violations").await;
    let done = expect(app.get(path).await, 200).await;
    assert_eq!(
        (done["state"].as_str(), done["scanned"].as_i64(), done["invalid"].as_i64()),
        (Some("done"), Some(250), Some(5)),
        "{done}"
    );
    let ids: Vec<&str> = done["items"].as_array().unwrap().iter().map(|f| f["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["d007", "d057", "d107", "d157", "d207"]);
    assert_eq!(done["items"][0]["errors"][0]["pointer"], "/customer");
    assert_eq!(done["truncated"], false);
    // Fixed documents are found valid by the next pass, asked for.
    let fix = json!({"set": {"customer": "fixed"}});
    expect(app.send_json(Method::PATCH, &doc_path("d007"), &fix).await, 200).await;
    expect(app.post(path, &json!({})).await, 202).await;
    assert_eq!(expect(app.get(path).await, 200).await["state"], "waiting");
    app.run_once("schema_violations").await;
    let again = expect(app.get(path).await, 200).await;
    assert_eq!(again["invalid"], 4, "{again}");
    // A new declaration starts a new pass against it.
    declare(&app, "orders", 1, &json!({"type": "object"})).await;
    app.run_once("schema_violations").await;
    let loose = expect(app.get(path).await, 200).await;
    assert_eq!((loose["state"].as_str(), loose["invalid"].as_i64()), (Some("done"), Some(0)), "{loose}");
    // A change of `validation` alone changes nothing the pass found.
    let body = json!({"validation": "warn"});
    expect(app.send_json(Method::PUT, "/v1/collections/orders/schema", &body).await, 202).await;
    let same = expect(app.get(path).await, 200).await;
    assert_eq!((same["state"].as_str(), &same["started_at"]), (Some("done"), &loose["started_at"]), "{same}");
    app.stop().await;
}

async fn hostile_schemas_are_refused_or_bounded(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let put = async |schema: Value| app.send_json(Method::PUT, "/v1/collections/orders/schemas/1", &schema).await;
    let mut deep = json!({"type": "string"});
    for _ in 0..40 {
        deep = json!({"properties": {"a": deep}});
    }
    let receiver = TestReceiver::start().await;
    let remote = json!({"properties": {"a": {"$ref": receiver.url("/schema.json")}}});
    let mut doubling = serde_json::Map::new();
    for i in 0..30 {
        let next = format!("#/$defs/d{}", i + 1);
        doubling.insert(format!("d{i}"), json!({"anyOf": [{"$ref": next}, {"$ref": next, "minimum": 1}]}));
    }
    doubling.insert("d30".into(), json!({"type": "integer"}));
    let many: serde_json::Map<String, Value> = (0..2_100).map(|i| (format!("p{i}"), json!(true))).collect();
    for (what, schema, pointer) in [
        ("deep", deep, None),
        ("remote $ref", remote, Some("/properties/a/$ref")),
        ("doubling $refs", json!({"$defs": doubling, "$ref": "#/$defs/d0"}), Some("")),
        ("too many keywords", json!({"properties": many}), None),
        ("huge", json!({"description": "x".repeat(70 * 1024)}), Some("")),
        ("look-around pattern", json!({"pattern": "(?=a)b"}), None),
        ("unbounded uniqueItems", json!({"uniqueItems": true}), Some("/uniqueItems")),
        ("another draft", json!({"$schema": "http://json-schema.org/draft-04/schema#"}), Some("/$schema")),
        ("not a schema", json!({"type": "strnig"}), None),
        ("a missing $ref", json!({"$ref": "#/$defs/none"}), None),
    ] {
        let problem = expect_problem(put(schema).await, 422, "validation_failed").await;
        if let Some(pointer) = pointer {
            assert_eq!(problem["errors"][0]["pointer"], pointer, "{what}: {problem}");
        }
    }
    assert!(receiver.collect_for(Duration::from_millis(200)).await.is_empty(), "a remote $ref is never fetched");
    assert_eq!(app.get("/v1/collections/orders/schemas/1").await.status(), 404, "nothing was declared");
    // Recursion through the document is taken and checks each level; a
    // pattern that backtracks catastrophically elsewhere runs in linear time.
    let tree = json!({
        "type": "object",
        "properties": {"name": {"type": "string", "pattern": "^(a+)+$"}, "children": {"type": "array", "items": {"$ref": "#"}}}
    });
    declare(&app, "orders", 1, &tree).await;
    let hostile = format!("{}!", "a".repeat(100_000));
    let doc = json!({"name": "aaa", "children": [{"name": "a", "children": [{"name": hostile}]}]});
    let found = refused(app.post(DOCS, &doc).await).await;
    assert_eq!(found, [pair("/children/0/children/0/name", "pattern")]);
    expect(app.post(DOCS, &json!({"name": "aa", "children": [{"name": "a", "children": []}]})).await, 201).await;
    // References that double at each of 14 levels are accepted (under the
    // bound); a document whose many values would each cost that much is
    // refused unchecked, at once.
    let mut defs = serde_json::Map::new();
    for i in 0..14 {
        let next = format!("#/$defs/d{}", i + 1);
        defs.insert(format!("d{i}"), json!({"allOf": [{"$ref": next}, {"$ref": next}]}));
    }
    defs.insert("d14".into(), json!({"type": "integer"}));
    let costly = json!({"$defs": defs, "properties": {"xs": {"type": "array", "items": {"$ref": "#/$defs/d0"}}}});
    let path = "/v1/collections/costly/schemas/1";
    expect(app.send_json(Method::PUT, path, &costly).await, 202).await;
    app.advance(Duration::from_millis(2_300));
    let docs = "/v1/collections/costly/documents";
    expect(app.post(docs, &json!({"xs": [1, 2, 3]})).await, 201).await;
    let many: Vec<Value> = (0..5_000).map(|i| json!(i)).collect();
    let problem = expect_problem(app.post(docs, &json!({"xs": many})).await, 422, "schema_violation").await;
    assert_eq!(errors(&problem), [pair("", "cost")]);
    app.stop().await;
}

async fn declarations_are_pending_then_active_and_counted_in_revisions(backend: Backend) {
    const READER: &str = "reader-key-0123456789";
    let spec = format!("{ADMIN}:admin,{WRITER}:write,{READER}:read");
    let Some(app) = TestApp::spawn_with(backend, |c| c.api_keys = parse_keys(&spec).unwrap()).await else { return };
    let path = "/v1/collections/orders/schemas/1";
    let schema = json!({"type": "object"});
    // Only an admin declares; any reader reads.
    for key in [WRITER, READER] {
        expect_problem(send(&app, key, Method::PUT, path, Some(&schema)).await, 403, "forbidden").await;
    }
    let first = expect(send(&app, ADMIN, Method::PUT, path, Some(&schema)).await, 202).await;
    assert_eq!((first["state"].as_str(), first["revision"].as_i64()), (Some("pending"), Some(1)), "{first}");
    app.advance(Duration::from_millis(2_300));
    let read = expect(send(&app, READER, Method::GET, path, None).await, 200).await;
    assert_eq!((read["state"].as_str(), &read["schema"]), (Some("active"), &schema));
    // Edits of one version are revisions; If-Match guards them.
    let stale = app
        .request(Method::PUT, path)
        .bearer_auth(ADMIN)
        .header("if-match", "\"7\"")
        .json(&schema)
        .send()
        .await
        .unwrap();
    expect_problem(stale, 409, "version_conflict").await;
    let only_new = app
        .request(Method::PUT, path)
        .bearer_auth(ADMIN)
        .header("if-match", "\"0\"")
        .json(&schema)
        .send()
        .await
        .unwrap();
    expect_problem(only_new, 409, "version_conflict").await;
    let second = app
        .request(Method::PUT, path)
        .bearer_auth(ADMIN)
        .header("if-match", "\"1\"")
        .json(&json!({"type": "object", "required": ["a"]}))
        .send()
        .await
        .unwrap();
    let second = expect(second, 202).await;
    assert_eq!((second["revision"].as_i64(), second["state"].as_str()), (Some(2), Some("pending")));
    let list = expect(send(&app, READER, Method::GET, "/v1/collections/orders/schemas", None).await, 200).await;
    assert_eq!((list["validation"].as_str(), list["items"].as_array().unwrap().len()), (Some("strict"), 1));
    // Bad input is a 4xx naming it, never a 5xx.
    expect_problem(
        send(&app, ADMIN, Method::PUT, "/v1/collections/orders/schemas/0", Some(&schema)).await,
        422,
        "validation_failed",
    )
    .await;
    expect_problem(
        send(&app, ADMIN, Method::PUT, "/v1/collections/orders/schemas/x", Some(&schema)).await,
        400,
        "invalid_path",
    )
    .await;
    let bad_mode = json!({"validation": "lenient"});
    expect_problem(
        send(&app, ADMIN, Method::PUT, "/v1/collections/orders/schema", Some(&bad_mode)).await,
        422,
        "validation_failed",
    )
    .await;
    // A removed version is no longer declared.
    assert_eq!(send(&app, ADMIN, Method::DELETE, path, None).await.status(), 204);
    expect_problem(send(&app, READER, Method::GET, path, None).await, 404, "not_found").await;
    expect_problem(send(&app, ADMIN, Method::DELETE, path, None).await, 404, "not_found").await;
    // A collection declares at most 32 versions.
    for v in 1..=32 {
        let p = format!("/v1/collections/many/schemas/{v}");
        expect(send(&app, ADMIN, Method::PUT, &p, Some(&schema)).await, 202).await;
    }
    let p = "/v1/collections/many/schemas/33";
    expect_problem(send(&app, ADMIN, Method::PUT, p, Some(&schema)).await, 409, "schema_limit").await;
    app.stop().await;
}

async fn under_rules_refusals_come_first_and_set_fields_are_checked(backend: Backend) {
    let issuer = Issuer::start(&[&RSA_A]).await;
    let Some(app) = gateway_with(backend, &issuer, |_| {}).await else { return };
    ready_index(&app, "orders", "owner", &["owner"]).await;
    let rules = json!({"grants": [
        {"name": "own", "roles": ["customer"], "match": {"owner": {"$auth": "sub"}},
         "actions": ["read", "create", "update"], "fields": {"write": ["item", "qty"]}, "set": {"owner": "sub"}}
    ]});
    expect(send(&app, ADMIN, Method::PUT, "/v1/collections/orders/rules", Some(&rules)).await, 200).await;
    let schema = json!({"type": "object", "required": ["owner", "item"], "properties": {"owner": {"type": "string"}, "item": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}}});
    let path = "/v1/collections/orders/schemas/1";
    expect(send(&app, ADMIN, Method::PUT, path, Some(&schema)).await, 202).await;
    app.advance(Duration::from_millis(2_300));
    let ada = token(&issuer, "ada", &["customer"], None);
    // The rule's `set` gives the owner the schema requires.
    let made = expect(send(&app, &ada, Method::POST, DOCS, Some(&json!({"item": "tea", "qty": 1}))).await, 201).await;
    assert_eq!(made["data"]["owner"], "ada");
    let a1 = made["id"].as_str().unwrap().to_owned();
    let problem = expect_problem(
        send(&app, &ada, Method::POST, DOCS, Some(&json!({"item": "tea", "qty": 0}))).await,
        422,
        "schema_violation",
    )
    .await;
    assert_eq!(errors(&problem), [pair("/qty", "minimum")]);
    // A document the user may not read is 404, and a field they may not
    // write 403, however invalid the write would be.
    expect(send(&app, WRITER, Method::POST, DOCS, Some(&json!({"_id": "b1", "owner": "bob", "item": "x"}))).await, 201)
        .await;
    let invalid = json!({"set": {"qty": 0}});
    expect_problem(send(&app, &ada, Method::PATCH, &doc_path("b1"), Some(&invalid)).await, 404, "not_found").await;
    let forbidden = json!({"set": {"owner": 5}});
    expect_problem(send(&app, &ada, Method::PATCH, &doc_path(&a1), Some(&forbidden)).await, 403, "rule_denied").await;
    let txn = json!({"actions": [{"op": "update", "collection": "orders", "id": "b1", "set": {"qty": 0}}]});
    expect_problem(send(&app, &ada, Method::POST, "/v1/transactions", Some(&txn)).await, 404, "not_found").await;
    let txn = json!({"actions": [{"op": "update", "collection": "orders", "id": a1, "set": {"qty": 0}}]});
    let problem =
        expect_problem(send(&app, &ada, Method::POST, "/v1/transactions", Some(&txn)).await, 422, "schema_violation")
            .await;
    assert_eq!(problem["action"], 0);
    app.stop().await;
}

async fn a_declaration_on_one_instance_is_enforced_by_another_once_active(backend: Backend) {
    let Some(one) = TestApp::spawn(backend).await else { return };
    let two = TestApp::on_store(one.config.clone(), std::sync::Arc::clone(&one.store), None).await;
    // The second instance has read the collection's (absent) schemas.
    expect(two.post(DOCS, &json!({"_id": "before", "anything": 1})).await, 201).await;
    let path = "/v1/collections/orders/schemas/1";
    let declared = expect(one.send_json(Method::PUT, path, &order_schema()).await, 202).await;
    assert_eq!(declared["state"], "pending");
    // Once the first says active (by the wall clock both share), the
    // second refuses.
    let started = std::time::Instant::now();
    loop {
        let state = expect(one.get(path).await, 200).await;
        if state["state"] == "active" {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never active: {state}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    refused(two.post(DOCS, &json!({"_id": "after", "anything": 1})).await).await;
    two.stop().await;
    one.stop().await;
}

async fn the_api_description_types_each_collections_documents(backend: Backend) {
    const ORDERS: &str = "orders-reader-0123456789";
    let spec = format!("{ADMIN}:admin,{ORDERS}:read@orders");
    let Some(app) = TestApp::spawn_with(backend, |c| c.api_keys = parse_keys(&spec).unwrap()).await else { return };
    let put = send(&app, ADMIN, Method::PUT, "/v1/collections/orders/schemas/1", Some(&order_schema())).await;
    expect(put, 202).await;
    // The committed document, to anyone, unchanged.
    let committed = expect(app.get("/openapi.json").await, 200).await;
    assert_eq!(
        committed.to_string(),
        serde_json::from_str::<Value>(&txgate::testing::http::openapi_json()).unwrap().to_string()
    );
    // Typed: as a read of the collections named.
    expect_problem(app.get("/openapi.json?collections=orders").await, 401, "unauthorized").await;
    let typed = expect(send(&app, ORDERS, Method::GET, "/openapi.json?collections=orders", None).await, 200).await;
    assert_eq!(typed["components"]["schemas"]["Orders"]["properties"]["total"]["minimum"], 0);
    let get = &typed["paths"]["/v1/collections/orders/documents/{id}"]["get"];
    assert_eq!(get["operationId"], "v1.collections.orders.documents.get");
    assert_eq!(
        get["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/OrdersDocument"
    );
    let other = send(&app, ORDERS, Method::GET, "/openapi.json?collections=orders,ledger", None).await;
    expect_problem(other, 403, "forbidden").await;
    let bad = send(&app, ORDERS, Method::GET, "/openapi.json?collections=orders,_meta", None).await;
    expect_problem(bad, 422, "validation_failed").await;
    // A collection without schemas is an object of any fields.
    let loose = expect(send(&app, ADMIN, Method::GET, "/openapi.json?collections=ledger", None).await, 200).await;
    assert_eq!(loose["components"]["schemas"]["Ledger"]["type"], "object");
    app.stop().await;
}

async fn a_pass_whose_instance_stopped_is_taken_over_and_a_damaged_record_is_reported(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    expect(app.post(DOCS, &json!({"_id": "bad", "total": -1})).await, 201).await;
    declare(&app, "orders", 1, &order_schema()).await;
    let seq = app.store.get("_schemas", "orders").await.unwrap().unwrap().get_i64("schemas_seq").unwrap();
    // Another instance holds the pass, and its lease has run out.
    let now = txgate_store::DateTime::now().timestamp_millis();
    let held = |until: i64| {
        txgate_store::doc! {"_id": "orders", "v": 1, "n": 7_i64, "seq": seq, "state": "running",
        "owner": "gone-instance", "lease_until": txgate_store::DateTime::from_millis(until),
        "after": null, "scanned": 0_i64, "invalid": 0_i64, "found": [],
        "started_at": txgate_store::DateTime::from_millis(now), "finished_at": null}
    };
    app.store.delete("_schema_checks", "orders", txgate_store::doc! {}).await.unwrap();
    assert!(app.store.insert("_schema_checks", held(now - 60_000)).await.unwrap());
    app.run_once("schema_violations").await;
    let path = "/v1/collections/orders/schema/violations";
    let done = expect(app.get(path).await, 200).await;
    assert_eq!((done["state"].as_str(), done["invalid"].as_i64()), (Some("done"), Some(1)), "{done}");
    // A damaged schemas record (of a collection this instance has not read
    // yet): writes to the collection are refused and reported (never let
    // through unchecked, never a crash); a new declaration replaces it.
    let broken = "/v1/collections/broken/documents";
    assert!(app.store.insert("_schemas", txgate_store::doc! {"_id": "broken", "v": "x"}).await.unwrap());
    expect_problem(app.post(broken, &json!({"total": 1})).await, 500, "record_unreadable").await;
    expect_problem(app.get("/v1/collections/broken/schemas").await, 500, "record_unreadable").await;
    assert_eq!(app.get(&format!("{broken}/x")).await.status(), 404, "reads go on");
    expect(app.send_json(Method::PUT, "/v1/collections/broken/schemas/1", &order_schema()).await, 202).await;
    expect(app.post(broken, &json!({"customer": "ada", "total": 2})).await, 201).await;
    app.stop().await;
}
