//! `/v1/deliveries`: the post-commit hook deliveries, for inspection.

use crate::http::guard::{Guard, On, Routes};
use crate::http::problems::{Problems, problems};
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::auth::Access;
use super::contract::AnyValue;
use super::error::{ApiError, ProblemCode};
use super::extract::{ApiPath, ApiQuery};
use super::paging::{ListQuery, Listed, Page, status_filter};
use crate::actor::Actor;
use crate::clock::{DateTime, rfc3339};
use crate::hooks::{AFTER_PREVIOUS, Delivery, DeliveryStatus, Replay};
use crate::keys::Scope;
use std::collections::HashMap;

pub(crate) fn router() -> Routes {
    // Deliveries are not filtered by collection: a grant on every one.
    Routes::new()
        .guarded(Guard::ByMethod(On::Everywhere), routes!(list_deliveries))
        .guarded(Guard::ByMethod(On::Everywhere), routes!(get_delivery))
        .guarded(Guard::Admin(On::Everywhere), routes!(retry_delivery))
}

/// A delivery: of a transaction's hook, or of an event to a subscription.
#[derive(Serialize, ToSchema)]
pub(crate) struct DeliveryOut {
    /// `<transaction>:<index>` for a hook, `<subscription>:<event id>` for
    /// an event; sent as `webhook-id`.
    pub id: String,
    /// The transaction whose hook this is, or whose change the event is
    /// about; `null` for the event of a single-document write.
    pub transaction: Option<String>,
    /// The hook's place in its transaction's list (0 for an event).
    pub index: i64,
    /// The subscription whose event this delivers; `null` for a hook.
    pub subscription: Option<String>,
    /// The id of the event it delivers; `null` for a hook.
    pub event: Option<String>,
    #[schema(value_type = DeliveryState)]
    pub status: DeliveryState,
    pub method: String,
    pub url: String,
    /// The hook's own headers; their values are write-only (shown as
    /// `[redacted]`).
    pub headers: std::collections::BTreeMap<String, String>,
    /// The body, fixed when the transaction committed.
    #[schema(value_type = AnyValue)]
    pub body: Value,
    #[schema(format = DateTime)]
    pub created_at: String,
    /// When the next attempt is due; null once finished, and while an
    /// earlier hook of the same transaction is not finished yet. While an
    /// attempt is in flight: when its claim expires.
    #[schema(format = DateTime)]
    pub next_attempt_at: Option<String>,
    /// An instance is sending it right now.
    pub in_flight: bool,
    pub attempts: Vec<AttemptOut>,
    #[schema(format = DateTime)]
    pub finished_at: Option<String>,
    /// The name of the API key that made the transaction (or the change
    /// the event is about); absent without one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The user who made it, when a user's token did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<crate::actor::UserId>,
}

/// A delivery's state: `failed` will be retried, `dead` will not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(rename_all = "snake_case")]
pub(crate) enum DeliveryState {
    Pending,
    Failed,
    Dead,
    Delivered,
}

