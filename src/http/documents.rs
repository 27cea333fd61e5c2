//! `/v1/collections/{collection}/documents`: create, read, replace, patch,
//! delete and list user documents.

use crate::actor::Actor;
use crate::http::guard::{Guard, On, Routes};
use crate::http::problems::{Problems, problems};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::auth::Access;
use super::conflicts::{Conflict, Reader, explained};
use super::contract::{Fields, IfMatch, IfNoneMatch, IncFields, MergePatch, NewDocument, SetFields, UnsetFields};
use super::envelope::{CollectionPath, DocumentOut, DocumentPath};
use super::error::ApiError;
use super::extract::{
    ApiPath, ApiQuery, JsonBody, body_bytes, etag, if_match, if_none_match, media_type, parse_json, present,
    unsupported_media,
};
use super::ruled::{self, Acting, Who};
use crate::document::View;
use crate::document::rules::{self, Invalid, Patch};
use crate::documents::{Change, DocError, Written};
use crate::rules::Judged;

pub(crate) fn router() -> Routes {
    Routes::new()
        .guarded(Guard::ByMethod(On::Path), routes!(create_document))
        .guarded(Guard::ByMethod(On::Path), routes!(get_document, replace_document, patch_document, delete_document))
}

/// A `set` / `unset` / `inc` patch. Keys may be dotted paths into nested
/// objects (`"address.city"`); an empty patch changes no field but is a
/// write (the version moves on).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"set": {"status": "paid"}, "inc": {"revision": 1}}))]
pub(crate) struct DocumentPatch {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<SetFields>, nullable = false)]
    pub set: Option<Map<String, Value>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<UnsetFields>, nullable = false)]
    pub unset: Option<Vec<String>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<IncFields>, nullable = false)]
    pub inc: Option<Map<String, Value>>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct WriteQuery {
    /// Schema version the writer declares (default: unchanged, 1 for new documents).
    #[param(minimum = 1, maximum = 9223372036854775807_i64)]
    pub schema_version: Option<i64>,
}

fn schema_version(query: &WriteQuery) -> Result<Option<i64>, ApiError> {
    match query.schema_version {
        Some(v) if v < 1 => Err(Invalid::new("/query/schema_version", "schema_version must be at least 1").into()),
        other => Ok(other),
    }
}

/// Everything but RFC 3986's unreserved characters is escaped in a path segment.
const SEGMENT: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

pub(crate) fn document_location(collection: &str, id: &str) -> String {
    let id = percent_encoding::utf8_percent_encode(id, SEGMENT);
    format!("/v1/collections/{collection}/documents/{id}")
}

fn with_etag(mut response: Response, version: i64) -> Response {
    if let Ok(value) = HeaderValue::from_str(&etag(version)) {
        response.headers_mut().insert(header::ETAG, value);
    }
    response
}

/// The top-level fields a patch touches, each with its pointer in the
/// document.
fn touched(change: &Change) -> Vec<(&str, String)> {
    fn top(parts: &[String]) -> &str {
        parts.first().map_or("", String::as_str)
    }
    match change {
        Change::Patch { patch, .. } => {
            let paths = patch.set.iter().map(|(p, _)| p).chain(&patch.unset).chain(patch.inc.iter().map(|(p, _)| p));
            paths.map(|p| (top(p), format!("/{}", rules::escape(top(p))))).collect()
        }
        Change::Merge { patch, .. } => patch.keys().map(|k| (k.as_str(), format!("/{}", rules::escape(k)))).collect(),
        Change::Replace { .. } | Change::Delete => Vec::new(),
    }
}

/// The answer to a refused write: under rules, what the caller may not
/// read is not found, and a conflict is explained with only what they may
/// read.
async fn refused(
    state: &AppState,
    access: &Access,
    headers: &HeaderMap,
    judged: &Judged,
    (collection, id): (&str, &str),
    err: DocError,
) -> ApiError {
    let err = ruled::hide_tombstone(err, judged);
    let conflict = Conflict::of_write(&err, collection, id);
    match judged {
        Judged::Ruled(judge) => explained(state, Reader::Rules(judge), headers, conflict, err.into()).await,
        Judged::Free => explained(state, Reader::Scopes(access), headers, conflict, err.into()).await,
    }
}

