//! `/v1/transactions`: run a multi-document transaction, read its record,
//! list records, abort a pending one.

mod plan;
mod ruled;
mod wire;

pub(crate) use wire::*;

use crate::http::problems::{Problems, problems};
use std::sync::Arc;

use crate::http::guard::{Guard, On, Routes};
use axum::Extension;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::Value;
use utoipa_axum::routes;

use super::AppState;
use super::auth::{Access, Caller};
use super::conflicts::{Conflict, Reader};
use super::contract::IdempotencyKey;
use super::error::{ApiError, PROBLEM_JSON, ProblemCode};
use super::extract::{ApiPath, ApiQuery, JsonBody, from_body};
use super::paging::{ListQuery, Page, kept, status_filter};
use crate::documents::DocError;
use crate::indexes::MemberRefusal;
use crate::keys::Scope;
use crate::seal::List;
use crate::txn::plan::ActionOp;
use crate::txn::record::{Status, TxnRecord};
use crate::txn::{Aborted, Fingerprint, Keyed, Submitted};

pub(crate) fn router() -> Routes {
    // The handlers check the collections a transaction touches.
    Routes::new()
        .guarded(Guard::ByMethod(On::Handler), routes!(create_transaction, list_transactions))
        .guarded(Guard::ByMethod(On::Handler), routes!(get_transaction))
        // An operator action.
        .guarded(Guard::Admin(On::Handler), routes!(abort_transaction))
}

const MAX_KEY_CHARS: usize = 255;

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

problems!(
    /// What `v1.transactions.create` can answer besides its success.
    CreateProblems = Problems::of(&[
        InvalidHeader,
        ValidationFailed,
        RuleDenied,
        DuplicateMember,
        InvalidChange,
        SchemaViolation,
        Duplicate,
        IdempotencyKeyReused,
        HookNotAllowed,
        DocumentRejected,
        OutcomeUnknown,
        InProgress,
        RecordUnreadable,
    ])
    .with_body()
    .with_failures(&[VersionConflict, NotFound, Deleted, AlreadyExists, Locked, Aborted])
);

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
    params(("Idempotency-Key" = Option<IdempotencyKey>, Header, description = "Makes a retry safe: the same key and body answer the first outcome")),
    request_body(content = TransactionIn, content_type = "application/json"),
    responses(CreateProblems,
        (status = 200, description = "Committed", body = CommittedOut,
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored outcome of an earlier request with the key"))),
    )
)]
pub(crate) async fn create_transaction(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    access: Access,
    crate::http::ruled::Acting { who, actor }: crate::http::ruled::Acting,
    user: Option<Extension<Arc<crate::identity::User>>>,
    headers: HeaderMap,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    // Only a request with a key is compared with another by its body.
    let fingerprint = key.is_some().then(|| Fingerprint::of(&value));
    // Kept in the record as the request as sent, with the hooks' header
    // values (write-only) left out: the hooks themselves are kept whole.
    let request = crate::hooks::redact_request(&value).to_string();
    let input: TransactionIn = from_body(value, &["", "/actions/*", "/hooks/*"])?;
    // Which inserts chose their id (rules may not let them).
    let chose: Vec<bool> =
        input.actions.iter().map(|a| !matches!(a, ActionIn::Insert(insert) if insert.id.is_none())).collect();
    let mut plan = plan::plan(input, &actor, request, key.clone(), state.txns.config(), &state.hook_guard)?;
    // A user's hooks go where their roles allow.
    for (i, hook) in plan.hooks.iter().enumerate() {
        crate::http::ruled::hook_allowed(
            &who,
            user.as_deref().map(Arc::as_ref),
            &hook.url,
            &format!("/hooks/{i}/url"),
        )?;
    }
    // Every member within the key's collections, or nothing is done.
    for (i, action) in plan.actions.iter().enumerate() {
        let needed = if matches!(action.op, ActionOp::Check) { Scope::Read } else { Scope::Write };
        access.check(needed, &action.collection).map_err(|e| e.action(i))?;
    }
    // And each action the rules judge allowed on the state it produces.
    let judged = ruled::judge_plan(&state, &who, &mut plan, &chose).await?;
    // And what each action makes checked against its collection's schema,
    // as the rules left it.
    with_schemas(&state, &mut plan).await?;
    // Admitted as every write is (the rule of declared indexes, unique
    // values claimed): a refusal is answered before anything is written.
    let admitted = match state.indexes.admit_plan(&mut plan, state.documents.as_ref()).await {
        Ok(admitted) => admitted,
        Err(MemberRefusal { action: None, refusal }) => return Err(DocError::from(refusal).into()),
        Err(MemberRefusal { action: Some(i), refusal }) => {
            let action = &plan.actions[i];
            return Err(ApiError::from(DocError::from(refusal)).action(i).document(&action.collection, &action.id));
        }
    };
    let keyed = key.zip(fingerprint).map(|(k, fingerprint)| Keyed {
        key: format!("{}:{k}", caller.map_or_else(|| "-".to_owned(), |c| c.0.scope.clone())),
        fingerprint,
    });
    // From here on the request's life does not depend on its connection: a
    // client that hangs up (a closed tab, a proxy timeout) drops this
    // handler, not the transaction, which runs to its outcome and stores it
    // for its Idempotency-Key. Shutdown waits for it.
    let txns = Arc::clone(&state.txns);
    let submitted = state
        .follow_ups
        .spawn(async move {
            let mut submitted = txns.submit(&plan, keyed.as_ref()).await;
            // A refusal's answer, kept for its key before it is given.
            if let Ok(Submitted::Ran(ran, keep)) = &mut submitted {
                if let (Err(err), Some(keep)) = (ran.as_ref(), keep.take()) {
                    let err = ApiError::from_txn(err);
                    keep.keep(err.status().as_u16(), &err.body()).await;
                }
            }
            let committed = matches!(&submitted, Ok(Submitted::Ran(ran, _)) if ran.is_ok());
            admitted.settle(committed).await;
            if committed {
                plan.warned.landed();
            }
            submitted
        })
        .await
        .map_err(|e| ApiError::internal(format!("transaction task failed: {e}")))??;
    match submitted {
        Submitted::Ran(ran, _) => match *ran {
            Ok(committed) => Ok(axum::Json(CommittedOut::of(&committed.record)).into_response()),
            Err(err) => {
                let conflict = Conflict::of_transaction(&err);
                let err = ApiError::from(err);
                // Explained with what the caller may read, where rules judge them.
                match conflict.as_ref().and_then(|c| judged.get(c.collection())) {
                    Some(crate::rules::Judged::Ruled(judge)) => {
                        Err(super::conflicts::explained(&state, Reader::Rules(judge), &headers, conflict, err).await)
                    }
                    _ => {
                        Err(super::conflicts::explained(&state, Reader::Scopes(&access), &headers, conflict, err).await)
                    }
                }
            }
        },
        Submitted::Replay { status, body } => {
            let mut response = answer(StatusCode::from_u16(status).unwrap_or(StatusCode::OK), body);
            response.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
            Ok(response)
        }
        Submitted::InProgress { txn } => {
            let mut err =
                ApiError::new(ProblemCode::InProgress, "a request with this Idempotency-Key is still running")
                    .transaction(txn)
                    .retry(std::time::Duration::from_secs(1));
            err.members.retryable = Some(true);
            Err(err)
        }
        Submitted::KeyReused => Err(ApiError::new(
            ProblemCode::IdempotencyKeyReused,
            "this Idempotency-Key was used with a different request body",
        )),
    }
}

