//! The storage seam: single-document atomic operations over named
//! collections, and the two backends that implement them.
//!
//! Every write here is atomic on exactly one record. Conditional writes take
//! a filter in MongoDB's query syntax, restricted to the subset that
//! [`filter`] evaluates (equality, comparisons, `$in`, `$exists`, `$or`,
//! `$and` on dotted paths), so both backends agree on what a filter means.
//! Nothing above this module relies on a multi-document transaction.

pub(crate) mod convert;
pub(crate) mod deadline;
pub(crate) mod disk;
pub(crate) mod embedded;
mod error;
pub(crate) mod filter;
pub(crate) mod layer;
pub(crate) mod memory;
pub(crate) mod mongo;
pub(crate) mod powerloss;
pub(crate) mod scans;
pub(crate) mod server;
pub(crate) mod shape;
pub(crate) mod simdisk;
pub(crate) mod templates;

pub(crate) use embedded::journal;

use std::sync::Arc;

use async_trait::async_trait;
pub use mongodb::bson::{Bson, DateTime, Document, doc};

/// A stored record: a BSON document whose `_id` is a string.
pub type Record = Document;

pub use error::{StoreError, StoreResult};

/// Report a record a scan skipped because it cannot be decoded: the pass
/// goes on without it, and an operator learns which record it was (the
/// error names its collection and id; the store counts it).
pub(crate) fn report_unreadable(err: &StoreError) {
    tracing::warn!(error = %err, "skipping a stored record that cannot be decoded; repair or remove it");
}

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
    pub(crate) fn new(decl: &scans::ScanDecl, eq: Vec<Bson>) -> Self {
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
    /// The filter of a query along a user index: live documents (the
    /// index's first field pinned to `_meta.deleted: false`) matching all
    /// of `clauses`, of string ids.
    pub(crate) fn live_filter(clauses: Vec<Document>) -> Document {
        let mut all = vec![doc! {"_meta.deleted": false}];
        all.extend(clauses);
        all.push(string_ids());
        doc! {"$and": all}
    }

    /// Every live document of a collection (tombstones aside), along the
    /// `live` index every user collection has: for counting them.
    pub(crate) fn live() -> Self {
        Self {
            index: "live".into(),
            eq: vec![Bson::Boolean(false)],
            slot: None,
            reverse: false,
            after: None,
            limit: 0,
            budget: usize::MAX,
            filter: doc! {"$and": [{"_meta.deleted": false}, string_ids()]},
            sort: Vec::new(),
        }
    }
}

/// Records of string ids only. Every id txgate writes is one; on MongoDB
/// another tool may give a record a number or an ObjectId, which a query or
/// a count must not take in (a cursor past one would, by MongoDB's type
/// order, skip every string id of the same key). Every index txgate makes
/// ends with `_id`, so the condition is answered from the index.
fn string_ids() -> Document {
    doc! {"_id": {"$gte": ""}}
}

