//! Post-commit hooks over real HTTP to a real receiver: recorded when (and
//! only when) a transaction commits, sent signed and in order, retried with
//! backoff, dead letters and replay, destinations guarded.

use std::sync::Arc;
use std::time::Duration;

use reqwest::Method;
use serde_json::{Value, json};

use crate::support::{Backend, SECRET, TestApp, TestReceiver, expect, expect_problem, signed_app};

crate::on_both_backends!(
    hooks_are_delivered_signed_in_order_with_fixed_payloads,
    failures_are_retried_with_growing_gaps_and_order_is_kept,
    gone_is_dead_at_once_and_a_replay_sends_it_again,
    retry_after_is_honoured,
    undeliverable_hooks_die_at_max_age,
    aborted_transactions_send_nothing,
    internal_destinations_are_refused_unless_allowed,
    two_instances_never_send_one_attempt_twice,
    a_hanging_receiver_does_not_delay_deliveries_to_another,
);

const T: &str = "/v1/transactions";
const WAIT: Duration = Duration::from_secs(20);

fn insert_with_hooks(id: &str, hooks: Value) -> Value {
    json!({"actions": [{"op": "insert", "collection": "orders", "id": id, "data": {"total": 5}}], "hooks": hooks})
}

/// Poll `GET /v1/deliveries/{id}` until `done` says yes.
async fn delivery_until(app: &TestApp, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let mut found = Value::Null;
    app.until(&format!("delivery {id} got there"), async || {
        let res = app.get(&format!("/v1/deliveries/{id}")).await;
        if res.status() != 200 {
            return false;
        }
        found = res.json().await.unwrap();
        done(&found)
    })
    .await;
    found
}

fn status_is(status: &'static str) -> impl Fn(&Value) -> bool {
    move |d| d["status"] == status
}

async fn hooks_are_delivered_signed_in_order_with_fixed_payloads(backend: Backend) {
    let Some(app) = signed_app(backend).await else { return };
    let rx = TestReceiver::start().await;
    let body = insert_with_hooks(
        "o-1",
        json!([
            {"url": rx.url("/a"), "headers": {"X-Tenant": "t1"}, "body": {"any": ["json", 1]}},
            {"method": "PUT", "url": rx.url("/b")},
            {"url": rx.url("/c")},
        ]),
    );
    let out = expect(app.post(T, &body).await, 200).await;
    let txn = out["id"].as_str().unwrap().to_owned();
    let ids: Vec<String> = (0..3).map(|i| format!("{txn}:{i}")).collect();
    assert_eq!(out["hooks"], json!(ids.iter().map(|id| json!({"id": id, "status": "pending"})).collect::<Vec<_>>()));
    // Readable at once, even before the roll-forward has recorded it.
    let last = expect(app.get(&format!("/v1/deliveries/{}", ids[2])).await, 200).await;
    assert_eq!((last["index"].as_i64(), last["url"].as_str()), (Some(2), Some(rx.url("/c").as_str())));

    let got = [rx.next(WAIT).await, rx.next(WAIT).await, rx.next(WAIT).await];
    assert_eq!(got.iter().map(|r| r.path.as_str()).collect::<Vec<_>>(), ["/a", "/b", "/c"], "in listed order");
    assert_eq!((got[0].method.as_str(), got[1].method.as_str()), ("POST", "PUT"));
    assert_eq!(got[0].json(), json!({"any": ["json", 1]}));
    assert_eq!(got[1].json(), out, "the default body is the commit summary");
    assert_eq!(got[0].header("x-tenant"), "t1");
    let verifier = standardwebhooks::Webhook::new(SECRET).unwrap();
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.header("webhook-id"), ids[i]);
        assert_eq!(r.header("txgate-transaction"), txn);
        assert_eq!(r.header("content-type"), "application/json");
        assert!(r.header("webhook-signature").starts_with("v1,"));
        // Checked by an independent implementation of Standard Webhooks.
        verifier.verify(&r.body, &r.headers).unwrap_or_else(|e| panic!("hook {i}: bad signature: {e:?}"));
    }
    let mut tampered = got[2].body.to_vec();
    tampered.push(b' ');
    assert!(verifier.verify(&tampered, &got[2].headers).is_err(), "the signature covers the body");

    let d = delivery_until(&app, &ids[2], status_is("delivered")).await;
    assert_eq!(d["attempts"].as_array().unwrap().len(), 1);
    assert_eq!(d["attempts"][0]["status_code"], 200);
    assert!(d["finished_at"].is_string());
    assert_eq!(d["next_attempt_at"], Value::Null);
    assert_eq!(d["in_flight"], false);
    let rec = expect(app.get(&format!("{T}/{txn}")).await, 200).await;
    assert_eq!(rec["hooks"][0]["status"], "delivered");
    let delivered = expect(app.get("/v1/deliveries?status=delivered").await, 200).await;
    assert_eq!(delivered["items"].as_array().unwrap().len(), 3);
    expect_problem(app.get("/v1/deliveries/nope:0").await, 404, "not_found").await;
    expect_problem(app.get("/v1/deliveries?status=odd").await, 422, "validation_failed").await;
    assert!(rx.collect_for(Duration::from_millis(300)).await.is_empty(), "each hook is sent once");
    app.stop().await;
}

