//! `/console`: the gateway's own UI, plain ES modules from `console/` at the
//! repository's root, embedded in the binary as they are (no build step),
//! served with a Content-Security-Policy that lets nothing run or load but
//! these files. It uses the public API with the user's key, like any
//! client; these routes themselves need none.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};

/// The console's files: path, media type, content.
pub(crate) const ASSETS: [(&str, &str, &str); 4] = [
    ("/console", "text/html; charset=utf-8", include_str!("../../console/index.html")),
    ("/console/app.js", "text/javascript; charset=utf-8", include_str!("../../console/app.js")),
    ("/console/style.css", "text/css; charset=utf-8", include_str!("../../console/style.css")),
    ("/console/icon.svg", "image/svg+xml", include_str!("../../console/icon.svg")),
];

/// Scripts, styles and API calls from the gateway only; no inline script,
/// no plugin, no frame, no form posted elsewhere.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; \
     img-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

fn asset(kind: &'static str, body: &'static str) -> Response {
    let mut response = ([(header::CONTENT_TYPE, kind)], body).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

/// The console's routes.
pub(crate) fn routes<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    ASSETS.iter().fold(router, |router, &(path, kind, body)| {
        router.route(path, axum::routing::get(move || async move { asset(kind, body) }))
    })
}
