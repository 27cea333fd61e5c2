//! Resuming a read along an index after a given entry, in MongoDB's order
//! of types.

use mongodb::bson::{Bson, Document, doc};

/// The MongoDB types of each type bracket the indexed values of a query
/// may hold, in MongoDB's bracket order.
const BRACKETS: &[&[&str]] = &[&["null"], &["double", "int", "long"], &["string"], &["object"], &["array"], &["bool"]];

fn bracket_of(value: &Bson) -> usize {
    match value {
        Bson::Null => 0,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 1,
        Bson::String(_) => 2,
        Bson::Document(_) => 3,
        Bson::Array(_) => 4,
        _ => 5,
    }
}

/// The records whose `sort` fields come strictly after the values `after`
/// in the order of `sort` (1 or -1 per field), as a filter. MongoDB's
/// comparisons stay inside a type bracket, so "after" a value is a greater
/// value of its bracket or any value of a later bracket (`$type`); a null
/// stands for a missing field too, as in an index.
pub(super) fn after_condition(sort: &[(String, i32)], after: &[Bson]) -> Document {
    let mut branches = Vec::new();
    let mut equal = Document::new();
    for ((field, dir), at) in sort.iter().zip(after) {
        let b = bracket_of(at);
        let (op, others): (&str, Vec<&str>) = if *dir < 0 {
            ("$lt", BRACKETS[..b].iter().flat_map(|t| t.iter().copied()).collect())
        } else {
            ("$gt", BRACKETS[b + 1..].iter().flat_map(|t| t.iter().copied()).collect())
        };
        let mut beyond = vec![Bson::Document(doc! {field.clone(): {op: at.clone()}})];
        if !others.is_empty() {
            // `null` is the only "type" a missing field has: `{f: null}`
            // finds it (and explicit nulls).
            let (nulls, types): (Vec<&str>, Vec<&str>) = others.into_iter().partition(|t| *t == "null");
            if !nulls.is_empty() {
                beyond.push(Bson::Document(doc! {field.clone(): Bson::Null}));
            }
            if !types.is_empty() {
                beyond.push(Bson::Document(doc! {field.clone(): {"$type": types}}));
            }
        }
        let mut branch = equal.clone();
        branch.insert("$or", beyond);
        branches.push(Bson::Document(branch));
        equal.insert(field.clone(), at.clone());
    }
    doc! {"$or": branches}
}