fn written(collection: &str, written: Written, judged: &Judged) -> Response {
    match written {
        Written::Live(mut live) => {
            ruled::written_shown(judged, &mut live);
            let version = live.version;
            with_etag(axum::Json(DocumentOut::new(collection, live)).into_response(), version)
        }
        Written::Deleted { version } => with_etag(StatusCode::NO_CONTENT.into_response(), version),
    }
}

problems!(
    /// What `v1.documents.create` can answer besides its success.
    CreateProblems = Problems::of(&[
        InvalidPath,
        AlreadyExists,
        Locked,
        ValidationFailed,
        InvalidChange,
        SchemaViolation,
        Duplicate,
        DocumentRejected,
        RecordUnreadable,
        RuleDenied,
    ])
    .with_body()
);

/// Create a document
///
/// The body is the document's fields, with an optional string `_id`; without
/// one the gateway assigns a UUIDv7. Creating over a deleted document
/// re-creates it, its version continuing from the tombstone's.
#[utoipa::path(
    post,
    path = "/v1/collections/{collection}/documents",
    operation_id = "v1.documents.create",
    tag = "documents",
    params(CollectionPath, WriteQuery),
    request_body(content = NewDocument, description = "The document's fields, optional `_id`", content_type = "application/json",
        example = json!({"_id": "order-1001", "customer": "ada", "total": 42})),
    responses(CreateProblems,
        (status = 201, description = "Created", body = DocumentOut,
            headers(("Location" = String, description = "URL of the document"), ("ETag" = String, description = "\"<version>\""))),
    )
)]
pub(crate) async fn create_document(
    State(state): State<AppState>,
    actor: Actor,
    Who(who): Who,
    ApiPath(path): ApiPath<CollectionPath>,
    ApiQuery(query): ApiQuery<WriteQuery>,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let collection = path.check()?;
    let sv = schema_version(&query)?.unwrap_or(1);
    let Value::Object(mut fields) = value else {
        return Err(Invalid::new("", "the body must be a JSON object of the document's fields").into());
    };
    let id = match fields.shift_remove("_id") {
        None => None,
        Some(Value::String(id)) => {
            rules::check_id(&id, "/_id")?;
            Some(id)
        }
        Some(_) => return Err(Invalid::new("/_id", "_id must be a string").into()),
    };
    let data = rules::user_data(&fields, "")?;
    let judged = ruled::judged(&state, collection, &who).await?;
    let (data, grant) = match &judged {
        Judged::Free => (data, None),
        Judged::Ruled(judge) => {
            let (data, grant) = judge.create(&who, &data, id.is_some()).map_err(ruled::denied)?;
            (data, Some(judge.header(&grant)))
        }
    };
    let created = state.documents.create(&actor, collection, id, data, sv).await;
    let mut live = created.map_err(|e| ruled::hide_tombstone(e, &judged))?;
    ruled::written_shown(&judged, &mut live);
    let location = document_location(collection, &live.id);
    let version = live.version;
    let mut response = (StatusCode::CREATED, axum::Json(DocumentOut::new(collection, live))).into_response();
    if let Ok(value) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, value);
    }
    Ok(ruled::with_grant(with_etag(response, version), grant))
}

problems!(
    /// What `v1.documents.get` can answer besides its success.
    GetProblems = Problems::of(&[InvalidPath, InvalidHeader, NotFound, Deleted, ValidationFailed, RecordUnreadable])
);

