//! The filter language of queries (docs/design.md §7): a subset of
//! MongoDB's query language over a document's data, parsed into
//! conditions per path, and each path's conditions into the intervals of
//! values they admit.
//!
//! A filter is an object of paths and `$and`; a path's condition is a
//! scalar (equality) or an object of operators: `$eq`, `$ne`, `$gt`,
//! `$gte`, `$lt`, `$lte`, `$in`, `$nin`, `$exists`. Values are JSON
//! scalars (null, booleans, numbers, strings): an indexed field never
//! holds an array or an object (see [`crate::indexes`]), so a comparison
//! with one could never match. The semantics are MongoDB's: numbers of
//! every kind compare as numbers, a comparison stays inside its type
//! bracket (`$gt: 5` never matches a string), and `null` stands for a
//! missing field too (`{f: null}` matches both; `$ne: null` neither).
//!
//! Values are ordered as index keys are ([`keys`]): each condition becomes
//! half-open ranges of key bytes, which intersect and complement exactly,
//! and which the embedded store reads as they are.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::document::rules::escape;
use crate::store::embedded::keys;
use crate::store::{Bson, Document, Edge, Interval};

/// Bounds on a filter, whoever sends it.
pub(crate) const MAX_CONDITIONS: usize = 64;
pub(crate) const MAX_IN: usize = 256;
/// Values in all of a filter's `$in` and `$nin` lists together: what a
/// plan combines and a page matches stays small whatever the nesting.
pub(crate) const MAX_LISTED: usize = 1024;
pub(crate) const MAX_AND_DEPTH: usize = 8;
pub(crate) const MAX_PATH_LEN: usize = 256;
pub(crate) const MAX_PATH_DEPTH: usize = 16;
pub(crate) const MAX_STRING: usize = 1024;

/// Why a filter is refused: a JSON pointer into it and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FilterError {
    pub pointer: String,
    pub message: String,
}

impl FilterError {
    fn new(pointer: &str, message: impl Into<String>) -> Self {
        Self { pointer: pointer.to_owned(), message: message.into() }
    }
}

/// One operator's condition on a path.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Cond {
    Eq(Bson),
    Ne(Bson),
    Gt(Bson),
    Gte(Bson),
    Lt(Bson),
    Lte(Bson),
    In(Vec<Bson>),
    Nin(Vec<Bson>),
    Exists(bool),
}

impl Cond {
    fn op(&self) -> &'static str {
        match self {
            Cond::Eq(_) => "$eq",
            Cond::Ne(_) => "$ne",
            Cond::Gt(_) => "$gt",
            Cond::Gte(_) => "$gte",
            Cond::Lt(_) => "$lt",
            Cond::Lte(_) => "$lte",
            Cond::In(_) => "$in",
            Cond::Nin(_) => "$nin",
            Cond::Exists(_) => "$exists",
        }
    }

    fn to_bson(&self) -> Bson {
        let arg = match self {
            Cond::Eq(v) | Cond::Ne(v) | Cond::Gt(v) | Cond::Gte(v) | Cond::Lt(v) | Cond::Lte(v) => v.clone(),
            Cond::In(vs) | Cond::Nin(vs) => Bson::Array(vs.clone()),
            Cond::Exists(b) => Bson::Boolean(*b),
        };
        let mut d = Document::new();
        d.insert(self.op(), arg);
        Bson::Document(d)
    }

    /// The condition in one form for every way of writing it: numbers
    /// equal as numbers are one value (`0`, `0.0` and `-0.0`; an integral
    /// double within 64 bits is that integer), and a list of values is a
    /// set (sorted, each once).
    pub(crate) fn normal(&self) -> Cond {
        let set = |vs: &[Bson]| {
            let mut keyed: Vec<(Vec<u8>, Bson)> = vs
                .iter()
                .map(|v| {
                    let v = normal_value(v);
                    let mut key = Vec::new();
                    mongodb::bson::doc! {"": v.clone()}.to_writer(&mut key).expect("a value serializes");
                    (key, v)
                })
                .collect();
            keyed.sort_by(|a, b| a.0.cmp(&b.0));
            keyed.dedup_by(|a, b| a.0 == b.0);
            keyed.into_iter().map(|(_, v)| v).collect()
        };
        match self {
            Cond::Eq(v) => Cond::Eq(normal_value(v)),
            Cond::Ne(v) => Cond::Ne(normal_value(v)),
            Cond::Gt(v) => Cond::Gt(normal_value(v)),
            Cond::Gte(v) => Cond::Gte(normal_value(v)),
            Cond::Lt(v) => Cond::Lt(normal_value(v)),
            Cond::Lte(v) => Cond::Lte(normal_value(v)),
            Cond::In(vs) => Cond::In(set(vs)),
            Cond::Nin(vs) => Cond::Nin(set(vs)),
            Cond::Exists(b) => Cond::Exists(*b),
        }
    }
}

