//! `/v1/subscriptions`: change events as webhooks (docs/design.md §5), sent by the
//! delivery engine of `/v1/deliveries`.

use crate::actor::Actor;
use crate::http::guard::{Guard, On, Routes};
use crate::http::problems::{Problems, problems};
use axum::extract::State;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::auth::Access;
use super::contract::{Collection, HookUrl};
use super::error::{ApiError, ProblemCode};
use super::events::event_type;
use super::extract::present;
use super::extract::{ApiPath, ApiQuery, JsonBody, from_body};
use super::paging::{ListQuery, Listed, Page, kept};
use crate::clock::rfc3339;
use crate::document::rules::{Invalid, check_collection};
use crate::events::{EventType, Filter};
use crate::keys::Scope;
use crate::seal::List;
use crate::subscriptions::{CreateError, Subscription};

pub(crate) fn router() -> Routes {
    // The handlers check the collections a subscription names.
    Routes::new()
        .guarded(Guard::ByMethod(On::Handler), routes!(create_subscription, list_subscriptions))
        .guarded(Guard::ByMethod(On::Handler), routes!(get_subscription, delete_subscription))
        .guarded(Guard::ByMethod(On::Handler), routes!(renew_subscription))
}

/// Most collections one subscription may name.
const MAX_COLLECTIONS: usize = 100;

/// A new subscription.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"url": "https://example.com/hooks/orders", "collections": ["orders"], "types": ["document.created", "document.updated"]}))]
pub(crate) struct SubscriptionIn {
    /// Where each event is POSTed: an http(s) URL the gateway's destination
    /// policy allows (as for hooks).
    #[schema(value_type = HookUrl)]
    pub url: String,
    /// Only events about these collections (a `transaction.committed`
    /// event: when one of its members is in one). Every collection when
    /// absent.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<Collection>>, nullable = false, min_items = 1, max_items = 100)]
    pub collections: Option<Vec<String>>,
    /// Only events of these types. Every type when absent (a subscription
    /// delivers changes: never `access.viewed_as`).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<EventType>>, nullable = false, min_items = 1, max_items = 6)]
    pub types: Option<Vec<String>>,
}

/// A subscription: every event appended to the log since its creation that
/// its filters want is POSTed to `url`, one per request, with
/// `webhook-id: <subscription>:<event id>`, signed like hooks, retried and
/// dead-lettered like them (see `/v1/deliveries`); one document's events
/// go in order.
#[derive(Serialize, ToSchema)]
pub(crate) struct SubscriptionOut {
    pub id: String,
    #[schema(format = "uri")]
    pub url: String,
    /// `null`: every collection.
    #[schema(value_type = Option<Vec<Collection>>)]
    pub collections: Option<Vec<String>>,
    /// `null`: every type.
    pub types: Option<Vec<EventType>>,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// The log position up to which its events have been queued as
    /// deliveries (it started at the end of the log when created).
    pub position: i64,
    /// A user's subscription delivers until the token that created (or
    /// renewed) it expires, then pauses, losing nothing, until renewed
    /// (`POST /v1/subscriptions/{id}/renew`); absent for an API key's.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(format = DateTime)]
    pub expires_at: Option<String>,
}

impl SubscriptionOut {
    /// `s` as `access` is shown it: its URL whole to a key that may delete
    /// it (write on what it delivers), with credentials and query string
    /// redacted to others.
    fn shown(s: Subscription, access: &Access) -> Self {
        let whole = allowed(&s, access, Scope::Write).is_ok();
        let mut out = Self::from(s);
        if !whole {
            out.url = crate::hooks::redact_url(&out.url);
        }
        out
    }
}

impl From<Subscription> for SubscriptionOut {
    fn from(s: Subscription) -> Self {
        Self {
            id: s.id,
            url: s.url,
            collections: s.collections,
            types: s.types,
            created_at: rfc3339(s.created_at),
            position: s.position,
            expires_at: s.caller.and_then(|c| c.expires).map(rfc3339),
        }
    }
}

