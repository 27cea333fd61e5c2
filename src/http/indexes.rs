//! `/v1/collections/{collection}/indexes`: declared indexes, the resources
//! queries are served by (docs/design.md §7).

use crate::http::guard::{Guard, On, Routes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::contract::Collection as CollectionName;
use super::envelope::CollectionPath;
use super::error::{ApiError, ProblemCode};
use super::extract::{ApiPath, JsonBody, from_body};
use crate::clock::rfc3339;
use crate::document::rules::{Invalid, check_collection, is_collection_name};
use crate::http::problems::{Problems, problems};
use crate::indexes::{Declaration, DeclareError, State as IndexState};

pub(crate) fn router() -> Routes {
    Routes::new()
        .guarded(Guard::ByMethod(On::Path), routes!(list_indexes))
        .guarded(Guard::ByMethod(On::Path), routes!(get_index, put_index, delete_index))
}

#[derive(Deserialize, IntoParams)]
pub(crate) struct IndexPath {
    #[param(value_type = CollectionName)]
    pub collection: String,
    /// The index's name: `^[a-zA-Z][a-zA-Z0-9_-]{0,63}$`.
    #[param(value_type = String, pattern = "^[a-zA-Z][a-zA-Z0-9_-]{0,63}$")]
    pub name: String,
}

impl IndexPath {
    fn check(&self) -> Result<(&str, &str), ApiError> {
        check_collection(&self.collection, "/path/collection")?;
        if !is_collection_name(&self.name) {
            return Err(Invalid::new("/path/name", "an index name must match ^[a-zA-Z][a-zA-Z0-9_-]{0,63}$").into());
        }
        Ok((&self.collection, &self.name))
    }
}

/// An index to declare.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"fields": ["status", "-amount"], "unique": false}))]
pub(crate) struct IndexIn {
    /// Data paths (dotted paths reach nested fields), each ascending, or
    /// descending written `-path`: 1 to 8, each once.
    #[schema(value_type = super::contract::IndexFields)]
    pub fields: Vec<String>,
    /// Whether one value may belong to one document only.
    #[serde(default)]
    pub unique: bool,
}

/// Where a build is.
#[derive(Serialize, ToSchema)]
pub(crate) struct ProgressOut {
    /// `waiting` for transactions in flight when the index was declared (`total`: how many), then `checking` the documents, then `indexing` them.
    #[schema(example = "indexing")]
    pub phase: String,
    #[schema(minimum = 0)]
    pub done: u64,
    /// Live documents when the build began.
    #[schema(minimum = 0)]
    pub total: u64,
}

/// The state of an index.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum IndexStateOut {
    /// Being built; queries do not use it yet.
    Building,
    /// Serving queries.
    Ready,
    /// Its build failed: see `reason` and `documents`.
    Failed,
}

/// A declared index.
#[derive(Serialize, ToSchema)]
pub(crate) struct IndexOut {
    #[schema(value_type = CollectionName)]
    pub collection: String,
    pub name: String,
    pub fields: Vec<String>,
    pub unique: bool,
    pub state: IndexStateOut,
    /// While `building`.
    #[schema(required = true)]
    pub progress: Option<ProgressOut>,
    /// Why the build failed.
    #[schema(required = true)]
    pub reason: Option<String>,
    /// Documents the failed build met that it cannot index (at most 10).
    pub documents: Vec<String>,
    #[schema(format = DateTime)]
    pub created_at: String,
    #[schema(format = DateTime)]
    pub updated_at: String,
}

impl From<Declaration> for IndexOut {
    fn from(d: Declaration) -> Self {
        Self {
            collection: d.coll,
            name: d.name,
            fields: d.fields,
            unique: d.unique,
            state: match d.state {
                IndexState::Ready => IndexStateOut::Ready,
                IndexState::Failed => IndexStateOut::Failed,
                IndexState::Building | IndexState::Dropping => IndexStateOut::Building,
            },
            progress: d.progress.map(|p| ProgressOut { phase: p.phase, done: p.done, total: p.total }),
            reason: d.reason,
            documents: d.documents,
            created_at: rfc3339(d.created_at),
            updated_at: rfc3339(d.updated_at),
        }
    }
}

/// A collection's declared indexes.
#[derive(Serialize, ToSchema)]
pub(crate) struct IndexListOut {
    pub items: Vec<IndexOut>,
}

impl From<DeclareError> for ApiError {
    fn from(err: DeclareError) -> Self {
        match err {
            DeclareError::Invalid(pointer, message) => Invalid::new(pointer, message).into(),
            DeclareError::Exists(detail) => ApiError::new(ProblemCode::IndexExists, detail),
            DeclareError::Limit(detail) => ApiError::new(ProblemCode::IndexLimit, detail),
            DeclareError::Store(err) => ApiError::store(&err),
        }
    }
}

