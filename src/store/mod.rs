//! The storage seam: single-document atomic operations over named
//! collections, and the two backends that implement them.
//!
//! Every write here is atomic on exactly one record. Conditional writes take
//! a filter in MongoDB's query syntax, restricted to the subset that
//! [`filter`] evaluates (equality, comparisons, `$in`, `$exists`, `$or`,
//! `$and` on dotted paths), so both backends agree on what a filter means.
//! Nothing above this module relies on a multi-document transaction.

pub mod convert;
pub mod deadline;
pub mod embedded;
pub mod filter;
pub mod memory;
pub mod mongo;

use std::sync::Arc;

use async_trait::async_trait;
pub use mongodb::bson::{self, Bson, DateTime, Document, doc};

/// A stored record: a BSON document whose `_id` is a string.
pub type Record = Document;

/// Errors every backend maps its failures onto.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached or did not answer in time.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The store refused the document itself (size, field names, nesting).
    #[error("store rejected the document: {0}")]
    Rejected(String),
    /// Anything else: a bug or a corrupted record.
    #[error("store error: {0}")]
    Internal(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// Sort direction of a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

/// A bounded scan of one collection.
#[derive(Clone, Debug)]
pub struct Scan {
    pub filter: Document,
    /// Field to sort by; ties are broken by `_id` in the same direction.
    pub sort: (String, Order),
    pub limit: usize,
}

impl Scan {
    /// Records matching `filter` in `_id` order.
    pub fn by_id(filter: Document, limit: usize) -> Self {
        Self { filter, sort: ("_id".into(), Order::Asc), limit }
    }

    pub fn sorted(filter: Document, field: &str, order: Order, limit: usize) -> Self {
        Self { filter, sort: (field.to_owned(), order), limit }
    }
}

/// A partial update: `$set` of dotted paths and `$unset` of dotted paths.
#[derive(Clone, Debug, Default)]
pub struct Update {
    pub set: Document,
    pub unset: Vec<String>,
}

impl Update {
    pub fn set(set: Document) -> Self {
        Self { set, unset: Vec::new() }
    }
}

/// An index a collection should have (used by the MongoDB backend; the
/// embedded backend plans its scans without them).
#[derive(Clone, Debug)]
pub struct IndexSpec {
    pub name: String,
    pub keys: Document,
    pub unique: bool,
}

/// The narrow interface the protocol is written against.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `"embedded"` or `"mongodb"`.
    fn backend(&self) -> &'static str;

    /// Cheap round trip proving the store answers.
    async fn ping(&self) -> StoreResult<()>;

    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>>;

    /// Insert-if-absent. `Ok(false)` when a record with that `_id` exists.
    async fn insert(&self, coll: &str, record: Record) -> StoreResult<bool>;

    /// Replace record `id` (its `_id` is kept) if it matches `filter`.
    async fn replace(&self, coll: &str, id: &str, filter: Document, record: Record) -> StoreResult<bool>;

    /// Apply `update` to record `id` if it matches `filter`.
    async fn update(&self, coll: &str, id: &str, filter: Document, update: Update) -> StoreResult<bool>;

    /// Delete record `id` if it matches `filter`.
    async fn delete(&self, coll: &str, id: &str, filter: Document) -> StoreResult<bool>;

    /// Up to `scan.limit` records matching the filter, in the scan's order.
    async fn scan(&self, coll: &str, scan: Scan) -> StoreResult<Vec<Record>>;

    /// Records with one of `ids` (missing ones are left out).
    async fn get_many(&self, coll: &str, ids: &[String]) -> StoreResult<Vec<Record>>;

    /// Names of every collection that holds at least one record.
    async fn collections(&self) -> StoreResult<Vec<String>>;

    /// Create an index if it does not exist (idempotent).
    async fn ensure_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()>;
}

pub type DynStore = Arc<dyn Store>;

/// One page of `coll` in `_id` order: up to `limit` records matching
/// `filter` after id `after`, decoded, and the id to continue after when
/// more exist.
pub async fn page<T>(
    store: &dyn Store,
    coll: &str,
    mut filter: Document,
    after: Option<&str>,
    limit: usize,
    decode: impl Fn(Record) -> StoreResult<T>,
) -> StoreResult<(Vec<T>, Option<String>)> {
    if let Some(after) = after {
        filter.insert("_id", doc! {"$gt": after});
    }
    let mut records = store.scan(coll, Scan::by_id(filter, limit + 1)).await?;
    let next = if records.len() > limit {
        records.truncate(limit);
        records.last().and_then(record_id).map(str::to_owned)
    } else {
        None
    };
    Ok((records.into_iter().map(decode).collect::<StoreResult<_>>()?, next))
}

/// The `_id` of a record, when it is a string.
pub fn record_id(record: &Record) -> Option<&str> {
    record.get_str("_id").ok()
}
