//! The embedded backend: records as BSON in one redb table, keyed by
//! `(collection, id)`, and real secondary indexes beside them.
//!
//! An index entry is keyed by `(collection and index name, key bytes)`,
//! the key being the record's index field values in an order-preserving
//! encoding ([`keys`]) followed by its `_id` (a unique index leaves
//! the `_id` out, so a second record with the same values collides), and
//! holds the record's `_id`. Entries are written in the same redb write
//! transaction as their record, so a crash never leaves an index and its
//! records disagreeing. A scan reads its range of entries, applying the
//! limit while it reads: it decodes only the records it returns. Which
//! indexes exist is kept in a catalog table (and in memory); an index
//! declared for a collection that already has records is built from them.
//!
//! Writes go through one writer thread that applies every queued operation
//! in a single redb write transaction: group commit. Each operation is
//! still checked and applied on its own, in queue order, so it is atomic on
//! its one record. redb commits are not synced: durability comes from the
//! [`journal`], where each commit's effects are written
//! before the commit becomes visible. A batch holding a write that must be
//! synced syncs the journal before its commit becomes visible and before
//! any of it is answered, so such a write is visible only once it is on
//! disk, with everything before it; other batches are visible at once and
//! durable with the next sync. A crash keeps a prefix of the journal, so
//! it loses only a suffix of unsynced commits (docs/design.md §1). While
//! unsynced entries exist, the writer syncs at least every sync interval;
//! once the journal has grown past a bound, and when the store closes, a
//! checkpoint makes redb itself durable and the journal starts over. A
//! failed journal write or sync stops the process, as the unsynced writes
//! readers may have seen could no longer be made durable. Reads use redb's
//! MVCC read transactions and never wait for the writer.

mod apply;
mod backup;
mod build;
mod index;
pub mod journal;
pub mod keys;
mod lead;
mod reader;
mod recover;
mod scan;
mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use redb::{ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::disk::{DirDisk, Disk, Fence};
use super::{Durability, IndexQuery, IndexSpec, Record, Scan, Store, StoreError, StoreResult, Write};
use apply::WriteOp;
use backup::write_backup;
use index::{entries_name, entry_key};
use reader::Reader;
use writer::Queued;

pub use recover::truncate_journal;

/// The records of `query` among `records` (those of one collection), in
/// the query's order, as an index of the embedded store holds them: for a
/// store that keeps no index (the memory store), so both answer alike.
pub(crate) fn along_index<'r>(
    query: &IndexQuery,
    records: impl Iterator<Item = &'r Record>,
) -> StoreResult<Vec<&'r Record>> {
    let fields = query.keys.iter().map(|(path, desc)| if *desc { format!("-{path}") } else { path.clone() });
    let spec =
        IndexSpec { name: query.index.clone(), fields: fields.collect(), unique: false, sparse: false, counted: false };
    let ranges = scan::query_ranges(&spec, query)?;
    let mut hits: Vec<(Vec<u8>, &Record)> = records
        .filter_map(|record| {
            let id = record.get_str("_id").ok()?;
            let key = entry_key(&spec, record, id)?.bytes;
            ranges.iter().any(|(start, end)| *start <= key && key < *end).then_some((key, record))
        })
        .collect();
    hits.sort_by(|a, b| a.0.cmp(&b.0));
    if query.reverse {
        hits.reverse();
    }
    Ok(hits.into_iter().map(|(_, record)| record).collect())
}
pub use writer::WriterStats;

const RECORDS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("records");
/// `("<collection>\0<index>", key bytes) -> _id`.
const ENTRIES: TableDefinition<(&str, &[u8]), &str> = TableDefinition::new("index_entries");
/// `("<collection>\0<index>", key bytes of the leading values) -> entries`
/// of counted indexes (layout 2 on).
const COUNTS: TableDefinition<(&str, &[u8]), u64> = TableDefinition::new("index_counts");
/// `(collection, index) -> IndexSpec as JSON`.
const CATALOG: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("index_catalog");

/// `"applied" -> ` the number of the last journal entry this state holds,
/// written by each checkpoint and before a backup's snapshot (the batches
/// between leave it behind; see `Writer::note_applied`);
/// `"layout" -> ` the version of the tables' layout ([`LAYOUT`]).
const JOURNAL_STATE: TableDefinition<&str, u64> = TableDefinition::new("journal_state");
const APPLIED: &str = "applied";
const LAYOUT_KEY: &str = "layout";

