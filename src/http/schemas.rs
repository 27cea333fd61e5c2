//! `/v1/collections/{collection}/schemas` and `…/schema`: a collection's
//! JSON Schemas, one per document `schema_version`, declared by an admin
//! and readable by any reader of the collection; how its writes meet them;
//! and the documents that do not satisfy them (docs/guides/validation.md).

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::contract::Collection as CollectionName;
use super::envelope::CollectionPath;
use super::error::{ApiError, ProblemCode};
use super::extract::{ApiPath, JsonBody, etag, from_body, if_match};
use crate::clock::rfc3339;
use crate::document::rules::{Invalid, check_collection};
use crate::http::guard::{Guard, On, Routes};
use crate::http::problems::{Problems, problems};
use crate::schema_checks::{self as violations, Found, PassState};
use crate::schemas::{Declared, Known, SetError, State as DeclState, Validation};

pub(crate) fn router() -> Routes {
    Routes::new()
        .guarded(Guard::ReadOrAdmin(On::Path), routes!(list_schemas))
        .guarded(Guard::ReadOrAdmin(On::Path), routes!(get_schema, put_schema, delete_schema))
        .guarded(Guard::ReadOrAdmin(On::Path), routes!(get_settings, put_settings))
        .guarded(Guard::Admin(On::Path), routes!(get_violations, check_again))
}

#[derive(Deserialize, IntoParams)]
pub(crate) struct SchemaPath {
    #[param(value_type = CollectionName)]
    pub collection: String,
    /// The document `schema_version` the schema is for.
    #[param(minimum = 1, maximum = 9223372036854775807_i64)]
    pub version: i64,
}

impl SchemaPath {
    fn check(&self) -> Result<(&str, i64), ApiError> {
        check_collection(&self.collection, "/path/collection")?;
        if self.version < 1 {
            return Err(Invalid::new("/path/version", "a schema version is at least 1").into());
        }
        Ok((&self.collection, self.version))
    }
}

/// A declared schema.
#[derive(Serialize, ToSchema)]
pub(crate) struct SchemaOut {
    #[schema(value_type = CollectionName)]
    pub collection: String,
    /// The document `schema_version` it checks.
    pub version: i64,
    /// Counts the declarations of this version; `If-Match` takes it.
    pub revision: i64,
    /// `pending` until every instance applies it, then `active`.
    pub state: DeclState,
    #[schema(format = DateTime)]
    pub declared_at: String,
    /// When it is (or was) `active` at the latest.
    #[schema(format = DateTime)]
    pub active_at: String,
    /// The JSON Schema (2020-12) as declared.
    #[schema(value_type = super::contract::JsonSchema)]
    pub schema: Value,
}

fn schema_out(state: &AppState, collection: &str, d: &Declared) -> SchemaOut {
    SchemaOut {
        collection: collection.to_owned(),
        version: d.version,
        revision: d.revision,
        state: state.documents.schemas().state(d.declared_at),
        declared_at: rfc3339(d.declared_at),
        active_at: rfc3339(crate::schemas::active_at(d.declared_at)),
        schema: (*d.schema).clone(),
    }
}

/// A collection's schemas.
#[derive(Serialize, ToSchema)]
pub(crate) struct SchemasOut {
    #[schema(value_type = CollectionName)]
    pub collection: String,
    pub validation: Validation,
    /// Each declared version, by version.
    pub items: Vec<SchemaOut>,
}

/// How a collection's writes meet its schemas.
#[derive(Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettingsIn {
    /// `strict` (the default), `warn` or `moderate`.
    pub validation: Validation,
}

/// How a collection's writes meet its schemas, and its versions.
#[derive(Serialize, ToSchema)]
pub(crate) struct SettingsOut {
    #[schema(value_type = CollectionName)]
    pub collection: String,
    pub validation: Validation,
    /// `pending` until every instance applies the setting, then `active`.
    pub state: DeclState,
    /// The versions that have a schema.
    pub versions: Vec<i64>,
}

fn settings_out(state: &AppState, collection: &str, known: &Known) -> SettingsOut {
    let at = known.validation_at.unwrap_or_else(|| crate::store::DateTime::from_millis(0));
    SettingsOut {
        collection: collection.to_owned(),
        validation: known.validation,
        state: state.documents.schemas().state(at),
        versions: known.versions.keys().copied().collect(),
    }
}

impl From<SetError> for ApiError {
    fn from(err: SetError) -> Self {
        match err {
            SetError::Invalid(invalid) => invalid.into(),
            SetError::Revision { version, expected, actual } => {
                let mut e = ApiError::new(
                    ProblemCode::VersionConflict,
                    format!("schema version {version} is at revision {actual}, not {expected}"),
                );
                (e.members.expected, e.members.actual) = (Some(expected), Some(actual));
                e
            }
            SetError::Limit => ApiError::new(ProblemCode::SchemaLimit, err.to_string()),
            SetError::NotFound(_) => ApiError::not_found(err.to_string()),
            SetError::Store(err) => ApiError::store(&err),
        }
    }
}

