//! The problems each operation can answer ([`Problems`], declared beside
//! its handler with [`problems!`]): one problem schema per [`Family`],
//! built from [`ProblemCode`], and the responses that carry them, with an
//! example and `Retry-After` where retrying helps.

use serde_json::{Value, json};
use utoipa::openapi::RefOr;

use super::error::{Family, ProblemCode};

/// A problem schema: the RFC 9457 members, the members that name a
/// transaction's failing action, and the family's own.
pub(super) fn problem_schema(family: Family) -> Value {
    let codes: Vec<ProblemCode> = family.codes().collect();
    let described: Vec<String> = codes.iter().map(|c| format!("- `{}`: {}", c.as_str(), c.describe())).collect();
    let mut properties = json!({
        "type": {"type": "string", "format": "uri", "description": "`urn:txgate:problem:<code>`", "examples": ["urn:txgate:problem:not_found"]},
        "title": {"type": "string", "description": "The status's reason phrase."},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string", "description": "What went wrong, for a person."},
        "code": {
            "type": "string",
            "enum": codes.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
            "description": format!("Stable machine-readable code:\n{}", described.join("\n")),
        },
        "transaction": {"type": "string", "description": "The transaction the problem concerns: the one that failed, or for `locked` on a single document the one holding it."},
        "retryable": {"type": "boolean", "description": "For a transaction's failure: whether sending it again can succeed (then `Retry-After` is set)."},
        "action": {"type": "integer", "minimum": 0, "description": "For a transaction's failure: the index of the failing action."},
        "collection": {"$ref": "#/components/schemas/Collection"},
        "id": {"$ref": "#/components/schemas/DocumentId"},
        "expected": {"type": "integer", "format": "int64", "description": "The version the request expected (`If-Match`, `if_version`)."},
        "actual": {"type": "integer", "format": "int64", "description": "The version the document is at (absent: it does not exist)."},
    });
    let own = match family {
        Family::Problem => json!({}),
        Family::ValidationFailed => json!({
            "errors": {
                "type": "array",
                "description": "Each refused part of the request.",
                "items": {
                    "type": "object",
                    "required": ["pointer", "detail"],
                    "properties": {
                        "pointer": {"type": "string", "description": "JSON pointer into the request (`/path/<name>` and `/query/<name>` for parameters)."},
                        "detail": {"type": "string"},
                    },
                },
            },
        }),
        Family::VersionConflict => json!({
            "current": {
                "description": "The document as it is now (null: deleted), for a key that may read it; absent with `Prefer: return=minimal`.",
                "anyOf": [{"$ref": "#/components/schemas/DocumentOut"}, {"type": "null"}],
            },
            "changes": {
                "type": "array",
                "maxItems": crate::conflicts::MAX_CHANGES,
                "description": "One entry per version after `expected`, oldest first, from the change-event log while it holds them (the latest 50 at most); absent with `Prefer: return=minimal`.",
                "items": {"$ref": "#/components/schemas/ChangeOut"},
            },
            "changes_truncated": {"type": "boolean", "description": "`true` when `changes` does not hold every version after `expected` (the log no longer holds some, there were more than 50, or they took more than 16 MiB to read)."},
        }),
        Family::Locked => json!({
            "holder": {"type": "string", "description": "For a transaction's failure: the transaction holding the document."},
        }),
        Family::Deleted => json!({
            "version": {"type": "integer", "format": "int64", "description": "The tombstone's version; creating the id again continues from it."},
            "deleted_at": {"type": ["string", "null"], "format": "date-time"},
        }),
        Family::AlreadyExists => json!({
            "version": {"type": "integer", "format": "int64", "description": "The live document's version."},
        }),
        Family::IndexRequired => json!({
            "index": {
                "type": "object",
                "description": "The index that would serve the query: `PUT` it to `/v1/collections/{collection}/indexes/{name}` as it is.",
                "required": ["name", "fields", "unique"],
                "properties": {
                    "name": {"type": "string"},
                    "fields": {"type": "array", "items": {"type": "string"}},
                    "unique": {"type": "boolean"},
                },
            },
            "declared": {
                "type": "object",
                "description": "When an index of the collection that would serve the query is declared but not ready: its name and state, `building` (with its `progress`; the query is served once it is `ready`) or `failed` (with the `reason`; delete it and declare it again once the documents are changed). `index` is then that index.",
                "required": ["name", "state"],
                "properties": {
                    "name": {"type": "string"},
                    "state": {"type": "string", "enum": ["building", "failed"]},
                    "progress": {
                        "type": ["object", "null"],
                        "properties": {
                            "phase": {"type": "string"},
                            "done": {"type": "integer", "format": "int64"},
                            "total": {"type": "integer", "format": "int64"},
                        },
                    },
                    "reason": {"type": ["string", "null"]},
                },
            },
        }),
        Family::Duplicate => json!({
            "index": {"type": "string", "description": "The unique index holding the value."},
            "existing": {"$ref": "#/components/schemas/DocumentId"},
        }),
        Family::SchemaViolation => json!({
            "errors": {
                "type": "array",
                "description": "Each way the document fails the schema (the first 50): where, which keyword, and why.",
                "items": {
                    "type": "object",
                    "required": ["pointer", "keyword", "detail"],
                    "properties": {
                        "pointer": {"type": "string", "description": "JSON pointer of the offending field in the document (for a missing required field, where it would be; `\"\"` for the document itself)."},
                        "keyword": {"type": "string", "description": "The schema keyword that failed (`type`, `required`, `minimum`, `pattern`, `format`, …; `schema_version` when the collection declares no schema for the version)."},
                        "detail": {"type": "string"},
                    },
                },
            },
            "schema_version": {"type": "integer", "format": "int64", "description": "The schema version the document was checked against."},
        }),
        Family::Aborted => json!({
            "reason": {"type": "string", "description": "`wounded`, `expired`, `superseded`, `timed_out` or `operator`."},
            "holder": {"type": "string", "description": "The transaction that wounded this one, when known."},
        }),
    };
    let props = properties.as_object_mut().expect("an object");
    props.extend(own.as_object().expect("an object").clone());
    let mut required = vec!["type", "title", "status", "detail", "code"];
    if family == Family::VersionConflict {
        required.extend(["expected", "actual"]);
    }
    if family == Family::SchemaViolation {
        required.extend(["errors", "schema_version"]);
    }
    let example_code = codes[0];
    json!({
        "type": "object",
        "description": format!("Problem details (RFC 9457, `application/problem+json`) with the codes:\n{}", described.join("\n")),
        "required": required,
        "properties": properties,
        "additionalProperties": true,
        "examples": [problem_example(example_code)],
    })
}

