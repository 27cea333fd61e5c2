//! The committed OpenAPI document is the one the code generates, and the
//! server serves it.

use crate::support::{Backend, TestApp, expect};

#[test]
fn committed_openapi_matches_the_code() {
    let committed = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json"))
        .expect("openapi/openapi.json exists");
    let generated = txgate::http::openapi_json();
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
    let docs = app.get("/docs").await;
    assert_eq!(docs.status(), 200);
    assert!(docs.text().await.unwrap().contains("openapi"));
    expect(app.get("/healthz").await, 200).await;
    let ready = expect(app.get("/readyz").await, 200).await;
    assert_eq!(ready["store"], "embedded");
    app.stop().await;
}
