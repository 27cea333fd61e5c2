//! The API description's contract: what the derives in the handlers cannot
//! say. utoipa derives the operations, parameters and payload types; this
//! module adds
//!
//! - the schemas of user data (document fields, dotted field paths, any
//!   JSON value with the naming rules of `document::rules`),
//! - one problem schema per [`Family`], built from [`ProblemCode`],
//! - every problem each operation can answer ([`Problems`], declared
//!   beside each handler with [`problems!`]), with the headers that come
//!   with them,
//! - the Bearer security scheme and the servers.
//!
//! What the description allows, the server accepts: the patterns here are
//! the rules the server checks, and `tests/clients` runs a property-based
//! tester against the running gateway to hold the two together.

use std::borrow::Cow;

use serde_json::{Value, json};
use utoipa::openapi::{ObjectBuilder, RefOr, Schema};

use super::error::{Family, ProblemCode};
use crate::document::rules::MAX_ID_CHARS;
use crate::hooks::send::RESERVED_HEADERS;

/// A collection name.
pub const COLLECTION_PATTERN: &str = "^[a-zA-Z][a-zA-Z0-9_-]{0,63}$";
/// A document id: printable characters (no Unicode control characters).
pub const ID_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$";
/// A top-level field name: not empty, no leading `_` or `$`, no `.`, no NUL.
const TOP_NAME: &str = "[^_$.\\u0000][^.\\u0000]*";
/// A nested field name: not empty, no leading `$`, no `.`, no NUL.
const NESTED_NAME: &str = "[^$.\\u0000][^.\\u0000]*";
/// A page cursor: unpadded base64url (a length of 4n+1 cannot be one).
/// The longest cursor (the API description says so): the base64 of the
/// longest id, with room to spare.
pub const MAX_CURSOR: usize = 2048;

pub const CURSOR_PATTERN: &str = "^(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2,3})?$";
/// A hook URL the gateway takes without a `TXGATE_HOOK_ALLOW` entry: http(s),
/// a host name (not `localhost`), an optional port and path.
const HOOK_URL_PATTERN: &str = r"^https?://(?!(?:[a-z0-9-]+\.)*localhost(?::|/|$))(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z](?:[a-z0-9-]{0,61}[a-z0-9])?(?::[1-9][0-9]{0,3})?(?:/[A-Za-z0-9._~!$&'()*+,;=:@%/-]*)?$";

/// A header name (an RFC 9110 token) that is not one the gateway sets,
/// whatever its case.
fn hook_header_name_pattern() -> String {
    let any_case = |name: &str| -> String {
        name.chars()
            .map(|c| {
                if c.is_ascii_alphabetic() {
                    format!("[{}{}]", c.to_ascii_lowercase(), c.to_ascii_uppercase())
                } else {
                    c.to_string()
                }
            })
            .collect()
    };
    let reserved: Vec<String> = RESERVED_HEADERS.iter().map(|h| any_case(h)).collect();
    format!("^(?!(?:{})$)[!#$%&'*+.^_`|~0-9A-Za-z-]+$", reserved.join("|"))
}

/// Types whose schema is written here rather than derived: handlers name
/// them in `value_type = ...`, and [`document`] puts the real schema in
/// place of the placeholder utoipa collects.
macro_rules! schema_here {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        $(
            $(#[$doc])*
            pub struct $name;

            impl utoipa::PartialSchema for $name {
                fn schema() -> RefOr<Schema> {
                    ObjectBuilder::new().build().into()
                }
            }

            impl utoipa::ToSchema for $name {
                fn name() -> Cow<'static, str> {
                    Cow::Borrowed(stringify!($name))
                }
            }
        )*

        const SCHEMAS_HERE: &[&str] = &[$(stringify!($name)),*];
    };
}

