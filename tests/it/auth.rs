//! API keys and scopes over HTTP.

use reqwest::Method;
use serde_json::json;
use txgate::http::auth::parse_keys;

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
    let res = app.post(url, &json!({"x": 1})).await;
    assert_eq!(res.headers()["www-authenticate"], "Bearer");
    expect_problem(res, 401, "unauthorized").await;
    let res = app.request(Method::POST, url).bearer_auth("wrong-key-0123456789").json(&json!({})).send().await.unwrap();
    expect_problem(res, 401, "unauthorized").await;
    let res = app.request(Method::POST, url).bearer_auth(READER).json(&json!({"_id": "d"})).send().await.unwrap();
    let p = expect_problem(res, 403, "forbidden").await;
    assert_eq!(p["required_scope"], "write");
    let res = app.request(Method::POST, url).bearer_auth(WRITER).json(&json!({"_id": "d"})).send().await.unwrap();
    expect(res, 201).await;
    let res = app.request(Method::GET, &format!("{url}/d")).bearer_auth(READER).send().await.unwrap();
    expect(res, 200).await;
    // Health, readiness and the API description stay public.
    for open in ["/healthz", "/readyz", "/openapi.json"] {
        assert_eq!(app.get(open).await.status(), 200, "{open}");
    }
    app.stop().await;
}
