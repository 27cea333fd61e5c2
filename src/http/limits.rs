//! What keeps the gateway up and strangers out before any handler runs:
//! bounds on the request head (431), the concurrency limit (429
//! `overloaded`, never an unbounded queue), the body's size and time (413,
//! 408) and, on a gateway without API keys, the DNS-rebinding guard (403
//! for a `Host` that is not a loopback name). Health and readiness checks pass
//! both: a probe must see the process even when it sheds load. A scrape of
//! `/metrics` is not limited either: an overload is when it matters most.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::sync::Semaphore;

use super::error::{ApiError, ProblemCode};
use crate::config::Cors;

/// How long a refused client is asked to wait.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(1);

fn probe(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz")
}

/// Serve at most as many requests at once as `permits` holds; answer the
/// others 429 at once, before they read their body or touch the store. A
/// request holds its permit until its response head is ready (an event
/// stream's body then flows without one).
pub(crate) async fn limit(State(permits): State<Arc<Semaphore>>, req: Request, next: Next) -> Response {
    if probe(req.uri().path()) || req.uri().path() == "/metrics" {
        return next.run(req).await;
    }
    let Ok(_permit) = permits.try_acquire() else {
        tracing::debug!("request refused: at the concurrency limit");
        // Its connection ends with it: see `close_after_early_refusal`.
        return ApiError::new(
            ProblemCode::Overloaded,
            "the gateway is serving as many requests as it is configured to (TXGATE_MAX_CONCURRENCY); retry later",
        )
        .retry(RETRY_AFTER)
        .into_response();
    };
    next.run(req).await
}

fn has_body(headers: &header::HeaderMap) -> bool {
    headers.get(header::CONTENT_LENGTH).is_some_and(|v| v.as_bytes() != b"0")
        || headers.contains_key(header::TRANSFER_ENCODING)
}

/// A refusal answered before the request's body is read (401 and 403 of
/// the keys and the Host guard, 413, 431, 429) or while it was read (408)
/// says `Connection: close` when a body was sent: the server cannot reuse
/// a connection whose body it left unread, and a keep-alive client that is
/// not told would send its next request on a connection being closed.
/// (A 403 or 413 a handler gives after reading costs only a reconnect.)
/// A 429 and a 408 always end their connection: an overload sheds
/// connections too, and a client too slow to send its body is not kept.
pub(crate) async fn close_after_early_refusal(req: Request, next: Next) -> Response {
    let has_body = has_body(req.headers());
    let mut res = next.run(req).await;
    let early = matches!(
        res.status(),
        StatusCode::UNAUTHORIZED
            | StatusCode::FORBIDDEN
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE
            | StatusCode::TOO_MANY_REQUESTS
    );
    let always = matches!(res.status(), StatusCode::TOO_MANY_REQUESTS | StatusCode::REQUEST_TIMEOUT);
    if (has_body && early) || always {
        res.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    }
    res
}

/// Most header fields in a request.
pub(crate) const MAX_HEADER_FIELDS: usize = 100;
/// Most bytes of header names and values in a request.
pub(crate) const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Bound the request head: more than [`MAX_HEADER_FIELDS`] fields or
/// [`MAX_HEADER_BYTES`] of them is a 431 problem, before anything else.
pub(crate) async fn head_limits(req: Request, next: Next) -> Response {
    let headers = req.headers();
    let bytes: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
    if headers.len() > MAX_HEADER_FIELDS || bytes > MAX_HEADER_BYTES {
        return ApiError::new(
            ProblemCode::HeadersTooLarge,
            format!(
                "a request has at most {MAX_HEADER_FIELDS} header fields and {} KiB of them",
                MAX_HEADER_BYTES / 1024
            ),
        )
        .into_response();
    }
    next.run(req).await
}

/// The request body, read whole before the handler runs: at most `limit`
/// bytes (413, answered before reading when `Content-Length` says so) within
/// `timeout` of the handler's turn (408, and the connection closes). A
/// client that trickles its body holds a concurrency slot for `timeout`
/// at most, and nothing is done for it.
pub(crate) async fn read_body(State((limit, timeout)): State<(usize, Duration)>, req: Request, next: Next) -> Response {
    if !has_body(req.headers()) {
        return next.run(req).await;
    }
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return too_large(limit);
    }
    let (parts, body) = req.into_parts();
    let read = async {
        use futures::StreamExt;
        let mut stream = body.into_data_stream();
        let mut buf = Vec::with_capacity(declared.map_or(0, |n| n as usize));
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|_| None)?;
            if buf.len() + chunk.len() > limit {
                return Err(Some(()));
            }
            buf.extend_from_slice(&chunk);
        }
        Ok(buf)
    };
    match tokio::time::timeout(timeout, read).await {
        Ok(Ok(bytes)) => next.run(Request::from_parts(parts, Body::from(bytes))).await,
        Ok(Err(Some(()))) => too_large(limit),
        Ok(Err(None)) => {
            ApiError::bad_request(ProblemCode::InvalidBody, "the request body could not be read").into_response()
        }
        Err(_) => {
            tracing::debug!(timeout_ms = timeout.as_millis() as u64, "request refused: its body came too slowly");
            ApiError::new(
                ProblemCode::RequestTimeout,
                format!(
                    "the request body did not arrive within {} ms (TXGATE_BODY_TIMEOUT_MS); nothing was done",
                    timeout.as_millis()
                ),
            )
            .into_response()
        }
    }
}

