//! Queries and counts (docs/design.md §7): `GET
//! /v1/collections/{collection}/documents` with `filter`, `sort` and
//! `fields`, the same as a body to `POST …/query`, and `GET …/count`.

use crate::http::guard::{Guard, On, Routes};
use axum::extract::State;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::routes;

use super::AppState;
use super::contract::Cursor;
use super::envelope::{CollectionPath, DocumentOut};
use super::error::{ApiError, Declared, IndexMember, ProblemCode};
use super::extract::{ApiPath, ApiQuery, JsonBody, from_body, integer};
use super::paging::{DEFAULT_PAGE, MAX_PAGE};
use super::ruled::{self, Who};
use crate::document::PageItem;
use crate::document::rules::{Invalid, check_collection};
use crate::http::problems::{Problems, problems};
use crate::indexes::State as IndexState;
use crate::queries::ruled::Part;
use crate::queries::{Query, QueryError};
use crate::query::filter::{Filter, FilterError, check_path};
use crate::query::plan::{SortKey, Unserved};
use crate::rules::{Action, Judged};

pub(crate) fn router() -> Routes {
    Routes::new()
        .guarded(Guard::ByMethod(On::Path), routes!(list_documents))
        // A query sent as `POST`: `read` is enough.
        .guarded(Guard::Read(On::Path), routes!(query_documents))
        .guarded(Guard::ByMethod(On::Path), routes!(count_documents))
}

/// Sort keys a query may name.
const MAX_SORT: usize = 8;
/// Data paths `fields` may name.
const MAX_FIELDS: usize = 64;

/// A query's parameters, as `GET …/documents` takes them.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct QueryParams {
    /// A filter (JSON, see `Filter`) over the documents' data.
    #[param(value_type = Option<String>, example = r#"{"status":"open","amount":{"$gte":100}}"#)]
    pub filter: Option<String>,
    /// Data paths, comma-separated, each ascending or `-` descending; the
    /// document id breaks ties.
    #[param(value_type = Option<String>, example = "-amount")]
    pub sort: Option<String>,
    /// The data paths to keep in each document's `data`, comma-separated
    /// (the id, version and timestamps are always there).
    #[param(value_type = Option<String>, example = "status,amount")]
    pub fields: Option<String>,
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// The `next` cursor of the previous page of the same query (with
    /// another filter or sort it is 422 `validation_failed`).
    #[param(value_type = Option<Cursor>)]
    pub after: Option<String>,
}

/// A query, as `POST …/query` takes it: the parameters of `GET
/// …/documents` as JSON.
#[derive(Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"filter": {"status": "open"}, "sort": ["-amount"], "fields": ["status", "amount"], "limit": 50}))]
pub(crate) struct QueryIn {
    #[serde(default)]
    #[schema(value_type = Option<super::contract::Filter>)]
    pub filter: Option<Value>,
    /// Data paths, each ascending or `-` descending; the document id
    /// breaks ties. A comma-separated string, as `GET …/documents` takes
    /// it, is taken too.
    #[serde(default, deserialize_with = "path_list")]
    #[schema(value_type = Option<Vec<super::contract::SortPath>>, max_items = 8)]
    pub sort: Option<Vec<String>>,
    /// The data paths to keep in each document's `data` (or a
    /// comma-separated string of them).
    #[serde(default, deserialize_with = "path_list")]
    #[schema(value_type = Option<Vec<super::contract::DataPath>>, max_items = 64)]
    pub fields: Option<Vec<String>>,
    /// Page size (default 50).
    #[serde(default, deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// The `next` cursor of the previous page of the same query (with
    /// another filter or sort it is 422 `validation_failed`).
    #[serde(default)]
    #[schema(value_type = Option<Cursor>)]
    pub after: Option<String>,
}

/// A page of a query's documents.
#[derive(Serialize, ToSchema)]
pub(crate) struct QueryPageOut {
    pub items: Vec<DocumentOut>,
    /// Cursor for `after=`; `null` on the last page. A page stops short
    /// of `limit` (with a cursor) once its documents hold 4 MiB as stored.
    #[schema(value_type = Option<Cursor>, required = true)]
    pub next: Option<String>,
    /// The change-event position the page was read at.
    #[schema(minimum = 0)]
    pub position: u64,
}

/// A count.
#[derive(Serialize, ToSchema)]
pub(crate) struct CountOut {
    #[schema(minimum = 0)]
    pub count: u64,
    /// The change-event position the count was read at.
    #[schema(minimum = 0)]
    pub position: u64,
}

