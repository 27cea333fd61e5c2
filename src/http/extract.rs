//! Extractors that answer bad input with problem+json: JSON bodies (with
//! content-type and size checks), path and query parameters, and the
//! `If-Match` / `If-None-Match` preconditions.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use super::error::{ApiError, ProblemCode};
use crate::document::rules::escape;

/// The media type of the request body, lower-cased, without parameters.
pub(crate) fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(value.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
}

fn is_json(media: &str) -> bool {
    media == "application/json" || (media.starts_with("application/") && media.ends_with("+json"))
}

pub(crate) fn unsupported_media(expected: &str) -> ApiError {
    ApiError::new(ProblemCode::UnsupportedMediaType, format!("the body must be sent as {expected}"))
}

/// Read the whole body, answering 413 when it is over the limit.
pub(crate) async fn body_bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, ApiError> {
    Bytes::from_request(req, state).await.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            too_large()
        } else {
            ApiError::bad_request(ProblemCode::InvalidBody, format!("could not read the request body: {rejection}"))
        }
    })
}

pub(crate) fn too_large() -> ApiError {
    ApiError::new(ProblemCode::PayloadTooLarge, "the request body is larger than the limit")
}

/// Parse JSON: syntax errors are 400, well-formed JSON of the wrong shape 422,
/// and so is an object with a member name twice (RFC 8259 leaves its meaning
/// open: one parser keeps the first, another the last, so it is refused
/// rather than guessed), and a struct read from an array (see
/// [`super::strict`]).
pub(crate) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if let Some(pointer) = duplicate_member(bytes) {
        let detail = "the member appears more than once";
        return Err(
            ApiError::new(ProblemCode::ValidationFailed, format!("{pointer}: {detail}")).pointer(pointer, detail)
        );
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let mut track = serde_path_to_error::Track::new();
    let read = super::strict::deserialize(serde_path_to_error::Deserializer::new(&mut de, &mut track))
        .and_then(|value| de.end().map(|()| value));
    read.map_err(|err| {
        use serde_json::error::Category;
        match err.classify() {
            Category::Data => shape_error("", &track.path(), &err),
            // Well-formed but deeper than the parser goes: a body nested
            // past every limit on data, refused as such.
            Category::Syntax if too_deep(&err) => {
                let (pointer, detail) = past_depth(bytes);
                ApiError::new(ProblemCode::ValidationFailed, detail.clone()).pointer(pointer, detail)
            }
            Category::Syntax | Category::Eof | Category::Io => {
                ApiError::bad_request(ProblemCode::InvalidJson, format!("malformed JSON: {err}"))
            }
        }
    })
}

/// The nesting the JSON parser takes (serde_json's recursion limit).
const JSON_DEPTH: usize = 127;

/// Whether the parser refused well-formed JSON for its nesting alone.
pub(crate) fn too_deep(err: &serde_json::Error) -> bool {
    err.classify() == serde_json::error::Category::Syntax && err.to_string().starts_with("recursion limit exceeded")
}

/// Where JSON the parser refused as [`too_deep`] first nests past its
/// depth (a JSON pointer), and what to say of it.
pub(crate) fn past_depth(bytes: &[u8]) -> (String, String) {
    let detail = format!(
        "nested deeper than {JSON_DEPTH} levels (document data may nest {} levels)",
        crate::document::rules::MAX_DATA_DEPTH
    );
    (pointer_past_depth(bytes, JSON_DEPTH), detail)
}

