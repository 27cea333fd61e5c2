//! API keys and scopes over HTTP.

use base64::Engine as _;
use reqwest::Method;
use serde_json::json;
use txgate::testing::keys::parse_keys;

use crate::support::{Backend, TestApp, expect, expect_problem};

const READER: &str = "reader-key-0123456789";
const WRITER: &str = "writer-key-0123456789";

#[tokio::test]
async fn keys_and_scopes_are_enforced() {
    let app = TestApp::spawn_with(Backend::Embedded, |c| {
        c.api_keys = parse_keys(&format!("{READER}:read,{WRITER}:write")).unwrap();
    })
    .await
    .unwrap();
    let url = "/v1/collections/a/documents";
    // A refusal that leaves a sent body unread ends its connection, and
    // says so; one without a body keeps it.
    let closes = |res: &reqwest::Response| res.headers().get("connection").is_some_and(|v| v == "close");
    let res = app.post(url, &json!({"x": 1})).await;
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
    assert!(closes(&res), "{:?}", res.headers());
    expect_problem(res, 401, "unauthorized").await;
    let res = app.request(Method::POST, url).bearer_auth("wrong-key-0123456789").json(&json!({})).send().await.unwrap();
    assert!(closes(&res), "{:?}", res.headers());
    expect_problem(res, 401, "unauthorized").await;
    let res = app.request(Method::POST, url).bearer_auth(READER).json(&json!({"_id": "d"})).send().await.unwrap();
    assert!(closes(&res), "{:?}", res.headers());
    let p = expect_problem(res, 403, "forbidden").await;
    assert_eq!(p["required_scope"], "write");
    let res = app.request(Method::GET, &format!("{url}/d")).send().await.unwrap();
    assert!(!closes(&res), "{:?}", res.headers());
    expect_problem(res, 401, "unauthorized").await;
    let res = app.request(Method::POST, url).bearer_auth(WRITER).json(&json!({"_id": "d"})).send().await.unwrap();
    expect(res, 201).await;
    let res = app.request(Method::GET, &format!("{url}/d")).bearer_auth(READER).send().await.unwrap();
    expect(res, 200).await;
    // A path parameter that cannot be decoded is refused as the handler
    // refuses it (once the key is known).
    for path in ["/v1/collections/%FF/documents", "/v1/collections/%FF", "/v1/collections/a/indexes/%FF"] {
        let res = app.request(Method::GET, path).bearer_auth(READER).send().await.unwrap();
        let p = expect_problem(res, 400, "invalid_path").await;
        assert!(p["detail"].as_str().unwrap().contains("UTF-8"), "{path}: {p}");
        expect_problem(app.request(Method::GET, path).send().await.unwrap(), 401, "unauthorized").await;
    }
    // Health, readiness and the API description stay public.
    for open in ["/healthz", "/readyz", "/openapi.json"] {
        assert_eq!(app.get(open).await.status(), 200, "{open}");
    }
    app.stop().await;
}

const APP: &str = "http://app.example.com";

