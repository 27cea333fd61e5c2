//! The wire shapes of `/v1/transactions`: the request a client sends, the
//! answers it gets, and a record as shown.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::{IntoParams, ToSchema};

use crate::clock::rfc3339;
use crate::document::rules;
use crate::hooks::{Delivery, Hook, delivery_id};
use crate::http::contract::{
    AnyObject, AnyValue, Collection, DocumentId, Fields, HookHeaders, HookUrl, IncFields, SetFields, UnsetFields,
};
use crate::http::extract::{integer, nested, present, read_nested};
use crate::http::paging::{Listed, Page};
use crate::txn::record::{Status, TxnRecord};

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
pub(crate) struct TransactionIn {
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
            pub(crate) enum $tag {
                #[serde(rename = $op)]
                #[schema(rename = $op)]
                Tag,
            }
        )*

        /// One action, chosen by `op`. `if_version` (optional) makes the
        /// transaction fail unless the document is at that version.
        pub(crate) enum ActionIn {
            $($variant($action),)*
        }

        impl ActionIn {
            /// Every action's `op` and schema name.
            const KINDS: &[(&str, &str)] = &[$(($op, stringify!($action)),)*];

            /// The action `value` is, read as `op`'s (errors as
            /// [`read_nested`] gives them).
            fn parse(op: &str, value: Value) -> Option<Result<Self, String>> {
                match op {
                    $($op => Some(read_nested::<$action>(value).map(ActionIn::$variant)),)*
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
        // Errors about `op` point at it, as `read_nested` gives them.
        let at_op = |detail: String| D::Error::custom(nested("/op", detail));
        let op = match map.get("op") {
            Some(Value::String(op)) => op.clone(),
            Some(_) => return Err(at_op("must be a string".into())),
            None => return Err(D::Error::missing_field("op")),
        };
        match ActionIn::parse(&op, Value::Object(map)) {
            Some(parsed) => parsed.map_err(D::Error::custom),
            None => {
                let ops: Vec<&str> = ActionIn::KINDS.iter().map(|(op, _)| *op).collect();
                Err(at_op(format!("unknown op {op:?}, expected one of {}", ops.join(", "))))
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
pub(crate) struct InsertAction {
    #[schema(inline)]
    #[allow(dead_code, reason = "the wire's discriminator: `ActionIn` reads it first")]
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
pub(crate) struct UpdateAction {
    #[schema(inline)]
    #[allow(dead_code, reason = "the wire's discriminator: `ActionIn` reads it first")]
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
pub(crate) struct ReplaceAction {
    #[schema(inline)]
    #[allow(dead_code, reason = "the wire's discriminator: `ActionIn` reads it first")]
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
pub(crate) struct DeleteAction {
    #[schema(inline)]
    #[allow(dead_code, reason = "the wire's discriminator: `ActionIn` reads it first")]
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
pub(crate) struct CheckAction {
    #[schema(inline)]
    #[allow(dead_code, reason = "the wire's discriminator: `ActionIn` reads it first")]
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
pub(crate) struct HookIn {
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, ToSchema)]
pub(crate) enum HookMethod {
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
    HookMethod::Post.as_str().into()
}

impl HookMethod {
    const ALL: [HookMethod; 5] =
        [HookMethod::Post, HookMethod::Put, HookMethod::Patch, HookMethod::Delete, HookMethod::Get];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            HookMethod::Post => "POST",
            HookMethod::Put => "PUT",
            HookMethod::Patch => "PATCH",
            HookMethod::Delete => "DELETE",
            HookMethod::Get => "GET",
        }
    }

    /// The method `name` names, if a hook may use it.
    pub(crate) fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

impl From<crate::hooks::DeliveryStatus> for HookState {
    fn from(status: crate::hooks::DeliveryStatus) -> Self {
        use crate::hooks::DeliveryStatus;
        match status {
            DeliveryStatus::Pending => HookState::Pending,
            DeliveryStatus::Failed => HookState::Failed,
            DeliveryStatus::Dead => HookState::Dead,
            DeliveryStatus::Delivered => HookState::Delivered,
        }
    }
}

impl From<crate::document::StagedOp> for ActionKind {
    fn from(op: crate::document::StagedOp) -> Self {
        use crate::document::StagedOp;
        match op {
            StagedOp::Insert => ActionKind::Insert,
            StagedOp::Update => ActionKind::Update,
            StagedOp::Replace => ActionKind::Replace,
            StagedOp::Delete => ActionKind::Delete,
            StagedOp::Check => ActionKind::Check,
        }
    }
}

impl HookIn {
    pub(super) fn into_hook(self) -> Hook {
        let mut body = self.body;
        if let Some(body) = &mut body {
            rules::storable_numbers(body);
        }
        Hook { method: self.method, url: self.url, headers: self.headers.into(), body }
    }
}

pub(crate) use crate::txn::answer::{CommittedOut, HookState, HookStateOut};

/// A transaction record.
#[derive(Serialize, ToSchema)]
pub(crate) struct TransactionOut {
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
pub(crate) struct ActionStateOut {
    #[schema(minimum = 0)]
    pub index: usize,
    #[schema(value_type = ActionKind)]
    pub op: ActionKind,
    #[schema(value_type = Collection)]
    pub collection: String,
    #[schema(value_type = DocumentId)]
    pub id: String,
    /// The version the change was computed from, once known.
    pub base_version: Option<i64>,
    /// The version after the commit.
    pub version: Option<i64>,
    #[schema(value_type = ActionOutcome)]
    pub outcome: ActionOutcome,
}

/// An action's `op`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(rename_all = "snake_case")]
pub(crate) enum ActionKind {
    Insert,
    Update,
    Replace,
    Delete,
    Check,
}

/// What became of an action.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[schema(rename_all = "snake_case")]
pub(crate) enum ActionOutcome {
    Pending,
    Committed,
    Failed,
    NotApplied,
}

/// A page of transactions.
pub(crate) type TransactionListOut = Page<TransactionOut>;

impl Listed for TransactionOut {
    const PAGE: &'static str = "TransactionListOut";
}

/// The filter of the transaction list (its page: [`ListQuery`](crate::http::paging::ListQuery)).
#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct TransactionFilter {
    /// Only those with this status (`pending`: not yet decided).
    #[param(value_type = Option<Status>)]
    pub status: Option<String>,
}

#[derive(Deserialize, IntoParams)]
pub(crate) struct TransactionPath {
    /// Transaction id.
    #[param(min_length = 1, max_length = 256)]
    pub id: String,
}

/// `rec` as shown; `urls`: whether its hooks' URLs are shown whole (to a
/// key that may write every collection of it), or with their credentials
/// and query strings redacted.
pub(super) fn transaction_out(rec: &TxnRecord, deliveries: &[Option<Delivery>], urls: bool) -> TransactionOut {
    let committed = rec.status.is_committed();
    let failed_action = rec.failure.as_ref().and_then(|f| f.action);
    let actions = rec
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let version = rec.results.as_ref().and_then(|r| r.get(i)).map(|r| r.version);
            let outcome = if committed {
                ActionOutcome::Committed
            } else if failed_action == Some(i as i64) {
                ActionOutcome::Failed
            } else if rec.status == Status::Pending {
                ActionOutcome::Pending
            } else {
                ActionOutcome::NotApplied
            };
            ActionStateOut {
                index: i,
                op: ActionKind::from(m.op),
                collection: m.collection.clone(),
                id: m.id.clone(),
                base_version: m.base_v,
                version,
                outcome,
            }
        })
        .collect();
    let hooks = (0..rec.hook_count as usize)
        .map(|i| HookStateOut {
            id: delivery_id(&rec.id, i),
            status: match deliveries.get(i).and_then(Option::as_ref) {
                Some(d) => HookState::from(d.status),
                None if committed => HookState::Pending,
                None => HookState::NotSent,
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
            .map(|r| {
                let mut r = crate::hooks::redact_request(&r);
                if !urls {
                    crate::hooks::redact_request_urls(&mut r);
                }
                r
            })
            .unwrap_or(Value::String(String::new())),
        actions,
        hooks,
        failure: rec.failure.as_ref().and_then(|f| serde_json::to_value(f).ok()),
    }
}