/// Where a request's parts are, for pointers: `/query/<name>` for a GET,
/// `/<name>` for a body.
#[derive(Clone, Copy)]
enum From {
    Params,
    Body,
}

impl From {
    fn at(self, name: &str) -> String {
        match self {
            From::Params => format!("/query/{name}"),
            From::Body => format!("/{name}"),
        }
    }
}

fn filter_error(from: From, err: FilterError) -> ApiError {
    let pointer = format!("{}{}", from.at("filter"), err.pointer);
    ApiError::bad_request(ProblemCode::InvalidFilter, format!("{pointer}: {}", err.message))
        .pointer(pointer, err.message)
}

/// A `filter` parameter's JSON.
fn filter_json(from: From, text: &str) -> Result<Value, ApiError> {
    let refused = |message: String| filter_error(from, FilterError { pointer: String::new(), message });
    // As in a body: nesting past the parser's depth is pointed at, and a
    // member named twice is refused, not read as its last.
    let value = serde_json::from_str::<Value>(text).map_err(|e| {
        if super::extract::too_deep(&e) {
            let (pointer, message) = super::extract::past_depth(text.as_bytes());
            filter_error(from, FilterError { pointer, message })
        } else {
            refused(format!("not JSON: {e}"))
        }
    })?;
    if let Some(pointer) = super::extract::duplicate_member(text.as_bytes()) {
        return Err(filter_error(from, FilterError { pointer, message: "the member appears more than once".into() }));
    }
    Ok(value)
}

fn parse_filter(from: From, filter: Option<&Value>) -> Result<Filter, ApiError> {
    match filter {
        None | Some(Value::Null) => Ok(Filter::default()),
        Some(v) => Filter::parse(v).map_err(|e| filter_error(from, e)),
    }
}

fn paths(from: From, name: &str, items: &[String], max: usize) -> Result<(), ApiError> {
    if items.len() > max {
        let detail = format!("{name} names at most {max} paths");
        return Err(ApiError::bad_request(ProblemCode::InvalidFilter, detail.clone()).pointer(from.at(name), detail));
    }
    // A body's list item by its place; a parameter is one string.
    let at = |i: usize| match from {
        From::Params => from.at(name),
        From::Body => format!("{}/{i}", from.at(name)),
    };
    let refused = |pointer: String, detail: String| {
        ApiError::bad_request(ProblemCode::InvalidFilter, format!("{pointer}: {detail}")).pointer(pointer, detail)
    };
    let mut seen = std::collections::HashSet::new();
    for (i, item) in items.iter().enumerate() {
        let path = if name == "sort" { item.strip_prefix('-').unwrap_or(item) } else { item };
        check_path(path, "").map_err(|e| refused(at(i), e.message))?;
        // A sort names each path once: a second mention orders nothing.
        if name == "sort" && !seen.insert(path) {
            return Err(refused(at(i), format!("sort names {path:?} twice")));
        }
    }
    Ok(())
}

fn sort_keys(items: &[String]) -> Vec<SortKey> {
    items
        .iter()
        .map(|k| match k.strip_prefix('-') {
            Some(p) => SortKey { path: p.to_owned(), desc: true },
            None => SortKey { path: k.clone(), desc: false },
        })
        .collect()
}

/// A body's `sort` or `fields`: a list of paths, or one string of them
/// comma-separated as the query parameter is (see [`split`]).
fn path_list<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Vec<String>>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged, expecting = "a list of data paths, or one string of them comma-separated")]
    enum Paths {
        List(Vec<String>),
        Joined(String),
    }
    Ok(match Option::<Paths>::deserialize(deserializer)? {
        None => None,
        Some(Paths::List(list)) => Some(list),
        Some(Paths::Joined(joined)) => split(Some(&joined)),
    })
}

/// A comma-separated list of a query parameter: none when the parameter
/// is empty; an empty item (`a,,b`, `a,`) is kept, to be refused as the
/// body's empty string is.
fn split(list: Option<&str>) -> Option<Vec<String>> {
    list.map(|l| match l.trim() {
        "" => Vec::new(),
        l => l.split(',').map(str::trim).map(str::to_owned).collect(),
    })
}

fn limit(from: From, limit: Option<i64>) -> Result<usize, ApiError> {
    let limit = limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(Invalid::new(from.at("limit"), format!("limit must be between 1 and {MAX_PAGE}")).into());
    }
    Ok(limit as usize)
}

