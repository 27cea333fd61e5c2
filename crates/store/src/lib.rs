//! txgate's storage engine: single-document atomic operations over named
//! collections (the [`Store`] trait), and the stores that implement it —
//! [`memory`], [`mongo`] and [`embedded`] (redb with its own journal) — with
//! the [`layer`]s that wrap any of them.
//!
//! Every write here is atomic on exactly one record. Conditional writes take
//! a filter in MongoDB's query syntax, restricted to the subset that
//! [`filter`] evaluates (equality, comparisons, `$in`, `$exists`, `$or`,
//! `$and` on dotted paths), so every store agrees on what a filter means.
//! Nothing above this crate relies on a multi-document transaction, and this
//! crate knows nothing of the gateway above it.
//!
//! With the `test-support` feature it also has [`simdisk`], a disk that
//! loses power, and [`powerloss`], the sweep that crashes the embedded store
//! on it at every write and sync.

pub mod convert;
pub mod disk;
pub mod embedded;
mod error;
pub mod filter;
pub mod layer;
pub mod memory;
pub mod mongo;
mod ops;
#[cfg(feature = "test-support")]
pub mod powerloss;
mod read;
pub mod scans;
pub mod server;
pub mod shape;
#[cfg(any(test, feature = "test-support"))]
pub mod simdisk;
pub mod templates;
mod write;

pub use embedded::journal;

use std::sync::Arc;

use async_trait::async_trait;
pub use mongodb::bson::{Bson, DateTime, Document, doc};

/// A stored record: a BSON document whose `_id` is a string.
pub type Record = Document;

pub use error::{StoreError, StoreResult};
pub use ops::{BATCH, get_all_within, page, purge, record_id, write_each};
pub use read::{Bound, Edge, Found, FoundRaw, IndexQuery, IndexSpec, Interval, Order, PAGE_BYTES, Scan};
pub use write::{Durability, LOG_SEQ, LOG_VOID, Unsynced, Update, Write, WriteKind, void_entry};

/// Report a record a scan skipped because it cannot be decoded: the pass
/// goes on without it, and an operator learns which record it was (the
/// error names its collection and id; the store counts it).
pub fn report_unreadable(err: &StoreError) {
    tracing::warn!(error = %err, "skipping a stored record that cannot be decoded; repair or remove it");
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

/// What a store can do beyond the [`Store`] contract, answered once as one
/// value ([`Store::capabilities`]); a layer that takes chains apart (a
/// fault injector) clears what that takes away.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Capabilities {
    /// [`Store::write_in_order`] costs one round trip, so that a chain
    /// beats the same writes issued in parallel. Where it does not
    /// (MongoDB: one request per write), the protocol's steps go in
    /// parallel instead.
    pub cheap_chains: bool,
    /// A chain ([`Store::write_in_order`]) is durable whole: a crash keeps
    /// every write the chain applied or none of them, never a prefix. (A
    /// chain still stops at the first write whose filter fails.) Where it
    /// is, a single write and its change event's append go as one chain
    /// without the outbox (docs/design.md §1).
    pub atomic_chains: bool,
    /// [`Store::write_all_or_nothing`] is supported.
    pub all_or_nothing: bool,
    /// [`Store::snapshot`] gives snapshots.
    pub snapshots: bool,
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

    /// What this store can do beyond the trait's contract: the one value
    /// the protocol above branches on (none, by default).
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Apply all of `writes` or none: every write's condition (an insert's
    /// or append's `_id` free, a filter matched) is checked first, and only
    /// if every one holds are they all applied, in order, as one commit
    /// that a crash keeps whole or drops whole. `Ok(false)`: some
    /// condition failed and nothing was applied. Each write must be about
    /// another record. Only where [`Capabilities::all_or_nothing`] says so
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
