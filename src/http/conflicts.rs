//! Conflicts that explain themselves (docs/design.md §7): a
//! `version_conflict` answer gains `current`, `changes` and
//! `changes_truncated`; `POST /v1/collections/{collection}/documents/{id}/merge`
//! answers a three-way merge and writes nothing.

use crate::http::guard::{Guard, On, Routes};
use axum::extract::State;
use axum::http::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Access;
use super::contract::{AnyValue, Fields};
use super::envelope::{DocumentOut, DocumentPath};
use super::error::{ApiError, ProblemCode};
use super::extract::{ApiPath, JsonBody, from_body};
use crate::conflicts::{Change, MergeConflict, MergeError};
use crate::document::rules::{self, Invalid, MAX_DATA_BYTES};
use crate::documents::DocError;
use crate::events::model::EventType;
use crate::http::problems::{Problems, problems};
use crate::keys::Scope;
use crate::txn::commit::TxnError;
use crate::txn::record::FailureCode;

pub(crate) fn router() -> Routes {
    // A merge writes nothing: `read` is enough.
    Routes::new().guarded(Guard::Read(On::Path), routes!(merge_document))
}

/// Whether the request says `Prefer: return=minimal` (RFC 7240).
fn minimal(headers: &HeaderMap) -> bool {
    // preference = token [ BWS "=" BWS word ] *( OWS ";" ... ); a word may
    // be a quoted string.
    headers.get_all("prefer").iter().filter_map(|v| v.to_str().ok()).any(|v| {
        v.split(',').filter_map(|p| p.split(';').next()).any(|p| {
            let Some((name, value)) = p.split_once('=') else { return false };
            let value = value.trim();
            let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
            name.trim().eq_ignore_ascii_case("return") && value.eq_ignore_ascii_case("minimal")
        })
    })
}

/// A version conflict, as the typed error of the service that met it
/// says: the document, and the version the writer expected.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Conflict {
    collection: String,
    id: String,
    /// 0 where the writer expected none (a write that met the document
    /// changed meanwhile; an insert over a tombstone expected a version).
    expected: i64,
}

impl Conflict {
    /// The conflict of a single write on `collection`/`id`, if `err` is one.
    pub(crate) fn of_write(err: &DocError, collection: &str, id: &str) -> Option<Self> {
        match err {
            DocError::VersionConflict { expected, .. } => {
                Some(Self { collection: collection.to_owned(), id: id.to_owned(), expected: *expected })
            }
            _ => None,
        }
    }

    /// The conflict a transaction was aborted for, if it was, on the member
    /// it names.
    /// The collection of the document in conflict.
    pub(crate) fn collection(&self) -> &str {
        &self.collection
    }

    pub(crate) fn of_transaction(err: &TxnError) -> Option<Self> {
        match err {
            TxnError::Aborted { failure, .. } if failure.code == FailureCode::VersionConflict => Some(Self {
                collection: failure.collection.clone()?,
                id: failure.id.clone()?,
                expected: failure.expected.unwrap_or(0),
            }),
            _ => None,
        }
    }
}