/// A page of subscriptions.
pub(crate) type SubscriptionListOut = Page<SubscriptionOut>;

impl Listed for SubscriptionOut {
    const PAGE: &'static str = "SubscriptionListOut";
}

#[derive(Deserialize, IntoParams)]
pub(crate) struct SubscriptionPath {
    /// Subscription id.
    #[param(min_length = 1, max_length = 64)]
    pub id: String,
}

/// A subscription's filters: collections and types (`None`: all).
type Filters = (Option<Vec<String>>, Option<Vec<EventType>>);

/// The subscription's destination and filters, checked.
fn check(input: &SubscriptionIn, state: &AppState) -> Result<Filters, ApiError> {
    state.hook_guard.destination(&input.url, "/url")?;
    let collections = match &input.collections {
        None => None,
        Some(list) => {
            if list.is_empty() || list.len() > MAX_COLLECTIONS {
                let why = format!("name 1 to {MAX_COLLECTIONS} collections, or leave it out for every collection");
                return Err(Invalid::new("/collections", why).into());
            }
            for (i, c) in list.iter().enumerate() {
                check_collection(c, &format!("/collections/{i}"))?;
                if list[..i].contains(c) {
                    return Err(Invalid::new(format!("/collections/{i}"), format!("{c} is named twice")).into());
                }
            }
            Some(list.clone())
        }
    };
    let types = match &input.types {
        None => None,
        Some(list) => {
            if list.is_empty() {
                return Err(Invalid::new("/types", "name at least one type, or leave it out for every type").into());
            }
            let mut types = Vec::new();
            for (i, t) in list.iter().enumerate() {
                let pointer = format!("/types/{i}");
                let t = event_type(t, &pointer)?;
                if types.contains(&t) {
                    return Err(Invalid::new(pointer, format!("{} is named twice", t.as_str())).into());
                }
                types.push(t);
            }
            Some(types)
        }
    };
    Ok((collections, types))
}

problems!(
    /// What `v1.subscriptions.create` can answer besides its success.
    CreateProblems = Problems::of(&[ValidationFailed, HookNotAllowed, SubscriptionLimit, RuleDenied]).with_body()
);

/// Create a subscription
///
/// Every event appended from now on that the filters want is POSTed to
/// `url` as JSON (the event as `/v1/events` shows it), one per request,
/// with `webhook-id: <subscription>:<event id>`, `txgate-subscription`,
/// and `webhook-signature` when a signing secret is configured. Failed
/// attempts are retried with backoff, then dead-lettered; each delivery
/// is listed under `/v1/deliveries`, and can be replayed there. One
/// document's events are delivered in version order. With an API key
/// limited to some collections, `collections` may name those only, and
/// only events that tell of nothing else are delivered. Each API key may
/// have `TXGATE_MAX_SUBSCRIPTIONS_PER_KEY` subscriptions (100 by default;
/// 409 `subscription_limit` beyond).
#[utoipa::path(
    post,
    path = "/v1/subscriptions",
    operation_id = "v1.subscriptions.create",
    tag = "subscriptions",
    request_body(content = SubscriptionIn, content_type = "application/json"),
    responses(CreateProblems,
        (status = 201, description = "Created", body = SubscriptionOut,
            headers(("Location" = String, description = "URL of the subscription"))),
    )
)]
pub(crate) async fn create_subscription(
    State(state): State<AppState>,
    access: Access,
    actor: Actor,
    super::ruled::Who(who): super::ruled::Who,
    user: Option<axum::Extension<std::sync::Arc<crate::identity::User>>>,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let input: SubscriptionIn = from_body(value, &[""])?;
    let (collections, types) = check(&input, &state)?;
    // A user's subscriptions deliver where their roles allow.
    super::ruled::hook_allowed(&who, user.as_deref().map(std::sync::Arc::as_ref), &input.url, "/url")?;
    // A key limited to some collections subscribes to those only: the
    // filter may not name others, and events telling of others are left
    // out (a transaction's event with a member elsewhere).
    access.check_all(Scope::Write, collections.iter().flatten().map(String::as_str))?;
    let within = access.collections(Scope::Read);
    // Subscriptions deliver changes: never an `access.viewed_as` event.
    let filter = Filter { collections, types, within, admin: Some(Vec::new()) };
    // Its events are judged as its creator's stream would judge them, and
    // a user's only until their token expires (then it pauses until renewed).
    let expires = access.expires.map(crate::store::DateTime::from_system_time);
    let caller = crate::subscriptions::Caller::of(&who, expires);
    let sub = match state.subscriptions.create(input.url, filter, (actor.owner(), caller)).await {
        Ok(sub) => sub,
        Err(CreateError::Store(err)) => return Err(err.into()),
        Err(CreateError::Limit(has)) => {
            return Err(ApiError::new(
                ProblemCode::SubscriptionLimit,
                format!(
                    "this caller has {has} subscriptions, as many as it may (TXGATE_MAX_SUBSCRIPTIONS_PER_KEY); \
                     delete one first"
                ),
            ));
        }
    };
    let location = format!("/v1/subscriptions/{}", sub.id);
    let mut response = (StatusCode::CREATED, axum::Json(SubscriptionOut::from(sub))).into_response();
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    Ok(response)
}

