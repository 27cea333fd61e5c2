//! An [`IndexQuery`] as MongoDB runs it: a filter, an order and a place to
//! resume after, built from the query's pinned values and intervals. An
//! interval may run across types (`$ne: 5` keeps every string, the strings
//! of `$gt: "a"` stop at the last string), and MongoDB's comparisons stay
//! inside one type bracket, so an interval becomes a comparison in each
//! bracket at its edges and a `$type` for the brackets wholly inside it.

use mongodb::bson::{Bson, Document, doc};

use crate::{Edge, IndexQuery, Interval};

/// MongoDB's type brackets in its order, each with the `$type` names of
/// the types it holds (a missing field sorts as null, and `{f: null}` is
/// what finds both).
const BRACKETS: &[&[&str]] = &[
    &["minKey"],
    &["null"],
    &["double", "int", "long", "decimal"],
    &["string", "symbol"],
    &["object"],
    &["array"],
    &["binData"],
    &["objectId"],
    &["bool"],
    &["date"],
    &["timestamp"],
    &["regex"],
    &["maxKey"],
];
const NULL: usize = 1;
const LAST: usize = BRACKETS.len() - 1;

fn bracket_of(value: &Bson) -> usize {
    match value {
        Bson::MinKey => 0,
        Bson::Null | Bson::Undefined => NULL,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 2,
        Bson::String(_) | Bson::Symbol(_) => 3,
        Bson::Document(_) => 4,
        Bson::Array(_) => 5,
        Bson::Binary(_) => 6,
        Bson::ObjectId(_) => 7,
        Bson::Boolean(_) => 8,
        Bson::DateTime(_) => 9,
        Bson::Timestamp(_) => 10,
        Bson::MaxKey => LAST,
        _ => 11,
    }
}

/// The conditions (any of which) finding a value at `path` of any type of
/// `brackets`.
fn of_brackets(path: &str, brackets: impl IntoIterator<Item = usize>) -> Vec<Document> {
    let mut out = Vec::new();
    let mut types: Vec<&str> = Vec::new();
    for b in brackets {
        if b == NULL {
            out.push(doc! {path: Bson::Null});
        } else {
            types.extend(BRACKETS[b]);
        }
    }
    if !types.is_empty() {
        out.push(doc! {path: {"$type": types}});
    }
    out
}

/// The conditions (any of which) finding a value at `path` in `interval`.
fn within(path: &str, interval: &Interval) -> Vec<Document> {
    if let (Edge::Value { value: a, inclusive: true }, Edge::Value { value: b, inclusive: true }) =
        (&interval.lower, &interval.upper)
    {
        if a == b {
            return vec![doc! {path: a.clone()}];
        }
    }
    let bracket = |edge: &Edge, unbounded: usize| match edge {
        Edge::Unbounded => unbounded,
        Edge::Value { value, .. } | Edge::Bracket(value) => bracket_of(value),
    };
    let (first, last) = (bracket(&interval.lower, 0), bracket(&interval.upper, LAST));
    let mut out = Vec::new();
    let mut whole = Vec::new();
    for b in first..=last {
        let mut range = Document::new();
        if let (true, Edge::Value { value, inclusive }) = (b == first, &interval.lower) {
            range.insert(if *inclusive { "$gte" } else { "$gt" }, value.clone());
        }
        if let (true, Edge::Value { value, inclusive }) = (b == last, &interval.upper) {
            range.insert(if *inclusive { "$lte" } else { "$lt" }, value.clone());
        }
        if range.is_empty() {
            whole.push(b);
        } else if [0, NULL, LAST].contains(&b) {
            // These brackets hold one value each (which MongoDB compares
            // with every other type): in where every edge in it keeps it.
            if range.keys().all(|op| op.ends_with('e')) {
                whole.push(b);
            }
        } else {
            out.push(doc! {path: range});
        }
    }
    out.extend(of_brackets(path, whole));
    out
}

