//! `ApiError`: every failure an HTTP client can see, rendered as RFC 9457
//! `application/problem+json` with a stable machine `code`. Layer errors are
//! mapped to HTTP here and nowhere else.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::Value;

use crate::clock::rfc3339;
use crate::document::rules::Invalid;
use crate::documents::DocError;
use crate::store::StoreError;
use crate::txn::commit::TxnError;
use crate::txn::record::{Failure, FailureCode};

pub(crate) const PROBLEM_JSON: &str = "application/problem+json";

macro_rules! problem_codes {
    ($($variant:ident => $name:literal, $status:literal, $family:ident, $doc:literal;)*) => {
        /// Every stable machine `code` a problem can carry.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
        pub enum ProblemCode {
            $(#[doc = $doc] #[serde(rename = $name)] $variant,)*
        }

        impl ProblemCode {
            /// Every code, for documentation and tests.
            pub const ALL: &[ProblemCode] = &[$(ProblemCode::$variant,)*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(ProblemCode::$variant => $name,)*
                }
            }

            /// The status a problem with this code is answered with (a
            /// transaction's failure is a 409 whatever its code).
            pub fn status(self) -> u16 {
                match self {
                    $(ProblemCode::$variant => $status,)*
                }
            }

            /// The problem schema a body with this code follows.
            pub fn family(self) -> Family {
                match self {
                    $(ProblemCode::$variant => Family::$family,)*
                }
            }

            /// What the code means, for the API description.
            pub fn describe(self) -> &'static str {
                match self {
                    $(ProblemCode::$variant => $doc,)*
                }
            }
        }
    };
}