/// Bytes of records (as stored) after which a page of documents or of
/// events, or a batch of events, stops short of its count, with a cursor
/// to the rest: the record that reaches it is its last, so a page holds
/// at least one whatever its size.
pub(crate) const PAGE_BYTES: usize = 4 * 1024 * 1024;

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
    pub(crate) fn take(&mut self, record: Record, size: usize, limit: usize, budget: usize) -> bool {
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
    pub(crate) fn take(&mut self, record: mongodb::bson::RawDocumentBuf, limit: usize, budget: usize) -> bool {
        self.bytes = self.bytes.saturating_add(record.as_bytes().len());
        self.records.push(record);
        if self.records.len() >= limit {
            return false;
        }
        self.cut = self.bytes >= budget;
        !self.cut
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
/// `count`, reads no record at all). The embedded store reads the entries
/// `eq`, `slot` and `after` name; a store with a query engine (MongoDB)
/// runs `filter` in the order of `sort` with the index as its hint. Both
/// describe the same records: the query planner above the store makes
/// them from one filter.
#[derive(Clone, Debug)]
pub struct IndexQuery {
    /// The index (by its name in the store).
    pub index: String,
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
    /// The same records as a MongoDB filter.
    pub filter: Document,
    /// The fields after `eq` (the last being `_id`), each with the
    /// direction read (1 or -1): the order of the answer.
    pub sort: Vec<(String, i32)>,
}

/// Whether a write must be on disk before it returns (docs/design.md §1,
/// "Durable where it matters").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Durable before the call returns, and visible to readers only once
    /// durable. Everything written before it is durable with it.
    Synced,
    /// Visible at once, in order; durable with the next synced write, or
    /// within the store's sync interval. A crash may lose a suffix of
    /// these writes, never a write before a synced one.
    Unsynced,
}

/// One conditional single-record write.
#[derive(Debug)]
pub enum Write<'a> {
    /// Insert-if-absent. `Ok(false)` when a record with that `_id` exists.
    Insert(Record),
    /// Replace record `id` (its `_id` is kept) if it matches `filter`.
    Replace { id: &'a str, filter: Document, record: Record },
    /// Apply `update` to record `id` if it matches `filter`.
    Update { id: &'a str, filter: Document, update: Update },
    /// Delete record `id` if it matches `filter`.
    Delete { id: &'a str, filter: Document },
    /// Insert-if-absent of `record` (by its `_id`) into log collection
    /// `coll`, at the next free position: the store sets its [`LOG_SEQ`]
    /// field, which the log's unique index on it keeps unique. `Ok(false)`
    /// when a record with that `_id` exists. The embedded store numbers
    /// appends in the order it applies them, so its positions never show a
    /// gap; on MongoDB a position is taken from a counter before the
    /// insert, so a later position may be visible before an earlier one,
    /// and one whose appender died stays empty: readers of the log wait
    /// for such a gap and close it for good with a void entry
    /// ([`void_entry`]) after a timeout, and an append that finds its
    /// position taken takes the next one.
    Append(Record),
}

/// The field of a log record holding its position.
pub(crate) const LOG_SEQ: &str = "seq";
/// The field marking a log record as a void entry: a position closed for
/// good with nothing in it.
pub(crate) const LOG_VOID: &str = "void";

/// The void entry closing position `seq` of a log, logged at `at`.
pub fn void_entry(seq: u64, at: DateTime) -> Record {
    doc! {"_id": format!("void/{seq}"), LOG_SEQ: i64::try_from(seq).unwrap_or(i64::MAX), LOG_VOID: true, "logged_at": at}
}

impl Write<'_> {
    /// The `_id` the write is about.
    pub fn id(&self) -> Option<&str> {
        match self {
            Write::Insert(record) | Write::Append(record) => record_id(record),
            Write::Replace { id, .. } | Write::Update { id, .. } | Write::Delete { id, .. } => Some(id),
        }
    }

    /// `insert`, `replace`, `update` or `delete`.
    pub fn kind(&self) -> &'static str {
        match self {
            Write::Insert(_) => "insert",
            Write::Append(_) => "append",
            Write::Replace { .. } => "replace",
            Write::Update { .. } => "update",
            Write::Delete { .. } => "delete",
        }
    }
}

/// What a backup holds ([`Store::backup`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackupInfo {
    /// Records copied (documents and the gateway's own).
    pub records: u64,
    /// Size of the copy's database file.
    pub bytes: u64,
    /// The last journal entry the copy includes.
    pub journal_position: u64,
}