/// The JSON pointer of the first object or array of `bytes` that sits
/// deeper than `depth` levels; found in one pass without recursion.
fn pointer_past_depth(bytes: &[u8], depth: usize) -> String {
    enum Frame {
        Object { key: Vec<u8>, in_key: bool },
        Array { index: usize },
    }
    let mut stack: Vec<Frame> = Vec::new();
    let mut in_string = false;
    let mut escaped = false;
    let mut key_next = false;
    for &b in bytes {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            if in_string || escaped {
                if let Some(Frame::Object { key, in_key: true }) = stack.last_mut() {
                    key.push(b);
                }
            } else if let Some(Frame::Object { in_key, .. }) = stack.last_mut() {
                *in_key = false;
            }
            continue;
        }
        match b {
            b'"' => {
                in_string = true;
                if key_next && let Some(Frame::Object { key, in_key }) = stack.last_mut() {
                    key.clear();
                    *in_key = true;
                }
                key_next = false;
            }
            b'{' | b'[' => {
                if stack.len() >= depth {
                    break;
                }
                stack.push(if b == b'{' {
                    Frame::Object { key: Vec::new(), in_key: false }
                } else {
                    Frame::Array { index: 0 }
                });
                key_next = b == b'{';
            }
            b'}' | b']' => {
                stack.pop();
            }
            b',' => match stack.last_mut() {
                Some(Frame::Array { index }) => *index += 1,
                Some(Frame::Object { .. }) => key_next = true,
                None => {}
            },
            _ => {}
        }
    }
    stack
        .iter()
        .map(|f| match f {
            Frame::Object { key, .. } => {
                format!("/{}", escape(&String::from_utf8_lossy(key)))
            }
            Frame::Array { index } => format!("/{index}"),
        })
        .collect()
}

/// The JSON pointer of the first member name that appears twice in one
/// object of `bytes`, if any (`None` too for malformed JSON, which the real
/// parse then reports).
pub(crate) fn duplicate_member(bytes: &[u8]) -> Option<String> {
    use std::cell::RefCell;

    use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

    /// Walks any JSON value; on a duplicate, records its pointer and stops.
    struct Walk<'a> {
        path: String,
        found: &'a RefCell<Option<String>>,
    }

    impl<'de> DeserializeSeed<'de> for Walk<'_> {
        type Value = ();
        fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
            d.deserialize_any(self)
        }
    }

    impl<'de> Visitor<'de> for Walk<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("any JSON value")
        }
        fn visit_bool<E>(self, _: bool) -> Result<(), E> {
            Ok(())
        }
        fn visit_i64<E>(self, _: i64) -> Result<(), E> {
            Ok(())
        }
        fn visit_u64<E>(self, _: u64) -> Result<(), E> {
            Ok(())
        }
        fn visit_f64<E>(self, _: f64) -> Result<(), E> {
            Ok(())
        }
        fn visit_str<E>(self, _: &str) -> Result<(), E> {
            Ok(())
        }
        fn visit_unit<E>(self) -> Result<(), E> {
            Ok(())
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut i = 0usize;
            while seq.next_element_seed(Walk { path: format!("{}/{i}", self.path), found: self.found })?.is_some() {
                i += 1;
            }
            Ok(())
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                let path = format!("{}/{}", self.path, escape(&key));
                if !seen.insert(key) {
                    *self.found.borrow_mut() = Some(path);
                    return Err(de::Error::custom("duplicate member"));
                }
                map.next_value_seed(Walk { path, found: self.found })?;
            }
            Ok(())
        }
    }

    let found = RefCell::new(None);
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let _ = Walk { path: String::new(), found: &found }.deserialize(&mut de);
    // The walk stops at the duplicate: report it only for well-formed JSON.
    found.into_inner().filter(|_| serde_json::from_slice::<de::IgnoredAny>(bytes).is_ok())
}

/// A JSON body (`application/json` or any `application/*+json`).
pub(crate) struct JsonBody<T> {
    pub value: T,
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        if !media_type(req.headers()).is_some_and(|m| is_json(&m)) {
            return Err(unsupported_media("application/json"));
        }
        let raw = body_bytes(req, state).await?;
        Ok(Self { value: parse_json(&raw)? })
    }
}

