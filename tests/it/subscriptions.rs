//! Event subscriptions over real HTTP to a real receiver: exactly the
//! filtered events from creation on, signed, one document's events in
//! version order, retried, dead-lettered, replayed; checked input; several
//! instances recording each delivery once.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{Backend, Received, SECRET, TestApp, TestReceiver, expect, expect_problem, signed_app};

crate::on_both_backends!(
    subscriptions_get_exactly_their_events_signed_in_document_order,
    a_failing_receiver_holds_back_later_events_of_the_document,
    a_down_receiver_is_retried_then_dead_and_replayed_when_back,
    subscriptions_are_checked_listed_and_deleted,
    two_instances_record_each_delivery_once,
    a_key_has_its_share_of_subscriptions_and_others_cost_it_nothing,
);

const S: &str = "/v1/subscriptions";
const WAIT: Duration = Duration::from_secs(20);

async fn subscribe(app: &TestApp, body: Value) -> String {
    let res = app.post(S, &body).await;
    let location = res.headers().get("location").map(|v| v.to_str().unwrap().to_owned());
    let out = expect(res, 201).await;
    let id = out["id"].as_str().unwrap().to_owned();
    assert_eq!(location.as_deref(), Some(format!("{S}/{id}").as_str()));
    id
}

async fn create(app: &TestApp, coll: &str, id: &str, data: Value) {
    let mut body = data;
    body["_id"] = json!(id);
    expect(app.post(&format!("/v1/collections/{coll}/documents"), &body).await, 201).await;
}

async fn patch(app: &TestApp, coll: &str, id: &str, set: Value) {
    let res =
        app.send_json(Method::PATCH, &format!("/v1/collections/{coll}/documents/{id}"), &json!({"set": set})).await;
    expect(res, 200).await;
}

/// The next `n` requests the receiver gets.
async fn receive(rx: &TestReceiver, n: usize) -> Vec<Received> {
    let mut got = Vec::with_capacity(n);
    for _ in 0..n {
        got.push(rx.next(WAIT).await);
    }
    got
}

fn webhook_ids(got: &[Received]) -> Vec<String> {
    got.iter().map(|r| r.header("webhook-id").to_owned()).collect()
}

/// `GET /v1/deliveries/{id}` (the id percent-encoded: event ids hold `/`).
async fn delivery(app: &TestApp, id: &str) -> Value {
    expect(app.get(&format!("/v1/deliveries/{}", id.replace('/', "%2F"))).await, 200).await
}

async fn delivery_until(app: &TestApp, id: &str, status: &str) -> Value {
    let mut found = Value::Null;
    app.until(&format!("delivery {id} got {status}"), async || {
        let res = app.get(&format!("/v1/deliveries/{}", id.replace('/', "%2F"))).await;
        if res.status() != 200 {
            return false;
        }
        found = res.json().await.unwrap();
        found["status"] == status
    })
    .await;
    found
}