problems!(
    /// What `v1.schemas.list` and `v1.schemas.get` can answer besides their success.
    GetProblems = Problems::of(&[InvalidPath, ValidationFailed, NotFound, RecordUnreadable])
);

/// List a collection's schemas
///
/// Every declared version, with its state, and how writes meet them.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}/schemas",
    operation_id = "v1.schemas.list",
    tag = "schemas",
    params(CollectionPath),
    responses(GetProblems,
        (status = 200, description = "The collection's schemas", body = SchemasOut),
    )
)]
pub(crate) async fn list_schemas(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CollectionPath>,
) -> Result<axum::Json<SchemasOut>, ApiError> {
    let collection = path.check()?;
    let known = state.documents.schemas().of(collection).await?;
    let items = known.versions.values().map(|d| schema_out(&state, collection, d)).collect();
    Ok(axum::Json(SchemasOut { collection: collection.to_owned(), validation: known.validation, items }))
}

/// Read a schema
///
/// The schema declared for one `schema_version`, its revision and state.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}/schemas/{version}",
    operation_id = "v1.schemas.get",
    tag = "schemas",
    params(SchemaPath),
    responses(GetProblems,
        (status = 200, description = "The schema", body = SchemaOut, headers(("ETag" = String, description = "\"<revision>\""))),
    )
)]
pub(crate) async fn get_schema(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<SchemaPath>,
) -> Result<Response, ApiError> {
    let (collection, version) = path.check()?;
    let known = state.documents.schemas().of(collection).await?;
    let declared = known
        .versions
        .get(&version)
        .ok_or_else(|| ApiError::not_found(format!("{collection} declares no schema version {version}")))?;
    Ok(with_etag(axum::Json(schema_out(&state, collection, declared)).into_response(), declared.revision))
}

fn with_etag(mut response: Response, revision: i64) -> Response {
    if let Ok(value) = HeaderValue::from_str(&etag(revision)) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

problems!(
    /// What `v1.schemas.put` can answer besides its success.
    PutProblems = Problems::of(&[
        InvalidPath,
        InvalidHeader,
        ValidationFailed,
        VersionConflict,
        SchemaLimit,
        NotFound,
        RecordUnreadable,
    ])
    .with_body()
);

/// Declare a schema
///
/// The body is a JSON Schema (2020-12) for the collection's documents of
/// one `schema_version`: every write that produces a document of that
/// version is checked against it once it is `active` (answered `pending`:
/// every instance applies it within a few seconds). Declaring a version
/// again makes a new revision; `If-Match: "<revision>"` declares only over
/// that one (`"0"`: only if none is declared). Documents already stored
/// are not checked: see `…/schema/violations`.
#[utoipa::path(
    put,
    path = "/v1/collections/{collection}/schemas/{version}",
    operation_id = "v1.schemas.put",
    tag = "schemas",
    params(SchemaPath, ("If-Match" = Option<super::contract::IfMatch>, Header, description = "\"<revision>\" the schema was read at")),
    request_body(content = super::contract::JsonSchema, description = "A JSON Schema (2020-12), at most 64 KiB", content_type = "application/json",
        example = json!({"type": "object", "required": ["customer", "total"], "properties": {"customer": {"type": "string", "minLength": 1}, "total": {"type": "number", "minimum": 0}}})),
    responses(PutProblems,
        (status = 202, description = "Declared: `pending` until every instance applies it", body = SchemaOut,
            headers(("ETag" = String, description = "\"<revision>\""))),
    )
)]
pub(crate) async fn put_schema(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<SchemaPath>,
    headers: HeaderMap,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let (collection, version) = path.check()?;
    let expected = if_match(&headers)?;
    let declared = state.documents.schemas().declare(collection, version, &value, expected).await?;
    tracing::info!(collection, version, revision = declared.revision, "schema declared");
    let body = axum::Json(schema_out(&state, collection, &declared));
    Ok(with_etag((StatusCode::ACCEPTED, body).into_response(), declared.revision))
}

problems!(
    /// What `v1.schemas.delete` can answer besides its success.
    DeleteProblems = Problems::of(&[InvalidPath, ValidationFailed, NotFound, RecordUnreadable])
);

/// Remove a schema
///
/// Documents of that version are no longer checked against it; while the
/// collection has other schemas, writes of that version are refused.
#[utoipa::path(
    delete,
    path = "/v1/collections/{collection}/schemas/{version}",
    operation_id = "v1.schemas.delete",
    tag = "schemas",
    params(SchemaPath),
    responses(DeleteProblems,
        (status = 204, description = "Removed (in force on every instance within a few seconds)"),
    )
)]
pub(crate) async fn delete_schema(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<SchemaPath>,
) -> Result<StatusCode, ApiError> {
    let (collection, version) = path.check()?;
    state.documents.schemas().remove(collection, version).await?;
    tracing::info!(collection, version, "schema removed");
    Ok(StatusCode::NO_CONTENT)
}