/// See [`Cond::normal`].
fn normal_value(value: &Bson) -> Bson {
    // 2^63: the first double past the 64-bit integers.
    const TOP: f64 = 9_223_372_036_854_775_808.0;
    match value {
        Bson::Int32(i) => Bson::Int64(i64::from(*i)),
        Bson::Double(f) if f.fract() == 0.0 && *f >= -TOP && *f < TOP => Bson::Int64(*f as i64),
        other => other.clone(),
    }
}

/// A parsed filter: the conditions on each path, all of which must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Filter {
    pub paths: BTreeMap<String, Vec<Cond>>,
}

impl Filter {
    /// Parse a filter (a JSON object), refusing anything outside the
    /// language and anything past its bounds.
    pub(crate) fn parse(value: &Value) -> Result<Self, FilterError> {
        let mut filter = Filter::default();
        let (mut count, mut listed) = (0, 0);
        filter.add(value, "", 0, &mut count, &mut listed)?;
        Ok(filter)
    }

    fn add(
        &mut self,
        value: &Value,
        at: &str,
        depth: usize,
        count: &mut usize,
        listed: &mut usize,
    ) -> Result<(), FilterError> {
        let Value::Object(map) = value else {
            return Err(FilterError::new(at, "a filter is a JSON object"));
        };
        for (key, cond) in map {
            let here = format!("{at}/{}", escape(key));
            if key == "$and" {
                if depth >= MAX_AND_DEPTH {
                    return Err(FilterError::new(&here, format!("$and nests at most {MAX_AND_DEPTH} deep")));
                }
                let Value::Array(items) = cond else {
                    return Err(FilterError::new(&here, "$and takes an array of filters"));
                };
                if items.is_empty() {
                    return Err(FilterError::new(&here, "$and takes at least one filter"));
                }
                for (i, item) in items.iter().enumerate() {
                    self.add(item, &format!("{here}/{i}"), depth + 1, count, listed)?;
                }
                continue;
            }
            if key.starts_with('$') {
                return Err(FilterError::new(
                    &here,
                    format!("operator {key} is not supported here; a filter's keys are data paths and $and"),
                ));
            }
            check_path(key, &here)?;
            let conds = conditions(cond, &here)?;
            *count += conds.len();
            if *count > MAX_CONDITIONS {
                return Err(FilterError::new(&here, format!("a filter holds at most {MAX_CONDITIONS} conditions")));
            }
            *listed +=
                conds.iter().map(|c| if let Cond::In(vs) | Cond::Nin(vs) = c { vs.len() } else { 0 }).sum::<usize>();
            if *listed > MAX_LISTED {
                return Err(FilterError::new(
                    &here,
                    format!("a filter's $in and $nin lists hold at most {MAX_LISTED} values together"),
                ));
            }
            // A condition given twice (`$and` of two equal filters) is one:
            // an equality stays an equality the planner serves.
            let known = self.paths.entry(key.clone()).or_default();
            for cond in conds {
                if !known.iter().any(|k| k.normal() == cond.normal()) {
                    known.push(cond);
                }
            }
        }
        Ok(())
    }