/// The `filter` query parameter `text`, parsed (400 `invalid_filter`).
pub(super) fn filter_param(text: &str) -> Result<Filter, ApiError> {
    parse_filter(From::Params, Some(&filter_json(From::Params, text)?))
}

/// 400 `index_required` for a filter of `collection`, given in the query
/// string, that no ready index serves (`err`: why, and the declared index
/// that will once ready, if any).
pub(super) fn unserved(collection: &str, err: QueryError) -> ApiError {
    query_error(From::Params, collection, err)
}

/// The answer for a query's failure.
fn query_error(from: From, collection: &str, err: QueryError) -> ApiError {
    match err {
        QueryError::Unserved(Unserved::Needs { fields, why }) => {
            let detail = crate::query::plan::needs_detail(&fields, why);
            let name = crate::indexes::free_name(&fields, |_| false);
            query_error(from, collection, QueryError::Suggested { name, fields, detail })
        }
        QueryError::Suggested { name, fields, detail } => ApiError::bad_request(
            ProblemCode::IndexRequired,
            format!("{detail}: PUT /v1/collections/{collection}/indexes/{name}"),
        )
        .index(IndexMember::Index { name, fields, unique: false }),
        QueryError::Unserved(Unserved::Never(detail)) => ApiError::bad_request(ProblemCode::IndexRequired, detail),
        QueryError::NotReady { why, index } => {
            // Why, without the index the planner would name: this answer
            // names the declared one.
            let detail = why.why();
            let path = format!("/v1/collections/{collection}/indexes/{}", index.name);
            let (detail, declared) = match index.state {
                IndexState::Failed => (
                    format!(
                        "{detail}: index {:?} on {:?} would, but its build failed: {} (DELETE {path}, then PUT it)",
                        index.name,
                        index.fields,
                        index.reason.as_deref().unwrap_or("no reason kept")
                    ),
                    Declared {
                        name: index.name.clone(),
                        state: "failed",
                        progress: None,
                        reason: Some(index.reason.clone()),
                    },
                ),
                _ => (
                    format!(
                        "{detail} yet: index {:?} on {:?} will once its build ends ({}; GET {path})",
                        index.name,
                        index.fields,
                        index.progress.as_ref().map_or_else(
                            || "starting".to_owned(),
                            |p| format!("{} {} of {} documents", p.phase, p.done, p.total)
                        )
                    ),
                    Declared {
                        name: index.name.clone(),
                        state: "building",
                        progress: Some(index.progress.clone()),
                        reason: None,
                    },
                ),
            };
            let mut err = ApiError::bad_request(ProblemCode::IndexRequired, detail).index(IndexMember::Index {
                name: index.name,
                fields: index.fields,
                unique: index.unique,
            });
            err.members.declared = Some(declared);
            err
        }
        QueryError::Cursor(detail) => Invalid::new(from.at("after"), detail).into(),
        QueryError::Doc(err) => err.into(),
        QueryError::Store(err) => ApiError::store(&err),
    }
}

/// The parts of a read by `action` under `judged` (`None`: no rules);
/// 403 when no grant allows the action, never an empty answer that hides
/// the refusal.
fn parts(judged: &Judged, action: Action) -> Result<Option<(Vec<Part<'_>>, String)>, ApiError> {
    let Judged::Ruled(judge) = judged else { return Ok(None) };
    let parts: Vec<Part<'_>> =
        judge.allowing(action).map(|a| Part { grant: &a.grant.name, filter: &a.filter }).collect();
    if parts.is_empty() {
        return Err(ruled::denied(crate::rules::Denied::Forbidden {
            detail: format!(
                "the rules of collection {:?} (version {}) give the caller no grant that allows {}",
                judge.collection,
                judge.version,
                action.as_str()
            ),
            pointer: None,
        }));
    }
    let header = parts.iter().map(|p| judge.header(p.grant)).collect::<Vec<_>>().join(", ");
    Ok(Some((parts, header)))
}

/// A page as the caller may see it: each document's fields trimmed to
/// those its grants let them read, then to the query's `fields`.
fn shown_page(judged: &Judged, items: Vec<PageItem>, fields: Option<&[String]>) -> Result<Vec<PageItem>, ApiError> {
    let Judged::Ruled(judge) = judged else { return Ok(items) };
    // Every document of a page under rules matches the filter of a grant
    // that reads it (its part of the read was that grant's filter): where
    // no such grant hides a field, each is shown as stored, never built.
    if judge.allowing(Action::Read).all(|a| a.grant.read.is_none()) {
        return crate::queries::project::trim(items, fields).map_err(|e| query_error(From::Body, "", e));
    }
    let mut out = Vec::with_capacity(items.len());
    for item in items {
        let mut live = item.into_live().map_err(|e| ApiError::store(&e))?;
        match judge.sees(Action::Read, &live.data) {
            Some(seen) => crate::rules::eval::project(&mut live.data, seen.fields.as_ref()),
            // Served by a grant's filter: never, but never shown either.
            None => continue,
        }
        out.push(PageItem::Built(live));
    }
    crate::queries::project::trim(out, fields).map_err(|e| query_error(From::Body, "", e))
}

