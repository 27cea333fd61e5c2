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

use std::time::Duration;

use super::error::{ApiError, ProblemCode};
use super::guard::{Guard, Guards, On};
use super::rate::{Bucket, Metered, with_rate};
use crate::actor::Actor;
use crate::identity::{Issuers, Rate, Refusal, TokenCode, User};
use crate::keys::{ApiKey, Grant, Scope};

/// Who made the request, for what must be kept apart per caller
/// (idempotency keys): a digest of the whole API key, or of the user's
/// issuer and subject.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    pub scope: String,
}

/// What the caller may do, for handlers that find the collections a
/// request touches in its body, query or stored records. Without
/// credentials configured: everything.
#[derive(Clone, Debug, Default)]
pub(crate) struct Access {
    /// `None`: no credentials configured.
    grants: Option<Arc<[Grant]>>,
    /// The caller's share of the instance's event streams, and for a user
    /// their issuer's (`None`: no credentials configured).
    streams: Option<Vec<Arc<tokio::sync::Semaphore>>>,
    /// Who holds the grants, as 403s say.
    holder: Holder,
    /// When the caller's credential stops being valid (a token's `exp`);
    /// `None`: it does not expire.
    pub(crate) expires: Option<std::time::SystemTime>,
}

/// Whose grants a request carries, for the words of a 403.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Holder {
    #[default]
    Key,
    User,
    Anonymous,
}

impl Holder {
    fn words(self) -> &'static str {
        match self {
            Holder::Key => "the API key",
            Holder::User => "the user's roles",
            Holder::Anonymous => "anonymous access",
        }
    }

    /// `verb` agreed with [`Holder::words`]: `(singular, plural)`.
    fn agree(self, verb: (&'static str, &'static str)) -> &'static str {
        if self == Holder::User { verb.1 } else { verb.0 }
    }
}

impl Access {
    /// One of the caller's event stream slots, held while the stream is
    /// open; `Err` when the caller holds all of its share. Without
    /// credentials, `Ok(None)`: only the instance's limit applies.
    pub(crate) fn stream_slot(&self) -> Result<Vec<tokio::sync::OwnedSemaphorePermit>, ()> {
        self.streams.iter().flatten().map(|share| Arc::clone(share).try_acquire_owned().map_err(|_| ())).collect()
    }

    /// Whether the gateway has credentials configured (rules apply only
    /// then).
    pub(crate) fn configured(&self) -> bool {
        self.grants.is_some()
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
        if self.allows(needed, collection) { Ok(()) } else { Err(forbidden(self.holder, needed, Some(collection))) }
    }

    /// The grants, in their grammar (`read@orders`); `None`: everything
    /// (no credentials configured).
    pub(crate) fn grant_names(&self) -> Option<Vec<String>> {
        let grants = self.grants.as_ref()?;
        Some(
            grants
                .iter()
                .map(|g| match &g.collection {
                    Some(c) => format!("{}@{c}", g.scope.as_str()),
                    None => g.scope.as_str().to_owned(),
                })
                .collect(),
        )
    }

    /// 403 unless `needed` is granted on every collection.
    pub(crate) fn check_everywhere(&self, needed: Scope) -> Result<(), ApiError> {
        if self.everywhere(needed) { Ok(()) } else { Err(forbidden(self.holder, needed, None)) }
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

/// The request's [`Actor`], as admission found it: the key's, the
/// user's, or [`Actor::Anyone`].
impl<S: Send + Sync> FromRequestParts<S> for Actor {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts.extensions.get::<Actor>().cloned().unwrap_or_default())
    }
}