    /// The filter's conditions in one order whatever order they were
    /// written in, each in the form `form` gives it: each as its BSON
    /// bytes (`{path: {op: value}}`), sorted. In the one form
    /// ([`Cond::normal`]) they are equal for filters that mean the same
    /// conditions; as written ([`Clone::clone`]: `0` apart from `0.0`,
    /// lists in their order) they are what cursors made before the one
    /// form hold.
    pub(crate) fn canonical(&self, form: impl Fn(&Cond) -> Cond) -> Vec<Vec<u8>> {
        let mut out: Vec<Vec<u8>> = Vec::new();
        for (path, conds) in &self.paths {
            for cond in conds {
                let mut d = Document::new();
                d.insert(path.clone(), form(cond).to_bson());
                let mut bytes = Vec::new();
                d.to_writer(&mut bytes).expect("a condition serializes");
                out.push(bytes);
            }
        }
        out.sort();
        out
    }

    /// This filter AND `other`: every condition of both, each once.
    pub(crate) fn and(&self, other: &Filter) -> Filter {
        let mut out = self.clone();
        for (path, conds) in &other.paths {
            let known = out.paths.entry(path.clone()).or_default();
            for cond in conds {
                if !known.iter().any(|k| k.normal() == cond.normal()) {
                    known.push(cond.clone());
                }
            }
        }
        out
    }

    /// Whether any condition is `$exists`.
    pub(crate) fn exists_paths(&self) -> Vec<&str> {
        self.paths
            .iter()
            .filter(|(_, conds)| conds.iter().any(|c| matches!(c, Cond::Exists(_))))
            .map(|(p, _)| p.as_str())
            .collect()
    }

    /// Whether `data` matches, by the same key order the index reads.
    pub(crate) fn matches(&self, data: &Document) -> bool {
        self.matcher().matches(data)
    }

    /// The filter with each condition's ranges worked out once, to match
    /// many documents.
    pub(crate) fn matcher(&self) -> Matcher {
        let paths = self.paths.iter().map(|(path, conds)| {
            let checks = conds
                .iter()
                .map(|cond| match cond {
                    Cond::Exists(want) => Check::Exists(*want),
                    cond => Check::Within(Ranges::of(cond)),
                })
                .collect();
            (path.clone(), checks)
        });
        Matcher { paths: paths.collect() }
    }
}

/// A [`Filter`] ready to match documents ([`Filter::matcher`]).
#[derive(Debug)]
pub(crate) struct Matcher {
    paths: Vec<(String, Vec<Check>)>,
}

/// One condition of a [`Matcher`].
#[derive(Debug)]
enum Check {
    Exists(bool),
    /// The value's index key is in these ranges.
    Within(Ranges),
}

impl Matcher {
    /// The top-level fields it looks at.
    pub(crate) fn fields(&self) -> impl Iterator<Item = &str> {
        self.paths.iter().map(|(p, _)| p.split('.').next().unwrap_or(p))
    }

    /// Whether `data` matches, by the same key order the index reads.
    pub(crate) fn matches(&self, data: &Document) -> bool {
        let mut key = Vec::new();
        self.paths.iter().all(|(path, checks)| {
            let value = crate::store::filter::lookup(data, path);
            key.clear();
            checks.iter().all(|check| match check {
                Check::Exists(want) => value.is_some() == *want,
                Check::Within(ranges) => {
                    if key.is_empty() {
                        keys::push(&mut key, value);
                    }
                    ranges.contains(&key)
                }
            })
        })
    }