async fn subscriptions_get_exactly_their_events_signed_in_document_order(backend: Backend) {
    let Some(app) = signed_app(backend).await else { return };
    let rx = TestReceiver::start().await;
    // Before any subscription: never delivered.
    create(&app, "acc", "early", json!({"n": 0})).await;
    let docs = subscribe(
        &app,
        json!({"url": rx.url("/docs"), "collections": ["acc"], "types": ["document.created", "document.updated", "document.deleted"]}),
    )
    .await;
    let txns = subscribe(&app, json!({"url": rx.url("/txns"), "types": ["transaction.committed"]})).await;
    create(&app, "acc", "a", json!({"n": 1})).await;
    for n in 2..=4 {
        patch(&app, "acc", "a", json!({"n": n})).await;
    }
    create(&app, "other", "x", json!({})).await;
    let t = json!({"actions": [
        {"op": "update", "collection": "acc", "id": "a", "set": {"n": 5}},
        {"op": "insert", "collection": "acc", "id": "b", "data": {"n": 0}},
        {"op": "insert", "collection": "other", "id": "y", "data": {}},
    ]});
    let txn = expect(app.post("/v1/transactions", &t).await, 200).await["id"].as_str().unwrap().to_owned();
    let res = app.request(Method::DELETE, "/v1/collections/acc/documents/b").send().await.unwrap();
    assert_eq!(res.status(), 204);

    let mut got = receive(&rx, 8).await;
    got.extend(rx.collect_for(Duration::from_millis(700)).await);
    let ids = webhook_ids(&got);
    let mut expected: Vec<String> = ["acc/a/1", "acc/a/2", "acc/a/3", "acc/a/4", "acc/a/5", "acc/b/1", "acc/b/2"]
        .iter()
        .map(|e| format!("{docs}:{e}"))
        .collect();
    expected.push(format!("{txns}:_txns/{txn}"));
    let mut sorted = ids.clone();
    sorted.sort();
    expected.sort();
    assert_eq!(sorted, expected, "exactly the filtered events, each once");
    // One document's events arrive in version order.
    let versions = |doc: &str| -> Vec<i64> {
        got.iter()
            .map(Received::json)
            .filter(|e| e["collection"] == "acc" && e["document"] == doc)
            .map(|e| e["version"].as_i64().unwrap())
            .collect()
    };
    assert_eq!(versions("a"), vec![1, 2, 3, 4, 5]);
    assert_eq!(versions("b"), vec![1, 2]);
    let verifier = standardwebhooks::Webhook::new(SECRET).unwrap();
    for r in &got {
        let event = r.json();
        let (sub, event_id) = r.header("webhook-id").split_once(':').unwrap();
        assert_eq!(event["id"], event_id, "the body is the event the id names");
        assert_eq!(r.header("txgate-subscription"), sub);
        assert_eq!(r.path, if sub == docs { "/docs" } else { "/txns" });
        assert_eq!(r.method, "POST");
        assert_eq!(r.header("content-type"), "application/json");
        verifier.verify(&r.body, &r.headers).unwrap_or_else(|e| panic!("{event_id}: bad signature: {e:?}"));
        match event["transaction"].as_str() {
            Some(t) => assert_eq!(r.header("txgate-transaction"), t),
            None => assert!(r.headers.get("txgate-transaction").is_none()),
        }
    }
    let by_id: HashMap<String, Value> = got.iter().map(|r| (r.header("webhook-id").to_owned(), r.json())).collect();
    assert_eq!(by_id[&format!("{docs}:acc/a/2")]["data"], json!({"n": 2}));
    assert_eq!(by_id[&format!("{docs}:acc/b/2")]["type"], "document.deleted");
    assert_eq!(by_id[&format!("{txns}:_txns/{txn}")]["members"].as_array().unwrap().len(), 3);
    // The deliveries are listed with the rest.
    let d = delivery_until(&app, &format!("{docs}:acc/a/5"), "delivered").await;
    assert_eq!((d["subscription"].as_str(), d["event"].as_str()), (Some(docs.as_str()), Some("acc/a/5")));
    assert_eq!(d["transaction"], json!(txn));
    let d = delivery(&app, &format!("{docs}:acc/a/1")).await;
    assert_eq!(d["transaction"], Value::Null);
    app.stop().await;
}

async fn a_failing_receiver_holds_back_later_events_of_the_document(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let rx = TestReceiver::start().await;
    let sub = subscribe(&app, json!({"url": rx.url("/"), "collections": ["acc"]})).await;
    rx.fail_next(2, 500);
    create(&app, "acc", "a", json!({"n": 1})).await;
    patch(&app, "acc", "a", json!({"n": 2})).await;
    patch(&app, "acc", "a", json!({"n": 3})).await;
    let got = receive(&rx, 5).await;
    let ids = webhook_ids(&got);
    let id = |v: i64| format!("{sub}:acc/a/{v}");
    assert_eq!(ids, vec![id(1), id(1), id(1), id(2), id(3)], "version 2 waits until version 1 is delivered");
    assert_eq!(got.iter().map(|r| r.status).collect::<Vec<_>>(), vec![500, 500, 200, 200, 200]);
    let d = delivery(&app, &id(1)).await;
    assert_eq!(d["attempts"].as_array().unwrap().len(), 3);

    // A 410 is dead at once; the document's next event goes after it.
    rx.fail_next(1, 410);
    patch(&app, "acc", "a", json!({"n": 4})).await;
    patch(&app, "acc", "a", json!({"n": 5})).await;
    let got = receive(&rx, 2).await;
    assert_eq!(webhook_ids(&got), vec![id(4), id(5)]);
    delivery_until(&app, &id(4), "dead").await;
    delivery_until(&app, &id(5), "delivered").await;
    // Replayed by hand, it is sent again, with the same body.
    let res = app.request(Method::POST, &format!("/v1/deliveries/{}/retry", id(4).replace('/', "%2F"))).send().await;
    expect(res.unwrap(), 202).await;
    let again = rx.next(WAIT).await;
    assert_eq!(again.header("webhook-id"), id(4));
    assert_eq!(again.body, got[0].body);
    delivery_until(&app, &id(4), "delivered").await;
    app.stop().await;
}

