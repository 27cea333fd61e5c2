//! `ApiError`: every failure an HTTP client can see, rendered as RFC 9457
//! `application/problem+json` with a stable machine `code`. Layer errors are
//! mapped to HTTP here and nowhere else.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::documents::DocError;
use crate::documents::rules::Invalid;
use crate::store::StoreError;
use crate::store::convert::rfc3339;

pub const PROBLEM_JSON: &str = "application/problem+json";

/// RFC 9457 problem details, as documented in the OpenAPI spec.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Problem {
    /// URI naming the problem type: `urn:txgate:problem:<code>`.
    #[serde(rename = "type")]
    pub kind: String,
    pub title: String,
    pub status: u16,
    pub detail: String,
    /// Stable machine-readable code (`not_found`, `version_conflict`, ...).
    pub code: String,
    /// Extra members depending on the code (`expected`, `actual`,
    /// `transaction`, `version`, `errors`, ...).
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub extra: Map<String, Value>,
}

/// An error answered to the client.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub detail: String,
    pub extra: Map<String, Value>,
    pub retry_after: Option<Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, detail: impl Into<String>) -> Self {
        Self { status, code, detail: detail.into(), extra: Map::new(), retry_after: None }
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        self.extra.insert(key.to_owned(), value.into());
        self
    }

    pub fn bad_request(code: &'static str, detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, detail)
    }

    /// 422 for a request that parsed but is not acceptable.
    pub fn invalid(invalid: Invalid) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "validation_failed", invalid.to_string())
            .with("errors", json!([{"pointer": invalid.pointer, "detail": invalid.message}]))
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", detail)
    }

    pub fn store(err: &StoreError) -> Self {
        match err {
            StoreError::Unavailable(msg) => {
                tracing::warn!(error = %msg, "store unavailable");
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", "the store is unreachable; retry later")
                    .retry(Duration::from_secs(1))
            }
            StoreError::Rejected(msg) => Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "document_rejected",
                format!("the store refused the document: {msg}"),
            ),
            StoreError::Internal(msg) => Self::internal(format!("store: {msg}")),
        }
    }

    /// 500 for a bug or corrupted data: logged here, nothing internal in the body.
    pub fn internal(msg: impl std::fmt::Display) -> Self {
        tracing::error!(error = %msg, "internal error");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "internal error")
    }

    pub fn retry(mut self, after: Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    fn title(&self) -> &'static str {
        self.status.canonical_reason().unwrap_or("Error")
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
            DocError::Deleted { version, deleted_at } => Self::new(StatusCode::GONE, "deleted", detail)
                .with("version", version)
                .with("deleted_at", deleted_at.map(rfc3339)),
            DocError::AlreadyExists { version } => {
                Self::new(StatusCode::CONFLICT, "already_exists", detail).with("version", version)
            }
            DocError::VersionConflict { expected, actual } => {
                Self::new(StatusCode::CONFLICT, "version_conflict", detail)
                    .with("expected", expected)
                    .with("actual", actual)
            }
            DocError::Locked { holder, retry_after } => {
                Self::new(StatusCode::CONFLICT, "locked", detail).with("transaction", holder).retry(retry_after)
            }
            DocError::InvalidChange(msg) => Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid_change", msg),
            DocError::Store(err) => Self::store(&err),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let problem = Problem {
            kind: format!("urn:txgate:problem:{}", self.code),
            title: self.title().to_owned(),
            status: self.status.as_u16(),
            detail: self.detail,
            code: self.code.to_owned(),
            extra: self.extra,
        };
        let mut response = (self.status, axum::Json(problem)).into_response();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(after) = self.retry_after {
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }
}
