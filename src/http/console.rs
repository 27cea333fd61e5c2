//! `/console`: the gateway's own UI, plain ES modules from `console/` at the
//! repository's root, embedded in the binary as they are (no build step),
//! served with a Content-Security-Policy that lets nothing run or load but
//! these files, and connect to nothing but the gateway and the configured
//! issuers (for sign-in). It uses the public API with the user's key or
//! access token, like any client; these routes themselves need none.
//! `/console/config.json` names the issuers the console may sign in with:
//! public facts (an issuer's URL, the console's public client id).

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

use crate::config::IssuerConfig;

/// The console's files: path, media type, content.
pub(crate) const ASSETS: [(&str, &str, &str); 5] = [
    ("/console", "text/html; charset=utf-8", include_str!("../../console/index.html")),
    ("/console/app.js", "text/javascript; charset=utf-8", include_str!("../../console/app.js")),
    ("/console/oidc.js", "text/javascript; charset=utf-8", include_str!("../../console/oidc.js")),
    ("/console/style.css", "text/css; charset=utf-8", include_str!("../../console/style.css")),
    ("/console/icon.svg", "image/svg+xml", include_str!("../../console/icon.svg")),
];

/// Scripts, styles and API calls from the gateway only (and, for sign-in,
/// calls to the configured issuers' origins); no inline script, no plugin,
/// no frame, no form posted elsewhere.
pub(crate) fn csp(issuers: &[IssuerConfig]) -> String {
    let mut connect = vec!["'self'".to_owned()];
    for issuer in issuers {
        if let Ok(url) = url::Url::parse(&issuer.url) {
            let origin = url.origin().ascii_serialization();
            if !connect.contains(&origin) {
                connect.push(origin);
            }
        }
    }
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src {}; img-src 'self'; \
         base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
        connect.join(" ")
    )
}

fn asset(csp: &HeaderValue, kind: &'static str, body: &'static str) -> Response {
    let mut response = ([(header::CONTENT_TYPE, kind)], body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, csp.clone());
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// An issuer the console may sign in with.
#[derive(serde::Serialize)]
struct ConsoleIssuer {
    name: String,
    url: String,
    client_id: String,
    /// The audience its access tokens are asked for (RFC 8707 `resource`).
    audience: String,
}

/// The console's routes, for a gateway configured with `issuers`.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(router: Router<S>, issuers: &[IssuerConfig]) -> Router<S> {
    let csp = HeaderValue::from_str(&csp(issuers)).expect("origins are ASCII");
    let listed: Vec<ConsoleIssuer> = issuers
        .iter()
        .filter_map(|i| {
            Some(ConsoleIssuer {
                name: i.name.clone(),
                url: i.url.clone(),
                client_id: i.console_client_id.clone()?,
                audience: i.audiences.first()?.clone(),
            })
        })
        .collect();
    let config = serde_json::json!({ "issuers": listed }).to_string();
    let router = ASSETS.iter().fold(router, |router, &(path, kind, body)| {
        let csp = csp.clone();
        router.route(path, axum::routing::get(move || async move { asset(&csp, kind, body) }))
    });
    router.route(
        "/console/config.json",
        axum::routing::get(move || {
            let config = config.clone();
            async move { ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-cache")], config) }
        }),
    )
}