fn problem_example(code: ProblemCode) -> Value {
    let status = axum::http::StatusCode::from_u16(code.status()).expect("a status");
    let mut example = json!({
        "type": format!("urn:txgate:problem:{}", code.as_str()),
        "title": status.canonical_reason().unwrap_or("Error"),
        "status": code.status(),
        "detail": code.describe(),
        "code": code.as_str(),
    });
    let extra = match code {
        ProblemCode::VersionConflict => json!({
            "expected": 3, "actual": 4, "collection": "orders", "id": "o-1",
            "current": {"collection": "orders", "id": "o-1", "version": 4, "schema_version": 1,
                "created_at": "2026-01-02T03:04:05.678Z", "updated_at": "2026-01-02T03:09:00.000Z",
                "data": {"status": "shipped", "total": 45}},
            "changes": [{"version": 4, "type": "document.updated", "at": "2026-01-02T03:09:00.000Z",
                "transaction": null, "key": "warehouse", "added": [], "removed": [], "changed": ["status"]}],
            "changes_truncated": false,
        }),
        ProblemCode::Locked => json!({"transaction": "0193f3c4-7d2e-7c1a-9b4e-3f5d2a1c0b9e"}),
        ProblemCode::Deleted => json!({"version": 5, "deleted_at": "2026-01-02T03:04:05.678Z"}),
        ProblemCode::AlreadyExists => json!({"version": 2}),
        ProblemCode::Duplicate => json!({"index": "email", "existing": "user-17"}),
        ProblemCode::IndexRequired => {
            json!({"index": {"name": "status_amount", "fields": ["status", "-amount"], "unique": false}})
        }
        ProblemCode::Aborted => {
            json!({"transaction": "0193f3c4-7d2e-7c1a-9b4e-3f5d2a1c0b9e", "retryable": true, "reason": "wounded"})
        }
        ProblemCode::ValidationFailed => {
            json!({"errors": [{"pointer": "/path/collection", "detail": "must match ^[a-zA-Z][a-zA-Z0-9_-]{0,63}$"}]})
        }
        ProblemCode::SchemaViolation => json!({
            "collection": "orders", "schema_version": 1,
            "errors": [
                {"pointer": "/total", "keyword": "minimum", "detail": "value is less than the minimum of 0"},
                {"pointer": "/customer", "keyword": "required", "detail": "\"customer\" is required"},
            ],
        }),
        _ => json!({}),
    };
    example.as_object_mut().expect("an object").extend(extra.as_object().expect("an object").clone());
    example
}

