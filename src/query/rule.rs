//! The rule every write keeps for declared indexes (docs/design.md §7),
//! and the value a document holds in a unique index: both are checked
//! wherever a document's data is written, single writes and transaction
//! members alike.

use std::collections::HashMap;

use crate::store::embedded::keys;
use crate::store::filter::lookup;
use crate::store::{Bson, Document};

/// The indexed values of one document, in one index, take at most this
/// many bytes of strings (a query's cursor carries them).
pub(crate) const MAX_KEY_BYTES: usize = 1024;

/// Why `data` breaks the rule of the indexed `paths` (index, path), if it
/// does: an indexed path holding, or passing through, an array or an
/// object, or one index's string values longer than [`MAX_KEY_BYTES`].
pub(crate) fn breaks_rule(paths: &[(String, String)], data: &Document) -> Option<String> {
    let mut key_bytes: HashMap<&str, usize> = HashMap::new();
    for (index, path) in paths {
        let mut current = Some(data);
        let segments: Vec<&str> = path.split('.').collect();
        for (i, segment) in segments.iter().enumerate() {
            let Some(doc) = current else { break };
            let last = i + 1 == segments.len();
            match doc.get(*segment) {
                Some(Bson::Array(_)) => {
                    return Some(format!("{path} is indexed (index {index}): it cannot hold or pass through an array"));
                }
                Some(Bson::Document(inner)) if !last => current = Some(inner),
                Some(Bson::Document(_)) => {
                    return Some(format!("{path} is indexed (index {index}): it cannot hold an object"));
                }
                Some(Bson::String(s)) if last => {
                    let total = key_bytes.entry(index.as_str()).or_default();
                    *total += s.len();
                    if *total > MAX_KEY_BYTES {
                        return Some(format!(
                            "the strings at the paths of index {index} take more than {MAX_KEY_BYTES} bytes together"
                        ));
                    }
                    current = None;
                }
                _ => current = None,
            }
        }
    }
    None
}

/// The key of the value `data` holds at `paths` (a unique index's), if it
/// holds one: a document that lacks every path (or holds null there)
/// holds none. Numbers of every kind give one key per number.
///
/// The key names the value's reservation record in `_unique` on every
/// store, so it keeps the encoding reservations were first named with
/// ([`keys::Numbers::Layout2`]): a reservation made by an earlier release
/// still holds its value. In it the integer 2^63 − 1 and the double 2^63
/// are one value, on both stores alike.
pub(crate) fn unique_key(paths: &[String], data: &Document) -> Option<Vec<u8>> {
    let values: Vec<Option<&Bson>> = paths.iter().map(|p| lookup(data, p)).collect();
    if values.iter().all(|v| matches!(v, None | Some(Bson::Null))) {
        return None;
    }
    Some(keys::encode_in(values, keys::Numbers::Layout2))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn data(value: serde_json::Value) -> Document {
        crate::store::convert::object_to_document(value.as_object().expect("an object"))
    }

    #[test]
    fn the_rule_refuses_arrays_and_objects_on_indexed_paths() {
        let paths = vec![("i".to_owned(), "a.b".to_owned()), ("j".to_owned(), "c".to_owned())];
        assert!(breaks_rule(&paths, &data(json!({"a": {"b": 1}, "c": "x"}))).is_none());
        assert!(breaks_rule(&paths, &data(json!({"a": 5}))).is_none(), "a.b is missing under a scalar");
        assert!(breaks_rule(&paths, &data(json!({"a": [{"b": 1}]}))).is_some());
        assert!(breaks_rule(&paths, &data(json!({"a": {"b": [1]}}))).is_some());
        assert!(breaks_rule(&paths, &data(json!({"a": {"b": {"x": 1}}}))).is_some());
        assert!(breaks_rule(&paths, &data(json!({"c": {"x": 1}}))).is_some());
        assert!(breaks_rule(&paths, &data(json!({"d": [1]}))).is_none());
        assert!(breaks_rule(&paths, &data(json!({"c": "x".repeat(MAX_KEY_BYTES)}))).is_none());
        assert!(breaks_rule(&paths, &data(json!({"c": "x".repeat(MAX_KEY_BYTES + 1)}))).is_some());
    }
}
