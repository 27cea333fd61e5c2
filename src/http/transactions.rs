//! `/v1/transactions`: run a multi-document transaction, read its record,
//! list records, abort a pending one.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::auth::Caller;
use super::documents::{encode_cursor, paging};
use super::error::{ApiError, PROBLEM_JSON, Problem, ProblemCode};
use super::extract::{ApiPath, ApiQuery, JsonBody};
use crate::clock::rfc3339;
use crate::documents::rules::{self, Invalid, Patch};
use crate::hooks::{Delivery, Hook, delivery_id};
use crate::txn::commit::TxnError;
use crate::txn::idem::{Claim, body_hash};
use crate::txn::plan::{Action, ActionOp, Plan};
use crate::txn::record::{Status, TxnRecord};
use crate::txn::{Engine, summary};

pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_transaction, list_transactions))
        .routes(routes!(get_transaction))
        .routes(routes!(abort_transaction))
}

/// A transaction request.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransactionIn {
    /// 1..1000 actions; a document may appear once.
    pub actions: Vec<ActionIn>,
    /// 0..16 webhooks called after the commit, in order.
    #[serde(default)]
    pub hooks: Vec<HookIn>,
    /// Schema version of what the transaction writes (default 1).
    pub schema_version: Option<i64>,
}

/// One action. `if_version` (optional) makes the transaction fail unless
/// the document is at that version.
#[derive(Deserialize, ToSchema)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum ActionIn {
    /// Create a document (over a tombstone, re-create it).
    Insert {
        collection: String,
        /// Generated (UUIDv7) when absent.
        id: Option<String>,
        #[schema(value_type = Object)]
        data: Map<String, Value>,
    },
    /// Change fields: `set`, `unset`, `inc` (dotted paths allowed).
    Update {
        collection: String,
        id: String,
        if_version: Option<i64>,
        #[schema(value_type = Option<Object>)]
        set: Option<Map<String, Value>>,
        unset: Option<Vec<String>>,
        #[schema(value_type = Option<Object>)]
        inc: Option<Map<String, Value>>,
    },
    /// Replace all fields.
    Replace {
        collection: String,
        id: String,
        if_version: Option<i64>,
        #[schema(value_type = Object)]
        data: Map<String, Value>,
    },
    /// Delete, leaving a tombstone.
    Delete { collection: String, id: String, if_version: Option<i64> },
    /// Write nothing, but hold the document at its version until commit.
    Check { collection: String, id: String, if_version: Option<i64> },
}

/// A webhook sent after the transaction commits.
#[derive(Deserialize, Serialize, ToSchema, Clone)]
#[serde(deny_unknown_fields)]
pub struct HookIn {
    /// `POST` (default), `PUT`, `PATCH`, `DELETE` or `GET`.
    #[serde(default = "default_method")]
    pub method: String,
    /// An http(s) URL.
    pub url: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// The body to send; the commit summary when absent.
    #[schema(value_type = Option<Object>)]
    pub body: Option<Value>,
}

fn default_method() -> String {
    "POST".into()
}

impl HookIn {
    fn into_hook(self) -> Hook {
        Hook { method: self.method, url: self.url, headers: self.headers, body: self.body }
    }
}

/// The answer once the commit point is passed.
#[derive(Serialize, ToSchema)]
pub struct CommittedOut {
    pub id: String,
    /// Always `committed`.
    pub status: String,
    pub committed_at: String,
    pub results: Vec<ResultOut>,
    pub hooks: Vec<HookStateOut>,
}

#[derive(Serialize, ToSchema)]
pub struct ResultOut {
    pub collection: String,
    pub id: String,
    /// The new version (the current one for `check`, the tombstone's for `delete`).
    pub version: i64,
}

#[derive(Serialize, ToSchema)]
pub struct HookStateOut {
    /// `<transaction>:<index>`: the delivery id.
    pub id: String,
    /// `pending`, `failed`, `dead`, `delivered`; `not_sent` when the
    /// transaction did not commit.
    pub status: String,
}