/// Whether a problem with this code comes with `Retry-After`.
fn retry_after(code: ProblemCode) -> bool {
    use ProblemCode::*;
    matches!(
        code,
        Locked
            | Aborted
            | InProgress
            | Overloaded
            | RateLimited
            | StoreUnavailable
            | OutcomeUnknown
            | IssuerUnavailable
    )
}

/// The problems one operation can answer, declared beside its handler
/// with [`problems!`] and named in its `responses(...)`. Added to what it
/// declares: 431 on every operation (every request's head is bounded),
/// the body's problems where it reads one, and 401, 403, 429 and 503 where
/// it needs a credential.
#[derive(Clone, Copy)]
pub(crate) struct Problems {
    codes: &'static [ProblemCode],
    /// A transaction's failures: a 409 whatever the code's own status.
    failures: &'static [ProblemCode],
    body: bool,
    public: bool,
}

impl Problems {
    pub(crate) const fn of(codes: &'static [ProblemCode]) -> Self {
        Self { codes, failures: &[], body: false, public: false }
    }

    /// The operation reads a JSON body.
    pub(crate) const fn with_body(self) -> Self {
        Self { body: true, ..self }
    }

    /// What a transaction fails with, nothing applied: each a 409.
    pub(crate) const fn with_failures(self, failures: &'static [ProblemCode]) -> Self {
        Self { failures, ..self }
    }

    /// The operation is open without an API key.
    pub(crate) const fn public(self) -> Self {
        Self { public: true, ..self }
    }

    /// Every (status, code) the operation can answer.
    pub(crate) fn answered(&self) -> Vec<(u16, ProblemCode)> {
        use ProblemCode::*;
        const BODY: &[ProblemCode] = &[InvalidJson, InvalidBody, RequestTimeout, PayloadTooLarge, UnsupportedMediaType];
        const KEYED: &[ProblemCode] = &[
            Unauthorized,
            TokenMalformed,
            TokenExpired,
            TokenNotYetValid,
            TokenAudience,
            TokenIssuer,
            TokenSignature,
            TokenAlgorithm,
            TokenType,
            TokenHeader,
            TokenKey,
            TokenClaims,
            Forbidden,
            Overloaded,
            RateLimited,
            StoreUnavailable,
            IssuerUnavailable,
        ];
        let body = if self.body { BODY } else { &[] };
        let keyed = if self.public { &[] } else { KEYED };
        let plain = [body, self.codes].concat().into_iter().map(|c| (c.status(), c));
        let failures = self.failures.iter().map(|c| (409, *c));
        let head = [HeadersTooLarge].into_iter().map(|c| (c.status(), c));
        plain.chain(failures).chain(head).chain(keyed.iter().map(|c| (c.status(), *c))).collect()
    }

    /// The responses of [`Problems::answered`], one per status.
    pub(crate) fn responses(&self) -> std::collections::BTreeMap<String, RefOr<utoipa::openapi::Response>> {
        let list = self.answered();
        let mut statuses: Vec<u16> = list.iter().map(|(s, _)| *s).collect();
        statuses.sort_unstable();
        statuses.dedup();
        statuses
            .into_iter()
            .map(|status| {
                let codes: Vec<ProblemCode> = list.iter().filter(|(s, _)| *s == status).map(|(_, c)| *c).collect();
                let response = serde_json::from_value(problem_response(&codes)).expect("a problem response");
                (status.to_string(), RefOr::T(response))
            })
            .collect()
    }
}

