//! How a delivery attempt reaches its receiver: one HTTP request, signed
//! (Standard Webhooks) when a key is set, with the headers a hook may not
//! set kept out, and its outcome as the worker records it.

use std::time::Duration;

use super::Delivery;
use super::net::Clients;

/// Most of a response body read (and thrown away) per attempt.
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Headers a hook may not set: the gateway sets them.
pub(crate) const RESERVED_HEADERS: &[&str] = &[
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "txgate-transaction",
    "txgate-subscription",
    "host",
    "content-length",
    "content-type",
    "transfer-encoding",
    "connection",
];

/// Hop-by-hop and framing headers: they describe one connection, not the
/// request, so a hook may not set them (422).
pub(crate) const HOP_BY_HOP_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "content-length",
    "host",
];

/// Whether a hook may not set header `name` (any case): the gateway sets
/// it, or it is hop-by-hop (`Proxy-*` included).
pub(crate) fn refused_header(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    if HOP_BY_HOP_HEADERS.contains(&name.as_str()) || name.starts_with("proxy-") {
        Some("hop-by-hop and framing headers cannot be set on a hook")
    } else if RESERVED_HEADERS.contains(&name.as_str()) {
        Some("this header is set by txgate")
    } else {
        None
    }
}

/// A `Retry-After` value: seconds, or an HTTP date.
pub(crate) fn retry_after(value: &str, now: std::time::SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

/// What one attempt came to.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// The receiver's status code; none when no answer came.
    pub status_code: Option<u16>,
    /// Why no answer came.
    pub error: Option<String>,
    /// The receiver's `Retry-After`.
    pub retry_after: Option<Duration>,
    /// No attempt was made and none will be: the delivery is dead.
    pub gone: bool,
}

/// How an attempt reaches its receiver: [`Http`] in a gateway; tests
/// script the answers (and run the worker under paused time).
#[async_trait::async_trait]
pub trait Transport: Send + Sync + 'static {
    async fn send(&self, d: &Delivery) -> Outcome;
}

/// Attempts as HTTP requests, signed when a key is set.
pub(crate) struct Http {
    pub(super) clients: Clients,
    pub(super) signer: Option<super::sign::Signer>,
    pub(super) timeout: Duration,
    pub(super) clock: crate::clock::Clock,
}

#[async_trait::async_trait]
impl Transport for Http {
    /// Make one HTTP request for `d`.
    async fn send(&self, d: &Delivery) -> Outcome {
        let failed = |error: String| Outcome { status_code: None, error: Some(error), ..Outcome::default() };
        let url = match url::Url::parse(&d.url) {
            Ok(url) => url,
            Err(e) => return failed(format!("invalid URL: {e}")),
        };
        let client = match self.clients.for_url(&url) {
            Ok(client) => client,
            Err(why) => return failed(why),
        };
        let method = reqwest::Method::from_bytes(d.method.as_bytes()).unwrap_or(reqwest::Method::POST);
        let timestamp = self.clock.now().timestamp_millis() / 1000;
        let mut req = client.request(method, url);
        for (name, value) in d.headers.iter() {
            if refused_header(name).is_none() {
                req = req.header(name, value);
            }
        }
        req = req
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header("webhook-id", &d.id)
            .header("webhook-timestamp", timestamp.to_string());
        if !d.txn.is_empty() {
            req = req.header("txgate-transaction", &d.txn);
        }
        if let Some(sub) = &d.subscription {
            req = req.header("txgate-subscription", sub);
        }
        if let Some(signer) = &self.signer {
            req = req.header("webhook-signature", signer.sign(&d.id, timestamp, d.body.as_bytes()));
        }
        let mut res = match req.body(d.body.clone()).send().await {
            Ok(res) => res,
            Err(err) => return failed(describe(&err, self.timeout)),
        };
        let status = res.status().as_u16();
        let retry_after = res
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| retry_after(v, std::time::SystemTime::now()));
        // Read (a bounded part of) the body so the connection can be reused.
        let mut read = 0;
        while read < MAX_RESPONSE_BYTES {
            match res.chunk().await {
                Ok(Some(chunk)) => read += chunk.len(),
                _ => break,
            }
        }
        Outcome { status_code: Some(status), error: None, retry_after, gone: false }
    }
}

/// An attempt's error as one line: the cause chain, without the URL
/// (it is in the delivery already).
fn describe(err: &reqwest::Error, timeout: Duration) -> String {
    if err.is_timeout() {
        return format!("timed out after {} ms", timeout.as_millis());
    }
    let mut parts: Vec<String> = Vec::new();
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        let text = s.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    if parts.is_empty() {
        parts.push(err.to_string());
    }
    parts.join(": ")
}