problems!(
    /// What `v1.subscriptions.list` can answer besides its success.
    ListProblems = Problems::of(&[ValidationFailed])
);

/// List subscriptions
///
/// In creation order. An API key limited to some collections sees the
/// subscriptions made with keys limited to those (a page may then hold
/// fewer than `limit`; follow `next`).
#[utoipa::path(
    get,
    path = "/v1/subscriptions",
    operation_id = "v1.subscriptions.list",
    tag = "subscriptions",
    params(ListQuery),
    responses(ListProblems,
        (status = 200, description = "A page of subscriptions", body = SubscriptionListOut),
    )
)]
pub(crate) async fn list_subscriptions(
    State(state): State<AppState>,
    access: Access,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<axum::Json<SubscriptionListOut>, ApiError> {
    let (limit, after) = query.sealed_page(&state.seal, List::Subscriptions).await?;
    let subscriptions = &state.subscriptions;
    let (items, next) = kept(
        |after, n| async move { subscriptions.list(after.as_deref(), n).await },
        after,
        limit,
        |s: &Subscription| visible(s, &access, Scope::Read),
        |s| &s.id,
    )
    .await?;
    let items = items.into_iter().map(|s| SubscriptionOut::shown(s, &access)).collect();
    Ok(axum::Json(Page::sealed(items, next.as_deref(), &state.seal, List::Subscriptions).await?))
}

problems!(
    /// What `v1.subscriptions.get` can answer besides its success.
    GetProblems = Problems::of(&[InvalidPath, NotFound])
);

/// Read a subscription
///
/// Its destination, filters, and the log position up to which its events
/// have been queued as deliveries.
#[utoipa::path(
    get,
    path = "/v1/subscriptions/{id}",
    operation_id = "v1.subscriptions.get",
    tag = "subscriptions",
    params(SubscriptionPath),
    responses(GetProblems,
        (status = 200, description = "The subscription", body = SubscriptionOut),
    )
)]
pub(crate) async fn get_subscription(
    State(state): State<AppState>,
    access: Access,
    ApiPath(path): ApiPath<SubscriptionPath>,
) -> Result<axum::Json<SubscriptionOut>, ApiError> {
    let sub = state.subscriptions.get(&path.id).await?.ok_or_else(|| not_found(&path.id))?;
    reach(&sub, &access, Scope::Read)?;
    Ok(axum::Json(SubscriptionOut::shown(sub, &access)))
}

problems!(
    /// What `v1.subscriptions.delete` can answer besides its success.
    DeleteProblems = Problems::of(&[InvalidPath, NotFound])
);

