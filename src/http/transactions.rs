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
use super::auth::{Access, Caller, Scope};
use super::contract::{
    AnyObject, AnyValue, Collection, Cursor, DocumentId, Fields, HookHeaders, HookUrl, IdempotencyKey, IncFields,
    SetFields, UnsetFields,
};
use super::documents::{encode_cursor, paging, present};
use super::error::{ApiError, PROBLEM_JSON, ProblemCode};
use super::extract::{ApiPath, ApiQuery, JsonBody, from_body, integer};
use crate::clock::rfc3339;
use crate::documents::rules::{self, Invalid, Patch};
use crate::hooks::{Delivery, Hook, delivery_id};
use crate::txn::commit::TxnError;
use crate::txn::idem::{Claim, Fingerprint};
use crate::txn::plan::{Action, ActionOp, Plan};
use crate::txn::record::{OPERATOR, Status, TxnRecord};
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
#[schema(example = json!({
    "actions": [
        {"op": "update", "collection": "accounts", "id": "alice", "if_version": 3, "inc": {"balance": -25}},
        {"op": "update", "collection": "accounts", "id": "bob", "inc": {"balance": 25}},
        {"op": "insert", "collection": "transfers", "data": {"from": "alice", "to": "bob", "amount": 25}}
    ],
    "hooks": [{"url": "https://example.com/hooks/transfer"}]
}))]
pub struct TransactionIn {
    /// A document may appear once. At most 1000 by default (`TXGATE_MAX_ACTIONS`).
    #[schema(min_items = 1, max_items = 1000)]
    pub actions: Vec<ActionIn>,
    /// Webhooks called after the commit, in order. At most 16 by default (`TXGATE_MAX_HOOKS`).
    #[serde(default)]
    #[schema(max_items = 16)]
    pub hooks: Vec<HookIn>,
    /// Schema version of what the transaction writes (default 1).
    #[serde(default, deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    pub schema_version: Option<i64>,
}

/// The actions, each named once: its variant, its schema, its `op` and the
/// single-valued enum of that `op` (so the description's discriminator and
/// the parser agree). `ActionIn` reads `op`, then the action's own fields.
macro_rules! actions {
    ($($variant:ident($action:ident, $tag:ident) => $op:literal,)*) => {
        $(
            #[derive(Clone, Copy, Debug, Deserialize, ToSchema)]
            pub enum $tag {
                #[serde(rename = $op)]
                #[schema(rename = $op)]
                Tag,
            }
        )*

        /// One action, chosen by `op`. `if_version` (optional) makes the
        /// transaction fail unless the document is at that version.
        pub enum ActionIn {
            $($variant($action),)*
        }

        impl ActionIn {
            /// Every action's `op` and schema name.
            const KINDS: &[(&str, &str)] = &[$(($op, stringify!($action)),)*];

            fn parse(op: &str, value: Value) -> Option<Result<Self, serde_json::Error>> {
                match op {
                    $($op => Some($action::deserialize(value).map(ActionIn::$variant)),)*
                    _ => None,
                }
            }
        }

        impl ToSchema for ActionIn {
            fn schemas(schemas: &mut Vec<(String, utoipa::openapi::RefOr<utoipa::openapi::Schema>)>) {
                use utoipa::PartialSchema;
                $(
                    schemas.push(($action::name().into(), $action::schema()));
                    $action::schemas(schemas);
                )*
            }
        }
    };
}

actions! {
    Insert(InsertAction, InsertOp) => "insert",
    Update(UpdateAction, UpdateOp) => "update",
    Replace(ReplaceAction, ReplaceOp) => "replace",
    Delete(DeleteAction, DeleteOp) => "delete",
    Check(CheckAction, CheckOp) => "check",
}

