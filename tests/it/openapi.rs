//! The committed OpenAPI document is the one the code generates, and the
//! server serves it.

use crate::support::{Backend, TestApp, expect};

#[test]
fn committed_openapi_matches_the_code() {
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
        .expect("openapi/openapi.json exists");
    let generated = txgate::testing::http::openapi_json();
    assert!(
        committed == generated,
        "openapi/openapi.json is stale: regenerate it with `cargo run -- openapi --output openapi/openapi.json`"
    );
}

#[tokio::test]
async fn served_openapi_and_docs() {
    let app = TestApp::spawn(Backend::Embedded).await.unwrap();
    let spec = expect(app.get("/openapi.json").await, 200).await;
    assert!(spec["openapi"].as_str().unwrap().starts_with("3.1"));
    for path in ["/v1/collections/{collection}/documents", "/v1/collections/{collection}/documents/{id}"] {
        assert!(spec["paths"][path].is_object(), "{path} documented");
    }
    // /docs is served from the gateway alone: the page, the vendored Redoc
    // bundle and /openapi.json; no script, style or font from elsewhere.
    let docs = app.get("/docs").await;
    assert_eq!(docs.status(), 200);
    let page = docs.text().await.unwrap();
    assert!(page.contains(r#"<script src="/docs/redoc.standalone.js">"#) && page.contains("/openapi.json"));
    for external in ["src=\"http", "href=\"http", "@import", "url(http"] {
        assert!(!page.contains(external), "/docs refers to something outside the gateway: {external}");
    }
    let script = app.get("/docs/redoc.standalone.js").await;
    assert_eq!(script.status(), 200);
    assert!(script.headers()["content-type"].to_str().unwrap().starts_with("text/javascript"));
    assert!(script.text().await.unwrap().len() > 500_000, "the Redoc bundle itself");
    expect(app.get("/healthz").await, 200).await;
    let ready = expect(app.get("/readyz").await, 200).await;
    assert_eq!(ready["store"], "embedded");
    app.stop().await;
}