/// 403 for a caller without `needed` (on `collection`, or on every one).
fn forbidden(holder: Holder, needed: Scope, collection: Option<&str>) -> ApiError {
    let scope = needed.as_str();
    let who = holder.words();
    let detail = match collection {
        Some(c) => format!("{who} {} the {scope} scope on collection {c:?}", holder.agree(("lacks", "lack"))),
        None => format!(
            "this needs the {scope} scope on every collection; {who} {} it on some or none",
            holder.agree(("has", "have"))
        ),
    };
    let mut err = ApiError::new(ProblemCode::Forbidden, detail);
    err.members.required_scope = Some(scope);
    err.members.collection = collection.map(str::to_owned);
    err
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// One caller's share of the instance: requests in flight, event streams
/// open, and (for users and anonymous callers) a request rate.
struct Share {
    permits: Arc<tokio::sync::Semaphore>,
    streams: Arc<tokio::sync::Semaphore>,
    bucket: Option<std::sync::Mutex<Bucket>>,
    /// Requests and streams it allows.
    sizes: (usize, usize),
}

impl Share {
    fn new(requests: usize, streams: usize, rate: Option<Rate>) -> Self {
        let sizes = (requests.max(1), streams.max(1));
        Self {
            permits: Arc::new(tokio::sync::Semaphore::new(sizes.0)),
            streams: Arc::new(tokio::sync::Semaphore::new(sizes.1)),
            bucket: rate.map(|r| std::sync::Mutex::new(Bucket::full(r))),
            sizes,
        }
    }

    /// Whether the share is idle and its bucket full: forgetting it loses
    /// nothing.
    fn forgettable(&self) -> bool {
        self.permits.available_permits() == self.sizes.0
            && self.streams.available_permits() == self.sizes.1
            && self.bucket.as_ref().is_none_or(|b| b.lock().expect("bucket lock").is_full())
    }
}

/// The most users' shares held at once per instance; idle ones with full
/// buckets are forgotten first.
const MAX_USER_SHARES: usize = 100_000;

/// Users: their issuers, and each user's share (by [`User::scope`]),
/// created at their first request.
struct Users {
    issuers: Arc<Issuers>,
    shares: std::sync::Mutex<HashMap<String, Arc<Share>>>,
    /// Each issuer's (by URL) caps on its users' requests in flight and
    /// event streams open at once, and one user's shares of them.
    caps: HashMap<String, IssuerCaps>,
}

struct IssuerCaps {
    requests: Arc<tokio::sync::Semaphore>,
    streams: Arc<tokio::sync::Semaphore>,
    per_user: (usize, usize),
}

/// The configured credentials, each caller's share of the concurrency
/// limit and of the event streams, and each route's guard.
pub(crate) struct Admission {
    /// Each key with its scope (computed once) and its share.
    keys: Vec<(ApiKey, String, Share)>,
    users: Option<Users>,
    /// Anonymous callers' grants and their one share.
    anonymous: Option<(Arc<[Grant]>, Share)>,
    /// Each route's guard, as its module declared it.
    guards: Guards,
    /// Stream tickets, claimed here in place of a credential.
    tickets: Arc<crate::tickets::Tickets>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl Admission {
    /// `keys`, the users of `issuers` and anonymous callers (`anonymous`),
    /// a key and anonymous callers each allowed `TXGATE_MAX_CONCURRENCY_PER_KEY`
    /// requests in flight and `TXGATE_MAX_STREAMS_PER_KEY` (a user: their
    /// issuer's shares per user, within its caps)
    /// event streams open at once, on routes guarded by `guards`.
    pub(crate) fn new(
        config: &crate::config::Config,
        issuers: Option<Arc<Issuers>>,
        tickets: Arc<crate::tickets::Tickets>,
        metrics: Arc<crate::metrics::Metrics>,
        guards: Guards,
    ) -> Self {
        let (per_key, streams_per_key) = (config.max_concurrency_per_key, config.max_streams_per_key);
        let keys = config
            .api_keys
            .iter()
            .map(|k| (k.clone(), k.scope(), Share::new(per_key, streams_per_key, None)))
            .collect();
        let users = issuers.map(|issuers| {
            // By default an issuer's users together have half the instance:
            // accounts anyone may sign up for never take all of it.
            let caps = issuers
                .configs()
                .map(|c| {
                    let requests = c.max_concurrency.unwrap_or(config.max_concurrency / 2).max(1);
                    let streams = c.max_streams.unwrap_or(config.max_streams / 2).max(1);
                    let caps = IssuerCaps {
                        requests: Arc::new(tokio::sync::Semaphore::new(requests)),
                        streams: Arc::new(tokio::sync::Semaphore::new(streams)),
                        per_user: (c.max_concurrency_per_user, c.max_streams_per_user),
                    };
                    (c.url.clone(), caps)
                })
                .collect();
            Users { issuers, shares: std::sync::Mutex::new(HashMap::new()), caps }
        });
        let anonymous = config
            .anonymous
            .clone()
            .map(|grants| (grants.into(), Share::new(per_key, streams_per_key, Some(Rate::DEFAULT))));
        Self { keys, users, anonymous, guards, tickets, metrics }
    }

    /// `user`'s share, made at their first request.
    fn user_share(&self, users: &Users, user: &User) -> Result<Arc<Share>, ApiError> {
        let mut shares = users.shares.lock().expect("user shares lock");
        let scope = user.scope();
        if let Some(share) = shares.get(&scope) {
            return Ok(Arc::clone(share));
        }
        if shares.len() >= MAX_USER_SHARES {
            shares.retain(|_, s| Arc::strong_count(s) > 1 || !s.forgettable());
            if shares.len() >= MAX_USER_SHARES {
                return Err(ApiError::new(
                    ProblemCode::Overloaded,
                    "this instance is serving as many users at once as it keeps shares for; retry later",
                )
                .retry(super::limits::RETRY_AFTER));
            }
        }
        let (requests, streams) = users.caps.get(&user.issuer).map_or((1, 1), |c| c.per_user);
        let share = Arc::new(Share::new(requests, streams, Some(user.rate)));
        shares.insert(scope, Arc::clone(&share));
        Ok(share)
    }
    /// Who `token` names (an API key, or a user's access token), or no
    /// one (anonymous access, where configured); else the 401.
    async fn principal(&self, token: Option<&str>) -> Result<Principal<'_>, Response> {
        match (token, &self.users) {
            (None, _) => match &self.anonymous {
                Some((grants, share)) => Ok(Principal::Anonymous(grants, share)),
                None if self.users.is_some() => {
                    Err(unauthorized("a credential is required: Authorization: Bearer <API key or access token>"))
                }
                None => Err(unauthorized("an API key is required: Authorization: Bearer <key>")),
            },
            (Some(token), Some(users)) if crate::identity::looks_like_jwt(token) => {
                match users.issuers.verify(token).await {
                    Ok(user) => match self.user_share(users, &user) {
                        Ok(share) => Ok(Principal::User(user, share)),
                        Err(err) => Err(err.into_response()),
                    },
                    Err(refusal) => {
                        let issuer = refusal.issuer.as_deref().unwrap_or("unknown");
                        let code = refused_code(refusal.code).map_or("issuer_unavailable", ProblemCode::as_str);
                        self.metrics.count(&crate::metrics::TOKEN_REFUSALS, &[issuer, code], 1);
                        Err(refused_token(&refusal))
                    }
                }
            }
            (Some(token), _) => {
                match self.keys.iter().find(|(k, _, _)| constant_time_eq(k.key.as_bytes(), token.as_bytes())) {
                    Some((key, scope, share)) => Ok(Principal::Key(key, scope, share)),
                    None if crate::identity::looks_like_jwt(token) => {
                        Err(invalid("the token is not an API key, and no issuer of tokens is configured"))
                    }
                    None => Err(invalid("the API key is not valid")),
                }
            }
        }
    }

    /// Who a ticket's holder is now: the key of that name (with its
    /// current grants), the user (with the grants their token had), or
    /// anonymous access; refused if that credential is gone.
    fn holder(&self, holder: &crate::tickets::Holder) -> Result<Principal<'_>, ApiError> {
        let gone = |what| ticket_refused(crate::tickets::Refused::Invalid(what));
        if let Some(name) = &holder.key {
            return match self.keys.iter().find(|(k, _, _)| &k.name == name) {
                Some((key, scope, share)) => Ok(Principal::Key(key, scope, share)),
                None => Err(gone("the API key the ticket was asked for with is no longer configured")),
            };
        }
        if let Some(user) = &holder.user {
            let Some(users) = &self.users else {
                return Err(gone("no issuer of tokens is configured any more"));
            };
            let Some(issuer) = users.issuers.configs().find(|c| c.url == user.issuer) else {
                return Err(gone("the ticket's issuer is no longer configured"));
            };
            let grants = holder.grants.iter().filter_map(|g| Grant::parse(g).ok()).collect();
            let rate = holder
                .rate
                .map(|(quota, secs)| Rate { quota, window: Duration::from_secs(secs.max(1)) })
                .unwrap_or(issuer.rate);
            let expires = holder.expires.map_or(std::time::UNIX_EPOCH, |e| e.to_system_time());
            if expires <= std::time::SystemTime::now() {
                return Err(gone("the token the ticket was asked for with has expired: ask for a new one"));
            }
            let user = Arc::new(User {
                issuer: user.issuer.clone(),
                issuer_name: issuer.name.clone(),
                subject: user.subject.clone(),
                roles: holder.roles.clone(),
                claims: holder.claims.as_deref().and_then(|c| serde_json::from_str(c).ok()).unwrap_or_default(),
                grants,
                rate,
                // A ticket opens a stream, which sends no hook.
                hooks: Vec::new(),
                expires,
            });
            let share = self.user_share(users, &user)?;
            return Ok(Principal::User(user, share));
        }
        match (&self.anonymous, holder.anonymous) {
            (Some((grants, share)), true) => Ok(Principal::Anonymous(grants, share)),
            _ => Err(gone("the ticket's holder has no credential here any more")),
        }
    }
}