impl<'de> Deserialize<'de> for ActionIn {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let map = Map::<String, Value>::deserialize(deserializer)?;
        let op = match map.get("op") {
            Some(Value::String(op)) => op.clone(),
            Some(_) => return Err(D::Error::custom("`op` must be a string")),
            None => return Err(D::Error::missing_field("op")),
        };
        match ActionIn::parse(&op, Value::Object(map)) {
            Some(parsed) => parsed.map_err(|e| D::Error::custom(format!("{op}: {e}"))),
            None => {
                let ops: Vec<&str> = ActionIn::KINDS.iter().map(|(op, _)| *op).collect();
                Err(D::Error::custom(format!("unknown op {op:?}, expected one of {}", ops.join(", "))))
            }
        }
    }
}

impl utoipa::PartialSchema for ActionIn {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::Schema> {
        use utoipa::openapi::schema::{Discriminator, OneOfBuilder, Ref};
        let reference = |name: &str| format!("#/components/schemas/{name}");
        let mut one_of = OneOfBuilder::new().description(Some("One action, chosen by `op`.")).discriminator(Some(
            Discriminator::with_mapping("op", ActionIn::KINDS.iter().map(|(op, name)| (*op, reference(name)))),
        ));
        for (_, name) in ActionIn::KINDS {
            one_of = one_of.item(Ref::new(reference(name)));
        }
        one_of.into()
    }
}

/// Create a document (over a tombstone, re-create it).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"op": "insert", "collection": "orders", "id": "order-1001", "data": {"total": 42}}))]
pub struct InsertAction {
    #[schema(inline)]
    pub op: InsertOp,
    #[schema(value_type = Collection)]
    pub collection: String,
    /// Generated (UUIDv7) when absent.
    #[schema(value_type = Option<DocumentId>)]
    pub id: Option<String>,
    #[schema(value_type = Fields)]
    pub data: Map<String, Value>,
}

/// Change fields: `set`, `unset`, `inc` (dotted paths allowed).
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"op": "update", "collection": "orders", "id": "order-1001", "if_version": 1, "set": {"status": "paid"}}))]
pub struct UpdateAction {
    #[schema(inline)]
    pub op: UpdateOp,
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
    #[serde(default, deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    pub if_version: Option<i64>,
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

/// Replace all fields.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"op": "replace", "collection": "orders", "id": "order-1001", "data": {"total": 45}}))]
pub struct ReplaceAction {
    #[schema(inline)]
    pub op: ReplaceOp,
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
    #[serde(default, deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    pub if_version: Option<i64>,
    #[schema(value_type = Fields)]
    pub data: Map<String, Value>,
}

/// Delete, leaving a tombstone.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"op": "delete", "collection": "orders", "id": "order-1001", "if_version": 2}))]
pub struct DeleteAction {
    #[schema(inline)]
    pub op: DeleteOp,
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
    #[serde(default, deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    pub if_version: Option<i64>,
}

/// Write nothing, but hold the document at its version until commit.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"op": "check", "collection": "limits", "id": "daily", "if_version": 7}))]
pub struct CheckAction {
    #[schema(inline)]
    pub op: CheckOp,
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
    #[serde(default, deserialize_with = "integer")]
    #[schema(minimum = 1, maximum = 9223372036854775807_i64)]
    pub if_version: Option<i64>,
}

/// A webhook sent after the transaction commits.
#[derive(Deserialize, Serialize, ToSchema, Clone)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({"url": "https://example.com/hooks/order-paid", "headers": {"X-Tenant": "acme"}}))]
pub struct HookIn {
    #[serde(default = "default_method")]
    #[schema(value_type = Option<HookMethod>, nullable = false)]
    pub method: String,
    /// An http(s) URL the gateway's destination policy allows.
    #[schema(value_type = HookUrl)]
    pub url: String,
    #[serde(default)]
    #[schema(value_type = Option<HookHeaders>, nullable = false)]
    pub headers: BTreeMap<String, String>,
    /// The body to send; the commit summary when absent.
    #[schema(value_type = Option<AnyValue>)]
    pub body: Option<Value>,
}

/// A hook's HTTP method.
#[derive(ToSchema)]
#[allow(dead_code)]
pub enum HookMethod {
    #[schema(rename = "POST")]
    Post,
    #[schema(rename = "PUT")]
    Put,
    #[schema(rename = "PATCH")]
    Patch,
    #[schema(rename = "DELETE")]
    Delete,
    #[schema(rename = "GET")]
    Get,
}

fn default_method() -> String {
    "POST".into()
}

impl HookIn {
    fn into_hook(self) -> Hook {
        let mut body = self.body;
        if let Some(body) = &mut body {
            rules::storable_numbers(body);
        }
        Hook { method: self.method, url: self.url, headers: self.headers.into(), body }
    }
}

/// The answer once the commit point is passed.
#[derive(Serialize, ToSchema)]
pub struct CommittedOut {
    /// The transaction's id (a UUIDv7).
    pub id: String,
    /// Always `committed`.
    #[schema(value_type = CommittedStatus)]
    pub status: String,
    #[schema(format = DateTime, example = "2026-01-02T03:04:05.678Z")]
    pub committed_at: String,
    /// One per action, in order.
    pub results: Vec<ResultOut>,
    pub hooks: Vec<HookStateOut>,
}

/// The status of a committed transaction's answer.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum CommittedStatus {
    Committed,
}

