//! `/v1/collections`: per-collection TTL policies and live counts
//! (docs/design.md §5).

use crate::http::guard::{Guard, On, Routes};
use crate::http::problems::{Problems, problems};
use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Access;
use super::contract::Collection as CollectionName;
use super::envelope::CollectionPath;
use super::error::ApiError;
use super::extract::{ApiPath, ApiQuery, JsonBody, from_body, integer};
use super::paging::{ListQuery, Listed, Page};
use crate::collections::{Collection, Policy};
use crate::document::rules::{Invalid, check_collection};
use crate::keys::Scope;

pub(crate) fn router() -> Routes {
    Routes::new()
        .guarded(Guard::ByMethod(On::Handler), routes!(list_collections))
        .guarded(Guard::ByMethod(On::Path), routes!(get_collection, put_collection))
}

/// The longest maximum age: 100 years.
const MAX_AGE_SECONDS: u64 = 100 * 365 * 24 * 3600;
/// The largest maximum count.
const MAX_COUNT: u64 = 1_000_000_000_000;

/// A collection's settings.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"ttl": {"max_age_seconds": 86400, "max_count": 10000}}))]
pub(crate) struct CollectionIn {
    /// The TTL policy: either limit or both. `null` removes it.
    #[serde(deserialize_with = "nullable")]
    #[schema(required = true)]
    pub ttl: Option<TtlIn>,
}

/// A present member that may be `null`.
fn nullable<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// A TTL policy as set: a limit left out or `null` is not set.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TtlIn {
    /// Documents created longer ago than this many seconds expire.
    #[serde(default, deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 3153600000_i64)]
    pub max_age_seconds: Option<i64>,
    /// Only this many of the newest live documents (by creation) are kept.
    #[serde(default, deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 1000000000000_i64)]
    pub max_count: Option<i64>,
}

/// A collection's TTL policy.
#[derive(Serialize, ToSchema)]
pub(crate) struct TtlOut {
    /// `null`: no maximum age.
    #[schema(minimum = 1, required = true)]
    pub max_age_seconds: Option<u64>,
    /// `null`: no maximum count.
    #[schema(minimum = 1, required = true)]
    pub max_count: Option<u64>,
}

/// A collection: its TTL policy and how many live documents it holds.
#[derive(Serialize, ToSchema)]
pub(crate) struct CollectionOut {
    #[schema(value_type = CollectionName)]
    pub name: String,
    /// `null`: documents never expire.
    #[schema(required = true)]
    pub ttl: Option<TtlOut>,
    /// The number of live documents (tombstones left out), kept as changes
    /// commit, never counted by a scan.
    #[schema(minimum = 0)]
    pub count: u64,
    /// Its per-document rules in force (to an admin of it; absent when it
    /// has none): their version and the names of their grants.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<RulesSummary>,
}

/// A collection's rules in brief (`GET …/rules` has them whole).
#[derive(Serialize, ToSchema)]
pub(crate) struct RulesSummary {
    pub version: i64,
    pub grants: Vec<String>,
}

impl From<Collection> for CollectionOut {
    fn from(c: Collection) -> Self {
        Self {
            name: c.name,
            ttl: c.ttl.map(|p| TtlOut { max_age_seconds: p.max_age_seconds, max_count: p.max_count }),
            count: c.count,
            rules: None,
        }
    }
}

/// `c` as `access` is shown it: with its rules in brief to an admin of it.
async fn shown(state: &AppState, access: &Access, c: Collection) -> Result<CollectionOut, ApiError> {
    let mut out = CollectionOut::from(c);
    if access.allows(Scope::Admin, &out.name) {
        let versions = state.rules.of(&out.name).await?;
        out.rules = versions.current.as_ref().map(|set| RulesSummary {
            version: set.version,
            grants: set.specs.iter().map(|g| g.name.clone()).collect(),
        });
    }
    Ok(out)
}

/// A page of collections.
pub(crate) type CollectionListOut = Page<CollectionOut>;

impl Listed for CollectionOut {
    const PAGE: &'static str = "CollectionListOut";
}

/// The policy a body sets, checked.
fn policy(input: &CollectionIn) -> Result<Option<Policy>, ApiError> {
    let Some(ttl) = &input.ttl else { return Ok(None) };
    let limit = |value: Option<i64>, name: &str, max: u64| match value {
        None => Ok(None),
        Some(v) => match u64::try_from(v).ok().filter(|v| (1..=max).contains(v)) {
            Some(v) => Ok(Some(v)),
            None => Err(Invalid::new(format!("/ttl/{name}"), format!("{name} must be between 1 and {max}, is {v}"))),
        },
    };
    Ok(Some(Policy {
        max_age_seconds: limit(ttl.max_age_seconds, "max_age_seconds", MAX_AGE_SECONDS)?,
        max_count: limit(ttl.max_count, "max_count", MAX_COUNT)?,
    }))
}