    /// [`Self::matches`] of a record as stored (its data paths: none
    /// reaches `_id` or `_meta`).
    pub(crate) fn matches_raw(&self, record: &mongodb::bson::RawDocument) -> bool {
        let mut key = Vec::new();
        self.paths.iter().all(|(path, checks)| {
            let value = crate::store::filter::lookup_raw(record, path).and_then(|v| Bson::try_from(v).ok());
            key.clear();
            checks.iter().all(|check| match check {
                Check::Exists(want) => value.is_some() == *want,
                Check::Within(ranges) => {
                    if key.is_empty() {
                        keys::push(&mut key, value.as_ref());
                    }
                    ranges.contains(&key)
                }
            })
        })
    }
}

/// Refuse a path that reaches the gateway's fields or is malformed.
pub(crate) fn check_path(path: &str, at: &str) -> Result<(), FilterError> {
    // Characters, as the API description's `maxLength` counts them.
    if path.is_empty() || path.chars().count() > MAX_PATH_LEN {
        return Err(FilterError::new(at, format!("a path is 1 to {MAX_PATH_LEN} characters")));
    }
    let segments: Vec<&str> = path.split('.').collect();
    if segments.len() > MAX_PATH_DEPTH {
        return Err(FilterError::new(at, format!("a path has at most {MAX_PATH_DEPTH} segments")));
    }
    if path.starts_with('_') || path.starts_with('$') {
        return Err(FilterError::new(at, format!("path {path:?} starts with _ or $: only data paths can be queried")));
    }
    for segment in segments {
        if segment.is_empty() || segment.starts_with('$') {
            return Err(FilterError::new(at, format!("path {path:?} has an empty segment or one starting with $")));
        }
        if segment.chars().any(char::is_control) {
            return Err(FilterError::new(at, format!("path {path:?} holds a control character")));
        }
    }
    Ok(())
}

fn scalar(value: &Value, at: &str) -> Result<Bson, FilterError> {
    match value {
        Value::Null => Ok(Bson::Null),
        Value::Bool(b) => Ok(Bson::Boolean(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(Bson::Int64(i))
            } else {
                n.as_f64().map(Bson::Double).ok_or_else(|| FilterError::new(at, "a number out of range"))
            }
        }
        // Characters, as the API description's `maxLength` counts them.
        Value::String(s) if s.len() > MAX_STRING && s.chars().count() > MAX_STRING => {
            Err(FilterError::new(at, format!("a string in a filter is at most {MAX_STRING} characters")))
        }
        Value::String(s) => Ok(Bson::String(s.clone())),
        Value::Array(_) | Value::Object(_) => Err(FilterError::new(
            at,
            "values in a filter are null, booleans, numbers or strings (an indexed field never holds an array or an object)",
        )),
    }
}

fn scalars(value: &Value, at: &str) -> Result<Vec<Bson>, FilterError> {
    let Value::Array(items) = value else {
        return Err(FilterError::new(at, "takes an array of values"));
    };
    if items.len() > MAX_IN {
        return Err(FilterError::new(at, format!("takes at most {MAX_IN} values")));
    }
    items.iter().enumerate().map(|(i, v)| scalar(v, &format!("{at}/{i}"))).collect()
}

fn conditions(cond: &Value, at: &str) -> Result<Vec<Cond>, FilterError> {
    let Value::Object(ops) = cond else {
        return Ok(vec![Cond::Eq(scalar(cond, at)?)]);
    };
    if ops.is_empty() || !ops.keys().all(|k| k.starts_with('$')) {
        return Err(FilterError::new(
            at,
            "a condition is a value or an object of operators ($eq, $ne, $gt, $gte, $lt, $lte, $in, $nin, $exists)",
        ));
    }
    let mut out = Vec::new();
    for (op, arg) in ops {
        let here = format!("{at}/{}", escape(op));
        out.push(match op.as_str() {
            "$eq" => Cond::Eq(scalar(arg, &here)?),
            "$ne" => Cond::Ne(scalar(arg, &here)?),
            "$gt" => Cond::Gt(scalar(arg, &here)?),
            "$gte" => Cond::Gte(scalar(arg, &here)?),
            "$lt" => Cond::Lt(scalar(arg, &here)?),
            "$lte" => Cond::Lte(scalar(arg, &here)?),
            "$in" => Cond::In(scalars(arg, &here)?),
            "$nin" => Cond::Nin(scalars(arg, &here)?),
            "$exists" => match arg {
                Value::Bool(b) => Cond::Exists(*b),
                _ => return Err(FilterError::new(&here, "$exists takes true or false")),
            },
            other => {
                return Err(FilterError::new(
                    &here,
                    format!(
                        "operator {other} is not supported (only $eq, $ne, $gt, $gte, $lt, $lte, $in, $nin, $exists and $and)"
                    ),
                ));
            }
        });
    }
    Ok(out)
}