schema_here! {
    /// A collection name.
    Collection,
    /// A document id.
    DocumentId,
    /// A document's fields.
    Fields,
    /// A create body: the fields and an optional `_id`.
    NewDocument,
    /// Any JSON value a field can hold.
    FieldValue,
    /// A dotted path to a field.
    FieldPath,
    /// `set`: values by field path.
    SetFields,
    /// `inc`: numbers by field path.
    IncFields,
    /// `unset`: field paths.
    UnsetFields,
    /// A merge patch (RFC 7396) of a document.
    MergePatch,
    /// Any JSON object.
    AnyObject,
    /// A page cursor.
    Cursor,
    /// `If-Match`.
    IfMatch,
    /// `If-None-Match`.
    IfNoneMatch,
    /// `Idempotency-Key`.
    IdempotencyKey,
    /// `Last-Event-ID`.
    LastEventId,
    /// A hook's destination.
    HookUrl,
    /// Headers a hook sends.
    HookHeaders,
    /// Any JSON value at all.
    AnyValue,
}

fn schema_here(name: &str) -> Value {
    let field_path = format!("^{TOP_NAME}(?:\\.{NESTED_NAME})*$");
    match name {
        "Collection" => json!({
            "type": "string",
            "description": "A collection name: a letter, then up to 63 letters, digits, `_` or `-`. Names starting with `_` are the gateway's own.",
            "pattern": COLLECTION_PATTERN,
            "minLength": 1,
            "maxLength": 64,
            "examples": ["orders"],
        }),
        "DocumentId" => json!({
            "type": "string",
            "description": format!("A document id: 1 to {MAX_ID_CHARS} characters, no control characters. Any other character is allowed; percent-encode it in a URL (`/` as `%2F`)."),
            "pattern": ID_PATTERN,
            "minLength": 1,
            "maxLength": MAX_ID_CHARS,
            "examples": ["order-1001"],
        }),
        "Fields" => json!({
            "type": "object",
            "description": "A document's fields: any JSON object. Top-level names must not start with `_` or `$`; no name may be empty, start with `$`, or contain `.` or NUL. Integers past the signed 64-bit range are kept as doubles.",
            "propertyNames": {"pattern": format!("^{TOP_NAME}$")},
            "additionalProperties": {"$ref": "#/components/schemas/FieldValue"},
            "examples": [{"customer": "ada", "total": 42, "lines": [{"sku": "A-1", "qty": 2}]}],
        }),
        "NewDocument" => json!({
            "type": "object",
            "description": "A new document's fields, as `Fields`, and optionally its id in `_id` (a UUIDv7 is assigned without one).",
            "properties": {"_id": {"$ref": "#/components/schemas/DocumentId"}},
            "propertyNames": {"pattern": format!("^(?:_id|{TOP_NAME})$")},
            "additionalProperties": {"$ref": "#/components/schemas/FieldValue"},
            "examples": [{"_id": "order-1001", "customer": "ada", "total": 42}],
        }),
        // Any value but the forbidden ones, so that generators see "any"
        // (they ignore `not`) and validators see the rules. The forbidden
        // values nest, so the `not` refers to itself.
        "FieldValue" => json!({
            "description": "Any JSON value. In objects, names must not be empty, start with `$`, or contain `.` or NUL. Integers past the signed 64-bit range are kept as doubles.",
            "not": {
                "title": "ForbiddenFieldValue",
                "anyOf": [
                    {"type": "object", "not": {"propertyNames": {"pattern": format!("^{NESTED_NAME}$")}}},
                    {"type": "object", "not": {"additionalProperties": {"not": {"$ref": "#/components/schemas/FieldValue/not"}}}},
                    {"type": "array", "items": {}, "contains": {"$ref": "#/components/schemas/FieldValue/not"}},
                ],
            },
        }),
        "FieldPath" => json!({
            "type": "string",
            "description": "A field, or a dotted path into nested objects (`address.city`).",
            "pattern": field_path,
            "examples": ["draft"],
        }),
        "SetFields" => json!({
            "type": "object",
            "description": "Values to set, by field path. A path may appear in only one of `set`, `unset` and `inc`, and not inside another (`a` and `a.b`): such a patch is refused with `validation_failed`.",
            "propertyNames": {"pattern": field_path},
            "additionalProperties": {"$ref": "#/components/schemas/FieldValue"},
            "examples": [{"status": "paid", "address.city": "Lyon"}],
        }),
        "IncFields" => json!({
            "type": "object",
            "description": "Numbers to add, by field path; a missing field starts at 0.",
            "propertyNames": {"pattern": field_path},
            "additionalProperties": {"type": "number"},
            "examples": [{"stock": -1}],
        }),
        "UnsetFields" => json!({
            "type": "array",
            "description": "Field paths to remove.",
            "items": {"$ref": "#/components/schemas/FieldPath"},
            "examples": [["draft"]],
        }),
        "MergePatch" => json!({
            "type": "object",
            "description": "A JSON Merge Patch (RFC 7396): members set to `null` are removed, objects are merged, anything else replaces. Names follow the rules of `Fields`.",
            "propertyNames": {"pattern": format!("^{TOP_NAME}$")},
            "additionalProperties": {"$ref": "#/components/schemas/FieldValue"},
            "examples": [{"status": "paid", "draft": null}],
        }),
        "AnyObject" => json!({"type": "object", "additionalProperties": true}),
        "Cursor" => json!({
            "type": "string",
            "description": "The `next` of the previous page. Opaque: pass it back as it came.",
            "pattern": CURSOR_PATTERN,
            "maxLength": MAX_CURSOR,
        }),
        "IfMatch" => json!({
            "type": "string",
            "description": "`*`, or the ETag (`\"<version>\"`) the change was computed from; a bare version is read as its ETag.",
            "pattern": "^(?:\\*|[0-9]{1,18}|\"[0-9]{1,18}\")$",
            "examples": ["\"3\""],
        }),
        "IfNoneMatch" => json!({
            "type": "string",
            "description": "`*`, or the ETags the client holds, comma-separated (`W/` prefixes are ignored).",
            "pattern": "^(?:\\*|(?:(?:W/)?\"[0-9]{1,18}\"|[0-9]{1,18})(?: *, *(?:(?:W/)?\"[0-9]{1,18}\"|[0-9]{1,18}))*)$",
            "examples": ["\"3\""],
        }),
        "LastEventId" => json!({
            "type": "string",
            "description": "The `id` (the `seq`) of the last event received.",
            "pattern": "^[0-9]{1,18}$",
            "examples": ["42"],
        }),
        "IdempotencyKey" => json!({
            "type": "string",
            "description": "1 to 255 visible ASCII characters (spaces inside allowed), chosen by the client; scoped to its API key.",
            "pattern": "^[!-~](?:[ -~]{0,253}[!-~])?$",
            "examples": ["order-1001-payment"],
        }),
        "HookUrl" => json!({
            "type": "string",
            "format": "uri",
            "description": "An http(s) URL. Loopback, private, link-local and metadata addresses are refused unless `TXGATE_HOOK_ALLOW` names them (`hook_not_allowed`).",
            "pattern": HOOK_URL_PATTERN,
            "maxLength": 2048,
            "examples": ["https://example.com/hooks/order-paid"],
        }),
        "HookHeaders" => json!({
            "type": "object",
            "description": format!("Headers to send, by name. The gateway sets {} itself.", RESERVED_HEADERS.iter().map(|h| format!("`{h}`")).collect::<Vec<_>>().join(", ")),
            "propertyNames": {"pattern": hook_header_name_pattern()},
            "additionalProperties": {"type": "string", "pattern": "^[^\\u0000-\\u0008\\u000a-\\u001f\\u007f]*$"},
            "examples": [{"X-Tenant": "acme"}],
        }),
        "AnyValue" => json!({"description": "Any JSON value."}),
        other => unreachable!("no schema written for {other}"),
    }
}