problems!(
    /// What `v1.collections.update` can answer besides its success.
    UpdateProblems = Problems::of(&[InvalidPath, ValidationFailed, RuleDenied]).with_body()
);

/// Set a collection's TTL policy
///
/// Replaces the collection's policy: `max_age_seconds` expires documents
/// created longer ago than that; `max_count` keeps only that many of the
/// newest live documents. Either, both, or neither (`"ttl": null`, or both
/// limits `null`) may be set. The TTL sweeper of every instance applies
/// the new policy from its next pass: each expired document leaves a
/// tombstone (its reads answer 410) and a `document.expired` event. A
/// document a transaction holds is skipped until the transaction ends.
#[utoipa::path(
    put,
    path = "/v1/collections/{collection}",
    operation_id = "v1.collections.update",
    tag = "collections",
    params(CollectionPath),
    request_body(content = CollectionIn, content_type = "application/json"),
    responses(UpdateProblems,
        (status = 200, description = "The collection with its new policy", body = CollectionOut),
    )
)]
pub(crate) async fn put_collection(
    State(state): State<AppState>,
    super::ruled::Who(who): super::ruled::Who,
    ApiPath(path): ApiPath<CollectionPath>,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<axum::Json<CollectionOut>, ApiError> {
    check_collection(&path.collection, "/path/collection")?;
    // A TTL policy deletes documents the rules may not let its caller delete.
    super::ruled::not_under_rules(&state, &path.collection, &who, "a TTL policy").await?;
    let input: CollectionIn = from_body(value, &["", "/ttl"])?;
    let policy = policy(&input)?;
    let collection = state.collections.set_policy(&path.collection, policy).await?;
    Ok(axum::Json(collection.into()))
}

problems!(
    /// What `v1.collections.get` can answer besides its success.
    GetProblems = Problems::of(&[InvalidPath, ValidationFailed, RuleDenied])
);

/// Read a collection
///
/// Its TTL policy and its number of live documents. A collection nothing
/// was written to reads as empty, with no policy.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}",
    operation_id = "v1.collections.get",
    tag = "collections",
    params(CollectionPath),
    responses(GetProblems,
        (status = 200, description = "The collection", body = CollectionOut),
    )
)]
pub(crate) async fn get_collection(
    State(state): State<AppState>,
    access: Access,
    super::ruled::Who(who): super::ruled::Who,
    ApiPath(path): ApiPath<CollectionPath>,
) -> Result<axum::Json<CollectionOut>, ApiError> {
    check_collection(&path.collection, "/path/collection")?;
    // Its live count counts documents the rules may hide.
    super::ruled::not_under_rules(&state, &path.collection, &who, "the collection's record").await?;
    Ok(axum::Json(shown(&state, &access, state.collections.get(&path.collection).await?).await?))
}

problems!(
    /// What `v1.collections.list` can answer besides its success.
    ListProblems = Problems::of(&[ValidationFailed])
);

/// List collections
///
/// Every collection that holds or held documents, or has a TTL policy, by
/// name, with its policy and its number of live documents. An API key
/// limited to some collections lists those (a page may then hold fewer
/// than `limit`; follow `next`).
#[utoipa::path(
    get,
    path = "/v1/collections",
    operation_id = "v1.collections.list",
    tag = "collections",
    params(ListQuery),
    responses(ListProblems,
        (status = 200, description = "A page of collections", body = CollectionListOut),
    )
)]
pub(crate) async fn list_collections(
    State(state): State<AppState>,
    access: Access,
    super::ruled::Who(who): super::ruled::Who,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<axum::Json<CollectionListOut>, ApiError> {
    let (limit, after) = query.page()?;
    // A key limited to some collections lists those, and its cursors name
    // only them.
    let (items, next) = match access.collections(Scope::Read) {
        None => state.collections.list(after.as_deref(), limit).await?,
        Some(names) => state.collections.list_among(&names, after.as_deref(), limit).await?,
    };
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        // Left out (the page may be short): live counts of documents the
        // rules may hide.
        if super::ruled::judged_in_any(&state, &who, &[item.name.as_str()]).await? {
            continue;
        }
        out.push(shown(&state, &access, item).await?);
    }
    Ok(axum::Json(Page::new(out, next.as_deref())))
}