/// One boundary of a range of key bytes, with the edge it stands for.
#[derive(Clone, Debug)]
struct Mark {
    bytes: Vec<u8>,
    edge: Edge,
}

/// Disjoint, ordered, half-open ranges of an index field's key bytes.
#[derive(Clone, Debug)]
pub(crate) struct Ranges(Vec<(Mark, Mark)>);

fn encoded(v: &Bson) -> Vec<u8> {
    let mut k = Vec::new();
    keys::push(&mut k, Some(v));
    k
}

fn with_end(mut k: Vec<u8>) -> Vec<u8> {
    k.push(keys::END);
    k
}

fn lowest() -> Mark {
    Mark { bytes: Vec::new(), edge: Edge::Unbounded }
}

fn highest() -> Mark {
    Mark { bytes: vec![keys::END], edge: Edge::Unbounded }
}

impl Ranges {
    fn all() -> Self {
        Ranges(vec![(lowest(), highest())])
    }

    fn point(v: &Bson) -> (Mark, Mark) {
        let k = encoded(v);
        (
            Mark { bytes: k.clone(), edge: Edge::Value { value: v.clone(), inclusive: true } },
            Mark { bytes: with_end(k), edge: Edge::Value { value: v.clone(), inclusive: true } },
        )
    }

    fn points(vs: &[Bson]) -> Self {
        let mut ranges: Vec<(Mark, Mark)> = vs.iter().map(Self::point).collect();
        ranges.sort_by(|a, b| a.0.bytes.cmp(&b.0.bytes));
        ranges.dedup_by(|a, b| a.0.bytes == b.0.bytes);
        Ranges(ranges)
    }

    fn complement(&self) -> Self {
        let mut out = Vec::new();
        let mut from = lowest();
        for (start, end) in &self.0 {
            if from.bytes < start.bytes {
                out.push((from, flip(start)));
            }
            from = flip(end);
        }
        if from.bytes < highest().bytes {
            out.push((from, highest()));
        }
        Ranges(out)
    }

    fn intersect(&self, other: &Ranges) -> Self {
        let mut out = Vec::new();
        for (a0, a1) in &self.0 {
            for (b0, b1) in &other.0 {
                let start = if a0.bytes >= b0.bytes { a0 } else { b0 };
                let end = if a1.bytes <= b1.bytes { a1 } else { b1 };
                if start.bytes < end.bytes {
                    out.push((start.clone(), end.clone()));
                }
            }
        }
        out.sort_by(|a, b| a.0.bytes.cmp(&b.0.bytes));
        Ranges(out)
    }