/// A problem schema: the RFC 9457 members, the members that name a
/// transaction's failing action, and the family's own.
fn problem_schema(family: Family) -> Value {
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
        Family::VersionConflict => json!({}),
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
        ProblemCode::VersionConflict => json!({"expected": 3, "actual": 4}),
        ProblemCode::Locked => json!({"transaction": "0193f3c4-7d2e-7c1a-9b4e-3f5d2a1c0b9e"}),
        ProblemCode::Deleted => json!({"version": 5, "deleted_at": "2026-01-02T03:04:05.678Z"}),
        ProblemCode::AlreadyExists => json!({"version": 2}),
        ProblemCode::Aborted => {
            json!({"transaction": "0193f3c4-7d2e-7c1a-9b4e-3f5d2a1c0b9e", "retryable": true, "reason": "wounded"})
        }
        ProblemCode::ValidationFailed => {
            json!({"errors": [{"pointer": "/path/collection", "detail": "must match ^[a-zA-Z][a-zA-Z0-9_-]{0,63}$"}]})
        }
        _ => json!({}),
    };
    example.as_object_mut().expect("an object").extend(extra.as_object().expect("an object").clone());
    example
}

/// Whether a problem with this code comes with `Retry-After`.
fn retry_after(code: ProblemCode) -> bool {
    use ProblemCode::*;
    matches!(code, Locked | Aborted | InProgress | Overloaded | StoreUnavailable | OutcomeUnknown)
}

