//! The documents API of docs/design.md §2 over real HTTP, on both backends.

use reqwest::Method;
use serde_json::{Value, json};
use txgate::testing::document::{Staged, StagedOp, StoredDoc};
use txgate::testing::txn::record::{Status, TXNS, TxnRecord};
use txgate_store::doc;

use crate::support::{Backend, TestApp, expect, expect_problem, txn_record};

crate::on_both_backends!(
    create_read_and_etags,
    create_generates_uuid_v7_ids,
    create_conflicts_and_validation,
    replace_with_if_match,
    patch_set_unset_inc_and_merge_patch,
    inc_keeps_64_bit_integers_exact,
    delete_leaves_a_tombstone_and_recreate_continues,
    list_pages_live_documents_in_id_order,
    malformed_requests_are_4xx_and_write_nothing,
    concurrent_unconditional_patches_lose_no_update,
    concurrent_conditional_writes_have_one_winner,
    writer_waits_for_a_live_lock_then_answers_locked,
    writer_cleans_up_a_dead_holder_on_the_spot,
    reader_sees_committed_post_image_never_staged_data,
);

const C: &str = "/v1/collections/accounts/documents";

fn at(path: &str) -> String {
    format!("{C}/{path}")
}

async fn app(backend: Backend) -> Option<TestApp> {
    TestApp::spawn(backend).await
}

async fn create(app: &TestApp, body: Value) -> Value {
    expect(app.post(C, &body).await, 201).await
}

async fn create_read_and_etags(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    let res = app.post(C, &json!({"_id": "acc-1", "owner": "ann", "balance": 100})).await;
    assert_eq!(res.headers()["location"], "/v1/collections/accounts/documents/acc-1");
    assert_eq!(res.headers()["etag"], "\"1\"");
    let body = expect(res, 201).await;
    assert_eq!(body["collection"], "accounts");
    assert_eq!(body["id"], "acc-1");
    assert_eq!(body["version"], 1);
    assert_eq!(body["schema_version"], 1);
    assert_eq!(body["data"], json!({"owner": "ann", "balance": 100}));
    assert_eq!(body["created_at"], body["updated_at"]);

    let res = app.get(&at("acc-1")).await;
    assert_eq!(res.headers()["etag"], "\"1\"");
    assert_eq!(expect(res, 200).await, body);

    let res = app.request(Method::GET, &at("acc-1")).header("If-None-Match", "\"1\"").send().await.unwrap();
    assert_eq!(res.status(), 304);
    let res = app.request(Method::GET, &at("acc-1")).header("If-None-Match", "\"7\"").send().await.unwrap();
    assert_eq!(res.status(), 200);
    expect_problem(app.get(&at("nope")).await, 404, "not_found").await;
    // A malformed If-None-Match is a 400 whatever the document's state.
    for id in ["acc-1", "nope"] {
        let res = app.request(Method::GET, &at(id)).header("If-None-Match", "junk").send().await.unwrap();
        expect_problem(res, 400, "invalid_header").await;
    }

    // Ids with reserved URL characters round-trip when percent-encoded.
    let res = app.post(C, &json!({"_id": "a/b c?", "x": 1})).await;
    assert_eq!(res.headers()["location"], "/v1/collections/accounts/documents/a%2Fb%20c%3F");
    expect(res, 201).await;
    expect(app.get(&at("a%2Fb%20c%3F")).await, 200).await;
    app.stop().await;
}

async fn create_generates_uuid_v7_ids(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    let body = create(&app, json!({"x": 1})).await;
    let id = uuid::Uuid::parse_str(body["id"].as_str().unwrap()).unwrap();
    assert_eq!(id.get_version_num(), 7);
    app.stop().await;
}