async fn failures_are_retried_with_growing_gaps_and_order_is_kept(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let rx = TestReceiver::start().await;
    rx.fail_next(3, 500);
    let hooks = json!([{"url": rx.url("/first")}, {"url": rx.url("/second")}]);
    let out = expect(app.post(T, &insert_with_hooks("o-2", hooks)).await, 200).await;
    let txn = out["id"].as_str().unwrap();
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(rx.next(WAIT).await);
    }
    let paths: Vec<_> = seen.iter().map(|r| (r.path.as_str(), r.status)).collect();
    assert_eq!(
        paths,
        [("/first", 500), ("/first", 500), ("/first", 500), ("/first", 200), ("/second", 200)],
        "the second hook waits until the first is delivered"
    );
    // Backoff: 100, 200, 400 ms, each times [0.8, 1.2], plus the time to
    // claim and send (which a loaded machine stretches, so only the lower
    // bounds are exact). Each retry is timed by the worker's own schedule,
    // not found by its once-a-second scan of the store.
    let gaps: Vec<u128> = seen.windows(2).take(3).map(|w| (w[1].at - w[0].at).as_millis()).collect();
    assert!(gaps[0] >= 80 && gaps[1] >= 160 && gaps[2] >= 320, "gaps {gaps:?}");
    assert!(gaps[2] > gaps[0], "gaps grow: {gaps:?}");
    assert!(gaps.iter().all(|g| *g < 950), "each retry on its own schedule: {gaps:?}");
    let d = delivery_until(&app, &format!("{txn}:0"), status_is("delivered")).await;
    let codes: Vec<_> = d["attempts"].as_array().unwrap().iter().map(|a| a["status_code"].as_i64().unwrap()).collect();
    assert_eq!(codes, [500, 500, 500, 200]);
    app.stop().await;
}