problems!(
    /// What `v1.indexes.put` can answer besides its success.
    PutProblems = Problems::of(&[InvalidPath, ValidationFailed, IndexExists, IndexLimit, RuleDenied]).with_body()
);

/// Declare an index
///
/// Declares an index on data paths, built online: writes go on while it
/// is built, each waiting for one batch of the build at most. Its `state`
/// is `building` (with `progress`) until it is `ready` and serves queries,
/// or `failed` with the `reason`. An indexed path never holds an array or
/// an object: a write that would put one there is refused (422
/// `invalid_change`), and a build that meets one fails naming the
/// documents. Declaring the same index again answers it (200); another
/// definition under the same name is 409 `index_exists`.
#[utoipa::path(
    put,
    path = "/v1/collections/{collection}/indexes/{name}",
    operation_id = "v1.indexes.put",
    tag = "indexes",
    params(IndexPath),
    request_body(content = IndexIn, content_type = "application/json"),
    responses(PutProblems,
        (status = 201, description = "Declared; its build has begun", body = IndexOut),
        (status = 200, description = "Declared already, as it is", body = IndexOut),
    )
)]
pub(crate) async fn put_index(
    State(state): State<AppState>,
    super::ruled::Who(who): super::ruled::Who,
    ApiPath(path): ApiPath<IndexPath>,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let (collection, name) = path.check()?;
    // Indexes serve the rules; a failed build names documents.
    super::ruled::not_under_rules(&state, collection, &who, "managing indexes").await?;
    let input: IndexIn = from_body(value, &[""])?;
    let (declaration, new) = state.indexes.declare(collection, name, input.fields, input.unique).await?;
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, axum::Json(IndexOut::from(declaration))).into_response())
}

problems!(
    /// What `v1.indexes.get` and `v1.indexes.delete` can answer besides their success.
    GetProblems = Problems::of(&[InvalidPath, ValidationFailed, NotFound, RuleDenied])
);

/// Read an index
///
/// Its definition, its state (`building` with `progress`, `ready`, or
/// `failed` with the `reason` and the documents that caused it) and when
/// it was declared and last changed state.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}/indexes/{name}",
    operation_id = "v1.indexes.get",
    tag = "indexes",
    params(IndexPath),
    responses(GetProblems,
        (status = 200, description = "The index", body = IndexOut),
    )
)]
pub(crate) async fn get_index(
    State(state): State<AppState>,
    super::ruled::Who(who): super::ruled::Who,
    ApiPath(path): ApiPath<IndexPath>,
) -> Result<axum::Json<IndexOut>, ApiError> {
    let (collection, name) = path.check()?;
    // Indexes serve the rules; a failed build names documents.
    super::ruled::not_under_rules(&state, collection, &who, "managing indexes").await?;
    match state.indexes.get(collection, name).await? {
        Some(d) => Ok(axum::Json(d.into())),
        None => Err(ApiError::not_found(format!("collection {collection} has no index {name}"))),
    }
}

/// Delete an index
///
/// Queries stop using it at once; its entries are removed in the
/// background. The TTL policy and the other indexes are untouched.
#[utoipa::path(
    delete,
    path = "/v1/collections/{collection}/indexes/{name}",
    operation_id = "v1.indexes.delete",
    tag = "indexes",
    params(IndexPath),
    responses(GetProblems,
        (status = 204, description = "Deleted"),
    )
)]
pub(crate) async fn delete_index(
    State(state): State<AppState>,
    super::ruled::Who(who): super::ruled::Who,
    ApiPath(path): ApiPath<IndexPath>,
) -> Result<StatusCode, ApiError> {
    let (collection, name) = path.check()?;
    // Indexes serve the rules; a failed build names documents.
    super::ruled::not_under_rules(&state, collection, &who, "managing indexes").await?;
    if state.indexes.delete(collection, name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("collection {collection} has no index {name}")))
    }
}

problems!(
    /// What `v1.indexes.list` can answer besides its success.
    ListProblems = Problems::of(&[InvalidPath, ValidationFailed, RuleDenied])
);

/// List a collection's indexes
///
/// Every declared index of the collection, by name, with its state. The
/// id order is implicit and not listed.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}/indexes",
    operation_id = "v1.indexes.list",
    tag = "indexes",
    params(CollectionPath),
    responses(ListProblems,
        (status = 200, description = "The collection's indexes", body = IndexListOut),
    )
)]
pub(crate) async fn list_indexes(
    State(state): State<AppState>,
    super::ruled::Who(who): super::ruled::Who,
    ApiPath(path): ApiPath<CollectionPath>,
) -> Result<axum::Json<IndexListOut>, ApiError> {
    check_collection(&path.collection, "/path/collection")?;
    super::ruled::not_under_rules(&state, &path.collection, &who, "managing indexes").await?;
    let items = state.indexes.list(&path.collection).await?.into_iter().map(IndexOut::from).collect();
    Ok(axum::Json(IndexListOut { items }))
}
