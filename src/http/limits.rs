//! What keeps the gateway up and strangers out before any handler runs:
//! the concurrency limit (429 `overloaded`, never an unbounded queue) and,
//! on a gateway without API keys, the DNS-rebinding guard (403 for a
//! `Host` that is not a loopback name). Health and readiness checks pass
//! both: a probe must see the process even when it sheds load. A scrape of
//! `/metrics` is not limited either: an overload is when it matters most.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::error::{ApiError, ProblemCode};

/// How long a refused client is asked to wait.
const RETRY_AFTER: Duration = Duration::from_secs(1);

fn probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

/// Serve at most as many requests at once as `permits` holds; answer the
/// others 429 at once, before they read their body or touch the store. A
/// request holds its permit until its response head is ready (an event
/// stream's body then flows without one).
pub async fn limit(State(permits): State<Arc<Semaphore>>, req: Request, next: Next) -> Response {
    if probe(req.uri().path()) || req.uri().path() == "/metrics" {
        return next.run(req).await;
    }
    let Ok(_permit) = permits.try_acquire() else {
        tracing::debug!("request refused: at the concurrency limit");
        // Its connection ends with it: see `close_after_early_refusal`.
        return ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            ProblemCode::Overloaded,
            "the gateway is serving as many requests as it is configured to (TXGATE_MAX_CONCURRENCY); retry later",
        )
        .retry(RETRY_AFTER)
        .into_response();
    };
    next.run(req).await
}

/// A refusal answered before the request's body is read (401 and 403 of
/// the keys and the Host guard, 413 on `Content-Length`, 429) says
/// `Connection: close` when a body was sent: the server cannot reuse a
/// connection whose body it left unread, and a keep-alive client that is
/// not told would send its next request on a connection being closed.
/// (A 403 or 413 a handler gives after reading costs only a reconnect.)
/// A 429 always ends its connection: an overload sheds connections too.
pub async fn close_after_early_refusal(req: Request, next: Next) -> Response {
    let headers = req.headers();
    let has_body = headers.get(header::CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0")
        || headers.contains_key(header::TRANSFER_ENCODING);
    let mut res = next.run(req).await;
    let early = matches!(
        res.status(),
        StatusCode::UNAUTHORIZED
            | StatusCode::FORBIDDEN
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::TOO_MANY_REQUESTS
    );
    if (has_body && early) || res.status() == StatusCode::TOO_MANY_REQUESTS {
        res.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
    res
}

/// With no API keys the gateway listens on loopback only; a web page on
/// another site could still reach it through a name it rebinds to
/// 127.0.0.1. Such a request carries that name in `Host`: refuse every
/// `Host` that is not `localhost` or a loopback address.
pub async fn loopback_host(req: Request, next: Next) -> Response {
    let host = req.headers().get(header::HOST).map(|h| h.to_str().unwrap_or("\u{fffd}")).or(req.uri().host());
    match host {
        Some(host) if !probe(req.uri().path()) && !is_loopback_host(host) => ApiError::new(
            StatusCode::FORBIDDEN,
            ProblemCode::Forbidden,
            "without API keys the gateway answers only requests to a loopback name (localhost, 127.0.0.1, [::1])",
        )
        .into_response(),
        _ => next.run(req).await,
    }
}

/// Whether `host` (a `Host` header: a name or address, perhaps with a
/// port) names this machine's loopback interface.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split_once(']').map_or("", |(addr, _)| addr)
    } else if host.parse::<IpAddr>().is_ok() {
        host
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) => name,
            _ => host,
        }
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_names_and_addresses_only() {
        for ok in [
            "localhost",
            "LOCALHOST:8080",
            "localhost.",
            "127.0.0.1",
            "127.0.0.1:9",
            "127.9.9.9:80",
            "[::1]",
            "[::1]:8080",
            "::1",
        ] {
            assert!(is_loopback_host(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "10.0.0.1",
            "0.0.0.0:80",
            "[::]:80",
            "",
            "127.0.0.1.nip.io",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
