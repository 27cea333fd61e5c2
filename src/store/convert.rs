//! Conversion between the JSON clients send and the BSON the stores keep.
//!
//! JSON integers become BSON `Int64` (so `inc` on 64-bit values keeps type
//! and precision on both backends), other numbers `Double`, and so do
//! integers past the signed 64-bit range, as MongoDB's own JSON import does. On the way back
//! dates become RFC 3339 strings, object ids hex strings, and other BSON
//! types relaxed Extended JSON.

use serde_json::{Map, Number, Value};

use super::{Bson, Document};
use crate::clock::rfc3339;

pub fn json_to_bson(value: &Value) -> Bson {
    match value {
        Value::Null => Bson::Null,
        Value::Bool(b) => Bson::Boolean(*b),
        Value::Number(n) => number_to_bson(n),
        Value::String(s) => Bson::String(s.clone()),
        Value::Array(items) => Bson::Array(items.iter().map(json_to_bson).collect()),
        Value::Object(map) => Bson::Document(object_to_document(map)),
    }
}

fn number_to_bson(n: &Number) -> Bson {
    match n.as_i64() {
        Some(i) => Bson::Int64(i),
        None => Bson::Double(n.as_f64().unwrap_or(f64::NAN)),
    }
}

pub fn object_to_document(map: &Map<String, Value>) -> Document {
    let mut doc = Document::new();
    for (key, value) in map {
        doc.insert(key.clone(), json_to_bson(value));
    }
    doc
}

pub fn bson_to_json(value: &Bson) -> Value {
    match value {
        Bson::Null | Bson::Undefined => Value::Null,
        Bson::Boolean(b) => Value::Bool(*b),
        Bson::Int32(n) => Value::from(*n),
        Bson::Int64(n) => Value::from(*n),
        Bson::Double(n) => Number::from_f64(*n).map_or(Value::Null, Value::Number),
        Bson::String(s) => Value::String(s.clone()),
        Bson::Array(items) => Value::Array(items.iter().map(bson_to_json).collect()),
        Bson::Document(doc) => Value::Object(document_to_object(doc)),
        Bson::DateTime(dt) => Value::String(rfc3339(*dt)),
        Bson::ObjectId(oid) => Value::String(oid.to_hex()),
        other => other.clone().into_relaxed_extjson(),
    }
}

pub fn document_to_object(doc: &Document) -> Map<String, Value> {
    doc.iter().map(|(k, v)| (k.clone(), bson_to_json(v))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::DateTime;
    use serde_json::json;

    #[test]
    fn integers_round_trip_exactly() {
        for n in [0_i64, -1, i64::MAX, i64::MIN, 9_007_199_254_740_993] {
            let b = json_to_bson(&json!(n));
            assert_eq!(b, Bson::Int64(n));
            assert_eq!(bson_to_json(&b), json!(n));
        }
        assert_eq!(bson_to_json(&Bson::Int32(7)), json!(7));
    }

    #[test]
    fn floats_stay_floats_and_integers_past_64_bits_become_doubles() {
        assert_eq!(json_to_bson(&json!(1.5)), Bson::Double(1.5));
        assert_eq!(bson_to_json(&Bson::Double(2.0)).to_string(), "2.0");
        assert_eq!(json_to_bson(&json!(u64::MAX)), Bson::Double(u64::MAX as f64));
        assert_eq!(json_to_bson(&json!(i64::MAX)), Bson::Int64(i64::MAX));
    }

    #[test]
    fn timestamps_have_fixed_width() {
        assert_eq!(rfc3339(DateTime::from_millis(1_700_000_000_400)), "2023-11-14T22:13:20.400Z");
    }

    #[test]
    fn nested_values_round_trip() {
        let v = json!({"a": [1, {"b": null}], "c": "x", "d": true});
        let b = json_to_bson(&v);
        assert_eq!(bson_to_json(&b), v);
    }
}
