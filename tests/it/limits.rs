//! Overload and strangers: beyond the concurrency limit requests are
//! refused at once with 429 and write nothing; a keyless gateway answers
//! only requests addressed to a loopback name (the DNS-rebinding guard).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use reqwest::Method;
use serde_json::json;
use txgate::testing::keys::parse_keys;

use crate::faulty::{Act, Op, rigged_app};
use crate::support::{Backend, TestApp, expect, expect_problem};

crate::on_both_backends!(
    beyond_the_concurrency_limit_requests_get_429_and_write_nothing,
    documents_and_transactions_are_bounded_in_bytes_before_anything_is_written,
);

const D: &str = "/v1/collections/slow/documents";

async fn beyond_the_concurrency_limit_requests_get_429_and_write_nothing(backend: Backend) {
    // Every write to "slow" is held at a gate until the test opens it, so
    // the admitted requests stay in flight while the others come.
    let gate = crate::faulty::Gate::new();
    let rule = {
        let gate = Arc::clone(&gate);
        move |op: &Op| if op.coll == "slow" && op.kind != "get" { Act::Hold(Arc::clone(&gate)) } else { Act::Pass }
    };
    let Some(app) = rigged_app(backend, |c| c.max_concurrency = 3, rule).await else { return };
    let app = Arc::new(app);
    let posts = (0..12).map(|i| {
        let app = Arc::clone(&app);
        async move {
            let res = app.post(D, &json!({"_id": format!("s{i}"), "n": i})).await;
            let status = res.status().as_u16();
            let retry_after = res.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
            if status == 429 {
                assert_eq!(res.headers().get("connection").map(|v| v.to_str().unwrap()), Some("close"));
            }
            let body: serde_json::Value = res.json().await.unwrap();
            (i, status, retry_after, body)
        }
    });
    let mut posts: futures::stream::FuturesUnordered<_> = posts.collect();
    // The requests beyond the limit are answered while the admitted ones
    // are held; meanwhile the health checks still answer.
    let mut answers = Vec::new();
    while answers.len() < 9 {
        answers.push(posts.next().await.expect("an answer"));
    }
    let probes = (app.get("/healthz").await.status().as_u16(), app.get("/readyz").await.status().as_u16());
    assert_eq!(probes, (200, 200), "health and readiness pass the limit");
    gate.open();
    while let Some(answer) = posts.next().await {
        answers.push(answer);
    }
    let created: Vec<usize> = answers.iter().filter(|a| a.1 == 201).map(|a| a.0).collect();
    let refused: Vec<usize> = answers.iter().filter(|a| a.1 == 429).map(|a| a.0).collect();
    assert_eq!(created.len() + refused.len(), 12, "each answered 201 or 429: {answers:?}");
    assert_eq!(created.len(), 3, "the limit admitted at once: {created:?}");
    for (_, status, retry_after, body) in answers.iter().filter(|a| a.1 == 429) {
        assert_eq!((*status, body["code"].as_str()), (429, Some("overloaded")), "{body}");
        assert_eq!(retry_after.as_deref(), Some("1"));
    }
    // Admitted requests did all their work; refused ones none.
    for i in &created {
        expect(app.get(&format!("{D}/s{i}")).await, 200).await;
    }
    for i in &refused {
        expect_problem(app.get(&format!("{D}/s{i}")).await, 404, "not_found").await;
    }
    // Once the load is gone, requests are served again.
    expect(app.post(D, &json!({"_id": "later"})).await, 201).await;
    Arc::into_inner(app).expect("one owner").stop().await;
}

async fn status_with_host(app: &TestApp, path: &str, host: &str, key: Option<&str>) -> u16 {
    let mut req = app.request(Method::GET, path).header("host", host);
    if let Some(key) = key {
        req = req.bearer_auth(key);
    }
    let res = req.send().await.unwrap();
    let status = res.status().as_u16();
    if status == 403 {
        expect_problem(res, 403, "forbidden").await;
    }
    status
}

#[tokio::test]
async fn a_keyless_gateway_answers_only_loopback_hosts() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let port = app.base.rsplit(':').next().unwrap().to_owned();
    let docs = "/v1/collections/a/documents";
    for host in ["evil.example", &format!("evil.example:{port}"), "localhost.evil.example", "10.0.0.7"] {
        for path in [docs, "/openapi.json", "/v1/events?after=0", "/nope"] {
            assert_eq!(status_with_host(&app, path, host, None).await, 403, "{host} {path}");
        }
        let res = app.request(Method::POST, docs).header("host", host).json(&json!({"_id": "x"})).send().await;
        expect_problem(res.unwrap(), 403, "forbidden").await;
        assert_eq!(status_with_host(&app, "/healthz", host, None).await, 200, "probes pass: {host}");
    }
    expect_problem(app.get(&format!("{docs}/x")).await, 404, "not_found").await;
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}"), "localhost".into(), format!("[::1]:{port}")]
    {
        assert_eq!(status_with_host(&app, docs, &host, None).await, 200, "{host}");
    }
    app.stop().await;

    // With keys (any address may be served) the Host is not checked.
    const KEY: &str = "reader-key-0123456789";
    let app = TestApp::spawn_with(Backend::Embedded, |c| c.api_keys = parse_keys(&format!("{KEY}:read")).unwrap())
        .await
        .unwrap();
    assert_eq!(status_with_host(&app, docs, "api.example.com", Some(KEY)).await, 200);
    app.stop().await;
}

