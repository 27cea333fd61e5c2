//! The API description's contract: what the derives in the handlers cannot
//! say. utoipa derives the operations, parameters and payload types; this
//! module adds
//!
//! - the schemas of user data (document fields, dotted field paths, any
//!   JSON value with the naming rules of `document::rules`),
//! - one problem schema per [`Family`] and the problems each operation
//!   can answer, from `http::problems` (each operation declares its own
//!   beside its handler), with the headers that come with them,
//! - the Bearer security scheme and the servers.
//!
//! What the description allows, the server accepts: the patterns here are
//! the rules the server checks, and `tests/clients` runs a property-based
//! tester against the running gateway to hold the two together.

use serde_json::{Value, json};

use super::error::Family;
use super::problems::problem_schema;
use crate::document::rules::MAX_ID_CHARS;
use crate::hooks::send::RESERVED_HEADERS;

/// A collection name.
pub(crate) const COLLECTION_PATTERN: &str = "^[a-zA-Z][a-zA-Z0-9_-]{0,63}$";
/// A document id: printable characters (no Unicode control characters).
pub(crate) const ID_PATTERN: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$";
/// A top-level field name: not empty, no leading `_` or `$`, no `.`, no NUL.
const TOP_NAME: &str = "[^_$.\\u0000][^.\\u0000]*";
/// A query path's first segment and the others: no control character (and
/// not `-` first, which says descending).
const QUERY_TOP: &str = "[^-_$.\\u0000-\\u001f\\u007f-\\u009f][^.\\u0000-\\u001f\\u007f-\\u009f]*";
const QUERY_NESTED: &str = "[^$.\\u0000-\\u001f\\u007f-\\u009f][^.\\u0000-\\u001f\\u007f-\\u009f]*";
/// The first segment of a filter's path: not `_`, `$` or `.`, no control
/// character.
const FILTER_TOP: &str = "[^_$.\\u0000-\\u001f\\u007f-\\u009f][^.\\u0000-\\u001f\\u007f-\\u009f]*";
/// A nested field name: not empty, no leading `$`, no `.`, no NUL.
const NESTED_NAME: &str = "[^$.\\u0000][^.\\u0000]*";
/// A page cursor: unpadded base64url (a length of 4n+1 cannot be one).
/// The longest cursor (the API description says so): the base64 of the
/// longest id, with room to spare.
pub(crate) const MAX_CURSOR: usize = crate::queries::MAX_CURSOR;

pub(crate) const CURSOR_PATTERN: &str = "^(?:[A-Za-z0-9_-]{4})*(?:[A-Za-z0-9_-]{2,3})?$";
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
            #[allow(dead_code, reason = "named in `value_type = ...` only")]
            pub(crate) struct $name;

            crate::document::names::placeholder_schema!($name);
        )*

        const SCHEMAS_HERE: &[&str] = &[$(stringify!($name)),*];
    };
}

pub(crate) use crate::document::names::{Collection, DocumentId};

schema_here! {
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
    /// A query's filter.
    Filter,
    /// A data path a query sorts by or an index holds, `-` for descending.
    SortPath,
    /// A data path a query keeps.
    DataPath,
    /// An index's fields.
    IndexFields,
    /// A filter's condition on one path.
    Condition,
    /// A value a filter compares with.
    Scalar,
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
    /// A JSON Schema (2020-12).
    JsonSchema,
}