async fn a_down_receiver_is_retried_then_dead_and_replayed_when_back(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| c.hooks.max_age = Duration::from_secs(2)).await else { return };
    let rx = TestReceiver::start().await;
    let addr = rx.addr.to_string();
    let sub = subscribe(&app, json!({"url": rx.url("/"), "types": ["document.created", "document.updated"]})).await;
    rx.stop();
    create(&app, "acc", "a", json!({})).await;
    patch(&app, "acc", "a", json!({"n": 2})).await;
    let id = format!("{sub}:acc/a/1");
    // Refused connections are retried with backoff until the maximum age.
    let dead = delivery_until(&app, &id, "dead").await;
    let attempts = dead["attempts"].as_array().unwrap();
    assert!(attempts.len() >= 3, "retried before it died: {dead}");
    assert!(attempts.iter().all(|a| a["status_code"].is_null() && a["error"].is_string()), "{dead}");
    // The document's next event waited meanwhile; its own maximum age
    // counts from then, so it is retried as long, not dead at once.
    let next = delivery_until(&app, &format!("{sub}:acc/a/2"), "dead").await;
    assert!(next["attempts"].as_array().unwrap().len() >= 3, "retried after its wait: {next}");
    // Back up on the same address, a replay delivers it.
    let rx = TestReceiver::start_on(&addr).await;
    let res = app.request(Method::POST, &format!("/v1/deliveries/{}/retry", id.replace('/', "%2F"))).send().await;
    expect(res.unwrap(), 202).await;
    let got = rx.next(WAIT).await;
    assert_eq!(got.header("webhook-id"), id);
    assert_eq!(got.json()["id"], "acc/a/1");
    delivery_until(&app, &id, "delivered").await;
    app.stop().await;
}

