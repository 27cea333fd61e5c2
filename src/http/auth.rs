//! API keys: `Authorization: Bearer <key>` checked against the configured
//! keys and their grants. Reads need `read`, writes `write`, operator
//! actions `admin`; `admin` implies the others and `write` implies `read`.
//! A grant may be limited to one collection (`read@orders`). Health,
//! readiness and the API description are public.
//!
//! Where a route names its collection in the path, the middleware checks
//! the grant for it. Where the collections are in the body, the query or
//! the stored record (transactions, events, subscriptions, lists), the
//! handler checks them through the caller's [`Access`]. Every other route
//! (deliveries, `/metrics`) needs a grant on every collection.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, Path, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

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

    fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Write => "write",
            Scope::Admin => "admin",
        }
    }
}

/// A scope, on every collection or on one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub scope: Scope,
    pub collection: Option<String>,
}

impl Grant {
    fn parse(spec: &str) -> Result<Self, String> {
        let (scope, collection) = match spec.split_once('@') {
            Some((scope, coll)) => (scope, Some(coll)),
            None => (spec, None),
        };
        let scope = Scope::parse(scope)
            .ok_or_else(|| format!("unknown scope {scope:?} (read, write, admin; or scope@collection)"))?;
        if let Some(coll) = collection
            && !crate::documents::rules::is_collection_name(coll)
        {
            return Err(format!("{spec:?}: {coll:?} is not a collection name (^[a-zA-Z][a-zA-Z0-9_-]{{0,63}}$)"));
        }
        Ok(Grant { scope, collection: collection.map(str::to_owned) })
    }

    fn covers(&self, needed: Scope, collection: Option<&str>) -> bool {
        self.scope >= needed
            && match (&self.collection, collection) {
                (None, _) => true,
                (Some(own), Some(c)) => own == c,
                (Some(_), None) => false,
            }
    }
}

/// An API key and what it may do. Its `Debug` shows the grants, never the
/// key.
#[derive(Clone)]
pub struct ApiKey {
    pub key: String,
    pub grants: Vec<Grant>,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKey").field("key", &REDACTED).field("grants", &self.grants).finish()
    }
}

const REDACTED: &str = "[redacted]";

impl ApiKey {
    /// What this key's requests are known by where they must be kept apart
    /// from other keys' (idempotency keys): a digest of the whole key,
    /// stable across restarts, from which the key cannot be recovered.
    pub fn scope(&self) -> String {
        use sha2::{Digest, Sha256};
        let digest = Sha256::digest(self.key.as_bytes());
        digest[..16].iter().map(|b| format!("{b:02x}")).collect()
    }
}

/// One key as the TOML file may give it: `{ key = "...", scopes = ["read@orders"] }`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub key: String,
    pub scopes: Vec<String>,
}

impl std::fmt::Debug for KeyEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyEntry").field("key", &REDACTED).field("scopes", &self.scopes).finish()
    }
}

/// `TXGATE_API_KEYS` (or `api_keys` in the TOML file): the string form,
/// or, in the file, a list of `{ key, scopes }` tables. `Debug` shows no
/// key.
#[derive(Clone, Deserialize)]
#[serde(untagged)]
pub enum KeysSetting {
    Spec(String),
    Table(Vec<KeyEntry>),
}

impl std::fmt::Debug for KeysSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeysSetting::Spec(_) => f.write_str("Spec([redacted])"),
            KeysSetting::Table(entries) => f.debug_tuple("Table").field(entries).finish(),
        }
    }
}

impl std::str::FromStr for KeysSetting {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(KeysSetting::Spec(s.to_owned()))
    }
}

impl KeysSetting {
    /// The keys, or why not; `None` when the setting names none (unset).
    pub fn keys(&self) -> Result<Option<Vec<ApiKey>>, String> {
        match self {
            KeysSetting::Spec(spec) if spec.trim().is_empty() => Ok(None),
            KeysSetting::Spec(spec) => parse_keys(spec).map(Some),
            KeysSetting::Table(entries) if entries.is_empty() => Err("api_keys is set but names no key".into()),
            KeysSetting::Table(entries) => entries
                .iter()
                .enumerate()
                .map(|(n, e)| key(n + 1, &e.key, &e.scopes.iter().map(String::as_str).collect::<Vec<_>>()))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
        }
    }
}

/// Key number `n` (from 1) of the setting; errors name it by its place,
/// never by any part of the key.
fn key(n: usize, key: &str, scopes: &[&str]) -> Result<ApiKey, String> {
    if key.len() < 16 {
        return Err(format!("API key #{n} is too short: use at least 16 characters"));
    }
    if scopes.is_empty() {
        return Err(format!("API key #{n} has no scope"));
    }
    let grants = scopes.iter().map(|s| Grant::parse(s.trim())).collect::<Result<Vec<_>, _>>()?;
    Ok(ApiKey { key: key.to_owned(), grants })
}

