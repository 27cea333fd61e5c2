//! Naming rules and the changes a client can ask for: validation of
//! collection names, ids and field names, and application of `set` /
//! `unset` / `inc` patches and JSON Merge Patch (RFC 7396) to a document.

use serde_json::{Map, Value};

use crate::store::convert::{json_to_bson, object_to_document};
use crate::store::{Bson, Document};

/// Why an input was refused; `pointer` is a JSON pointer into the request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{pointer}: {message}")]
pub struct Invalid {
    pub pointer: String,
    pub message: String,
}

impl Invalid {
    pub fn new(pointer: impl Into<String>, message: impl Into<String>) -> Self {
        Self { pointer: pointer.into(), message: message.into() }
    }
}

pub(crate) const MAX_ID_CHARS: usize = 256;

/// How deeply a document's data may nest: the data object is level 1, each
/// object or array inside it one more. Stored, data sits at most three
/// levels down (a transaction's staged copy in `_meta.pending.data`, a
/// single write's event in `_meta.outbox.data`, a hook body in a
/// transaction record's `hooks[i].body`), and every stored form must stay
/// within MongoDB's nesting limit ([`MAX_STORED_DEPTH`] levels, the record
/// itself included).
pub const MAX_DATA_DEPTH: usize = crate::store::convert::MAX_STORED_DEPTH - 3;

fn too_deep(pointer: impl Into<String>) -> Invalid {
    Invalid::new(pointer, format!("nested deeper than {MAX_DATA_DEPTH} levels, the limit for document data"))
}

/// `^[a-zA-Z][a-zA-Z0-9_-]{0,63}$`: a user collection name.
pub(crate) fn is_collection_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

pub(crate) fn check_collection(name: &str, pointer: &str) -> Result<(), Invalid> {
    if is_collection_name(name) {
        Ok(())
    } else {
        Err(Invalid::new(
            pointer,
            format!(
                "collection name {name:?} must match ^[a-zA-Z][a-zA-Z0-9_-]{{0,63}}$ (names starting with '_' are reserved)"
            ),
        ))
    }
}

/// A document id: 1..256 printable characters.
pub(crate) fn check_id(id: &str, pointer: &str) -> Result<(), Invalid> {
    let count = id.chars().count();
    if count == 0 || count > MAX_ID_CHARS {
        return Err(Invalid::new(pointer, format!("id must have 1..{MAX_ID_CHARS} characters, has {count}")));
    }
    if id.chars().any(char::is_control) {
        return Err(Invalid::new(pointer, "id must contain only printable characters"));
    }
    Ok(())
}

fn check_key(key: &str, pointer: &str, top_level: bool) -> Result<(), Invalid> {
    let problem = if key.is_empty() {
        Some("field names must not be empty")
    } else if top_level && key.starts_with('_') {
        Some("top-level field names starting with '_' are reserved (use \"_id\" only to name the document)")
    } else if key.starts_with('$') {
        Some("field names must not start with '$'")
    } else if key.contains('.') {
        Some("field names must not contain '.'")
    } else if key.contains('\0') {
        Some("field names must not contain NUL")
    } else {
        None
    };
    match problem {
        Some(message) => Err(Invalid::new(format!("{pointer}/{}", escape(key)), message)),
        None => Ok(()),
    }
}

