//! API keys: `Authorization: Bearer <key>` checked against the configured
//! keys and their scopes. Reads need `read`, writes `write`, operator
//! actions `admin`; `admin` implies the others and `write` implies `read`.
//! Health, readiness and the API description are public.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ProblemCode};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scope {
    Read,
    Write,
    Admin,
}

impl Scope {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "read" => Some(Scope::Read),
            "write" => Some(Scope::Write),
            "admin" => Some(Scope::Admin),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct ApiKey {
    pub key: String,
    pub scopes: Vec<Scope>,
}

impl ApiKey {
    fn allows(&self, needed: Scope) -> bool {
        self.scopes.iter().any(|s| *s >= needed)
    }
}

/// Parse `key:scope[+scope],...`.
pub fn parse_keys(spec: &str) -> Result<Vec<ApiKey>, String> {
    let mut keys = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, scopes) = entry
            .rsplit_once(':')
            .ok_or_else(|| format!("API key entry {:?} must be key:scope[+scope]", redact(entry)))?;
        if key.len() < 16 {
            return Err(format!("API key {:?} is too short: use at least 16 characters", redact(key)));
        }
        let scopes = scopes
            .split('+')
            .map(|s| Scope::parse(s.trim()).ok_or_else(|| format!("unknown scope {s:?} (read, write, admin)")))
            .collect::<Result<Vec<_>, _>>()?;
        keys.push(ApiKey { key: key.to_owned(), scopes });
    }
    if keys.is_empty() {
        return Err("TXGATE_API_KEYS is set but names no key".into());
    }
    Ok(keys)
}

fn redact(key: &str) -> String {
    format!("{}…", key.chars().take(4).collect::<String>())
}

/// Which key made the request (its first characters), for scoping
/// idempotency keys and for logs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller(pub String);

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn needed_scope(method: &Method, path: &str) -> Option<Scope> {
    if matches!(path, "/healthz" | "/readyz" | "/openapi.json") || path == "/docs" || path.starts_with("/docs/") {
        return None;
    }
    let operator_action = path.ends_with("/abort") || path.ends_with("/retry");
    Some(match *method {
        _ if operator_action => Scope::Admin,
        Method::GET | Method::HEAD | Method::OPTIONS => Scope::Read,
        _ => Scope::Write,
    })
}

/// Middleware: authenticate and authorize every API request.
pub async fn require_key(State(keys): State<Arc<Vec<ApiKey>>>, mut req: Request, next: Next) -> Response {
    let Some(needed) = needed_scope(req.method(), req.uri().path()) else { return next.run(req).await };
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let Some(token) = token else {
        return unauthorized("an API key is required: Authorization: Bearer <key>");
    };
    let Some(key) = keys.iter().find(|k| constant_time_eq(k.key.as_bytes(), token.as_bytes())) else {
        return unauthorized("the API key is not valid");
    };
    if !key.allows(needed) {
        let scope = format!("{needed:?}").to_lowercase();
        return ApiError::new(
            StatusCode::FORBIDDEN,
            ProblemCode::Forbidden,
            format!("the API key lacks the {scope} scope"),
        )
        .with("required_scope", scope)
        .into_response();
    }
    req.extensions_mut().insert(Caller(redact(&key.key)));
    next.run(req).await
}

fn unauthorized(detail: &str) -> Response {
    let mut response = ApiError::new(StatusCode::UNAUTHORIZED, ProblemCode::Unauthorized, detail).into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keys_and_scopes() {
        let keys = parse_keys("abcdefghijklmnop:read, qrstuvwxyz012345:write+admin").unwrap();
        assert_eq!(keys.len(), 2);
        assert!(keys[0].allows(Scope::Read) && !keys[0].allows(Scope::Write));
        assert!(keys[1].allows(Scope::Read) && keys[1].allows(Scope::Admin));
        assert!(parse_keys("short:read").is_err());
        assert!(parse_keys("abcdefghijklmnop:root").is_err());
        assert!(parse_keys("abcdefghijklmnop").is_err());
        assert!(parse_keys(" , ").is_err());
    }

    #[test]
    fn scopes_by_route() {
        assert_eq!(needed_scope(&Method::GET, "/healthz"), None);
        assert_eq!(needed_scope(&Method::GET, "/v1/collections/a/documents"), Some(Scope::Read));
        assert_eq!(needed_scope(&Method::POST, "/v1/transactions"), Some(Scope::Write));
        assert_eq!(needed_scope(&Method::POST, "/v1/transactions/x/abort"), Some(Scope::Admin));
    }
}