fn too_large(limit: usize) -> Response {
    ApiError::new(
        ProblemCode::PayloadTooLarge,
        format!("the request body is larger than the limit of {limit} bytes (TXGATE_MAX_BODY_BYTES)"),
    )
    .into_response()
}

/// With no API keys the gateway listens on loopback only; a web page on
/// another site could still reach it through a name it rebinds to
/// 127.0.0.1. Such a request carries that name in `Host`: refuse every
/// request whose one `Host` is not a well-formed loopback authority
/// (`localhost`, a loopback address, an optional port), and one whose
/// target names another authority (absolute form). A missing or repeated
/// `Host` is refused too.
pub(crate) async fn loopback_host(req: Request, next: Next) -> Response {
    if probe(req.uri().path()) {
        return next.run(req).await;
    }
    let mut hosts = req.headers().get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (Some(host), None) => host.to_str().ok(),
        _ => None,
    };
    let target_ok = req.uri().authority().is_none_or(|a| is_loopback_host(a.as_str()));
    if host.is_some_and(is_loopback_host) && target_ok {
        return next.run(req).await;
    }
    ApiError::new(
        ProblemCode::Forbidden,
        "without API keys the gateway answers only requests with one Host naming a loopback authority \
         (localhost, 127.0.0.1, [::1], with an optional port)",
    )
    .into_response()
}

/// On a gateway without API keys, a request that changes something
/// (any method but `GET`, `HEAD` and `OPTIONS`) from another origin is
/// refused with 403 `cross_origin` before its body is read: a web page the
/// operator's browser visits can send a "simple" cross-site `POST`
/// (`Content-Type: text/plain`, no preflight) to a loopback gateway, and
/// without keys nothing else stops it. Allowed: an `Origin` that is the
/// gateway's own (`http://` or `https://` and the request's `Host`) or one
/// `TXGATE_CORS_ORIGINS` lists (`*`: any but `null`); no `Origin` unless
/// `Sec-Fetch-Site: cross-site` says a browser sent it from another site
/// (clients that are not browsers send neither).
pub(crate) async fn same_origin(State(cors): State<Arc<Cors>>, req: Request, next: Next) -> Response {
    use axum::http::Method;
    if matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS) {
        return next.run(req).await;
    }
    let headers = req.headers();
    let mut origins = headers.get_all(header::ORIGIN).iter();
    let allowed = match (origins.next(), origins.next()) {
        (None, _) => headers.get("sec-fetch-site").is_none_or(|site| site.as_bytes() != b"cross-site"),
        (Some(origin), None) => origin.to_str().is_ok_and(|origin| {
            let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
            host.is_some_and(|host| own_origin(origin, host)) || cors.lists(origin)
        }),
        // Two `Origin` fields: no browser sends that.
        (Some(_), Some(_)) => false,
    };
    if allowed {
        return next.run(req).await;
    }
    tracing::debug!(method = %req.method(), "request refused: from another origin, without API keys");
    ApiError::new(
        ProblemCode::CrossOrigin,
        "without API keys the gateway takes requests that change something only from its own origin or one \
         TXGATE_CORS_ORIGINS lists",
    )
    .into_response()
}

/// Whether `origin` is the gateway's own when it is reached as `host`:
/// `http://` or `https://` (behind a proxy that ends TLS) and that
/// authority, compared as browsers serialize origins.
fn own_origin(origin: &str, host: &str) -> bool {
    ["http", "https"].iter().any(|scheme| {
        url::Url::parse(&format!("{scheme}://{host}"))
            .is_ok_and(|own| own.origin().ascii_serialization().eq_ignore_ascii_case(origin))
    })
}

/// Whether `host` (a `Host` header or a target's authority) is exactly a
/// loopback authority: `localhost` (or `localhost.`), an IPv4 loopback
/// address, or a bracketed IPv6 loopback address, each with an optional
/// port of digits.
pub(crate) fn is_loopback_host(host: &str) -> bool {
    let port_ok = |port: &str| (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = host.strip_prefix('[') {
        let Some((addr, after)) = rest.split_once(']') else { return false };
        let after_ok = after.is_empty() || after.strip_prefix(':').is_some_and(port_ok);
        return after_ok && addr.parse::<std::net::Ipv6Addr>().is_ok_and(|ip| ip.is_loopback());
    }
    let name = match host.split_once(':') {
        Some((name, port)) if port_ok(port) => name,
        Some(_) => return false,
        None => host,
    };
    let name = name.strip_suffix('.').unwrap_or(name);
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok_and(|ip| ip.is_loopback())
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
            "[0:0:0:0:0:0:0:1]:1",
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
            "[::1]evil.com",
            "[::1]:80evil",
            "[::1]:",
            "::1",
            "localhost:80:80",
            "localhost:",
            "localhost:abc",
            "localhost@evil.com",
            "evil.com#localhost",
            "[::ffff:127.0.0.1]",
        ] {
            assert!(!is_loopback_host(bad), "{bad}");
        }
    }
}
