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

pub const MAX_ID_CHARS: usize = 256;

/// `^[a-zA-Z][a-zA-Z0-9_-]{0,63}$`: a user collection name.
pub fn is_collection_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

pub fn check_collection(name: &str, pointer: &str) -> Result<(), Invalid> {
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
pub fn check_id(id: &str, pointer: &str) -> Result<(), Invalid> {
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

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn check_value(value: &Value, pointer: &str) -> Result<(), Invalid> {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                check_key(k, pointer, false)?;
                check_value(v, &format!("{pointer}/{}", escape(k)))?;
            }
            Ok(())
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                check_value(v, &format!("{pointer}/{i}"))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Validate user fields (the whole document body) and convert them.
pub fn user_data(map: &Map<String, Value>, pointer: &str) -> Result<Document, Invalid> {
    for (k, v) in map {
        check_key(k, pointer, true)?;
        check_value(v, &format!("{pointer}/{}", escape(k)))?;
    }
    Ok(object_to_document(map))
}

/// A `{"set","unset","inc"}` patch, validated.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Patch {
    pub set: Vec<(Vec<String>, Bson)>,
    pub unset: Vec<Vec<String>>,
    pub inc: Vec<(Vec<String>, Bson)>,
}

fn path(key: &str, pointer: &str) -> Result<Vec<String>, Invalid> {
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
            check_value(v, &format!("{p}/{}", escape(k)))?;
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
        let mut all: Vec<&Vec<String>> =
            patch.set.iter().map(|(p, _)| p).chain(&patch.unset).chain(patch.inc.iter().map(|(p, _)| p)).collect();
        all.sort();
        for pair in all.windows(2) {
            if pair[1].starts_with(pair[0]) {
                return Err(Invalid::new(
                    pointer.to_owned(),
                    format!("paths {:?} and {:?} conflict", pair[0].join("."), pair[1].join(".")),
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
                Some(current) => add(current, by).ok_or_else(|| match current {
                    Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => {
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
pub fn merge_patch(data: &Document, patch: &Map<String, Value>, pointer: &str) -> Result<Document, Invalid> {
    let mut out = data.clone();
    for k in patch.keys() {
        check_key(k, pointer, true)?;
    }
    merge_into(&mut out, patch, pointer)?;
    Ok(out)
}

fn merge_into(target: &mut Document, patch: &Map<String, Value>, pointer: &str) -> Result<(), Invalid> {
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
                merge_into(&mut base, inner, &p)?;
                target.insert(k.clone(), Bson::Document(base));
            }
            other => {
                check_value(other, &p)?;
                target.insert(k.clone(), json_to_bson(other));
            }
        }
    }
    Ok(())
}

fn add(current: &Bson, by: &Bson) -> Option<Bson> {
    match (current, by) {
        (Bson::Int64(a), Bson::Int64(b)) => a.checked_add(*b).map(Bson::Int64),
        (Bson::Int32(a), Bson::Int64(b)) => i64::from(*a).checked_add(*b).map(Bson::Int64),
        (Bson::Double(a), Bson::Int64(b)) => Some(Bson::Double(a + *b as f64)),
        (Bson::Int64(a), Bson::Double(b)) => Some(Bson::Double(*a as f64 + b)),
        (Bson::Int32(a), Bson::Double(b)) => Some(Bson::Double(f64::from(*a) + b)),
        (Bson::Double(a), Bson::Double(b)) => Some(Bson::Double(a + b)),
        _ => None,
    }
}
