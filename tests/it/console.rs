//! `/console`: served by the gateway without a key, with a CSP that lets
//! only the gateway's own scripts run, and exactly the files under
//! `console/` (the console has no build step: what is served is what is
//! committed).

use reqwest::Method;
use txgate::testing::keys::parse_keys;

use crate::support::{Backend, TestApp};

const KEY: &str = "console-test-key-0123456789";

#[tokio::test]
async fn the_console_is_served_as_committed_with_a_strict_csp() {
    let app = TestApp::spawn_with(Backend::Embedded, |c| c.api_keys = parse_keys(&format!("{KEY}:read")).unwrap())
        .await
        .expect("the embedded store");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("console");
    for (path, file, kind) in [
        ("/console", "index.html", "text/html"),
        ("/console/app.js", "app.js", "text/javascript"),
        ("/console/oidc.js", "oidc.js", "text/javascript"),
        ("/console/style.css", "style.css", "text/css"),
        ("/console/icon.svg", "icon.svg", "image/svg+xml"),
    ] {
        // No key needed: the console asks for one and sends it to the API.
        let res = app.request(Method::GET, path).send().await.unwrap();
        assert_eq!(res.status(), 200, "{path}");
        let header = |name: &str| res.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
        assert!(header("content-type").starts_with(kind), "{path}: {}", header("content-type"));
        let csp = header("content-security-policy");
        assert!(csp.contains("script-src 'self'") && csp.contains("default-src 'none'"), "{path}: {csp}");
        assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{path}: {csp}");
        assert_eq!(header("x-content-type-options"), "nosniff");
        let served = res.text().await.unwrap();
        let committed = std::fs::read_to_string(root.join(file)).unwrap();
        assert_eq!(served, committed, "{path} differs from console/{file}");
    }
    // No inline script, and nothing loaded from elsewhere.
    let html = std::fs::read_to_string(root.join("index.html")).unwrap();
    for tag in html.match_indices("<script").map(|(i, _)| &html[i..html[i..].find('>').map_or(html.len(), |e| i + e)]) {
        assert!(tag.contains("src=\"/console/"), "an inline or foreign script: {tag}");
    }
    assert!(!html.contains("http://") && !html.contains("https://"), "the page names another origin");
    // The API behind it still wants the key.
    let res = app.request(Method::GET, "/v1/collections").send().await.unwrap();
    assert_eq!(res.status(), 401);
    app.stop().await;
}

/// With issuers configured, the console's CSP lets it connect to their
/// origins and no other, and `/console/config.json` names those it signs
/// in with.
#[tokio::test]
async fn the_console_may_reach_exactly_the_issuers_it_signs_in_with() {
    let issuer = |url: &str, client: Option<&str>| {
        txgate::config::IssuerEntry {
            url: url.into(),
            name: Some(url.split('/').nth(2).unwrap().into()),
            audiences: vec!["urn:txgate:api".into()],
            console_client_id: client.map(str::to_owned),
            ..Default::default()
        }
        .resolve(1)
        .unwrap()
    };
    let app = TestApp::spawn_with(Backend::Embedded, |c| {
        c.issuers = vec![
            issuer("https://id.example.com/realms/shop", Some("txgate-console")),
            issuer("https://api-only.example.net", None),
        ];
    })
    .await
    .expect("the embedded store");
    let res = app.request(Method::GET, "/console").send().await.unwrap();
    let csp = res.headers()["content-security-policy"].to_str().unwrap().to_owned();
    let connect: Vec<&str> =
        csp.split(';').map(str::trim).find_map(|d| d.strip_prefix("connect-src ")).unwrap().split(' ').collect();
    assert_eq!(connect, ["'self'", "https://id.example.com", "https://api-only.example.net"], "{csp}");
    let config: serde_json::Value = app.get("/console/config.json").await.json().await.unwrap();
    assert_eq!(
        config,
        serde_json::json!({"issuers": [{
            "name": "id.example.com", "url": "https://id.example.com/realms/shop",
            "client_id": "txgate-console", "audience": "urn:txgate:api",
        }]})
    );
    app.stop().await;
}