/// A JSON body the client may leave out, for operations whose every member
/// is optional: an empty body (whatever its `Content-Type`, so a bare
/// `curl -X POST` works) is `None`; any other is read as [`JsonBody`]
/// reads it, with the same 415, 400 and 422 answers.
pub(crate) struct OptionalJsonBody<T>(pub Option<T>);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for OptionalJsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = media_type(req.headers()).is_some_and(|m| is_json(&m));
        let raw = body_bytes(req, state).await?;
        if raw.is_empty() {
            return Ok(Self(None));
        }
        if !json {
            return Err(unsupported_media("application/json"));
        }
        parse_json(&raw).map(|value| Self(Some(value)))
    }
}

/// A request body as `T`, answered 422 (`validation_failed`) when it does
/// not fit. The values at `objects` (JSON pointers; `*` stands for every
/// element of an array) must be objects (or `null`, where `T` takes one),
/// and the answer names the first that is not; past these, a struct is
/// still never read from an array (see [`super::strict`]), only without
/// the pointer.
pub(crate) fn from_body<T: DeserializeOwned>(value: serde_json::Value, objects: &[&str]) -> Result<T, ApiError> {
    for pattern in objects {
        let mut found = vec![("".to_owned(), &value)];
        for segment in pattern.split('/').skip(1) {
            found = found
                .into_iter()
                .flat_map(|(at, v)| -> Vec<(String, &serde_json::Value)> {
                    match (segment, v) {
                        ("*", serde_json::Value::Array(items)) => {
                            items.iter().enumerate().map(|(i, item)| (format!("{at}/{i}"), item)).collect()
                        }
                        (name, serde_json::Value::Object(map)) => {
                            map.get(name).map(|item| (format!("{at}/{name}"), item)).into_iter().collect()
                        }
                        _ => Vec::new(),
                    }
                })
                .collect();
        }
        if let Some((at, _)) = found.iter().find(|(_, v)| !v.is_object() && !v.is_null()) {
            let invalid = crate::document::rules::Invalid::new(at.clone(), "must be an object");
            return Err(invalid.into());
        }
    }
    let mut track = serde_path_to_error::Track::new();
    super::strict::deserialize(serde_path_to_error::Deserializer::new(value, &mut track))
        .map_err(|err| shape_error("", &track.path(), &err))
}

/// A 422 for input of the wrong shape (a wrong type, a missing or unknown
/// member), naming where: `path` leads from `base` (a JSON pointer) to the
/// value refused. At the top, with nothing to point at, the detail alone.
fn shape_error(base: &str, path: &serde_path_to_error::Path, err: &impl std::fmt::Display) -> ApiError {
    let mut pointer = format!("{base}{}", pointer_of(path));
    let mut detail = err.to_string();
    // An error inside a value read whole first carries where in it.
    if let Some((below, rest)) = split_nested(&detail) {
        pointer.push_str(below);
        detail = rest.to_owned();
    }
    // A member missing is pointed at where it belongs.
    if let Some(name) = detail.strip_prefix("missing field `").and_then(|rest| rest.split('`').next()) {
        pointer.push('/');
        pointer.push_str(&escape(name));
    }
    // The name of a type of this code means nothing to a client.
    if let Some((head, rest)) = detail.split_once("expected struct ") {
        let tail = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
        detail = format!("{head}expected a JSON object{tail}");
    }
    if pointer.is_empty() {
        ApiError::new(ProblemCode::ValidationFailed, detail.clone()).pointer("", detail)
    } else {
        crate::document::rules::Invalid::new(pointer, detail).into()
    }
}

/// The JSON pointer `path` leads to. Past a value read whole first (a
/// tagged enum), the path is not known: the pointer stops where it still is
/// (see [`read_nested`] for how such a value tells where in it).
fn pointer_of(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let mut pointer = String::new();
    for segment in path.iter() {
        match segment {
            Segment::Seq { index } => pointer.push_str(&format!("/{index}")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                pointer.push('/');
                pointer.push_str(&escape(key));
            }
            Segment::Unknown => break,
        }
    }
    pointer
}

