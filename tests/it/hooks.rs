//! Post-commit hooks: recorded as deliveries when (and only when) a
//! transaction commits, with their payload fixed; destinations guarded.

use serde_json::json;

use crate::support::{Backend, TestApp, expect, expect_problem};

crate::on_both_backends!(
    committed_hooks_are_recorded_with_fixed_payloads,
    aborted_transactions_record_no_delivery,
    internal_destinations_are_refused_unless_allowed,
);

const T: &str = "/v1/transactions";

async fn committed_hooks_are_recorded_with_fixed_payloads(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let body = json!({
        "actions": [{"op": "insert", "collection": "orders", "id": "o-1", "data": {"total": 5}}],
        "hooks": [
            {"url": "https://example.com/a", "headers": {"X-Tenant": "t1"}, "body": {"any": ["json", 1]}},
            {"method": "PUT", "url": "https://example.com/b"},
        ],
    });
    let out = expect(app.post(T, &body).await, 200).await;
    let txn = out["id"].as_str().unwrap();
    assert_eq!(
        out["hooks"],
        json!([{"id": format!("{txn}:0"), "status": "pending"}, {"id": format!("{txn}:1"), "status": "pending"}])
    );
    // Deliveries are recorded by the roll-forward, which may still run.
    for _ in 0..200 {
        if expect(app.get(&format!("{T}/{txn}")).await, 200).await["status"] == "done" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let first = expect(app.get(&format!("/v1/deliveries/{txn}:0")).await, 200).await;
    assert_eq!(first["transaction"], txn);
    assert_eq!(first["status"], "pending");
    assert_eq!(first["method"], "POST");
    assert_eq!(first["url"], "https://example.com/a");
    assert_eq!(first["headers"], json!({"X-Tenant": "t1"}));
    assert_eq!(first["body"], json!({"any": ["json", 1]}));
    let second = expect(app.get(&format!("/v1/deliveries/{txn}:1")).await, 200).await;
    assert_eq!(second["method"], "PUT");
    assert_eq!(second["body"], out, "the default body is the commit summary");
    let pending = expect(app.get("/v1/deliveries?status=pending").await, 200).await;
    assert_eq!(pending["items"].as_array().unwrap().len(), 2);
    let rec = expect(app.get(&format!("{T}/{txn}")).await, 200).await;
    assert_eq!(rec["hooks"][1]["status"], "pending");
    expect_problem(app.get("/v1/deliveries/nope:0").await, 404, "not_found").await;
    expect_problem(app.get("/v1/deliveries?status=odd").await, 422, "validation_failed").await;
    app.stop().await;
}

async fn aborted_transactions_record_no_delivery(backend: Backend) {
    let Some(app) = TestApp::spawn(backend).await else { return };
    let body = json!({
        "actions": [{"op": "update", "collection": "orders", "id": "missing", "inc": {"n": 1}}],
        "hooks": [{"url": "https://example.com/a"}],
    });
    let p = expect_problem(app.post(T, &body).await, 409, "not_found").await;
    let txn = p["transaction"].as_str().unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    expect_problem(app.get(&format!("/v1/deliveries/{txn}:0")).await, 404, "not_found").await;
    let rec = expect(app.get(&format!("{T}/{txn}")).await, 200).await;
    assert_eq!(rec["hooks"][0]["status"], "not_sent");
    assert_eq!(expect(app.get("/v1/deliveries").await, 200).await["items"], json!([]));
    app.stop().await;
}

async fn internal_destinations_are_refused_unless_allowed(backend: Backend) {
    let Some(app) = TestApp::spawn_with(backend, |c| {
        c.hook_guard = txgate::hooks::guard::HookGuard::new("127.0.0.1:*").unwrap();
    })
    .await
    else {
        return;
    };
    let tx = |url: &str| json!({"actions": [{"op": "insert", "collection": "o", "data": {}}], "hooks": [{"url": url}]});
    for url in [
        "http://localhost:9/x",
        "http://10.0.0.1/",
        "http://169.254.169.254/latest",
        "http://[::1]/",
        "http://[::ffff:192.168.0.1]/",
    ] {
        let p = expect_problem(app.post(T, &tx(url)).await, 422, "hook_not_allowed").await;
        assert_eq!(p["errors"][0]["pointer"], "/hooks/0/url", "{url}");
    }
    expect(app.post(T, &tx("http://127.0.0.1:9000/hook")).await, 200).await;
    expect(app.post(T, &tx("https://example.com/hook")).await, 200).await;
    app.stop().await;
}