    /// The values one condition admits.
    pub(crate) fn of(cond: &Cond) -> Self {
        let bracket = |v: &Bson, upper: bool| {
            let t = keys::tag(Some(v));
            Mark { bytes: vec![if upper { t + 1 } else { t }], edge: Edge::Bracket(v.clone()) }
        };
        let value = |v: &Bson, inclusive: bool, upper: bool| {
            let k = encoded(v);
            // A lower edge that leaves the value out starts past every key
            // beginning with it; an upper edge that keeps it in ends there.
            let bytes = if inclusive == upper { with_end(k) } else { k };
            Mark { bytes, edge: Edge::Value { value: v.clone(), inclusive } }
        };
        let one =
            |start: Mark, end: Mark| if start.bytes < end.bytes { Ranges(vec![(start, end)]) } else { Ranges(vec![]) };
        match cond {
            Cond::Eq(v) => Ranges::points(std::slice::from_ref(v)),
            Cond::In(vs) => Ranges::points(vs),
            Cond::Ne(v) => Ranges::points(std::slice::from_ref(v)).complement(),
            Cond::Nin(vs) => Ranges::points(vs).complement(),
            // Against null, the bracket holds only null (and missing):
            // `$gte`/`$lte` are equality, `$gt`/`$lt` admit nothing.
            Cond::Gt(v) => one(value(v, false, false), bracket(v, true)),
            Cond::Gte(v) => one(value(v, true, false), bracket(v, true)),
            Cond::Lt(v) => one(bracket(v, false), value(v, false, true)),
            Cond::Lte(v) => one(bracket(v, false), value(v, true, true)),
            Cond::Exists(_) => Ranges::all(),
        }
    }

    /// The values every one of `conds` admits.
    pub(crate) fn of_all(conds: &[Cond]) -> Self {
        conds.iter().fold(Ranges::all(), |acc, c| acc.intersect(&Ranges::of(c)))
    }

    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        self.0.iter().any(|(s, e)| s.bytes.as_slice() <= key && key < e.bytes.as_slice())
    }

    /// The ranges as intervals of values, for the store.
    pub(crate) fn intervals(&self) -> Vec<Interval> {
        self.0.iter().map(|(s, e)| Interval { lower: s.edge.clone(), upper: e.edge.clone() }).collect()
    }
}