/// Read the schemas of `plan`'s member collections into it (staging
/// checks each member's data against them), and check now the data of
/// each insert and replace whose check does not depend on the document as
/// it is (all but a replace under `moderate`): the first refused answers
/// for the transaction, naming its action, before anything runs.
async fn with_schemas(state: &AppState, plan: &mut crate::txn::plan::Plan) -> Result<(), ApiError> {
    use crate::schemas::Validation;
    let schemas = state.documents.schemas();
    for action in &plan.actions {
        if !plan.schemas.contains_key(&action.collection) {
            let known = schemas.of(&action.collection).await?;
            plan.schemas.insert(action.collection.clone(), known);
        }
    }
    plan.schemas.retain(|_, known| known.any());
    for (i, action) in plan.actions.iter().enumerate() {
        let Some(known) = plan.schemas.get(&action.collection) else { continue };
        let data = match (&action.op, known.validation) {
            (_, Validation::Warn) => continue,
            (ActionOp::Insert(data), _) => data,
            (ActionOp::Replace(data), Validation::Strict) => data,
            _ => continue,
        };
        if let Err(refusal) = known.judge(&action.collection, None, (data, plan.schema_version), &action.id) {
            known.count_refusal();
            return Err(ApiError::schema_violation(&refusal).action(i).document(&action.collection, &action.id));
        }
    }
    Ok(())
}

/// Whether `access` may read every collection of `rec`: what a key limited
/// to some collections sees of the transactions.
fn readable(rec: &TxnRecord, access: &Access) -> bool {
    rec.members.iter().all(|m| access.allows(Scope::Read, &m.collection))
}

/// Whether `access` may write every collection of `rec`: who is shown its
/// hooks' URLs whole (credentials and query strings included).
fn writable(rec: &TxnRecord, access: &Access) -> bool {
    rec.members.iter().all(|m| access.allows(Scope::Write, &m.collection))
}