async fn subscriptions_are_checked_listed_and_deleted(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let rx = TestReceiver::start().await;
    for (body, code) in [
        (json!({"url": "ftp://example.com/"}), "validation_failed"),
        (json!({"url": "not a url"}), "validation_failed"),
        (json!({"url": "http://10.1.2.3/x"}), "hook_not_allowed"),
        (json!({"url": "http://localhost:9/x"}), "hook_not_allowed"),
        (json!({"url": rx.url("/"), "types": ["document.nope"]}), "validation_failed"),
        (json!({"url": rx.url("/"), "types": []}), "validation_failed"),
        (json!({"url": rx.url("/"), "collections": []}), "validation_failed"),
        (json!({"url": rx.url("/"), "collections": ["_txns"]}), "validation_failed"),
        (json!({"url": rx.url("/"), "filter": "x"}), "validation_failed"),
        (json!({"url": rx.url("/"), "types": null}), "validation_failed"),
        (json!({"url": rx.url("/"), "collections": ["acc", "acc"]}), "validation_failed"),
        (json!({"url": rx.url("/"), "types": ["document.created", "document.created"]}), "validation_failed"),
        (json!({"url": "https://a.example.com*/x"}), "validation_failed"),
        (json!({"url": "https://a.example.com/J%rh"}), "validation_failed"),
        (json!({"collections": ["a"]}), "validation_failed"),
        (json!([rx.url("/")]), "validation_failed"),
    ] {
        expect_problem(app.post(S, &body).await, 422, code).await;
    }
    let listed = expect(app.get(S).await, 200).await;
    assert_eq!(listed["items"], json!([]), "nothing was half-created");

    let keep = subscribe(&app, json!({"url": rx.url("/keep"), "collections": ["acc"]})).await;
    let gone = subscribe(&app, json!({"url": rx.url("/gone")})).await;
    let one = expect(app.get(&format!("{S}/{keep}")).await, 200).await;
    assert_eq!(one["collections"], json!(["acc"]));
    assert_eq!(one["types"], Value::Null);
    assert_eq!(one["url"], json!(rx.url("/keep")));
    let page = expect(app.get(&format!("{S}?limit=1")).await, 200).await;
    assert_eq!(page["items"][0]["id"], json!(keep));
    let rest = expect(app.get(&format!("{S}?limit=1&after={}", page["next"].as_str().unwrap())).await, 200).await;
    assert_eq!(rest["items"][0]["id"], json!(gone));
    assert_eq!(rest["next"], Value::Null);

    // A delivery of `gone` that keeps failing; then `gone` is deleted.
    rx.fail_next(1000, 500);
    create(&app, "acc", "a", json!({})).await;
    let pending = format!("{gone}:acc/a/1");
    delivery_until(&app, &pending, "failed").await;
    let res = app.request(Method::DELETE, &format!("{S}/{gone}")).send().await.unwrap();
    assert_eq!(res.status(), 204);
    expect_problem(app.get(&format!("{S}/{gone}")).await, 404, "not_found").await;
    let res = app.request(Method::DELETE, &format!("{S}/{gone}")).send().await.unwrap();
    assert_eq!(res.status(), 404);
    // Its undelivered delivery is dead without another attempt.
    let res = app.request(Method::POST, &format!("/v1/deliveries/{}/retry", pending.replace('/', "%2F"))).send().await;
    assert!([202, 409].contains(&res.unwrap().status().as_u16()));
    let dead = delivery_until(&app, &pending, "dead").await;
    let last = dead["attempts"].as_array().unwrap().last().unwrap().clone();
    assert!(last["error"].as_str().unwrap().contains("deleted"), "{last}");
    assert_eq!(last["status_code"], Value::Null);
    // And no event after the deletion reaches it.
    create(&app, "acc", "b", json!({})).await;
    delivery_until(&app, &format!("{keep}:acc/b/1"), "failed").await;
    let res = app.get(&format!("/v1/deliveries/{}", format!("{gone}:acc/b/1").replace('/', "%2F"))).await;
    if res.status() != 404 {
        // Recorded by a pass that began before the deletion: dead unsent.
        let d: Value = res.json().await.unwrap();
        assert!(d["status"] == "dead" || d["status"] == "pending", "{d}");
    }
    let sent = rx.collect_for(Duration::from_millis(700)).await;
    let late = format!("{gone}:acc/b/1");
    assert!(sent.iter().all(|r| r.header("webhook-id") != late), "a deleted subscription is sent nothing new");
    app.stop().await;
}

async fn two_instances_record_each_delivery_once(backend: Backend) {
    let Some(a) = TestApp::spawn(backend).await else { return };
    let b = TestApp::on_store(a.config.clone(), Arc::clone(&a.store), None).await;
    let rx = TestReceiver::start().await;
    let sub = subscribe(&a, json!({"url": rx.url("/"), "types": ["document.created", "document.updated"]})).await;
    let writers = [&a, &b].into_iter().enumerate().map(|(w, app)| async move {
        for i in 0..10 {
            let id = format!("w{w}-{i}");
            create(app, "two", &id, json!({"i": i})).await;
            patch(app, "two", &id, json!({"i": i + 1})).await;
        }
    });
    futures::future::join_all(writers).await;
    let mut got = receive(&rx, 40).await;
    got.extend(rx.collect_for(Duration::from_millis(700)).await);
    let mut ids = webhook_ids(&got);
    ids.sort();
    let mut expected: Vec<String> =
        (0..2).flat_map(|w| (0..10).flat_map(move |i| (1..=2).map(move |v| format!("two/w{w}-{i}/{v}")))).collect();
    expected = expected.into_iter().map(|e| format!("{sub}:{e}")).collect();
    expected.sort();
    assert_eq!(ids, expected, "every event once, through either instance");
    b.stop().await;
    a.stop().await;
}

