//! `POST /v1/events/tickets`: a ticket that opens one event stream in place
//! of the `Authorization` header (docs/guides/users.md, "Streams and
//! tickets"); the stream side is in `events.rs`, the tickets themselves in
//! the `tickets` service.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::AppState;
use super::auth::Access;
use super::error::{ApiError, ProblemCode};
use super::events::{EventsQuery, filter, position, set_filter};
use super::guard::{Guard, On, Routes};
use super::problems::{Problems, problems};

/// The longest `filter` a ticket keeps, in bytes.
const MAX_FILTER: usize = 4096;

pub(crate) fn router() -> Routes {
    // Authorized like the stream it is for: a read.
    Routes::new().guarded(Guard::Read(On::Handler), utoipa_axum::routes!(ticket))
}

/// What a ticket is asked for with: the stream's parameters, as
/// `GET /v1/events` takes them, and where it starts.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"collections": "carts", "after": "42"}))]
pub(crate) struct TicketIn {
    /// As the stream's `collections`.
    collections: Option<String>,
    /// As the stream's `types`.
    types: Option<String>,
    /// As the stream's `filter` (JSON, as a string).
    filter: Option<String>,
    /// The `seq` of the last event the client saw.
    after: Option<String>,
}

/// A ticket, to open one stream within 60 s.
#[derive(Serialize, ToSchema)]
pub(crate) struct TicketOut {
    /// The ticket: `GET /v1/events?ticket=<ticket>` with the parameters
    /// it was asked for.
    ticket: String,
    /// When it can no longer be used (RFC 3339).
    expires_at: String,
    /// The stream's address with the ticket, for `new EventSource(url)`.
    url: String,
}

problems!(
    /// What `v1.events.tickets.create` can answer besides its success.
    TicketProblems = Problems::of(&[ValidationFailed, InvalidFilter, IndexRequired, CursorBeyondHead]).with_body()
);

/// Ask for a stream ticket
///
/// A browser's `EventSource` cannot send an `Authorization` header, and a
/// token in a URL leaks into logs: a ticket, asked for here with the
/// credential, opens the stream instead (`GET /v1/events?ticket=…`), once,
/// within 60 s, on any instance. It carries who asked and what they may
/// read; a stream opened with it ends when their token expires (after
/// `event: reauth`). Ask for another with the last event id seen, and
/// nothing is missed.
#[utoipa::path(
    post,
    path = "/v1/events/tickets",
    operation_id = "v1.events.tickets.create",
    tag = "events",
    request_body(content = TicketIn, content_type = "application/json"),
    responses(TicketProblems, (status = 201, description = "The ticket", body = TicketOut))
)]
pub(crate) async fn ticket(
    State(state): State<AppState>,
    access: Access,
    actor: crate::actor::Actor,
    caller: Option<axum::Extension<super::auth::Caller>>,
    user: Option<axum::Extension<Arc<crate::identity::User>>>,
    super::extract::JsonBody { value, .. }: super::extract::JsonBody<serde_json::Value>,
) -> Result<Response, ApiError> {
    let input: TicketIn = super::extract::from_body(value, &[""])?;
    // What a ticket keeps is small: its stream's address must fit in a URL.
    for (pointer, value, most) in [
        ("/collections", &input.collections, 1024),
        ("/types", &input.types, 256),
        ("/filter", &input.filter, MAX_FILTER),
        ("/after", &input.after, 32),
    ] {
        if value.as_ref().is_some_and(|v| v.len() > most) {
            return Err(
                crate::document::rules::Invalid::new(pointer, format!("at most {most} bytes in a ticket")).into()
            );
        }
    }
    let query = EventsQuery {
        collections: input.collections,
        types: input.types,
        after: None,
        limit: None,
        filter: input.filter,
        ticket: None,
    };
    // Refused now as the stream would refuse it.
    filter(&query, &access)?;
    set_filter(&state, &query).await?;
    if let Some(after) = &input.after {
        let after = position(after, "/after")?;
        let head = state.events.head().await?;
        if after > head {
            return Err(ApiError::new(
                ProblemCode::CursorBeyondHead,
                format!("the cursor {after} is beyond the log's last position ({head}): use a position an event had"),
            ));
        }
    }
    let user = user.map(|axum::Extension(u)| u);
    let holder = crate::tickets::Holder {
        scope: caller.map_or_else(|| "-".to_owned(), |axum::Extension(c)| c.scope),
        key: actor.name().map(str::to_owned),
        user: actor.user().cloned(),
        grants: access.grant_names().unwrap_or_default(),
        rate: user.as_ref().map(|u| (u.rate.quota, u.rate.window.as_secs())),
        expires: user.as_ref().map(|u| crate::store::DateTime::from_system_time(u.expires)),
        anonymous: actor == crate::actor::Actor::Anyone && access.grant_names().is_some(),
        roles: user.as_ref().map(|u| u.roles.clone()).unwrap_or_default(),
        claims: user.as_ref().and_then(|u| serde_json::to_string(&u.claims).ok()),
    };
    let stream = crate::tickets::Stream {
        collections: query.collections,
        types: query.types,
        filter: query.filter,
        after: input.after,
    };
    let pairs: Vec<(&str, String)> =
        [("collections", &stream.collections), ("types", &stream.types), ("filter", &stream.filter)]
            .into_iter()
            .filter_map(|(name, value)| value.clone().map(|v| (name, v)))
            .collect();
    let (ticket, expires_at) = state.tickets.issue(holder, stream).await?;
    let mut url = url::form_urlencoded::Serializer::new(String::new());
    url.extend_pairs(pairs).append_pair("ticket", &ticket);
    let url = format!("/v1/events?{}", url.finish());
    let out = TicketOut { ticket, expires_at: crate::clock::rfc3339(expires_at), url };
    Ok((axum::http::StatusCode::CREATED, axum::Json(out)).into_response())
}