/// Who reads a conflict's explanation: a caller judged by its scopes, or
/// one a collection's rules judge.
pub(crate) enum Reader<'a> {
    Scopes(&'a Access),
    Rules(&'a crate::rules::eval::Judge),
}

/// `err` as answered: for a `conflict`, with `current`, `changes` and
/// `changes_truncated` added, unless the request prefers a minimal
/// answer. A caller judged by its scopes is told it if it may read the
/// collection; one the rules judge is told only what they may read
/// (`current` trimmed to those fields, each change's paths too), and a
/// document they may no longer read (or that is gone) is not found.
/// Anything else as it is.
pub(crate) async fn explained(
    state: &AppState,
    reader: Reader<'_>,
    headers: &HeaderMap,
    conflict: Option<Conflict>,
    mut err: ApiError,
) -> ApiError {
    let Some(Conflict { collection: coll, id, expected }) = conflict else { return err };
    let judge = match reader {
        Reader::Scopes(access) if !access.allows(Scope::Read, &coll) => return err,
        Reader::Scopes(_) => None,
        Reader::Rules(judge) => Some(judge),
    };
    if minimal(headers) {
        return err;
    }
    let explained = match state.conflicts.explain(&coll, &id, expected, MAX_DATA_BYTES).await {
        Ok(explained) => explained,
        Err(e) => {
            tracing::warn!(collection = %coll, id = %id, error = %e, "a version conflict is answered without its explanation");
            return err;
        }
    };
    let mut current = explained.current;
    // The fields the caller may read (`None`: all of them).
    let mut readable = None;
    if let Some(judge) = judge {
        let Some(live) = current.as_mut() else { return DocError::NotFound.into() };
        let Some(seen) = judge.sees(crate::rules::Action::Read, &live.data) else {
            return DocError::NotFound.into();
        };
        crate::rules::eval::project(&mut live.data, seen.fields.as_ref());
        readable = seen.fields;
    }
    let keep = |paths: Option<Vec<String>>| {
        let Some(fields) = &readable else { return paths };
        paths.map(|p| p.into_iter().filter(|path| fields.contains(path.split('.').next().unwrap_or(path))).collect())
    };
    let changes: Vec<ChangeOut> = explained
        .changes
        .into_iter()
        .map(ChangeOut::from)
        .map(|c| ChangeOut { added: keep(c.added), removed: keep(c.removed), changed: keep(c.changed), ..c })
        .collect();
    let current = current.map(|live| DocumentOut::new(&coll, live));
    err.members.current = Some(serde_json::to_value(current).expect("a document serializes"));
    err.members.changes = Some(serde_json::to_value(changes).expect("changes serialize"));
    err.members.changes_truncated = Some(explained.truncated);
    err
}

/// One change after the version a `version_conflict` expected.
#[derive(Serialize, ToSchema)]
pub(crate) struct ChangeOut {
    /// The version the change made.
    pub version: i64,
    /// `document.created`, `document.updated`, `document.deleted` or
    /// `document.expired`.
    #[serde(rename = "type")]
    pub kind: EventType,
    /// When it was committed (RFC 3339).
    #[schema(format = DateTime)]
    pub at: String,
    /// The transaction that made it; null for a single-document write.
    pub transaction: Option<String>,
    /// The name of the API key that made it; null without API keys, for an
    /// expiry, and for changes logged before keys had names.
    pub key: Option<String>,
    /// The user who made it, when a user's token did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor: Option<crate::actor::UserId>,
    /// Field paths (dotted) it added; null (as `removed` and `changed`)
    /// when the log no longer holds the version before it.
    pub added: Option<Vec<String>>,
    pub removed: Option<Vec<String>>,
    pub changed: Option<Vec<String>>,
}

impl From<Change> for ChangeOut {
    fn from(c: Change) -> Self {
        let (added, removed, changed) = match c.paths {
            Some(p) => (Some(p.added), Some(p.removed), Some(p.changed)),
            None => (None, None, None),
        };
        Self {
            version: c.version,
            kind: c.kind,
            at: c.at,
            transaction: c.transaction,
            key: c.key,
            actor: c.actor,
            added,
            removed,
            changed,
        }
    }
}

/// A path both sides of a merge changed to different values, with the
/// three values; a side where the field is absent leaves its member out.
#[derive(Serialize, ToSchema)]
pub(crate) struct MergeConflictOut {
    /// The dotted path.
    pub path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<AnyValue>)]
    pub base: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<AnyValue>)]
    pub mine: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<AnyValue>)]
    pub theirs: Option<Value>,
}

impl From<MergeConflict> for MergeConflictOut {
    fn from(c: MergeConflict) -> Self {
        Self { path: c.path, base: c.base, mine: c.mine, theirs: c.theirs }
    }
}

/// A client's change to merge.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"base_version": 3, "mine": {"status": "paid", "total": 45}}))]
pub(crate) struct MergeIn {
    /// The version the client's change started from (0: the document did
    /// not exist).
    #[serde(deserialize_with = "super::extract::required_integer")]
    #[schema(minimum = 0)]
    pub base_version: i64,
    /// The document's data as the client changed it.
    #[schema(value_type = Fields)]
    pub mine: Map<String, Value>,
}