/// The credential of an `Authorization: Bearer <credential>` value.
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credential) = value.trim().split_once([' ', '\t'])?;
    let credential = credential.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !credential.is_empty()).then_some(credential)
}

/// The `ticket` query parameter of `req`, if any.
fn ticket_of(req: &Request) -> Option<String> {
    let query = req.uri().query()?;
    url::form_urlencoded::parse(query.as_bytes()).find(|(k, _)| k == "ticket").map(|(_, v)| v.into_owned())
}

/// 401 `ticket_invalid` (or the store's error).
pub(crate) fn ticket_refused(refused: crate::tickets::Refused) -> ApiError {
    match refused {
        crate::tickets::Refused::Invalid(why) => ApiError::new(ProblemCode::TicketInvalid, why),
        crate::tickets::Refused::Store(e) => e.into(),
    }
}

/// Who a request's credential names.
enum Principal<'a> {
    Key(&'a ApiKey, &'a String, &'a Share),
    User(Arc<User>, Arc<Share>),
    Anonymous(&'a Arc<[Grant]>, &'a Share),
}

/// Middleware: authenticate and authorize every API request, and hold one
/// of the caller's permits while it is served (a caller at its share of
/// the concurrency limit, or past its request rate, gets 429; other
/// callers are served).
pub(crate) async fn admit(State(keys): State<Arc<Admission>>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().map(|m| m.as_str().to_owned()).unwrap_or_default();
    // A route without a guard (none is: see `guard::Routes`) is an
    // operator's alone.
    let guard = keys.guards.get(&route).copied().unwrap_or(Guard::Admin(On::Everywhere));
    let Some((needed, on)) = guard.needs_for(req.method(), req.uri().query()) else { return next.run(req).await };
    // A header that is there but is not `Bearer <credential>` (any case,
    // RFC 9110 §11.1) is refused, never taken as no credential.
    let token = match req.headers().get(header::AUTHORIZATION).map(|v| v.to_str().ok().and_then(bearer)) {
        None => None,
        Some(Some(token)) => Some(token),
        Some(None) => return invalid("the Authorization header is not `Bearer <API key or access token>`"),
    };
    // A stream opened with a ticket: its holder, in place of a credential.
    // It is used (spent) only once the stream opens (`http::events`): a
    // refusal (429, 403) leaves it for a retry within its minute.
    let ticket = match ticket_of(&req) {
        Some(ticket) if route == "/v1/events" => match keys.tickets.peek(&ticket).await {
            Ok(peeked) => Some(peeked),
            Err(refused) => return ticket_refused(refused).into_response(),
        },
        _ => None,
    };
    let principal = match ticket.as_ref().map(|t| keys.holder(&t.claimed.holder)) {
        Some(Ok(principal)) => principal,
        Some(Err(err)) => return err.into_response(),
        None => match keys.principal(token).await {
            Ok(principal) => principal,
            Err(response) => return response,
        },
    };
    let (grants, holder, share): (Arc<[Grant]>, Holder, &Share) = match &principal {
        Principal::Key(key, _, share) => (key.grants.clone().into(), Holder::Key, share),
        Principal::User(user, share) => (user.grants.clone().into(), Holder::User, share),
        Principal::Anonymous(grants, share) => (Arc::clone(grants), Holder::Anonymous, share),
    };
    if let Principal::User(user, _) = &principal
        && user.grants.is_empty()
    {
        let mut err = ApiError::new(
            ProblemCode::Forbidden,
            format!("none of the user's roles maps to a grant at issuer {:?}", user.issuer_name),
        );
        err.members.required_scope = Some(needed.as_str());
        return with_challenge(err.into_response(), "insufficient_scope", "no role maps to a grant");
    }
    let expires = match &principal {
        Principal::User(user, _) => Some(user.expires),
        _ => None,
    };
    let issuer_caps = match (&principal, &keys.users) {
        (Principal::User(user, _), Some(users)) => users.caps.get(&user.issuer),
        _ => None,
    };
    let mut streams = vec![Arc::clone(&share.streams)];
    streams.extend(issuer_caps.map(|caps| Arc::clone(&caps.streams)));
    let access = Access { grants: Some(Arc::clone(&grants)), streams: Some(streams), holder, expires };
    // The request rate, for users and anonymous callers (a scrape is not
    // limited: see `limits::limit`).
    let metered = match (&share.bucket, &principal) {
        _ if route == "/metrics" => None,
        (Some(bucket), Principal::User(user, _)) => Some(bucket.lock().expect("bucket lock").take(user.rate)),
        (Some(bucket), _) => Some(bucket.lock().expect("bucket lock").take(Rate::DEFAULT)),
        (None, _) => None,
    };
    if let Some(Metered { wait: Some(wait), .. }) = &metered {
        let caller = if matches!(principal, Principal::User(..)) { "user" } else { "anonymous" };
        keys.metrics.incr(&crate::metrics::RATE_LIMITED, caller);
        let response = ApiError::new(
            ProblemCode::RateLimited,
            "this caller has used its request rate (RateLimit-Policy); retry after Retry-After",
        )
        .retry(wait.max(&Duration::from_secs(1)).to_owned())
        .into_response();
        return with_rate(response, metered.as_ref());
    }
    let (mut parts, body) = req.into_parts();
    let allowed = match on {
        On::Path => match Path::<HashMap<String, String>>::from_request_parts(&mut parts, &()).await {
            Ok(Path(params)) => match params.get("collection") {
                Some(c) => access.check(needed, c),
                // Declared as naming its collection, and naming none.
                None => Err(forbidden(holder, needed, None)),
            },
            // Not decodable: refused as the handler refuses it.
            Err(rejection) => {
                return ApiError::bad_request(ProblemCode::InvalidPath, rejection.body_text()).into_response();
            }
        },
        // The handler checks each collection; here, that some are granted.
        On::Handler => {
            if grants.iter().any(|g| g.scope >= needed) {
                Ok(())
            } else {
                let scope = needed.as_str();
                let detail =
                    format!("{} {} the {scope} scope on no collection", holder.words(), holder.agree(("has", "have")));
                let mut err = ApiError::new(ProblemCode::Forbidden, detail);
                err.members.required_scope = Some(scope);
                Err(err)
            }
        }
        On::Everywhere if access.everywhere(needed) => Ok(()),
        On::Everywhere => Err(forbidden(holder, needed, None)),
    };
    if let Err(err) = allowed {
        return with_rate(err.into_response(), metered.as_ref());
    }
    // A scrape is not limited (see `limits::limit`).
    let _permits = if route == "/metrics" {
        None
    } else {
        let own = Arc::clone(&share.permits).try_acquire_owned();
        let cap = issuer_caps.map(|caps| Arc::clone(&caps.requests).try_acquire_owned());
        match (own, cap) {
            (Ok(own), None) => Some((own, None)),
            (Ok(own), Some(Ok(cap))) => Some((own, Some(cap))),
            (Err(_), _) => {
                tracing::debug!("request refused: the caller is at its share of the concurrency limit");
                let response = ApiError::new(
                    ProblemCode::Overloaded,
                    format!(
                        "this caller has {} requests in flight, its share of the gateway \
                         (TXGATE_MAX_CONCURRENCY_PER_KEY; for a user, its issuer's max_concurrency_per_user); \
                         retry later",
                        share.sizes.0
                    ),
                )
                .retry(super::limits::RETRY_AFTER)
                .into_response();
                return with_rate(response, metered.as_ref());
            }
            (Ok(_), Some(Err(_))) => {
                tracing::debug!("request refused: the issuer's users are at their aggregate cap");
                let response = ApiError::new(
                    ProblemCode::Overloaded,
                    "this issuer's users have as many requests in flight as the issuer's max_concurrency allows; \
                     retry later",
                )
                .retry(super::limits::RETRY_AFTER)
                .into_response();
                return with_rate(response, metered.as_ref());
            }
        }
    };
    let (scope, actor) = match &principal {
        // What the request changes is recorded as made by the key's name.
        Principal::Key(key, scope, _) => ((*scope).clone(), Actor::Key(key.name.clone())),
        Principal::User(user, _) => {
            (user.scope(), Actor::User(Arc::new(crate::actor::UserId::new(&user.issuer, &user.subject))))
        }
        Principal::Anonymous(..) => ("anonymous".to_owned(), Actor::Anyone),
    };
    parts.extensions.insert(Caller { scope });
    parts.extensions.insert(access);
    parts.extensions.insert(actor);
    if let Principal::User(user, _) = &principal {
        parts.extensions.insert(Arc::clone(user));
    }
    if let Some(ticket) = ticket {
        parts.extensions.insert(ticket);
    }
    let response = next.run(Request::from_parts(parts, body)).await;
    with_rate(response, metered.as_ref())
}