/// Transaction `id` if `access` has `needed` on each of its collections.
/// One the key may not read (a collection it has no grant on) is answered
/// as one that does not exist, so its existence and its collections stay
/// another key's.
async fn load(
    state: &AppState,
    id: &str,
    (access, who): (&Access, &crate::rules::Principal),
    needed: Scope,
) -> Result<TxnRecord, ApiError> {
    let missing = || ApiError::not_found(format!("no transaction {id}"));
    let rec = state.txns.get(id).await?.ok_or_else(missing)?;
    if !readable(&rec, access) {
        return Err(missing());
    }
    // Its request and outcome name documents the rules may hide.
    let collections: Vec<&str> = rec.members.iter().map(|m| m.collection.as_str()).collect();
    if crate::http::ruled::judged_in_any(state, who, &collections).await? {
        return Err(missing());
    }
    access.check_all(needed, rec.members.iter().map(|m| m.collection.as_str()))?;
    Ok(rec)
}

problems!(
    /// What `v1.transactions.get` can answer besides its success.
    GetProblems = Problems::of(&[InvalidPath, NotFound])
);

/// Read a transaction
///
/// Status, timestamps, the request as sent, each action's outcome.
#[utoipa::path(
    get,
    path = "/v1/transactions/{id}",
    operation_id = "v1.transactions.get",
    tag = "transactions",
    params(TransactionPath),
    responses(GetProblems,
        (status = 200, description = "The transaction", body = TransactionOut),
    )
)]
pub(crate) async fn get_transaction(
    State(state): State<AppState>,
    access: Access,
    crate::http::ruled::Who(who): crate::http::ruled::Who,
    ApiPath(path): ApiPath<TransactionPath>,
) -> Result<axum::Json<TransactionOut>, ApiError> {
    let rec = load(&state, &path.id, (&access, &who), Scope::Read).await?;
    let deliveries = state.hooks.deliveries_of(&rec.id, rec.hook_count).await?;
    Ok(axum::Json(transaction_out(&rec, &deliveries, writable(&rec, &access))))
}

problems!(
    /// What `v1.transactions.list` can answer besides its success.
    ListProblems = Problems::of(&[ValidationFailed])
);

/// List transactions
///
/// Oldest first; `status=pending` lists those not yet decided (operators
/// hunting stuck work). An API key limited to some collections sees the
/// transactions whose members all lie within them (a page may then hold
/// fewer than `limit`; follow `next`).
#[utoipa::path(
    get,
    path = "/v1/transactions",
    operation_id = "v1.transactions.list",
    tag = "transactions",
    params(TransactionFilter, ListQuery),
    responses(ListProblems,
        (status = 200, description = "A page of transactions", body = TransactionListOut),
    )
)]
pub(crate) async fn list_transactions(
    State(state): State<AppState>,
    access: Access,
    crate::http::ruled::Who(who): crate::http::ruled::Who,
    ApiQuery(filter): ApiQuery<TransactionFilter>,
    ApiQuery(query): ApiQuery<ListQuery>,
) -> Result<axum::Json<TransactionListOut>, ApiError> {
    let status: Option<Status> =
        status_filter(filter.status.as_deref(), "pending, committed, done, aborted or rolled_back")?;
    let (limit, after) = query.sealed_page(&state.seal, List::Transactions).await?;
    let txns = &state.txns;
    // A key limited to some collections sees the transactions within them.
    let (items, next) = kept(
        |after, n| async move { txns.list(status, after.as_deref(), n).await },
        after,
        limit,
        |r: &TxnRecord| readable(r, &access),
        |r| &r.id,
    )
    .await?;
    let mut out = Vec::with_capacity(items.len());
    for rec in &items {
        // Left out (the page may be short): records the rules may hide.
        let collections: Vec<&str> = rec.members.iter().map(|m| m.collection.as_str()).collect();
        if crate::http::ruled::judged_in_any(&state, &who, &collections).await? {
            continue;
        }
        let deliveries = state.hooks.deliveries_of(&rec.id, rec.hook_count).await?;
        out.push(transaction_out(rec, &deliveries, writable(rec, &access)));
    }
    Ok(axum::Json(Page::sealed(out, next.as_deref(), &state.seal, List::Transactions).await?))
}

problems!(
    /// What `v1.transactions.abort` can answer besides its success.
    AbortProblems = Problems::of(&[InvalidPath, NotFound, AlreadyCommitted])
);

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
    responses(AbortProblems,
        (status = 200, description = "Aborted (its changes are being rolled back)", body = TransactionOut),
    )
)]
pub(crate) async fn abort_transaction(
    State(state): State<AppState>,
    access: Access,
    crate::http::ruled::Who(who): crate::http::ruled::Who,
    ApiPath(path): ApiPath<TransactionPath>,
) -> Result<axum::Json<TransactionOut>, ApiError> {
    let rec = load(&state, &path.id, (&access, &who), Scope::Admin).await?;
    match state.txns.abort(rec).await? {
        Aborted::Record(rec) => {
            let urls = writable(&rec, &access);
            Ok(axum::Json(transaction_out(&rec, &[], urls)))
        }
        Aborted::Committed(rec) => {
            Err(ApiError::new(ProblemCode::AlreadyCommitted, "the transaction has committed")
                .transaction(rec.id.clone()))
        }
    }
}