/// The problems one operation can answer, declared beside its handler
/// with [`problems!`] and named in its `responses(...)`. Added to what it
/// declares: 431 on every operation (every request's head is bounded),
/// the body's problems where it reads one, and 401, 403, 429 and 503 where
/// it needs a key.
#[derive(Clone, Copy)]
pub struct Problems {
    codes: &'static [ProblemCode],
    /// A transaction's failures: a 409 whatever the code's own status.
    failures: &'static [ProblemCode],
    body: bool,
    public: bool,
}

impl Problems {
    pub const fn of(codes: &'static [ProblemCode]) -> Self {
        Self { codes, failures: &[], body: false, public: false }
    }

    /// The operation reads a JSON body.
    pub const fn with_body(self) -> Self {
        Self { body: true, ..self }
    }

    /// What a transaction fails with, nothing applied: each a 409.
    pub const fn with_failures(self, failures: &'static [ProblemCode]) -> Self {
        Self { failures, ..self }
    }

    /// The operation is open without an API key.
    pub const fn public(self) -> Self {
        Self { public: true, ..self }
    }

    /// Every (status, code) the operation can answer.
    pub fn answered(&self) -> Vec<(u16, ProblemCode)> {
        use ProblemCode::*;
        const BODY: &[ProblemCode] = &[InvalidJson, InvalidBody, RequestTimeout, PayloadTooLarge, UnsupportedMediaType];
        const KEYED: &[ProblemCode] = &[Unauthorized, Forbidden, Overloaded, StoreUnavailable];
        let body = if self.body { BODY } else { &[] };
        let keyed = if self.public { &[] } else { KEYED };
        let plain = [body, self.codes].concat().into_iter().map(|c| (c.status(), c));
        let failures = self.failures.iter().map(|c| (409, *c));
        let head = [HeadersTooLarge].into_iter().map(|c| (c.status(), c));
        plain.chain(failures).chain(head).chain(keyed.iter().map(|c| (c.status(), *c))).collect()
    }