/// CORS for configured origins: a preflight on any route is answered
/// (before authentication: it carries no key) with the methods and the
/// request headers the API reads; answers expose `ETag`, `Location` and
/// `Retry-After`; another origin gets no CORS headers at all.
#[tokio::test]
async fn browsers_on_allowed_origins_may_call_and_read_etag() {
    let app = TestApp::spawn_with(Backend::Embedded, |c| {
        c.api_keys = parse_keys(&format!("{WRITER}:write")).unwrap();
        c.cors = txgate::config::Cors::parse(&format!("{APP}, https://other.example:8443")).unwrap();
    })
    .await
    .unwrap();
    for (path, method) in [
        ("/v1/collections/a/documents/x", "PUT"),
        ("/v1/collections/a/documents", "POST"),
        ("/v1/transactions", "POST"),
        ("/v1/collections/a/documents/x", "DELETE"),
    ] {
        let res = app
            .request(Method::OPTIONS, path)
            .header("origin", APP)
            .header("access-control-request-method", method)
            .header("access-control-request-headers", "if-match, idempotency-key, authorization, content-type")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200, "preflight of {method} {path}");
        let h = res.headers();
        assert_eq!(h["access-control-allow-origin"], APP);
        assert!(h["access-control-allow-methods"].to_str().unwrap().contains(method));
        let allowed = h["access-control-allow-headers"].to_str().unwrap().to_ascii_lowercase();
        for name in ["if-match", "if-none-match", "idempotency-key", "authorization", "content-type"] {
            assert!(allowed.contains(name), "{name} not in {allowed}");
        }
        assert!(h.get("access-control-allow-credentials").is_none());
    }
    let res = app
        .request(Method::POST, "/v1/collections/a/documents")
        .header("origin", APP)
        .bearer_auth(WRITER)
        .json(&json!({"_id": "d", "n": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 201);
    let exposed = res.headers()["access-control-expose-headers"].to_str().unwrap().to_ascii_lowercase();
    for name in ["etag", "location", "retry-after"] {
        assert!(exposed.contains(name), "{name} not exposed: {exposed}");
    }
    assert_eq!(res.headers()["access-control-allow-origin"], APP);
    // Errors carry CORS headers too, so a page can read the problem.
    let res = app.request(Method::GET, "/v1/collections/a/documents/d").header("origin", APP).send().await.unwrap();
    assert_eq!(res.headers()["access-control-allow-origin"], APP);
    expect_problem(res, 401, "unauthorized").await;
    // Not an allowed origin: no CORS headers, so the browser blocks it.
    let res = app
        .request(Method::OPTIONS, "/v1/transactions")
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert!(res.headers().get("access-control-allow-origin").is_none());
    app.stop().await;
}

/// Unset, no CORS headers are sent; `*` allows any origin without
/// credentials; malformed origins are refused at start.
#[tokio::test]
async fn cors_is_off_unless_configured_and_any_origin_is_explicit() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let res = app.request(Method::GET, "/healthz").header("origin", APP).send().await.unwrap();
    assert!(res.headers().get("access-control-allow-origin").is_none());
    app.stop().await;

    let app =
        TestApp::spawn_with(Backend::Embedded, |c| c.cors = txgate::config::Cors::parse("*").unwrap()).await.unwrap();
    let res = app
        .request(Method::OPTIONS, "/v1/collections/a/documents/x")
        .header("origin", "https://anywhere.example")
        .header("access-control-request-method", "PATCH")
        .header("access-control-request-headers", "if-match")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["access-control-allow-origin"], "*");
    app.stop().await;

    use txgate::config::Cors;
    assert_eq!(Cors::parse("").unwrap(), Cors::None);
    assert_eq!(
        Cors::parse("https://a.example/, http://b.example:8080").unwrap(),
        Cors::Origins(vec!["https://a.example".into(), "http://b.example:8080".into()])
    );
    for bad in ["*, https://a.example", "a.example", "https://a.example/app", "ftp://a.example"] {
        assert!(Cors::parse(bad).is_err(), "{bad} accepted");
    }
}

const ADMIN: &str = "admin-key-0123456789";
const ORDERS: &str = "orders-key-0123456789";
const AUDIT: &str = "audit-key-0123456789";

crate::on_both_backends!(
    keys_limited_to_collections_reach_only_those,
    list_cursors_show_a_limited_key_nothing_of_the_records_it_cannot_see,
);

