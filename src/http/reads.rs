//! Batch reads (docs/design.md §7): `POST /v1/reads`.

use crate::http::guard::{Guard, On, Routes};
use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Access;
use super::contract::{Collection, DocumentId};
use super::envelope::DocumentOut;
use super::error::{ApiError, ProblemCode};
use super::extract::{JsonBody, from_body};
use crate::document::View;
use crate::document::rules::{Invalid, check_collection, check_id};
use crate::documents::DocError;
use crate::http::problems::{Problems, problems};
use crate::keys::Scope;
use crate::positioned::{MAX_MEMBERS, Member, ReadError};

pub(crate) fn router() -> Routes {
    // Reads sent as `POST`; the handler checks each collection read.
    Routes::new().guarded(Guard::Read(On::Handler), routes!(read_documents))
}

/// Documents to read together.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"documents": [{"collection": "orders", "id": "o-1"}, {"collection": "customers", "id": "c-7"}]}))]
pub(crate) struct ReadsIn {
    /// The documents, answered in this order (one may be named twice).
    #[schema(min_items = 1, max_items = 100)]
    pub documents: Vec<ReadIn>,
}

/// A document to read.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadIn {
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
}

/// The documents as of one point.
#[derive(Serialize, ToSchema)]
pub(crate) struct ReadsOut {
    /// The change-event position every document is read at: each shows
    /// every change at or before it and none after it.
    #[schema(minimum = 0)]
    pub position: u64,
    /// One entry per document asked for, in the order asked.
    pub documents: Vec<ReadOut>,
}

/// One document of a batch read: `document` when it is live (200),
/// `problem` when it does not exist (404 `not_found`) or was deleted (410
/// `deleted`, with the tombstone's version).
#[derive(Serialize, ToSchema)]
pub(crate) struct ReadOut {
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
    /// 200, 404 or 410: what a single read of the document would answer.
    #[schema(minimum = 200, maximum = 599, example = 200)]
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub document: Option<DocumentOut>,
    /// The problem a single read would answer (RFC 9457).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub problem: Option<Value>,
}

problems!(
    /// What `v1.reads.create` can answer besides its success.
    ReadProblems = Problems::of(&[ValidationFailed, Locked, RecordUnreadable]).with_body()
);

/// Read documents at one point
///
/// Up to 100 documents of any collections (`read` on each), every one as
/// of one consistent point: never one from before a transaction and
/// another from after it. `position` is that point in the change-event
/// log (`GET /v1/events?after=<position>` goes on from it). A document
/// locked by a transaction that has committed reads as that transaction
/// left it. 409 `locked` when a document kept changing (or its change
/// kept finishing) for longer than the lock wait; retry after
/// `Retry-After`. 422 `validation_failed` (at `/documents`) when the
/// documents hold more than 16 MiB as stored: read them in smaller
/// batches.
#[utoipa::path(
    post,
    path = "/v1/reads",
    operation_id = "v1.reads.create",
    tag = "documents",
    request_body(content = ReadsIn, content_type = "application/json"),
    responses(ReadProblems,
        (status = 200, description = "The documents, in the order asked", body = ReadsOut),
    )
)]
pub(crate) async fn read_documents(
    State(state): State<AppState>,
    access: Access,
    super::ruled::Who(who): super::ruled::Who,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<axum::Json<ReadsOut>, ApiError> {
    let input: ReadsIn = from_body(value, &["", "/documents/*"])?;
    if input.documents.is_empty() || input.documents.len() > MAX_MEMBERS {
        return Err(Invalid::new("/documents", format!("documents holds 1 to {MAX_MEMBERS} entries")).into());
    }
    for (i, d) in input.documents.iter().enumerate() {
        check_collection(&d.collection, &format!("/documents/{i}/collection"))?;
        check_id(&d.id, &format!("/documents/{i}/id"))?;
    }
    // Each member's collection's rules, as a by-id read judges by them.
    let mut judged = std::collections::HashMap::new();
    for d in &input.documents {
        access.check(Scope::Read, &d.collection)?;
        if !judged.contains_key(&d.collection) {
            judged.insert(d.collection.clone(), super::ruled::judged(&state, &d.collection, &who).await?);
        }
    }
    let members: Vec<Member> =
        input.documents.into_iter().map(|d| Member { collection: d.collection, id: d.id }).collect();
    let read = state.positioned.members(&members).await.map_err(read_error)?;
    let documents = members
        .into_iter()
        .zip(read.views)
        .map(|(m, view)| {
            let rules = &judged[&m.collection];
            let view = match view {
                View::Live(mut live) => match super::ruled::shown(rules, &mut live) {
                    Ok(_) => View::Live(live),
                    Err(_) => View::NotFound,
                },
                View::Deleted { .. } if matches!(rules, crate::rules::Judged::Ruled(_)) => View::NotFound,
                other => other,
            };
            let (status, document, problem) = match view {
                View::Live(live) => (200, Some(DocumentOut::new(&m.collection, live)), None),
                View::NotFound => (404, None, Some(member_problem(DocError::NotFound, &m))),
                View::Deleted { version, deleted_at } => {
                    (410, None, Some(member_problem(DocError::Deleted { version, deleted_at }, &m)))
                }
            };
            ReadOut { collection: m.collection, id: m.id, status, document, problem }
        })
        .collect();
    Ok(axum::Json(ReadsOut { position: read.position, documents }))
}

fn member_problem(err: DocError, member: &Member) -> Value {
    ApiError::from(err).document(&member.collection, &member.id).body()
}

fn read_error(err: ReadError) -> ApiError {
    match err {
        ReadError::Unsettled { collection, id, holder } => {
            let detail = format!("{collection}/{id} kept changing: it could not be read at one point with the others");
            let mut err = ApiError::new(ProblemCode::Locked, detail)
                .document(collection, id)
                .retry(std::time::Duration::from_secs(1));
            err.members.transaction = holder;
            err
        }
        ReadError::TooLarge => Invalid::new("/documents", ReadError::TooLarge.to_string()).into(),
        ReadError::Doc(err) => err.into(),
    }
}
