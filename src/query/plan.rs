//! Which declared index serves a query exactly, or the index that would.
//!
//! A query is served exactly by an index when the index holds exactly the
//! entries of the documents that match, in the query's order, so a page
//! reads only what it returns and a count reads only the entries it
//! counts. That is the case when the index's fields are, in order: the
//! paths the filter pins by equality (in any order among themselves), then
//! the query's order fields: the one path with any other condition (a
//! range, `$in`, `$ne`, `$nin`) first, then the rest of `sort`, each in the
//! index's direction, or each against it (the index read backwards). A
//! query's order is its `sort` (less the paths pinned by equality), then
//! the document id; without a `sort`, a query with a range condition is
//! ordered by that path, ascending. A count needs only the equality paths
//! first and the range path next. `$exists` is served by no index: a
//! missing field and a `null` share an index key.

use super::filter::{Cond, Filter, Ranges};
use crate::store::Interval;

/// Fields one index may have.
pub(crate) const MAX_FIELDS: usize = 8;

/// A user index as the planner sees it: its name and its fields, each
/// with its direction (`-path`: descending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Declared {
    pub name: String,
    pub fields: Vec<String>,
}

impl Declared {
    fn keys(&self) -> Vec<(&str, bool)> {
        self.fields
            .iter()
            .map(|f| match f.strip_prefix('-') {
                Some(p) => (p, true),
                None => (f.as_str(), false),
            })
            .collect()
    }
}

/// One sort key: a path and whether it is descending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SortKey {
    pub path: String,
    pub desc: bool,
}

impl SortKey {
    fn written(&self) -> String {
        if self.desc { format!("-{}", self.path) } else { self.path.clone() }
    }
}

/// How a query runs along an index.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    /// The index's name.
    pub index: String,
    /// The index's fields in order, each with its direction.
    pub keys: Vec<SortKey>,
    /// The values of the paths pinned by equality, in the index's order.
    pub eq: Vec<crate::store::Bson>,
    /// The intervals of the range path's values, if the query has one.
    pub slot: Option<Vec<Interval>>,
    /// The index is read backwards.
    pub reverse: bool,
}

/// Why no ready index serves a query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Unserved {
    /// The index on `fields` (as `PUT` takes them) would serve it; `why`
    /// no ready one does.
    Needs { fields: Vec<String>, why: Unmet },
    /// No index can serve it exactly; the detail says why.
    Never(String),
}

/// Why no ready index serves a query an index would.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unmet {
    /// No ready index serves the page exactly.
    Page,
    /// A page without a filter or sort (read in id order).
    IdOrder,
    /// No ready index counts the filter from its entries.
    Count,
}

impl Unmet {
    /// Why, in words.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Unmet::Page => "no ready index serves this query exactly",
            Unmet::IdOrder => "a query without a filter or sort is served by the id order",
            Unmet::Count => "no ready index counts this filter from its entries",
        }
    }
}

impl Unserved {
    /// Why no ready index serves it and, where one would, which.
    pub(crate) fn detail(&self) -> String {
        match self {
            Unserved::Needs { fields, why } => needs_detail(fields, *why),
            Unserved::Never(detail) => detail.clone(),
        }
    }

    /// Why no ready index serves it, without the index that would.
    pub(crate) fn why(&self) -> &str {
        match self {
            Unserved::Needs { why, .. } => why.as_str(),
            Unserved::Never(detail) => detail,
        }
    }
}

/// What the filter pins and ranges over, and the query's order.
struct Shape<'f> {
    eq: Vec<(&'f str, crate::store::Bson)>,
    range: Option<(&'f str, Ranges)>,
    order: Vec<SortKey>,
}

fn shape<'f>(filter: &'f Filter, sort: &[SortKey], counting: bool) -> Result<Shape<'f>, Unserved> {
    let exists = filter.exists_paths();
    if let Some(path) = exists.first() {
        return Err(Unserved::Never(format!(
            "$exists on {path:?} is served by no index: a missing field and null share an index key; \
             use {{\"{path}\": null}} (null or missing) or {{\"{path}\": {{\"$ne\": null}}}} instead"
        )));
    }
    let mut eq = Vec::new();
    let mut ranges = Vec::new();
    for (path, conds) in &filter.paths {
        match conds.as_slice() {
            [Cond::Eq(v)] => eq.push((path.as_str(), v.clone())),
            _ => ranges.push((path.as_str(), Ranges::of_all(conds))),
        }
    }
    if ranges.len() > 1 {
        let paths: Vec<&str> = ranges.iter().map(|(p, _)| *p).collect();
        return Err(Unserved::Never(format!(
            "the filter has conditions other than equality on {paths:?}: an index serves such a condition \
             (a range, $in, $ne, $nin) on one path only"
        )));
    }
    let range = ranges.pop();
    let pinned = |p: &str| eq.iter().any(|(e, _)| *e == p);
    let mut order: Vec<SortKey> = sort.iter().filter(|k| !pinned(&k.path)).cloned().collect();
    if let Some((path, _)) = &range {
        match order.first() {
            None => order.push(SortKey { path: (*path).to_owned(), desc: false }),
            Some(first) if first.path == *path => {}
            Some(first) if !counting => {
                return Err(Unserved::Never(format!(
                    "the filter has a range condition on {path:?} but the sort starts with {:?}: \
                     an index serves a range only on the first path it is sorted by",
                    first.path
                )));
            }
            Some(_) => {}
        }
    }
    let mut seen = std::collections::HashSet::new();
    if let Some(dup) = order.iter().find(|k| !seen.insert(k.path.as_str())) {
        return Err(Unserved::Never(format!("the sort names {:?} twice", dup.path)));
    }
    Ok(Shape { eq, range, order })
}

