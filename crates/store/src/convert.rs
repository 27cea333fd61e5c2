//! Conversion between the JSON clients send and the BSON the stores keep.
//!
//! JSON integers become BSON `Int64` (so `inc` on 64-bit values keeps type
//! and precision on both backends), other numbers `Double`, and so do
//! integers past the signed 64-bit range, as MongoDB's own JSON import does. On the way back
//! dates become RFC 3339 strings, object ids hex strings, and other BSON
//! types relaxed Extended JSON.

use mongodb::bson::{RawBsonRef, RawDocument};
use serde_json::{Map, Number, Value};

use super::{Bson, DateTime, Document};

/// The nesting MongoDB allows in a stored document: each object or array is
/// a level, the document itself included.
pub const MAX_STORED_DEPTH: usize = 100;

/// Records deeper than this are not decoded (a margin over what may be
/// stored): decoding recurses once per level, so an unbounded depth would
/// be an unbounded stack.
pub(crate) const MAX_DECODE_DEPTH: usize = 128;

/// How deeply `value` nests: 0 for a scalar, 1 for an object or array of
/// scalars, and so on. Iterative, so any depth is safe to measure.
pub fn json_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0_usize)];
    while let Some((value, level)) = stack.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Object(map) => Box::new(map.values()),
            Value::Array(items) => Box::new(items.iter()),
            _ => continue,
        };
        deepest = deepest.max(level + 1);
        stack.extend(children.map(|child| (child, level + 1)));
    }
    deepest
}

/// Why a stored record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Undecodable(pub String);

/// Decode a stored record: its structure and depth are checked first,
/// without recursion, so a record that is corrupt or nested beyond
/// [`MAX_DECODE_DEPTH`] (written by another tool, or by a release without
/// the write-side bound) is refused instead of exhausting the stack.
pub fn decode(bytes: &[u8]) -> Result<Document, Undecodable> {
    let raw = RawDocument::from_bytes(bytes).map_err(|e| Undecodable(format!("not a BSON document: {e}")))?;
    decode_raw(raw, 1)
}

/// [`decode`] of the top-level `fields` of a record only (those it has),
/// each checked as [`decode`] checks it; the others are not parsed.
pub(crate) fn decode_fields(bytes: &[u8], fields: &[&str]) -> Result<Document, Undecodable> {
    let raw = RawDocument::from_bytes(bytes).map_err(malformed)?;
    let mut doc = Document::new();
    for field in fields {
        if let Some(value) = raw.get(field).map_err(malformed)? {
            doc.insert(*field, value_at(value, 1)?);
        }
    }
    Ok(doc)
}

fn malformed(e: mongodb::bson::raw::Error) -> Undecodable {
    Undecodable(format!("not a BSON document: {e}"))
}

/// Refuses an object or array at `level` past [`MAX_DECODE_DEPTH`].
fn within_depth(level: usize) -> Result<(), Undecodable> {
    if level > MAX_DECODE_DEPTH {
        return Err(Undecodable(format!("nested deeper than {MAX_DECODE_DEPTH} levels")));
    }
    Ok(())
}

/// [`decode`] for a record already framed as a raw document, at nesting
/// `level` (the record itself is level 1): one pass that parses every
/// element and refuses an object or array deeper than [`MAX_DECODE_DEPTH`]
/// levels before descending into it, so the recursion is bounded whatever
/// the bytes claim.
pub(crate) fn decode_raw(raw: &RawDocument, level: usize) -> Result<Document, Undecodable> {
    within_depth(level)?;
    let mut doc = Document::new();
    for element in raw {
        let (key, value) = element.map_err(malformed)?;
        doc.insert(key.to_owned(), value_at(value, level)?);
    }
    Ok(doc)
}