async fn gone_is_dead_at_once_and_a_replay_sends_it_again(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let rx = TestReceiver::start().await;
    rx.fail_next(1, 410);
    let hooks = json!([{"url": rx.url("/gone")}, {"url": rx.url("/next")}]);
    let out = expect(app.post(T, &insert_with_hooks("o-3", hooks)).await, 200).await;
    let txn = out["id"].as_str().unwrap();
    let id = format!("{txn}:0");
    let (first, second) = (rx.next(WAIT).await, rx.next(WAIT).await);
    assert_eq!((first.path.as_str(), first.status), ("/gone", 410));
    assert_eq!(second.path, "/next", "a dead hook lets the next one go");
    let dead = delivery_until(&app, &id, status_is("dead")).await;
    assert_eq!(dead["attempts"].as_array().unwrap().len(), 1, "410 is not retried");
    let listed = expect(app.get("/v1/deliveries?status=dead").await, 200).await;
    assert_eq!(listed["items"][0]["id"], id);

    // Manual replay.
    let res = app.request(Method::POST, &format!("/v1/deliveries/{id}/retry")).send().await.unwrap();
    let queued = expect(res, 202).await;
    assert_eq!(queued["status"], "pending");
    let again = rx.next(WAIT).await;
    assert_eq!((again.path.as_str(), again.header("webhook-id")), ("/gone", id.as_str()));
    let d = delivery_until(&app, &id, status_is("delivered")).await;
    assert_eq!(d["attempts"].as_array().unwrap().len(), 2, "the history is kept");
    // A replay of a delivered one works too; a queued one cannot be queued twice.
    rx.delay(Duration::from_millis(500));
    let res = app.request(Method::POST, &format!("/v1/deliveries/{id}/retry")).send().await.unwrap();
    expect(res, 202).await;
    let res = app.request(Method::POST, &format!("/v1/deliveries/{id}/retry")).send().await.unwrap();
    expect_problem(res, 409, "delivery_pending").await;
    let sending = delivery_until(&app, &id, |d| d["in_flight"] == true).await;
    assert_eq!(sending["status"], "pending");
    rx.next(WAIT).await;
    let res = app.request(Method::POST, "/v1/deliveries/nope:0/retry").send().await.unwrap();
    expect_problem(res, 404, "not_found").await;
    app.stop().await;
}

async fn retry_after_is_honoured(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let rx = TestReceiver::start().await;
    rx.answer_next(1, 503, &[("retry-after", "1")]);
    expect(app.post(T, &insert_with_hooks("o-4", json!([{"url": rx.url("/busy")}]))).await, 200).await;
    let (first, second) = (rx.next(WAIT).await, rx.next(WAIT).await);
    assert_eq!((first.status, second.status), (503, 200));
    let gap = second.at - first.at;
    assert!(gap >= Duration::from_millis(950), "Retry-After: 1 waited only {gap:?}");
    app.stop().await;
}

async fn undeliverable_hooks_die_at_max_age(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| c.hooks.max_age = Duration::from_secs(1)).await else {
        return;
    };
    let rx = TestReceiver::start().await;
    rx.fail_next(1000, 500);
    let out = expect(app.post(T, &insert_with_hooks("o-5", json!([{"url": rx.url("/down")}]))).await, 200).await;
    let id = format!("{}:0", out["id"].as_str().unwrap());
    let d = delivery_until(&app, &id, status_is("dead")).await;
    let attempts = d["attempts"].as_array().unwrap();
    assert!(attempts.len() >= 3, "retried until max age: {d}");
    assert!(attempts.iter().all(|a| a["status_code"] == 500));
    app.stop().await;
}

async fn aborted_transactions_send_nothing(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let rx = TestReceiver::start().await;
    let body = json!({
        "actions": [{"op": "update", "collection": "orders", "id": "missing", "inc": {"n": 1}}],
        "hooks": [{"url": rx.url("/never")}],
    });
    let p = expect_problem(app.post(T, &body).await, 409, "not_found").await;
    let txn = p["transaction"].as_str().unwrap();
    assert!(rx.collect_for(Duration::from_millis(1500)).await.is_empty(), "nothing is sent for an abort");
    expect_problem(app.get(&format!("/v1/deliveries/{txn}:0")).await, 404, "not_found").await;
    let rec = expect(app.get(&format!("{T}/{txn}")).await, 200).await;
    assert_eq!(rec["hooks"][0]["status"], "not_sent");
    assert_eq!(expect(app.get("/v1/deliveries").await, 200).await["items"], json!([]));
    app.stop().await;
}

