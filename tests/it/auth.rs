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