/// Declare the problems of one operation as a type its
/// `#[utoipa::path(responses(...))]` names:
/// `problems!(GetProblems = Problems::of(&[NotFound]));`.
macro_rules! problems {
    ($(#[$attr:meta])* $name:ident = $problems:expr) => {
        $(#[$attr])*
        pub(crate) struct $name;

        impl $name {
            #[allow(dead_code, reason = "read by the contract's tests")]
            pub(crate) const PROBLEMS: $crate::http::problems::Problems = {
                #[allow(unused_imports)]
                use $crate::http::error::ProblemCode::*;
                $problems
            };
        }

        impl utoipa::IntoResponses for $name {
            fn responses() -> std::collections::BTreeMap<String, utoipa::openapi::RefOr<utoipa::openapi::Response>> {
                Self::PROBLEMS.responses()
            }
        }
    };
}
pub(crate) use problems;

/// A response for the problems of one status.
pub(super) fn problem_response(codes: &[ProblemCode]) -> Value {
    let mut families: Vec<Family> = codes.iter().map(|c| c.family()).collect();
    families.sort();
    families.dedup();
    let reference = |f: Family| json!({"$ref": format!("#/components/schemas/{}", f.name())});
    // No `discriminator`: each family's `code` enum is its own, so exactly
    // one member matches; a mapping would list only this response's codes,
    // and generators (openapi-typescript) narrow the shared schema's `code`
    // to the first mapping they meet.
    let schema = if families.len() == 1 {
        reference(families[0])
    } else {
        json!({"oneOf": families.iter().map(|f| reference(*f)).collect::<Vec<_>>()})
    };
    let described: Vec<String> = codes.iter().map(|c| format!("`{}`: {}", c.as_str(), c.describe())).collect();
    let mut response = json!({
        "description": described.join("; "),
        "content": {"application/problem+json": {"schema": schema, "example": problem_example(codes[0])}},
    });
    if codes.iter().any(|c| retry_after(*c)) {
        // Written out here, a `$ref` in the finished document.
        let header =
            json!({"description": "Seconds to wait before retrying.", "schema": {"type": "integer", "minimum": 1}});
        response["headers"] = json!({"Retry-After": header});
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_is_answered_by_some_operation() {
        let doc: Value = serde_json::from_str(&crate::http::openapi_json()).expect("the API description");
        let mut answered = std::collections::HashSet::new();
        for item in doc["paths"].as_object().expect("paths").values() {
            for operation in item.as_object().expect("a path item").values() {
                for response in operation["responses"].as_object().into_iter().flat_map(|r| r.values()) {
                    if response.pointer("/content/application~1problem+json").is_none() {
                        continue;
                    }
                    // "`code`: meaning; `code`: meaning"
                    let description = response["description"].as_str().expect("a description");
                    answered.extend(description.split("; ").filter_map(|d| d.split('`').nth(1)).map(str::to_owned));
                }
            }
        }
        // Not tied to a documented operation: unknown methods, and errors
        // no request should meet.
        let elsewhere = [ProblemCode::MethodNotAllowed, ProblemCode::BadRequest, ProblemCode::Internal];
        for code in ProblemCode::ALL {
            assert!(
                answered.contains(code.as_str()) || elsewhere.contains(code),
                "{code:?} is answered by no operation"
            );
        }
    }

    #[test]
    fn a_transaction_fails_with_409_whatever_the_code() {
        use ProblemCode::*;
        let problems = Problems::of(&[ValidationFailed]).with_body().with_failures(&[NotFound, Locked]);
        let answered = problems.answered();
        assert!(answered.contains(&(409, NotFound)) && answered.contains(&(409, Locked)));
        assert!(answered.contains(&(422, ValidationFailed)) && answered.contains(&(400, InvalidJson)));
        assert!(answered.contains(&(401, Unauthorized)) && answered.contains(&(431, HeadersTooLarge)));
        let public = Problems::of(&[NotReady]).public().answered();
        assert!(!public.iter().any(|(_, c)| *c == Unauthorized), "a public operation needs no key");
    }

    /// Every member a problem body carries is one its family's schema
    /// names, with the declared JSON type.
    #[test]
    fn problem_bodies_follow_their_family_schema() {
        use super::super::error::ApiError;
        use crate::documents::DocError;
        use crate::txn::commit::TxnError;
        use crate::txn::record::{Failure, FailureCode};

        // What the engine fills in for each code (txn/commit).
        let failure = |code, retryable| Failure {
            action: Some(1),
            collection: Some("accounts".into()),
            id: Some("a".into()),
            expected: Some(3),
            actual: (code != FailureCode::NotFound).then_some(4),
            holder: (code == FailureCode::Locked).then(|| "t0".into()),
            reason: (code == FailureCode::Aborted).then(|| "wounded".into()),
            ..Failure::new(code, "d", retryable)
        };
        let mut errors: Vec<ApiError> = vec![
            DocError::VersionConflict { expected: 1, actual: 2 }.into(),
            DocError::AlreadyExists { version: 3 }.into(),
            DocError::Deleted { version: 4, deleted_at: None }.into(),
            DocError::NotFound.into(),
            DocError::Locked { holder: "t".into(), retry_after: std::time::Duration::from_secs(1) }.into(),
            crate::document::rules::Invalid::new("/a", "bad").into(),
            TxnError::OutcomeUnknown { txn: "t".into() }.into(),
            DocError::Schema(crate::schemas::Refusal {
                collection: "orders".into(),
                schema_version: 1,
                violations: vec![crate::schemas::Violation {
                    pointer: "/total".into(),
                    keyword: "minimum".into(),
                    detail: "too small".into(),
                }],
                more: 0,
            })
            .into(),
        ];
        for code in [
            FailureCode::VersionConflict,
            FailureCode::Locked,
            FailureCode::Aborted,
            FailureCode::Deleted,
            FailureCode::NotFound,
            FailureCode::AlreadyExists,
        ] {
            errors.push(TxnError::Aborted { txn: "t".into(), failure: failure(code, true) }.into());
        }
        errors.push(
            TxnError::InvalidChange { txn: "t".into(), failure: failure(FailureCode::InvalidChange, false) }.into(),
        );
        let mut invalid = failure(FailureCode::SchemaViolation, false);
        invalid.schema_version = Some(2);
        invalid.errors =
            vec![crate::schemas::Violation { pointer: "".into(), keyword: "cost".into(), detail: "d".into() }];
        errors.push(TxnError::InvalidChange { txn: "t".into(), failure: invalid }.into());
        for err in errors {
            let schema = problem_schema(err.code.family());
            let body = err.body();
            for required in schema["required"].as_array().expect("required") {
                let name = required.as_str().expect("a name");
                assert!(body.get(name).is_some(), "{:?}: required `{name}` is missing", err.code);
            }
            for (name, value) in body.as_object().expect("an object") {
                let declared = &schema["properties"][name];
                assert!(declared.is_object(), "{:?}: `{name}` is not in {}", err.code, err.code.family().name());
                let types: Vec<&str> = match &declared["type"] {
                    Value::String(t) => vec![t.as_str()],
                    Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
                    _ => continue, // a $ref (collection, id)
                };
                let actual = match value {
                    Value::Null => "null",
                    Value::Bool(_) => "boolean",
                    Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
                    Value::Number(_) => "number",
                    Value::String(_) => "string",
                    Value::Array(_) => "array",
                    Value::Object(_) => "object",
                };
                assert!(types.contains(&actual), "{:?}: `{name}` is {actual}, declared {types:?}", err.code);
            }
        }
    }

    #[test]
    fn a_status_with_several_families_is_one_of_them_told_apart_by_code() {
        let response = problem_response(&[ProblemCode::VersionConflict, ProblemCode::Locked]);
        let schema = &response["content"]["application/problem+json"]["schema"];
        assert_eq!(schema["oneOf"].as_array().unwrap().len(), 2);
        // Each family's codes are its own: a body matches exactly one.
        for family in Family::ALL {
            for code in family.codes() {
                assert_eq!(code.family(), *family);
            }
        }
        assert!(response["headers"]["Retry-After"].is_object(), "locked comes with Retry-After");
    }
}