/// Each API key has at most its share of subscriptions (409
/// `subscription_limit` beyond, for that key only; a delete frees one),
/// and dispatching one tenant's events costs nothing for another tenant's
/// subscriptions: no write of their positions while their collections are
/// quiet.
async fn a_key_has_its_share_of_subscriptions_and_others_cost_it_nothing(backend: Backend) {
    use crate::faulty::{Act, Op};
    const WA: &str = "tenant-a-key-0123456789";
    const WB: &str = "tenant-b-key-0123456789";
    const SHARE: usize = 40;
    let writes: Arc<std::sync::Mutex<HashMap<String, usize>>> = Arc::default();
    let counted = Arc::clone(&writes);
    let rule = move |op: &Op| {
        if op.kind == "update" && op.coll == "_subscriptions" {
            *counted.lock().unwrap().entry(op.id.unwrap_or_default().to_owned()).or_default() += 1;
        }
        Act::Pass
    };
    let tweak = |c: &mut txgate::config::Config| {
        c.max_subscriptions_per_key = SHARE;
        c.api_keys = txgate::testing::keys::parse_keys(&format!("{WA}:read@a+write@a,{WB}:read@b+write@b")).unwrap();
    };
    let Some(app) = crate::faulty::rigged_app(backend, tweak, rule).await else { return };
    let rx = TestReceiver::start().await;
    let as_key = |key: &str, body: Value| app.request(Method::POST, S).bearer_auth(key).json(&body).send();
    let mut of_a = Vec::new();
    for i in 0..SHARE {
        let res = as_key(WA, json!({"url": rx.url(&format!("/a{i}")), "collections": ["a"]})).await.unwrap();
        of_a.push(expect(res, 201).await["id"].as_str().unwrap().to_owned());
    }
    let res = as_key(WA, json!({"url": rx.url("/a-more"), "collections": ["a"]})).await.unwrap();
    let problem = expect_problem(res, 409, "subscription_limit").await;
    assert!(problem["detail"].as_str().unwrap().contains("TXGATE_MAX_SUBSCRIPTIONS_PER_KEY"), "{problem}");
    // Another key has its own share.
    let res = as_key(WB, json!({"url": rx.url("/b"), "collections": ["b"]})).await.unwrap();
    let of_b = expect(res, 201).await["id"].as_str().unwrap().to_owned();
    // Tenant B writes; its subscription gets every event.
    writes.lock().unwrap().clear();
    for i in 0..30 {
        let res = app
            .request(Method::POST, "/v1/collections/b/documents")
            .bearer_auth(WB)
            .json(&json!({"_id": format!("d{i}")}))
            .send()
            .await
            .unwrap();
        expect(res, 201).await;
    }
    let got = receive(&rx, 30).await;
    assert!(got.iter().all(|r| r.path == "/b"), "only B's subscription delivers");
    // Whatever A's subscriptions would write for B's events is written by now.
    app.run_once("subscriptions").await;
    app.run_once("deliveries").await;
    let writes = std::mem::take(&mut *writes.lock().unwrap());
    let of_a_written: usize = of_a.iter().map(|id| writes.get(id).copied().unwrap_or(0)).sum();
    assert_eq!(of_a_written, 0, "A's subscriptions cost B's writes nothing: {writes:?}");
    assert!(writes.get(&of_b).copied().unwrap_or(0) >= 1, "B's position moves: {writes:?}");
    // A delete frees a place.
    let res = app.request(Method::DELETE, &format!("{S}/{}", of_a[0])).bearer_auth(WA).send().await.unwrap();
    assert_eq!(res.status(), 204);
    let res = as_key(WA, json!({"url": rx.url("/a-again"), "collections": ["a"]})).await.unwrap();
    expect(res, 201).await;
    // And A's subscriptions still get A's events.
    let res = app
        .request(Method::POST, "/v1/collections/a/documents")
        .bearer_auth(WA)
        .json(&json!({"_id": "x"}))
        .send()
        .await
        .unwrap();
    expect(res, 201).await;
    let got = receive(&rx, SHARE).await;
    let mut paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    paths.sort_unstable();
    paths.dedup();
    assert_eq!(paths.len(), SHARE, "every subscription of A, once: {paths:?}");
    app.stop().await;
}