/// Read a document
///
/// Returns the last committed state; never waits for a transaction and
/// never shows uncommitted data. `If-None-Match` with the current ETag
/// answers 304.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}/documents/{id}",
    operation_id = "v1.documents.get",
    tag = "documents",
    params(DocumentPath, ("If-None-Match" = Option<IfNoneMatch>, Header, description = "ETag(s) the client has")),
    responses(GetProblems,
        (status = 200, description = "The document", body = DocumentOut, headers(("ETag" = String, description = "\"<version>\""))),
        (status = 304, description = "Not modified: the client's ETag is current", headers(("ETag" = String, description = "\"<version>\""))),
    )
)]
pub(crate) async fn get_document(
    State(state): State<AppState>,
    Who(who): Who,
    ApiPath(path): ApiPath<DocumentPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (collection, id) = path.check()?;
    // A malformed header is a 400 whatever the document's state.
    let none_match = if_none_match(&headers)?;
    let judged = ruled::judged(&state, collection, &who).await?;
    match state.documents.get(collection, id).await? {
        View::NotFound => Err(DocError::NotFound.into()),
        View::Deleted { version, deleted_at } => {
            Err(ruled::hide_tombstone(DocError::Deleted { version, deleted_at }, &judged).into())
        }
        View::Live(mut live) => {
            let grant = ruled::shown(&judged, &mut live)?;
            let version = live.version;
            if none_match.matches(version) {
                let response = with_etag(StatusCode::NOT_MODIFIED.into_response(), version);
                return Ok(ruled::with_grant(response, grant));
            }
            let response = with_etag(axum::Json(DocumentOut::new(collection, live)).into_response(), version);
            Ok(ruled::with_grant(response, grant))
        }
    }
}

problems!(
    /// What `v1.documents.replace` and `v1.documents.patch` can answer besides their success.
    WriteProblems = Problems::of(&[
        InvalidPath,
        InvalidHeader,
        NotFound,
        VersionConflict,
        Locked,
        Deleted,
        ValidationFailed,
        InvalidChange,
        SchemaViolation,
        Duplicate,
        DocumentRejected,
        RecordUnreadable,
        RuleDenied,
    ])
    .with_body()
);

/// Replace a document
///
/// The body is the new set of fields. With `If-Match: "<version>"` the
/// write happens only at that version (optimistic locking).
#[utoipa::path(
    put,
    path = "/v1/collections/{collection}/documents/{id}",
    operation_id = "v1.documents.replace",
    tag = "documents",
    params(DocumentPath, WriteQuery, ("If-Match" = Option<IfMatch>, Header, description = "\"<version>\" the change was computed from")),
    request_body(content = Fields, description = "The document's new fields", content_type = "application/json",
        example = json!({"customer": "ada", "total": 45})),
    responses(WriteProblems,
        (status = 200, description = "Replaced", body = DocumentOut, headers(("ETag" = String, description = "\"<version>\""))),
    )
)]
pub(crate) async fn replace_document(
    State(state): State<AppState>,
    Acting { who, actor }: Acting,
    access: Access,
    ApiPath(path): ApiPath<DocumentPath>,
    ApiQuery(query): ApiQuery<WriteQuery>,
    headers: HeaderMap,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let (collection, id) = path.check()?;
    let expected = if_match(&headers)?;
    let sv = schema_version(&query)?;
    let Value::Object(mut fields) = value else {
        return Err(Invalid::new("", "the body must be a JSON object of the document's fields").into());
    };
    match fields.shift_remove("_id") {
        None => {}
        Some(Value::String(given)) if given == id => {}
        Some(_) => return Err(Invalid::new("/_id", "_id, when given, must equal the id in the URL").into()),
    }
    let data = rules::user_data(&fields, "")?;
    let judged = ruled::judged(&state, collection, &who).await?;
    let granted = std::sync::Mutex::new(None);
    let guard = ruled::guard(&judged, (false, true), &[], &granted);
    let change = Change::Replace { data, sv };
    let result = match state.documents.change(&actor, collection, id, expected, &change, Some(&guard)).await {
        Ok(result) => result,
        Err(err) => return Err(refused(&state, &access, &headers, &judged, (collection, id), err).await),
    };
    let grant = granted.lock().expect("grant").take();
    Ok(ruled::with_grant(written(collection, result, &judged), grant))
}