/// What leads an error's message that says where in a value read whole
/// first the error lies.
const NESTED: char = '\u{1e}';

/// `value`, read whole first (a transaction's action, read by its `op`),
/// read as `T` (strictly, as a body is). serde's errors carry only a
/// message, so an error's message is led by the pointer below `value`
/// (after [`NESTED`] and its length), which [`shape_error`] adds to the
/// pointer of `value` itself.
pub(crate) fn read_nested<T: DeserializeOwned>(value: serde_json::Value) -> Result<T, String> {
    let mut track = serde_path_to_error::Track::new();
    super::strict::deserialize(serde_path_to_error::Deserializer::new(value, &mut track))
        .map_err(|err| nested(&pointer_of(&track.path()), err))
}

/// The message of an error at `below` (a JSON pointer) inside a value read
/// whole first: see [`read_nested`].
pub(crate) fn nested(below: &str, detail: impl std::fmt::Display) -> String {
    format!("{NESTED}{}:{below}{detail}", below.len())
}

/// The pointer a [`read_nested`] message carries, and the rest of it.
fn split_nested(message: &str) -> Option<(&str, &str)> {
    let (len, rest) = message.strip_prefix(NESTED)?.split_once(':')?;
    let len: usize = len.parse().ok()?;
    Some((rest.get(..len)?, rest.get(len..)?))
}

/// An optional integer member of a JSON body. JSON has one number type, so
/// an integral number written with a fraction or exponent (`3.0`, `3e0`)
/// is that integer, as JSON Schema's `integer` says.
pub(crate) fn integer<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<i64>, D::Error> {
    use serde::de::Error;
    let Some(number) = Option::<serde_json::Number>::deserialize(deserializer)? else { return Ok(None) };
    if let Some(i) = number.as_i64() {
        return Ok(Some(i));
    }
    match number.as_f64() {
        // i64::MAX as f64 rounds up to 2^63, which is out of range.
        Some(f) if f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64 => Ok(Some(f as i64)),
        _ => Err(D::Error::custom(format!("expected an integer in the signed 64-bit range, got {number}"))),
    }
}

/// A required integer member of a JSON body, read as [`integer`] reads one.
pub(crate) fn required_integer<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    use serde::de::Error;
    integer(deserializer)?.ok_or_else(|| D::Error::custom("expected an integer, got null"))
}

/// Path parameters; a parameter that cannot be decoded is a 400.
pub(crate) struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| Self(p.0))
            .map_err(|e| ApiError::bad_request(ProblemCode::InvalidPath, e.body_text()))
    }
}

/// Query parameters; values of the wrong type are a 422.
pub(crate) struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        // A parameter without a name (`?=x`, `?a=1&=2`) is malformed, not
        // one to ignore.
        if parts.uri.query().is_some_and(|q| q.split('&').any(|pair| pair.starts_with('='))) {
            return Err(crate::document::rules::Invalid::new("/query", "a query parameter has no name").into());
        }
        let query = parts.uri.query().unwrap_or_default();
        let mut track = serde_path_to_error::Track::new();
        let de = serde_urlencoded::Deserializer::new(url::form_urlencoded::parse(query.as_bytes()));
        T::deserialize(serde_path_to_error::Deserializer::new(de, &mut track)).map(Self).map_err(|err| {
            let path = track.path();
            if path.iter().next().is_some() {
                return shape_error("/query", &path, &err);
            }
            // Refused as a whole (a parameter given twice): the first
            // name given twice is the one to point at.
            let mut seen = std::collections::HashSet::new();
            match url::form_urlencoded::parse(query.as_bytes())
                .map(|(name, _)| name)
                .find(|name| !seen.insert(name.clone()))
            {
                Some(name) => {
                    crate::document::rules::Invalid::new(format!("/query/{}", escape(&name)), "given more than once")
                        .into()
                }
                None => shape_error("/query", &path, &err),
            }
        })
    }
}