/// The narrow interface the protocol is written against.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// `"embedded"` or `"mongodb"`.
    fn backend(&self) -> &'static str;

    /// Cheap round trip proving the store answers.
    async fn ping(&self) -> StoreResult<()>;

    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>>;

    /// Apply one write to collection `coll`, durable as `durability` says.
    /// `Ok(false)`: the record exists (insert) or does not match the filter.
    async fn write(&self, coll: &str, write: Write<'_>, durability: Durability) -> StoreResult<bool>;

    /// Apply `writes` in order, each on its own as [`Store::write`] does,
    /// until one is not applied: a write is attempted only when every
    /// write before it was. Returns how many were applied. This is no
    /// transaction: each write is atomic on its one record, a crash may
    /// keep any prefix, and on an error a prefix may have been applied
    /// (as any write's outcome is unknown when it errs). It saves round
    /// trips where a step needs several writes in a set order (a
    /// transaction's record before its locks): the embedded store commits
    /// them together, in one group commit.
    async fn write_in_order(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<usize> {
        write_each(self, writes, durability).await
    }

    /// Whether [`Store::write_in_order`] costs one round trip, so that a
    /// chain beats the same writes issued in parallel. Where it does not
    /// (MongoDB: one request per write), the protocol's steps go in
    /// parallel instead.
    fn chains_cheaply(&self) -> bool {
        false
    }

    /// Whether a chain ([`Store::write_in_order`]) is durable whole: a
    /// crash keeps every write the chain applied or none of them, never a
    /// prefix. (A chain still stops at the first write whose filter
    /// fails.) Where it is, a single write and its change event's append
    /// go as one chain without the outbox (docs/design.md §1).
    fn chains_atomically(&self) -> bool {
        false
    }

    /// Whether [`Store::write_all_or_nothing`] is supported.
    fn writes_all_or_nothing(&self) -> bool {
        false
    }

    /// Apply all of `writes` or none: every write's condition (an insert's
    /// or append's `_id` free, a filter matched) is checked first, and only
    /// if every one holds are they all applied, in order, as one commit
    /// that a crash keeps whole or drops whole. `Ok(false)`: some
    /// condition failed and nothing was applied. Each write must be about
    /// another record. Only where [`Store::writes_all_or_nothing`] says so
    /// (the embedded store: one queued item of its single writer); the
    /// protocol never needs it, and goes without it elsewhere
    /// (docs/design.md §1).
    async fn write_all_or_nothing(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<bool> {
        let _ = (writes, durability);
        Err(StoreError::Internal(format!("the {} store cannot apply writes all or nothing", self.backend())))
    }

    /// [`Write::Append`] of each of `records` to `coll`, unsynced; where
    /// positions are taken from a counter (MongoDB), those of one call are
    /// taken at once and follow the order of `records`. Returns whether
    /// each was appended (`false`: it was there already).
    async fn append_all(&self, coll: &str, records: Vec<Record>) -> StoreResult<Vec<bool>> {
        let mut out = Vec::with_capacity(records.len());
        for record in records {
            out.push(self.write(coll, Write::Append(record), Durability::Unsynced).await?);
        }
        Ok(out)
    }

    /// Make every write so far durable (at shutdown).
    async fn sync(&self) -> StoreResult<()>;

    /// The store as it is now, for reads only, where a store can give
    /// one: every read made through it sees the same state, whatever is
    /// written meanwhile, and a write through it is refused. The embedded
    /// store gives one (a redb read transaction); `None` elsewhere (on
    /// MongoDB a snapshot read needs a replica set's read concern).
    async fn snapshot(&self) -> StoreResult<Option<DynStore>> {
        Ok(None)
    }

    /// Whether [`Store::snapshot`] gives snapshots.
    fn snapshots(&self) -> bool {
        false
    }

    /// The id of this opening of a store that one process at a time can
    /// open (the embedded store): whatever another opening leased is
    /// dead, as the process that held it is. `None` where several
    /// processes share the store (MongoDB), and a lease runs out.
    fn opening(&self) -> Option<&str> {
        None
    }

    /// Close the store at shutdown: every write so far durable, and (for
    /// the embedded store) a checkpoint, so the next start replays
    /// nothing, and its writer thread joined. No write is taken after.
    async fn close(&self) -> StoreResult<()> {
        self.sync().await
    }

    /// Write a consistent copy of the store into the new directory `dest`,
    /// where a store can (the embedded one; `None` elsewhere). Writes go on
    /// meanwhile; the copy holds every write made durable before it began
    /// and nothing after.
    async fn backup(&self, dest: &std::path::Path) -> StoreResult<Option<BackupInfo>> {
        let _ = dest;
        Ok(None)
    }

    /// Durable syncs (fsyncs) made so far, for a store that counts them
    /// (the embedded one); exposed as `txgate_store_syncs_total`.
    fn syncs(&self) -> Option<u64> {
        None
    }

    /// Checkpoints made so far and the time writes waited for them in all,
    /// for a store that makes them (the embedded one); exposed as
    /// `txgate_store_checkpoints_total` and
    /// `txgate_store_checkpoint_seconds_total`.
    fn checkpoints(&self) -> Option<(u64, std::time::Duration)> {
        None
    }

    /// Records reads met that could not be decoded (see
    /// [`convert::decode`]); exposed as
    /// `txgate_store_unreadable_records_total`.
    fn unreadable(&self) -> u64 {
        0
    }

    /// A synced insert-if-absent (see [`Write::Insert`]).
    async fn insert(&self, coll: &str, record: Record) -> StoreResult<bool> {
        self.write(coll, Write::Insert(record), Durability::Synced).await
    }

    /// A synced [`Write::Replace`].
    async fn replace(&self, coll: &str, id: &str, filter: Document, record: Record) -> StoreResult<bool> {
        self.write(coll, Write::Replace { id, filter, record }, Durability::Synced).await
    }

    /// A synced [`Write::Update`].
    async fn update(&self, coll: &str, id: &str, filter: Document, update: Update) -> StoreResult<bool> {
        self.write(coll, Write::Update { id, filter, update }, Durability::Synced).await
    }

    /// A synced [`Write::Delete`].
    async fn delete(&self, coll: &str, id: &str, filter: Document) -> StoreResult<bool> {
        self.write(coll, Write::Delete { id, filter }, Durability::Synced).await
    }

    /// Up to `scan.limit` records matching the filter, in the scan's order.
    async fn scan(&self, coll: &str, scan: Scan) -> StoreResult<Vec<Record>> {
        Ok(self.scan_found(coll, scan).await?.records)
    }

    /// [`Store::scan`], and their size as stored, and whether the scan's
    /// byte budget ([`Scan::within`]) stopped it before its limit.
    async fn scan_found(&self, coll: &str, scan: Scan) -> StoreResult<Found>;

    /// Up to `query.limit` records along a declared index, in its order
    /// (see [`IndexQuery`]), fewer when they reach `query.budget` bytes.
    async fn query(&self, coll: &str, query: &IndexQuery) -> StoreResult<Found>;

    /// [`Store::query`] with the records as stored, not built: a reader
    /// that writes them out (a page of documents) saves building them.
    /// Where the store reads built documents (MongoDB), they are encoded.
    async fn query_raw(&self, coll: &str, query: &IndexQuery) -> StoreResult<FoundRaw> {
        let found = self.query(coll, query).await?;
        let records = found
            .records
            .iter()
            .map(mongodb::bson::RawDocumentBuf::from_document)
            .collect::<Result<_, _>>()
            .map_err(|e| StoreError::Internal(format!("a record read does not encode: {e}")))?;
        Ok(FoundRaw { records, bytes: found.bytes, cut: found.cut })
    }

    /// How many records `query` finds (its `after` and `limit` aside),
    /// counted from index entries.
    async fn count(&self, coll: &str, query: &IndexQuery) -> StoreResult<u64>;

    /// Declare an index whose records a builder then adds with
    /// [`Store::build_index_step`]: from now on every write keeps its
    /// entries. A store that builds indexes online itself (MongoDB)
    /// builds it here, and has no steps.
    async fn declare_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        self.ensure_index(coll, index).await
    }

    /// Add up to `batch` entries of the records of `coll` to declared
    /// index `name`, as one commit, going on where the step before left
    /// off: `after` is what that step returned (`None` for the first).
    /// Returns where the next step goes on (a token only the store reads),
    /// or `None` once no record is left (or where [`Store::declare_index`]
    /// built it whole). A step may be lost in a crash (the build then
    /// starts over): the builder ends with a step of `batch` 0, which
    /// makes every step before it durable.
    async fn build_index_step(
        &self,
        coll: &str,
        name: &str,
        after: Option<&str>,
        batch: usize,
    ) -> StoreResult<Option<String>> {
        let _ = (coll, name, after, batch);
        Ok(None)
    }

    /// Records with one of `ids` (missing ones are left out).
    async fn get_many(&self, coll: &str, ids: &[String]) -> StoreResult<Vec<Record>> {
        Ok(self.get_many_within(coll, ids, usize::MAX).await?.records)
    }

    /// [`Store::get_many`], read in the order of `ids` and stopped by
    /// `budget` bytes as stored ([`Found::take`]): `cut` when it stopped
    /// with ids left to read (which may name no record).
    async fn get_many_within(&self, coll: &str, ids: &[String], budget: usize) -> StoreResult<Found>;

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

impl dyn Store {
    /// The same writes, [`Durability::Unsynced`]: for what no client is
    /// told and a synced write or recovery makes good (docs/design.md §1).
    pub fn unsynced(&self) -> Unsynced<'_> {
        Unsynced(self)
    }
}

/// Unsynced writes to a store (see [`Durability::Unsynced`]).
pub struct Unsynced<'a>(&'a dyn Store);