/// An element of a level-`level` object or array.
fn value_at(value: RawBsonRef<'_>, level: usize) -> Result<Bson, Undecodable> {
    Ok(match value {
        RawBsonRef::Document(inner) => Bson::Document(decode_raw(inner, level + 1)?),
        RawBsonRef::Array(inner) => {
            within_depth(level + 1)?;
            let mut items = Vec::new();
            for item in inner {
                items.push(value_at(item.map_err(malformed)?, level + 1)?);
            }
            Bson::Array(items)
        }
        RawBsonRef::JavaScriptCodeWithScope(code) => {
            Bson::JavaScriptCodeWithScope(mongodb::bson::JavaScriptCodeWithScope {
                code: code.code.to_owned(),
                scope: decode_raw(code.scope, level + 1)?,
            })
        }
        // A scalar: no nesting, nothing copied twice.
        scalar => Bson::try_from(scalar).map_err(malformed)?,
    })
}

/// Check a stored record as [`decode`] does (its structure, every element
/// and its depth) without building it: a record that passes is written
/// as JSON by [`serialize_raw_document`] and its values convert to BSON
/// without error. One pass, nothing allocated.
pub fn check(bytes: &[u8]) -> Result<&RawDocument, Undecodable> {
    let raw = RawDocument::from_bytes(bytes).map_err(malformed)?;
    check_at(raw, 1)?;
    Ok(raw)
}

fn check_at(raw: &RawDocument, level: usize) -> Result<(), Undecodable> {
    within_depth(level)?;
    for element in raw {
        let (_, value) = element.map_err(malformed)?;
        check_value(value, level)?;
    }
    Ok(())
}

/// An element of a level-`level` object or array, as [`value_at`] reads it.
fn check_value(value: RawBsonRef<'_>, level: usize) -> Result<(), Undecodable> {
    match value {
        RawBsonRef::Document(inner) => check_at(inner, level + 1),
        RawBsonRef::Array(inner) => {
            within_depth(level + 1)?;
            for item in inner {
                check_value(item.map_err(malformed)?, level + 1)?;
            }
            Ok(())
        }
        RawBsonRef::JavaScriptCodeWithScope(code) => check_at(code.scope, level + 1),
        // A scalar the iterator parsed converts to BSON without error.
        _ => Ok(()),
    }
}

/// The `_id` of a raw record, for reporting one that cannot be decoded.
pub(crate) fn raw_id(raw: &RawDocument) -> String {
    match raw.get("_id") {
        Ok(Some(RawBsonRef::String(id))) => id.to_owned(),
        Ok(Some(other)) => format!("{other:?}"),
        _ => "?".to_owned(),
    }
}

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

/// `doc` as a JSON object, as [`AsJson`] writes it (the one writer of
/// BSON as JSON: dates as RFC 3339, object ids as hex, non-finite numbers
/// as `null`, other BSON types as relaxed Extended JSON).
pub fn document_to_object(doc: &Document) -> Map<String, Value> {
    match serde_json::to_value(Object(doc)).expect("a document writes as JSON") {
        Value::Object(map) => map,
        _ => unreachable!("a document writes as an object"),
    }
}

/// A document written as an object (for [`document_to_object`]).
struct Object<'a>(&'a Document);

impl serde::Serialize for Object<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serialize_document(self.0, s)
    }
}

/// A value written as JSON straight to the serializer: a response of many
/// documents builds no JSON value first; [`document_to_object`] is the
/// same writing into a value.
pub(crate) struct AsJson<'a>(pub &'a Bson);

impl serde::Serialize for AsJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            Bson::Null | Bson::Undefined => s.serialize_unit(),
            Bson::Boolean(b) => s.serialize_bool(*b),
            Bson::Int32(n) => s.serialize_i32(*n),
            Bson::Int64(n) => s.serialize_i64(*n),
            Bson::Double(n) if n.is_finite() => s.serialize_f64(*n),
            Bson::Double(_) => s.serialize_unit(),
            Bson::String(text) => s.serialize_str(text),
            Bson::Array(items) => s.collect_seq(items.iter().map(AsJson)),
            Bson::Document(doc) => serialize_document(doc, s),
            Bson::DateTime(dt) => s.serialize_str(&rfc3339(*dt)),
            Bson::ObjectId(oid) => s.serialize_str(&oid.to_hex()),
            other => other.clone().into_relaxed_extjson().serialize(s),
        }
    }
}