/// Patch a document
///
/// `application/json`: `{"set":{...},"unset":[...],"inc":{...}}` (dotted
/// paths reach into nested objects); `application/merge-patch+json`: a JSON
/// Merge Patch (RFC 7396). Without `If-Match`, concurrent patches are
/// applied one after the other, so `inc` is an atomic increment.
#[utoipa::path(
    patch,
    path = "/v1/collections/{collection}/documents/{id}",
    operation_id = "v1.documents.patch",
    tag = "documents",
    params(DocumentPath, WriteQuery, ("If-Match" = Option<IfMatch>, Header, description = "\"<version>\" the change was computed from")),
    request_body(content(
        (DocumentPatch = "application/json", example = json!({"set": {"status": "paid"}, "inc": {"revision": 1}})),
        (MergePatch = "application/merge-patch+json", example = json!({"status": "paid", "draft": null})),
    )),
    responses(WriteProblems,
        (status = 200, description = "Patched", body = DocumentOut, headers(("ETag" = String, description = "\"<version>\""))),
    )
)]
pub(crate) async fn patch_document(
    State(state): State<AppState>,
    Acting { who, actor }: Acting,
    access: Access,
    ApiPath(path): ApiPath<DocumentPath>,
    ApiQuery(query): ApiQuery<WriteQuery>,
    headers: HeaderMap,
    request: Request,
) -> Result<Response, ApiError> {
    let (collection, id) = path.check()?;
    let expected = if_match(&headers)?;
    let sv = schema_version(&query)?;
    let media = media_type(&headers);
    let change = match media.as_deref() {
        Some("application/merge-patch+json") => {
            let bytes = body_bytes(request, &state).await?;
            match parse_json::<Value>(&bytes)? {
                Value::Object(patch) => {
                    // Validate up front so a bad patch is a 422 even when the
                    // document is missing.
                    rules::merge_patch(&Default::default(), &patch, "")?;
                    Change::Merge { patch, sv }
                }
                _ => return Err(Invalid::new("", "a merge patch for a document must be a JSON object").into()),
            }
        }
        Some("application/json") => {
            let bytes = body_bytes(request, &state).await?;
            let patch: DocumentPatch = parse_json(&bytes)?;
            let patch = Patch::parse(patch.set.as_ref(), patch.unset.as_deref(), patch.inc.as_ref(), "")?;
            Change::Patch { patch, sv }
        }
        _ => return Err(unsupported_media("application/json or application/merge-patch+json")),
    };
    let judged = ruled::judged(&state, collection, &who).await?;
    let touched = touched(&change);
    let granted = std::sync::Mutex::new(None);
    let guard = ruled::guard(&judged, (false, false), &touched, &granted);
    let result = match state.documents.change(&actor, collection, id, expected, &change, Some(&guard)).await {
        Ok(result) => result,
        Err(err) => return Err(refused(&state, &access, &headers, &judged, (collection, id), err).await),
    };
    let grant = granted.lock().expect("grant").take();
    Ok(ruled::with_grant(written(collection, result, &judged), grant))
}

problems!(
    /// What `v1.documents.delete` can answer besides its success.
    DeleteProblems = Problems::of(&[
        InvalidPath,
        InvalidHeader,
        NotFound,
        VersionConflict,
        Locked,
        Deleted,
        ValidationFailed,
        RecordUnreadable,
        RuleDenied,
    ])
);

/// Delete a document
///
/// Leaves a tombstone: reads answer 410 with the tombstone's version, and
/// creating the id again continues from that version.
#[utoipa::path(
    delete,
    path = "/v1/collections/{collection}/documents/{id}",
    operation_id = "v1.documents.delete",
    tag = "documents",
    params(DocumentPath, ("If-Match" = Option<IfMatch>, Header, description = "\"<version>\" the delete was decided at")),
    responses(DeleteProblems,
        (status = 204, description = "Deleted", headers(("ETag" = String, description = "\"<version>\" of the tombstone"))),
    )
)]
pub(crate) async fn delete_document(
    State(state): State<AppState>,
    Acting { who, actor }: Acting,
    access: Access,
    ApiPath(path): ApiPath<DocumentPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (collection, id) = path.check()?;
    let expected = if_match(&headers)?;
    let judged = ruled::judged(&state, collection, &who).await?;
    let granted = std::sync::Mutex::new(None);
    let guard = ruled::guard(&judged, (true, false), &[], &granted);
    let result = match state.documents.change(&actor, collection, id, expected, &Change::Delete, Some(&guard)).await {
        Ok(result) => result,
        Err(err) => return Err(refused(&state, &access, &headers, &judged, (collection, id), err).await),
    };
    let grant = granted.lock().expect("grant").take();
    Ok(ruled::with_grant(written(collection, result, &judged), grant))
}