/// Every schema written here: those of the placeholders below the HTTP
/// layer (`document::names`), then this module's own.
fn schemas_here() -> impl Iterator<Item = &'static str> {
    crate::document::names::NAMES.iter().chain(SCHEMAS_HERE).copied()
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
        "SortPath" => json!({
            "type": "string",
            "description": "A data path (dotted paths reach nested fields), ascending, or descending written `-path`. No segment starts with `$`, the first not with `_`; at most 16 segments.",
            "pattern": format!("^-?{QUERY_TOP}(?:\\.{QUERY_NESTED}){{0,15}}$"),
            "minLength": 1,
            "maxLength": 257,
            "examples": ["-amount"],
        }),
        "IndexFields" => json!({
            "type": "array",
            "description": "Data paths, each ascending, or descending written `-path`: 1 to 8, each path once.",
            "items": {"$ref": "#/components/schemas/SortPath"},
            "minItems": 1,
            "maxItems": 8,
            "uniqueItems": true,
            "examples": [["status", "-amount"]],
        }),
        "DataPath" => json!({
            "type": "string",
            "description": "A data path (dotted paths reach nested fields). No segment starts with `$`, the first not with `_`; at most 16 segments.",
            "pattern": format!("^{QUERY_TOP}(?:\\.{QUERY_NESTED}){{0,15}}$"),
            "minLength": 1,
            "maxLength": 256,
            "examples": ["status"],
        }),
        "Filter" => json!({
            "type": "object",
            "description": "A filter over a document's data, a subset of MongoDB's query language: each member is a data path (dotted paths reach nested fields; a path starting with `_` or `$` is refused) and its `Condition`, or `$and` and an array of filters. Every member must hold. Comparisons follow MongoDB's type order and stay within a type (`{\"$gt\": 5}` matches numbers only); `null` matches a missing field too. `$exists` is part of the language but no index serves it (a missing field and `null` share an index key): use `null` and `{\"$ne\": null}`.",
            "properties": {
                "$and": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Filter"}},
            },
            "propertyNames": {
                "pattern": format!("^(?:\\$and|{FILTER_TOP}(?:\\.{QUERY_NESTED}){{0,15}})$"),
                "maxLength": crate::query::filter::MAX_PATH_LEN,
            },
            "maxProperties": crate::query::filter::MAX_CONDITIONS,
            "additionalProperties": {"$ref": "#/components/schemas/Condition"},
            "examples": [{"status": "open", "amount": {"$gte": 100}}],
        }),
        "Condition" => json!({
            "description": "A value (equality), or operators that must all hold.",
            "oneOf": [
                {"$ref": "#/components/schemas/Scalar"},
                {
                    "type": "object",
                    "minProperties": 1,
                    "additionalProperties": false,
                    "properties": {
                        "$eq": {"$ref": "#/components/schemas/Scalar"},
                        "$ne": {"$ref": "#/components/schemas/Scalar"},
                        "$gt": {"$ref": "#/components/schemas/Scalar"},
                        "$gte": {"$ref": "#/components/schemas/Scalar"},
                        "$lt": {"$ref": "#/components/schemas/Scalar"},
                        "$lte": {"$ref": "#/components/schemas/Scalar"},
                        "$in": {"type": "array", "maxItems": crate::query::filter::MAX_IN, "items": {"$ref": "#/components/schemas/Scalar"}},
                        "$nin": {"type": "array", "maxItems": crate::query::filter::MAX_IN, "items": {"$ref": "#/components/schemas/Scalar"}},
                        "$exists": {"type": "boolean"},
                    },
                },
            ],
        }),
        "Scalar" => json!({
            "description": "A value a filter compares with: an indexed field holds only these. A string is at most 1024 characters.",
            "type": ["string", "number", "boolean", "null"],
            "maxLength": crate::query::filter::MAX_STRING,
        }),
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
        "JsonSchema" => json!({
            "type": ["object", "boolean"],
            "description": "A JSON Schema (2020-12): an object, or `true` / `false`; at most 64 KiB, 32 levels and 2,000 members, `$ref` within itself only (docs/guides/validation.md, \"Bounds\").",
            "examples": [{"type": "object", "required": ["total"], "properties": {"total": {"type": "number", "minimum": 0}}}],
        }),
        other => unreachable!("no schema written for {other}"),
    }
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
pub(crate) fn document(derived: utoipa::openapi::OpenApi) -> Value {
    let mut doc = serde_json::to_value(derived).expect("the API description serializes");
    doc["servers"] = json!([{"url": "http://127.0.0.1:8080", "description": "A gateway on its default address"}]);
    // Either credential: an API key or a user's access token.
    doc["security"] = json!([{"bearer": []}, {"userToken": []}]);
    let components = doc["components"].as_object_mut().expect("components");
    components.insert(
        "securitySchemes".into(),
        json!({
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key from `TXGATE_API_KEYS`, as `Authorization: Bearer <key>`. A gateway with no credentials configured serves loopback clients without one.",
            },
            "userToken": {
                "type": "http",
                "scheme": "bearer",
                "bearerFormat": "JWT",
                "description": "A user's access token from a configured OpenID Connect issuer (`TXGATE_ISSUER`), for one of its audiences, as `Authorization: Bearer <JWT>`. A refused token is answered 401 with a `token_*` code and `WWW-Authenticate: Bearer error=\"invalid_token\"`. An event stream may be opened with a ticket instead (`POST /v1/events/tickets`).",
            },
        }),
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
    for name in schemas_here() {
        schemas.insert(name.to_owned(), schema_here(name));
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
        for (method, operation) in item.as_object_mut().expect("a path item").iter_mut() {
            let Some(id) = operation.get("operationId").and_then(Value::as_str).map(str::to_owned) else { continue };
            let responses = operation["responses"].as_object_mut().expect("responses");
            assert!(responses.contains_key("431"), "{id} declares no problems (`problems!`)");
            let public = !responses.contains_key("401");
            // Without API keys, what changes something is refused from
            // another origin (`limits::same_origin`).
            if !matches!(method.as_str(), "get" | "head" | "options") {
                use super::error::ProblemCode::{self, CrossOrigin, Forbidden};
                // The operation's own 403s (as its `problems!` described
                // them), and these.
                let described = responses.get("403").and_then(|r| r["description"].as_str()).unwrap_or_default();
                let mut codes: Vec<ProblemCode> = ProblemCode::ALL
                    .iter()
                    .filter(|c| c.status() == 403 && described.contains(&format!("`{}`: {}", c.as_str(), c.describe())))
                    .copied()
                    .collect();
                let added: &[_] = if public { &[CrossOrigin] } else { &[Forbidden, CrossOrigin] };
                for code in added {
                    if !codes.contains(code) {
                        codes.push(*code);
                    }
                }
                responses.insert("403".into(), super::problems::problem_response(&codes));
            }
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
        schemas_here().filter(|n| !text.contains(&format!("\"#/components/schemas/{n}\""))).collect();
    let schemas = doc["components"]["schemas"].as_object_mut().expect("schemas");
    for name in unused {
        schemas.remove(name);
    }
    doc
}