async fn run(
    state: &AppState,
    from: From,
    collection: &str,
    query: Query,
    who: &crate::rules::Principal,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let judged = ruled::judged(state, collection, who).await?;
    if let Judged::Ruled(judge) = &judged {
        let filtered = query.filter.paths.keys().map(|p| (p.as_str(), from.at("filter")));
        let sorted = query.sort.iter().map(|k| (k.path.as_str(), from.at("sort")));
        ruled::readable_paths(judge, Action::Read, filtered.chain(sorted))?;
    }
    let (page, header) = match parts(&judged, Action::Read)? {
        None => {
            let page = state.queries.page(collection, &query).await.map_err(|e| query_error(from, collection, e))?;
            (page, None)
        }
        Some((parts, header)) => {
            let all = Query { fields: None, ..query.clone() };
            let mut page = state
                .queries
                .page_ruled(collection, &all, &parts)
                .await
                .map_err(|e| query_error(from, collection, e))?;
            page.items = shown_page(&judged, page.items, query.fields.as_deref())?;
            (page, Some(header))
        }
    };
    let out = QueryPageOut {
        items: page
            .items
            .into_iter()
            .map(|item| match item {
                PageItem::Built(live) => DocumentOut::new(collection, live),
                PageItem::Stored(live) => DocumentOut::stored(collection, live),
            })
            .collect(),
        next: page.next,
        position: page.position,
    };
    Ok(ruled::with_grant(axum::Json(out).into_response(), header))
}

/// A page of `collection` as `who` reads it, `query` being a body's
/// `query` member (pointed at as `/query/<name>`): `POST /v1/access/view`.
pub(super) async fn page_as(
    state: &AppState,
    collection: &str,
    query: QueryIn,
    who: &crate::rules::Principal,
) -> Result<axum::response::Response, ApiError> {
    run(state, From::Params, collection, query_of(From::Params, query)?, who).await
}

problems!(
    /// What `v1.documents.list` and `v1.documents.query` can answer besides their success.
    QueryProblems = Problems::of(&[InvalidPath, ValidationFailed, InvalidFilter, IndexRequired, RecordUnreadable, RuleDenied])
);

/// List or query documents
///
/// Live documents, a page at a time. Without `filter` and `sort`, in id
/// order. With them, the documents whose data matches `filter`, in `sort`
/// order then by id, read along the ready index that serves the query
/// exactly; a query no ready index serves is 400 `index_required`, whose
/// `index` is the index that would (`PUT` it). `fields` trims each
/// document's data to the paths named. Cursors are stable: a document
/// present for the whole listing whose sort values do not change comes
/// exactly once, whatever is written meanwhile.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}/documents",
    operation_id = "v1.documents.list",
    tag = "documents",
    params(CollectionPath, QueryParams),
    responses(QueryProblems,
        (status = 200, description = "A page of documents", body = QueryPageOut),
    )
)]
pub(crate) async fn list_documents(
    State(state): State<AppState>,
    Who(who): Who,
    ApiPath(path): ApiPath<CollectionPath>,
    ApiQuery(params): ApiQuery<QueryParams>,
) -> Result<axum::response::Response, ApiError> {
    check_collection(&path.collection, "/path/collection")?;
    let from = From::Params;
    let filter = params.filter.as_deref().map(|text| filter_json(from, text)).transpose()?;
    let sort = split(params.sort.as_deref()).unwrap_or_default();
    let fields = split(params.fields.as_deref());
    let body = QueryIn { filter, sort: Some(sort), fields, limit: params.limit, after: params.after };
    run(&state, from, &path.collection, query_of(from, body)?, &who).await
}

fn query_of(from: From, body: QueryIn) -> Result<Query, ApiError> {
    let filter = parse_filter(from, body.filter.as_ref())?;
    let sort = body.sort.unwrap_or_default();
    paths(from, "sort", &sort, MAX_SORT)?;
    if let Some(fields) = &body.fields {
        paths(from, "fields", fields, MAX_FIELDS)?;
    }
    Ok(Query {
        filter,
        sort: sort_keys(&sort),
        fields: body.fields,
        limit: limit(from, body.limit)?,
        after: body.after,
    })
}

