//! A caller's request rate: a token bucket per user (and one for anonymous
//! callers), and the `RateLimit-Policy` and `RateLimit` fields that tell a
//! client where it stands (draft-ietf-httpapi-ratelimit-headers-08 and
//! later). Admission (`auth.rs`) keeps the buckets, one per caller's share.

use std::time::{Duration, Instant};

use axum::http::header;
use axum::response::Response;

use crate::identity::Rate;

/// A token bucket: `rate.quota` requests, refilled evenly over
/// `rate.window`.
pub(super) struct Bucket {
    rate: Rate,
    tokens: f64,
    at: Instant,
}

/// What a bucket said of a request: its policy, what is left, and (when
/// refused) how long until one more.
pub(super) struct Metered {
    pub rate: Rate,
    pub remaining: u32,
    pub wait: Option<Duration>,
}

impl Bucket {
    pub(super) fn full(rate: Rate) -> Self {
        Self { rate, tokens: f64::from(rate.quota), at: Instant::now() }
    }

    fn refill(&mut self, now: Instant) {
        let earned = now.duration_since(self.at).as_secs_f64() * self.rate.per_second();
        self.tokens = (self.tokens + earned).min(f64::from(self.rate.quota));
        self.at = now;
    }

    pub(super) fn is_full(&mut self) -> bool {
        self.refill(Instant::now());
        self.tokens >= f64::from(self.rate.quota)
    }

    /// Take one token for a request, or say how long until there is one.
    pub(super) fn take(&mut self, rate: Rate) -> Metered {
        let now = Instant::now();
        if self.rate != rate {
            // The user's roles changed: the new policy, from what is left.
            self.rate = rate;
        }
        self.refill(now);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Metered { rate, remaining: self.tokens as u32, wait: None }
        } else {
            let wait = Duration::from_secs_f64((1.0 - self.tokens) / rate.per_second());
            Metered { rate, remaining: 0, wait: Some(wait) }
        }
    }
}

/// The `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-
/// ratelimit-headers-08 and later) of a metered request.
pub(super) fn with_rate(mut response: Response, metered: Option<&Metered>) -> Response {
    let Some(m) = metered else { return response };
    let window = m.rate.window.as_secs().max(1);
    let reset = m.wait.map_or(0, |w| w.as_secs_f64().ceil() as u64);
    let headers = response.headers_mut();
    if let Ok(v) = header::HeaderValue::from_str(&format!("\"caller\";q={};w={window}", m.rate.quota)) {
        headers.insert("ratelimit-policy", v);
    }
    if let Ok(v) = header::HeaderValue::from_str(&format!("\"caller\";r={};t={reset}", m.remaining)) {
        headers.insert("ratelimit", v);
    }
    response
}