/// The values the filter pins the index's first fields (`head`) to, in
/// the index's order.
fn pinned(shape: &Shape<'_>, head: &[(&str, bool)]) -> Vec<crate::store::Bson> {
    head.iter()
        .map(|(p, _)| shape.eq.iter().find(|(e, _)| e == p).map(|(_, v)| v.clone()).expect("an equality path"))
        .collect()
}

/// The fields of the index that would serve a query of this shape.
///
/// A path that starts with `-`, written ascending, reads as another path
/// descending; such a path is asked for descending (`--path`) wherever
/// its direction is free: an equality path, and an order field that is
/// the query's only one (the index is read backwards). Every other order
/// field comes from `sort`, where an ascending path cannot start with
/// `-`.
fn wanted(shape: &Shape<'_>) -> Vec<String> {
    let free = |p: &str| if p.starts_with('-') { format!("-{p}") } else { p.to_owned() };
    let mut fields: Vec<String> = shape.eq.iter().map(|(p, _)| free(p)).collect();
    match shape.order.as_slice() {
        [only] if !only.desc => fields.push(free(&only.path)),
        order => fields.extend(order.iter().map(SortKey::written)),
    }
    fields
}

/// What a read asks the planner for: a page of `filter` in the order of
/// `sort`, or a count of `filter`.
#[derive(Clone, Copy)]
pub(crate) enum Planning<'q> {
    Page { filter: &'q Filter, sort: &'q [SortKey] },
    Count { filter: &'q Filter },
}

impl Planning<'_> {
    /// The plan over the `ready` indexes ([`plan`] or [`plan_count`]).
    pub(crate) fn over(self, ready: &[Declared]) -> Result<Plan, Unserved> {
        match self {
            Planning::Page { filter, sort } => plan(filter, sort, ready),
            Planning::Count { filter } => plan_count(filter, ready),
        }
    }
}

/// The plan of a page of `filter` in `sort` order over one of `ready`.
///
/// Of several ready indexes that serve it, one read forwards is taken
/// (ties by id ascending), whatever the others: the order of a page does
/// not depend on which other indexes exist.
pub(crate) fn plan(filter: &Filter, sort: &[SortKey], ready: &[Declared]) -> Result<Plan, Unserved> {
    let shape = shape(filter, sort, false)?;
    let n = shape.eq.len();
    let mut backwards = None;
    for index in ready {
        let keys = index.keys();
        if keys.len() != n + shape.order.len() {
            continue;
        }
        let (head, tail) = keys.split_at(n);
        if !head.iter().all(|(p, _)| shape.eq.iter().any(|(e, _)| e == p)) {
            continue;
        }
        if !tail.iter().zip(&shape.order).all(|((p, _), k)| *p == k.path) {
            continue;
        }
        let same = tail.iter().zip(&shape.order).all(|((_, d), k)| *d == k.desc);
        let opposite = tail.iter().zip(&shape.order).all(|((_, d), k)| *d != k.desc);
        if !(same || opposite) {
            continue;
        }
        let plan = Plan {
            index: index.name.clone(),
            keys: keys.iter().map(|(path, desc)| SortKey { path: (*path).to_owned(), desc: *desc }).collect(),
            eq: pinned(&shape, head),
            slot: shape.range.as_ref().map(|(_, r)| r.intervals()),
            // With no order field, the index is read forwards (by id).
            reverse: !same,
        };
        if same {
            return Ok(plan);
        }
        backwards.get_or_insert(plan);
    }
    if let Some(plan) = backwards {
        return Ok(plan);
    }
    let fields = wanted(&shape);
    let why = if fields.is_empty() { Unmet::IdOrder } else { Unmet::Page };
    needs(fields, why)
}