/// `"<v>"`, the entity tag of version `v`.
pub(crate) fn etag(version: i64) -> String {
    format!("\"{version}\"")
}

fn parse_tag(tag: &str, name: &str) -> Result<i64, ApiError> {
    let bad = || {
        ApiError::bad_request(
            ProblemCode::InvalidHeader,
            format!("{name} must be \"*\" or a quoted version such as \"3\" (the ETag of the document), got {tag:?}"),
        )
    };
    // A bare version is read as its quoted tag: what the client means is
    // not in doubt.
    let inner = match tag.strip_prefix('"') {
        Some(quoted) => quoted.strip_suffix('"').ok_or_else(bad)?,
        None => tag,
    };
    if inner.is_empty() || !inner.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match inner.parse::<i64>() {
        Ok(v) if v >= 0 && !inner.starts_with('+') => Ok(v),
        _ => Err(bad()),
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &header::HeaderName) -> Result<Option<&'a str>, ApiError> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else { return Ok(None) };
    if values.next().is_some() {
        return Err(ApiError::bad_request(ProblemCode::InvalidHeader, format!("{name} may be given once")));
    }
    value
        .to_str()
        .map(|v| Some(v.trim()))
        .map_err(|_| ApiError::bad_request(ProblemCode::InvalidHeader, format!("{name} is not valid text")))
}

/// `If-Match`: `None` when absent or `*`, else the version it names.
pub(crate) fn if_match(headers: &HeaderMap) -> Result<Option<i64>, ApiError> {
    match header_str(headers, &header::IF_MATCH)? {
        None | Some("*") => Ok(None),
        Some(tag) if tag.contains(',') => Err(ApiError::bad_request(
            ProblemCode::InvalidHeader,
            "If-Match takes a single entity tag: the version the change was computed from",
        )),
        Some(tag) => parse_tag(tag, "If-Match").map(Some),
    }
}

/// Whether `If-None-Match` matches a document at `version`.
pub(crate) fn if_none_match(headers: &HeaderMap) -> Result<NoneMatch, ApiError> {
    match header_str(headers, &header::IF_NONE_MATCH)? {
        None => Ok(NoneMatch(None)),
        Some("*") => Ok(NoneMatch(Some(Vec::new()))),
        Some(list) => list
            .split(',')
            .map(str::trim)
            .map(|tag| parse_tag(tag.strip_prefix("W/").unwrap_or(tag), "If-None-Match"))
            .collect::<Result<Vec<_>, _>>()
            .map(|tags| NoneMatch(Some(tags))),
    }
}

/// What `If-None-Match` names: nothing (absent), any version (`*`), or
/// these versions.
pub(crate) struct NoneMatch(Option<Vec<i64>>);

impl NoneMatch {
    /// Whether a document at `version` matches (a 304).
    pub(crate) fn matches(&self, version: i64) -> bool {
        self.0.as_ref().is_some_and(|tags| tags.is_empty() || tags.contains(&version))
    }
}

/// An optional member that, when present, must have a value: `null` is
/// refused rather than read as absent.
pub(crate) fn present<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

#[cfg(test)]
mod depth_tests {
    use super::*;