/// `key` as one segment of a JSON pointer (RFC 6901: `~` as `~0`, `/`
/// as `~1`).
pub(crate) fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// Check the field names in `value`, which sits at `level` of the data
/// (the data object is level 1): an object or array there may be at most
/// [`MAX_DATA_DEPTH`] deep. The recursion is bounded: parsed JSON nests at
/// most 128 levels, and the depth check stops it sooner.
fn check_value(value: &Value, pointer: &str, level: usize) -> Result<(), Invalid> {
    match value {
        Value::Object(_) | Value::Array(_) if level > MAX_DATA_DEPTH => Err(too_deep(pointer)),
        Value::Object(map) => {
            for (k, v) in map {
                check_key(k, pointer, false)?;
                check_value(v, &format!("{pointer}/{}", escape(k)), level + 1)?;
            }
            Ok(())
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                check_value(v, &format!("{pointer}/{i}"), level + 1)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Validate user fields (the whole document body) and convert them.
pub(crate) fn user_data(map: &Map<String, Value>, pointer: &str) -> Result<Document, Invalid> {
    for (k, v) in map {
        check_key(k, pointer, true)?;
        check_value(v, &format!("{pointer}/{}", escape(k)), 2)?;
    }
    let data = object_to_document(map);
    check_data_size(&data, if pointer.is_empty() { "/" } else { pointer })?;
    Ok(data)
}

/// How large a document's data may be, encoded as BSON. Stored, data may
/// sit in a record up to three times (the document, a staged copy, a change
/// event in its outbox), and every record must fit MongoDB's 16 MiB; the
/// embedded store journals one record at a time, so this also bounds a
/// journal entry.
pub(crate) const MAX_DATA_BYTES: usize = 4 << 20;

/// The size of `data` encoded as BSON.
pub(crate) fn data_size(data: &Document) -> usize {
    let mut out = Vec::new();
    data.to_writer(&mut out).map_or(usize::MAX, |()| out.len())
}

/// Refuse data larger than [`MAX_DATA_BYTES`] (a create, a replace, or what
/// a patch or merge would make of a document).
pub(crate) fn check_data_size(data: &Document, pointer: &str) -> Result<(), Invalid> {
    let size = data_size(data);
    if size > MAX_DATA_BYTES {
        return Err(Invalid::new(
            pointer,
            format!("the document's data would be {size} bytes, over the limit of {MAX_DATA_BYTES} (as BSON)"),
        ));
    }
    Ok(())
}

/// `value` with every integer past the signed 64-bit range made a double,
/// as document data is stored ([`json_to_bson`]): BSON has no unsigned
/// 64-bit integers. For JSON kept as BSON as it is (a hook's body).
pub(crate) fn storable_numbers(value: &mut Value) {
    match value {
        Value::Number(n) if n.as_i64().is_none() && n.is_u64() => {
            *value = n.as_f64().and_then(serde_json::Number::from_f64).map_or(Value::Null, Value::Number);
        }
        Value::Array(items) => items.iter_mut().for_each(storable_numbers),
        Value::Object(map) => map.values_mut().for_each(storable_numbers),
        _ => {}
    }
}

/// A hook's `body` (any JSON), stored with the transaction record as data
/// is: within the same depth.
pub(crate) fn check_body_depth(body: &Value, pointer: &str) -> Result<(), Invalid> {
    if crate::store::convert::json_depth(body) > MAX_DATA_DEPTH {
        return Err(too_deep(pointer));
    }
    Ok(())
}

/// A `{"set","unset","inc"}` patch, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Patch {
    pub set: Vec<(Vec<String>, Bson)>,
    pub unset: Vec<Vec<String>>,
    pub inc: Vec<(Vec<String>, Bson)>,
}

/// A dotted path, checked: `a.b` names field `b` of the object in field
/// `a`, so a path of n parts reaches level n of the data.
fn path(key: &str, pointer: &str) -> Result<Vec<String>, Invalid> {
    if key.split('.').nth(MAX_DATA_DEPTH).is_some() {
        return Err(too_deep(format!("{pointer}/{}", escape(key))));
    }
    let parts: Vec<String> = key.split('.').map(str::to_owned).collect();
    for (i, part) in parts.iter().enumerate() {
        check_key(part, pointer, i == 0).map_err(|e| Invalid::new(format!("{pointer}/{}", escape(key)), e.message))?;
    }
    Ok(parts)
}

impl Patch {
    /// Build from the wire form. Keys may be dotted paths into nested
    /// objects; a path may appear in only one of the three parts.
    pub fn parse(
        set: Option<&Map<String, Value>>,
        unset: Option<&[String]>,
        inc: Option<&Map<String, Value>>,
        pointer: &str,
    ) -> Result<Self, Invalid> {
        let mut patch = Patch::default();
        for (k, v) in set.into_iter().flatten() {
            let p = format!("{pointer}/set");
            let parts = path(k, &p)?;
            // The value sits one level below the path's last parent.
            check_value(v, &format!("{p}/{}", escape(k)), parts.len() + 1)?;
            patch.set.push((parts, json_to_bson(v)));
        }
        for (i, k) in unset.into_iter().flatten().enumerate() {
            let parts = path(k, &format!("{pointer}/unset"))
                .map_err(|e| Invalid::new(format!("{pointer}/unset/{i}"), e.message))?;
            patch.unset.push(parts);
        }
        for (k, v) in inc.into_iter().flatten() {
            let p = format!("{pointer}/inc/{}", escape(k));
            let parts = path(k, &format!("{pointer}/inc"))?;
            if !v.is_number() {
                return Err(Invalid::new(p, "inc takes a number"));
            }
            patch.inc.push((parts, json_to_bson(v)));
        }
        // Each path with where it was given: a conflict points at the
        // second of the two.
        let set = patch.set.iter().map(|(p, _)| (p, format!("{pointer}/set/{}", escape(&p.join(".")))));
        let unset = (unset.into_iter().flatten().enumerate()).map(|(i, _)| format!("{pointer}/unset/{i}"));
        let inc = patch.inc.iter().map(|(p, _)| (p, format!("{pointer}/inc/{}", escape(&p.join(".")))));
        let mut all: Vec<(&Vec<String>, String)> = set.chain(patch.unset.iter().zip(unset)).chain(inc).collect();
        all.sort();
        for pair in all.windows(2) {
            if pair[1].0.starts_with(pair[0].0) {
                return Err(Invalid::new(
                    pair[1].1.clone(),
                    format!("paths {:?} and {:?} conflict", pair[0].0.join("."), pair[1].0.join(".")),
                ));
            }
        }
        // An empty patch is a write that changes no field, as an empty
        // merge patch is.
        Ok(patch)
    }

    /// Apply to `data`; an `inc` on a non-number (or past the 64-bit range)
    /// or a path through a non-object is an invalid change.
    pub fn apply(&self, data: &Document) -> Result<Document, String> {
        let mut out = data.clone();
        for (p, v) in &self.set {
            set_path(&mut out, p, v.clone())?;
        }
        for p in &self.unset {
            unset_path(&mut out, p);
        }
        for (p, by) in &self.inc {
            let next = match get_path(&out, p) {
                None => by.clone(),
                Some(current) => add(current, by).ok_or_else(|| match (current, by) {
                    (Bson::Double(_), _) | (_, Bson::Double(_)) => {
                        format!("inc on {:?} overflows the range of a double (no infinity is stored)", p.join("."))
                    }
                    (Bson::Int32(_) | Bson::Int64(_), _) => {
                        format!("inc on {:?} overflows the 64-bit integer range", p.join("."))
                    }
                    _ => format!("inc on {:?}: the field holds a non-number", p.join(".")),
                })?,
            };
            set_path(&mut out, p, next)?;
        }
        Ok(out)
    }
}

fn get_path<'a>(doc: &'a Document, path: &[String]) -> Option<&'a Bson> {
    let (first, rest) = path.split_first()?;
    let mut current = doc.get(first)?;
    for part in rest {
        current = current.as_document()?.get(part)?;
    }
    Some(current)
}