/// Read how a collection's writes meet its schemas
///
/// Its `validation` (`strict` when never set), the setting's state, and
/// the versions that have a schema.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}/schema",
    operation_id = "v1.schemas.settings",
    tag = "schemas",
    params(CollectionPath),
    responses(GetProblems,
        (status = 200, description = "The collection's validation", body = SettingsOut),
    )
)]
pub(crate) async fn get_settings(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CollectionPath>,
) -> Result<axum::Json<SettingsOut>, ApiError> {
    let collection = path.check()?;
    let known = state.documents.schemas().of(collection).await?;
    Ok(axum::Json(settings_out(&state, collection, &known)))
}

problems!(
    /// What `v1.schemas.configure` can answer besides its success.
    SettingsProblems = Problems::of(&[InvalidPath, ValidationFailed, RecordUnreadable]).with_body()
);

/// Choose how a collection's writes meet its schemas
///
/// `strict`: every write must produce a valid document; `warn`: invalid
/// documents are written, counted and logged; `moderate`: as `strict`,
/// except that writes to a document that was invalid already are not
/// checked. `pending` until every instance applies it.
#[utoipa::path(
    put,
    path = "/v1/collections/{collection}/schema",
    operation_id = "v1.schemas.configure",
    tag = "schemas",
    params(CollectionPath),
    request_body(content = SettingsIn, content_type = "application/json", example = json!({"validation": "moderate"})),
    responses(SettingsProblems,
        (status = 202, description = "Set: `pending` until every instance applies it", body = SettingsOut),
    )
)]
pub(crate) async fn put_settings(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CollectionPath>,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let collection = path.check()?;
    let input: SettingsIn = from_body(value, &[""])?;
    let known = state.documents.schemas().set_validation(collection, input.validation).await?;
    tracing::info!(collection, validation = ?input.validation, "schema validation set");
    Ok((StatusCode::ACCEPTED, axum::Json(settings_out(&state, collection, &known))).into_response())
}

/// The documents that do not satisfy a collection's schemas.
#[derive(Serialize, ToSchema)]
pub(crate) struct ViolationsOut {
    #[schema(value_type = CollectionName)]
    pub collection: String,
    /// `waiting` (the schemas changed, no pass has started), `running`
    /// or `done`.
    pub state: PassState,
    /// Documents checked so far.
    pub scanned: i64,
    /// Documents found invalid so far.
    pub invalid: i64,
    /// The first 100 found, each with its first 10 errors.
    pub items: Vec<Found>,
    /// `true` when more were found than `items` holds.
    pub truncated: bool,
    #[schema(format = DateTime)]
    pub started_at: Option<String>,
    #[schema(format = DateTime)]
    pub finished_at: Option<String>,
}

problems!(
    /// What `v1.schemas.violations` can answer besides its success.
    ViolationsProblems = Problems::of(&[InvalidPath, ValidationFailed, RecordUnreadable])
);

/// List the documents that do not satisfy the schemas
///
/// Found by a background pass over the collection, run after each change
/// of its schemas (or when asked again): its state, progress and the
/// first 100 documents it found, each with the errors of the schema of
/// its version.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}/schema/violations",
    operation_id = "v1.schemas.violations",
    tag = "schemas",
    params(CollectionPath),
    responses(ViolationsProblems,
        (status = 200, description = "The pass and what it found", body = ViolationsOut),
    )
)]
pub(crate) async fn get_violations(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CollectionPath>,
) -> Result<axum::Json<ViolationsOut>, ApiError> {
    let collection = path.check()?;
    let known = state.documents.schemas().of(collection).await?;
    let check = violations::read(&state.store, collection).await?;
    let mut out = ViolationsOut {
        collection: collection.to_owned(),
        state: if known.any() { PassState::Waiting } else { PassState::Done },
        scanned: 0,
        invalid: 0,
        items: Vec::new(),
        truncated: false,
        started_at: None,
        finished_at: None,
    };
    if let Some(check) = check.filter(|c| c.seq == known.schemas_seq && known.any()) {
        out.state = check.state;
        (out.scanned, out.invalid) = (check.scanned, check.invalid);
        out.truncated = check.invalid > i64::try_from(check.found.len()).unwrap_or(i64::MAX);
        out.items = check.found;
        out.started_at = Some(rfc3339(check.started_at));
        out.finished_at = check.finished_at.map(rfc3339);
    }
    Ok(axum::Json(out))
}

/// Look for violations again
///
/// Starts a new pass over the collection (what the last one found is
/// forgotten): documents written since under `warn` or `moderate` are
/// found too.
#[utoipa::path(
    post,
    path = "/v1/collections/{collection}/schema/violations",
    operation_id = "v1.schemas.check",
    tag = "schemas",
    params(CollectionPath),
    responses(ViolationsProblems,
        (status = 202, description = "A new pass is waiting to start"),
    )
)]
pub(crate) async fn check_again(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<CollectionPath>,
) -> Result<StatusCode, ApiError> {
    let collection = path.check()?;
    violations::again(&state.store, collection).await?;
    Ok(StatusCode::ACCEPTED)
}