/// The version of the store's layout: its tables and what they hold
/// (records as BSON, index entries, the catalog as JSON; from 2, the
/// counts of counted indexes; from 3, numbers in index keys encoded
/// exactly, [`keys::Numbers`]). A store without the key was written by a
/// release before versions were recorded, in layout 1. A layout 1 store
/// has no counted index (its catalog's indexes say nothing of counts), so
/// an empty count table is exact. A layout 1 or 2 store opens as layout 3
/// once the entries of records holding an integer from 2^63 − 512 to
/// 2^63 − 1 at an indexed path are encoded again
/// ([`index::renumber`], in the same commit as the new version).
pub(crate) const LAYOUT: u64 = 3;

/// The database and journal files in the data directory.
pub const DATABASE_FILE: &str = "txgate.redb";
pub const JOURNAL_FILE: &str = "txgate.journal";
/// Where a new database is made before it is renamed to [`DATABASE_FILE`].
const NEW_DATABASE_FILE: &str = "txgate.redb.new";

/// Upper bound on queued items committed together.
const MAX_BATCH: usize = 512;

/// A batch takes no further queued item once its journal effects reach
/// this many bytes: it bounds the writer's memory, and the time one batch
/// holds everything queued behind it.
pub const MAX_BATCH_BYTES: usize = 32 << 20;

/// Journal bytes after which a checkpoint makes redb durable and the
/// journal starts over; it bounds what opening the store replays.
pub(crate) const CHECKPOINT_BYTES: u64 = 16 << 20;

/// The most records a read runs on the calling thread rather than in the
/// blocking pool (see [`EmbeddedStore::read_sized`]): a page of a query
/// at the default limit and a little over.
const SMALL_READ: usize = 128;

/// The longest a commit waits for a checkpoint by default (see
/// [`Options::checkpoint_interval`]). At a million documents and 1,000
/// random writes a second, a quarter of a second's pages take 10 to 25 ms to
/// write and sync, a second's 50 to 100, and the sixteen seconds or so the
/// journal's bound alone allows a few hundred; the sustained throughput is
/// the same (see docs/bench-runs/2026-11-30-checkpoints.md).
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_millis(250);

/// The embedded store's default page cache, in MiB.
pub const DEFAULT_CACHE_MB: u64 = 256;

/// How long, at most, an unsynced write of the embedded store waits for a
/// sync by default.
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_millis(200);

/// How an embedded store is opened.
#[derive(Clone, Debug)]
pub struct Options {
    /// redb's page cache.
    pub cache_bytes: u64,
    /// Unsynced writes are made durable at least this often.
    pub sync_interval: Duration,
    /// Journal bytes after which a checkpoint starts it over.
    pub checkpoint_bytes: u64,
    /// The longest a commit waits for a checkpoint (`None`: only
    /// [`Self::checkpoint_bytes`] starts one). A checkpoint writes every
    /// page changed since the last one while writes wait, so this bounds
    /// that pause by time as well as by journal bytes.
    pub checkpoint_interval: Option<Duration>,
    /// Durable commits save redb's allocator state (two-phase), so an open
    /// after a crash needs no full repair of the file. Off only to measure
    /// what a crash cost without it.
    pub quick_repair: bool,
    /// The most records an index build reads into one sorted run
    /// ([`build`]).
    pub run_records: usize,
    /// How long the writer waits, idle after a sync, before it seals what
    /// the sync covered (see `journal`). Zero: a seal with every sync,
    /// before the answer, which makes the writes and syncs of a workload
    /// the same on every run (the power-loss sweep's crash points).
    pub seal_delay: Duration,
    /// Called by the writer each time it is about to answer its callers,
    /// after what the answer promises is done (the power-loss harness
    /// records whether a crash came before it; `None` in service).
    pub on_answer: Option<OnAnswer>,
}

/// See [`Options::on_answer`].
#[derive(Clone)]
pub struct OnAnswer(pub Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for OnAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnAnswer")
    }
}

impl Default for Options {
    fn default() -> Self {
        Self {
            cache_bytes: DEFAULT_CACHE_MB << 20,
            sync_interval: DEFAULT_SYNC_INTERVAL,
            checkpoint_bytes: CHECKPOINT_BYTES,
            checkpoint_interval: Some(DEFAULT_CHECKPOINT_INTERVAL),
            quick_repair: true,
            run_records: build::RUN_RECORDS,
            seal_delay: journal::SEAL_DELAY,
            on_answer: None,
        }
    }
}

/// The indexes of each collection, as committed.
type Catalog = Arc<RwLock<HashMap<String, Vec<IndexSpec>>>>;