async fn internal_destinations_are_refused_unless_allowed(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| {
        c.hook_guard = txgate::testing::hooks::guard::HookGuard::new("127.0.0.1:9000").unwrap();
    })
    .await
    else {
        return;
    };
    // An update of a missing document: 409 when the hook passes the guard
    // (and, being aborted, nothing is ever sent), 422 when it does not.
    let tx = |url: &str| json!({"actions": [{"op": "update", "collection": "o", "id": "missing", "inc": {"n": 1}}], "hooks": [{"url": url}]});
    for url in [
        "http://localhost:9/x",
        "http://10.0.0.1/",
        "http://169.254.169.254/latest",
        "http://[::1]/",
        "http://[::ffff:192.168.0.1]/",
        "http://127.0.0.1:9001/",
    ] {
        let p = expect_problem(app.post(T, &tx(url)).await, 422, "hook_not_allowed").await;
        assert_eq!(p["errors"][0]["pointer"], "/hooks/0/url", "{url}");
    }
    expect_problem(app.post(T, &tx("http://127.0.0.1:9000/hook")).await, 409, "not_found").await;
    expect_problem(app.post(T, &tx("https://example.com/hook")).await, 409, "not_found").await;
    // Headers the gateway sets cannot come from the hook.
    let mut body = tx("http://127.0.0.1:9000/hook");
    body["hooks"][0]["headers"] = json!({"Webhook-Id": "forged"});
    let p = expect_problem(app.post(T, &body).await, 422, "validation_failed").await;
    assert_eq!(p["errors"][0]["pointer"], "/hooks/0/headers/Webhook-Id");
    app.stop().await;
}

async fn two_instances_never_send_one_attempt_twice(backend: Backend) {
    let Some(a) = TestApp::spawn(backend).await else { return };
    let b = TestApp::on_store(a.config.clone(), Arc::clone(&a.store), None).await;
    let rx = TestReceiver::start().await;
    rx.delay(Duration::from_millis(50));
    let n = 20;
    for i in 0..n {
        let app = if i % 2 == 0 { &a } else { &b };
        expect(app.post(T, &insert_with_hooks(&format!("o-{i}"), json!([{"url": rx.url("/h")}]))).await, 200).await;
    }
    let mut ids = std::collections::HashSet::new();
    for _ in 0..n {
        let r = rx.next(WAIT).await;
        assert!(ids.insert(r.header("webhook-id").to_owned()), "{} sent twice", r.header("webhook-id"));
    }
    assert!(rx.collect_for(Duration::from_millis(1500)).await.is_empty(), "nothing is sent twice");
    b.stop().await;
    a.stop().await;
}

/// One receiver hangs on every request; deliveries to another go at once,
/// however many to the first are waiting. Each destination gets at most
/// its share of the attempt slots, and every delivery is made in the end.
async fn a_hanging_receiver_does_not_delay_deliveries_to_another(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| {
        c.hooks.concurrency = 4;
        c.hooks.per_destination = 2;
        c.hooks.timeout = Duration::from_secs(10);
    })
    .await
    else {
        return;
    };
    let slow = TestReceiver::start().await;
    slow.delay(Duration::from_secs(3));
    let fast = TestReceiver::start().await;
    for i in 0..8 {
        let body = insert_with_hooks(&format!("s{i}"), json!([{"url": slow.url("/slow")}]));
        expect(app.post(T, &body).await, 200).await;
    }
    // The slow receiver's deliveries have taken what they may: its share.
    slow.arrived(2, WAIT).await;
    let started = std::time::Instant::now();
    for i in 0..4 {
        let body = insert_with_hooks(&format!("f{i}"), json!([{"url": fast.url("/fast")}]));
        expect(app.post(T, &body).await, 200).await;
    }
    for _ in 0..4 {
        let got = fast.next(WAIT).await;
        assert_eq!(got.path, "/fast");
        assert!(
            got.at.duration_since(started) < Duration::from_millis(2500),
            "a delivery to the fast receiver waited {:?} behind the slow one",
            got.at.duration_since(started)
        );
    }
    // The slow receiver gets all of its deliveries, two at a time.
    let got = slow.collect_for(Duration::from_secs(15)).await;
    assert_eq!(got.len(), 8, "every delivery to the slow receiver was made once");
    let mut ends: Vec<std::time::Instant> = got.iter().map(|r| r.at).collect();
    ends.sort();
    // Answers come in pairs 3 s apart: never more than two at once.
    for pair in ends.windows(3) {
        assert!(pair[2].duration_since(pair[0]) >= Duration::from_millis(2500), "three attempts overlapped");
    }
    app.stop().await;
}