/// A transaction record.
#[derive(Serialize, ToSchema)]
pub struct TransactionOut {
    pub id: String,
    /// `pending`, `committed`, `done`, `aborted` or `rolled_back`.
    pub status: Status,
    pub started_at: String,
    pub expires_at: String,
    pub committed_at: Option<String>,
    pub finished_at: Option<String>,
    pub abort_reason: Option<String>,
    pub idempotency_key: Option<String>,
    /// The request as sent.
    #[schema(value_type = Object)]
    pub request: Value,
    pub actions: Vec<ActionStateOut>,
    pub hooks: Vec<HookStateOut>,
    /// Why it did not commit, when it did not.
    #[schema(value_type = Option<Object>)]
    pub failure: Option<Value>,
}

#[derive(Serialize, ToSchema)]
pub struct ActionStateOut {
    pub index: usize,
    pub op: String,
    pub collection: String,
    pub id: String,
    /// The version the change was computed from, once known.
    pub base_version: Option<i64>,
    /// The version after the commit.
    pub version: Option<i64>,
    /// `pending`, `committed`, `failed` or `not_applied`.
    pub outcome: String,
}

#[derive(Serialize, ToSchema)]
pub struct TransactionListOut {
    pub items: Vec<TransactionOut>,
    pub next: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TransactionListQuery {
    /// `pending` (not yet decided), `committed`, `done`, `aborted`, `rolled_back`.
    pub status: Option<String>,
    /// Page size, 1..1000 (default 50).
    pub limit: Option<i64>,
    /// The `next` cursor of the previous page.
    pub after: Option<String>,
}

#[derive(Deserialize, IntoParams)]
pub struct TransactionPath {
    /// Transaction id.
    pub id: String,
}

const MAX_KEY_CHARS: usize = 255;

fn validate_hook(hook: &HookIn, i: usize, guard: &crate::hooks::guard::HookGuard) -> Result<(), ApiError> {
    let p = format!("/hooks/{i}");
    if !matches!(hook.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE" | "GET") {
        return Err(Invalid::new(format!("{p}/method"), "method must be POST, PUT, PATCH, DELETE or GET").into());
    }
    let url = url::Url::parse(&hook.url).map_err(|e| Invalid::new(format!("{p}/url"), format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(Invalid::new(format!("{p}/url"), "the URL must be http or https with a host").into());
    }
    if let Err(why) = guard.check_url(&url) {
        return Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, ProblemCode::HookNotAllowed, why)
            .with("errors", json!([{"pointer": format!("{p}/url"), "detail": "destination not allowed"}])));
    }
    for (name, value) in &hook.headers {
        if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() || HeaderValue::from_str(value).is_err() {
            return Err(Invalid::new(format!("{p}/headers/{name}"), "not a valid HTTP header").into());
        }
        if crate::hooks::send::RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
            return Err(Invalid::new(format!("{p}/headers/{name}"), "this header is set by txgate").into());
        }
    }
    Ok(())
}

/// Check the request and resolve it into a plan.
fn plan(input: TransactionIn, raw: &[u8], key: Option<String>, state: &AppState) -> Result<Plan, ApiError> {
    let cfg = &state.engine.config();
    if input.actions.is_empty() || input.actions.len() > cfg.max_actions {
        return Err(Invalid::new("/actions", format!("a transaction has 1..{} actions", cfg.max_actions)).into());
    }
    if input.hooks.len() > cfg.max_hooks {
        return Err(Invalid::new("/hooks", format!("a transaction has at most {} hooks", cfg.max_hooks)).into());
    }
    for (i, hook) in input.hooks.iter().enumerate() {
        validate_hook(hook, i, &state.hook_guard)?;
    }
    let schema_version = match input.schema_version {
        Some(v) if v < 1 => return Err(Invalid::new("/schema_version", "schema_version must be at least 1").into()),
        v => v.unwrap_or(1),
    };
    let mut seen = HashSet::new();
    let mut actions = Vec::with_capacity(input.actions.len());
    for (i, action) in input.actions.into_iter().enumerate() {
        let p = format!("/actions/{i}");
        let check_version = |v: Option<i64>| match v {
            Some(v) if v < 1 => Err(Invalid::new(format!("{p}/if_version"), "if_version must be at least 1")),
            v => Ok(v),
        };
        let (collection, id, op, if_version) = match action {
            ActionIn::Insert { collection, id, data } => {
                let id = id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
                (collection, id, ActionOp::Insert(rules::user_data(&data, &format!("{p}/data"))?), None)
            }
            ActionIn::Update { collection, id, if_version, set, unset, inc } => {
                let patch = Patch::parse(set.as_ref(), unset.as_deref(), inc.as_ref(), &p)?;
                (collection, id, ActionOp::Update(patch), check_version(if_version)?)
            }
            ActionIn::Replace { collection, id, if_version, data } => {
                let data = rules::user_data(&data, &format!("{p}/data"))?;
                (collection, id, ActionOp::Replace(data), check_version(if_version)?)
            }
            ActionIn::Delete { collection, id, if_version } => {
                (collection, id, ActionOp::Delete, check_version(if_version)?)
            }
            ActionIn::Check { collection, id, if_version } => {
                (collection, id, ActionOp::Check, check_version(if_version)?)
            }
        };
        rules::check_collection(&collection, &format!("{p}/collection"))?;
        rules::check_id(&id, &format!("{p}/id"))?;
        if !seen.insert((collection.clone(), id.clone())) {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                ProblemCode::DuplicateMember,
                format!("document {collection}/{id} appears more than once"),
            )
            .with("action", i));
        }
        actions.push(Action { collection, id, op, if_version });
    }
    Ok(Plan {
        actions,
        schema_version,
        request: String::from_utf8_lossy(raw).into_owned(),
        idempotency_key: key,
        hooks: input.hooks.into_iter().map(HookIn::into_hook).collect(),
    })
}

fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else { return Ok(None) };
    let key = value
        .to_str()
        .map_err(|_| ApiError::bad_request(ProblemCode::InvalidHeader, "Idempotency-Key must be text"))?;
    let n = key.chars().count();
    if n == 0 || n > MAX_KEY_CHARS || key.chars().any(char::is_control) {
        return Err(ApiError::bad_request(
            ProblemCode::InvalidHeader,
            format!("Idempotency-Key must have 1..{MAX_KEY_CHARS} printable characters"),
        ));
    }
    Ok(Some(key.to_owned()))
}

/// A response with a JSON body (a stored outcome being replayed).
fn answer(status: StatusCode, body: Value) -> Response {
    let mut response = (status, axum::Json(body)).into_response();
    if status.is_client_error() || status.is_server_error() {
        response.headers_mut().insert(axum::http::header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
    }
    response
}

/// Run a transaction
///
/// All actions apply or none does. 200 once the commit point is passed
/// (later reads see the writes); 409 when it cannot commit, with the
/// failing action and whether a retry can succeed. With an
/// `Idempotency-Key` the same request returns the same outcome for 24 h.
#[utoipa::path(
    post,
    path = "/v1/transactions",
    operation_id = "v1.transactions.create",
    tag = "transactions",
    params(("Idempotency-Key" = Option<String>, Header, description = "1..255 characters; scoped to the API key")),
    request_body(content = TransactionIn, content_type = "application/json"),
    responses(
        (status = 200, description = "Committed", body = CommittedOut),
        (status = 400, description = "Malformed JSON or header", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "Not committed, nothing applied: `version_conflict`, `not_found`, `deleted`, `already_exists` (retryable: false), `locked`, `aborted` (retryable: true), or `in_progress` for a repeated Idempotency-Key", body = Problem, content_type = "application/problem+json"),
        (status = 422, description = "Malformed body (`validation_failed`, `duplicate_member`), `invalid_change`, `idempotency_key_reused`", body = Problem, content_type = "application/problem+json"),
        (status = 503, description = "Store unreachable (`transaction` names it when the outcome is unknown)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn create_transaction(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    headers: HeaderMap,
    JsonBody { value, raw }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let hash = body_hash(&value);
    let input: TransactionIn = serde_json::from_value(value)
        .map_err(|e| ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, ProblemCode::ValidationFailed, e.to_string()))?;
    let plan = plan(input, &raw, key.clone(), &state)?;
    let scoped = key.map(|k| format!("{}:{k}", caller.map_or_else(|| "-".to_owned(), |c| c.0.0.clone())));
    // From here on the request's life does not depend on its connection: a
    // client that hangs up (a closed tab, a proxy timeout) drops this
    // handler, not the transaction, which runs to its outcome and stores it
    // for its Idempotency-Key. Shutdown waits for it.
    let engine = Arc::clone(&state.engine);
    state
        .engine
        .tasks()
        .spawn(run_transaction(engine, plan, hash, scoped))
        .await
        .map_err(|e| ApiError::internal(format!("transaction task failed: {e}")))?
}

/// What becomes of an Idempotency-Key once its request has an answer.
enum KeyOutcome {
    /// Store the answer: a commit or a non-retryable failure.
    Complete,
    /// Free the key: a retryable failure, nothing applied.
    Release,
    /// Leave the claim on the attempt: its outcome is unknown, and a retry
    /// with the key must learn it from the record, not run again.
    Keep,
}

async fn run_transaction(
    engine: Arc<Engine>,
    plan: Plan,
    hash: String,
    scoped: Option<String>,
) -> Result<Response, ApiError> {
    let txn = uuid::Uuid::now_v7().to_string();
    if let Some(scoped) = &scoped {
        match engine.claim_key(scoped, &hash, &txn).await? {
            Claim::Fresh => {}
            Claim::Replay { status, body } => {
                let mut response = answer(StatusCode::from_u16(status).unwrap_or(StatusCode::OK), body);
                response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
                return Ok(response);
            }
            Claim::InProgress { txn } => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    ProblemCode::InProgress,
                    "a request with this Idempotency-Key is still running",
                )
                .with("transaction", txn)
                .with("retryable", true)
                .retry(std::time::Duration::from_secs(1)));
            }
            Claim::Reused => {
                return Err(ApiError::new(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    ProblemCode::IdempotencyKeyReused,
                    "this Idempotency-Key was used with a different request body",
                ));
            }
        }
    }
    let result = engine.execute(&plan, Some(txn.clone()), scoped.as_deref()).await;
    // The attempt that decided the outcome (a wounded attempt is retried).
    let txn = match &result {
        Ok(c) => c.record.id.clone(),
        Err(
            TxnError::Aborted { txn, .. }
            | TxnError::InvalidChange { txn, .. }
            | TxnError::Store { txn, .. }
            | TxnError::OutcomeUnknown { txn },
        ) => txn.clone(),
    };
    let (response, key_outcome) = match result {
        Ok(committed) => (Ok(summary(&committed.record)), KeyOutcome::Complete),
        Err(err) => {
            let key_outcome = match &err {
                TxnError::Aborted { failure, .. } if !failure.retryable => KeyOutcome::Complete,
                TxnError::InvalidChange { .. } => KeyOutcome::Complete,
                TxnError::OutcomeUnknown { .. } => KeyOutcome::Keep,
                _ => KeyOutcome::Release,
            };
            (Err(ApiError::from(err)), key_outcome)
        }
    };
    if let Some(scoped) = &scoped {
        let stored = match (key_outcome, &response) {
            (KeyOutcome::Complete, Ok(body)) => engine.complete_key(scoped, &txn, 200, body).await,
            (KeyOutcome::Complete, Err(err)) => {
                engine.complete_key(scoped, &txn, err.status.as_u16(), &err.body()).await
            }
            (KeyOutcome::Release, _) => engine.release_key(scoped, &txn).await,
            (KeyOutcome::Keep, _) => Ok(()),
        };
        if let Err(err) = stored {
            tracing::warn!(txn.id = %txn, error = %err, "could not record the idempotency outcome");
        }
    }
    response.map(|body| answer(StatusCode::OK, body))
}