/// Without API keys, a web page of another origin cannot change anything
/// through the operator's browser, not even with a "simple" request
/// (`text/plain`, no preflight): 403 `cross_origin` before the body is
/// read. The gateway's own pages, listed origins and clients that are not
/// browsers go on; reads are not refused (CORS keeps their answers from
/// the page).
#[tokio::test]
async fn a_keyless_gateway_takes_changes_only_from_its_own_origin() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let port = app.base.rsplit(':').next().unwrap().to_owned();
    let docs = "/v1/collections/a/documents";
    let send = |method: Method, path: &str, headers: &[(&str, String)]| {
        let mut req = app.request(method, path).header("content-type", "text/plain").body(r#"{"_id":"x"}"#);
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        req.send()
    };
    let evil = ("origin", "https://evil.example".to_owned());
    for (method, path) in [
        (Method::POST, docs.to_owned()),
        (Method::PUT, format!("{docs}/x")),
        (Method::PATCH, format!("{docs}/x")),
        (Method::DELETE, format!("{docs}/x")),
        (Method::POST, "/v1/transactions".to_owned()),
        (Method::POST, "/v1/admin/backup".to_owned()),
        (Method::POST, "/v1/subscriptions".to_owned()),
    ] {
        for headers in [
            vec![evil.clone()],
            vec![("origin", "null".to_owned())],
            vec![("origin", format!("http://localhost:{port}"))],
            vec![("sec-fetch-site", "cross-site".to_owned())],
            vec![evil.clone(), ("origin", app.base.clone())],
        ] {
            let res = send(method.clone(), &path, &headers).await.unwrap();
            expect_problem(res, 403, "cross_origin").await;
        }
    }
    expect_problem(app.get(&format!("{docs}/x")).await, 404, "not_found").await;
    let data_dir = match &app.config.store {
        txgate::config::StoreConfig::Embedded { data_dir, .. } => data_dir.clone(),
        _ => unreachable!(),
    };
    assert!(!data_dir.join("backups").exists(), "no backup was taken");
    // Reads are not refused.
    let res = app.request(Method::GET, docs).header("origin", "https://evil.example").send().await.unwrap();
    expect(res, 200).await;
    // Its own origin (as the console sends it), a same-origin fetch
    // without `Origin`, a client that is not a browser.
    let own = [("origin", app.base.clone())];
    expect_problem(send(Method::POST, docs, &own).await.unwrap(), 415, "unsupported_media_type").await;
    let res = app.request(Method::POST, docs).header("origin", &app.base).json(&json!({"_id": "a"})).send().await;
    expect(res.unwrap(), 201).await;
    let res = app
        .request(Method::POST, docs)
        .header("host", format!("localhost:{port}"))
        .header("origin", format!("http://localhost:{port}"))
        .json(&json!({"_id": "b"}))
        .send()
        .await;
    expect(res.unwrap(), 201).await;
    let res = app.request(Method::POST, docs).header("sec-fetch-site", "same-origin").json(&json!({"_id": "c"})).send();
    expect(res.await.unwrap(), 201).await;
    expect(app.post(docs, &json!({"_id": "d"})).await, 201).await;
    app.stop().await;

    // Origins TXGATE_CORS_ORIGINS lists may change things; `*` any but `null`.
    let listed = "https://app.example";
    let app = TestApp::spawn_with(Backend::Embedded, |c| c.cors = txgate::config::Cors::parse(listed).unwrap())
        .await
        .unwrap();
    let res = app.request(Method::POST, docs).header("origin", listed).json(&json!({"_id": "a"})).send().await;
    expect(res.unwrap(), 201).await;
    let res = app.request(Method::POST, docs).header("origin", "https://evil.example").json(&json!({"_id": "b"}));
    expect_problem(res.send().await.unwrap(), 403, "cross_origin").await;
    app.stop().await;
    let app =
        TestApp::spawn_with(Backend::Embedded, |c| c.cors = txgate::config::Cors::parse("*").unwrap()).await.unwrap();
    let res = app.request(Method::POST, docs).header("origin", "https://any.example").json(&json!({"_id": "a"}));
    expect(res.send().await.unwrap(), 201).await;
    let res = app.request(Method::POST, docs).header("origin", "null").json(&json!({"_id": "b"}));
    expect_problem(res.send().await.unwrap(), 403, "cross_origin").await;
    app.stop().await;

    // With keys, the key is what counts.
    const KEY: &str = "writer-key-0123456789";
    let app = TestApp::spawn_with(Backend::Embedded, |c| c.api_keys = parse_keys(&format!("{KEY}:write")).unwrap())
        .await
        .unwrap();
    let res = app.request(Method::POST, docs).bearer_auth(KEY).header("origin", "https://evil.example");
    expect(res.json(&json!({"_id": "a"})).send().await.unwrap(), 201).await;
    app.stop().await;
}