#[derive(Serialize, ToSchema)]
pub struct ResultOut {
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
    /// The new version (the current one for `check`, the tombstone's for `delete`).
    #[schema(minimum = 1)]
    pub version: i64,
}

#[derive(Serialize, ToSchema)]
pub struct HookStateOut {
    /// `<transaction>:<index>`: the delivery id.
    pub id: String,
    #[schema(value_type = HookState)]
    pub status: String,
}

/// A hook's delivery state: `not_sent` when the transaction did not commit.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum HookState {
    Pending,
    Failed,
    Dead,
    Delivered,
    NotSent,
}

/// A transaction record.
#[derive(Serialize, ToSchema)]
pub struct TransactionOut {
    pub id: String,
    pub status: Status,
    #[schema(format = DateTime)]
    pub started_at: String,
    #[schema(format = DateTime)]
    pub expires_at: String,
    #[schema(format = DateTime)]
    pub committed_at: Option<String>,
    #[schema(format = DateTime)]
    pub finished_at: Option<String>,
    /// Why it was aborted: `wounded`, `expired`, `superseded`, `timed_out`, `operator`.
    pub abort_reason: Option<String>,
    pub idempotency_key: Option<String>,
    /// The request as sent.
    #[schema(value_type = AnyValue)]
    pub request: Value,
    pub actions: Vec<ActionStateOut>,
    pub hooks: Vec<HookStateOut>,
    /// Why it did not commit, when it did not: `code`, `detail`, and the
    /// members a failing transaction's problem carries.
    #[schema(value_type = Option<AnyObject>)]
    pub failure: Option<Value>,
}

#[derive(Serialize, ToSchema)]
pub struct ActionStateOut {
    #[schema(minimum = 0)]
    pub index: usize,
    #[schema(value_type = ActionKind)]
    pub op: String,
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
    /// The version the change was computed from, once known.
    pub base_version: Option<i64>,
    /// The version after the commit.
    pub version: Option<i64>,
    #[schema(value_type = ActionOutcome)]
    pub outcome: String,
}

/// An action's `op`.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum ActionKind {
    Insert,
    Update,
    Replace,
    Delete,
    Check,
}

/// What became of an action.
#[derive(ToSchema)]
#[schema(rename_all = "snake_case")]
#[allow(dead_code)]
pub enum ActionOutcome {
    Pending,
    Committed,
    Failed,
    NotApplied,
}