fn transaction_out(rec: &TxnRecord, deliveries: &[Option<Delivery>]) -> TransactionOut {
    let committed = rec.status.is_committed();
    let failed_action = rec.failure.as_ref().and_then(|f| f.action);
    let actions = rec
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let version = rec.results.as_ref().and_then(|r| r.get(i)).map(|r| r.version);
            let outcome = if committed {
                "committed"
            } else if failed_action == Some(i as i64) {
                "failed"
            } else if rec.status == Status::Pending {
                "pending"
            } else {
                "not_applied"
            };
            ActionStateOut {
                index: i,
                op: serde_json::to_value(m.op).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
                collection: m.collection.clone(),
                id: m.id.clone(),
                base_version: m.base_v,
                version,
                outcome: outcome.to_owned(),
            }
        })
        .collect();
    let hooks = (0..rec.hook_count as usize)
        .map(|i| HookStateOut {
            id: delivery_id(&rec.id, i),
            status: match deliveries.get(i).and_then(Option::as_ref) {
                Some(d) => d.status.as_str().to_owned(),
                None if committed => "pending".to_owned(),
                None => "not_sent".to_owned(),
            },
        })
        .collect();
    TransactionOut {
        id: rec.id.clone(),
        status: rec.status,
        started_at: rfc3339(rec.started_at),
        expires_at: rfc3339(rec.expires_at),
        committed_at: rec.committed_at.map(rfc3339),
        finished_at: rec.finished_at.map(rfc3339),
        abort_reason: rec.abort_reason.clone(),
        idempotency_key: rec.idempotency_key.clone(),
        request: serde_json::from_str(&rec.request).unwrap_or(Value::String(rec.request.clone())),
        actions,
        hooks,
        failure: rec.failure.as_ref().and_then(|f| serde_json::to_value(f).ok()),
    }
}