/// Parse `key:grant[+grant],...` where a grant is `scope` or
/// `scope@collection`.
pub fn parse_keys(spec: &str) -> Result<Vec<ApiKey>, String> {
    let mut keys = Vec::new();
    for (n, entry) in spec.split(',').map(str::trim).filter(|e| !e.is_empty()).enumerate() {
        let (k, scopes) =
            entry.rsplit_once(':').ok_or_else(|| format!("API key #{} must be key:scope[+scope]", n + 1))?;
        keys.push(key(n + 1, k, &scopes.split('+').collect::<Vec<_>>())?);
    }
    if keys.is_empty() {
        return Err("TXGATE_API_KEYS is set but names no key".into());
    }
    Ok(keys)
}

/// Which key made the request: its [`ApiKey::scope`], which keeps its
/// idempotency keys apart from every other key's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Caller {
    pub scope: String,
}

/// What the caller may do, for handlers that find the collections a
/// request touches in its body, query or stored records. Without keys
/// configured: everything.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// `None`: no keys configured.
    grants: Option<Arc<[Grant]>>,
}

impl Access {
    pub fn allows(&self, needed: Scope, collection: &str) -> bool {
        self.grants.as_ref().is_none_or(|g| g.iter().any(|g| g.covers(needed, Some(collection))))
    }

    /// Whether `needed` is granted on every collection.
    pub fn everywhere(&self, needed: Scope) -> bool {
        self.grants.as_ref().is_none_or(|g| g.iter().any(|g| g.covers(needed, None)))
    }

    /// The collections `needed` is granted on; `None`: every collection.
    pub fn collections(&self, needed: Scope) -> Option<Vec<String>> {
        if self.everywhere(needed) {
            return None;
        }
        let grants = self.grants.as_deref().unwrap_or_default();
        let mut names: Vec<String> =
            grants.iter().filter(|g| g.scope >= needed).filter_map(|g| g.collection.clone()).collect();
        names.sort();
        names.dedup();
        Some(names)
    }

    /// 403 unless `needed` is granted on `collection`.
    pub fn check(&self, needed: Scope, collection: &str) -> Result<(), ApiError> {
        if self.allows(needed, collection) { Ok(()) } else { Err(forbidden(needed, Some(collection))) }
    }

    /// 403 unless `needed` is granted on every one of `collections`.
    pub fn check_all<'a>(&self, needed: Scope, collections: impl IntoIterator<Item = &'a str>) -> Result<(), ApiError> {
        collections.into_iter().try_for_each(|c| self.check(needed, c))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Access {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Access>().cloned().unwrap_or_default())
    }
}

