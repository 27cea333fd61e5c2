//! Request metrics and their exposition: every answer counted by method,
//! route template and status, its latency observed, and `/metrics` in the
//! Prometheus text format.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::AppState;
use crate::metrics::Metrics;

/// The label of a request no route matched: raw paths never become labels.
pub(crate) const UNMATCHED: &str = "unmatched";

/// Middleware (outermost, so refusals by the layers inside are counted
/// too): count and time every request.
pub(crate) async fn record(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map_or(UNMATCHED, MatchedPath::as_str).to_owned();
    let method = method_label(req.method());
    let started = Instant::now();
    let in_flight = metrics.hold(&crate::metrics::HTTP_REQUESTS_IN_FLIGHT);
    let response = next.run(req).await;
    drop(in_flight);
    let status = response.status();
    metrics.count(&crate::metrics::HTTP_REQUESTS, &[method, &route, status.as_str()], 1);
    metrics.observe(&crate::metrics::HTTP_REQUEST_DURATION, &[method, &route], started.elapsed());
    response
}

/// A method as a label: the ones the API knows, every other as `other`.
fn method_label(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// `/metrics`: this instance's metrics in the Prometheus text format.
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], state.metrics.render()).into_response()
}