async fn create_conflicts_and_validation(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    create(&app, json!({"_id": "a", "x": 1})).await;
    let p = expect_problem(app.post(C, &json!({"_id": "a", "x": 2})).await, 409, "already_exists").await;
    assert_eq!(p["version"], 1);
    for bad in [
        json!({"_id": "b", "_x": 1}),
        json!({"_id": "b", "$x": 1}),
        json!({"_id": "b", "a.b": 1}),
        json!({"_id": "b", "o": {"$in": 1}}),
        json!({"_id": "b", "o": {"a.b": 1}}),
        json!({"_id": 5}),
        json!({"_id": ""}),
        json!({"_id": "x".repeat(257)}),
        json!({"_id": "tab\there"}),
        json!([1, 2]),
    ] {
        expect_problem(app.post(C, &bad).await, 422, "validation_failed").await;
    }
    // Past the signed 64-bit range an integer is kept as a double, as
    // MongoDB's own JSON import does.
    let big = expect(app.post(C, &json!({"_id": "big", "n": u64::MAX})).await, 201).await;
    assert_eq!(big["data"]["n"].as_f64(), Some(u64::MAX as f64));
    expect_problem(app.post("/v1/collections/_txns/documents", &json!({})).await, 422, "validation_failed").await;
    expect_problem(app.post("/v1/collections/9x/documents", &json!({})).await, 422, "validation_failed").await;
    let long = format!("/v1/collections/{}/documents", "a".repeat(65));
    expect_problem(app.post(&long, &json!({})).await, 422, "validation_failed").await;
    // A 256-character id is fine.
    create(&app, json!({"_id": "y".repeat(256)})).await;
    expect_problem(app.get(&at("b")).await, 404, "not_found").await;
    app.stop().await;
}

async fn replace_with_if_match(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    create(&app, json!({"_id": "a", "x": 1, "y": 2})).await;
    let put = |v: &str, body: Value| app.request(Method::PUT, &at("a")).header("If-Match", v).json(&body).send();
    let res = put("\"1\"", json!({"x": 10})).await.unwrap();
    assert_eq!(res.headers()["etag"], "\"2\"");
    let body = expect(res, 200).await;
    assert_eq!(body["data"], json!({"x": 10}));
    assert_eq!(body["version"], 2);

    let p = expect_problem(put("\"1\"", json!({"x": 11})).await.unwrap(), 409, "version_conflict").await;
    assert_eq!((p["expected"].as_i64(), p["actual"].as_i64()), (Some(1), Some(2)));
    expect_problem(put("1x", json!({})).await.unwrap(), 400, "invalid_header").await;
    expect_problem(put("\"abc\"", json!({})).await.unwrap(), 400, "invalid_header").await;
    // Without If-Match the write still happens; with "*" too.
    let body = expect(app.send_json(Method::PUT, &at("a"), &json!({"z": true})).await, 200).await;
    assert_eq!(body["version"], 3);
    let body = expect(put("*", json!({"z": false})).await.unwrap(), 200).await;
    assert_eq!(body["version"], 4);
    // A schema version can be declared with the write.
    let res =
        app.request(Method::PUT, &format!("{}?schema_version=3", at("a"))).json(&json!({"z": 1})).send().await.unwrap();
    assert_eq!(expect(res, 200).await["schema_version"], 3);
    expect_problem(app.send_json(Method::PUT, &at("nope"), &json!({})).await, 404, "not_found").await;
    expect_problem(app.send_json(Method::PUT, &at("a"), &json!({"_id": "other"})).await, 422, "validation_failed")
        .await;
    app.stop().await;
}

