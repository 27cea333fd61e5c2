//! API keys: `Authorization: Bearer <key>` checked against the configured
//! keys and their grants. Reads need `read`, writes `write`, operator
//! actions `admin`; `admin` implies the others and `write` implies `read`.
//! A grant may be limited to one collection (`read@orders`). Health,
//! readiness and the API description are public.
//!
//! Each route's scope, and where its collections are, is its [`Guard`],
//! declared beside it (`guard::Routes`). Where a route names its
//! collection in the path, the middleware checks the grant for it. Where
//! the collections are in the body, the query or the stored record
//! (transactions, events, subscriptions, lists), the handler checks them
//! through the caller's [`Access`]. Every other route (deliveries,
//! `/metrics`) needs a grant on every collection.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{FromRequestParts, MatchedPath, Path, Request, State};
use axum::http::header;
use axum::http::request::Parts;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::{ApiError, ProblemCode};
use super::guard::{Guard, Guards, On};
use crate::actor::Actor;
use crate::keys::{ApiKey, Grant, Scope};

/// Which key made the request: its [`ApiKey::scope`], which keeps its
/// idempotency keys apart from every other key's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    pub scope: String,
}

/// What the caller may do, for handlers that find the collections a
/// request touches in its body, query or stored records. Without keys
/// configured: everything.
#[derive(Clone, Debug, Default)]
pub(crate) struct Access {
    /// `None`: no keys configured.
    grants: Option<Arc<[Grant]>>,
    /// The key's share of the instance's event streams (`None`: no keys).
    streams: Option<Arc<tokio::sync::Semaphore>>,
}

impl Access {
    /// One of the key's event stream slots, held while the stream is open;
    /// `Err` when the key holds all of its share. Without keys, `Ok(None)`:
    /// only the instance's limit applies.
    pub(crate) fn stream_slot(&self) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, ()> {
        match &self.streams {
            None => Ok(None),
            Some(share) => Arc::clone(share).try_acquire_owned().map(Some).map_err(|_| ()),
        }
    }

    pub(crate) fn allows(&self, needed: Scope, collection: &str) -> bool {
        self.grants.as_ref().is_none_or(|g| g.iter().any(|g| g.covers(needed, Some(collection))))
    }

    /// Whether `needed` is granted on every collection.
    pub(crate) fn everywhere(&self, needed: Scope) -> bool {
        self.grants.as_ref().is_none_or(|g| g.iter().any(|g| g.covers(needed, None)))
    }

    /// The collections `needed` is granted on; `None`: every collection.
    pub(crate) fn collections(&self, needed: Scope) -> Option<Vec<String>> {
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
    pub(crate) fn check(&self, needed: Scope, collection: &str) -> Result<(), ApiError> {
        if self.allows(needed, collection) { Ok(()) } else { Err(forbidden(needed, Some(collection))) }
    }

    /// 403 unless `needed` is granted on every one of `collections`.
    pub(crate) fn check_all<'a>(
        &self,
        needed: Scope,
        collections: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), ApiError> {
        collections.into_iter().try_for_each(|c| self.check(needed, c))
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Access {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Access>().cloned().unwrap_or_default())
    }
}

/// The request's [`Actor`], as admission found it: the key's, or
/// [`Actor::Anyone`] without keys configured.
impl<S: Send + Sync> FromRequestParts<S> for Actor {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Actor>().cloned().unwrap_or_default())
    }
}

