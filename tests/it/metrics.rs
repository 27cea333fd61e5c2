//! `/metrics`: parsed by a Prometheus text-format parser after a mixed
//! workload over HTTP, with the counts matching what was sent and no label
//! value taken from a path or an id.

use std::time::Duration;

use reqwest::Method;
use serde_json::json;
use txgate::testing::txn::record::TXNS;

use crate::support::{Backend, SseStream, TestApp, TestReceiver, all_events, expect, expect_problem};
use crate::transactions::{held_record, lock, seed, txn_id_at};

crate::on_both_backends!(metrics_count_a_mixed_workload,);

const D: &str = "/v1/collections/orders/documents";
const T: &str = "/v1/transactions";

/// One scrape as exposed. Series are looked up by their exact line (the
/// encoder writes labels in their declared order); the exposition itself
/// is parsed by Prometheus's own parser in the operator scenario
/// (tests/clients/operator).
struct Scrape {
    text: String,
}

impl Scrape {
    async fn of(app: &TestApp) -> Self {
        let res = app.get("/metrics").await;
        assert_eq!(res.status(), 200);
        let kind = res.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(kind.starts_with("text/plain") && kind.contains("version=0.0.4"), "{kind}");
        Self { text: res.text().await.unwrap() }
    }

    /// The sample lines (comments left out).
    fn samples(&self) -> impl Iterator<Item = &str> {
        self.text.lines().filter(|l| !l.starts_with('#') && !l.is_empty())
    }

    /// The value of series `name{labels}` (0 when absent).
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let series = if labels.is_empty() {
            name.to_owned()
        } else {
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            format!("{name}{{{}}}", labels.join(","))
        };
        let found: Vec<f64> = self
            .samples()
            .filter_map(|l| l.strip_prefix(series.as_str())?.strip_prefix(' '))
            .map(|v| v.trim().parse::<f64>().unwrap_or_else(|e| panic!("{series} {v}: {e}")))
            .collect();
        assert!(found.len() <= 1, "{series} appears {} times", found.len());
        found.first().copied().unwrap_or(0.0)
    }

    /// The observation count of histogram `name` at `labels`.
    fn observed(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        self.value(&format!("{name}_count"), labels) as u64
    }

    fn requests(&self, method: &str, route: &str, status: &str) -> f64 {
        self.value("txgate_http_requests_total", &[("method", method), ("route", route), ("status", status)])
    }
}