async fn patch_set_unset_inc_and_merge_patch(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    create(&app, json!({"_id": "a", "owner": "ann", "balance": 100, "tmp": 1, "addr": {"city": "X", "zip": "1"}}))
        .await;
    let res = app
        .request(Method::PATCH, &at("a"))
        .header("If-Match", "\"1\"")
        .json(
            &json!({"set": {"owner": "bob", "addr.city": "Y"}, "unset": ["tmp"], "inc": {"balance": -10, "visits": 1}}),
        )
        .send()
        .await
        .unwrap();
    let body = expect(res, 200).await;
    assert_eq!(body["version"], 2);
    assert_eq!(body["data"], json!({"owner": "bob", "balance": 90, "addr": {"city": "Y", "zip": "1"}, "visits": 1}));

    let p = expect_problem(
        app.send_json(Method::PATCH, &at("a"), &json!({"inc": {"owner": 1}})).await,
        422,
        "invalid_change",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("owner"), "{p}");
    expect_problem(
        app.send_json(Method::PATCH, &at("a"), &json!({"inc": {"balance": "x"}})).await,
        422,
        "validation_failed",
    )
    .await;
    expect_problem(app.send_json(Method::PATCH, &at("a"), &json!({"bogus": {}})).await, 422, "validation_failed").await;
    // Two parts on one path: the second of them is pointed at.
    for (patch, pointer) in [
        (json!({"set": {"addr.city": "Z"}, "inc": {"addr": 1}}), "/set/addr.city"),
        (json!({"unset": ["tmp", "visits"], "inc": {"visits": 1}}), "/unset/1"),
    ] {
        let p = expect_problem(app.send_json(Method::PATCH, &at("a"), &patch).await, 422, "validation_failed").await;
        assert_eq!(p["errors"][0]["pointer"], pointer, "{patch}: {p}");
    }
    // An empty patch changes no field but is a write, as an empty merge patch is.
    let before = expect(app.get(&at("a")).await, 200).await;
    let after = expect(app.send_json(Method::PATCH, &at("a"), &json!({})).await, 200).await;
    assert_eq!(after["version"], before["version"].as_i64().unwrap() + 1);
    assert_eq!(after["data"], before["data"]);
    expect_problem(app.send_json(Method::PATCH, &at("a"), &json!({"set": null})).await, 422, "validation_failed").await;
    expect_problem(
        app.send_json(Method::PATCH, &at("a"), &json!({"set": {"a": 1}, "unset": ["a"]})).await,
        422,
        "validation_failed",
    )
    .await;
    expect_problem(
        app.send_json(Method::PATCH, &at("a"), &json!({"set": {"_meta": 1}})).await,
        422,
        "validation_failed",
    )
    .await;

    let res = app
        .request(Method::PATCH, &at("a"))
        .header("content-type", "application/merge-patch+json")
        .body(r#"{"owner": null, "addr": {"zip": "2", "street": "S"}, "note": "n"}"#)
        .send()
        .await
        .unwrap();
    let body = expect(res, 200).await;
    assert_eq!(body["version"], 4);
    assert_eq!(
        body["data"],
        json!({"balance": 90, "addr": {"city": "Y", "zip": "2", "street": "S"}, "visits": 1, "note": "n"})
    );
    let res = app
        .request(Method::PATCH, &at("a"))
        .header("content-type", "application/merge-patch+json")
        .body("[1]")
        .send()
        .await
        .unwrap();
    expect_problem(res, 422, "validation_failed").await;
    let res =
        app.request(Method::PATCH, &at("a")).header("content-type", "text/plain").body("{}").send().await.unwrap();
    expect_problem(res, 415, "unsupported_media_type").await;
    // Nothing of the refused patches was written.
    assert_eq!(expect(app.get(&at("a")).await, 200).await["version"], 4);
    app.stop().await;
}

async fn inc_keeps_64_bit_integers_exact(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    let big = 9_007_199_254_740_993_i64; // 2^53 + 1: not representable as a double
    create(&app, json!({"_id": "a", "n": big, "m": i64::MAX - 1, "f": 1.5})).await;
    let body =
        expect(app.send_json(Method::PATCH, &at("a"), &json!({"inc": {"n": 2, "m": 1, "f": 1}})).await, 200).await;
    assert_eq!(body["data"]["n"].as_i64(), Some(big + 2));
    assert_eq!(body["data"]["m"].as_i64(), Some(i64::MAX));
    assert_eq!(body["data"]["f"].as_f64(), Some(2.5));
    let raw = app.get(&at("a")).await.text().await.unwrap();
    assert!(raw.contains("\"n\":9007199254740995"), "{raw}");
    expect_problem(app.send_json(Method::PATCH, &at("a"), &json!({"inc": {"m": 1}})).await, 422, "invalid_change")
        .await;
    app.stop().await;
}

async fn delete_leaves_a_tombstone_and_recreate_continues(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    create(&app, json!({"_id": "a", "x": 1})).await;
    let del = |v: &'static str| app.request(Method::DELETE, &at("a")).header("If-Match", v).send();
    expect_problem(del("\"9\"").await.unwrap(), 409, "version_conflict").await;
    let res = del("\"1\"").await.unwrap();
    assert_eq!(res.status(), 204);
    assert_eq!(res.headers()["etag"], "\"2\"");
    let p = expect_problem(app.get(&at("a")).await, 410, "deleted").await;
    assert_eq!(p["version"], 2);
    assert!(p["deleted_at"].is_string());
    expect_problem(del("\"2\"").await.unwrap(), 410, "deleted").await;
    expect_problem(app.send_json(Method::PUT, &at("a"), &json!({})).await, 410, "deleted").await;
    expect_problem(app.send_json(Method::PATCH, &at("a"), &json!({"set": {"x": 1}})).await, 410, "deleted").await;
    let body = create(&app, json!({"_id": "a", "y": 2})).await;
    assert_eq!(body["version"], 3, "a re-created document continues the tombstone's version");
    assert_eq!(body["data"], json!({"y": 2}));
    expect_problem(app.request(Method::DELETE, &at("nope")).send().await.unwrap(), 404, "not_found").await;
    app.stop().await;
}

async fn list_pages_live_documents_in_id_order(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    for i in (0..7).rev() {
        create(&app, json!({"_id": format!("d{i}"), "i": i})).await;
    }
    let res = app.request(Method::DELETE, &at("d3")).send().await.unwrap();
    assert_eq!(res.status(), 204);
    let mut ids = Vec::new();
    let mut next: Option<String> = None;
    let mut pages = 0;
    loop {
        let url = match &next {
            Some(c) => format!("{C}?limit=2&after={c}"),
            None => format!("{C}?limit=2"),
        };
        let page = expect(app.get(&url).await, 200).await;
        pages += 1;
        for item in page["items"].as_array().unwrap() {
            ids.push(item["id"].as_str().unwrap().to_owned());
        }
        match page["next"].as_str() {
            Some(c) => {
                assert!(c.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_'), "URL-safe cursor");
                next = Some(c.to_owned());
            }
            None => break,
        }
    }
    assert_eq!(ids, ["d0", "d1", "d2", "d4", "d5", "d6"]);
    assert_eq!(pages, 3);
    let all = expect(app.get(C).await, 200).await;
    assert_eq!(all["items"].as_array().unwrap().len(), 6);
    assert_eq!(all["next"], Value::Null);
    let empty = expect(app.get("/v1/collections/empty/documents").await, 200).await;
    assert_eq!((&empty["items"], &empty["next"]), (&json!([]), &Value::Null), "{empty}");
    assert!(empty["position"].is_u64(), "a page carries the log position it was read at: {empty}");
    for bad in ["?limit=0", "?limit=1001", "?limit=x", "?after=%%%", "?after=!!"] {
        expect_problem(app.get(&format!("{C}{bad}")).await, 422, "validation_failed").await;
    }
    // Each parameter refused is named by a pointer into the query string:
    // a value of the wrong type, a name not taken, a name given twice.
    for (bad, pointer) in [
        ("?limit=x", "/query/limit"),
        ("?limit=2&limit=3", "/query/limit"),
        ("?sort=n&bogus=1", "/query/bogus"),
        ("?after=d1&after=d2", "/query/after"),
    ] {
        let problem = expect_problem(app.get(&format!("{C}{bad}")).await, 422, "validation_failed").await;
        assert_eq!(problem["errors"][0]["pointer"], pointer, "{bad}: {problem}");
        assert!(problem["detail"].as_str().unwrap().starts_with(pointer), "{bad}: {problem}");
    }
    // A parameter an operation does not take is refused on every
    // operation (a misspelled filter lists nothing), and nothing is done.
    let d1 = at("d1");
    let cases = [
        (Method::GET, "/v1/transactions?stauts=pending".to_owned(), None, "/query/stauts"),
        (
            Method::PUT,
            "/v1/collections/qp/indexes/ix?bogus=1".to_owned(),
            Some(json!({"fields": ["a"]})),
            "/query/bogus",
        ),
        (Method::POST, "/v1/collections/accounts/query?limit=2".to_owned(), Some(json!({})), "/query/limit"),
        (Method::GET, format!("{d1}?fields=a"), None, "/query/fields"),
        (Method::DELETE, format!("{d1}?force=1"), None, "/query/force"),
        (Method::GET, format!("{C}?=1"), None, "/query"),
    ];
    for (method, path, body, pointer) in cases {
        let mut req = app.request(method.clone(), &path);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let problem = expect_problem(req.send().await.unwrap(), 422, "validation_failed").await;
        assert_eq!(problem["errors"][0]["pointer"], pointer, "{method} {path}: {problem}");
    }
    expect_problem(app.get("/v1/collections/qp/indexes/ix").await, 404, "not_found").await;
    expect(app.get(&d1).await, 200).await;
    app.stop().await;
}

async fn malformed_requests_are_4xx_and_write_nothing(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    let post =
        |ct: &'static str, body: Vec<u8>| app.request(Method::POST, C).header("content-type", ct).body(body).send();
    expect_problem(post("application/json", b"{\"_id\": \"a\",".to_vec()).await.unwrap(), 400, "invalid_json").await;
    // Well-formed JSON of the wrong shape: the problem points at the member.
    for (body, pointer) in [(r#"{"unset": ["a", 5]}"#, "/unset/1"), (r#"{"set": {}, "sett": {}}"#, "/sett")] {
        let res = app.request(Method::PATCH, &at("a")).header("content-type", "application/json").body(body).send();
        let problem = expect_problem(res.await.unwrap(), 422, "validation_failed").await;
        assert_eq!(problem["errors"][0]["pointer"], pointer, "{body}: {problem}");
    }
    expect_problem(post("text/plain", b"{}".to_vec()).await.unwrap(), 415, "unsupported_media_type").await;
    let res = app.request(Method::POST, C).body("{}").send().await.unwrap();
    expect_problem(res, 415, "unsupported_media_type").await;
    // Too large: announced by Content-Length, answered before the body is
    // read, saying the connection ends. (Sent by hand: a client still
    // writing the body may see the connection close before it reads the
    // early answer.)
    let head = format!(
        "POST {C} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: 1100000\r\n\r\n"
    );
    let answer = raw_exchange(&app.base, head.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload_too_large"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("\r\nconnection: close\r\n"), "{answer}");
    expect_problem(app.request(Method::PUT, C).send().await.unwrap(), 405, "method_not_allowed").await;
    expect_problem(app.get("/v1/nowhere").await, 404, "not_found").await;
    let res = app
        .request(Method::PUT, &at("a"))
        .header("If-Match", "\"1\"")
        .header("content-type", "application/json")
        .body("nope")
        .send()
        .await
        .unwrap();
    expect_problem(res, 400, "invalid_json").await;
    let list = expect(app.get(C).await, 200).await;
    assert_eq!(list["items"], json!([]), "nothing was written");
    app.stop().await;
}

async fn concurrent_unconditional_patches_lose_no_update(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    create(&app, json!({"_id": "a", "n": 0})).await;
    let app = std::sync::Arc::new(app);
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let app = std::sync::Arc::clone(&app);
            tokio::spawn(async move {
                app.send_json(Method::PATCH, &at("a"), &json!({"inc": {"n": 1}})).await.status().as_u16()
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    let body = expect(app.get(&at("a")).await, 200).await;
    assert_eq!(body["data"]["n"], 20);
    assert_eq!(body["version"], 21);
}

async fn concurrent_conditional_writes_have_one_winner(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    create(&app, json!({"_id": "a", "n": 0})).await;
    let app = std::sync::Arc::new(app);
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let app = std::sync::Arc::clone(&app);
            tokio::spawn(async move {
                let res = app
                    .request(Method::PUT, &at("a"))
                    .header("If-Match", "\"1\"")
                    .json(&json!({"n": i}))
                    .send()
                    .await
                    .unwrap();
                res.status().as_u16()
            })
        })
        .collect();
    let mut codes = Vec::new();
    for t in tasks {
        codes.push(t.await.unwrap());
    }
    assert_eq!(codes.iter().filter(|c| **c == 200).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 409).count(), 9, "{codes:?}");
    assert_eq!(expect(app.get(&at("a")).await, 200).await["version"], 2);
}

/// Lock document `id` for `txn` with a staged update to `data`.
async fn lock_doc(app: &TestApp, id: &str, txn: &str, data: Value) {
    let rec = app.store.get("accounts", id).await.unwrap().unwrap();
    let mut d = StoredDoc::from_record(rec).unwrap();
    d.meta.txn = Some(txn.into());
    let data = txgate_store::convert::object_to_document(data.as_object().unwrap());
    d.meta.pending = Some(Staged { op: StagedOp::Update, data: Some(data), sv: 1 });
    let v = d.meta.v;
    assert!(app.store.replace("accounts", id, doc! {"_meta.v": v}, d.to_record()).await.unwrap());
}

async fn writer_waits_for_a_live_lock_then_answers_locked(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    create(&app, json!({"_id": "a", "n": 1})).await;
    app.store
        .insert(TXNS, txn_record("T-live", Status::Pending, 60_000, "accounts", &["a"]).to_record())
        .await
        .unwrap();
    lock_doc(&app, "a", "T-live", json!({"n": 2})).await;
    let started = std::time::Instant::now();
    let res = app.send_json(Method::PATCH, &at("a"), &json!({"inc": {"n": 1}})).await;
    let waited = started.elapsed();
    assert!(res.headers().contains_key("retry-after"));
    let p = expect_problem(res, 409, "locked").await;
    assert_eq!(p["transaction"], "T-live");
    assert!(waited >= app.config.txn.lock_wait, "the writer waited {waited:?} before giving up");
    expect_problem(app.request(Method::DELETE, &at("a")).send().await.unwrap(), 409, "locked").await;
    // Readers never wait and see the last committed value.
    let body = expect(app.get(&at("a")).await, 200).await;
    assert_eq!((body["version"].as_i64(), &body["data"]), (Some(1), &json!({"n": 1})));
    app.stop().await;
}

async fn writer_cleans_up_a_dead_holder_on_the_spot(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    for id in ["a", "b", "c"] {
        create(&app, json!({"_id": id, "n": 1})).await;
    }
    // "a": holder missing; "b": holder aborted; "c": holder's lease ran out.
    lock_doc(&app, "a", "T-gone", json!({"n": 100})).await;
    app.store.insert(TXNS, txn_record("T-ab", Status::Aborted, 60_000, "accounts", &["b"]).to_record()).await.unwrap();
    lock_doc(&app, "b", "T-ab", json!({"n": 100})).await;
    app.store
        .insert(TXNS, txn_record("T-exp", Status::Pending, -60_000, "accounts", &["c"]).to_record())
        .await
        .unwrap();
    lock_doc(&app, "c", "T-exp", json!({"n": 100})).await;
    for id in ["a", "b", "c"] {
        let body = expect(app.send_json(Method::PATCH, &at(id), &json!({"inc": {"n": 1}})).await, 200).await;
        assert_eq!(body["data"]["n"], 2, "{id}: the staged change of a dead holder is never applied");
        assert_eq!(body["version"], 2);
    }
    let rec = TxnRecord::from_record(app.store.get(TXNS, "T-exp").await.unwrap().unwrap()).unwrap();
    assert_eq!(rec.status, Status::Aborted);
    assert_eq!(rec.abort_reason.as_deref(), Some("expired"));
    app.stop().await;
}

async fn reader_sees_committed_post_image_never_staged_data(backend: Backend) {
    let Some(app) = app(backend).await else { return };
    create(&app, json!({"_id": "a", "n": 1})).await;
    create(&app, json!({"_id": "b", "n": 1})).await;
    app.store
        .insert(TXNS, txn_record("T-pend", Status::Pending, 60_000, "accounts", &["a"]).to_record())
        .await
        .unwrap();
    lock_doc(&app, "a", "T-pend", json!({"n": 50})).await;
    let body = expect(app.get(&at("a")).await, 200).await;
    assert_eq!((body["version"].as_i64(), &body["data"]), (Some(1), &json!({"n": 1})), "no dirty read");

    app.store
        .insert(TXNS, txn_record("T-com", Status::Committed, 60_000, "accounts", &["b"]).to_record())
        .await
        .unwrap();
    lock_doc(&app, "b", "T-com", json!({"n": 7})).await;
    let res = app.get(&at("b")).await;
    assert_eq!(res.headers()["etag"], "\"2\"");
    let body = expect(res, 200).await;
    assert_eq!((body["version"].as_i64(), &body["data"]), (Some(2), &json!({"n": 7})), "committed value");
    let listed = expect(app.get(C).await, 200).await;
    assert_eq!(listed["items"][0]["data"], json!({"n": 1}));
    assert_eq!(listed["items"][1]["data"], json!({"n": 7}));
    // A writer finishes the committed holder's roll-forward first.
    let body = expect(app.send_json(Method::PATCH, &at("b"), &json!({"inc": {"n": 1}})).await, 200).await;
    assert_eq!((body["version"].as_i64(), &body["data"]), (Some(3), &json!({"n": 8})));
    app.stop().await;
}

/// Write `request` to the server at `base` and read its answer to the end.
async fn raw_exchange(base: &str, request: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = base.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    String::from_utf8_lossy(&answer).into_owned()
}