problem_codes! {
    InvalidJson => "invalid_json", 400, Problem, "the body is not JSON";
    InvalidBody => "invalid_body", 400, Problem, "the body could not be read";
    InvalidHeader => "invalid_header", 400, Problem, "a header (`If-Match`, `If-None-Match`, `Idempotency-Key`) is malformed";
    InvalidPath => "invalid_path", 400, Problem, "a path parameter cannot be decoded";
    BadRequest => "bad_request", 400, Problem, "the request could not be understood";
    InvalidFilter => "invalid_filter", 400, ValidationFailed, "a query's `filter` or `sort` is outside the query language (an operator not supported, a path starting with `_` or `$`, a value that is not a scalar)";
    IndexRequired => "index_required", 400, IndexRequired, "no ready index serves the query exactly; `index` is the one that would (`PUT` it), absent when no index can; `declared` says when it is declared already but still building, or failed";
    CursorBeyondHead => "cursor_beyond_head", 400, Problem, "the event cursor is past the log's last position: no event has had it yet";
    Unauthorized => "unauthorized", 401, Problem, "no credential (API key or token), or an API key that is not valid";
    TokenMalformed => "token_malformed", 401, Problem, "the bearer token is not a JWT (three base64url segments of JSON), or is larger than 8 KiB";
    TokenExpired => "token_expired", 401, Problem, "the token's `exp` has passed (beyond the issuer's clock leeway): get a new one";
    TokenNotYetValid => "token_not_yet_valid", 401, Problem, "the token's `nbf` or `iat` is in the future (beyond the clock leeway)";
    TokenAudience => "token_audience", 401, Problem, "the token's `aud` names none of the issuer's configured audiences (an ID token, or a token for another API)";
    TokenIssuer => "token_issuer", 401, Problem, "the token's `iss` is not a configured issuer";
    TokenSignature => "token_signature", 401, Problem, "the token's signature does not verify with the issuer's key";
    TokenAlgorithm => "token_algorithm", 401, Problem, "the token's `alg` is `none`, not in the issuer's allow-list, or not one its key is for";
    TokenType => "token_type", 401, Problem, "the token's `typ` is neither `JWT` nor `at+jwt`";
    TokenHeader => "token_header", 401, Problem, "the token has a `crit` header: no extension is understood";
    TokenKey => "token_key", 401, Problem, "the issuer's key set holds no key with the token's `kid` (fetched again at most once per `keys_refetch_secs`)";
    TokenClaims => "token_claims", 401, Problem, "a claim the token needs (`exp`, `sub`, `iss`, `aud`) is missing or malformed";
    TicketInvalid => "ticket_invalid", 401, Problem, "the stream ticket is unknown, used already, past its 60 s, or for another stream: ask for a new one";
    Forbidden => "forbidden", 403, Problem, "the API key, or the user's roles, lack the scope (or, with no credentials configured, the `Host` is not a loopback name)";
    RuleDenied => "rule_denied", 403, ValidationFailed, "the collection's rules allow the caller no such write (a field outside a grant's `fields.write` or in its `set`, a document given away or taken over, an `_id` chosen without `choose_id`): `errors` names the field when one is to blame; `detail` says, per grant, why not";
    CrossOrigin => "cross_origin", 403, Problem, "with no API keys configured, a request that changes something came from a web page of another origin (`Origin` neither the gateway's own nor in `TXGATE_CORS_ORIGINS`, or `Sec-Fetch-Site: cross-site`)";
    NotFound => "not_found", 404, Problem, "never existed (or purged after its retention)";
    MethodNotAllowed => "method_not_allowed", 405, Problem, "the method is not allowed on this resource";
    AlreadyExists => "already_exists", 409, AlreadyExists, "a live document has this id";
    VersionConflict => "version_conflict", 409, VersionConflict, "the document is not at the expected version";
    Locked => "locked", 409, Locked, "a transaction held the document past the lock wait";
    Aborted => "aborted", 409, Aborted, "the transaction was aborted (wounded, expired, superseded, timed out, by an operator)";
    InProgress => "in_progress", 409, Problem, "the first request with this `Idempotency-Key` is still running";
    AlreadyCommitted => "already_committed", 409, Problem, "a committed transaction cannot be aborted";
    DeliveryPending => "delivery_pending", 409, Problem, "the delivery is queued or in flight already";
    Duplicate => "duplicate", 409, Duplicate, "a unique index holds the value for another document: `index` names the index, `existing` the document";
    SubscriptionLimit => "subscription_limit", 409, Problem, "the API key has as many subscriptions as it may (`TXGATE_MAX_SUBSCRIPTIONS_PER_KEY`); delete one first";
    SchemaLimit => "schema_limit", 409, Problem, "the collection declares as many schema versions as it may (32); delete one first";
    IndexLimit => "index_limit", 409, Problem, "the collection has as many indexes as it may (32); delete one first";
    IndexExists => "index_exists", 409, Problem, "an index of this name exists with another definition (or is being dropped), or another index is on the same fields; delete it first";
    BackupUnsupported => "backup_unsupported", 409, Problem, "this store has no online backup; use the database's own tools";
    BackupInProgress => "backup_in_progress", 409, Problem, "a backup is being written already; send the request again once it has finished";
    Deleted => "deleted", 410, Deleted, "the document is deleted (a tombstone)";
    CursorExpired => "cursor_expired", 410, Problem, "the events after this cursor are past their retention; start again without one";
    BaseUnavailable => "base_unavailable", 410, Problem, "the change-event log no longer holds the version a merge starts from (past the event retention)";
    RequestTimeout => "request_timeout", 408, Problem, "the request body did not arrive within the body timeout (`TXGATE_BODY_TIMEOUT_MS`)";
    PayloadTooLarge => "payload_too_large", 413, Problem, "the body is larger than the limit";
    UnsupportedMediaType => "unsupported_media_type", 415, Problem, "the body's `Content-Type` is not one this operation takes";
    ValidationFailed => "validation_failed", 422, ValidationFailed, "a name, id, field, value or parameter is not acceptable";
    DuplicateMember => "duplicate_member", 422, ValidationFailed, "one document appears twice in a transaction";
    SchemaViolation => "schema_violation", 422, SchemaViolation, "the document the write would produce does not satisfy its collection's schema for its `schema_version` (or the collection declares no schema for that version): `errors` lists each failure as the JSON pointer of the field in the document, the schema keyword that failed, and why; nothing is written";
    InvalidChange => "invalid_change", 422, Problem, "a change cannot apply to the document as it is (`inc` on a non-number)";
    IdempotencyKeyReused => "idempotency_key_reused", 422, ValidationFailed, "the `Idempotency-Key` was used with another body";
    HookNotAllowed => "hook_not_allowed", 422, ValidationFailed, "a hook destination is not allowed";
    DocumentRejected => "document_rejected", 422, ValidationFailed, "the store refused the document";
    InsufficientStorage => "insufficient_storage", 507, Problem, "a backup would leave less free space on the data's disk than the reserve (`TXGATE_BACKUP_RESERVE_MB`)";
    HeadersTooLarge => "headers_too_large", 431, Problem, "the request's header fields are larger or more numerous than the limit";
    Overloaded => "overloaded", 429, Problem, "too many requests are being served at once; retry after `Retry-After`";
    RateLimited => "rate_limited", 429, Problem, "the caller has used its request rate (`RateLimit-Policy`); retry after `Retry-After`";
    Internal => "internal", 500, Problem, "an internal error";
    RecordUnreadable => "record_unreadable", 500, Problem, "the stored record cannot be decoded (corrupt, nested beyond the limit, or not of a document's shape, as another tool could leave it); it is skipped by background work, lists and queries, and reported";
    IssuerUnavailable => "issuer_unavailable", 503, Problem, "the token's issuer's keys cannot be fetched and none are at hand; retry later";
    StoreUnavailable => "store_unavailable", 503, Problem, "the store cannot be reached; retry later";
    OutcomeUnknown => "outcome_unknown", 503, Problem, "the store stopped answering at the commit point; read the transaction to learn its outcome";
    NotReady => "not_ready", 503, Problem, "migrations are not applied yet";
}

