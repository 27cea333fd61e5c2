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
pub mod keys;
pub mod memory;
pub mod mongo;
pub mod scans;
pub mod templates;

use std::sync::Arc;

use async_trait::async_trait;
pub use mongodb::bson::{self, Bson, DateTime, Document, doc};

/// A stored record: a BSON document whose `_id` is a string.
pub type Record = Document;

pub use crate::error::{StoreError, StoreResult};

/// Sort direction of a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    Asc,
    Desc,
}

/// A bounded read of one collection along one of its declared indexes
/// (see [`scans`]): records whose index fields equal `eq` (a prefix of the
/// index's fields), ordered by the next field of the index (`_id` once the
/// prefix is all of them), within the bounds on that field. Bounds are
/// bracketed by type as in MongoDB: a lower bound that is a string never
/// reaches a number or a date. Records with equal order fields come in
/// `_id` order on the embedded store and in index order on MongoDB.
///
/// A scan is made only from a declaration in [`scans`], which a test checks
/// against the indexes in `migrations/`; so every scan is served by an
/// index, and reads O(limit) records.
#[derive(Clone, Debug)]
pub struct Scan {
    index: &'static str,
    eq: Vec<(&'static str, Bson)>,
    by: &'static str,
    lower: Bound<Bson>,
    upper: Bound<Bson>,
    order: Order,
    limit: usize,
}

pub use std::ops::Bound;

impl Scan {
    pub(crate) fn new(decl: &scans::ScanDecl, eq: Vec<Bson>) -> Self {
        assert_eq!(eq.len(), decl.eq.len(), "scan {} takes {} equality values", decl.index, decl.eq.len());
        Self {
            index: decl.index,
            eq: decl.eq.iter().copied().zip(eq).collect(),
            by: decl.by,
            lower: Bound::Unbounded,
            upper: Bound::Unbounded,
            order: Order::Asc,
            limit: usize::MAX,
        }
    }

    /// Only records whose order field is above `lower`.
    #[must_use]
    pub fn from(mut self, lower: Bound<Bson>) -> Self {
        self.lower = lower;
        self
    }

    /// Only records whose order field is below `upper`.
    #[must_use]
    pub fn to(mut self, upper: Bound<Bson>) -> Self {
        self.upper = upper;
        self
    }

    /// Only records whose `_id` follows `id` (the order field is `_id`).
    #[must_use]
    pub fn after(self, id: Option<&str>) -> Self {
        debug_assert_eq!(self.by, "_id");
        match id {
            Some(id) => self.from(Bound::Excluded(Bson::String(id.to_owned()))),
            None => self,
        }
    }

    #[must_use]
    pub fn desc(mut self) -> Self {
        self.order = Order::Desc;
        self
    }

    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    pub fn index(&self) -> &'static str {
        self.index
    }
    pub fn eq(&self) -> &[(&'static str, Bson)] {
        &self.eq
    }
    pub fn by(&self) -> &'static str {
        self.by
    }
    pub fn bounds(&self) -> (&Bound<Bson>, &Bound<Bson>) {
        (&self.lower, &self.upper)
    }
    pub fn order(&self) -> Order {
        self.order
    }
    pub fn max(&self) -> usize {
        self.limit
    }

    /// The scan as a MongoDB filter and sort (the order field only: ties
    /// come in index order).
    pub fn to_query(&self) -> (Document, Document) {
        let mut filter = Document::new();
        for (field, value) in &self.eq {
            filter.insert(*field, value.clone());
        }
        let mut range = Document::new();
        match &self.lower {
            Bound::Included(v) => {
                range.insert("$gte", v.clone());
            }
            Bound::Excluded(v) => {
                range.insert("$gt", v.clone());
            }
            Bound::Unbounded => {}
        }
        match &self.upper {
            Bound::Included(v) => {
                range.insert("$lte", v.clone());
            }
            Bound::Excluded(v) => {
                range.insert("$lt", v.clone());
            }
            Bound::Unbounded => {}
        }
        if !range.is_empty() {
            filter.insert(self.by, range);
        }
        let dir = if self.order == Order::Asc { 1 } else { -1 };
        (filter, doc! { self.by: dir })
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

/// A secondary index: records ordered by the values of `fields` (all
/// ascending; a missing field counts as null), then by `_id`. A `unique`
/// index admits one record per value.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexSpec {
    pub name: String,
    pub fields: Vec<String>,
    #[serde(default)]
    pub unique: bool,
    /// Records whose first field is null or missing have no entry, so the
    /// index holds only what its scans look for (locks, staged inserts):
    /// such an index serves only scans that pin its first field to, or
    /// bound it by, a value that is not null. The embedded store leaves
    /// those entries out; MongoDB gets a full index (FerretDB has no sparse
    /// indexes), which answers the same scans.
    #[serde(default)]
    pub sparse: bool,
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

    /// Create an index if it does not exist (idempotent), building it for
    /// the records already there.
    async fn ensure_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()>;

    /// Drop index `name` if it exists.
    async fn drop_index(&self, coll: &str, name: &str) -> StoreResult<()>;

    /// The secondary indexes `coll` has.
    async fn indexes(&self, coll: &str) -> StoreResult<Vec<IndexSpec>>;
}

pub type DynStore = Arc<dyn Store>;

/// One page of an `_id`-ordered `scan` of `coll`: up to `limit` records
/// after id `after`, decoded, and the id to continue after when more exist.
pub async fn page<T>(
    store: &dyn Store,
    coll: &str,
    scan: Scan,
    after: Option<&str>,
    limit: usize,
    decode: impl Fn(Record) -> StoreResult<T>,
) -> StoreResult<(Vec<T>, Option<String>)> {
    let mut records = store.scan(coll, scan.after(after).limit(limit + 1)).await?;
    let next = if records.len() > limit {
        records.truncate(limit);
        records.last().and_then(record_id).map(str::to_owned)
    } else {
        None
    };
    Ok((records.into_iter().map(decode).collect::<StoreResult<_>>()?, next))
}

/// Records one background step reads or deletes at a time: recovery's
/// scans, the lock sweep, purges. Steps repeat batches while there is work.
pub const BATCH: usize = 200;

/// Delete every record of `coll` that `scan` finds (it must be bounded so
/// that what it finds stays found: a cutoff), in batches of [`BATCH`] while
/// batches come back full. Each delete is conditional on the scan's own
/// filter, so a record changed meanwhile is kept. Returns how many went.
pub async fn purge(store: &dyn Store, coll: &str, scan: Scan) -> StoreResult<usize> {
    let (filter, _) = scan.to_query();
    let mut purged = 0;
    loop {
        let batch = store.scan(coll, scan.clone().limit(BATCH)).await?;
        let full = batch.len() == BATCH;
        // The deletes of a batch go together: one group commit (or one
        // round of requests) for all of them, not one each.
        let deletes = batch.iter().filter_map(record_id).map(|id| store.delete(coll, id, filter.clone()));
        let mut deleted = 0;
        for done in futures::future::join_all(deletes).await {
            deleted += usize::from(done?);
        }
        purged += deleted;
        // A full batch none of which could go would be read again forever.
        if !full || deleted == 0 {
            return Ok(purged);
        }
    }
}

/// The `_id` of a record, when it is a string.
pub fn record_id(record: &Record) -> Option<&str> {
    record.get_str("_id").ok()
}