impl From<DeliveryStatus> for DeliveryState {
    fn from(status: DeliveryStatus) -> Self {
        match status {
            DeliveryStatus::Pending => DeliveryState::Pending,
            DeliveryStatus::Failed => DeliveryState::Failed,
            DeliveryStatus::Dead => DeliveryState::Dead,
            DeliveryStatus::Delivered => DeliveryState::Delivered,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub(crate) struct AttemptOut {
    #[schema(format = DateTime)]
    pub at: String,
    pub status_code: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: i64,
}

/// A page of deliveries.
pub(crate) type DeliveryListOut = Page<DeliveryOut>;

impl Listed for DeliveryOut {
    const PAGE: &'static str = "DeliveryListOut";
}

/// The filter of the delivery list (its page: [`ListQuery`]).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct DeliveryFilter {
    /// Only those in this state.
    #[param(value_type = Option<DeliveryState>)]
    pub status: Option<String>,
}

#[derive(Deserialize, IntoParams)]
pub(crate) struct DeliveryPath {
    /// Delivery id, `<transaction>:<index>` or `<subscription>:<event id>`.
    #[param(min_length = 1, max_length = 300)]
    pub id: String,
}

/// `d` as shown: its URL whole to a key that may write every collection
/// (`urls`), with credentials and query string redacted to others.
fn delivery_out(d: Delivery, now: DateTime, urls: bool) -> DeliveryOut {
    let finished = d.status.is_final();
    DeliveryOut {
        body: serde_json::from_str(&d.body).unwrap_or(Value::String(d.body.clone())),
        id: d.id,
        transaction: (!d.txn.is_empty()).then_some(d.txn),
        index: d.index,
        subscription: d.subscription,
        event: d.event,
        status: DeliveryState::from(d.status),
        method: d.method,
        url: if urls { d.url } else { crate::hooks::redact_url(&d.url) },
        headers: d.headers.redacted(),
        created_at: rfc3339(d.created_at),
        next_attempt_at: (!finished && d.next_at != AFTER_PREVIOUS).then(|| rfc3339(d.next_at)),
        in_flight: d.claim.is_some() && d.lease_until.is_some_and(|until| until > now),
        attempts: d
            .attempts
            .into_iter()
            .map(|a| AttemptOut {
                at: rfc3339(a.at),
                status_code: a.status_code,
                error: a.error,
                duration_ms: a.duration_ms,
            })
            .collect(),
        finished_at: d.finished_at.map(rfc3339),
        key: d.by_key,
        actor: d.by_user,
    }
}

problems!(
    /// What `v1.deliveries.list` can answer besides its success.
    ListProblems = Problems::of(&[ValidationFailed])
);

/// List deliveries
///
/// In id order (so a transaction's hooks stand together), optionally by
/// status.
#[utoipa::path(
    get,
    path = "/v1/deliveries",
    operation_id = "v1.deliveries.list",
    tag = "deliveries",
    params(DeliveryFilter, ListQuery),
    responses(ListProblems,
        (status = 200, description = "A page of deliveries", body = DeliveryListOut),
    )
)]
pub(crate) async fn list_deliveries(
    State(state): State<AppState>,
    access: Access,
    actor: Actor,
    ApiQuery(filter): ApiQuery<DeliveryFilter>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<axum::Json<DeliveryListOut>, ApiError> {
    let status: Option<DeliveryStatus> = status_filter(filter.status.as_deref(), "pending, failed, dead or delivered")?;
    let (limit, after) = query.page()?;
    let (items, next) = state.hooks.list(status, after.as_deref(), limit).await?;
    let now = state.hooks.clock.now();
    let urls = access.everywhere(Scope::Write);
    let mut shown = Vec::with_capacity(items.len());
    let mut owners = HashMap::new();
    for d in items {
        if sees(&state, &access, &actor, &d, &mut owners).await? {
            shown.push(delivery_out(d, now, urls));
        }
    }
    Ok(axum::Json(Page::new(shown, next.as_deref())))
}

/// Whether the caller is shown delivery `d`: API keys with the route's
/// grant every one; a user (unless an admin everywhere) only the hooks of
/// their own transactions and the events of their own subscriptions (a
/// delivery's body may carry documents the rules let only its maker
/// read); anonymous callers none (in keyless mode, every caller every
/// one). `owners` keeps each subscription's
/// creator met.
async fn sees(
    state: &AppState,
    access: &Access,
    actor: &Actor,
    d: &Delivery,
    owners: &mut HashMap<String, Option<String>>,
) -> Result<bool, ApiError> {
    let user = match actor {
        Actor::User(user) => user,
        // Keyless mode: everyone; else an anonymous caller.
        Actor::Anyone => return Ok(!access.configured()),
        Actor::Key(_) | Actor::Gateway => return Ok(true),
    };
    if access.everywhere(Scope::Admin) {
        return Ok(true);
    }
    let Some(sub) = &d.subscription else { return Ok(d.by_user.as_ref() == Some(user)) };
    if !owners.contains_key(sub) {
        let owner = state.subscriptions.get(sub).await?.and_then(|s| s.key);
        owners.insert(sub.clone(), owner);
    }
    Ok(owners[sub].is_some() && owners[sub] == actor.owner())
}

problems!(
    /// What `v1.deliveries.get` can answer besides its success.
    GetProblems = Problems::of(&[InvalidPath, NotFound])
);

/// Read a delivery
///
/// Its state and every attempt (time, status code or error, duration).
#[utoipa::path(
    get,
    path = "/v1/deliveries/{id}",
    operation_id = "v1.deliveries.get",
    tag = "deliveries",
    params(DeliveryPath),
    responses(GetProblems,
        (status = 200, description = "The delivery", body = DeliveryOut),
    )
)]
pub(crate) async fn get_delivery(
    State(state): State<AppState>,
    access: Access,
    actor: Actor,
    ApiPath(path): ApiPath<DeliveryPath>,
) -> Result<axum::Json<DeliveryOut>, ApiError> {
    let none = || ApiError::not_found(format!("no delivery {}", path.id));
    let d = state.hooks.delivery(&path.id).await?.ok_or_else(none)?;
    // One the caller is not shown is not there.
    if !sees(&state, &access, &actor, &d, &mut HashMap::new()).await? {
        return Err(none());
    }
    Ok(axum::Json(delivery_out(d, state.hooks.clock.now(), access.everywhere(Scope::Write))))
}

problems!(
    /// What `v1.deliveries.retry` can answer besides its success.
    RetryProblems = Problems::of(&[InvalidPath, NotFound, DeliveryPending])
);

/// Send a delivery again
///
/// Replays a `dead` or `delivered` delivery (it is queued again, with a
/// fresh backoff and `hook_max_age`), or makes a `failed` one due now
/// instead of at the end of its backoff. Other hooks of the transaction
/// are not affected.
#[utoipa::path(
    post,
    path = "/v1/deliveries/{id}/retry",
    operation_id = "v1.deliveries.retry",
    tag = "deliveries",
    params(DeliveryPath),
    responses(RetryProblems,
        (status = 202, description = "Queued; it is sent as soon as a sender is free", body = DeliveryOut),
    )
)]
pub(crate) async fn retry_delivery(
    State(state): State<AppState>,
    access: Access,
    ApiPath(path): ApiPath<DeliveryPath>,
) -> Result<(StatusCode, axum::Json<DeliveryOut>), ApiError> {
    match state.hooks.replay(&path.id).await? {
        Replay::Queued(d) => {
            let out = delivery_out(*d, state.hooks.clock.now(), access.everywhere(Scope::Write));
            Ok((StatusCode::ACCEPTED, axum::Json(out)))
        }
        Replay::AlreadyPending => Err(pending(&path.id)),
        Replay::NotFound => Err(ApiError::not_found(format!("no delivery {}", path.id))),
    }
}

fn pending(id: &str) -> ApiError {
    ApiError::new(ProblemCode::DeliveryPending, format!("delivery {id} is queued or being sent already"))
}