/// The problem schemas of the API description: a body follows the one its
/// code belongs to, and carries that family's typed members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Problem,
    ValidationFailed,
    VersionConflict,
    Locked,
    Deleted,
    AlreadyExists,
    Aborted,
    IndexRequired,
    Duplicate,
    SchemaViolation,
}

impl Family {
    pub const ALL: &[Family] = &[
        Family::Problem,
        Family::ValidationFailed,
        Family::VersionConflict,
        Family::Locked,
        Family::Deleted,
        Family::AlreadyExists,
        Family::Aborted,
        Family::IndexRequired,
        Family::Duplicate,
        Family::SchemaViolation,
    ];

    /// The schema's name in the API description.
    pub fn name(self) -> &'static str {
        match self {
            Family::Problem => "Problem",
            Family::ValidationFailed => "ValidationFailed",
            Family::VersionConflict => "VersionConflict",
            Family::Locked => "Locked",
            Family::Deleted => "Deleted",
            Family::AlreadyExists => "AlreadyExists",
            Family::Aborted => "Aborted",
            Family::IndexRequired => "IndexRequired",
            Family::Duplicate => "Duplicate",
            Family::SchemaViolation => "SchemaViolation",
        }
    }

    pub fn codes(self) -> impl Iterator<Item = ProblemCode> {
        ProblemCode::ALL.iter().copied().filter(move |c| c.family() == self)
    }
}

impl From<FailureCode> for ProblemCode {
    fn from(code: FailureCode) -> Self {
        match code {
            FailureCode::VersionConflict => ProblemCode::VersionConflict,
            FailureCode::NotFound => ProblemCode::NotFound,
            FailureCode::Deleted => ProblemCode::Deleted,
            FailureCode::AlreadyExists => ProblemCode::AlreadyExists,
            FailureCode::Locked => ProblemCode::Locked,
            FailureCode::Aborted => ProblemCode::Aborted,
            FailureCode::InvalidChange => ProblemCode::InvalidChange,
            FailureCode::SchemaViolation => ProblemCode::SchemaViolation,
        }
    }
}

/// RFC 9457 problem details; the API description's problem schemas are
/// built in `contract.rs` from the codes' families.
#[derive(Serialize)]
pub(crate) struct Problem {
    /// URI naming the problem type: `urn:txgate:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable machine-readable code (`not_found`, `version_conflict`, ...).
    pub code: String,
    /// The members of the code's family (`expected`, `actual`,
    /// `transaction`, `version`, `errors`, ...).
    #[serde(flatten)]
    pub members: Members,
}

/// The members a problem carries beyond RFC 9457's, each typed as the API
/// description's problem schemas (`problems.rs`) describe it; a member
/// left `None` is not in the body.
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Members {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub transaction: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retryable: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub action: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub required_scope: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub collection: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actual: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<i64>,
    /// `Some(None)`: a tombstone whose time is not known (`null`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<Option<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<IndexMember>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub declared: Option<Declared>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub existing: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<FieldError>>,
    /// For `schema_violation`: the schema version the document was checked against.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub schema_version: Option<i64>,
    /// A version conflict's explanation: the document as it is now
    /// (`null`: it does not exist), the changes after the expected version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changes_truncated: Option<bool>,
}