/// 403 for a key without `needed` (on `collection`, or on every one).
pub(crate) fn forbidden(needed: Scope, collection: Option<&str>) -> ApiError {
    let scope = needed.as_str();
    let detail = match collection {
        Some(c) => format!("the API key lacks the {scope} scope on collection {c:?}"),
        None => format!("this needs the {scope} scope on every collection; the API key has it on some or none"),
    };
    let mut err = ApiError::new(ProblemCode::Forbidden, detail);
    err.members.required_scope = Some(scope);
    err.members.collection = collection.map(str::to_owned);
    err
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The configured keys, each with its share of the concurrency limit and
/// of the event streams.
pub(crate) struct Keys {
    /// Each key with its scope (computed once), its permits and its stream
    /// slots.
    keys: Vec<(ApiKey, String, Arc<tokio::sync::Semaphore>, Arc<tokio::sync::Semaphore>)>,
    per_key: usize,
    /// Each route's guard, as its module declared it.
    guards: Guards,
}

impl Keys {
    /// `keys`, each allowed `per_key` requests in flight and
    /// `streams_per_key` event streams open at once, on routes guarded by
    /// `guards`.
    pub(crate) fn new(keys: Vec<ApiKey>, per_key: usize, streams_per_key: usize, guards: Guards) -> Self {
        let per_key = per_key.max(1);
        let keys = keys
            .into_iter()
            .map(|k| {
                let scope = k.scope();
                let streams = Arc::new(tokio::sync::Semaphore::new(streams_per_key.max(1)));
                (k, scope, Arc::new(tokio::sync::Semaphore::new(per_key)), streams)
            })
            .collect();
        Self { keys, per_key, guards }
    }
}

/// Middleware: authenticate and authorize every API request, and hold one
/// of the key's permits while it is served (a key at its share of the
/// concurrency limit gets 429; other keys are served).
pub(crate) async fn require_key(State(keys): State<Arc<Keys>>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_owned()).unwrap_or_default();
    // A route without a guard (none is: see `guard::Routes`) is an
    // operator's alone.
    let guard = keys.guards.get(&route).copied().unwrap_or(Guard::Admin(On::Everywhere));
    let Some((needed, on)) = guard.needs(req.method()) else { return next.run(req).await };
    let token = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")))
        .map(str::trim);
    let Some(token) = token else {
        return unauthorized("an API key is required: Authorization: Bearer <key>");
    };
    let Some((key, scope, permits, streams)) =
        keys.keys.iter().find(|(k, _, _, _)| constant_time_eq(k.key.as_bytes(), token.as_bytes()))
    else {
        return unauthorized("the API key is not valid");
    };
    let access = Access { grants: Some(key.grants.clone().into()), streams: Some(Arc::clone(streams)) };
    let (mut parts, body) = req.into_parts();
    let allowed = match on {
        On::Path => match Path::<HashMap<String, String>>::from_request_parts(&mut parts, &()).await {
            Ok(Path(params)) => match params.get("collection") {
                Some(c) => access.check(needed, c),
                // Declared as naming its collection, and naming none.
                None => Err(forbidden(needed, None)),
            },
            // Not decodable: refused as the handler refuses it.
            Err(rejection) => {
                return ApiError::bad_request(ProblemCode::InvalidPath, rejection.body_text()).into_response();
            }
        },
        // The handler checks each collection; here, that some are granted.
        On::Handler => {
            if key.grants.iter().any(|g| g.scope >= needed) {
                Ok(())
            } else {
                let scope = needed.as_str();
                let detail = format!("the API key has the {scope} scope on no collection");
                let mut err = ApiError::new(ProblemCode::Forbidden, detail);
                err.members.required_scope = Some(scope);
                Err(err)
            }
        }
        On::Everywhere if access.everywhere(needed) => Ok(()),
        On::Everywhere => Err(forbidden(needed, None)),
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
    // What the request changes is recorded as made by the key's name.
    parts.extensions.insert(Actor::Key(key.name.clone()));
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
    use crate::keys::parse_keys;

    #[test]
    fn parses_keys_and_scopes() {
        let keys = parse_keys(
            "abcdefghijklmnop:read, qrstuvwxyz012345:write+admin, orders-key-0123456:read@orders+write@carts",
        )
        .unwrap();
        assert_eq!(keys.len(), 3);
        let access = |k: &ApiKey| Access { grants: Some(k.grants.clone().into()), streams: None };
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
        use axum::http::Method;
        let (_, _, guards) = super::super::api();
        let needs = |method: Method, route: &str| {
            let guard = guards.get(route).unwrap_or_else(|| panic!("{route} has a guard"));
            guard.needs(&method).map(|(scope, _)| scope)
        };
        assert_eq!(needs(Method::GET, "/healthz"), None);
        assert_eq!(needs(Method::GET, "/readyz"), None);
        assert_eq!(needs(Method::GET, "/v1/collections/{collection}/documents"), Some(Scope::Read));
        assert_eq!(needs(Method::POST, "/v1/collections/{collection}/documents"), Some(Scope::Write));
        assert_eq!(needs(Method::POST, "/v1/collections/{collection}/query"), Some(Scope::Read));
        assert_eq!(needs(Method::POST, "/v1/collections/{collection}/documents/{id}/merge"), Some(Scope::Read));
        assert_eq!(needs(Method::POST, "/v1/reads"), Some(Scope::Read));
        assert_eq!(needs(Method::PUT, "/v1/collections/{collection}/indexes/{name}"), Some(Scope::Write));
        assert_eq!(needs(Method::POST, "/v1/transactions"), Some(Scope::Write));
        assert_eq!(needs(Method::POST, "/v1/transactions/{id}/abort"), Some(Scope::Admin));
        assert_eq!(needs(Method::POST, "/v1/deliveries/{id}/retry"), Some(Scope::Admin));
        // A backup copies every collection: `admin` on all of them.
        assert_eq!(guards["/v1/admin/backup"], Guard::Admin(On::Everywhere));
        // A document whose id is `abort` is a document.
        assert_eq!(needs(Method::GET, "/v1/collections/{collection}/documents/{id}"), Some(Scope::Read));
        // Every route that names its collection is guarded by it, and
        // only those.
        for (route, guard) in &guards {
            let on = guard.needs(&Method::GET).map(|(_, on)| on);
            assert_eq!(route.contains("{collection}"), on == Some(On::Path), "{route}: {guard:?}");
        }
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