#[derive(Serialize, ToSchema)]
pub struct TransactionListOut {
    pub items: Vec<TransactionOut>,
    /// Cursor for `after=`; `null` on the last page.
    #[schema(value_type = Option<Cursor>)]
    pub next: Option<String>,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TransactionListQuery {
    /// Only those with this status (`pending`: not yet decided).
    #[param(value_type = Option<Status>)]
    pub status: Option<String>,
    /// Page size (default 50).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// The `next` cursor of the previous page.
    #[param(value_type = Option<Cursor>)]
    pub after: Option<String>,
}

#[derive(Deserialize, IntoParams)]
pub struct TransactionPath {
    /// Transaction id.
    #[param(min_length = 1, max_length = 256)]
    pub id: String,
}

const MAX_KEY_CHARS: usize = 255;

fn validate_hook(hook: &HookIn, i: usize, guard: &crate::hooks::guard::HookGuard) -> Result<(), ApiError> {
    let p = format!("/hooks/{i}");
    if !matches!(hook.method.as_str(), "POST" | "PUT" | "PATCH" | "DELETE" | "GET") {
        return Err(Invalid::new(format!("{p}/method"), "method must be POST, PUT, PATCH, DELETE or GET").into());
    }
    destination(&hook.url, &format!("{p}/url"), guard)?;
    for (name, value) in &hook.headers {
        if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() || HeaderValue::from_str(value).is_err() {
            return Err(Invalid::new(format!("{p}/headers/{name}"), "not a valid HTTP header").into());
        }
        if let Some(why) = crate::hooks::send::refused_header(name) {
            return Err(Invalid::new(format!("{p}/headers/{name}"), why).into());
        }
    }
    if let Some(body) = &hook.body {
        rules::check_body_depth(body, &format!("{p}/body"))?;
    }
    Ok(())
}

/// Longest destination URL.
const MAX_URL: usize = 2048;

/// Webhook destination `url` (at `pointer`), checked: an http(s) URL with
/// a host name of letters, digits, `-` and `.` (or an IP address) that the
/// destination guard allows.
pub fn destination(url: &str, pointer: &str, guard: &crate::hooks::guard::HookGuard) -> Result<url::Url, ApiError> {
    if url.len() > MAX_URL {
        return Err(Invalid::new(pointer, format!("a URL has at most {MAX_URL} characters")).into());
    }
    let bytes = url.as_bytes();
    let bad_escape = bytes.iter().enumerate().any(|(i, b)| {
        *b == b'%'
            && !(bytes.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && bytes.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if bad_escape {
        return Err(Invalid::new(pointer, "not a URL: '%' must start a percent-escape of two hex digits").into());
    }
    let parsed = url::Url::parse(url).map_err(|e| Invalid::new(pointer, format!("not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(Invalid::new(pointer, "the URL must be http or https with a host").into());
    }
    match parsed.host() {
        None => return Err(Invalid::new(pointer, "the URL must be http or https with a host").into()),
        Some(url::Host::Domain(name)) if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.') => {
            return Err(Invalid::new(pointer, "a host name has only letters, digits, '-' and '.'").into());
        }
        Some(_) => {}
    }
    if let Err(why) = guard.check_url(&parsed) {
        return Err(ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, ProblemCode::HookNotAllowed, why)
            .with("errors", json!([{"pointer": pointer, "detail": "destination not allowed"}])));
    }
    Ok(parsed)
}

/// Check the request and resolve it into a plan.
fn plan(input: TransactionIn, request: String, key: Option<String>, state: &AppState) -> Result<Plan, ApiError> {
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
            ActionIn::Insert(InsertAction { collection, id, data, .. }) => {
                let id = id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
                (collection, id, ActionOp::Insert(rules::user_data(&data, &format!("{p}/data"))?), None)
            }
            ActionIn::Update(UpdateAction { collection, id, if_version, set, unset, inc, .. }) => {
                let patch = Patch::parse(set.as_ref(), unset.as_deref(), inc.as_ref(), &p)?;
                (collection, id, ActionOp::Update(patch), check_version(if_version)?)
            }
            ActionIn::Replace(ReplaceAction { collection, id, if_version, data, .. }) => {
                let data = rules::user_data(&data, &format!("{p}/data"))?;
                (collection, id, ActionOp::Replace(data), check_version(if_version)?)
            }
            ActionIn::Delete(DeleteAction { collection, id, if_version, .. }) => {
                (collection, id, ActionOp::Delete, check_version(if_version)?)
            }
            ActionIn::Check(CheckAction { collection, id, if_version, .. }) => {
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
        request,
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
    params(("Idempotency-Key" = Option<IdempotencyKey>, Header, description = "Makes a retry safe: the same key and body answer the first outcome")),
    request_body(content = TransactionIn, content_type = "application/json"),
    responses(
        (status = 200, description = "Committed", body = CommittedOut,
            headers(("Idempotent-Replayed" = String, description = "`true` when this is the stored outcome of an earlier request with the key"))),
    )
)]
pub async fn create_transaction(
    State(state): State<AppState>,
    caller: Option<Extension<Caller>>,
    access: Access,
    headers: HeaderMap,
    JsonBody { value, .. }: JsonBody<Value>,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let hash = Fingerprint::of(&value);
    // Kept in the record as the request as sent, with the hooks' header
    // values (write-only) left out: the hooks themselves are kept whole.
    let request = crate::hooks::redact_request(&value).to_string();
    let input: TransactionIn = from_body(value, &["", "/actions/*", "/hooks/*"])?;
    let plan = plan(input, request, key.clone(), &state)?;
    // Every member within the key's collections, or nothing is done.
    for (i, action) in plan.actions.iter().enumerate() {
        let needed = if matches!(action.op, ActionOp::Check) { Scope::Read } else { Scope::Write };
        access.check(needed, &action.collection).map_err(|e| e.with("action", i))?;
    }
    let scoped = key.map(|k| format!("{}:{k}", caller.map_or_else(|| "-".to_owned(), |c| c.0.scope.clone())));
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
    hash: Fingerprint,
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
        // Records written before requests were kept redacted are redacted
        // here.
        request: serde_json::from_str(&rec.request)
            .map(|r| crate::hooks::redact_request(&r))
            .unwrap_or(Value::String(String::new())),
        actions,
        hooks,
        failure: rec.failure.as_ref().and_then(|f| serde_json::to_value(f).ok()),
    }
}

/// Transaction `id`, when the caller has `needed` on all its members'
/// collections.
async fn load(state: &AppState, id: &str, access: &Access, needed: Scope) -> Result<TxnRecord, ApiError> {
    let rec = state.engine.record(id).await?.ok_or_else(|| ApiError::not_found(format!("no transaction {id}")))?;
    access.check_all(needed, rec.members.iter().map(|m| m.collection.as_str()))?;
    Ok(rec)
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
    )
)]
pub async fn get_transaction(
    State(state): State<AppState>,
    access: Access,
    ApiPath(path): ApiPath<TransactionPath>,
) -> Result<axum::Json<TransactionOut>, ApiError> {
    let rec = load(&state, &path.id, &access, Scope::Read).await?;
    let deliveries = state.hooks.deliveries_of(&rec.id, rec.hook_count).await?;
    Ok(axum::Json(transaction_out(&rec, &deliveries)))
}

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
    params(TransactionListQuery),
    responses(
        (status = 200, description = "A page of transactions", body = TransactionListOut),
    )
)]
pub async fn list_transactions(
    State(state): State<AppState>,
    access: Access,
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
    // A key limited to some collections sees the transactions within them.
    for rec in items.iter().filter(|r| r.members.iter().all(|m| access.allows(Scope::Read, &m.collection))) {
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
    )
)]
pub async fn abort_transaction(
    State(state): State<AppState>,
    access: Access,
    ApiPath(path): ApiPath<TransactionPath>,
) -> Result<axum::Json<TransactionOut>, ApiError> {
    let rec = load(&state, &path.id, &access, Scope::Admin).await?;
    let rec = if rec.status == Status::Pending {
        state.engine.abort_pending(&rec.id, None, OPERATOR).await?.unwrap_or(rec)
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