/// One refused part of a request: its JSON pointer, and why.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct FieldError {
    pub pointer: String,
    /// For `schema_violation`: the schema keyword that failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyword: Option<String>,
    pub detail: String,
}

/// Schema violations as a problem's `errors`.
pub(crate) fn schema_errors(violations: &[crate::schemas::Violation]) -> Vec<FieldError> {
    violations
        .iter()
        .map(|v| FieldError { pointer: v.pointer.clone(), keyword: Some(v.keyword.clone()), detail: v.detail.clone() })
        .collect()
}

/// The index a problem names: a unique index by name (`duplicate`), or the
/// one a query needs (`index_required`).
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum IndexMember {
    Name(String),
    Index { name: String, fields: Vec<String>, unique: bool },
}

/// For `index_required`: the declared index that will serve, or would have.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Declared {
    pub name: String,
    pub state: &'static str,
    /// A building index's progress (`null` before it starts).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Option<crate::indexes::Progress>>,
    /// A failed build's reason (`null` when none was kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Option<String>>,
}

/// An error answered to the client.
#[derive(Debug)]
pub(crate) struct ApiError {
    /// The status answered: the code's own, except where a layer answers
    /// otherwise ([`ApiError::with_status`]).
    status: StatusCode,
    pub code: ProblemCode,
    pub detail: String,
    pub members: Members,
    pub retry_after: Option<Duration>,
}