/// Set the field at `path`, creating missing intermediate objects.
fn set_path(doc: &mut Document, path: &[String], value: Bson) -> Result<(), String> {
    let (last, parents) = path.split_last().expect("paths are non-empty");
    let mut current = doc;
    for (i, part) in parents.iter().enumerate() {
        let entry = current.entry(part.clone()).or_insert_with(|| Bson::Document(Document::new()));
        current = match entry {
            Bson::Document(inner) => inner,
            _ => return Err(format!("{:?} is not an object", path[..=i].join("."))),
        };
    }
    current.insert(last.clone(), value);
    Ok(())
}

fn unset_path(doc: &mut Document, path: &[String]) {
    let (last, parents) = path.split_last().expect("paths are non-empty");
    let mut current = doc;
    for part in parents {
        match current.get_mut(part) {
            Some(Bson::Document(inner)) => current = inner,
            _ => return,
        }
    }
    current.remove(last);
}

/// JSON Merge Patch (RFC 7396) applied to the user fields. The patch must
/// be an object; `null` removes a field; nested objects merge.
pub(crate) fn merge_patch(data: &Document, patch: &Map<String, Value>, pointer: &str) -> Result<Document, Invalid> {
    let mut out = data.clone();
    for k in patch.keys() {
        check_key(k, pointer, true)?;
    }
    merge_into(&mut out, patch, pointer, 1)?;
    Ok(out)
}

/// Merge `patch`, an object at `level` of the data, into `target`.
fn merge_into(target: &mut Document, patch: &Map<String, Value>, pointer: &str, level: usize) -> Result<(), Invalid> {
    if level > MAX_DATA_DEPTH {
        return Err(too_deep(pointer));
    }
    for (k, v) in patch {
        let p = format!("{pointer}/{}", escape(k));
        check_key(k, pointer, false)?;
        match v {
            Value::Null => {
                target.remove(k);
            }
            Value::Object(inner) => {
                let mut base = match target.get(k) {
                    Some(Bson::Document(d)) => d.clone(),
                    _ => Document::new(),
                };
                merge_into(&mut base, inner, &p, level + 1)?;
                target.insert(k.clone(), Bson::Document(base));
            }
            other => {
                check_value(other, &p, level + 1)?;
                target.insert(k.clone(), json_to_bson(other));
            }
        }
    }
    Ok(())
}

/// `current + by`, or `None` when that is not a number, overflows a
/// 64-bit integer, or is not finite (JSON has no infinity).
fn add(current: &Bson, by: &Bson) -> Option<Bson> {
    let sum = match (current, by) {
        (Bson::Int64(a), Bson::Int64(b)) => a.checked_add(*b).map(Bson::Int64),
        (Bson::Int32(a), Bson::Int64(b)) => i64::from(*a).checked_add(*b).map(Bson::Int64),
        (Bson::Double(a), Bson::Int64(b)) => Some(Bson::Double(a + *b as f64)),
        (Bson::Int64(a), Bson::Double(b)) => Some(Bson::Double(*a as f64 + b)),
        (Bson::Int32(a), Bson::Double(b)) => Some(Bson::Double(f64::from(*a) + b)),
        (Bson::Double(a), Bson::Double(b)) => Some(Bson::Double(a + b)),
        _ => None,
    };
    sum.filter(|s| !matches!(s, Bson::Double(d) if !d.is_finite()))
}