impl Unsynced<'_> {
    pub async fn insert(&self, coll: &str, record: Record) -> StoreResult<bool> {
        self.0.write(coll, Write::Insert(record), Durability::Unsynced).await
    }

    pub async fn replace(&self, coll: &str, id: &str, filter: Document, record: Record) -> StoreResult<bool> {
        self.0.write(coll, Write::Replace { id, filter, record }, Durability::Unsynced).await
    }

    pub async fn update(&self, coll: &str, id: &str, filter: Document, update: Update) -> StoreResult<bool> {
        self.0.write(coll, Write::Update { id, filter, update }, Durability::Unsynced).await
    }

    pub async fn delete(&self, coll: &str, id: &str, filter: Document) -> StoreResult<bool> {
        self.0.write(coll, Write::Delete { id, filter }, Durability::Unsynced).await
    }

    /// See [`Write::Append`].
    pub async fn append(&self, coll: &str, record: Record) -> StoreResult<bool> {
        self.0.write(coll, Write::Append(record), Durability::Unsynced).await
    }

    /// See [`Store::write_in_order`].
    pub async fn in_order(&self, writes: Vec<(&str, Write<'_>)>) -> StoreResult<usize> {
        self.0.write_in_order(writes, Durability::Unsynced).await
    }
}

/// [`Store::write_in_order`] as one write after another: how many were
/// applied before the first that was not.
pub(crate) async fn write_each<S: Store + ?Sized>(
    store: &S,
    writes: Vec<(&str, Write<'_>)>,
    durability: Durability,
) -> StoreResult<usize> {
    let mut applied = 0;
    for (coll, write) in writes {
        if !store.write(coll, write, durability).await? {
            break;
        }
        applied += 1;
    }
    Ok(applied)
}

/// One page of an `_id`-ordered `scan` of `coll`: up to `limit` records
/// after id `after`, decoded, and the id to continue after when more exist.
/// A record `decode` refuses is left out of the page and reported.
pub(crate) async fn page<T>(
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
    let decoded = records.into_iter().filter_map(|record| {
        let id = record_id(&record).unwrap_or_default().to_owned();
        decode(record).map_err(|e| report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}")))).ok()
    });
    Ok((decoded.collect(), next))
}

/// Collections [`get_all_within`] reads side by side.
const READS_AT_ONCE: usize = 8;

/// The records of `wanted` (ids by collection; missing ones are left out),
/// read [`READS_AT_ONCE`] collections side by side, each within an equal
/// share of what is left of `budget` bytes as stored; a collection that its
/// share cut short is read on in a later round. `None` when the records
/// hold more than `budget` in all: the read stops there, having held at
/// most `budget` and one record per collection of a round.
pub(crate) async fn get_all_within<'c>(
    store: &(impl Store + ?Sized),
    wanted: impl IntoIterator<Item = (&'c str, Vec<String>)>,
    budget: usize,
) -> StoreResult<Option<Vec<(&'c str, Record)>>> {
    let mut queue: std::collections::VecDeque<(&'c str, Vec<String>)> = wanted.into_iter().collect();
    let (mut spent, mut out) = (0usize, Vec::new());
    while !queue.is_empty() {
        if spent > budget {
            return Ok(None);
        }
        let round: Vec<(&'c str, Vec<String>)> = queue.drain(..queue.len().min(READS_AT_ONCE)).collect();
        // At least one byte: a budget spent exactly still finds out
        // whether anything is left.
        let share = ((budget - spent) / round.len()).max(1);
        let reads = round.iter().map(|(coll, ids)| store.get_many_within(coll, ids, share));
        let found = futures::future::try_join_all(reads).await?;
        for ((coll, ids), found) in round.into_iter().zip(found) {
            spent = spent.saturating_add(found.bytes);
            if found.cut {
                let got: std::collections::HashSet<&str> = found.records.iter().filter_map(record_id).collect();
                let left: Vec<String> = ids.into_iter().filter(|id| !got.contains(id.as_str())).collect();
                queue.push_back((coll, left));
            }
            out.extend(found.records.into_iter().map(|record| (coll, record)));
        }
    }
    Ok((spent <= budget).then_some(out))
}

/// Records one background step reads or deletes at a time: recovery's
/// scans, the lock sweep, purges. Steps repeat batches while there is work.
pub(crate) const BATCH: usize = 200;

/// Delete every record of `coll` that `scan` finds (it must be bounded so
/// that what it finds stays found: a cutoff), in batches of [`BATCH`] while
/// batches come back full. Each delete is conditional on the scan's own
/// filter, so a record changed meanwhile is kept. Returns how many went.
pub(crate) async fn purge(store: &dyn Store, coll: &str, scan: Scan) -> StoreResult<usize> {
    let (filter, _) = scan.to_query();
    let mut purged = 0;
    loop {
        let batch = store.scan(coll, scan.clone().limit(BATCH)).await?;
        let full = batch.len() == BATCH;
        // The deletes of a batch go together: one group commit (or one
        // round of requests) for all of them, not one each.
        // Unsynced: a purge lost in a crash is done again by the next pass.
        let unsynced = store.unsynced();
        let deletes = batch.iter().filter_map(record_id).map(|id| unsynced.delete(coll, id, filter.clone()));
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
pub(crate) fn record_id(record: &Record) -> Option<&str> {
    record.get_str("_id").ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records of `n` bytes each as stored, `count` of them in `coll`.
    async fn fill(store: &memory::MemoryStore, coll: &str, count: usize) -> usize {
        let mut size = 0;
        for i in 0..count {
            let record = doc! {"_id": format!("{coll}-{i}"), "pad": "x".repeat(100)};
            size = mongodb::bson::to_vec(&record).expect("bson").len();
            store.insert(coll, record).await.expect("insert");
        }
        size
    }

    fn ids(coll: &'static str, count: usize) -> (&'static str, Vec<String>) {
        (coll, (0..count).map(|i| format!("{coll}-{i}")).collect())
    }

    #[tokio::test]
    async fn a_page_leaves_out_a_record_it_cannot_decode() {
        let store = memory::MemoryStore::default();
        fill(&store, "l", 4).await;
        let decode = |r: Record| match record_id(&r) {
            Some("l-1") => Err(StoreError::Internal("not a record of this list".into())),
            id => Ok(id.unwrap_or_default().to_owned()),
        };
        let (got, next) = page(&store, "l", scans::SUBSCRIPTIONS.scan(Vec::new()), None, 3, decode).await.unwrap();
        assert_eq!((got, next.as_deref()), (vec!["l-0".to_owned(), "l-2".into()], Some("l-2")));
    }

    #[tokio::test]
    async fn reads_over_collections_are_refused_exactly_past_their_budget() {
        let store = memory::MemoryStore::default();
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let mut size = 0;
        for (i, coll) in names.iter().enumerate() {
            size = fill(&store, coll, i + 1).await;
        }
        // 10 collections (two rounds), 55 records; one asks for a missing id.
        let mut wanted: Vec<(&str, Vec<String>)> = names.iter().enumerate().map(|(i, c)| ids(c, i + 1)).collect();
        wanted[0].1.push("nobody".into());
        let read = |budget| get_all_within(&store, wanted.clone(), budget);
        let all = read(55 * size).await.unwrap().expect("exactly the budget is within it");
        assert_eq!(all.len(), 55);
        let mut got: Vec<String> = all.iter().map(|(c, r)| format!("{c}:{}", record_id(r).unwrap())).collect();
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 55);
        assert!(read(55 * size - 1).await.unwrap().is_none(), "one byte short");
        assert!(read(1).await.unwrap().is_none());
        // One collection whose share is cut (one of 9 records against the
        // share of two collections) is read on: all within the budget.
        let uneven = vec![ids("i", 9), ids("a", 1)];
        let found = get_all_within(&store, uneven.clone(), 10 * size).await.unwrap().expect("within");
        assert_eq!(found.len(), 10);
        assert!(get_all_within(&store, uneven, 10 * size - 1).await.unwrap().is_none());
        assert_eq!(
            get_all_within(&store, Vec::<(&str, Vec<String>)>::new(), 0).await.unwrap().map(|r| r.len()),
            Some(0)
        );
    }
}