/// A value of a stored record written as JSON straight from its bytes,
/// exactly as [`AsJson`] writes the decoded value: a page of documents
/// read along an index is written without building them. For records
/// [`check`] passed (an element it cannot read is a serializer error).
pub(crate) struct RawAsJson<'a>(pub RawBsonRef<'a>);

impl serde::Serialize for RawAsJson<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{Error as _, SerializeSeq as _};
        match self.0 {
            RawBsonRef::Null | RawBsonRef::Undefined => s.serialize_unit(),
            RawBsonRef::Boolean(b) => s.serialize_bool(b),
            RawBsonRef::Int32(n) => s.serialize_i32(n),
            RawBsonRef::Int64(n) => s.serialize_i64(n),
            RawBsonRef::Double(n) if n.is_finite() => s.serialize_f64(n),
            RawBsonRef::Double(_) => s.serialize_unit(),
            RawBsonRef::String(text) => s.serialize_str(text),
            RawBsonRef::Array(items) => {
                let mut seq = s.serialize_seq(None)?;
                for item in items {
                    seq.serialize_element(&RawAsJson(item.map_err(S::Error::custom)?))?;
                }
                seq.end()
            }
            RawBsonRef::Document(doc) => serialize_raw_document(doc, &[], s),
            RawBsonRef::DateTime(dt) => s.serialize_str(&rfc3339(dt)),
            RawBsonRef::ObjectId(oid) => s.serialize_str(&oid.to_hex()),
            other => Bson::try_from(other).map_err(S::Error::custom)?.into_relaxed_extjson().serialize(s),
        }
    }
}

/// Raw document `doc` as [`serialize_document`] writes it decoded,
/// without its top-level fields named in `skip`.
pub fn serialize_raw_document<S: serde::Serializer>(doc: &RawDocument, skip: &[&str], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::{Error as _, SerializeMap as _};
    let mut map = s.serialize_map(None)?;
    for element in doc {
        let (key, value) = element.map_err(S::Error::custom)?;
        if !skip.contains(&key) {
            map.serialize_entry(key, &RawAsJson(value))?;
        }
    }
    map.end()
}

/// `doc` as [`document_to_object`] shows it (for `serialize_with`).
pub fn serialize_document<S: serde::Serializer>(doc: &Document, s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(doc.iter().map(|(k, v)| (k, AsJson(v))))
}

/// RFC 3339 with milliseconds, UTC (`2026-01-02T03:04:05.678Z`).
pub fn rfc3339(dt: DateTime) -> String {
    let Ok(t) = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(dt.timestamp_millis()) * 1_000_000) else {
        return dt.timestamp_millis().to_string();
    };
    let Ok(year) = u32::try_from(t.year()) else { return formatted(t, dt) };
    if year > 9999 {
        return formatted(t, dt);
    }
    // Every response carries two of these per document: the digits are
    // placed directly rather than through a format description.
    let mut out = *b"0000-00-00T00:00:00.000Z";
    let mut put = |at: usize, width: usize, mut n: u32| {
        for i in (at..at + width).rev() {
            out[i] = b'0' + (n % 10) as u8;
            n /= 10;
        }
    };
    put(0, 4, year);
    put(5, 2, u32::from(u8::from(t.month())));
    put(8, 2, u32::from(t.day()));
    put(11, 2, u32::from(t.hour()));
    put(14, 2, u32::from(t.minute()));
    put(17, 2, u32::from(t.second()));
    put(20, 3, u32::from(t.millisecond()));
    String::from_utf8_lossy(&out).into_owned()
}