async fn load(state: &AppState, id: &str) -> Result<TxnRecord, ApiError> {
    state.engine.record(id).await?.ok_or_else(|| ApiError::not_found(format!("no transaction {id}")))
}

/// Read a transaction
///
/// Status, timestamps, the request as sent, each action's outcome.
#[utoipa::path(
    get,
    path = "/v1/transactions/{id}",
    operation_id = "v1.transactions.get",
    tag = "transactions",
    params(TransactionPath),
    responses(
        (status = 200, description = "The transaction", body = TransactionOut),
        (status = 404, description = "`not_found` (never existed, or purged after retention)", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn get_transaction(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<TransactionPath>,
) -> Result<axum::Json<TransactionOut>, ApiError> {
    let rec = load(&state, &path.id).await?;
    let deliveries = state.hooks.deliveries_of(&rec.id, rec.hook_count).await?;
    Ok(axum::Json(transaction_out(&rec, &deliveries)))
}

/// List transactions
///
/// Oldest first; `status=pending` lists those not yet decided (operators
/// hunting stuck work).
#[utoipa::path(
    get,
    path = "/v1/transactions",
    operation_id = "v1.transactions.list",
    tag = "transactions",
    params(TransactionListQuery),
    responses(
        (status = 200, description = "A page of transactions", body = TransactionListOut),
        (status = 422, description = "Bad status, limit or cursor", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn list_transactions(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<TransactionListQuery>,
) -> Result<axum::Json<TransactionListOut>, ApiError> {
    let status = match query.status.as_deref() {
        None => None,
        Some("pending") => Some(Status::Pending),
        Some("committed") => Some(Status::Committed),
        Some("done") => Some(Status::Done),
        Some("aborted") => Some(Status::Aborted),
        Some("rolled_back") => Some(Status::RolledBack),
        Some(_) => {
            return Err(
                Invalid::new("/query/status", "status is pending, committed, done, aborted or rolled_back").into()
            );
        }
    };
    let (limit, after) = paging(query.limit, query.after.as_deref())?;
    let (items, next) = state.engine.list_transactions(status, after.as_deref(), limit).await?;
    let next = next.as_deref().map(encode_cursor);
    let mut out = Vec::with_capacity(items.len());
    for rec in &items {
        let deliveries = state.hooks.deliveries_of(&rec.id, rec.hook_count).await?;
        out.push(transaction_out(rec, &deliveries));
    }
    Ok(axum::Json(TransactionListOut { items: out, next }))
}

/// Abort a pending transaction
///
/// Needs the `admin` scope. Aborting an aborted one is a no-op; a committed
/// one cannot be aborted (409 `already_committed`).
#[utoipa::path(
    post,
    path = "/v1/transactions/{id}/abort",
    operation_id = "v1.transactions.abort",
    tag = "transactions",
    params(TransactionPath),
    responses(
        (status = 200, description = "Aborted (its changes are being rolled back)", body = TransactionOut),
        (status = 404, description = "`not_found`", body = Problem, content_type = "application/problem+json"),
        (status = 409, description = "`already_committed`", body = Problem, content_type = "application/problem+json"),
    )
)]
pub async fn abort_transaction(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<TransactionPath>,
) -> Result<axum::Json<TransactionOut>, ApiError> {
    let rec = load(&state, &path.id).await?;
    let rec = if rec.status == Status::Pending {
        state.engine.abort_pending(&rec.id, None, "operator").await?.unwrap_or(rec)
    } else {
        rec
    };
    if rec.status.is_committed() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            ProblemCode::AlreadyCommitted,
            "the transaction has committed",
        )
        .with("transaction", rec.id.clone()));
    }
    if rec.status == Status::Aborted {
        state.engine.roll_back_in_background(rec.clone());
    }
    Ok(axum::Json(transaction_out(&rec, &[])))
}
