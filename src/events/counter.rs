//! The counters kept in [`STATE`](super::STATE) (the log's floor, the position counts
//! are folded to): each a position `n` that only moves forward, by
//! compare-and-set on the value below the new one.

use serde::Serialize;

use crate::store::shape::{Lt, fields};
use crate::store::{Document, Record, Update};

#[derive(Serialize)]
struct Counter<'a> {
    #[serde(rename = "_id")]
    id: &'a str,
    n: i64,
}

#[derive(Serialize)]
struct Value<N> {
    n: N,
}

fn stored(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Counter `id` at `n`, as first inserted.
pub(crate) fn record(id: &str, n: u64) -> Record {
    fields(&Counter { id, n: stored(n) })
}

/// The value `n`, as a replacement of the counter's record.
pub(crate) fn value(n: u64) -> Document {
    fields(&Value { n: stored(n) })
}

/// Set the counter to `n`.
pub(crate) fn set(n: u64) -> Update {
    Update::fields(&Value { n: stored(n) })
}

/// The filter of a counter below `n`: moving it to `n` moves it forward.
pub(crate) fn below(n: u64) -> Document {
    fields(&Value { n: Lt(stored(n)) })
}

/// The position a counter's record holds.
pub(crate) fn read(rec: &Record) -> u64 {
    rec.get_i64("n").ok().and_then(|n| u64::try_from(n).ok()).unwrap_or(0)
}