/// 403 for a key without `needed` (on `collection`, or on every one).
pub fn forbidden(needed: Scope, collection: Option<&str>) -> ApiError {
    let scope = needed.as_str();
    let detail = match collection {
        Some(c) => format!("the API key lacks the {scope} scope on collection {c:?}"),
        None => format!("this needs the {scope} scope on every collection; the API key has it on some or none"),
    };
    let err = ApiError::new(ProblemCode::Forbidden, detail).with("required_scope", scope);
    match collection {
        Some(c) => err.with("collection", c),
        None => err,
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Operator actions: routes that need `admin` whatever their method.
const OPERATOR_ROUTES: &[&str] = &["/v1/transactions/{id}/abort", "/v1/deliveries/{id}/retry", "/v1/admin/backup"];

/// The scope a request needs, decided by its matched route (a document
/// whose id is `abort` is a document).
fn needed_scope(method: &Method, route: &str) -> Option<Scope> {
    if matches!(route, "/healthz" | "/readyz" | "/openapi.json") || route == "/docs" || route.starts_with("/docs/") {
        return None;
    }
    let operator_action = OPERATOR_ROUTES.contains(&route);
    Some(match *method {
        _ if operator_action => Scope::Admin,
        Method::GET | Method::HEAD | Method::OPTIONS => Scope::Read,
        _ => Scope::Write,
    })
}

/// Routes whose handlers check the collections they touch (in the body,
/// the query or the records they read) through [`Access`].
const CHECKED_BY_HANDLER: &[&str] = &[
    "/v1/collections",
    "/v1/transactions",
    "/v1/transactions/{id}",
    "/v1/transactions/{id}/abort",
    "/v1/events",
    "/v1/subscriptions",
    "/v1/subscriptions/{id}",
];

/// The configured keys, each with its share of the concurrency limit.
pub struct Keys {
    /// Each key with its scope (computed once) and its permits.
    keys: Vec<(ApiKey, String, Arc<tokio::sync::Semaphore>)>,
    per_key: usize,
}

impl Keys {
    /// `keys`, each allowed `per_key` requests in flight at once.
    pub fn new(keys: Vec<ApiKey>, per_key: usize) -> Self {
        let per_key = per_key.max(1);
        let keys = keys
            .into_iter()
            .map(|k| {
                let scope = k.scope();
                (k, scope, Arc::new(tokio::sync::Semaphore::new(per_key)))
            })
            .collect();
        Self { keys, per_key }
    }
}

/// Middleware: authenticate and authorize every API request, and hold one
/// of the key's permits while it is served (a key at its share of the
/// concurrency limit gets 429; other keys are served).
pub async fn require_key(State(keys): State<Arc<Keys>>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_owned()).unwrap_or_default();
    let Some(needed) = needed_scope(req.method(), &route) else { return next.run(req).await };
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let Some(token) = token else {
        return unauthorized("an API key is required: Authorization: Bearer <key>");
    };
    let Some((key, scope, permits)) =
        keys.keys.iter().find(|(k, _, _)| constant_time_eq(k.key.as_bytes(), token.as_bytes()))
    else {
        return unauthorized("the API key is not valid");
    };
    let access = Access { grants: Some(key.grants.clone().into()) };
    let (mut parts, body) = req.into_parts();
    let collection = if route.contains("{collection}") {
        match Path::<HashMap<String, String>>::from_request_parts(&mut parts, &()).await {
            Ok(Path(params)) => params.get("collection").cloned(),
            // Not decodable: the handler would refuse it too.
            Err(rejection) => return rejection.into_response(),
        }
    } else {
        None
    };
    let allowed = match &collection {
        Some(c) => access.check(needed, c),
        // The handler checks each collection; here, that some are granted.
        None if CHECKED_BY_HANDLER.contains(&route.as_str()) => {
            if key.grants.iter().any(|g| g.scope >= needed) {
                Ok(())
            } else {
                Err(forbidden(needed, None))
            }
        }
        None if access.everywhere(needed) => Ok(()),
        None => Err(forbidden(needed, None)),
    };
    if let Err(err) = allowed {
        return err.into_response();
    }
    // A scrape is not limited (see `limits::limit`).
    let _permit = if route == "/metrics" {
        None
    } else {
        match Arc::clone(permits).try_acquire_owned() {
            Ok(permit) => Some(permit),
            Err(_) => {
                tracing::debug!("request refused: the API key is at its share of the concurrency limit");
                return ApiError::new(
                    ProblemCode::Overloaded,
                    format!(
                        "this API key has {} requests in flight, its share of the gateway \
                         (TXGATE_MAX_CONCURRENCY_PER_KEY); retry later",
                        keys.per_key
                    ),
                )
                .retry(super::limits::RETRY_AFTER)
                .into_response();
            }
        }
    };
    parts.extensions.insert(Caller { scope: scope.clone() });
    parts.extensions.insert(access);
    next.run(Request::from_parts(parts, body)).await
}

fn unauthorized(detail: &str) -> Response {
    let mut response = ApiError::new(ProblemCode::Unauthorized, detail).into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_keys_and_scopes() {
        let keys = parse_keys(
            "abcdefghijklmnop:read, qrstuvwxyz012345:write+admin, orders-key-0123456:read@orders+write@carts",
        )
        .unwrap();
        assert_eq!(keys.len(), 3);
        let access = |k: &ApiKey| Access { grants: Some(k.grants.clone().into()) };
        let (reader, admin, orders) = (access(&keys[0]), access(&keys[1]), access(&keys[2]));
        assert!(reader.everywhere(Scope::Read) && !reader.everywhere(Scope::Write));
        assert!(admin.everywhere(Scope::Read) && admin.everywhere(Scope::Admin));
        assert!(orders.allows(Scope::Read, "orders") && !orders.allows(Scope::Write, "orders"));
        assert!(orders.allows(Scope::Read, "carts") && orders.allows(Scope::Write, "carts"));
        assert!(!orders.allows(Scope::Read, "payments") && !orders.everywhere(Scope::Read));
        assert_eq!(orders.collections(Scope::Read), Some(vec!["carts".to_owned(), "orders".to_owned()]));
        assert_eq!(orders.collections(Scope::Write), Some(vec!["carts".to_owned()]));
        assert_eq!(reader.collections(Scope::Read), None);
        assert!(Access::default().everywhere(Scope::Admin), "no keys: everything");
        assert!(parse_keys("abcdefghijklmnop:read@_txns").is_err(), "reserved names are not collections");
        assert!(parse_keys("abcdefghijklmnop:read@").is_err());
        assert!(parse_keys("abcdefghijklmnop:root@orders").is_err());
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
        assert_eq!(needed_scope(&Method::POST, "/v1/transactions/{id}/abort"), Some(Scope::Admin));
        assert_eq!(needed_scope(&Method::POST, "/v1/deliveries/{id}/retry"), Some(Scope::Admin));
        // A backup copies every collection: `admin` on all of them.
        assert_eq!(needed_scope(&Method::POST, "/v1/admin/backup"), Some(Scope::Admin));
        // A document whose id is `abort` is a document.
        assert_eq!(needed_scope(&Method::GET, "/v1/collections/{collection}/documents/{id}"), Some(Scope::Read));
    }

    #[test]
    fn scopes_are_digests_of_the_whole_key() {
        let keys = parse_keys("svc-billing-0123456789:write, svc-shipping-012345678:write").unwrap();
        assert_ne!(keys[0].scope(), keys[1].scope());
        assert_eq!(keys[0].scope(), keys[0].clone().scope(), "stable");
        assert!(!keys[0].scope().contains("svc"));
        let shown = format!("{keys:?}");
        assert!(!shown.contains("svc-billing") && !shown.contains("svc-shipping"), "{shown}");
    }
}