/// A key limited to collections (`read@orders+write@orders`): documents,
/// collections, transactions (every member), batch reads (every member),
/// events and subscriptions
/// (their filters, and what they deliver) outside them are refused with
/// 403 and nothing is written; lists show what lies within.
async fn keys_limited_to_collections_reach_only_those(backend: Backend) {
    let spec = format!("{ADMIN}:admin,{ORDERS}:read@orders+write@orders,{AUDIT}:read@orders+read@payments");
    let Some(app) = TestApp::spawn_with(backend, |c| c.api_keys = parse_keys(&spec).unwrap()).await else { return };
    let as_key = |key: &'static str, method: Method, path: &str, body: Option<serde_json::Value>| {
        let mut req = app.request(method, path).bearer_auth(key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        async move { req.send().await.unwrap() }
    };
    let orders = "/v1/collections/orders/documents";
    let payments = "/v1/collections/payments/documents";
    expect(as_key(ADMIN, Method::POST, payments, Some(json!({"_id": "p1", "amount": 5}))).await, 201).await;

    // Documents and collections: by the path.
    expect(as_key(ORDERS, Method::POST, orders, Some(json!({"_id": "o1"}))).await, 201).await;
    expect(as_key(ORDERS, Method::GET, &format!("{orders}/o1"), None).await, 200).await;
    let p = expect_problem(as_key(ORDERS, Method::POST, payments, Some(json!({"_id": "p9"}))).await, 403, "forbidden")
        .await;
    assert_eq!((p["required_scope"].as_str(), p["collection"].as_str()), (Some("write"), Some("payments")));
    expect_problem(as_key(ORDERS, Method::GET, &format!("{payments}/p1"), None).await, 403, "forbidden").await;
    expect_problem(as_key(ORDERS, Method::GET, payments, None).await, 403, "forbidden").await;
    let ttl = Some(json!({"ttl": {"max_count": 1}}));
    expect_problem(as_key(ORDERS, Method::PUT, "/v1/collections/payments", ttl).await, 403, "forbidden").await;
    expect(as_key(ORDERS, Method::GET, "/v1/collections/orders", None).await, 200).await;
    expect_problem(as_key(AUDIT, Method::POST, orders, Some(json!({"_id": "o9"}))).await, 403, "forbidden").await;
    expect_problem(as_key(ADMIN, Method::GET, &format!("{payments}/p9"), None).await, 404, "not_found").await;
    expect_problem(as_key(ADMIN, Method::GET, &format!("{orders}/o9"), None).await, 404, "not_found").await;
    let listed = expect(as_key(ORDERS, Method::GET, "/v1/collections", None).await, 200).await;
    let names: Vec<&str> = listed["items"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["orders"], "a limited key lists its collections only");
    // Paged one at a time, its cursors name only its own collections: a
    // cursor is a name, and the others' names are not its to learn.
    expect(as_key(ADMIN, Method::POST, "/v1/collections/a-secret/documents", Some(json!({}))).await, 201).await;
    expect(as_key(ADMIN, Method::POST, "/v1/collections/zz-secret/documents", Some(json!({}))).await, 201).await;
    let (mut after, mut seen, mut pages) = (None::<String>, Vec::new(), 0);
    for key in [AUDIT, ORDERS] {
        loop {
            let path = match &after {
                Some(a) => format!("/v1/collections?limit=1&after={a}"),
                None => "/v1/collections?limit=1".to_owned(),
            };
            let page = expect(as_key(key, Method::GET, &path, None).await, 200).await;
            seen.extend(page["items"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap().to_owned()));
            let text = page.to_string();
            assert!(!text.contains("secret") && !text.contains("c2VjcmV0"), "{page}");
            pages += 1;
            assert!(pages < 10, "paging ends");
            let Some(next) = page["next"].as_str() else { break };
            let decoded = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(next).unwrap();
            let name = String::from_utf8(decoded).unwrap();
            assert!(["orders", "payments"].contains(&name.as_str()), "a cursor names {name:?}");
            after = Some(next.to_owned());
        }
        after = None;
    }
    assert_eq!(seen, ["orders", "payments", "orders"]);

    // Indexes, queries and counts: by the path; a query by POST needs read.
    let index = Some(json!({"fields": ["amount"]}));
    expect_problem(
        as_key(ORDERS, Method::PUT, "/v1/collections/payments/indexes/a", index.clone()).await,
        403,
        "forbidden",
    )
    .await;
    expect_problem(
        as_key(AUDIT, Method::PUT, "/v1/collections/orders/indexes/a", index.clone()).await,
        403,
        "forbidden",
    )
    .await;
    expect(as_key(ORDERS, Method::PUT, "/v1/collections/orders/indexes/a", index).await, 201).await;
    expect_problem(as_key(ORDERS, Method::GET, "/v1/collections/payments/indexes", None).await, 403, "forbidden").await;
    let query = Some(json!({"filter": {"amount": 5}}));
    expect_problem(
        as_key(ORDERS, Method::POST, "/v1/collections/payments/query", query.clone()).await,
        403,
        "forbidden",
    )
    .await;
    expect_problem(as_key(ORDERS, Method::GET, "/v1/collections/payments/count", None).await, 403, "forbidden").await;
    // AUDIT reads payments: the query is served or refused for its index, never forbidden.
    let resp = as_key(AUDIT, Method::POST, "/v1/collections/payments/query", query).await;
    expect_problem(resp, 400, "index_required").await;
    expect(as_key(AUDIT, Method::GET, "/v1/collections/payments/count", None).await, 200).await;

    // Batch reads: read on every member's collection; one outside is a
    // 403 naming it, and nothing of the others is shown.
    let both =
        Some(json!({"documents": [{"collection": "orders", "id": "o1"}, {"collection": "payments", "id": "p1"}]}));
    let p = expect_problem(as_key(ORDERS, Method::POST, "/v1/reads", both.clone()).await, 403, "forbidden").await;
    assert_eq!((p["required_scope"].as_str(), p["collection"].as_str()), (Some("read"), Some("payments")));
    assert!(p.get("documents").is_none(), "{p}");
    let read = expect(as_key(AUDIT, Method::POST, "/v1/reads", both).await, 200).await;
    assert_eq!(read["documents"][1]["document"]["data"]["amount"], 5);
    let own = Some(json!({"documents": [{"collection": "orders", "id": "o1"}]}));
    expect(as_key(ORDERS, Method::POST, "/v1/reads", own).await, 200).await;

    // Transactions: every member, checked before anything is done.
    let mixed = json!({"actions": [
        {"op": "insert", "collection": "orders", "id": "o2", "data": {"n": 1}},
        {"op": "update", "collection": "payments", "id": "p1", "set": {"order": "o2"}},
    ]});
    let p =
        expect_problem(as_key(ORDERS, Method::POST, "/v1/transactions", Some(mixed.clone())).await, 403, "forbidden")
            .await;
    assert_eq!((p["action"].as_i64(), p["collection"].as_str()), (Some(1), Some("payments")));
    let res = app
        .request(Method::POST, "/v1/transactions")
        .bearer_auth(ORDERS)
        .header("Idempotency-Key", "k-1")
        .json(&mixed)
        .send()
        .await
        .unwrap();
    expect_problem(res, 403, "forbidden").await;
    expect_problem(as_key(ADMIN, Method::GET, &format!("{orders}/o2"), None).await, 404, "not_found").await;
    let p1 = expect(as_key(ADMIN, Method::GET, &format!("{payments}/p1"), None).await, 200).await;
    assert_eq!((p1["version"].as_i64(), p1["data"].get("order")), (Some(1), None), "nothing applied");
    let txns = expect(as_key(ADMIN, Method::GET, "/v1/transactions", None).await, 200).await;
    assert_eq!(txns["items"], json!([]), "no transaction was started");
    // A `check` needs read only: orders may be written on a payments check
    // by a key that reads payments... which this one does not.
    let checked = json!({"actions": [
        {"op": "insert", "collection": "orders", "id": "o3", "data": {}},
        {"op": "check", "collection": "payments", "id": "p1", "if_version": 1},
    ]});
    expect_problem(as_key(ORDERS, Method::POST, "/v1/transactions", Some(checked)).await, 403, "forbidden").await;

    // The admin's transaction across both, the orders key's within orders.
    let mixed_out = expect(as_key(ADMIN, Method::POST, "/v1/transactions", Some(mixed)).await, 200).await;
    let own = json!({"actions": [{"op": "insert", "collection": "orders", "id": "o4", "data": {}}]});
    let own_out = expect(as_key(ORDERS, Method::POST, "/v1/transactions", Some(own)).await, 200).await;
    let (mixed_id, own_id) = (mixed_out["id"].as_str().unwrap(), own_out["id"].as_str().unwrap());
    let path = |id: &str| format!("/v1/transactions/{id}");
    // One the key may not read is answered as a missing one: its existence
    // and its collections are not the key's to learn.
    let hidden = expect_problem(as_key(ORDERS, Method::GET, &path(mixed_id), None).await, 404, "not_found").await;
    assert!(!hidden.to_string().contains("payments"), "{hidden}");
    let missing = "01234567-89ab-7def-8123-456789abcdef";
    let absent = expect_problem(as_key(ORDERS, Method::GET, &path(missing), None).await, 404, "not_found").await;
    assert_eq!(hidden["detail"].as_str().unwrap().replace(mixed_id, missing), absent["detail"].as_str().unwrap());
    // An abort needs admin everywhere, whatever the transaction.
    let abort = |id: &str| format!("{}/abort", path(id));
    let refused = expect_problem(as_key(ORDERS, Method::POST, &abort(mixed_id), None).await, 403, "forbidden").await;
    assert_eq!(
        refused,
        expect_problem(as_key(ORDERS, Method::POST, &abort(missing), None).await, 403, "forbidden").await
    );
    expect(as_key(ORDERS, Method::GET, &path(own_id), None).await, 200).await;
    expect(as_key(AUDIT, Method::GET, &path(mixed_id), None).await, 200).await;
    let listed = expect(as_key(ORDERS, Method::GET, "/v1/transactions", None).await, 200).await;
    let ids: Vec<&str> = listed["items"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [own_id]);
    expect_problem(as_key(ORDERS, Method::POST, &format!("{}/abort", path(own_id)), None).await, 403, "forbidden")
        .await;

    // Events: a filter outside is refused; without one, only what lies
    // within (not the admin's transaction event, which names payments).
    let page = |key, q: &str| {
        let req = app.request(Method::GET, &format!("/v1/events?after=0{q}")).bearer_auth(key);
        async move { req.header("accept", "application/json").send().await.unwrap() }
    };
    expect_problem(page(ORDERS, "&collections=payments").await, 403, "forbidden").await;
    expect_problem(page(ORDERS, "&collections=orders,payments").await, 403, "forbidden").await;
    // A transaction's own event is appended by its roll-forward, which may
    // follow its answer: read once that is done.
    app.settled().await;
    let ids_seen = |key: &'static str, q: &'static str| {
        let page = &page;
        async move {
            let body = expect(page(key, q).await, 200).await;
            let mut ids: Vec<String> =
                body["items"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().into()).collect();
            ids.sort();
            ids
        }
    };
    let mut want =
        vec!["orders/o1/1".to_owned(), "orders/o2/1".into(), "orders/o4/1".into(), format!("_txns/{own_id}")];
    want.sort();
    let seen = ids_seen(ORDERS, "").await;
    assert_eq!(seen, want, "the orders key sees orders only");
    let mixed_event = format!("_txns/{mixed_id}");
    let audit = ids_seen(AUDIT, "&collections=orders").await;
    want.push(mixed_event);
    want.sort();
    assert_eq!(audit, want, "with payments readable, the mixed transaction's too");

    // Subscriptions: the filter within, and what is delivered within too.
    let rx = crate::support::TestReceiver::start().await;
    let sub = |key, body: serde_json::Value| as_key(key, Method::POST, "/v1/subscriptions", Some(body));
    let p =
        expect_problem(sub(ORDERS, json!({"url": rx.url("/x"), "collections": ["payments"]})).await, 403, "forbidden")
            .await;
    assert_eq!(p["collection"], "payments");
    // A key that may write nowhere is told so.
    let p = expect_problem(sub(AUDIT, json!({"url": rx.url("/x"), "collections": ["orders"]})).await, 403, "forbidden")
        .await;
    assert_eq!(p["required_scope"], "write");
    assert_eq!(p["detail"], "the API key has the write scope on no collection", "{p}");
    let mine = expect(sub(ORDERS, json!({"url": rx.url("/orders")})).await, 201).await;
    let admins = expect(sub(ADMIN, json!({"url": rx.url("/admin"), "collections": ["orders"]})).await, 201).await;
    let (mine, admins) = (mine["id"].as_str().unwrap(), admins["id"].as_str().unwrap());
    let listed = expect(as_key(ORDERS, Method::GET, "/v1/subscriptions", None).await, 200).await;
    let ids: Vec<&str> = listed["items"].as_array().unwrap().iter().map(|s| s["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [mine]);
    let subs = |id: &str| format!("/v1/subscriptions/{id}");
    expect_problem(as_key(ORDERS, Method::GET, &subs(admins), None).await, 404, "not_found").await;
    expect_problem(as_key(ORDERS, Method::DELETE, &subs(admins), None).await, 404, "not_found").await;
    expect(as_key(ORDERS, Method::GET, &subs(mine), None).await, 200).await;
    let across = json!({"actions": [
        {"op": "insert", "collection": "orders", "id": "o5", "data": {}},
        {"op": "insert", "collection": "payments", "id": "p5", "data": {}},
    ]});
    expect(as_key(ADMIN, Method::POST, "/v1/transactions", Some(across)).await, 200).await;
    expect(as_key(ADMIN, Method::POST, payments, Some(json!({"_id": "p6"}))).await, 201).await;
    expect(as_key(ORDERS, Method::POST, orders, Some(json!({"_id": "o6"}))).await, 201).await;
    // Until both have what they should get (or 20 s), then a second more
    // for anything they should not.
    let mut got = Vec::new();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while got.len() < 5 && std::time::Instant::now() < until {
        got.extend(rx.collect_for(std::time::Duration::from_millis(200)).await);
    }
    got.extend(rx.collect_for(std::time::Duration::from_secs(1)).await);
    let mut to_mine: Vec<String> =
        got.iter().filter(|r| r.path == "/orders").map(|r| r.json()["id"].as_str().unwrap().to_owned()).collect();
    to_mine.sort();
    assert_eq!(to_mine, ["orders/o5/1", "orders/o6/1"], "the limited subscription gets orders events only");
    let to_admin = got.iter().filter(|r| r.path == "/admin").count();
    assert_eq!(to_admin, 3, "the admin's gets the orders events and the transaction's");
    expect(as_key(ORDERS, Method::DELETE, &subs(mine), None).await, 204).await;

    // Everything else needs a key for every collection.
    expect_problem(as_key(ORDERS, Method::GET, "/v1/deliveries", None).await, 403, "forbidden").await;
    expect_problem(as_key(AUDIT, Method::GET, "/v1/deliveries", None).await, 403, "forbidden").await;
    expect(as_key(ADMIN, Method::GET, "/v1/deliveries", None).await, 200).await;
    app.stop().await;
}

/// The transactions and subscriptions lists, paged one record at a time by
/// a key limited to `orders` among others' records: it gets its own, each
/// once, and no page or cursor holds another record's id. Cursors are
/// sealed: one list's is refused by the other, a changed one is refused,
/// and an earlier release's plain cursor (an id) still works.
async fn list_cursors_show_a_limited_key_nothing_of_the_records_it_cannot_see(backend: Backend) {
    let spec = format!("{ADMIN}:admin,{ORDERS}:read@orders+write@orders");
    let Some(app) = TestApp::spawn_with(backend, |c| c.api_keys = parse_keys(&spec).unwrap()).await else { return };
    let send = |key: &'static str, method: Method, path: String, body: Option<serde_json::Value>| {
        let mut req = app.request(method, &path).bearer_auth(key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        async move { req.send().await.unwrap() }
    };
    let rx = crate::support::TestReceiver::start().await;
    let (mut own_txns, mut own_subs, mut others) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..4 {
        // Others' first, then between each of its own.
        for j in 0..2 {
            let other =
                json!({"actions": [{"op": "insert", "collection": "payments", "id": format!("p{i}-{j}"), "data": {}}]});
            let out = expect(send(ADMIN, Method::POST, "/v1/transactions".into(), Some(other)).await, 200).await;
            others.push(out["id"].as_str().unwrap().to_owned());
            let sub = json!({"url": rx.url("/p"), "collections": ["payments"]});
            let out = expect(send(ADMIN, Method::POST, "/v1/subscriptions".into(), Some(sub)).await, 201).await;
            others.push(out["id"].as_str().unwrap().to_owned());
        }
        let own = json!({"actions": [{"op": "insert", "collection": "orders", "id": format!("o{i}"), "data": {}}]});
        let out = expect(send(ORDERS, Method::POST, "/v1/transactions".into(), Some(own)).await, 200).await;
        own_txns.push(out["id"].as_str().unwrap().to_owned());
        let sub = json!({"url": rx.url("/o"), "collections": ["orders"]});
        let out = expect(send(ORDERS, Method::POST, "/v1/subscriptions".into(), Some(sub)).await, 201).await;
        own_subs.push(out["id"].as_str().unwrap().to_owned());
    }
    // And one of others' after the last.
    let other = json!({"actions": [{"op": "insert", "collection": "payments", "id": "p-last", "data": {}}]});
    let out = expect(send(ADMIN, Method::POST, "/v1/transactions".into(), Some(other)).await, 200).await;
    others.push(out["id"].as_str().unwrap().to_owned());
    let sub = json!({"url": rx.url("/p"), "collections": ["payments"]});
    let out = expect(send(ADMIN, Method::POST, "/v1/subscriptions".into(), Some(sub)).await, 201).await;
    others.push(out["id"].as_str().unwrap().to_owned());
    let mut cursors = Vec::new();
    for (list, own) in [("/v1/transactions", &own_txns), ("/v1/subscriptions", &own_subs)] {
        let (mut after, mut seen, mut pages) = (None::<String>, Vec::new(), 0);
        loop {
            let path = match &after {
                Some(a) => format!("{list}?limit=1&after={a}"),
                None => format!("{list}?limit=1"),
            };
            let page = expect(send(ORDERS, Method::GET, path, None).await, 200).await;
            seen.extend(page["items"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap().to_owned()));
            pages += 1;
            // One record a page, and none after the last: the page that
            // holds it reads on to the end of the list.
            assert!(pages <= own.len(), "one record a page: {page}");
            let Some(next) = page["next"].as_str() else { break };
            let text = format!("{page}{}", String::from_utf8_lossy(&base64_url(next)));
            for other in &others {
                assert!(!text.contains(other.as_str()), "{list} shows {other}: {page}");
            }
            cursors.push((list, next.to_owned()));
            after = Some(next.to_owned());
        }
        assert_eq!(&seen, own, "{list}: its own, each once");
        // The admin sees all of them, a page of three at a time.
        let (mut after, mut all) = (None::<String>, 0);
        loop {
            let path = after.as_ref().map_or(format!("{list}?limit=3"), |a| format!("{list}?limit=3&after={a}"));
            let page = expect(send(ADMIN, Method::GET, path, None).await, 200).await;
            all += page["items"].as_array().unwrap().len();
            let Some(next) = page["next"].as_str() else { break };
            after = Some(next.to_owned());
        }
        assert_eq!(all, 13, "{list}: the admin's and the limited key's");
    }
    // A cursor of one list is not one of the other; a changed one is none.
    let (txn_cursor, sub_cursor) = (&cursors[0].1, &cursors.last().unwrap().1);
    let refused = send(ORDERS, Method::GET, format!("/v1/subscriptions?after={txn_cursor}"), None).await;
    let p = expect_problem(refused, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["pointer"], "/query/after", "{p}");
    let refused = send(ORDERS, Method::GET, format!("/v1/transactions?after={sub_cursor}"), None).await;
    expect_problem(refused, 422, "validation_failed").await;
    let mut bent = base64_url(txn_cursor);
    *bent.last_mut().unwrap() ^= 1;
    let bent = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bent);
    expect_problem(
        send(ORDERS, Method::GET, format!("/v1/transactions?after={bent}"), None).await,
        422,
        "validation_failed",
    )
    .await;
    // Nor is anything else that is not a cursor of the list (a damaged
    // one never restarts or ends it silently).
    let mut bytes = base64_url(txn_cursor);
    for first in [0x00, 0x02, 0xff] {
        bytes[0] = first;
        let cursor = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes);
        let res = send(ORDERS, Method::GET, format!("/v1/transactions?after={cursor}"), None).await;
        expect_problem(res, 422, "validation_failed").await;
    }
    for cursor in ["", "aGVsbG8", "MA", own_txns[0].as_str()] {
        let res = send(ORDERS, Method::GET, format!("/v1/subscriptions?after={cursor}"), None).await;
        let p = expect_problem(res, 422, "validation_failed").await;
        assert_eq!(p["errors"][0]["pointer"], "/query/after", "{cursor:?}: {p}");
    }
    // A plain cursor (an earlier release's: the id) names its id.
    let plain = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&own_txns[1]);
    let page = expect(send(ORDERS, Method::GET, format!("/v1/transactions?after={plain}"), None).await, 200).await;
    let ids: Vec<&str> = page["items"].as_array().unwrap().iter().map(|t| t["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [&own_txns[2], &own_txns[3]]);
}

fn base64_url(cursor: &str) -> Vec<u8> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(cursor).unwrap()
}
