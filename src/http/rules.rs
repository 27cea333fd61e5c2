//! `/v1/collections/{collection}/rules` and `/v1/access/check`: a
//! collection's per-document rules, set by an admin, and the explanation
//! of what they allow a caller (docs/guides/rules.md).

use std::collections::BTreeMap;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Access;
use super::contract::Collection as CollectionName;
use super::envelope::CollectionPath;
use super::error::{ApiError, ProblemCode};
use super::extract::{ApiPath, JsonBody, from_body, if_match};
use super::queries::QueryIn;
use super::ruled::Who;
use crate::clock::rfc3339;
use crate::document::View;
use crate::document::rules::{Invalid, check_collection, check_id};
use crate::http::guard::{Guard, On, Routes};
use crate::http::problems::{Problems, problems};
use crate::keys::Scope;
use crate::rules::{Action, Denied, GrantSpec, Judged, PrincipalIn, SetError, Versions};

pub(crate) fn router() -> Routes {
    Routes::new()
        .guarded(Guard::Admin(On::Path), routes!(get_rules, put_rules, delete_rules))
        .guarded(Guard::Read(On::Handler), routes!(check_access))
        .guarded(Guard::Read(On::Handler), routes!(view_as))
}

/// A collection's rules, as `PUT` takes them.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RulesIn {
    /// The grants, each named once (at most 32). Empty: no user may do
    /// anything on the collection.
    #[schema(max_items = 32)]
    pub grants: Vec<GrantSpec>,
}

/// A collection's rules in force.
#[derive(Serialize, ToSchema)]
pub(crate) struct RulesOut {
    #[schema(value_type = CollectionName)]
    pub collection: String,
    /// Counts every `PUT` and `DELETE`; `If-Match` takes it.
    pub version: i64,
    /// Always `active`: the answer comes once every instance applies them.
    #[schema(example = "active")]
    pub state: &'static str,
    /// The event log position from which they are in force: events after
    /// it are judged by them.
    pub position: u64,
    pub grants: Vec<GrantSpec>,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

fn out(versions: &Versions) -> Option<RulesOut> {
    let set = versions.current.as_ref()?;
    Some(RulesOut {
        collection: set.collection.clone(),
        version: set.version,
        state: "active",
        position: set.at,
        grants: set.specs.clone(),
        updated_at: rfc3339(set.updated_at),
    })
}

impl From<SetError> for ApiError {
    fn from(err: SetError) -> Self {
        match err {
            SetError::Invalid(invalid) => invalid.into(),
            SetError::Version { expected, actual } => {
                let mut e = ApiError::new(
                    ProblemCode::VersionConflict,
                    format!("the rules are at version {actual}, not {expected}"),
                );
                (e.members.expected, e.members.actual) = (Some(expected), Some(actual));
                e
            }
            SetError::Store(err) => ApiError::store(&err),
        }
    }
}

problems!(
    /// What `v1.rules.put` and `v1.rules.delete` can answer besides their success.
    PutProblems = Problems::of(&[InvalidPath, InvalidHeader, ValidationFailed, VersionConflict, NotFound]).with_body()
);

/// Set a collection's rules
///
/// Replaces the collection's rules with these grants, as a new version.
/// Answers once every instance applies them (a few seconds); from then
/// on a user may do on the collection only what a grant allows, and
/// change events after `position` are judged by them. `If-Match:
/// "<version>"` sets them only over that version.
#[utoipa::path(
    put,
    path = "/v1/collections/{collection}/rules",
    operation_id = "v1.rules.put",
    tag = "rules",
    params(CollectionPath, ("If-Match" = Option<super::contract::IfMatch>, Header, description = "\"<version>\" the rules were read at")),
    request_body(content = RulesIn, content_type = "application/json"),
    responses(PutProblems,
        (status = 200, description = "In force on every instance", body = RulesOut),
    )
)]
pub(crate) async fn put_rules(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CollectionPath>,
    headers: HeaderMap,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let collection = path.check()?;
    let expected = if_match(&headers)?;
    let input: RulesIn = from_body(value, &[""])?;
    let at = state.events.head().await?;
    let versions = state.rules.set(collection, Some(input.grants), expected, at).await?;
    tokio::time::sleep(crate::rules::stored::SETTLE).await;
    let body = out(&versions).ok_or_else(|| ApiError::not_found("the rules were removed meanwhile"))?;
    Ok(axum::Json(body).into_response())
}

problems!(
    /// What `v1.rules.get` can answer besides its success.
    GetProblems = Problems::of(&[InvalidPath, ValidationFailed, NotFound])
);

/// Read a collection's rules
///
/// The grants in force, their version and the log position they took
/// effect at; 404 when the collection has none.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}/rules",
    operation_id = "v1.rules.get",
    tag = "rules",
    params(CollectionPath),
    responses(GetProblems,
        (status = 200, description = "The rules in force", body = RulesOut),
    )
)]
pub(crate) async fn get_rules(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CollectionPath>,
) -> Result<axum::Json<RulesOut>, ApiError> {
    let collection = path.check()?;
    let versions = state.rules.of(collection).await?;
    out(&versions).map(axum::Json).ok_or_else(|| ApiError::not_found(format!("collection {collection} has no rules")))
}