/// A boundary seen from the other side: the end of one range as the start
/// of its complement (an included value becomes an excluded one).
fn flip(mark: &Mark) -> Mark {
    let edge = match &mark.edge {
        Edge::Value { value, inclusive } => Edge::Value { value: value.clone(), inclusive: !inclusive },
        other => other.clone(),
    };
    Mark { bytes: mark.bytes.clone(), edge }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn data(value: Value) -> Document {
        crate::store::convert::object_to_document(value.as_object().expect("an object"))
    }

    fn parse(v: Value) -> Filter {
        Filter::parse(&v).unwrap()
    }

    #[test]
    fn refuses_what_is_outside_the_language() {
        for bad in [
            json!({"$where": "1"}),
            json!({"$or": [{"a": 1}]}),
            json!({"a": {"$regex": "x"}}),
            json!({"_meta.v": 1}),
            json!({"_id": "x"}),
            json!({"$a": 1}),
            json!({"a..b": 1}),
            json!({"a.$b": 1}),
            json!({"a": {"b": 1}}),
            json!({"a": [1]}),
            json!({"a": {"$in": 1}}),
            json!({"a": {"$exists": 1}}),
            json!({"$and": []}),
            json!([1]),
        ] {
            assert!(Filter::parse(&bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_condition_given_twice_is_one() {
        let f = parse(json!({"$and": [{"g": "x"}, {"g": {"$eq": "x"}}], "n": {"$gte": 0}}));
        assert_eq!(f.paths["g"], [Cond::Eq(Bson::String("x".into()))]);
        let f = parse(json!({"$and": [{"n": 1}, {"n": 1.0}, {"n": {"$gt": 0}}]}));
        assert_eq!(f.paths["n"].len(), 2, "{f:?}");
        // Two values: both kept (nothing matches both).
        let f = parse(json!({"$and": [{"g": "x"}, {"g": "y"}]}));
        assert_eq!(f.paths["g"].len(), 2);
    }

    #[test]
    fn bounds_hold_whatever_the_nesting() {
        let list = |n: usize| Value::Array((0..n).map(|i| json!(i)).collect());
        // 4 lists of 256 fill the bound; one more value passes it.
        let four: Vec<Value> = (0..4).map(|_| json!({"a": {"$nin": list(256)}})).collect();
        assert!(Filter::parse(&json!({ "$and": four })).is_ok());
        let mut five: Vec<Value> = (0..4).map(|_| json!({"a": {"$nin": list(256)}})).collect();
        five.push(json!({"b": {"$in": [1]}}));
        let err = Filter::parse(&json!({ "$and": five })).unwrap_err();
        assert!(err.message.contains("1024"), "{err:?}");
        // Strings are measured in characters, as the description counts them.
        assert!(Filter::parse(&json!({"a": "é".repeat(MAX_STRING)})).is_ok());
        assert!(Filter::parse(&json!({"a": "é".repeat(MAX_STRING + 1)})).is_err());
    }

    #[test]
    fn a_path_is_measured_in_characters() {
        assert!(check_path(&"é".repeat(MAX_PATH_LEN), "").is_ok());
        assert!(check_path(&"é".repeat(MAX_PATH_LEN + 1), "").is_err());
    }

    #[test]
    fn conditions_admit_what_mongodb_matches() {
        let docs = [
            data(json!({"a": 1})),
            data(json!({"a": 2.5})),
            data(json!({"a": "x"})),
            data(json!({"a": null})),
            data(json!({})),
            data(json!({"a": true})),
            data(json!({"a": 3_i64})),
        ];
        let cases = [
            (json!({"a": 1}), vec![0]),
            (json!({"a": null}), vec![3, 4]),
            (json!({"a": {"$gt": 1}}), vec![1, 6]),
            (json!({"a": {"$gte": null}}), vec![3, 4]),
            (json!({"a": {"$gt": null}}), vec![]),
            (json!({"a": {"$ne": null}}), vec![0, 1, 2, 5, 6]),
            (json!({"a": {"$ne": 1}}), vec![1, 2, 3, 4, 5, 6]),
            (json!({"a": {"$lt": "y"}}), vec![2]),
            (json!({"a": {"$in": [1, "x", null]}}), vec![0, 2, 3, 4]),
            (json!({"a": {"$nin": [1, "x", null]}}), vec![1, 5, 6]),
            (json!({"a": {"$gt": 1, "$lt": 3}}), vec![1]),
            (json!({"$and": [{"a": {"$gte": 1}}, {"a": {"$ne": 2.5}}]}), vec![0, 6]),
            (json!({"a": {"$exists": false}}), vec![4]),
            (json!({"a": {"$gt": false}}), vec![5]),
        ];
        for (filter, want) in cases {
            let f = parse(filter.clone());
            let got: Vec<usize> = docs.iter().enumerate().filter(|(_, d)| f.matches(d)).map(|(i, _)| i).collect();
            assert_eq!(got, want, "{filter}");
            // The same answer from the records as stored.
            let matcher = f.matcher();
            let raw: Vec<usize> = docs
                .iter()
                .enumerate()
                .filter(|(_, d)| matcher.matches_raw(&mongodb::bson::RawDocumentBuf::from_document(d).unwrap()))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(raw, want, "{filter} as stored");
        }
    }

    #[test]
    fn nested_paths_match_as_stored_as_built() {
        let docs = [
            data(json!({"a": {"b": 1}})),
            data(json!({"a": {"b": {"c": "x"}}})),
            data(json!({"a": 1})),
            data(json!({"a": {"c": 1}})),
            data(json!({"a": [{"b": 1}]})),
        ];
        for filter in [
            json!({"a.b": 1}),
            json!({"a.b": null}),
            json!({"a.b.c": "x"}),
            json!({"a.b": {"$exists": true}}),
            json!({"a.b": {"$gte": 0}}),
        ] {
            let f = parse(filter.clone());
            let matcher = f.matcher();
            for d in &docs {
                let raw = mongodb::bson::RawDocumentBuf::from_document(d).unwrap();
                assert_eq!(matcher.matches_raw(&raw), matcher.matches(d), "{filter} over {d}");
            }
        }
    }
}