/// A store in one redb file under the data directory.
pub struct EmbeddedStore {
    /// Reads, with the database, the index catalog and the read counters.
    reader: Reader,
    /// Whether redb had to repair the whole file when the store opened.
    repaired: bool,
    /// The writer and its queue (see [`lead`]).
    lead: Arc<lead::Lead>,
    /// The database file's fence, which counts its reads.
    fence: Fence,
    /// The writer's background thread, joined when the store closes.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    path: PathBuf,
    /// What the writer has done since the store opened.
    stats: Arc<WriterStats>,
    /// The runs of the index builds in progress ([`build`]).
    runs: build::Runs,
    /// The most records a run reads.
    run_records: usize,
    /// This opening's id ([`Store::opening`]).
    opening: String,
}

/// A store dropped without [`Store::close`] lets go of its file before
/// the drop returns: its writer thread, told so by its queue closing,
/// finishes what was queued, checkpoints, and is joined here, so the data
/// directory can be opened again at once.
impl Drop for EmbeddedStore {
    fn drop(&mut self) {
        let Some(thread) = self.thread.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).take() else {
            return;
        };
        self.lead.close();
        // A panic there was reported by the thread itself.
        let _ = thread.join();
    }
}

fn internal(err: impl std::fmt::Display) -> StoreError {
    StoreError::Internal(err.to_string())
}

impl EmbeddedStore {
    /// Open (or create) the store in `dir` with the default options.
    pub fn open(dir: &Path) -> StoreResult<Self> {
        Self::open_dir(dir, &Options::default())
    }

    /// Open (or create) the store in `dir` with `options`.
    pub fn open_dir(dir: &Path, options: &Options) -> StoreResult<Self> {
        let disk = DirDisk::create(dir)
            .map_err(|e| StoreError::Unavailable(format!("cannot create data directory {}: {e}", dir.display())))?;
        let mut store = Self::open_on(Arc::new(disk), options)?;
        store.path = dir.join(DATABASE_FILE);
        Ok(store)
    }

    /// Whether opening the store needed redb's full repair of the file
    /// (a crash after a checkpoint made without quick repair).
    pub fn repaired_at_open(&self) -> bool {
        self.repaired
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records decoded by reads since the store opened.
    pub fn decoded(&self) -> u64 {
        self.reader.reads.decoded.load(Ordering::Relaxed)
    }

    /// Reads of the database file since the store opened: the misses of
    /// redb's page cache (`TXGATE_CACHE_MB`).
    pub fn file_reads(&self) -> u64 {
        self.fence.reads()
    }

    /// Records decoded by queries ([`Store::query`]) since the store opened.
    pub fn queried(&self) -> u64 {
        self.reader.reads.queried.load(Ordering::Relaxed)
    }

    /// What the writer thread has done since the store opened.
    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }

    /// Every entry of index `name` of `coll` as `_id`s in index order (for
    /// tests that compare an index with its records).
    pub async fn index_ids(&self, coll: &str, name: &str) -> StoreResult<Vec<String>> {
        let table_name = entries_name(coll, name);
        let db = Arc::clone(&self.reader.db);
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(internal)?;
            let table = txn.open_table(ENTRIES).map_err(internal)?;
            let end = [keys::END];
            let range =
                table.range((table_name.as_str(), &[][..])..(table_name.as_str(), &end[..])).map_err(internal)?;
            range.map(|e| e.map(|(_, id)| id.value().to_owned()).map_err(internal)).collect()
        })
        .await
        .map_err(internal)?
    }

    /// Every record as stored, `(collection, id) -> BSON`, from one
    /// snapshot (for the power-loss harness and tests).
    pub fn dump(&self) -> StoreResult<std::collections::BTreeMap<(String, String), Vec<u8>>> {
        let txn = self.reader.db.begin_read().map_err(internal)?;
        let table = txn.open_table(RECORDS).map_err(internal)?;
        let mut out = std::collections::BTreeMap::new();
        for row in table.iter().map_err(internal)? {
            let (k, v) = row.map_err(internal)?;
            let (coll, id) = k.value();
            out.insert((coll.to_owned(), id.to_owned()), v.value().to_vec());
        }
        Ok(out)
    }

    /// What a backup writes into its directory, written onto `disk`
    /// instead (the power-loss tests' simulated disk): a snapshot taken
    /// right after a sync, copied into a new database there. The records
    /// copied.
    pub async fn backup_onto(&self, disk: Arc<dyn Disk>) -> StoreResult<u64> {
        let (tx, rx) = oneshot::channel();
        self.queue(WriteOp::Snapshot(tx), Durability::Synced).await?;
        let snapshot = rx.await.map_err(|_| StoreError::Unavailable("embedded writer stopped".into()))??;
        tokio::task::spawn_blocking(move || {
            let failed =
                |what: &str, e: &dyn std::fmt::Display| StoreError::Unavailable(format!("backup: {what}: {e}"));
            backup::copy_snapshot(&snapshot, disk.as_ref(), &failed).map(|(records, _)| records)
        })
        .await
        .map_err(internal)?
    }

    /// [`Self::dump`] with the index catalog: each declared index as a
    /// record `("#catalog", "{collection}/{name}")` holding its spec, so
    /// that declarations are compared as records are.
    pub fn dump_with_catalog(&self) -> StoreResult<std::collections::BTreeMap<(String, String), Vec<u8>>> {
        let mut out = self.dump()?;
        let txn = self.reader.db.begin_read().map_err(internal)?;
        let table = txn.open_table(CATALOG).map_err(internal)?;
        for row in table.iter().map_err(internal)? {
            let (k, v) = row.map_err(internal)?;
            let (coll, name) = k.value();
            out.insert(("#catalog".to_owned(), format!("{coll}/{name}")), v.value().to_vec());
        }
        Ok(out)
    }

    /// Check, in one snapshot, that every index holds exactly one entry per
    /// record it should hold, under the key that record gives it, and
    /// nothing else, and that the counts of counted indexes are those of
    /// their entries. Returns the first difference found.
    pub fn verify_indexes(&self) -> Result<(), String> {
        self.verify_indexes_building(&[])
    }

    /// [`Self::verify_indexes`] with the indexes `building` (collection,
    /// name) built part way: each of their entries matches its record and
    /// their counts are those of their entries, but records may lack
    /// their entries yet.
    pub fn verify_indexes_building(&self, building: &[(&str, &str)]) -> Result<(), String> {
        let partial: std::collections::BTreeSet<String> =
            building.iter().map(|(coll, name)| entries_name(coll, name)).collect();
        let txn = self.reader.db.begin_read().map_err(|e| e.to_string())?;
        let records = txn.open_table(RECORDS).map_err(|e| e.to_string())?;
        let entries = txn.open_table(ENTRIES).map_err(|e| e.to_string())?;
        let catalog = self.reader.catalog.read().expect("index catalog").clone();
        // Each record's entries, with the prefixes they are counted under.
        #[allow(clippy::type_complexity)]
        let mut expected: std::collections::BTreeMap<(String, Vec<u8>, String), Vec<Vec<u8>>> =
            std::collections::BTreeMap::new();
        for row in records.iter().map_err(|e| e.to_string())? {
            let (k, v) = row.map_err(|e| e.to_string())?;
            let (coll, id) = k.value();
            let Some(specs) = catalog.get(coll) else { continue };
            let record = super::convert::decode(v.value()).map_err(|e| format!("{coll}/{id}: {e}"))?;
            for spec in specs {
                if let Some(key) = entry_key(spec, &record, id) {
                    let prefixes = key.counted_prefixes().map(<[u8]>::to_vec).collect();
                    expected.insert((entries_name(coll, &spec.name), key.bytes, id.to_owned()), prefixes);
                }
            }
        }
        let mut found = std::collections::BTreeSet::new();
        for row in entries.iter().map_err(|e| e.to_string())? {
            let (k, v) = row.map_err(|e| e.to_string())?;
            let (table, key) = k.value();
            found.insert((table.to_owned(), key.to_vec(), v.value().to_owned()));
        }
        if let Some(missing) = expected.keys().find(|e| !partial.contains(&e.0) && !found.contains(*e)) {
            return Err(format!("index {:?} lacks the entry of record {}", missing.0, missing.2));
        }
        if let Some(extra) = found.iter().find(|e| !expected.contains_key(*e)) {
            return Err(format!("index {:?} has an entry for record {} that no record gives", extra.0, extra.2));
        }
        // Counted as the entries there are (all of them but for an index
        // built part way).
        let mut expected_counts: std::collections::BTreeMap<(String, Vec<u8>), u64> = std::collections::BTreeMap::new();
        for (entry, prefixes) in expected.iter().filter(|(e, _)| found.contains(*e)) {
            for prefix in prefixes {
                *expected_counts.entry((entry.0.clone(), prefix.clone())).or_default() += 1;
            }
        }
        let counts = txn.open_table(COUNTS).map_err(|e| e.to_string())?;
        let mut found_counts = std::collections::BTreeMap::new();
        for row in counts.iter().map_err(|e| e.to_string())? {
            let (k, v) = row.map_err(|e| e.to_string())?;
            let (table, prefix) = k.value();
            found_counts.insert((table.to_owned(), prefix.to_vec()), v.value());
        }
        if expected_counts != found_counts {
            let differs = expected_counts
                .keys()
                .chain(found_counts.keys())
                .find(|k| expected_counts.get(*k) != found_counts.get(*k))
                .expect("the maps differ somewhere");
            return Err(format!(
                "index {:?} counts {:?} entries under {:?}, its entries are {:?}",
                differs.0,
                found_counts.get(differs),
                differs.1,
                expected_counts.get(differs)
            ));
        }
        Ok(())
    }

    async fn queue(&self, op: WriteOp, durability: Durability) -> StoreResult<bool> {
        self.queue_chain(vec![op], durability).await.map(|applied| applied == 1)
    }

    async fn queue_chain(&self, ops: Vec<WriteOp>, durability: Durability) -> StoreResult<usize> {
        self.queue_item(ops, durability, false).await
    }

    async fn queue_item(&self, ops: Vec<WriteOp>, durability: Durability, all_or_nothing: bool) -> StoreResult<usize> {
        let (reply, rx) = oneshot::channel();
        self.lead.submit(Queued { ops, durability, all_or_nothing, reply })?;
        rx.await.map_err(|_| StoreError::Unavailable("embedded writer stopped".into()))?
    }
}

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn ping(&self) -> StoreResult<()> {
        self.reader.read(|_, _| Ok(())).await
    }

    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>> {
        self.reader.get(coll, id).await
    }

    async fn get_many_within(&self, coll: &str, ids: &[String], budget: usize) -> StoreResult<super::Found> {
        self.reader.get_many(coll, ids, budget).await
    }

    async fn scan_found(&self, coll: &str, scan: Scan) -> StoreResult<super::Found> {
        self.reader.scan(coll, scan).await
    }

    async fn query(&self, coll: &str, query: &IndexQuery) -> StoreResult<super::Found> {
        self.reader.query(coll, query).await
    }

    async fn query_raw(&self, coll: &str, query: &IndexQuery) -> StoreResult<super::FoundRaw> {
        self.reader.query_raw(coll, query).await
    }

    async fn count(&self, coll: &str, query: &IndexQuery) -> StoreResult<u64> {
        self.reader.count(coll, query).await
    }

    async fn collections(&self) -> StoreResult<Vec<String>> {
        self.reader.collections().await
    }

    async fn indexes(&self, coll: &str) -> StoreResult<Vec<IndexSpec>> {
        Ok(self.reader.indexes(coll))
    }

    /// One process opens the store at a time (redb's lock on the file).
    fn opening(&self) -> Option<&str> {
        Some(&self.opening)
    }

    /// A pinned reader: one redb read transaction for every read.
    async fn snapshot(&self) -> StoreResult<Option<super::DynStore>> {
        Ok(Some(Arc::new(reader::Pinned(self.reader.pin()?))))
    }

    async fn write(&self, coll: &str, write: Write<'_>, durability: Durability) -> StoreResult<bool> {
        self.queue(WriteOp::of(coll, write), durability).await
    }

    /// A chain is one group commit (one redb commit and one journal entry,
    /// which a crash keeps whole or drops whole); the writer checks every
    /// write of a chain before it applies any; a read transaction is a
    /// snapshot.
    fn capabilities(&self) -> super::Capabilities {
        super::Capabilities { cheap_chains: true, atomic_chains: true, all_or_nothing: true, snapshots: true }
    }
    fn syncs(&self) -> Option<u64> {
        Some(self.stats().syncs.load(Ordering::Relaxed))
    }
    fn checkpoints(&self) -> Option<(u64, Duration)> {
        let stats = self.stats();
        let took = Duration::from_nanos(stats.checkpoint_nanos.load(Ordering::Relaxed));
        Some((stats.checkpoints.load(Ordering::Relaxed), took))
    }
    fn unreadable(&self) -> u64 {
        self.reader.reads.unreadable.load(Ordering::Relaxed)
    }

    /// One queued chain: one group commit for all of it.
    async fn write_in_order(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<usize> {
        if writes.is_empty() {
            return Ok(0);
        }
        let ops = writes.into_iter().map(|(coll, write)| WriteOp::of(coll, write)).collect();
        self.queue_chain(ops, durability).await
    }

    /// One queued item, checked whole before any of it is applied.
    async fn write_all_or_nothing(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<bool> {
        let n = writes.len();
        let ops = writes.into_iter().map(|(coll, write)| WriteOp::of(coll, write)).collect();
        Ok(self.queue_item(ops, durability, true).await? == n)
    }

    async fn sync(&self) -> StoreResult<()> {
        // Everything committed so far is durable already: nothing to wait
        // for (a reader's sync after its read, most of the time).
        if !self.stats.unsynced.load(Ordering::SeqCst) {
            return Ok(());
        }
        self.queue(WriteOp::Sync, Durability::Synced).await.map(|_| ())
    }

    async fn close(&self) -> StoreResult<()> {
        // Answered once the writer has checkpointed and stopped; an error
        // means it had stopped already.
        let _ = self.queue(WriteOp::Close, Durability::Synced).await;
        let thread = self.thread.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
        if let Some(thread) = thread {
            tokio::task::spawn_blocking(move || thread.join())
                .await
                .map_err(internal)?
                .map_err(|_| StoreError::Internal("the writer thread panicked".into()))?;
        }
        Ok(())
    }

    async fn backup(&self, dest: &Path) -> StoreResult<Option<super::BackupInfo>> {
        let (tx, rx) = oneshot::channel();
        self.queue(WriteOp::Snapshot(tx), Durability::Synced).await?;
        let snapshot = rx.await.map_err(|_| StoreError::Unavailable("embedded writer stopped".into()))??;
        let dest = dest.to_owned();
        tokio::task::spawn_blocking(move || write_backup(&snapshot, &dest).map(Some)).await.map_err(internal)?
    }

    async fn ensure_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        if self.reader.spec(coll, &index.name).as_ref() == Some(&index) {
            return Ok(());
        }
        self.queue(WriteOp::EnsureIndex { coll: coll.to_owned(), spec: index, online: false }, Durability::Synced)
            .await
            .map(|_| ())
    }

    async fn declare_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        if self.reader.spec(coll, &index.name).as_ref() == Some(&index) {
            return Ok(());
        }
        self.queue(WriteOp::EnsureIndex { coll: coll.to_owned(), spec: index, online: true }, Durability::Synced)
            .await
            .map(|_| ())
    }

    /// A step of a build in sorted runs ([`build`]): `after` is the token
    /// the step before handed back.
    async fn build_index_step(
        &self,
        coll: &str,
        name: &str,
        after: Option<&str>,
        batch: usize,
    ) -> StoreResult<Option<String>> {
        let step = |entries| WriteOp::BuildIndex { coll: coll.to_owned(), name: name.to_owned(), entries };
        if batch == 0 {
            self.queue(step(None), Durability::Synced).await?;
            return Ok(None);
        }
        let mut resume = build::Resume::of(after)?;
        loop {
            let kept = match &resume {
                build::Resume::Within(start) => self.runs.take(coll, name, start),
                build::Resume::After(_) => None,
            };
            let mut run = match kept {
                Some(run) => run,
                // A new run, or one no longer kept: read (again).
                None => {
                    let (build::Resume::After(start) | build::Resume::Within(start)) = resume;
                    let spec = self
                        .reader
                        .spec(coll, name)
                        .ok_or_else(|| StoreError::Internal(format!("{coll} has no index {name} to build")))?;
                    let (coll, most) = (coll.to_owned(), self.run_records);
                    self.reader.read(move |txn, reads| build::read_run(txn, reads, &coll, &spec, start, most)).await?
                }
            };
            if run.entries.is_empty() {
                // No entry in the run (a sparse index's): on to the next.
                let Some(next) = run.after() else { return Ok(None) };
                resume = next;
                continue;
            }
            self.queue(step(Some(run.next_batch(batch))), Durability::Synced).await?;
            if run.entries.is_empty() {
                return Ok(run.after().map(|next| next.token()));
            }
            let within = build::Resume::Within(run.start.clone());
            self.runs.keep(run);
            return Ok(Some(within.token()));
        }
    }

    async fn drop_index(&self, coll: &str, name: &str) -> StoreResult<()> {
        self.runs.forget(coll, name);
        if self.reader.spec(coll, name).is_none() {
            return Ok(());
        }
        self.queue(WriteOp::DropIndex { coll: coll.to_owned(), name: name.to_owned() }, Durability::Synced)
            .await
            .map(|_| ())
    }
}