/// Remove a collection's rules
///
/// Users are judged by their scopes alone again, once every instance
/// applies the removal (the answer waits for it).
#[utoipa::path(
    delete,
    path = "/v1/collections/{collection}/rules",
    operation_id = "v1.rules.delete",
    tag = "rules",
    params(CollectionPath, ("If-Match" = Option<super::contract::IfMatch>, Header, description = "\"<version>\" the rules were read at")),
    responses(PutProblems,
        (status = 204, description = "Removed on every instance"),
    )
)]
pub(crate) async fn delete_rules(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CollectionPath>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let collection = path.check()?;
    let expected = if_match(&headers)?;
    if state.rules.of(collection).await?.current.is_none() {
        return Err(ApiError::not_found(format!("collection {collection} has no rules")));
    }
    let at = state.events.head().await?;
    state.rules.set(collection, None, expected, at).await?;
    tokio::time::sleep(crate::rules::stored::SETTLE).await;
    Ok(StatusCode::NO_CONTENT)
}

/// An access check: whether `principal` may do `action` on a collection
/// (a document of it, by `id`; or, for `create`, this `document`).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"principal": {"sub": "ada", "roles": ["customer"]}, "collection": "orders", "action": "read", "id": "order-1"}))]
pub(crate) struct CheckIn {
    #[serde(default)]
    pub principal: Option<PrincipalIn>,
    #[schema(value_type = CollectionName)]
    pub collection: String,
    pub action: Action,
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub document: Option<Map<String, Value>>,
}