/// [`Unserved::Needs`] told: why, and the index on `fields` that would.
pub(crate) fn needs_detail(fields: &[String], why: Unmet) -> String {
    match why {
        Unmet::IdOrder => why.as_str().to_owned(),
        Unmet::Page | Unmet::Count => format!("{}; an index on {fields:?} would", why.as_str()),
    }
}

/// The answer to a query no ready index serves: the index on `fields`
/// would, unless it has more fields than an index may have.
fn needs<T>(fields: Vec<String>, why: Unmet) -> Result<T, Unserved> {
    if fields.len() > MAX_FIELDS {
        return Err(Unserved::Never(format!(
            "no index can serve this query: it would need the {} paths the filter pins and the query \
             orders by, and an index has at most {MAX_FIELDS} fields",
            fields.len()
        )));
    }
    Err(Unserved::Needs { fields, why })
}

/// The plan of a count of `filter`: any ready index whose first fields
/// are the equality paths and whose next is the range path.
pub(crate) fn plan_count(filter: &Filter, ready: &[Declared]) -> Result<Plan, Unserved> {
    let shape = shape(filter, &[], true)?;
    let n = shape.eq.len();
    let need = n + usize::from(shape.range.is_some());
    for index in ready {
        let keys = index.keys();
        if keys.len() < need.max(1) {
            continue;
        }
        if !keys[..n].iter().all(|(p, _)| shape.eq.iter().any(|(e, _)| e == p)) {
            continue;
        }
        if let Some((path, _)) = &shape.range {
            if keys[n].0 != *path {
                continue;
            }
        }
        return Ok(Plan {
            index: index.name.clone(),
            keys: keys.iter().map(|(path, desc)| SortKey { path: (*path).to_owned(), desc: *desc }).collect(),
            eq: pinned(&shape, &keys[..n]),
            slot: shape.range.as_ref().map(|(_, r)| r.intervals()),
            reverse: false,
        });
    }
    let fields = wanted(&shape);
    needs(fields, Unmet::Count)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn filter(v: serde_json::Value) -> Filter {
        Filter::parse(&v).unwrap()
    }

    fn sort(keys: &[&str]) -> Vec<SortKey> {
        keys.iter()
            .map(|k| match k.strip_prefix('-') {
                Some(p) => SortKey { path: p.into(), desc: true },
                None => SortKey { path: (*k).into(), desc: false },
            })
            .collect()
    }

    fn index(name: &str, fields: &[&str]) -> Declared {
        Declared { name: name.into(), fields: fields.iter().map(|f| (*f).to_owned()).collect() }
    }

    #[test]
    fn equality_then_sort_is_served_forwards_or_backwards() {
        let ready = [index("by_status", &["status", "-amount"])];
        let p = plan(&filter(json!({"status": "open"})), &sort(&["-amount"]), &ready).unwrap();
        assert_eq!((p.index.as_str(), p.reverse, p.eq.len()), ("by_status", false, 1));
        let p = plan(&filter(json!({"status": "open"})), &sort(&["amount"]), &ready).unwrap();
        assert!(p.reverse);
        let p = plan(&filter(json!({"status": "open", "amount": {"$gt": 5}})), &[], &ready);
        assert!(p.unwrap().reverse, "a range orders by its path ascending: the index read backwards");
    }

    #[test]
    fn an_index_read_forwards_is_taken_before_one_read_backwards() {
        let f = filter(json!({"g": 1}));
        for ready in [
            [index("a_back", &["g", "-n"]), index("b_fwd", &["g", "n"])],
            [index("b_fwd", &["g", "n"]), index("a_back", &["g", "-n"])],
        ] {
            let p = plan(&f, &sort(&["n"]), &ready).unwrap();
            assert_eq!((p.index.as_str(), p.reverse), ("b_fwd", false));
            let p = plan(&f, &sort(&["-n"]), &ready).unwrap();
            assert_eq!((p.index.as_str(), p.reverse), ("a_back", false));
        }
        // Alone, an index read backwards serves.
        let p = plan(&f, &sort(&["n"]), &[index("a_back", &["g", "-n"])]).unwrap();
        assert!(p.reverse);
    }

    #[test]
    fn a_query_needing_more_fields_than_an_index_holds_names_none() {
        let nine: serde_json::Map<String, serde_json::Value> = (0..9).map(|i| (format!("f{i}"), json!(1))).collect();
        let eight: serde_json::Map<String, serde_json::Value> = (0..8).map(|i| (format!("f{i}"), json!(1))).collect();
        assert!(matches!(plan(&filter(json!(nine)), &[], &[]), Err(Unserved::Never(why)) if why.contains("at most 8")));
        assert!(matches!(plan_count(&filter(json!(nine)), &[]), Err(Unserved::Never(_))));
        assert!(
            matches!(plan(&filter(json!(eight)), &[], &[]), Err(Unserved::Needs { fields, .. }) if fields.len() == 8)
        );
        assert!(matches!(plan(&filter(json!(eight)), &sort(&["x"]), &[]), Err(Unserved::Never(_))));
    }

    #[test]
    fn what_no_index_serves_names_the_index_that_would() {
        let ready = [index("by_status", &["status", "-amount"])];
        let needs = |f, s: &[&str]| match plan(&filter(f), &sort(s), &ready) {
            Err(Unserved::Needs { fields, .. }) => fields,
            other => panic!("{other:?}"),
        };
        assert_eq!(needs(json!({"status": "open"}), &[]), ["status"]);
        assert_eq!(needs(json!({"customer": "c"}), &["-amount"]), ["customer", "-amount"]);
        assert_eq!(needs(json!({"status": "open"}), &["-amount", "created"]), ["status", "-amount", "created"]);
        assert_eq!(needs(json!({"status": "open"}), &["-amount", "-created"]), ["status", "-amount", "-created"]);
        assert_eq!(needs(json!({"amount": {"$in": [1, 2]}}), &[]), ["amount"]);
        let never = |f, s: &[&str]| matches!(plan(&filter(f), &sort(s), &ready), Err(Unserved::Never(_)));
        assert!(never(json!({"a": {"$exists": true}}), &[]));
        assert!(never(json!({"a": {"$gt": 1}, "b": {"$lt": 2}}), &[]));
        assert!(never(json!({"a": {"$gt": 1}}), &["b"]));
        // Mixed directions against the index's.
        let ready = [index("i", &["a", "b"])];
        assert!(matches!(plan(&filter(json!({})), &sort(&["a", "-b"]), &ready), Err(Unserved::Needs { .. })));
    }

    #[test]
    fn a_path_starting_with_a_dash_is_asked_for_as_declarations_read_it() {
        let needs = |f, s: &[&str]| match plan(&filter(f), &sort(s), &[]) {
            Err(Unserved::Needs { fields, .. }) => fields,
            other => panic!("{other:?}"),
        };
        // `-a` would be `a` descending: `--a` is `-a` descending.
        assert_eq!(needs(json!({"-a": 1}), &[]), ["--a"]);
        assert_eq!(needs(json!({"-a": 1}), &["b"]), ["--a", "b"]);
        assert_eq!(needs(json!({"s": 1, "-a": {"$gt": 1}}), &[]), ["s", "--a"]);
        assert_eq!(needs(json!({"s": 1}), &["--a"]), ["s", "--a"]);
        assert_eq!(needs(json!({"s": 1}), &["--a", "b"]), ["s", "--a", "b"]);
        // And each is served by what it asked for.
        for (f, s) in [
            (json!({"-a": 1}), vec![]),
            (json!({"-a": 1}), vec!["b"]),
            (json!({"s": 1, "-a": {"$gt": 1}}), vec![]),
            (json!({"s": 1, "-a": {"$gt": 1}}), vec!["--a"]),
        ] {
            let fields = needs(f.clone(), &s);
            let ready = [Declared { name: "i".into(), fields }];
            assert!(plan(&filter(f.clone()), &sort(&s), &ready).is_ok(), "{f} {s:?}");
        }
        match plan_count(&filter(json!({"-a": {"$lt": 3}})), &[]) {
            Err(Unserved::Needs { fields, .. }) => assert_eq!(fields, ["--a"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn counts_need_the_equality_paths_then_the_range_path() {
        let ready = [index("by_status", &["status", "-amount"])];
        assert!(plan_count(&filter(json!({"status": "open"})), &ready).is_ok());
        assert!(plan_count(&filter(json!({"status": "open", "amount": {"$lt": 3}})), &ready).is_ok());
        assert!(plan_count(&filter(json!({"amount": {"$lt": 3}})), &ready).is_err());
    }

    /// What an `index_required` answer says, word for word: why, and the
    /// index that would serve it (also where it names no field).
    #[test]
    fn an_unserved_query_says_why_and_which_index_would() {
        let ready = [Declared { name: "by_b".into(), fields: vec!["b".into()] }];
        let needs = plan(&filter(json!({"a": 1})), &sort(&["-t"]), &ready).unwrap_err();
        assert_eq!(needs.detail(), r#"no ready index serves this query exactly; an index on ["a", "-t"] would"#);
        assert_eq!(needs.why(), "no ready index serves this query exactly");
        let counted = plan_count(&filter(json!({})), &[]).unwrap_err();
        assert_eq!(counted.detail(), "no ready index counts this filter from its entries; an index on [] would");
        let unsorted = plan(&filter(json!({})), &[], &[]).unwrap_err();
        assert_eq!(unsorted.detail(), "a query without a filter or sort is served by the id order");
    }
}