/// Delete a subscription
///
/// No more of its events are queued, and deliveries of it not yet sent
/// are dead without an attempt.
#[utoipa::path(
    delete,
    path = "/v1/subscriptions/{id}",
    operation_id = "v1.subscriptions.delete",
    tag = "subscriptions",
    params(SubscriptionPath),
    responses(DeleteProblems,
        (status = 204, description = "Deleted"),
    )
)]
pub(crate) async fn delete_subscription(
    State(state): State<AppState>,
    access: Access,
    ApiPath(path): ApiPath<SubscriptionPath>,
) -> Result<StatusCode, ApiError> {
    if !access.everywhere(Scope::Write) {
        let sub = state.subscriptions.get(&path.id).await?.ok_or_else(|| not_found(&path.id))?;
        reach(&sub, &access, Scope::Write)?;
    }
    if state.subscriptions.delete(&path.id).await? { Ok(StatusCode::NO_CONTENT) } else { Err(not_found(&path.id)) }
}

problems!(
    /// What `v1.subscriptions.renew` can answer besides its success.
    RenewProblems = Problems::of(&[InvalidPath, NotFound])
);

/// Renew a subscription
///
/// By its creator, with a fresher token: its events are judged by the
/// roles and claims of this one, and it delivers until this token expires.
/// A paused subscription goes on from where it stopped; nothing is lost
/// (within the event log's retention).
#[utoipa::path(
    post,
    path = "/v1/subscriptions/{id}/renew",
    operation_id = "v1.subscriptions.renew",
    tag = "subscriptions",
    params(SubscriptionPath),
    responses(RenewProblems,
        (status = 200, description = "Renewed", body = SubscriptionOut),
    )
)]
pub(crate) async fn renew_subscription(
    State(state): State<AppState>,
    access: Access,
    actor: Actor,
    super::ruled::Who(who): super::ruled::Who,
    ApiPath(path): ApiPath<SubscriptionPath>,
) -> Result<axum::Json<SubscriptionOut>, ApiError> {
    let sub = state.subscriptions.get(&path.id).await?.ok_or_else(|| not_found(&path.id))?;
    // Its creator's only: anyone else is told there is none.
    if sub.key.is_none() || sub.key != actor.owner() {
        return Err(not_found(&path.id));
    }
    reach(&sub, &access, Scope::Write)?;
    let expires = access.expires.map(crate::store::DateTime::from_system_time);
    let caller = crate::subscriptions::Caller::of(&who, expires).ok_or_else(|| not_found(&path.id))?;
    if !state.subscriptions.renew(&path.id, caller).await? {
        return Err(not_found(&path.id));
    }
    let sub = state.subscriptions.get(&path.id).await?.ok_or_else(|| not_found(&path.id))?;
    Ok(axum::Json(SubscriptionOut::shown(sub, &access)))
}

/// Whether the caller may see (`Read`) or delete (`Write`) `sub`. A
/// subscription made with a key limited to some collections delivers
/// events of those only: it needs `needed` on each of them. Any other may
/// deliver events of every collection (a transaction's event lists all its
/// members), so it needs `needed` everywhere.
fn visible(sub: &Subscription, access: &Access, needed: Scope) -> bool {
    allowed(sub, access, needed).is_ok()
}

/// [`allowed`] for a subscription named by its id: one the caller may not
/// see is answered as one that does not exist (404), so its existence and
/// the collections it delivers stay another key's.
fn reach(sub: &Subscription, access: &Access, needed: Scope) -> Result<(), ApiError> {
    if !visible(sub, access, Scope::Read) {
        return Err(not_found(&sub.id));
    }
    allowed(sub, access, needed)
}

fn allowed(sub: &Subscription, access: &Access, needed: Scope) -> Result<(), ApiError> {
    match &sub.within {
        None => access.check_everywhere(needed),
        Some(colls) => access.check_all(needed, colls.iter().map(String::as_str)),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::not_found(format!("no subscription {id}"))
}