    #[test]
    fn json_past_the_parsers_depth_is_a_422_with_the_pointer() {
        let body =
            format!(r#"{{"ok": [1, {{"x\"y": 2}}], "v": {{"w": [0, {}1{}]}}}}"#, "[".repeat(300), "]".repeat(300));
        let err = parse_json::<serde_json::Value>(body.as_bytes()).unwrap_err();
        let problem = err.body();
        assert_eq!(problem["code"], "validation_failed", "{problem}");
        let pointer = problem["errors"][0]["pointer"].as_str().unwrap().to_owned();
        assert!(pointer.starts_with("/v/w/1/0/0/0"), "{pointer}");
        assert_eq!(pointer.matches('/').count(), JSON_DEPTH, "{pointer}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn a_nested_error_carries_its_pointer_whatever_the_names() {
        // Names may hold the marker, `:` and digits: the length decides.
        for below in ["", "/op", "/set/a\u{1e}3:b", "/12:/x~1y"] {
            let message = nested(below, "invalid type: 3:x");
            assert_eq!(split_nested(&message), Some((below, "invalid type: 3:x")));
        }
        assert_eq!(split_nested("missing field `id`"), None);
        assert_eq!(split_nested("\u{1e}9:/op"), None, "shorter than its length");
        #[derive(Debug, serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Action {
            #[allow(dead_code, reason = "read to be checked")]
            unset: Vec<String>,
        }
        let err = read_nested::<Action>(serde_json::json!({"unset": ["a", 3]})).unwrap_err();
        assert_eq!(split_nested(&err).map(|(at, _)| at), Some("/unset/1"));
        let err = read_nested::<Action>(serde_json::json!({"a/b": 1})).unwrap_err();
        assert_eq!(split_nested(&err).map(|(at, _)| at), Some("/a~1b"), "an unknown member, escaped");
    }

    fn headers(name: header::HeaderName, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    #[test]
    fn if_match_forms() {
        assert_eq!(if_match(&HeaderMap::new()).unwrap(), None);
        assert_eq!(if_match(&headers(header::IF_MATCH, "*")).unwrap(), None);
        assert_eq!(if_match(&headers(header::IF_MATCH, "\"12\"")).unwrap(), Some(12));
        assert_eq!(if_match(&headers(header::IF_MATCH, "12")).unwrap(), Some(12), "a bare version is its tag");
        for bad in ["\"12", "12\"", "\"x\"", "x", "W/\"1\"", "\"1\", \"2\"", "\"-1\"", "\"+1\"", "+1", "\"\""] {
            assert_eq!(
                if_match(&headers(header::IF_MATCH, bad)).unwrap_err().status(),
                StatusCode::BAD_REQUEST,
                "{bad}"
            );
        }
    }

    #[test]
    fn a_duplicated_member_anywhere_is_named_by_its_pointer() {
        assert_eq!(duplicate_member(br#"{"a":1,"b":2}"#), None);
        assert_eq!(duplicate_member(br#"{"a":1,"a":2}"#).as_deref(), Some("/a"));
        let nested = br#"{"hooks":[{"url":"x"},{"url":"y","url":"z"}]}"#;
        assert_eq!(duplicate_member(nested).as_deref(), Some("/hooks/1/url"));
        assert_eq!(duplicate_member(br#"{"a/b":{"~":1,"~":2}}"#).as_deref(), Some("/a~1b/~0"));
        assert_eq!(duplicate_member(br#"{"a":1,"a""#), None, "malformed JSON is left to the parser");
        let err = parse_json::<serde_json::Value>(br#"{"x":{"k":1,"k":1}}"#).unwrap_err();
        assert_eq!((err.status(), err.code), (StatusCode::UNPROCESSABLE_ENTITY, ProblemCode::ValidationFailed));
        assert_eq!(err.members.errors.as_ref().unwrap()[0].pointer, "/x/k");
    }

    #[test]
    fn if_none_match_lists() {
        assert!(if_none_match(&headers(header::IF_NONE_MATCH, "\"1\", W/\"3\"")).unwrap().matches(3));
        assert!(!if_none_match(&headers(header::IF_NONE_MATCH, "\"1\"")).unwrap().matches(3));
        assert!(if_none_match(&headers(header::IF_NONE_MATCH, "*")).unwrap().matches(3));
        assert!(!if_none_match(&HeaderMap::new()).unwrap().matches(3));
        assert!(if_none_match(&headers(header::IF_NONE_MATCH, "junk")).is_err());
    }
}
