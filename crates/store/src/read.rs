//! What a read asks for ([`Scan`] along a declared scan, [`IndexQuery`]
//! along a declared index, [`IndexSpec`]) and what it finds ([`Found`]).

use mongodb::bson::{Bson, Document, doc};

use crate::{Record, scans};

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
    skip: usize,
    limit: usize,
    /// The top-level fields the caller reads (empty: all of them).
    fields: &'static [&'static str],
    /// Bytes of records (as stored) after which the scan stops.
    budget: usize,
}

pub use std::ops::Bound;

impl Scan {
    pub fn new(decl: &scans::ScanDecl, eq: Vec<Bson>) -> Self {
        assert_eq!(eq.len(), decl.eq.len(), "scan {} takes {} equality values", decl.index, decl.eq.len());
        Self {
            index: decl.index,
            eq: decl.eq.iter().copied().zip(eq).collect(),
            by: decl.by,
            lower: Bound::Unbounded,
            upper: Bound::Unbounded,
            order: Order::Asc,
            skip: 0,
            limit: usize::MAX,
            fields: &[],
            budget: usize::MAX,
        }
    }

    /// Only these top-level fields of each record are read by the caller:
    /// a store may leave the others out (and spare decoding them), or
    /// return them all.
    #[must_use]
    pub fn fields(mut self, fields: &'static [&'static str]) -> Self {
        self.fields = fields;
        self
    }

    /// The fields asked for with [`Self::fields`] (empty: all).
    pub fn wanted(&self) -> &'static [&'static str] {
        self.fields
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

    /// Only records whose `_id` follows `id` (the order field is `_id`);
    /// from the first string without one. Every id txgate writes is a
    /// string: the bound keeps out, on MongoDB, records another tool gave
    /// an `_id` of another type, which sort before or after every string
    /// and could not be walked past by a string.
    #[must_use]
    pub fn after(self, id: Option<&str>) -> Self {
        debug_assert_eq!(self.by, "_id");
        self.from(Bound::Excluded(Bson::String(id.unwrap_or_default().to_owned())))
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

    /// Stop, short of the limit, at the record that brings the records
    /// read to `bytes` as stored (so at least one is read): see
    /// [`Store::scan_found`].
    #[must_use]
    pub fn within(mut self, bytes: usize) -> Self {
        self.budget = bytes;
        self
    }

    /// The bytes set with [`Self::within`] (`usize::MAX`: no bound).
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Pass over the first `n` records the scan finds (in its order)
    /// before the ones it returns. The records passed over are counted
    /// along the index, not read: `skip(n)` costs `n` index entries.
    #[must_use]
    pub fn skip(mut self, n: usize) -> Self {
        self.skip = n;
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
    pub fn skipped(&self) -> usize {
        self.skip
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

impl IndexQuery {
    /// Every live document of a collection (tombstones aside), along the
    /// `live` index every user collection has: for counting them.
    pub fn live() -> Self {
        Self {
            index: "live".into(),
            keys: vec![("_meta.deleted".into(), false), ("_id".into(), false)],
            eq: vec![Bson::Boolean(false)],
            slot: None,
            reverse: false,
            after: None,
            limit: 0,
            budget: usize::MAX,
        }
    }

    /// The keys of `spec` as a query reads them: `_id` last, where the
    /// index does not name it (every index orders equal values by id).
    pub fn keys_of(spec: &IndexSpec) -> Vec<(String, bool)> {
        let mut keys: Vec<(String, bool)> = spec.keys().map(|(path, desc)| (path.to_owned(), desc)).collect();
        if keys.last().is_none_or(|(path, _)| path != "_id") {
            keys.push(("_id".to_owned(), false));
        }
        keys
    }

    /// The order of the answer: the fields after `eq` (the last being
    /// `_id`), each with the direction read (1 or -1), which are also the
    /// fields of [`Self::after`].
    pub fn order(&self) -> Vec<(String, i32)> {
        self.keys
            .iter()
            .skip(self.eq.len())
            .map(|(path, desc)| (path.clone(), if *desc != self.reverse { -1 } else { 1 }))
            .collect()
    }
}

/// Bytes of records (as stored) after which a page of documents or of
/// events, or a batch of events, stops short of its count, with a cursor
/// to the rest: the record that reaches it is its last, so a page holds
/// at least one whatever its size.
pub const PAGE_BYTES: usize = 4 * 1024 * 1024;

/// What a [`Store::query`] or [`Store::scan_found`] found.
#[derive(Debug, Default)]
pub struct Found {
    pub records: Vec<Record>,
    /// Their size as stored, in bytes.
    pub bytes: usize,
    /// The budget ([`IndexQuery::budget`]) stopped the read before
    /// `limit` records: more may follow the last.
    pub cut: bool,
}

impl Found {
    /// Take `record`, of `size` bytes as stored, as the read's next; whether
    /// the read goes on (neither `limit` nor `budget` reached).
    pub fn take(&mut self, record: Record, size: usize, limit: usize, budget: usize) -> bool {
        self.records.push(record);
        self.bytes = self.bytes.saturating_add(size);
        if self.records.len() >= limit {
            return false;
        }
        self.cut = self.bytes >= budget;
        !self.cut
    }
}

/// What a [`Store::query_raw`] found: records as stored, each checked as
/// a decode would check it ([`convert::check`]) but not built.
#[derive(Debug, Default)]
pub struct FoundRaw {
    pub records: Vec<mongodb::bson::RawDocumentBuf>,
    /// Their size as stored, in bytes.
    pub bytes: usize,
    /// As [`Found::cut`].
    pub cut: bool,
}

impl FoundRaw {
    /// As [`Found::take`].
    pub fn take(&mut self, record: mongodb::bson::RawDocumentBuf, limit: usize, budget: usize) -> bool {
        self.bytes = self.bytes.saturating_add(record.as_bytes().len());
        self.records.push(record);
        if self.records.len() >= limit {
            return false;
        }
        self.cut = self.bytes >= budget;
        !self.cut
    }
}

/// A secondary index: records ordered by the values of `fields` (each
/// ascending, or descending when written `-field`; a missing field counts
/// as null), then by `_id`. A `unique` index admits one record per value.
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
    /// The store keeps, for each value of each leading group of fields
    /// short of the whole key, how many entries start with it, so a count
    /// pinning those fields by equality reads one number instead of
    /// walking the entries (the embedded store; MongoDB has no such
    /// counts, and ignores it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub counted: bool,
}

impl IndexSpec {
    /// Each field's path and whether it is descending (written `-path`).
    pub fn keys(&self) -> impl Iterator<Item = (&str, bool)> {
        self.fields.iter().map(|f| match f.strip_prefix('-') {
            Some(path) => (path, true),
            None => (f.as_str(), false),
        })
    }
}

/// One edge of an [`Interval`] of index values, in MongoDB's order.
#[derive(Clone, Debug, PartialEq)]
pub enum Edge {
    /// Past every value (below, as a lower edge; above, as an upper one).
    Unbounded,
    /// The value, in or out.
    Value { value: Bson, inclusive: bool },
    /// The first (as a lower edge) or last (as an upper one) value of the
    /// type bracket of this value: `$gt: 5` stops at the last number.
    Bracket(Bson),
}

/// The values of one index field between two edges.
#[derive(Clone, Debug, PartialEq)]
pub struct Interval {
    pub lower: Edge,
    pub upper: Edge,
}

/// A read of a collection along one declared index, exact: every record it
/// returns matches, and it reads only the entries it returns (and, with
/// `count`, reads no record at all). It says which entries in the index's
/// own terms (values pinned, intervals of the next field's values, a place
/// to resume after), and each store reads them its own way: the embedded
/// store walks those entries, a store with a query engine (MongoDB) builds
/// its filter and order from them and hints the index. Only records with
/// string ids are read (every id txgate writes is one; on MongoDB another
/// tool may give a record a number or an ObjectId, which a cursor past it
/// would skip every string id of the same key for).
#[derive(Clone, Debug)]
pub struct IndexQuery {
    /// The index (by its name in the store).
    pub index: String,
    /// The index's fields in order, each with whether it is descending,
    /// `_id` last (the store's own last field where the index does not
    /// name it: [`Self::keys_of`]).
    pub keys: Vec<(String, bool)>,
    /// The values of the index's first fields, pinned by equality.
    pub eq: Vec<Bson>,
    /// The intervals of the next field's values, in order and disjoint;
    /// `None`: every value.
    pub slot: Option<Vec<Interval>>,
    /// Read against the index's directions.
    pub reverse: bool,
    /// Resume strictly after the entry whose fields after `eq` (the last
    /// being `_id`) have these values.
    pub after: Option<Vec<Bson>>,
    pub limit: usize,
    /// Bytes of records (as stored) after which the read stops, short of
    /// `limit`: the record that reaches it is the last returned, so at
    /// least one is (`usize::MAX`: no bound).
    pub budget: usize,
}
