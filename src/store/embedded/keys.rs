//! Order-preserving byte encoding of index keys for the embedded store: the
//! bytes of two keys compare as MongoDB compares the values (type bracket
//! first, in MongoDB's bracket order, then the value), so a range of an
//! index is a range of bytes.
//!
//! Every value starts with a tag byte naming its bracket. Numbers of every
//! BSON type share one bracket (ordered as `f64`, ties broken by the exact
//! integer, so `2`, `2_i64` and `2.0` are one key). Strings are their bytes
//! with `0x00` escaped as `0x00 0xFF` and ended by `0x00 0x00`, so a string
//! sorts before every string it is a prefix of. Documents, arrays and other
//! rare types are kept by their BSON bytes: equal values give equal keys,
//! but their order is not MongoDB's (no index the gateway declares orders
//! by them). [`END`] is greater than every encoded value.

use crate::store::Bson;

const NULL: u8 = 0x0A;
const NUMBER: u8 = 0x10;
const STRING: u8 = 0x14;
const DOCUMENT: u8 = 0x1E;
const ARRAY: u8 = 0x28;
const BINARY: u8 = 0x32;
const OBJECT_ID: u8 = 0x3C;
const BOOLEAN: u8 = 0x46;
const DATE: u8 = 0x50;
const TIMESTAMP: u8 = 0x5A;
const OTHER: u8 = 0x64;
const MAX_KEY: u8 = 0xF0;
/// Greater than the first byte of any encoded value.
pub(crate) const END: u8 = 0xFF;

/// The tag (type bracket) of `value`; a missing field is `None`, indexed as
/// null as MongoDB does.
pub(crate) fn tag(value: Option<&Bson>) -> u8 {
    match value {
        None | Some(Bson::Null | Bson::Undefined) => NULL,
        Some(Bson::MinKey) => 0x05,
        Some(Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_)) => NUMBER,
        Some(Bson::String(_) | Bson::Symbol(_)) => STRING,
        Some(Bson::Document(_)) => DOCUMENT,
        Some(Bson::Array(_)) => ARRAY,
        Some(Bson::Binary(_)) => BINARY,
        Some(Bson::ObjectId(_)) => OBJECT_ID,
        Some(Bson::Boolean(_)) => BOOLEAN,
        Some(Bson::DateTime(_)) => DATE,
        Some(Bson::Timestamp(_)) => TIMESTAMP,
        Some(Bson::MaxKey) => MAX_KEY,
        Some(_) => OTHER,
    }
}

/// An `i64` as 8 bytes whose unsigned order is the signed order.
fn ordered_i64(n: i64) -> [u8; 8] {
    ((n as u64) ^ (1 << 63)).to_be_bytes()
}

/// An `f64` as 8 bytes whose unsigned order is the numeric order (all NaNs
/// first, as MongoDB orders NaN below every number; -0.0 equal to 0.0).
fn ordered_f64(x: f64) -> [u8; 8] {
    if x.is_nan() {
        return [0; 8];
    }
    let x = if x == 0.0 { 0.0 } else { x };
    let bits = x.to_bits();
    let bits = if bits >> 63 == 1 { !bits } else { bits | (1 << 63) };
    bits.to_be_bytes()
}

fn escaped(out: &mut Vec<u8>, bytes: &[u8]) {
    for &b in bytes {
        out.push(b);
        if b == 0 {
            out.push(0xFF);
        }
    }
    out.extend_from_slice(&[0, 0]);
}

/// Append the encoding of `value` to `out`.
pub(crate) fn push(out: &mut Vec<u8>, value: Option<&Bson>) {
    let tag = tag(value);
    out.push(tag);
    let Some(value) = value else { return };
    match value {
        Bson::Int32(n) => number(out, f64::from(*n), i64::from(*n)),
        Bson::Int64(n) => number(out, *n as f64, *n),
        Bson::Double(x) => number(out, *x, if x.is_finite() { *x as i64 } else { 0 }),
        Bson::String(s) | Bson::Symbol(s) => escaped(out, s.as_bytes()),
        Bson::Boolean(b) => out.push(u8::from(*b)),
        Bson::DateTime(d) => out.extend_from_slice(&ordered_i64(d.timestamp_millis())),
        Bson::Timestamp(t) => {
            out.extend_from_slice(&t.time.to_be_bytes());
            out.extend_from_slice(&t.increment.to_be_bytes());
        }
        Bson::ObjectId(o) => out.extend_from_slice(&o.bytes()),
        Bson::Null | Bson::Undefined | Bson::MinKey | Bson::MaxKey => {}
        other => {
            // Equality only: the value's BSON bytes inside a document.
            let mut bytes = Vec::new();
            let wrapped = crate::store::doc! {"v": other.clone()};
            wrapped.to_writer(&mut bytes).expect("a BSON value serializes");
            escaped(out, &bytes);
        }
    }
}