problems!(
    /// What `v1.documents.query` can answer besides its success.
    QueryBodyProblems =
        Problems::of(&[InvalidPath, ValidationFailed, InvalidFilter, IndexRequired, RecordUnreadable, RuleDenied]).with_body()
);

/// Query documents
///
/// The query of `GET …/documents` as a JSON body, for filters too long
/// for a URL. Needs the `read` scope only.
#[utoipa::path(
    post,
    path = "/v1/collections/{collection}/query",
    operation_id = "v1.documents.query",
    tag = "documents",
    params(CollectionPath),
    request_body(content = QueryIn, content_type = "application/json"),
    responses(QueryBodyProblems,
        (status = 200, description = "A page of documents", body = QueryPageOut),
    )
)]
pub(crate) async fn query_documents(
    State(state): State<AppState>,
    Who(who): Who,
    ApiPath(path): ApiPath<CollectionPath>,
    body: Result<JsonBody<Value>, ApiError>,
) -> Result<axum::response::Response, ApiError> {
    let JsonBody { value, .. } = body.map_err(filter_refusal)?;
    check_collection(&path.collection, "/path/collection")?;
    let body: QueryIn = from_body(value, &[""])?;
    let from = From::Body;
    run(&state, from, &path.collection, query_of(from, body)?, &who).await
}

/// The body's JSON refused where it holds the filter (a member given
/// twice, nesting past the parser's depth) is a refused filter, 400
/// `invalid_filter`, as the same filter in the `filter` parameter is.
fn filter_refusal(err: ApiError) -> ApiError {
    let pointer = err.members.errors.as_ref().and_then(|e| e.first()).map(|e| e.pointer.clone()).unwrap_or_default();
    if err.code != ProblemCode::ValidationFailed || !(pointer == "/filter" || pointer.starts_with("/filter/")) {
        return err;
    }
    let detail = if err.detail.starts_with(&pointer) { err.detail } else { format!("{pointer}: {}", err.detail) };
    ApiError::bad_request(ProblemCode::InvalidFilter, detail).errors(err.members.errors.unwrap_or_default())
}

/// A count's parameters.
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(crate) struct CountParams {
    /// A filter (JSON, see `Filter`); without one, every live document.
    #[param(value_type = Option<String>, example = r#"{"status":"open"}"#)]
    pub filter: Option<String>,
}

problems!(
    /// What `v1.documents.count` can answer besides its success.
    CountProblems = Problems::of(&[InvalidPath, ValidationFailed, InvalidFilter, IndexRequired, RuleDenied])
);

/// Count documents
///
/// How many live documents match `filter`, counted from the entries of
/// the ready index whose first fields are the filter's equality paths and
/// whose next is its range path (no document is read); 400
/// `index_required` when there is none.
#[utoipa::path(
    get,
    path = "/v1/collections/{collection}/count",
    operation_id = "v1.documents.count",
    tag = "documents",
    params(CollectionPath, CountParams),
    responses(CountProblems,
        (status = 200, description = "The count", body = CountOut),
    )
)]
pub(crate) async fn count_documents(
    State(state): State<AppState>,
    Who(who): Who,
    ApiPath(path): ApiPath<CollectionPath>,
    ApiQuery(params): ApiQuery<CountParams>,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    check_collection(&path.collection, "/path/collection")?;
    let from = From::Params;
    let filter = params.filter.as_deref().map(|text| filter_json(from, text)).transpose()?;
    let filter = parse_filter(from, filter.as_ref())?;
    let coll = &path.collection;
    let judged = ruled::judged(&state, coll, &who).await?;
    if let Judged::Ruled(judge) = &judged {
        ruled::readable_paths(judge, Action::Count, filter.paths.keys().map(|p| (p.as_str(), from.at("filter"))))?;
    }
    let ((count, position), header) = match parts(&judged, Action::Count)? {
        None => (state.queries.count(coll, &filter).await.map_err(|e| query_error(from, coll, e))?, None),
        Some((parts, header)) => {
            let counted = state.queries.count_ruled(coll, &filter, &parts).await;
            (counted.map_err(|e| query_error(from, coll, e))?, Some(header))
        }
    };
    Ok(ruled::with_grant(axum::Json(CountOut { count, position }).into_response(), header))
}