/// [`rfc3339`] of a year outside 0..=9999, through `time`'s formatter.
fn formatted(t: time::OffsetDateTime, dt: DateTime) -> String {
    const FORMAT: &[time::format_description::FormatItem<'static>] =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z");
    t.format(FORMAT).unwrap_or_else(|_| dt.timestamp_millis().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_written_as_the_format_description_writes_them() {
        let mut ms: i64 = -62_135_596_800_000; // 0001-01-01
        let step = 9_876_543_210_987;
        while ms < 253_402_300_799_999 {
            let t = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000).unwrap();
            assert_eq!(rfc3339(DateTime::from_millis(ms)), formatted(t, DateTime::from_millis(ms)), "{ms}");
            ms += step;
        }
        assert_eq!(rfc3339(DateTime::from_millis(0)), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(DateTime::from_millis(253_402_300_799_999)), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(DateTime::from_millis(-1)), "1969-12-31T23:59:59.999Z");
    }

    /// A record `levels` objects deep (`{"a": {"a": ... {}}}`), built as
    /// bytes in one pass.
    fn deep_bytes(levels: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(levels * 8 + 5);
        for k in (1..=levels).rev() {
            out.extend_from_slice(&((5 + 8 * k) as i32).to_le_bytes());
            out.extend_from_slice(&[3, b'a', 0]);
        }
        out.extend_from_slice(&[5, 0, 0, 0, 0]);
        out.extend(std::iter::repeat_n(0, levels));
        out
    }

    #[test]
    fn decoding_is_bounded_in_depth_and_refuses_corruption() {
        // A million levels: refused without touching the stack.
        assert!(decode(&deep_bytes(1_000_000)).unwrap_err().0.contains("nested deeper"));
        assert!(decode(&deep_bytes(MAX_DECODE_DEPTH)).unwrap_err().0.contains("nested deeper"));
        assert!(decode(&deep_bytes(MAX_DECODE_DEPTH - 1)).is_ok());
        let mut corrupt = deep_bytes(3);
        corrupt[9] = 0x7f;
        assert!(decode(&corrupt).is_err());
        assert!(decode(&[1, 2, 3]).is_err());
    }

    #[test]
    fn json_depth_counts_objects_and_arrays() {
        assert_eq!(json_depth(&serde_json::json!(1)), 0);
        assert_eq!(json_depth(&serde_json::json!({"a": 1})), 1);
        assert_eq!(json_depth(&serde_json::json!({"a": [1, {"b": []}]})), 4);
    }
    use crate::DateTime;
    use serde_json::json;

    fn bson_to_json(value: &Bson) -> Value {
        serde_json::to_value(AsJson(value)).unwrap()
    }

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

    /// A record of every BSON type, nested in objects and arrays.
    fn every_type() -> Document {
        use mongodb::bson::{
            Binary, DateTime, Decimal128, JavaScriptCodeWithScope, Regex, Timestamp, doc, oid::ObjectId,
        };
        let scalars = doc! {
            "double": 1.5, "whole": 2.0, "nan": f64::NAN, "string": "t\u{e9}xt \"q\"", "int32": 7_i32, "int64": i64::MAX,
            "bool": true, "null": Bson::Null, "undefined": Bson::Undefined, "date": DateTime::from_millis(1_700_000_000_400),
            "oid": ObjectId::from_bytes([1; 12]), "binary": Binary { subtype: mongodb::bson::spec::BinarySubtype::Generic, bytes: vec![1, 2, 3] },
            "regex": Regex { pattern: "^a".into(), options: "i".into() }, "ts": Timestamp { time: 1, increment: 2 },
            "decimal": Decimal128::from_bytes([0; 16]), "code": Bson::JavaScriptCode("f()".into()),
            "scoped": Bson::JavaScriptCodeWithScope(JavaScriptCodeWithScope { code: "g()".into(), scope: doc! {"x": 1} }),
            "min": Bson::MinKey, "max": Bson::MaxKey, "symbol": Bson::Symbol("s".into()),
        };
        doc! {"_id": "a", "z": 1, "a": scalars.clone(), "list": [scalars.clone(), [1, [2, {"b": []}]], "x"], "empty": {}}
    }

    #[test]
    fn decoding_agrees_with_the_bson_crate() {
        let record = every_type();
        let bytes = mongodb::bson::to_vec(&record).unwrap();
        let ours = decode(&bytes).unwrap();
        let theirs = Document::try_from(RawDocument::from_bytes(&bytes).unwrap()).unwrap();
        // NaN is not equal to itself: compare the bytes each encodes to.
        assert_eq!(mongodb::bson::to_vec(&ours).unwrap(), mongodb::bson::to_vec(&theirs).unwrap());
        assert_eq!(ours.keys().collect::<Vec<_>>(), record.keys().collect::<Vec<_>>());
    }

    #[test]
    fn json_values_are_written_as_json_is() {
        let record = every_type();
        // Written straight out or into a value, the same text: the same
        // member order, the same numbers.
        let direct = serde_json::to_string(&AsJson(&Bson::Document(record.clone()))).unwrap();
        let built = serde_json::to_string(&document_to_object(&record)).unwrap();
        assert_eq!(direct, built);
        // What the types JSON has no word for become.
        let mut nan = Document::new();
        nan.insert("n", f64::NAN);
        nan.insert("i", f64::INFINITY);
        nan.insert("d", DateTime::from_millis(0));
        nan.insert("o", mongodb::bson::oid::ObjectId::from_bytes([1; 12]));
        assert_eq!(
            Value::Object(document_to_object(&nan)),
            json!({"n": null, "i": null, "d": "1970-01-01T00:00:00.000Z", "o": "010101010101010101010101"})
        );
    }

    #[test]
    fn raw_records_are_checked_and_written_as_decoded_ones() {
        let record = every_type();
        let bytes = mongodb::bson::to_vec(&record).unwrap();
        let raw = check(&bytes).unwrap();
        // The same text as the decoded document, member for member.
        struct Raw<'a>(&'a RawDocument, &'a [&'a str]);
        impl serde::Serialize for Raw<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                serialize_raw_document(self.0, self.1, s)
            }
        }
        let decoded = serde_json::to_string(&AsJson(&Bson::Document(record.clone()))).unwrap();
        assert_eq!(serde_json::to_string(&Raw(raw, &[])).unwrap(), decoded);
        let mut without = record.clone();
        without.remove("_id");
        without.remove("list");
        let decoded = serde_json::to_string(&AsJson(&Bson::Document(without))).unwrap();
        assert_eq!(serde_json::to_string(&Raw(raw, &["_id", "list"])).unwrap(), decoded);
        // Refused where decoding refuses.
        assert!(check(&deep_bytes(MAX_DECODE_DEPTH)).unwrap_err().0.contains("nested deeper"));
        assert!(check(&deep_bytes(MAX_DECODE_DEPTH - 1)).is_ok());
        let mut corrupt = deep_bytes(3);
        corrupt[9] = 0x7f;
        assert!(check(&corrupt).is_err());
        assert!(check(&[1, 2, 3]).is_err());
        // A string that is not UTF-8.
        let mut bad = mongodb::bson::to_vec(&mongodb::bson::doc! {"s": "ab"}).unwrap();
        let at = bad.len() - 3;
        bad[at] = 0xff;
        assert!(decode(&bad).is_err());
        assert!(check(&bad).is_err());
    }

    #[test]
    fn nested_values_round_trip() {
        let v = json!({"a": [1, {"b": null}], "c": "x", "d": true});
        let b = json_to_bson(&v);
        assert_eq!(bson_to_json(&b), v);
    }
}