fn number(out: &mut Vec<u8>, approx: f64, exact: i64) {
    out.extend_from_slice(&ordered_f64(approx));
    out.extend_from_slice(&ordered_i64(exact));
}

/// Append the encoding of `value` to `out`, its bytes inverted when the
/// field is descending: every encoding is self-delimiting (no encoding is
/// a prefix of another), so inverting each byte exactly reverses the order
/// of a field's values while later fields still order the ties.
pub(crate) fn push_dir(out: &mut Vec<u8>, value: Option<&Bson>, desc: bool) {
    let from = out.len();
    push(out, value);
    if desc {
        for b in &mut out[from..] {
            *b = !*b;
        }
    }
}

/// The first byte of an encoding: its tag, inverted for a descending field.
pub(crate) fn tag_dir(value: Option<&Bson>, desc: bool) -> u8 {
    if desc { !tag(value) } else { tag(value) }
}

/// The encoding of a sequence of values.
pub(crate) fn encode<'a>(values: impl IntoIterator<Item = Option<&'a Bson>>) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        push(&mut out, v);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::*;
    use crate::store::DateTime;
    use crate::store::filter::sort_order;

    fn values() -> Vec<Bson> {
        let mut v = vec![
            Bson::Null,
            Bson::Int32(-3),
            Bson::Int64(-2),
            Bson::Double(-1.5),
            Bson::Int32(0),
            Bson::Double(0.5),
            Bson::Int64(1),
            Bson::Double(2.0),
            Bson::Int64(2),
            Bson::Int64(1 << 60),
            Bson::Int64((1 << 60) + 1),
            Bson::Boolean(false),
            Bson::Boolean(true),
            Bson::DateTime(DateTime::from_millis(-5)),
            Bson::DateTime(DateTime::from_millis(0)),
            Bson::DateTime(DateTime::from_millis(1_700_000_000_000)),
        ];
        for s in ["", "\0", "\0a", "a", "a\0", "a\0b", "ab", "b", "é", "z\u{10FFFF}"] {
            v.push(Bson::String(s.into()));
        }
        v
    }

    #[test]
    fn byte_order_is_mongodb_order() {
        let values = values();
        for a in &values {
            for b in &values {
                let want = sort_order(Some(a), Some(b));
                let got = encode([Some(a)]).cmp(&encode([Some(b)]));
                assert_eq!(got, want, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn compound_keys_order_by_first_value_then_next() {
        let values = values();
        for a in &values {
            for b in &values {
                for c in ["", "a", "b"] {
                    let c = Bson::String(c.into());
                    let ka = encode([Some(a), Some(&c)]);
                    let kb = encode([Some(b), Some(&Bson::String("a".into()))]);
                    let want = sort_order(Some(a), Some(b))
                        .then_with(|| sort_order(Some(&c), Some(&Bson::String("a".into()))));
                    assert_eq!(ka.cmp(&kb), want, "{a:?},{c:?} vs {b:?},a");
                }
            }
        }
    }

    #[test]
    fn descending_fields_reverse_their_order_and_keep_the_next_ones() {
        let values = values();
        for a in &values {
            for b in &values {
                for (c, d) in [("a", "b"), ("b", "a"), ("a", "a")] {
                    let key = |v: &Bson, s: &str| {
                        let mut k = Vec::new();
                        push_dir(&mut k, Some(v), true);
                        push_dir(&mut k, Some(&Bson::String(s.into())), false);
                        k
                    };
                    let want = sort_order(Some(b), Some(a)).then_with(|| c.cmp(d));
                    assert_eq!(key(a, c).cmp(&key(b, d)), want, "-{a:?},{c} vs -{b:?},{d}");
                    assert!(key(a, c)[0] < END);
                }
            }
        }
    }

    #[test]
    fn missing_is_null_and_end_is_above_everything() {
        assert_eq!(encode([None]), encode([Some(&Bson::Null)]));
        for v in values() {
            assert_eq!(encode([Some(&v)]).cmp(&vec![END]), Ordering::Less);
        }
    }
}