/// A three-way merge.
#[derive(Serialize, ToSchema)]
pub(crate) struct MergeOut {
    pub base_version: i64,
    /// The version to send in `If-Match` with the merged data.
    pub version: i64,
    /// Whether the document is deleted now (its tombstone is at `version`).
    pub deleted: bool,
    /// The document now (null when deleted).
    pub current: Option<DocumentOut>,
    /// The merge: the client's changes and everyone else's; where both
    /// changed a path to different values, the current value (see
    /// `conflicts`).
    #[schema(value_type = Fields)]
    pub merged: Map<String, Value>,
    /// Paths only the client changed.
    pub mine: Vec<String>,
    /// Paths only others changed since `base_version`.
    pub theirs: Vec<String>,
    /// Paths both changed to different values, with the three values (a
    /// side's value is absent where the field is).
    pub conflicts: Vec<MergeConflictOut>,
    /// How `merged` fails the collection's schema for the document's
    /// `schema_version` (the first 50; empty: it satisfies it, or there
    /// is none): what a write of it would be refused for.
    pub schema_errors: Vec<crate::schemas::Violation>,
}

problems!(
    /// What `v1.documents.merge` can answer besides its success.
    MergeProblems =
        Problems::of(&[InvalidPath, ValidationFailed, NotFound, VersionConflict, BaseUnavailable, RecordUnreadable, RuleDenied])
            .with_body()
);

/// Merge a change with everything since
///
/// A three-way merge of `mine` (the data a client changed, starting from
/// the document at `base_version`, which the change-event log must still
/// hold: 410 `base_unavailable` otherwise; a version after the current one
/// is 409 `version_conflict`) with the document as it is now: objects per field, recursively;
/// arrays and scalars as whole values. Writes nothing: send `merged` (after
/// settling `conflicts`) with `If-Match` on `version`.
#[utoipa::path(
    post,
    path = "/v1/collections/{collection}/documents/{id}/merge",
    operation_id = "v1.documents.merge",
    tag = "documents",
    params(DocumentPath),
    request_body(content = MergeIn, content_type = "application/json"),
    responses(MergeProblems,
        (status = 200, description = "The merge", body = MergeOut),
    )
)]
pub(crate) async fn merge_document(
    State(state): State<AppState>,
    super::ruled::Who(who): super::ruled::Who,
    ApiPath(path): ApiPath<DocumentPath>,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<axum::Json<MergeOut>, ApiError> {
    let (collection, id) = path.check()?;
    super::ruled::not_under_rules(&state, collection, &who, "the merge helper").await?;
    let input: MergeIn = from_body(value, &[""])?;
    if input.base_version < 0 {
        return Err(Invalid::new("/base_version", "a version is 0 or more").into());
    }
    rules::user_data(&input.mine, "/mine")?;
    let merged = state.conflicts.merge(collection, id, input.base_version, &input.mine).await;
    let (merged, current, version) = match merged {
        Ok(m) => m,
        Err(MergeError::Doc(e)) => return Err(e.into()),
        Err(e @ MergeError::BaseGone(_)) => return Err(ApiError::new(ProblemCode::BaseUnavailable, e.to_string())),
        Err(MergeError::BaseAhead { base, current }) => {
            return Err(ApiError::from(crate::documents::DocError::VersionConflict {
                expected: base,
                actual: current,
            }));
        }
    };
    // As a write of it would be checked: the current version's schema.
    let sv = current.as_ref().map_or(1, |live| live.schema_version);
    let data = crate::store::convert::object_to_document(&merged.data);
    let known = state.documents.schemas().of(collection).await?;
    let schema_errors = known.violations(collection, sv, &data).map(|r| r.violations).unwrap_or_default();
    Ok(axum::Json(MergeOut {
        schema_errors,
        base_version: input.base_version,
        version,
        deleted: current.is_none(),
        current: current.map(|live| DocumentOut::new(collection, live)),
        merged: merged.data,
        mine: merged.mine,
        theirs: merged.theirs,
        conflicts: merged.conflicts.into_iter().map(MergeConflictOut::from).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefer_return_minimal_is_found_among_preferences() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert("prefer", v.parse().unwrap());
            minimal(&h)
        };
        assert!(with("return=minimal"));
        assert!(with("respond-async, Return=Minimal; x=1"));
        assert!(with("return = minimal"));
        assert!(with("return=\"minimal\""));
        assert!(!with("return"));
        assert!(!with("return=minimalist"));
        assert!(!with("return=representation"));
        assert!(!minimal(&HeaderMap::new()));
    }
}