async fn metrics_count_a_mixed_workload(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let rx = TestReceiver::start().await;
    let doc_route = "/v1/collections/{collection}/documents/{id}";
    let list_route = "/v1/collections/{collection}/documents";

    // Before any work: the families are there, at zero.
    let before = Scrape::of(&app).await;
    assert_eq!(before.value("txgate_transactions_total", &[("outcome", "committed")]), 0.0);
    assert_eq!(before.value("txgate_event_streams_open", &[]), 0.0);
    assert_eq!(before.value("txgate_wounds_total", &[]), 0.0);

    // 5 creates, 3 reads that find, 2 that do not, 2 stale writes.
    for i in 0..5 {
        expect(app.post(D, &json!({"_id": format!("ord-{i}"), "total": i})).await, 201).await;
    }
    for i in 0..3 {
        expect(app.get(&format!("{D}/ord-{i}")).await, 200).await;
    }
    for i in 0..2 {
        expect_problem(app.get(&format!("{D}/missing-{i}")).await, 404, "not_found").await;
    }
    for _ in 0..2 {
        let res = app.request(Method::PUT, &format!("{D}/ord-0")).header("If-Match", "\"7\"").json(&json!({})).send();
        expect_problem(res.await.unwrap(), 409, "version_conflict").await;
    }
    expect_problem(app.get("/no/such/path/ord-1").await, 404, "not_found").await;

    // An event stream, open while the next scrape is taken.
    let stream = SseStream::open(&app, "/v1/events", None).await;

    // 2 transactions committed with a hook each, 1 aborted (a member is missing).
    for i in 0..2 {
        let body = json!({
            "actions": [
                {"op": "insert", "collection": "orders", "id": format!("t-{i}"), "data": {"n": i}},
                {"op": "update", "collection": "orders", "id": format!("ord-{}", i + 1), "set": {"paid": true}},
            ],
            "hooks": [{"url": rx.url("/paid")}],
        });
        expect(app.post(T, &body).await, 200).await;
    }
    let missing = json!({"actions": [{"op": "update", "collection": "orders", "id": "nobody", "set": {"x": 1}}]});
    expect_problem(app.post(T, &missing).await, 409, "not_found").await;

    // A lock wait on an older holder (then 409 locked), and a wound of a
    // younger one (then committed).
    seed(&app, "acc", "a", json!({"n": 1})).await;
    seed(&app, "acc", "b", json!({"n": 1})).await;
    let older = txn_id_at(-3600);
    app.store.insert(TXNS, held_record(&older, &["a"]).to_record()).await.unwrap();
    lock(&app, "acc", "a", &older).await;
    let on_a = json!({"actions": [{"op": "update", "collection": "acc", "id": "a", "inc": {"n": 1}}]});
    expect_problem(app.post(T, &on_a).await, 409, "locked").await;
    let younger = txn_id_at(3600);
    app.store.insert(TXNS, held_record(&younger, &["b"]).to_record()).await.unwrap();
    lock(&app, "acc", "b", &younger).await;
    let on_b = json!({"actions": [{"op": "update", "collection": "acc", "id": "b", "inc": {"n": 1}}]});
    expect(app.post(T, &on_b).await, 200).await;

    for _ in 0..2 {
        rx.next(Duration::from_secs(20)).await;
    }
    // The delivered state is recorded just after the receiver answers: a
    // pass of the worker ends once the attempts in flight have.
    app.run_once("deliveries").await;
    let m = Scrape::of(&app).await;

    // Requests by route template and status.
    assert_eq!(m.requests("POST", list_route, "201"), 7.0, "5 creates and 2 seeds");
    assert_eq!(m.requests("GET", doc_route, "200"), 3.0);
    assert_eq!(m.requests("GET", doc_route, "404"), 2.0);
    assert_eq!(m.requests("PUT", doc_route, "409"), 2.0);
    assert_eq!(m.requests("GET", "unmatched", "404"), 1.0);
    assert_eq!(m.requests("POST", T, "200"), 3.0);
    assert_eq!(m.requests("POST", T, "409"), 2.0);
    assert_eq!(m.requests("GET", "/v1/events", "200"), 1.0);
    assert!(m.requests("GET", "/metrics", "200") >= 1.0, "the scrapes before this one");
    assert_eq!(m.observed("txgate_http_request_duration_seconds", &[("method", "GET"), ("route", doc_route)]), 5);
    assert_eq!(m.observed("txgate_http_request_duration_seconds", &[("method", "POST"), ("route", T)]), 5);

    // Transactions, conflicts, locks.
    assert_eq!(m.value("txgate_transactions_total", &[("outcome", "committed")]), 3.0);
    assert_eq!(m.value("txgate_transactions_total", &[("outcome", "aborted")]), 2.0);
    assert_eq!(m.observed("txgate_transaction_duration_seconds", &[("outcome", "committed")]), 3);
    assert_eq!(m.value("txgate_conflicts_total", &[("code", "version_conflict")]), 2.0);
    assert_eq!(m.value("txgate_conflicts_total", &[("code", "not_found")]), 1.0);
    assert_eq!(m.value("txgate_conflicts_total", &[("code", "locked")]), 1.0);
    assert!(m.value("txgate_lock_waits_total", &[]) >= 1.0, "the wait on the older holder");
    assert_eq!(m.observed("txgate_lock_wait_seconds", &[]) as f64, m.value("txgate_lock_waits_total", &[]));
    assert_eq!(m.value("txgate_wounds_total", &[]), 1.0);
    assert_eq!(m.value("txgate_transactions_aborted_total", &[("reason", "wounded")]), 1.0);

    // Deliveries, events, streams, the store.
    assert_eq!(m.value("txgate_deliveries_total", &[("outcome", "delivered")]), 2.0);
    assert_eq!(m.value("txgate_delivery_attempts_total", &[("result", "success")]), 2.0);
    assert_eq!(m.observed("txgate_delivery_lag_seconds", &[]), 2);
    // Roll-forwards append their events after the answers (all_events
    // settles them first).
    let (events, _) = all_events(&app, 0, "").await;
    let written = Scrape::of(&app).await.value("txgate_events_written_total", &[]);
    assert_eq!(written, events.len() as f64, "events written, and in the log");
    assert_eq!(m.value("txgate_event_streams_open", &[]), 1.0);
    assert!(m.observed("txgate_store_operation_duration_seconds", &[("operation", "get")]) > 0);
    let syncs = m.value("txgate_store_syncs_total", &[]);
    match backend {
        Backend::Embedded => {
            assert!(syncs > 0.0, "the embedded store counts its syncs");
            for name in ["txgate_store_checkpoints_total", "txgate_store_checkpoint_seconds_total"] {
                assert!(m.samples().any(|l| l.starts_with(&format!("{name} "))), "{name} not served: {}", m.text);
            }
        }
        Backend::Mongodb => {
            assert!(!m.text.contains("txgate_store_syncs_total"), "MongoDB has no syncs to count");
            assert!(!m.text.contains("txgate_store_checkpoint"), "MongoDB has no checkpoints");
        }
        Backend::Memory => unreachable!("the memory store runs the store suite only"),
    }

    // Bounded labels: names prefixed, nothing from a path or an id.
    let ids = ["ord-", "missing-", "t-0", "t-1", "nobody", "/no/such", "orders", "acc", &older, &younger];
    for line in m.samples() {
        assert!(line.starts_with("txgate_"), "{line}");
        assert!(!ids.iter().any(|id| line.contains(id)), "{line} carries an id or a path");
    }

    // A closed stream is no longer counted.
    drop(stream);
    expect(app.post(D, &json!({"_id": "wake-the-stream"})).await, 201).await;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while Scrape::of(&app).await.value("txgate_event_streams_open", &[]) != 0.0 {
        assert!(std::time::Instant::now() < until, "the closed stream is still counted open");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    app.stop().await;
}

/// With API keys, `/metrics` needs a key that reads every collection.
#[tokio::test]
async fn metrics_need_a_key_when_keys_are_configured() {
    const READ: &str = "reader-key-0123456789";
    const ORDERS: &str = "orders-key-0123456789";
    let spec = format!("{READ}:read,{ORDERS}:read@orders+write@orders");
    let app =
        TestApp::spawn_with(Backend::Embedded, |c| c.api_keys = txgate::testing::keys::parse_keys(&spec).unwrap())
            .await
            .unwrap();
    expect_problem(app.get("/metrics").await, 401, "unauthorized").await;
    let res = app.request(Method::GET, "/metrics").bearer_auth(ORDERS).send().await.unwrap();
    expect_problem(res, 403, "forbidden").await;
    let res = app.request(Method::GET, "/metrics").bearer_auth(READ).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let text = res.text().await.unwrap();
    assert!(text.contains("txgate_http_requests_total{method=\"GET\",route=\"/metrics\",status=\"401\"} 1"), "{text}");
    app.stop().await;
}