    /// The responses of [`Problems::answered`], one per status.
    pub fn responses(&self) -> std::collections::BTreeMap<String, RefOr<utoipa::openapi::Response>> {
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
        pub struct $name;

        impl $name {
            #[allow(dead_code, reason = "read by the contract's tests")]
            pub const PROBLEMS: $crate::http::contract::Problems = {
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
fn problem_response(codes: &[ProblemCode]) -> Value {
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

/// `schema` without its `null` alternative, where it is one of two: what
/// utoipa derives from an `Option<T>` that may be absent but not null.
fn drop_null(schema: &mut Value) {
    let non_null = schema.get("oneOf").and_then(Value::as_array).and_then(|alternatives| {
        let rest: Vec<&Value> = alternatives.iter().filter(|s| s["type"] != "null").collect();
        (rest.len() == 1 && alternatives.len() == 2).then(|| rest[0].clone())
    });
    if let Some(non_null) = non_null {
        *schema = non_null;
    }
}

/// The complete API description: the derived one with the contract added.
pub fn document(derived: utoipa::openapi::OpenApi) -> Value {
    let mut doc = serde_json::to_value(derived).expect("the API description serializes");
    doc["servers"] = json!([{"url": "http://127.0.0.1:8080", "description": "A gateway on its default address"}]);
    doc["security"] = json!([{"bearer": []}]);
    let components = doc["components"].as_object_mut().expect("components");
    components.insert(
        "securitySchemes".into(),
        json!({"bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key from `TXGATE_API_KEYS`, as `Authorization: Bearer <key>`. A gateway with no keys configured serves loopback clients without one.",
        }}),
    );
    components.insert(
        "headers".into(),
        json!({
            "ETag": {"description": "The document's version as an entity tag, `\"<version>\"`: send it back in `If-Match`.", "schema": {"type": "string", "pattern": "^\"[0-9]+\"$"}, "example": "\"3\""},
            "Location": {"description": "The URL of the new document.", "schema": {"type": "string", "format": "uri-reference"}},
            "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer", "minimum": 1}, "example": 1},
            "Idempotent-Replayed": {"description": "`true` when the answer is the stored outcome of an earlier request with the same `Idempotency-Key`.", "schema": {"type": "string", "enum": ["true"]}},
        }),
    );
    let schemas = components.get_mut("schemas").and_then(Value::as_object_mut).expect("schemas");
    for name in SCHEMAS_HERE {
        schemas.insert((*name).to_owned(), schema_here(name));
    }
    for family in Family::ALL {
        schemas.insert(family.name().to_owned(), problem_schema(*family));
    }
    // What derives cannot say: a subscription names each filter value once.
    for field in ["collections", "types"] {
        schemas["SubscriptionIn"]["properties"][field]["uniqueItems"] = json!(true);
    }
    let paths = doc["paths"].as_object_mut().expect("paths");
    for item in paths.values_mut() {
        for operation in item.as_object_mut().expect("a path item").values_mut() {
            let Some(id) = operation.get("operationId").and_then(Value::as_str).map(str::to_owned) else { continue };
            let responses = operation["responses"].as_object_mut().expect("responses");
            assert!(responses.contains_key("431"), "{id} declares no problems (`problems!`)");
            let public = !responses.contains_key("401");
            for response in responses.values_mut() {
                let Some(headers) = response.get_mut("headers").and_then(Value::as_object_mut) else { continue };
                for (name, header) in headers.iter_mut() {
                    if matches!(name.as_str(), "ETag" | "Location" | "Idempotent-Replayed" | "Retry-After") {
                        *header = json!({"$ref": format!("#/components/headers/{name}")});
                    }
                }
            }
            if public {
                operation["security"] = json!([]);
            }
            // An optional body is absent or has a value: never null
            // (utoipa writes an `Option<T>` body as one that may be).
            if let Some(schema) = operation.pointer_mut("/requestBody/content/application~1json/schema") {
                drop_null(schema);
            }
            // Nor is a parameter. Header schemas are written out in place
            // (tools resolve `$ref`s in headers less reliably).
            for parameter in operation.get_mut("parameters").and_then(Value::as_array_mut).into_iter().flatten() {
                let header = parameter["in"] == "header";
                let schema = &mut parameter["schema"];
                drop_null(schema);
                let name =
                    schema.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/components/schemas/"));
                if let Some(name) = name.filter(|_| header).map(str::to_owned) {
                    *schema = schema_here(&name);
                }
            }
        }
    }
    // Schemas written out in place (the headers') are not components.
    let text = doc.to_string();
    let unused: Vec<&str> =
        SCHEMAS_HERE.iter().copied().filter(|n| !text.contains(&format!("\"#/components/schemas/{n}\""))).collect();
    let schemas = doc["components"]["schemas"].as_object_mut().expect("schemas");
    for name in unused {
        schemas.remove(name);
    }
    doc
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