/// One grant's part in the answer.
#[derive(Serialize, ToSchema)]
pub(crate) struct GrantCheck {
    pub name: String,
    /// Whether it applies to the principal (roles, keys, `when`).
    pub applies: bool,
    /// Whether it allows the request.
    pub allows: bool,
    /// Why not, when it does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// The answer of an access check.
#[derive(Serialize, ToSchema)]
pub(crate) struct CheckOut {
    pub allowed: bool,
    /// Whether the collection's rules judge the principal (`false`: its
    /// scopes alone decide).
    pub ruled: bool,
    /// `<collection>/<grant>@<version>`, when a grant allows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// Why not, when it is not allowed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    pub grants: Vec<GrantCheck>,
}

problems!(
    /// What `v1.access.check` can answer besides its success.
    CheckProblems = Problems::of(&[ValidationFailed]).with_body()
);

/// Explain what the rules allow
///
/// Whether a principal (absent: the caller itself; another one: admins
/// only) may do an action on a collection, or on one of its documents:
/// which grant allows it, or for each grant why not. Nothing is written.
#[utoipa::path(
    post,
    path = "/v1/access/check",
    operation_id = "v1.access.check",
    tag = "rules",
    request_body(content = CheckIn, content_type = "application/json"),
    responses(CheckProblems,
        (status = 200, description = "The explanation", body = CheckOut),
    )
)]
pub(crate) async fn check_access(
    State(state): State<AppState>,
    access: Access,
    Who(caller): Who,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<axum::Json<CheckOut>, ApiError> {
    let input: CheckIn = from_body(value, &[""])?;
    check_collection(&input.collection, "/collection")?;
    let by_admin = input.principal.is_some();
    let who = match input.principal {
        None => {
            access.check(Scope::Read, &input.collection)?;
            caller
        }
        Some(p) => {
            access.check(Scope::Admin, &input.collection)?;
            p.principal().map_err(|why| Invalid::new("/principal", why))?
        }
    };
    let collection = input.collection.as_str();
    let versions = state.rules.of(collection).await?;
    let judged = Judged::of(versions.current.as_deref(), &who, &state.rules.now_string());
    let Judged::Ruled(judge) = judged else {
        return Ok(axum::Json(CheckOut { allowed: true, ruled: false, grant: None, detail: None, grants: Vec::new() }));
    };
    let document = match (&input.id, input.action) {
        (Some(id), _) => {
            check_id(id, "/id")?;
            match state.documents.get(collection, id).await? {
                // A caller asking about itself learns nothing of a document
                // it may not read: as if there were none.
                View::Live(live) if by_admin || judge.sees(Action::Read, &live.data).is_some() => Some(live.data),
                _ => None,
            }
        }
        _ => None,
    };
    let mut grants: Vec<GrantCheck> = judge
        .not_applied
        .iter()
        .map(|n| GrantCheck { name: n.grant.clone(), applies: false, allows: false, why: Some(n.why.clone()) })
        .collect();
    let action = input.action;
    let mut per: BTreeMap<String, (bool, Option<String>)> = BTreeMap::new();
    for a in &judge.applied {
        let g = &a.grant;
        let why = if !g.allows(action) {
            Some(format!("it does not allow {}", action.as_str()))
        } else if let Some(doc) = &document {
            (!a.matches(doc)).then(|| "the document does not match it".to_owned())
        } else if input.id.is_some() {
            Some("there is no such document, or the principal may not read it".to_owned())
        } else {
            None
        };
        per.insert(g.name.clone(), (why.is_none(), why));
    }
    let outcome: Result<String, Denied> = match (action, &document, &input.document) {
        (Action::Create, _, Some(doc)) => {
            let data = crate::document::rules::user_data(doc, "/document")?;
            judge.create(&who, &data, false).map(|(_, g)| g)
        }
        (Action::Update, Some(doc), _) => judge.update(doc, doc),
        (Action::Delete, Some(doc), _) => judge.delete(doc),
        (Action::Read | Action::Stream | Action::Count, Some(doc), _) => {
            judge.sees(action, doc).map(|s| s.grant).ok_or(Denied::Hidden)
        }
        (_, None, _) if input.id.is_some() => Err(Denied::Hidden),
        _ => per.iter().find(|(_, (ok, _))| *ok).map(|(g, _)| g.clone()).ok_or(Denied::Forbidden {
            detail: format!("no grant of the principal's allows {}", action.as_str()),
            pointer: None,
        }),
    };
    for a in &judge.applied {
        let (ok, why) = per.remove(&a.grant.name).unwrap_or((false, None));
        grants.push(GrantCheck { name: a.grant.name.clone(), applies: true, allows: ok, why });
    }
    let (allowed, grant, detail) = match outcome {
        Ok(g) => (true, Some(judge.header(&g)), None),
        Err(Denied::Hidden) => (false, None, Some("the principal may not read the document (or there is none)".into())),
        Err(Denied::Forbidden { detail, .. }) => (false, None, Some(detail)),
    };
    Ok(axum::Json(CheckOut { allowed, ruled: true, grant, detail, grants }))
}

/// A read of a collection as a principal sees it, by an admin.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"principal": {"sub": "ada", "roles": ["customer"]}, "collection": "orders", "query": {"limit": 20}}))]
pub(crate) struct ViewIn {
    pub principal: PrincipalIn,
    #[schema(value_type = CollectionName)]
    pub collection: String,
    /// The query, as `POST …/query` takes it (absent: the first page in id
    /// order).
    #[serde(default)]
    pub query: Option<QueryIn>,
}

problems!(
    /// What `v1.access.view` can answer besides its success.
    ViewProblems =
        Problems::of(&[ValidationFailed, InvalidFilter, IndexRequired, RecordUnreadable, RuleDenied]).with_body()
);

/// Read a collection as a principal sees it
///
/// A page of the collection's documents exactly as the principal (a user
/// by `sub`, `roles` and `claims`, a key by name, or anonymous) would read
/// it under the collection's rules: only the documents a grant lets it
/// read, only the fields it may read, `Txgate-Grant` naming the grant.
/// Admins on the collection only. Each view is recorded in the event log
/// as an `access.viewed_as` event (sent to callers with `admin` on the
/// collection) naming the principal and who viewed. A principal the rules
/// do not judge (no rules, or a key no grant names) is 422: its scopes
/// decide what it reads.
#[utoipa::path(
    post,
    path = "/v1/access/view",
    operation_id = "v1.access.view",
    tag = "rules",
    request_body(content = ViewIn, content_type = "application/json"),
    responses(ViewProblems,
        (status = 200, description = "A page of documents as the principal reads it", body = super::queries::QueryPageOut),
    )
)]
pub(crate) async fn view_as(
    State(state): State<AppState>,
    access: Access,
    actor: crate::actor::Actor,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let principal = value.get("principal").and_then(Value::as_object).cloned().unwrap_or_default();
    let input: ViewIn = from_body(value, &[""])?;
    check_collection(&input.collection, "/collection")?;
    access.check(Scope::Admin, &input.collection)?;
    let who = input.principal.principal().map_err(|why| Invalid::new("/principal", why))?;
    let collection = input.collection.as_str();
    let versions = state.rules.of(collection).await?;
    if let Judged::Free = Judged::of(versions.current.as_deref(), &who, &state.rules.now_string()) {
        let why = format!("the rules of {collection:?} do not judge this principal: its scopes decide what it reads");
        return Err(Invalid::new("/principal", why).into());
    }
    let page = super::queries::page_as(&state, collection, input.query.unwrap_or_default(), &who).await?;
    // Recorded before it is answered: a view nobody can find is not given.
    let at = state.txns.config().clock.now();
    let principal = crate::store::convert::object_to_document(&principal);
    let mut record = crate::events::model::viewed_as_event(collection, actor.name(), actor.user(), at, principal);
    record.insert("logged_at", at);
    let store = state.store.as_ref();
    store.write(crate::events::EVENTS, crate::store::Write::Append(record), crate::store::Durability::Synced).await?;
    tracing::info!(collection, by = actor.name().unwrap_or("-"), "an admin read a collection as another principal");
    Ok(page)
}