impl ApiError {
    /// A problem with `code`, answered with the code's status.
    pub(crate) fn new(code: ProblemCode, detail: impl Into<String>) -> Self {
        let status = StatusCode::from_u16(code.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Self::with_status(status, code, detail)
    }

    /// A problem with `code` answered with another status: a transaction's
    /// failure (a 409 whatever its member's code), or a status the
    /// framework chose (an unknown route, a method not allowed).
    pub(crate) fn with_status(status: StatusCode, code: ProblemCode, detail: impl Into<String>) -> Self {
        Self { status, code, detail: detail.into(), members: Members::default(), retry_after: None }
    }

    /// The status this problem is answered with.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// The transaction the problem concerns.
    pub(crate) fn transaction(mut self, id: impl Into<String>) -> Self {
        self.members.transaction = Some(id.into());
        self
    }

    /// The index of the action of a transaction the problem is about.
    pub(crate) fn action(mut self, i: usize) -> Self {
        self.members.action = Some(i64::try_from(i).unwrap_or(i64::MAX));
        self
    }

    /// The document the problem is about.
    pub(crate) fn document(mut self, collection: impl Into<String>, id: impl Into<String>) -> Self {
        self.members.collection = Some(collection.into());
        self.members.id = Some(id.into());
        self
    }

    /// 403 `rule_denied`: the collection's rules allow no such write;
    /// `pointer` names the field to blame, if one is.
    pub(crate) fn rule_denied(detail: String, pointer: Option<String>) -> Self {
        let err = Self::new(ProblemCode::RuleDenied, detail.clone());
        match pointer {
            Some(pointer) => err.pointer(pointer, detail),
            None => err,
        }
    }

    /// 422 `schema_violation`: every way the document fails its schema.
    pub(crate) fn schema_violation(refusal: &crate::schemas::Refusal) -> Self {
        let mut err =
            Self::new(ProblemCode::SchemaViolation, refusal.to_string()).errors(schema_errors(&refusal.violations));
        err.members.collection = Some(refusal.collection.clone());
        err.members.schema_version = Some(refusal.schema_version);
        err
    }

    /// One refused part of the request, at `pointer`.
    pub(crate) fn pointer(self, pointer: impl Into<String>, detail: impl Into<String>) -> Self {
        self.errors(vec![FieldError { pointer: pointer.into(), keyword: None, detail: detail.into() }])
    }

    /// The index the problem names.
    pub(crate) fn index(mut self, index: IndexMember) -> Self {
        self.members.index = Some(index);
        self
    }

    /// The refused parts of the request.
    pub(crate) fn errors(mut self, errors: Vec<FieldError>) -> Self {
        self.members.errors = Some(errors);
        self
    }

    pub(crate) fn bad_request(code: ProblemCode, detail: impl Into<String>) -> Self {
        Self::with_status(StatusCode::BAD_REQUEST, code, detail)
    }

    /// 422 for a request that parsed but is not acceptable.
    pub(crate) fn invalid(invalid: Invalid) -> Self {
        Self::new(ProblemCode::ValidationFailed, invalid.to_string()).pointer(invalid.pointer, invalid.message)
    }

    pub(crate) fn not_found(detail: impl Into<String>) -> Self {
        Self::new(ProblemCode::NotFound, detail)
    }

    pub(crate) fn store(err: &StoreError) -> Self {
        match err {
            StoreError::Unavailable(msg) => {
                tracing::warn!(error = %msg, "store unavailable");
                Self::new(ProblemCode::StoreUnavailable, "the store is unreachable; retry later")
                    .retry(Duration::from_secs(1))
            }
            StoreError::Rejected(msg) => {
                Self::new(ProblemCode::DocumentRejected, format!("the store refused the document: {msg}"))
            }
            StoreError::Internal(msg) => Self::internal(format!("store: {msg}")),
            StoreError::Undecodable(msg) => {
                tracing::error!(error = %msg, "a stored record cannot be decoded");
                Self::new(
                    ProblemCode::RecordUnreadable,
                    "the stored record cannot be decoded; an operator must repair or remove it",
                )
            }
            StoreError::Duplicate(index) => Self::internal(format!("store: duplicate key in {index}")),
        }
    }

    /// 500 for a bug or corrupted data: logged here, nothing internal in the body.
    pub(crate) fn internal(msg: impl std::fmt::Display) -> Self {
        tracing::error!(error = %msg, "internal error");
        Self::new(ProblemCode::Internal, "internal error")
    }

    pub(crate) fn retry(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    /// The problem+json body (what is answered, and what an
    /// Idempotency-Key stores for replay).
    pub(crate) fn body(&self) -> Value {
        let problem = Problem {
            kind: format!("urn:txgate:problem:{}", self.code.as_str()),
            title: self.status.canonical_reason().unwrap_or("Error").to_owned(),
            status: self.status.as_u16(),
            detail: self.detail.clone(),
            code: self.code.as_str().to_owned(),
            members: self.members.clone(),
        };
        serde_json::to_value(problem).expect("a problem serializes")
    }

    /// A transaction failure: the failing action, `retryable`, and
    /// Retry-After exactly when retrying can help.
    fn failure(status: StatusCode, txn: String, f: Failure) -> Self {
        let mut err = Self::with_status(status, f.code.into(), f.detail).transaction(txn);
        err.members = Members {
            retryable: Some(f.retryable),
            action: f.action,
            expected: f.expected,
            actual: f.actual,
            collection: f.collection,
            id: f.id,
            holder: f.holder,
            reason: f.reason,
            schema_version: f.schema_version,
            errors: (!f.errors.is_empty()).then(|| schema_errors(&f.errors)),
            ..err.members
        };
        if f.retryable { err.retry(Duration::from_secs(1)) } else { err }
    }
}

impl From<TxnError> for ApiError {
    fn from(err: TxnError) -> Self {
        Self::from_txn(&err)
    }
}

impl ApiError {
    /// The answer for a transaction that did not commit.
    pub(crate) fn from_txn(err: &TxnError) -> Self {
        match err {
            TxnError::Aborted { txn, failure } => Self::failure(StatusCode::CONFLICT, txn.clone(), failure.clone()),
            TxnError::InvalidChange { txn, failure } => {
                Self::failure(StatusCode::UNPROCESSABLE_ENTITY, txn.clone(), failure.clone())
            }
            TxnError::Store { txn, source } => Self::store(source).transaction(txn.clone()),
            TxnError::OutcomeUnknown { txn } => Self::new(
                ProblemCode::OutcomeUnknown,
                "the store stopped answering at the commit point; read the transaction to learn its outcome",
            )
            .transaction(txn.clone())
            .retry(Duration::from_secs(1)),
        }
    }
}

impl From<crate::hooks::guard::Refused> for ApiError {
    fn from(refused: crate::hooks::guard::Refused) -> Self {
        match refused {
            crate::hooks::guard::Refused::Invalid(invalid) => Self::invalid(invalid),
            crate::hooks::guard::Refused::NotAllowed { pointer, why } => {
                Self::new(ProblemCode::HookNotAllowed, why).pointer(pointer, "destination not allowed")
            }
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(err: StoreError) -> Self {
        Self::store(&err)
    }
}

impl From<Invalid> for ApiError {
    fn from(err: Invalid) -> Self {
        Self::invalid(err)
    }
}

impl From<DocError> for ApiError {
    fn from(err: DocError) -> Self {
        let detail = err.to_string();
        match err {
            DocError::Invalid(invalid) => Self::invalid(invalid),
            DocError::NotFound => Self::not_found(detail),
            DocError::Deleted { version, deleted_at } => {
                let mut err = Self::new(ProblemCode::Deleted, detail);
                err.members.version = Some(version);
                err.members.deleted_at = Some(deleted_at.map(rfc3339));
                err
            }
            DocError::AlreadyExists { version } => {
                let mut err = Self::new(ProblemCode::AlreadyExists, detail);
                err.members.version = Some(version);
                err
            }
            DocError::VersionConflict { expected, actual } => {
                let mut err = Self::new(ProblemCode::VersionConflict, detail);
                (err.members.expected, err.members.actual) = (Some(expected), Some(actual));
                err
            }
            DocError::Locked { holder, retry_after } => {
                Self::new(ProblemCode::Locked, detail).transaction(holder).retry(retry_after)
            }
            DocError::InvalidChange(msg) => Self::new(ProblemCode::InvalidChange, msg),
            // Under rules the other document is not named.
            DocError::Duplicate { index, existing } if existing.is_empty() => {
                let detail = format!("the value of unique index {index} is held by another document");
                Self::new(ProblemCode::Duplicate, detail).index(IndexMember::Name(index))
            }
            DocError::Duplicate { index, existing } => {
                let mut err = Self::new(ProblemCode::Duplicate, detail);
                err.members.index = Some(IndexMember::Name(index));
                err.members.existing = Some(existing);
                err
            }
            DocError::Denied { detail, pointer } => Self::rule_denied(detail, pointer),
            DocError::Schema(refusal) => Self::schema_violation(&refusal),
            DocError::Store(err) => Self::store(&err),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(code: FailureCode, retryable: bool) -> Failure {
        Failure { action: Some(0), ..Failure::new(code, "d", retryable) }
    }

    fn retry_after(err: ApiError) -> (bool, Value) {
        let body = err.body();
        (err.into_response().headers().contains_key(header::RETRY_AFTER), body)
    }

    #[test]
    fn retry_after_exactly_on_retryable_answers() {
        use FailureCode::*;
        for (code, retryable) in [
            (VersionConflict, false),
            (NotFound, false),
            (Deleted, false),
            (AlreadyExists, false),
            (Locked, true),
            (Aborted, true),
        ] {
            let err = ApiError::from(TxnError::Aborted { txn: "t".into(), failure: failure(code, retryable) });
            let (has, body) = retry_after(err);
            assert_eq!(has, retryable, "{code:?}");
            assert_eq!(body["retryable"], retryable);
            assert_eq!(body["code"], code.as_str());
        }
        let invalid = TxnError::InvalidChange { txn: "t".into(), failure: failure(InvalidChange, false) };
        assert!(!retry_after(invalid.into()).0);
        assert!(retry_after(TxnError::OutcomeUnknown { txn: "t".into() }.into()).0);
        let unavailable = StoreError::Unavailable("down".into());
        assert!(retry_after(TxnError::Store { txn: "t".into(), source: unavailable }.into()).0);
        assert!(!retry_after(StoreError::Internal("bug".into()).into()).0);
        assert!(!retry_after(DocError::VersionConflict { expected: 1, actual: 2 }.into()).0);
        assert!(!retry_after(DocError::AlreadyExists { version: 1 }.into()).0);
        assert!(!retry_after(DocError::NotFound.into()).0);
        assert!(retry_after(DocError::Locked { holder: "t".into(), retry_after: Duration::from_secs(5) }.into()).0);
        assert!(retry_after(DocError::Store(StoreError::Unavailable("down".into())).into()).0);
    }

    #[test]
    fn every_code_renders_its_urn() {
        for code in ProblemCode::ALL {
            let body = ApiError::new(*code, "x").body();
            assert_eq!(body["code"], code.as_str());
            assert_eq!(body["type"], format!("urn:txgate:problem:{}", code.as_str()));
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str(), "serde and as_str agree");
        }
    }
}