/// The records of `query` (all of them, without `after`) as a filter;
/// `None` when its intervals admit no value (`$gt: null`), which MongoDB
/// has no filter for (`$or` of nothing).
pub(super) fn query_filter(query: &IndexQuery) -> Option<Document> {
    let keys = &query.keys;
    let mut all: Vec<Bson> =
        keys.iter().zip(&query.eq).map(|((path, _), value)| Bson::Document(doc! {path: value.clone()})).collect();
    if let (Some(intervals), Some((path, _))) = (&query.slot, keys.get(query.eq.len())) {
        let any: Vec<Bson> = intervals.iter().flat_map(|i| within(path, i)).map(Bson::Document).collect();
        if any.is_empty() {
            return None;
        }
        all.push(Bson::Document(doc! {"$or": any}));
    }
    // String ids only: every index ends with `_id`, which answers it.
    all.push(Bson::Document(doc! {"_id": {"$gte": ""}}));
    Some(doc! {"$and": all})
}

/// The records whose `sort` fields come strictly after the values `after`
/// in the order of `sort` (1 or -1 per field), as a filter: "after" a value
/// is a greater value of its bracket or any value of a later bracket.
pub(super) fn after_condition(sort: &[(String, i32)], after: &[Bson]) -> Document {
    let mut branches = Vec::new();
    let mut equal = Document::new();
    for ((field, dir), at) in sort.iter().zip(after) {
        let b = bracket_of(at);
        let (op, others): (&str, Vec<usize>) =
            if *dir < 0 { ("$lt", (0..b).collect()) } else { ("$gt", (b + 1..=LAST).collect()) };
        let mut beyond = vec![Bson::Document(doc! {field.clone(): {op: at.clone()}})];
        beyond.extend(of_brackets(field, others).into_iter().map(Bson::Document));
        let mut branch = equal.clone();
        branch.insert("$or", beyond);
        branches.push(Bson::Document(branch));
        equal.insert(field.clone(), at.clone());
    }
    doc! {"$or": branches}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(v: impl Into<Bson>, inclusive: bool) -> Edge {
        Edge::Value { value: v.into(), inclusive }
    }

    #[test]
    fn intervals_become_comparisons_in_their_edge_brackets_and_types_between() {
        // `$gt: 5`: the numbers above 5, nothing else.
        let gt = Interval { lower: value(5, false), upper: Edge::Bracket(Bson::Int32(0)) };
        assert_eq!(within("a", &gt), [doc! {"a": {"$gt": 5}}]);
        // A point.
        let point = Interval { lower: value("x", true), upper: value("x", true) };
        assert_eq!(within("a", &point), [doc! {"a": "x"}]);
        // Above 5 (of `$ne: 5`): greater numbers and every later type.
        let above = Interval { lower: value(5, false), upper: Edge::Unbounded };
        let got = within("a", &above);
        assert_eq!(got[0], doc! {"a": {"$gt": 5}});
        let types: Vec<&str> = BRACKETS[3..].iter().flat_map(|t| t.iter().copied()).collect();
        assert_eq!(got[1..], [doc! {"a": {"$type": types}}]);
        // Below 5: min key, null or missing, smaller numbers.
        let below = Interval { lower: Edge::Unbounded, upper: value(5, false) };
        assert_eq!(
            within("a", &below),
            [doc! {"a": {"$lt": 5}}, doc! {"a": Bson::Null}, doc! {"a": {"$type": ["minKey"]}}]
        );
        // Above null (of `$ne: null`): null is out.
        let not_null = Interval { lower: value(Bson::Null, false), upper: Edge::Unbounded };
        assert!(!within("a", &not_null).contains(&doc! {"a": Bson::Null}));
        let from_null = Interval { lower: value(Bson::Null, true), upper: value(3, true) };
        assert_eq!(within("a", &from_null), [doc! {"a": {"$lte": 3}}, doc! {"a": Bson::Null}]);
    }

    #[test]
    fn a_slot_that_admits_no_value_finds_nothing() {
        let mut query = IndexQuery::live();
        assert!(query_filter(&query).is_some());
        query.slot = Some(Vec::new());
        assert!(query_filter(&query).is_none());
        // `$gt: null`: past null, inside the null bracket.
        query.slot = Some(vec![Interval { lower: value(Bson::Null, false), upper: Edge::Bracket(Bson::Null) }]);
        assert!(query_filter(&query).is_none());
    }
}