/// A document's data is at most 4 MiB (as BSON) however it gets there
/// (create, patch, merge, a transaction's update), and a transaction
/// writes at most 64 MiB of document data: beyond, 422 with nothing
/// written. These bound every record the gateway writes and what one
/// transaction's writes hold in memory.
async fn documents_and_transactions_are_bounded_in_bytes_before_anything_is_written(backend: Backend) {
    // The bounds are the gateway's, the same on both stores; what is timed
    // here is not. On the test server (PostgreSQL on the same two cores)
    // the reads of 70 MB, and of 270 MB below, can pass the default 5 s
    // store deadline while the suite's other tests run, so the deadlines
    // are raised as an operator would for such documents.
    let Some(app) = TestApp::spawn_with(backend, |c| {
        c.max_body_bytes = 8 << 20;
        c.txn.store_timeout = Duration::from_secs(120);
        c.txn.max_duration = Duration::from_secs(240);
    })
    .await
    else {
        return;
    };
    let big = "x".repeat(5 << 20);
    let p = expect_problem(
        app.post("/v1/collections/big/documents", &json!({"_id": "a", "s": big})).await,
        422,
        "validation_failed",
    )
    .await;
    assert!(p["detail"].as_str().unwrap().contains("over the limit"), "{p}");
    // Under the limit, then patched over it.
    let part = "y".repeat(3 << 20);
    expect(app.post("/v1/collections/big/documents", &json!({"_id": "b", "s": part})).await, 201).await;
    let grow = json!({"set": {"t": "z".repeat((1 << 20) + 512 * 1024)}});
    let res = app.send_json(Method::PATCH, "/v1/collections/big/documents/b", &grow).await;
    assert_eq!(res.status(), 422);
    let merge = app
        .request(Method::PATCH, "/v1/collections/big/documents/b")
        .header("content-type", "application/merge-patch+json")
        .json(&grow["set"])
        .send()
        .await
        .unwrap();
    assert_eq!(merge.status(), 422);
    let t = json!({"actions": [{"op": "update", "collection": "big", "id": "b", "set": grow["set"]}]});
    let res = app.post("/v1/transactions", &t).await;
    assert_eq!(res.status(), 422);
    let b = expect(app.get("/v1/collections/big/documents/b").await, 200).await;
    assert_eq!(b["version"], 1, "nothing was written: {}", b["version"]);
    // A transaction over 64 MiB in all: 17 documents of 4.1 MB, updated.
    let fill = "w".repeat(4_100_000);
    for i in 0..17 {
        expect(app.post("/v1/collections/many/documents", &json!({"_id": format!("m{i:02}"), "s": fill})).await, 201)
            .await;
    }
    let actions: Vec<_> = (0..17)
        .map(|i| json!({"op": "update", "collection": "many", "id": format!("m{i:02}"), "set": {"n": i}}))
        .collect();
    let res = app.post("/v1/transactions", &json!({"actions": actions})).await;
    let status = res.status();
    let body: serde_json::Value = res.json().await.unwrap();
    assert_eq!(status, 422, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("over the limit"), "{body}");
    for i in 0..17 {
        let d = expect(app.get(&format!("/v1/collections/many/documents/m{i:02}")).await, 200).await;
        assert_eq!(d["version"], 1);
    }
    // What a transaction reads is bounded too, checks and deletes included
    // (they write no data): 65 documents of 4.1 MB (266.5 MB) are read,
    // 66 (270.6 MB) pass 256 MiB and are refused before anything is
    // written, whatever collections they are in.
    for i in 17..66 {
        let coll = if i % 2 == 0 { "many" } else { "more" };
        expect(
            app.post(&format!("/v1/collections/{coll}/documents"), &json!({"_id": format!("m{i:02}"), "s": fill}))
                .await,
            201,
        )
        .await;
    }
    let checks = |n: usize| {
        let actions: Vec<_> = (0..n)
            .map(|i| {
                let coll = if i < 17 || i % 2 == 0 { "many" } else { "more" };
                json!({"op": "check", "collection": coll, "id": format!("m{i:02}"), "if_version": 1})
            })
            .collect();
        json!({"actions": actions})
    };
    let refused = expect_problem(app.post("/v1/transactions", &checks(66)).await, 422, "document_rejected").await;
    assert!(refused["detail"].as_str().unwrap().contains("256 MiB"), "{refused}");
    let (_, head) = crate::support::all_events(&app, 0, "").await;
    expect(app.post("/v1/transactions", &checks(65)).await, 200).await;
    let mut deletes = checks(66);
    for action in deletes["actions"].as_array_mut().unwrap() {
        action["op"] = json!("delete");
    }
    expect_problem(app.post("/v1/transactions", &deletes).await, 422, "document_rejected").await;
    let (events, _) = crate::support::all_events(&app, head, "").await;
    assert!(events.iter().all(|e| e["type"] != "document.deleted"), "a refused transaction deleted: {events:?}");
    app.stop().await;
}
