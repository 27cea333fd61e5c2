//! Order-preserving byte encoding of index keys for the embedded store: the
//! bytes of two keys compare as MongoDB compares the values (type bracket
//! first, in MongoDB's bracket order, then the value), so a range of an
//! index is a range of bytes.
//!
//! Every value starts with a tag byte naming its bracket. Numbers of every
//! BSON type share one bracket (ordered as `f64`, ties broken by the exact
//! integer, so `2`, `2_i64` and `2.0` are one key; see [`number`] for the
//! integers whose nearest double is 2^63). Strings are their bytes
//! with `0x00` escaped as `0x00 0xFF` and ended by `0x00 0x00`, so a string
//! sorts before every string it is a prefix of. Documents, arrays and other
//! rare types are kept by their BSON bytes: equal values give equal keys,
//! but their order is not MongoDB's (no index the gateway declares orders
//! by them). [`END`] is greater than every encoded value.

use crate::Bson;
use crate::filter::TWO_TO_63;

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
pub const END: u8 = 0xFF;

/// The tag (type bracket) of `value`; a missing field is `None`, indexed as
/// null as MongoDB does.
pub fn tag(value: Option<&Bson>) -> u8 {
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

/// How numbers are encoded: exactly (every index key from store layout 3
/// on), or as store layouts 1 and 2 wrote index entries, and as unique
/// reservations are still named, where the integer 2^63 − 1 and the double
/// 2^63 are one key (see [`number`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Numbers {
    Exact,
    Layout2,
}

/// Append the encoding of `value` to `out`.
pub fn push(out: &mut Vec<u8>, value: Option<&Bson>) {
    push_in(out, value, Numbers::Exact);
}

/// [`push`], numbers encoded as `numbers` says.
pub(crate) fn push_in(out: &mut Vec<u8>, value: Option<&Bson>, numbers: Numbers) {
    let tag = tag(value);
    out.push(tag);
    let Some(value) = value else { return };
    match value {
        Bson::Int32(n) => number(out, f64::from(*n), i64::from(*n)),
        Bson::Int64(n) => {
            let approx = *n as f64;
            // Below the double 2^63, whose integer part saturates to
            // 2^63 − 1 (see [`number`]).
            let exact = if numbers == Numbers::Exact && approx == TWO_TO_63 { n - 1 } else { *n };
            number(out, approx, exact)
        }
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
            let wrapped = crate::doc! {"v": other.clone()};
            wrapped.to_writer(&mut bytes).expect("a BSON value serializes");
            escaped(out, &bytes);
        }
    }
}

/// A number as its nearest double, then its integer part as an `i64`
/// (the tie-break among integers that round to one double, and between an
/// integer and a double of the same value). A double of 2^63 or more has
/// the integer part 2^63 − 1 (saturated); above 2^63 its double alone
/// tells it apart. The integers whose nearest double is 2^63 itself
/// (2^63 − 512 to 2^63 − 1) are encoded with their integer part less one,
/// so every one of them stays below the double 2^63, as MongoDB orders
/// them (store layouts 1 and 2, [`Numbers::Layout2`], took 2^63 − 1 and
/// the double 2^63 as one key).
fn number(out: &mut Vec<u8>, approx: f64, exact: i64) {
    out.extend_from_slice(&ordered_f64(approx));
    out.extend_from_slice(&ordered_i64(exact));
}

/// Append the encoding of `value` to `out`, its bytes inverted when the
/// field is descending: every encoding is self-delimiting (no encoding is
/// a prefix of another), so inverting each byte exactly reverses the order
/// of a field's values while later fields still order the ties.
pub(crate) fn push_dir(out: &mut Vec<u8>, value: Option<&Bson>, desc: bool) {
    push_dir_in(out, value, desc, Numbers::Exact);
}

/// [`push_dir`], numbers encoded as `numbers` says.
pub(crate) fn push_dir_in(out: &mut Vec<u8>, value: Option<&Bson>, desc: bool, numbers: Numbers) {
    let from = out.len();
    push_in(out, value, numbers);
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
pub fn encode<'a>(values: impl IntoIterator<Item = Option<&'a Bson>>) -> Vec<u8> {
    encode_in(values, Numbers::Exact)
}

/// [`encode`], numbers encoded as `numbers` says.
pub fn encode_in<'a>(values: impl IntoIterator<Item = Option<&'a Bson>>, numbers: Numbers) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        push_in(&mut out, v, numbers);
    }
    out
}

/// Whether `value` is encoded differently by [`Numbers::Exact`] and
/// [`Numbers::Layout2`]: an integer whose nearest double is 2^63.
pub fn renumbered(value: Option<&Bson>) -> bool {
    matches!(value, Some(Bson::Int64(n)) if *n as f64 == TWO_TO_63)
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::*;
    use crate::DateTime;
    use crate::filter::sort_order;

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
            Bson::Int64(i64::MAX - 1024),
            Bson::Double(9_223_372_036_854_774_784.0),
            Bson::Int64(i64::MAX - 600),
            Bson::Int64(i64::MAX - 511),
            Bson::Int64(i64::MAX - 1),
            Bson::Int64(i64::MAX),
            Bson::Double(9_223_372_036_854_775_808.0),
            Bson::Double(1e19),
            Bson::Int64(i64::MIN),
            Bson::Double(-9_223_372_036_854_775_808.0),
            Bson::Double(-1e19),
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
    fn layout_2_took_the_largest_integer_for_the_double_two_to_the_63() {
        let (max, two63) = (Bson::Int64(i64::MAX), Bson::Double(9_223_372_036_854_775_808.0));
        assert!(encode([Some(&max)]) < encode([Some(&two63)]));
        assert_eq!(encode_in([Some(&max)], Numbers::Layout2), encode_in([Some(&two63)], Numbers::Layout2));
        for v in values() {
            let same = encode([Some(&v)]) == encode_in([Some(&v)], Numbers::Layout2);
            assert_eq!(same, !renumbered(Some(&v)), "{v:?}");
        }
        assert!(renumbered(Some(&Bson::Int64(i64::MAX - 511))) && !renumbered(Some(&Bson::Int64(i64::MAX - 512))));
    }

    #[test]
    fn missing_is_null_and_end_is_above_everything() {
        assert_eq!(encode([None]), encode([Some(&Bson::Null)]));
        for v in values() {
            assert_eq!(encode([Some(&v)]).cmp(&vec![END]), Ordering::Less);
        }
    }
}
