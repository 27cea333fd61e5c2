//! Evaluation of the MongoDB filter and update subset the gateway uses, for
//! backends that have no query engine of their own.
//!
//! Semantics follow MongoDB's for the supported operators: equality with
//! `null` also matches a missing field, comparisons only between values of
//! the same type bracket (numbers with numbers, strings with strings, dates
//! with dates), and an unsupported operator is an error rather than a
//! silent mismatch.

use std::cmp::Ordering;

use super::{Bson, Document, StoreError, StoreResult, Update};

/// Whether `record` matches `filter`.
pub fn matches(record: &Document, filter: &Document) -> StoreResult<bool> {
    for (key, cond) in filter {
        let ok = match key.as_str() {
            "$or" => any_of(record, cond)?,
            "$and" => all_of(record, cond)?,
            op if op.starts_with('$') => return Err(unsupported(op)),
            path => field_matches(lookup(record, path), cond)?,
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

fn clauses(cond: &Bson) -> StoreResult<impl Iterator<Item = &Document>> {
    match cond {
        Bson::Array(items) => Ok(items.iter().filter_map(Bson::as_document)),
        _ => Err(StoreError::Internal("$or/$and take an array".into())),
    }
}

fn any_of(record: &Document, cond: &Bson) -> StoreResult<bool> {
    for clause in clauses(cond)? {
        if matches(record, clause)? {
            return Ok(true);
        }
    }
    Ok(false)
}

fn all_of(record: &Document, cond: &Bson) -> StoreResult<bool> {
    for clause in clauses(cond)? {
        if !matches(record, clause)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn unsupported(op: &str) -> StoreError {
    StoreError::Internal(format!("filter operator {op} is not supported"))
}

/// The value at a dotted path, if every step exists.
pub fn lookup<'a>(record: &'a Document, path: &str) -> Option<&'a Bson> {
    let mut parts = path.split('.');
    let mut current = record.get(parts.next()?)?;
    for part in parts {
        current = current.as_document()?.get(part)?;
    }
    Some(current)
}

/// [`lookup`] in a record as stored: the value at dotted `path`, through
/// embedded documents only. An element that cannot be read is missing
/// (records read are checked first: see [`crate::convert::check`]).
pub fn lookup_raw<'a>(record: &'a mongodb::bson::RawDocument, path: &str) -> Option<mongodb::bson::RawBsonRef<'a>> {
    let mut parts = path.split('.');
    let mut current = record.get(parts.next()?).ok()??;
    for part in parts {
        let mongodb::bson::RawBsonRef::Document(inner) = current else { return None };
        current = inner.get(part).ok()??;
    }
    Some(current)
}

fn is_operator_doc(cond: &Bson) -> bool {
    matches!(cond, Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')))
}

fn field_matches(value: Option<&Bson>, cond: &Bson) -> StoreResult<bool> {
    if !is_operator_doc(cond) {
        return Ok(equals(value, cond));
    }
    let Bson::Document(ops) = cond else { unreachable!() };
    for (op, arg) in ops {
        let ok = match op.as_str() {
            "$eq" => equals(value, arg),
            "$ne" => !equals(value, arg),
            "$lt" => compare(value, arg) == Some(Ordering::Less),
            "$lte" => matches!(compare(value, arg), Some(Ordering::Less | Ordering::Equal)),
            "$gt" => compare(value, arg) == Some(Ordering::Greater),
            "$gte" => matches!(compare(value, arg), Some(Ordering::Greater | Ordering::Equal)),
            "$in" => match arg {
                Bson::Array(items) => items.iter().any(|item| equals(value, item)),
                _ => return Err(StoreError::Internal("$in takes an array".into())),
            },
            "$nin" => match arg {
                Bson::Array(items) => !items.iter().any(|item| equals(value, item)),
                _ => return Err(StoreError::Internal("$nin takes an array".into())),
            },
            "$exists" => value.is_some() == arg.as_bool().unwrap_or(true),
            other => return Err(unsupported(other)),
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

fn equals(value: Option<&Bson>, expected: &Bson) -> bool {
    match (value, expected) {
        (None | Some(Bson::Null), Bson::Null) => true,
        (None, _) => false,
        (Some(v), e) => compare_values(v, e) == Some(Ordering::Equal),
    }
}

fn compare(value: Option<&Bson>, arg: &Bson) -> Option<Ordering> {
    compare_values(value?, arg)
}

fn as_f64(value: &Bson) -> Option<f64> {
    match value {
        Bson::Int32(n) => Some(f64::from(*n)),
        Bson::Int64(n) => Some(*n as f64),
        Bson::Double(n) => Some(*n),
        _ => None,
    }
}

fn as_i64(value: &Bson) -> Option<i64> {
    match value {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        _ => None,
    }
}

/// 2^63, the smallest double above every `i64`.
pub(crate) const TWO_TO_63: f64 = 9_223_372_036_854_775_808.0;

/// The order of an integer and a double, exact as MongoDB's (an `i64`
/// as `f64` rounds past 2^53); `None` for NaN.
fn compare_int_double(i: i64, x: f64) -> Option<Ordering> {
    if x.is_nan() {
        return None;
    }
    if x >= TWO_TO_63 {
        return Some(Ordering::Less);
    }
    if x < -TWO_TO_63 {
        return Some(Ordering::Greater);
    }
    // |x| < 2^63 here (or x is -2^63): its integer part is an exact i64.
    let whole = x.trunc();
    Some(i.cmp(&(whole as i64)).then_with(|| 0.0_f64.partial_cmp(&(x - whole)).unwrap_or(Ordering::Equal)))
}

/// Order of two values of the same type bracket; `None` across brackets.
pub(crate) fn compare_values(a: &Bson, b: &Bson) -> Option<Ordering> {
    match (as_i64(a), as_i64(b), as_f64(a), as_f64(b)) {
        (Some(x), Some(y), _, _) => return Some(x.cmp(&y)),
        (Some(i), None, _, Some(y)) => return compare_int_double(i, y),
        (None, Some(j), Some(x), _) => return compare_int_double(j, x).map(Ordering::reverse),
        _ => {}
    }
    if let (Some(x), Some(y)) = (as_f64(a), as_f64(b)) {
        return x.partial_cmp(&y);
    }
    match (a, b) {
        (Bson::String(x), Bson::String(y)) => Some(x.cmp(y)),
        (Bson::Boolean(x), Bson::Boolean(y)) => Some(x.cmp(y)),
        (Bson::DateTime(x), Bson::DateTime(y)) => Some(x.cmp(y)),
        (Bson::Null, Bson::Null) => Some(Ordering::Equal),
        (Bson::Document(_), Bson::Document(_)) | (Bson::Array(_), Bson::Array(_)) => {
            (a == b).then_some(Ordering::Equal)
        }
        _ => None,
    }
}

/// Order used by sorted scans: like [`compare_values`], with values of
/// different brackets ordered by MongoDB's bracket order.
pub(crate) fn sort_order(a: Option<&Bson>, b: Option<&Bson>) -> Ordering {
    fn bracket(v: Option<&Bson>) -> u8 {
        match v {
            None | Some(Bson::Null) => 0,
            Some(Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)) => 1,
            Some(Bson::String(_)) => 2,
            Some(Bson::Document(_)) => 3,
            Some(Bson::Array(_)) => 4,
            Some(Bson::Boolean(_)) => 5,
            Some(Bson::DateTime(_)) => 6,
            Some(_) => 7,
        }
    }
    match (a, b) {
        (Some(x), Some(y)) => compare_values(x, y).unwrap_or_else(|| bracket(a).cmp(&bracket(b))),
        _ => bracket(a).cmp(&bracket(b)),
    }
}

/// Apply a `$set`/`$unset` update in place, creating intermediate
/// documents for dotted paths as MongoDB does.
pub(crate) fn apply_update(record: &mut Document, update: &Update) -> StoreResult<()> {
    for (path, value) in &update.set {
        set_path(record, path, value.clone())?;
    }
    for path in &update.unset {
        unset_path(record, path);
    }
    Ok(())
}

fn set_path(record: &mut Document, path: &str, value: Bson) -> StoreResult<()> {
    match path.split_once('.') {
        None => {
            record.insert(path, value);
            Ok(())
        }
        Some((head, rest)) => {
            let child = record.entry(head.to_owned()).or_insert_with(|| Bson::Document(Document::new()));
            match child {
                Bson::Document(inner) => set_path(inner, rest, value),
                Bson::Null => {
                    let mut inner = Document::new();
                    set_path(&mut inner, rest, value)?;
                    *child = Bson::Document(inner);
                    Ok(())
                }
                _ => Err(StoreError::Rejected(format!("cannot set {path}: {head} is not a document"))),
            }
        }
    }
}

fn unset_path(record: &mut Document, path: &str) {
    match path.split_once('.') {
        None => {
            record.remove(path);
        }
        Some((head, rest)) => {
            if let Some(Bson::Document(inner)) = record.get_mut(head) {
                unset_path(inner, rest);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doc;

    #[test]
    fn null_matches_missing_and_null() {
        let rec = doc! {"_id": "a", "_meta": {"txn": Bson::Null, "v": 3_i64}};
        assert!(matches(&rec, &doc! {"_meta.txn": Bson::Null, "_meta.v": 3}).unwrap());
        assert!(matches(&rec, &doc! {"_meta.absent": Bson::Null}).unwrap());
        assert!(!matches(&rec, &doc! {"_meta.v": 4}).unwrap());
        assert!(!matches(&rec, &doc! {"_meta.txn": "T"}).unwrap());
    }

    #[test]
    fn comparisons_stay_within_a_type_bracket() {
        let rec = doc! {"n": 5_i64, "s": "b", "d": 2.5};
        assert!(matches(&rec, &doc! {"n": {"$gt": 4, "$lte": 5.0}}).unwrap());
        assert!(!matches(&rec, &doc! {"n": {"$gt": "a"}}).unwrap());
        assert!(matches(&rec, &doc! {"s": {"$gt": "a"}}).unwrap());
        assert!(matches(&rec, &doc! {"d": {"$lt": 3_i64}}).unwrap());
        assert!(matches(&rec, &doc! {"s": {"$in": ["a", "b"]}}).unwrap());
        assert!(matches(&rec, &doc! {"x": {"$exists": false}}).unwrap());
        assert!(!matches(&rec, &doc! {"n": {"$ne": 5}}).unwrap());
    }

    #[test]
    fn or_and_and() {
        let rec = doc! {"a": 1, "b": 2};
        assert!(matches(&rec, &doc! {"$or": [{"a": 2}, {"b": 2}]}).unwrap());
        assert!(!matches(&rec, &doc! {"$and": [{"a": 1}, {"b": 3}]}).unwrap());
        assert!(matches(&rec, &doc! {"a": {"$bogus": 1}}).is_err());
    }

    #[test]
    fn update_sets_and_unsets_dotted_paths() {
        let mut rec = doc! {"_id": "a", "_meta": {"txn": Bson::Null}};
        let update = Update { set: doc! {"_meta.txn": "T", "x.y": 1}, unset: vec!["_meta.gone".into()] };
        apply_update(&mut rec, &update).unwrap();
        assert_eq!(rec, doc! {"_id": "a", "_meta": {"txn": "T"}, "x": {"y": 1}});
        apply_update(&mut rec, &Update { set: doc! {}, unset: vec!["x.y".into()] }).unwrap();
        assert_eq!(rec, doc! {"_id": "a", "_meta": {"txn": "T"}, "x": {}});
    }
}