/// 401 for a missing or unknown credential: a bare `Bearer` challenge
/// (RFC 6750 §3: no error code when no token was understood).
fn unauthorized(detail: &str) -> Response {
    let mut response = ApiError::new(ProblemCode::Unauthorized, detail).into_response();
    response.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Bearer"));
    response
}

/// 401 for a credential that is not a valid API key (nor, without
/// issuers, a token): `Bearer error="invalid_token"`.
fn invalid(detail: &str) -> Response {
    with_challenge(ApiError::new(ProblemCode::Unauthorized, detail).into_response(), "invalid_token", "unauthorized")
}

/// 401 for a refused token, with its code, and `WWW-Authenticate: Bearer
/// error="invalid_token"` (RFC 6750 §3.1); 503 when its issuer's keys
/// cannot be had.
fn refused_token(refusal: &Refusal) -> Response {
    let Some(code) = refused_code(refusal.code) else {
        return ApiError::new(ProblemCode::IssuerUnavailable, refusal.detail.clone())
            .retry(Duration::from_secs(5))
            .into_response();
    };
    let response = ApiError::new(code, refusal.detail.clone()).into_response();
    with_challenge(response, "invalid_token", code.as_str())
}

/// The 401 problem code of a token's refusal; `None`: not the token's
/// fault (its issuer's keys cannot be had).
fn refused_code(code: TokenCode) -> Option<ProblemCode> {
    Some(match code {
        TokenCode::Malformed => ProblemCode::TokenMalformed,
        TokenCode::Expired => ProblemCode::TokenExpired,
        TokenCode::NotYetValid => ProblemCode::TokenNotYetValid,
        TokenCode::Audience => ProblemCode::TokenAudience,
        TokenCode::Issuer => ProblemCode::TokenIssuer,
        TokenCode::Signature => ProblemCode::TokenSignature,
        TokenCode::Algorithm => ProblemCode::TokenAlgorithm,
        TokenCode::Type => ProblemCode::TokenType,
        TokenCode::Header => ProblemCode::TokenHeader,
        TokenCode::Key => ProblemCode::TokenKey,
        TokenCode::Claims => ProblemCode::TokenClaims,
        TokenCode::IssuerUnavailable => return None,
    })
}

/// `WWW-Authenticate: Bearer error="<error>", error_description="<why>"`
/// (`why` is one of the gateway's own words, never the token's).
fn with_challenge(mut response: Response, error: &str, why: &str) -> Response {
    if let Ok(v) = header::HeaderValue::from_str(&format!("Bearer error=\"{error}\", error_description=\"{why}\"")) {
        response.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
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
        let access = |k: &ApiKey| Access { grants: Some(k.grants.clone().into()), ..Access::default() };
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
        // Schemas: any reader reads them, an admin declares them.
        let schema = "/v1/collections/{collection}/schemas/{version}";
        assert_eq!((needs(Method::GET, schema), needs(Method::PUT, schema)), (Some(Scope::Read), Some(Scope::Admin)));
        assert_eq!(needs(Method::DELETE, schema), Some(Scope::Admin));
        assert_eq!(needs(Method::POST, "/v1/collections/{collection}/schema/violations"), Some(Scope::Admin));
        assert_eq!(needs(Method::GET, "/v1/collections/{collection}/schema/violations"), Some(Scope::Admin));
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
