//! The embedded backend: records as BSON in one redb table, keyed by
//! `(collection, id)`, and real secondary indexes beside them.
//!
//! An index entry is keyed by `(collection and index name, key bytes)`,
//! the key being the record's index field values in an order-preserving
//! encoding ([`super::keys`]) followed by its `_id` (a unique index leaves
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
//! [`journal`](super::journal), where each commit's effects are written
//! before the commit becomes visible. A batch holding a write that must be
//! synced syncs the journal before its commit becomes visible and before
//! any of it is answered, so such a write is visible only once it is on
//! disk, with everything before it; other batches are visible at once and
//! durable with the next sync. A crash keeps a prefix of the journal, so
//! it loses only a suffix of unsynced commits (DESIGN.md §1). While
//! unsynced entries exist, the writer syncs at least every sync interval;
//! once the journal has grown past a bound, and when the store closes, a
//! checkpoint makes redb itself durable and the journal starts over. A
//! failed journal write or sync stops the process, as the unsynced writes
//! readers may have seen could no longer be made durable. Reads use redb's
//! MVCC read transactions and never wait for the writer.

use std::collections::HashMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, mpsc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::disk::{DirDisk, Disk, Fence};
use super::filter::{apply_update, lookup, matches};
use super::journal::{self, Effect, Effects, Journal};
use super::keys;
use super::{
    Bson, Document, Durability, IndexSpec, Order, Record, Scan, Store, StoreError, StoreResult, Update, Write,
};

const RECORDS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("records");
/// `("<collection>\0<index>", key bytes) -> _id`.
const ENTRIES: TableDefinition<(&str, &[u8]), &str> = TableDefinition::new("index_entries");
/// `(collection, index) -> IndexSpec as JSON`.
const CATALOG: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("index_catalog");

/// `"applied" -> ` the number of the last journal entry this state holds;
/// `"layout" -> ` the version of the tables' layout ([`LAYOUT`]).
const JOURNAL_STATE: TableDefinition<&str, u64> = TableDefinition::new("journal_state");
const APPLIED: &str = "applied";
const LAYOUT_KEY: &str = "layout";

/// The version of the store's layout: its tables and what they hold
/// (records as BSON, index entries, the catalog as JSON). A store without
/// the key was written by a release before versions were recorded, in
/// this same layout.
pub const LAYOUT: u64 = 1;

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
pub const CHECKPOINT_BYTES: u64 = 16 << 20;

/// How an embedded store is opened.
#[derive(Clone, Debug)]
pub struct Options {
    /// redb's page cache.
    pub cache_bytes: u64,
    /// Unsynced writes are made durable at least this often.
    pub sync_interval: Duration,
    /// Journal bytes after which a checkpoint starts it over.
    pub checkpoint_bytes: u64,
    /// Durable commits save redb's allocator state (two-phase), so an open
    /// after a crash needs no full repair of the file. Off only to measure
    /// what a crash cost without it.
    pub quick_repair: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            cache_bytes: crate::config::DEFAULT_CACHE_MB << 20,
            sync_interval: crate::config::DEFAULT_SYNC_INTERVAL,
            checkpoint_bytes: CHECKPOINT_BYTES,
            quick_repair: true,
        }
    }
}

/// The indexes of each collection, as committed.
type Catalog = Arc<RwLock<HashMap<String, Vec<IndexSpec>>>>;

/// Records the writer wrote lately, decoded: the next conditional write of
/// one of them (a transaction's record moving on, a locked document rolled
/// forward, a hot document) takes it from here instead of decoding it
/// again. Only the writer thread changes records, and it keeps this equal
/// to what it committed: a write takes its record out and puts the new one
/// back once applied; a write that fails leaves it out; a batch that fails
/// empties it. Every record it holds counts its encoded size against the
/// byte bound, a record put back unchanged included.
#[derive(Default)]
struct Recent {
    records: HashMap<String, (Record, usize)>,
    bytes: usize,
}

impl Recent {
    const MAX_RECORDS: usize = 4096;
    const MAX_BYTES: usize = 32 << 20;
    /// Larger records are not kept.
    const MAX_RECORD: usize = 64 << 10;

    fn key(coll: &str, id: &str) -> String {
        format!("{coll}\0{id}")
    }

    fn contains(&self, coll: &str, id: &str) -> bool {
        self.records.contains_key(&Self::key(coll, id))
    }

    /// The record and its encoded size.
    fn take(&mut self, coll: &str, id: &str) -> Option<(Record, usize)> {
        let (record, size) = self.records.remove(&Self::key(coll, id))?;
        self.bytes -= size;
        Some((record, size))
    }

    /// Keep `record` (encoded in `size` bytes) as the current `coll`/`id`.
    fn put(&mut self, coll: &str, id: &str, record: Record, size: usize) {
        if size > Self::MAX_RECORD {
            return;
        }
        if self.records.len() >= Self::MAX_RECORDS || self.bytes + size > Self::MAX_BYTES {
            self.clear();
        }
        self.bytes += size;
        if let Some((_, before)) = self.records.insert(Self::key(coll, id), (record, size)) {
            self.bytes -= before;
        }
    }

    fn clear(&mut self) {
        self.records.clear();
        self.bytes = 0;
    }
}

enum WriteOp {
    Insert {
        coll: String,
        record: Record,
    },
    Replace {
        coll: String,
        id: String,
        filter: Document,
        record: Record,
    },
    Update {
        coll: String,
        id: String,
        filter: Document,
        update: Update,
    },
    Delete {
        coll: String,
        id: String,
        filter: Document,
    },
    Append {
        coll: String,
        record: Record,
    },
    /// Index changes commit on their own.
    EnsureIndex {
        coll: String,
        spec: IndexSpec,
    },
    DropIndex {
        coll: String,
        name: String,
    },
    /// Nothing to apply: make every write so far durable.
    Sync,
    /// Make every write so far durable and open a read transaction on
    /// that state (a backup's snapshot); commits on its own.
    Snapshot(oneshot::Sender<StoreResult<redb::ReadTransaction>>),
    /// Checkpoint and stop the writer (the store closes).
    Close,
}

impl WriteOp {
    fn of(coll: &str, write: Write<'_>) -> Self {
        let coll = coll.to_owned();
        match write {
            Write::Insert(record) => WriteOp::Insert { coll, record },
            Write::Replace { id, filter, record } => WriteOp::Replace { coll, id: id.to_owned(), filter, record },
            Write::Update { id, filter, update } => WriteOp::Update { coll, id: id.to_owned(), filter, update },
            Write::Delete { id, filter } => WriteOp::Delete { coll, id: id.to_owned(), filter },
            Write::Append(record) => WriteOp::Append { coll, record },
        }
    }

    /// Whether the item commits on its own, outside any batch.
    fn is_schema(&self) -> bool {
        matches!(self, WriteOp::EnsureIndex { .. } | WriteOp::DropIndex { .. } | WriteOp::Snapshot(_) | WriteOp::Close)
    }
}

/// How many of a queued chain's writes were applied.
type Reply = oneshot::Sender<StoreResult<usize>>;

/// Writes waiting for the writer: one, or a chain applied in order until
/// one is not applied ([`Store::write_in_order`]).
struct Queued {
    ops: Vec<WriteOp>,
    durability: Durability,
    reply: Reply,
}

impl Queued {
    fn is_schema(&self) -> bool {
        self.ops.first().is_some_and(WriteOp::is_schema)
    }
}

/// A store in one redb file under the data directory.
pub struct EmbeddedStore {
    db: Arc<Database>,
    /// Whether redb had to repair the whole file when the store opened.
    repaired: bool,
    writer: mpsc::Sender<Queued>,
    /// The writer thread, joined when the store closes.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    path: PathBuf,
    catalog: Catalog,
    /// What reads (gets and scans) decoded and skipped since the store opened.
    reads: Arc<Reads>,
    /// What the writer has done since the store opened.
    stats: Arc<WriterStats>,
}

/// Counters of the writer thread, for benchmarks and metrics.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// redb commits (group commits), synced or not.
    pub commits: AtomicU64,
    /// Syncs (fsyncs) of the journal or, at checkpoints, of redb.
    pub syncs: AtomicU64,
    /// Checkpoints: redb made durable, the journal started over.
    pub checkpoints: AtomicU64,
    /// Queued writes applied or refused (a chain counts each of its writes).
    pub writes: AtomicU64,
    /// Time spent committing, in nanoseconds (the writer's busy time).
    pub busy_nanos: AtomicU64,
    /// Of which in commits that synced, and in checkpoints.
    pub synced_nanos: AtomicU64,
    /// Where the busy time went, in nanoseconds: applying batches (redb's
    /// write transaction begun, each write checked and applied, indexes
    /// kept), writing their journal entries, syncing the journal, committing
    /// to redb (unsynced), and checkpoints (redb made durable).
    pub apply_nanos: AtomicU64,
    pub journal_nanos: AtomicU64,
    pub sync_nanos: AtomicU64,
    pub commit_nanos: AtomicU64,
    pub checkpoint_nanos: AtomicU64,
    /// Journal entries written.
    pub entries: AtomicU64,
    /// The longest a commit waited unsynced before a sync covered it, and
    /// the longest one batch took, in nanoseconds: the sync interval is a
    /// deadline when the first stays within the interval plus a batch.
    pub max_unsynced_nanos: AtomicU64,
    pub max_batch_nanos: AtomicU64,
    /// The most journal bytes one batch wrote.
    pub max_batch_bytes: AtomicU64,
    /// Records in the writer's cache of recent records, and the bytes it
    /// counts for them, after the last batch.
    pub recent_records: AtomicU64,
    pub recent_bytes: AtomicU64,
    /// Some commit is not durable yet: set before such a commit becomes
    /// visible, cleared once a sync covers it. A reader that finds it
    /// clear after reading has read only durable data.
    pub unsynced: std::sync::atomic::AtomicBool,
}

fn internal(err: impl std::fmt::Display) -> StoreError {
    StoreError::Internal(err.to_string())
}

/// The entry-table name of index `name` of `coll`.
fn entries_name(coll: &str, name: &str) -> String {
    format!("{coll}\0{name}")
}

impl EmbeddedStore {
    /// Open (or create) the store in `dir` with the default page cache and
    /// sync interval.
    pub fn open(dir: &Path) -> StoreResult<Self> {
        Self::open_with(dir, crate::config::DEFAULT_CACHE_MB << 20, crate::config::DEFAULT_SYNC_INTERVAL)
    }

    /// Open (or create) the store in `dir` with a page cache of
    /// `cache_bytes`; unsynced writes are made durable at least every
    /// `sync_interval`.
    pub fn open_with(dir: &Path, cache_bytes: u64, sync_interval: Duration) -> StoreResult<Self> {
        let disk = DirDisk::create(dir)
            .map_err(|e| StoreError::Unavailable(format!("cannot create data directory {}: {e}", dir.display())))?;
        let options = Options { cache_bytes, sync_interval, ..Options::default() };
        let mut store = Self::open_on(Arc::new(disk), &options)?;
        store.path = dir.join(DATABASE_FILE);
        Ok(store)
    }

    /// Open (or create) the store on `disk`: the database, then the
    /// journal, whose entries the database does not hold yet are replayed
    /// into it.
    pub fn open_on(disk: Arc<dyn Disk>, options: &Options) -> StoreResult<Self> {
        let unavailable = |e: std::io::Error| StoreError::Unavailable(format!("data directory: {e}"));
        let cache = usize::try_from(options.cache_bytes).unwrap_or(usize::MAX);
        let db_name = disk.describe(DATABASE_FILE);
        let opened = |e: redb::DatabaseError| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable(format!(
                "{db_name} is already open in another process (the embedded store serves one instance)"
            )),
            other => StoreError::Unavailable(format!("cannot open {db_name}: {other}")),
        };
        let mut builder = redb::Builder::new();
        builder.set_cache_size(cache);
        // A full repair (redb walking the whole file to rebuild its
        // allocator state) is what quick-repair checkpoints avoid: noted.
        let repaired = Arc::new(std::sync::atomic::AtomicBool::new(false));
        {
            let repaired = Arc::clone(&repaired);
            builder.set_repair_callback(move |_| repaired.store(true, Ordering::Relaxed));
        }
        let db_existed = disk.exists(DATABASE_FILE).map_err(unavailable)?;
        if !db_existed {
            // A new database is made under another name and renamed once
            // whole: a crash while it is made leaves no file redb cannot
            // open under the database's name.
            disk.remove(NEW_DATABASE_FILE).map_err(unavailable)?;
            let db = disk.open_database(&builder, NEW_DATABASE_FILE, &Fence::default()).map_err(opened)?;
            db.close().map_err(opened)?;
            disk.rename(NEW_DATABASE_FILE, DATABASE_FILE).map_err(unavailable)?;
        }
        let journal_existed = disk.exists(JOURNAL_FILE).map_err(unavailable)?;
        let opening = Instant::now();
        let fence = Fence::default();
        let db = disk.open_database(&builder, DATABASE_FILE, &fence).map_err(opened)?;
        let repaired = repaired.load(Ordering::Relaxed);
        if repaired {
            tracing::warn!(
                database = %db_name,
                took_ms = opening.elapsed().as_millis() as u64,
                "the database needed a full repair at open (its last durable commit saved no allocator state)"
            );
        }
        let journal_file = disk.open_file(JOURNAL_FILE).map_err(unavailable)?;
        if !db_existed || !journal_existed {
            // The new files' directory entries, before anything relies on them.
            disk.sync_dir().map_err(unavailable)?;
        }
        let quick_repair = options.quick_repair;
        let mut txn = db.begin_write().map_err(internal)?;
        txn.set_quick_repair(quick_repair);
        txn.open_table(RECORDS).map_err(internal)?;
        txn.open_table(ENTRIES).map_err(internal)?;
        let mut catalog: HashMap<String, Vec<IndexSpec>> = HashMap::new();
        {
            let table = txn.open_table(CATALOG).map_err(internal)?;
            for entry in table.iter().map_err(internal)? {
                let (key, value) = entry.map_err(internal)?;
                let spec: IndexSpec = serde_json::from_slice(value.value()).map_err(internal)?;
                catalog.entry(key.value().0.to_owned()).or_default().push(spec);
            }
        }
        {
            let mut state = txn.open_table(JOURNAL_STATE).map_err(internal)?;
            let layout = state.get(LAYOUT_KEY).map_err(internal)?.map(|v| v.value());
            match layout {
                Some(v) if v > LAYOUT => {
                    return Err(StoreError::Unavailable(format!(
                        "{db_name} has layout version {v}, newer than this release reads ({LAYOUT})"
                    )));
                }
                Some(_) => {}
                None => {
                    state.insert(LAYOUT_KEY, LAYOUT).map_err(internal)?;
                }
            }
        }
        txn.commit().map_err(internal)?;
        let journal = replay(&db, &catalog, journal_file, &disk.describe(JOURNAL_FILE), quick_repair)?;
        let db = Arc::new(db);
        let catalog: Catalog = Arc::new(RwLock::new(catalog));
        let (tx, rx) = mpsc::channel();
        let stats: Arc<WriterStats> = Arc::default();
        let writer = Writer {
            db: Arc::clone(&db),
            catalog: Arc::clone(&catalog),
            stats: Arc::clone(&stats),
            interval: options.sync_interval,
            checkpoint_bytes: options.checkpoint_bytes,
            quick_repair,
            fence,
            unsynced_since: None,
            journal,
            recent: Recent::default(),
            positions: HashMap::new(),
        };
        let thread = std::thread::Builder::new()
            .name("txgate-embedded-writer".into())
            .spawn(move || {
                // A panic leaves no writer behind a store that still reads:
                // the process stops, and the next start recovers.
                if let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.run(&rx))) {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    stop(&StoreError::Internal(format!("the writer thread panicked: {what}")));
                }
            })
            .map_err(internal)?;
        Ok(Self {
            db,
            repaired,
            writer: tx,
            thread: Mutex::new(Some(thread)),
            path: PathBuf::from(db_name),
            catalog,
            reads: Arc::default(),
            stats,
        })
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
        self.reads.decoded.load(Ordering::Relaxed)
    }

    /// What the writer thread has done since the store opened.
    pub fn stats(&self) -> &WriterStats {
        &self.stats
    }

    /// Every entry of index `name` of `coll` as `_id`s in index order (for
    /// tests that compare an index with its records).
    pub async fn index_ids(&self, coll: &str, name: &str) -> StoreResult<Vec<String>> {
        let table_name = entries_name(coll, name);
        let db = Arc::clone(&self.db);
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
        let txn = self.db.begin_read().map_err(internal)?;
        let table = txn.open_table(RECORDS).map_err(internal)?;
        let mut out = std::collections::BTreeMap::new();
        for row in table.iter().map_err(internal)? {
            let (k, v) = row.map_err(internal)?;
            let (coll, id) = k.value();
            out.insert((coll.to_owned(), id.to_owned()), v.value().to_vec());
        }
        Ok(out)
    }

    /// Check, in one snapshot, that every index holds exactly one entry per
    /// record it should hold, under the key that record gives it, and
    /// nothing else. Returns the first difference found.
    pub fn verify_indexes(&self) -> Result<(), String> {
        let txn = self.db.begin_read().map_err(|e| e.to_string())?;
        let records = txn.open_table(RECORDS).map_err(|e| e.to_string())?;
        let entries = txn.open_table(ENTRIES).map_err(|e| e.to_string())?;
        let catalog = self.catalog.read().expect("index catalog").clone();
        let mut expected: std::collections::BTreeSet<(String, Vec<u8>, String)> = std::collections::BTreeSet::new();
        for row in records.iter().map_err(|e| e.to_string())? {
            let (k, v) = row.map_err(|e| e.to_string())?;
            let (coll, id) = k.value();
            let Some(specs) = catalog.get(coll) else { continue };
            let record = super::convert::decode(v.value()).map_err(|e| format!("{coll}/{id}: {e}"))?;
            for spec in specs {
                if let Some(key) = entry_key(spec, &record, id) {
                    expected.insert((entries_name(coll, &spec.name), key, id.to_owned()));
                }
            }
        }
        let mut found = std::collections::BTreeSet::new();
        for row in entries.iter().map_err(|e| e.to_string())? {
            let (k, v) = row.map_err(|e| e.to_string())?;
            let (table, key) = k.value();
            found.insert((table.to_owned(), key.to_vec(), v.value().to_owned()));
        }
        if let Some(missing) = expected.difference(&found).next() {
            return Err(format!("index {:?} lacks the entry of record {}", missing.0, missing.2));
        }
        if let Some(extra) = found.difference(&expected).next() {
            return Err(format!("index {:?} has an entry for record {} that no record gives", extra.0, extra.2));
        }
        Ok(())
    }

    async fn queue(&self, op: WriteOp, durability: Durability) -> StoreResult<bool> {
        self.queue_chain(vec![op], durability).await.map(|applied| applied == 1)
    }

    async fn queue_chain(&self, ops: Vec<WriteOp>, durability: Durability) -> StoreResult<usize> {
        let (reply, rx) = oneshot::channel();
        self.writer
            .send(Queued { ops, durability, reply })
            .map_err(|_| StoreError::Unavailable("embedded writer stopped".into()))?;
        rx.await.map_err(|_| StoreError::Unavailable("embedded writer stopped".into()))?
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction, &Reads) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let db = Arc::clone(&self.db);
        let reads = Arc::clone(&self.reads);
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(internal)?;
            f(&txn, &reads)
        })
        .await
        .map_err(internal)?
    }

    /// A point read (one record, or a few by id), on the calling thread:
    /// redb serves it from its page cache in microseconds, less than
    /// handing it to the blocking pool costs (a page not in the cache is
    /// read from disk on this thread). Scans, which may read many pages,
    /// go to the blocking pool.
    fn read_now<T>(&self, f: impl FnOnce(&redb::ReadTransaction, &Reads) -> StoreResult<T>) -> StoreResult<T> {
        let txn = self.db.begin_read().map_err(internal)?;
        f(&txn, &self.reads)
    }

    /// The committed spec of index `name` of `coll`.
    fn spec(&self, coll: &str, name: &str) -> Option<IndexSpec> {
        let catalog = self.catalog.read().expect("index catalog");
        catalog.get(coll)?.iter().find(|s| s.name == name).cloned()
    }
}

/// Decode a record the store wrote (the writer's own reads).
fn decode(bytes: &[u8]) -> StoreResult<Record> {
    super::convert::decode(bytes).map_err(|e| StoreError::Undecodable(e.0))
}

/// The records reads decoded, and those they could not decode.
#[derive(Debug, Default)]
pub(crate) struct Reads {
    decoded: AtomicU64,
    unreadable: AtomicU64,
}

impl Reads {
    /// The record `coll`/`id` read by id: one that cannot be decoded is an
    /// error naming it.
    fn get(&self, coll: &str, id: &str, bytes: &[u8]) -> StoreResult<Record> {
        self.decoded.fetch_add(1, Ordering::Relaxed);
        super::convert::decode(bytes).map_err(|e| {
            self.unreadable.fetch_add(1, Ordering::Relaxed);
            StoreError::Undecodable(format!("{coll}/{id}: {e}"))
        })
    }

    /// A record met by a scan: one that cannot be decoded is skipped and
    /// reported, so no pass over a collection stops at it.
    fn scanned(&self, coll: &str, id: &str, bytes: &[u8], out: &mut Vec<Record>) {
        match self.get(coll, id, bytes) {
            Ok(record) => out.push(record),
            Err(err) => super::report_unreadable(&err),
        }
    }
}

fn encode(record: &Record) -> StoreResult<Vec<u8>> {
    let mut out = Vec::new();
    record.to_writer(&mut out).map_err(|e| StoreError::Rejected(e.to_string()))?;
    Ok(out)
}

/// The smallest collection name ordered after `coll` and all its keys.
fn after_collection(coll: &str) -> String {
    format!("{coll}\0")
}

/// The entry key of `record` (with `_id` `id`) in index `spec`; none in a
/// sparse index when its first field is null or missing.
fn entry_key(spec: &IndexSpec, record: &Record, id: &str) -> Option<Vec<u8>> {
    if spec.sparse && spec.fields.first().is_some_and(|f| matches!(lookup(record, f), None | Some(Bson::Null))) {
        return None;
    }
    let mut key = keys::encode(spec.fields.iter().map(|f| lookup(record, f)));
    if !spec.unique && spec.fields.last().is_none_or(|f| f != "_id") {
        keys::push(&mut key, Some(&Bson::String(id.to_owned())));
    }
    Some(key)
}

type Entries<'t> = redb::Table<'t, (&'static str, &'static [u8]), &'static str>;

/// The entry keys of `record` in each of `specs`.
fn keys_of(specs: &[IndexSpec], record: &Record, id: &str) -> Vec<Option<Vec<u8>>> {
    specs.iter().map(|spec| entry_key(spec, record, id)).collect()
}

/// The entry changes of non-unique indexes in one batch, kept until the
/// batch's end: per index and record, the key before the batch and the key
/// after its last write. A record changed several times in a batch (locked
/// and released in one chain, a transaction record moved through its
/// statuses) then touches each of its entries once, or not at all. Nothing
/// reads a non-unique index inside a write transaction (scans read
/// committed state), so deferring them changes no answer; unique indexes
/// change at once, since the next write's uniqueness check must see them.
#[derive(Default)]
struct Deferred {
    /// (index table, record id) → (key before the batch, key after it).
    changes: HashMap<(String, String), (EntryKey, EntryKey)>,
}

/// An index entry's key; `None`: the record has no entry in that index.
type EntryKey = Option<Vec<u8>>;

impl Deferred {
    fn change(&mut self, table: String, id: &str, old: Option<Vec<u8>>, new: Option<Vec<u8>>) {
        match self.changes.entry((table, id.to_owned())) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().1 = new,
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert((old, new));
            }
        }
    }

    /// Write the net changes.
    fn flush(self, entries: &mut Entries<'_>) -> StoreResult<()> {
        for ((table, id), (old, new)) in self.changes {
            if old == new {
                continue;
            }
            if let Some(key) = old {
                entries.remove((table.as_str(), key.as_slice())).map_err(internal)?;
            }
            if let Some(key) = new {
                entries.insert((table.as_str(), key.as_slice()), id.as_str()).map_err(internal)?;
            }
        }
        Ok(())
    }
}

/// Keep the entries of every index of `coll` equal to the record `id`
/// becoming `new` (from the record whose keys are `old`). Unique indexes are checked before anything
/// is changed, so a refused write leaves no trace. With `deferred`, the
/// entries of non-unique indexes change at the end of the batch.
fn reindex(
    entries: &mut Entries<'_>,
    specs: &[IndexSpec],
    coll: &str,
    id: &str,
    old: Option<Vec<Option<Vec<u8>>>>,
    new: Option<&Record>,
    mut deferred: Option<&mut Deferred>,
) -> StoreResult<()> {
    let mut changes = Vec::new();
    let mut old = old.map(Vec::into_iter);
    for spec in specs {
        let old_key = old.as_mut().and_then(Iterator::next).flatten();
        let new_key = new.and_then(|r| entry_key(spec, r, id));
        if old_key == new_key {
            continue;
        }
        let table = entries_name(coll, &spec.name);
        if let (Some(key), true) = (&new_key, spec.unique) {
            if let Some(holder) = entries.get((table.as_str(), key.as_slice())).map_err(internal)? {
                if holder.value() != id {
                    return Err(StoreError::Duplicate(format!("{coll}.{}", spec.name)));
                }
            }
        }
        changes.push((table, spec.unique, old_key, new_key));
    }
    for (table, unique, old_key, new_key) in changes {
        if let (false, Some(deferred)) = (unique, deferred.as_deref_mut()) {
            deferred.change(table, id, old_key, new_key);
            continue;
        }
        if let Some(key) = old_key {
            entries.remove((table.as_str(), key.as_slice())).map_err(internal)?;
        }
        if let Some(key) = new_key {
            entries.insert((table.as_str(), key.as_slice()), id).map_err(internal)?;
        }
    }
    Ok(())
}

impl WriterStats {
    /// Nanoseconds from `since` to `now`.
    fn nanos(since: Instant, now: Instant) -> u64 {
        u64::try_from((now - since).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Add the time since `since` to `counter`; returns now.
    fn add(counter: &AtomicU64, since: Instant) -> Instant {
        let now = Instant::now();
        counter.fetch_add(Self::nanos(since, now), Ordering::Relaxed);
        now
    }

    /// Busy time of a batch that started at `started` (and synced).
    fn count(&self, started: Instant, synced: bool) {
        let nanos = Self::nanos(started, Instant::now());
        self.busy_nanos.fetch_add(nanos, Ordering::Relaxed);
        if synced {
            self.synced_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
    }
}

/// The writer thread's state.
struct Writer {
    db: Arc<Database>,
    catalog: Catalog,
    stats: Arc<WriterStats>,
    interval: Duration,
    checkpoint_bytes: u64,
    quick_repair: bool,
    /// Raised after the last checkpoint: redb's own close writes nothing.
    fence: Fence,
    /// When the oldest journal entry not yet synced was written.
    unsynced_since: Option<Instant>,
    journal: Journal,
    recent: Recent,
    /// The next position of each log collection appended to (see
    /// [`Write::Append`]), learned from its last record on first use.
    positions: HashMap<String, u64>,
}

impl Writer {
    fn run(mut self, rx: &mpsc::Receiver<Queued>) {
        let mut held: Option<Queued> = None;
        loop {
            let first = match held.take() {
                Some(item) => item,
                None => match self.next(rx) {
                    Some(item) => item,
                    None => {
                        // Every handle is gone: the store closes durable.
                        self.checkpoint_or_stop();
                        self.fence.raise();
                        return;
                    }
                },
            };
            if first.is_schema() {
                // Schema changes commit on their own, durable, after
                // everything before them is; the journal never spans one.
                let op = first.ops.into_iter().next().expect("a schema change");
                match op {
                    WriteOp::Snapshot(reply) => {
                        self.sync_or_stop();
                        let _ = reply.send(self.db.begin_read().map_err(internal));
                        let _ = first.reply.send(Ok(1));
                    }
                    WriteOp::Close => {
                        self.checkpoint_or_stop();
                        // The file stays as a crash right after this
                        // checkpoint would leave it (see `disk::Fence`).
                        self.fence.raise();
                        let _ = first.reply.send(Ok(1));
                        return;
                    }
                    op => {
                        self.checkpoint_or_stop();
                        let done = schema_change(&self.db, &self.catalog, op, self.quick_repair);
                        let _ = first.reply.send(done.map(usize::from));
                    }
                }
                continue;
            }
            self.commit(first, rx, &mut held);
            // The sync interval is a deadline, kept under continuous load
            // too, not only when the queue runs dry.
            if self.unsynced_since.is_some_and(|since| since.elapsed() >= self.interval) {
                self.sync_or_stop();
            }
        }
    }

    /// The next queued write; with unsynced commits outstanding, a sync
    /// once the interval since the oldest has passed. `None` once every
    /// handle to the store is gone.
    fn next(&mut self, rx: &mpsc::Receiver<Queued>) -> Option<Queued> {
        loop {
            let Some(since) = self.unsynced_since else { return rx.recv().ok() };
            let left = self.interval.saturating_sub(since.elapsed());
            match rx.recv_timeout(left) {
                Ok(item) => return Some(item),
                Err(mpsc::RecvTimeoutError::Timeout) => self.sync_or_stop(),
                Err(mpsc::RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Commit a batch: `first` and whatever else is queued, up to
    /// [`MAX_BATCH`] items or [`MAX_BATCH_BYTES`] of effects. Its effects go
    /// to the journal (in entries of about [`journal::ENTRY_TARGET`], split
    /// between writes) before the commit is visible, and the journal is
    /// synced first when the batch holds a write that must be durable. An
    /// item that must commit on its own is left in `held`.
    fn commit(&mut self, first: Queued, rx: &mpsc::Receiver<Queued>, held: &mut Option<Queued>) {
        let started = Instant::now();
        let mut batch = vec![first];
        let mut results = Vec::with_capacity(1);
        let mut entries = vec![Effects::default()];
        let prepared = (|| -> StoreResult<redb::WriteTransaction> {
            let mut txn = self.db.begin_write().map_err(internal)?;
            txn.set_durability(redb::Durability::None).map_err(internal)?;
            {
                let specs = self.catalog.read().expect("index catalog");
                let mut table = txn.open_table(RECORDS).map_err(internal)?;
                let mut index = txn.open_table(ENTRIES).map_err(internal)?;
                let mut deferred = Deferred::default();
                let mut bytes = 0usize;
                let mut next = 0;
                while next < batch.len() {
                    let queued = &batch[next];
                    let mut applied = 0;
                    let mut result = Ok(());
                    for op in &queued.ops {
                        let mut state = Applying {
                            recent: &mut self.recent,
                            positions: &mut self.positions,
                            deferred: &mut deferred,
                        };
                        let effects = entries.last_mut().expect("an entry");
                        let before = effects.len();
                        let outcome = apply(&mut table, &mut index, &specs, &mut state, op, effects);
                        bytes += effects.len() - before;
                        if effects.len() >= journal::ENTRY_TARGET {
                            entries.push(Effects::default());
                        }
                        match outcome {
                            Ok(true) => applied += 1,
                            Ok(false) => break,
                            Err(err) => {
                                result = Err(err);
                                break;
                            }
                        }
                    }
                    results.push(result.map(|()| applied));
                    next += 1;
                    if next == batch.len() && batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                        match rx.try_recv() {
                            Ok(item) if item.is_schema() => *held = Some(item),
                            Ok(item) => batch.push(item),
                            Err(_) => {}
                        }
                    }
                }
                deferred.flush(&mut index)?;
            }
            let written = entries.iter().filter(|e| !e.is_empty()).count() as u64;
            if written > 0 {
                let mut state = txn.open_table(JOURNAL_STATE).map_err(internal)?;
                state.insert(APPLIED, self.journal.next_lsn() + written - 1).map_err(internal)?;
            }
            Ok(txn)
        })();
        let mut phase = WriterStats::add(&self.stats.apply_nanos, started);
        let writes: usize = batch.iter().map(|q| q.ops.len()).sum();
        self.stats.writes.fetch_add(writes as u64, Ordering::Relaxed);
        let durable = batch.iter().any(|q| q.durability == Durability::Synced);
        let txn = match prepared {
            Ok(txn) => txn,
            Err(err) => {
                // Nothing was written: the batch is refused as a whole.
                self.recent.clear();
                self.positions.clear();
                tracing::error!(error = %err, "embedded store commit failed; batch not applied");
                for queued in batch {
                    let _ = queued.reply.send(Err(StoreError::Unavailable(err.to_string())));
                }
                return;
            }
        };
        let txn = if entries.iter().all(Effects::is_empty) {
            // Only refusals and syncs: nothing to commit.
            if let Err(err) = txn.abort() {
                tracing::warn!(error = %err, "aborting an empty embedded write transaction failed");
            }
            None
        } else {
            let mut bytes = 0;
            for effects in entries.iter_mut().filter(|e| !e.is_empty()) {
                bytes += effects.len() as u64;
                if let Err(err) = self.journal.append(effects) {
                    stop(&StoreError::Unavailable(format!("journal write failed: {err}")));
                }
                self.stats.entries.fetch_add(1, Ordering::Relaxed);
            }
            self.stats.max_batch_bytes.fetch_max(bytes, Ordering::Relaxed);
            drop(entries);
            phase = WriterStats::add(&self.stats.journal_nanos, phase);
            if self.unsynced_since.is_none() {
                self.unsynced_since = Some(Instant::now());
                self.stats.unsynced.store(true, Ordering::SeqCst);
            }
            Some(txn)
        };
        let synced = durable && self.journal.is_unsynced();
        if durable {
            self.sync_or_stop();
            phase = WriterStats::add(&self.stats.sync_nanos, phase);
        }
        if let Some(txn) = txn {
            if let Err(err) = txn.commit() {
                // The journal holds the batch: opening the store again
                // applies it.
                stop(&StoreError::Unavailable(format!("commit failed: {err}")));
            }
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
            WriterStats::add(&self.stats.commit_nanos, phase);
        }
        self.stats.count(started, synced);
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.max_batch_nanos.fetch_max(took, Ordering::Relaxed);
        self.stats.recent_records.store(self.recent.records.len() as u64, Ordering::Relaxed);
        self.stats.recent_bytes.store(self.recent.bytes as u64, Ordering::Relaxed);
        for (queued, result) in batch.into_iter().zip(results) {
            let _ = queued.reply.send(result);
        }
        if self.journal.written() >= self.checkpoint_bytes {
            self.checkpoint_or_stop();
        }
    }

    /// Make every journal entry durable, or stop the process.
    fn sync_or_stop(&mut self) {
        if self.unsynced_since.is_none() {
            return;
        }
        if let Err(err) = self.journal.sync() {
            stop(&StoreError::Unavailable(format!("journal sync failed: {err}")));
        }
        if let Some(since) = self.unsynced_since {
            let waited = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.stats.max_unsynced_nanos.fetch_max(waited, Ordering::Relaxed);
        }
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        self.unsynced_since = None;
        self.stats.unsynced.store(false, Ordering::SeqCst);
    }

    /// Make redb durable with every commit so far, and start the journal
    /// over; or stop the process.
    fn checkpoint_or_stop(&mut self) {
        if self.journal.written() == 0 {
            return;
        }
        let started = Instant::now();
        let done = (|| -> StoreResult<()> {
            let mut txn = self.db.begin_write().map_err(internal)?;
            txn.set_durability(redb::Durability::Immediate).map_err(internal)?;
            // The allocator state is saved with the commit, so opening
            // after a crash needs no full repair of the file.
            txn.set_quick_repair(self.quick_repair);
            txn.commit().map_err(internal)
        })();
        if let Err(err) = done {
            stop(&err);
        }
        if let Err(err) = self.journal.restart(self.journal.next_lsn()) {
            stop(&StoreError::Unavailable(format!("journal restart failed: {err}")));
        }
        self.unsynced_since = None;
        self.stats.unsynced.store(false, Ordering::SeqCst);
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        WriterStats::add(&self.stats.checkpoint_nanos, started);
        self.stats.count(started, true);
    }
}

/// Apply the journal entries in `file` that the state in `db` does not
/// hold yet, make them durable in redb, and hand back the journal, started
/// over in a new generation.
fn replay(
    db: &Database,
    catalog: &HashMap<String, Vec<IndexSpec>>,
    file: Box<dyn redb::StorageBackend>,
    name: &str,
    quick_repair: bool,
) -> StoreResult<Journal> {
    let unavailable = |e: &dyn std::fmt::Display| StoreError::Unavailable(format!("journal {name}: {e}"));
    let (mut journal, read) = Journal::open(file).map_err(|e| unavailable(&e))?;
    if read.dropped > 0 {
        tracing::warn!(
            journal = name,
            entries = read.dropped,
            "dropped journal entries written after one that was lost, none of them synced (power loss)"
        );
    }
    let applied = {
        let txn = db.begin_read().map_err(internal)?;
        let state = txn.open_table(JOURNAL_STATE).map_err(internal)?;
        state.get(APPLIED).map_err(internal)?.map_or(0, |v| v.value())
    };
    let missing: Vec<_> = read.entries.into_iter().filter(|(lsn, _)| *lsn > applied).collect();
    let Some(&(first, _)) = missing.first() else {
        // The usual start after a clean stop (the last checkpoint applied
        // every entry); said, so an operator can tell it from a recovery.
        tracing::info!(journal = name, applied, "journal: nothing to replay");
        journal.restart(applied + 1).map_err(|e| unavailable(&e))?;
        return Ok(journal);
    };
    if first != applied + 1 {
        return Err(StoreError::Unavailable(format!(
            "journal {name} starts at entry {first}, but the store holds entries up to {applied} only"
        )));
    }
    let last = missing.last().map_or(applied, |(lsn, _)| *lsn);
    let mut txn = db.begin_write().map_err(internal)?;
    txn.set_quick_repair(quick_repair);
    {
        let mut table = txn.open_table(RECORDS).map_err(internal)?;
        let mut entries = txn.open_table(ENTRIES).map_err(internal)?;
        let specs = |coll: &str| catalog.get(coll).map_or(&[][..], Vec::as_slice);
        for (_, payload) in &missing {
            for effect in journal::effects(payload).map_err(|e| unavailable(&e))? {
                let (coll, id, bytes) = match effect {
                    Effect::Put { coll, id, bytes } => (coll, id, Some(bytes)),
                    Effect::Delete { coll, id } => (coll, id, None),
                };
                // A record that cannot be decoded (written below the API)
                // is replayed as it is, without index entries: the store
                // opens, and reads report it.
                let decoded = |bytes: &[u8]| {
                    super::convert::decode(bytes)
                        .map_err(|e| super::report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}"))))
                        .ok()
                };
                let old = match table.get((coll, id)).map_err(internal)? {
                    Some(v) => decoded(v.value()).map(|r| keys_of(specs(coll), &r, id)),
                    None => None,
                };
                let new = bytes.and_then(decoded);
                reindex(&mut entries, specs(coll), coll, id, old, new.as_ref(), None)?;
                match bytes {
                    Some(bytes) => table.insert((coll, id), bytes).map_err(internal)?,
                    None => table.remove((coll, id)).map_err(internal)?,
                };
            }
        }
        let mut state = txn.open_table(JOURNAL_STATE).map_err(internal)?;
        state.insert(APPLIED, last).map_err(internal)?;
    }
    txn.commit().map_err(|e| StoreError::Unavailable(format!("commit of the replayed journal failed: {e}")))?;
    tracing::info!(
        entries = missing.len(),
        up_to = last,
        format = read.version,
        "replayed the embedded store's journal"
    );
    journal.restart(last + 1).map_err(|e| unavailable(&e))?;
    Ok(journal)
}

/// Unsynced commits that cannot be made durable, or a writer that cannot
/// go on: readers may have seen writes that could be lost, so the process
/// stops rather than go on past them (the next start recovers).
fn stop(err: &StoreError) -> ! {
    tracing::error!(error = %err, "embedded store cannot go on; stopping");
    eprintln!("txgate: the embedded store cannot go on ({err}); stopping");
    std::process::exit(70)
}

/// Records copied per write transaction of a backup.
const BACKUP_CHUNK: usize = 20_000;

/// Copy the state `snapshot` reads into a new store in `dest`: written
/// under `dest` with `.partial` appended, synced, then renamed, so a
/// directory named `dest` is always a whole backup.
fn write_backup(snapshot: &redb::ReadTransaction, dest: &Path) -> StoreResult<super::BackupInfo> {
    let started = Instant::now();
    let failed = |what: &str, e: &dyn std::fmt::Display| {
        StoreError::Unavailable(format!("backup to {}: {what}: {e}", dest.display()))
    };
    if dest.exists() {
        return Err(StoreError::Rejected(format!("backup to {}: it exists already", dest.display())));
    }
    let mut partial = dest.as_os_str().to_owned();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    if partial.exists() {
        std::fs::remove_dir_all(&partial).map_err(|e| failed("removing an unfinished backup", &e))?;
    }
    // The directories above it too, their entries synced (the backups'
    // directory is new at the first backup).
    if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
        DirDisk::create(parent).map_err(|e| failed("creating its parent directory", &e))?;
    }
    let disk = DirDisk::create(&partial).map_err(|e| failed("creating the directory", &e))?;
    let written = copy_snapshot(snapshot, &disk, &failed);
    if written.is_err() {
        // Nothing half-written stays behind under a name of its own.
        let _ = std::fs::remove_dir_all(&partial);
    }
    let (records, applied) = written?;
    std::fs::rename(&partial, dest).map_err(|e| failed("renaming the finished backup", &e))?;
    let parent = dest.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(|e| failed("syncing its parent", &e))?;
    let bytes = std::fs::metadata(dest.join(DATABASE_FILE)).map(|m| m.len()).unwrap_or(0);
    tracing::info!(
        path = %dest.display(),
        records,
        bytes,
        journal_position = applied,
        took_ms = started.elapsed().as_millis() as u64,
        "backup written"
    );
    Ok(super::BackupInfo { records, bytes, journal_position: applied })
}

/// Copy every table `snapshot` reads into a new database on `disk`, synced;
/// the records copied and the journal position the snapshot includes.
fn copy_snapshot(
    snapshot: &redb::ReadTransaction,
    disk: &DirDisk,
    failed: &dyn Fn(&str, &dyn std::fmt::Display) -> StoreError,
) -> StoreResult<(u64, u64)> {
    let db = disk
        .open_database(&redb::Builder::new(), DATABASE_FILE, &Fence::default())
        .map_err(|e| failed("creating the database", &e))?;
    let mut records = 0u64;
    let applied = {
        let state = snapshot.open_table(JOURNAL_STATE).map_err(internal)?;
        state.get(APPLIED).map_err(internal)?.map_or(0, |v| v.value())
    };
    // Each table in chunks, each chunk a write transaction of its own: a
    // million records never sit in one transaction's memory.
    fn copy<K: redb::Key + 'static, V: redb::Value + 'static>(
        snapshot: &redb::ReadTransaction,
        db: &Database,
        def: TableDefinition<K, V>,
        mut counted: impl FnMut(usize),
    ) -> StoreResult<()>
    where
        for<'a> K::SelfType<'a>: std::borrow::Borrow<K::SelfType<'a>>,
        for<'a> V::SelfType<'a>: std::borrow::Borrow<V::SelfType<'a>>,
    {
        let source = snapshot.open_table(def).map_err(internal)?;
        let mut rows = source.iter().map_err(internal)?.peekable();
        loop {
            let mut txn = db.begin_write().map_err(internal)?;
            txn.set_durability(redb::Durability::None).map_err(internal)?;
            let mut n = 0;
            {
                let mut table = txn.open_table(def).map_err(internal)?;
                for row in rows.by_ref().take(BACKUP_CHUNK) {
                    let (k, v) = row.map_err(internal)?;
                    table.insert(k.value(), v.value()).map_err(internal)?;
                    n += 1;
                }
            }
            txn.commit().map_err(internal)?;
            counted(n);
            if rows.peek().is_none() {
                return Ok(());
            }
        }
    }
    copy(snapshot, &db, RECORDS, |n| {
        records += n as u64;
        if records % 100_000 < n as u64 {
            tracing::info!(records, "backup: copying records");
        }
    })?;
    copy(snapshot, &db, ENTRIES, |_| {})?;
    copy(snapshot, &db, CATALOG, |_| {})?;
    copy(snapshot, &db, JOURNAL_STATE, |_| {})?;
    let mut txn = db.begin_write().map_err(internal)?;
    txn.set_quick_repair(true);
    txn.commit().map_err(|e| failed("the final commit", &e))?;
    drop(db);
    disk.sync_dir().map_err(|e| failed("syncing the directory", &e))?;
    Ok((records, applied))
}

/// Create or drop an index in a write transaction of its own; the
/// in-memory catalog changes once it is committed.
fn schema_change(db: &Database, catalog: &Catalog, op: WriteOp, quick_repair: bool) -> StoreResult<bool> {
    match op {
        WriteOp::EnsureIndex { coll, spec } => {
            let existing = catalog
                .read()
                .expect("index catalog")
                .get(&coll)
                .and_then(|specs| specs.iter().find(|s| s.name == spec.name).cloned());
            match existing {
                Some(s) if s == spec => return Ok(false),
                Some(s) => {
                    return Err(StoreError::Internal(format!(
                        "index {} of {coll} exists as {s:?}, not {spec:?}",
                        spec.name
                    )));
                }
                None => {}
            }
            let mut txn = db.begin_write().map_err(internal)?;
            txn.set_quick_repair(quick_repair);
            let mut built = 0usize;
            {
                let records = txn.open_table(RECORDS).map_err(internal)?;
                let mut entries = txn.open_table(ENTRIES).map_err(internal)?;
                clear_entries(&mut entries, &entries_name(&coll, &spec.name))?;
                let end = after_collection(&coll);
                for entry in records.range((coll.as_str(), "")..(end.as_str(), "")).map_err(internal)? {
                    let (key, value) = entry.map_err(internal)?;
                    let id = key.value().1;
                    let record = match super::convert::decode(value.value()) {
                        Ok(record) => record,
                        Err(e) => {
                            super::report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}")));
                            continue;
                        }
                    };
                    reindex(&mut entries, std::slice::from_ref(&spec), &coll, id, None, Some(&record), None)?;
                    built += 1;
                    if built % 100_000 == 0 {
                        tracing::info!(collection = %coll, index = %spec.name, records = built, "building index");
                    }
                }
                let mut cat = txn.open_table(CATALOG).map_err(internal)?;
                let json = serde_json::to_vec(&spec).map_err(internal)?;
                cat.insert((coll.as_str(), spec.name.as_str()), json.as_slice()).map_err(internal)?;
            }
            txn.commit().map_err(|e| StoreError::Unavailable(format!("commit failed: {e}")))?;
            if built > 0 {
                tracing::info!(collection = %coll, index = %spec.name, records = built, "index built");
            }
            catalog.write().expect("index catalog").entry(coll).or_default().push(spec);
            Ok(true)
        }
        WriteOp::DropIndex { coll, name } => {
            let mut txn = db.begin_write().map_err(internal)?;
            txn.set_quick_repair(quick_repair);
            {
                let mut entries = txn.open_table(ENTRIES).map_err(internal)?;
                clear_entries(&mut entries, &entries_name(&coll, &name))?;
                let mut cat = txn.open_table(CATALOG).map_err(internal)?;
                cat.remove((coll.as_str(), name.as_str())).map_err(internal)?;
            }
            txn.commit().map_err(|e| StoreError::Unavailable(format!("commit failed: {e}")))?;
            if let Some(specs) = catalog.write().expect("index catalog").get_mut(&coll) {
                specs.retain(|s| s.name != name);
            }
            Ok(true)
        }
        _ => unreachable!("only index changes commit on their own"),
    }
}

fn clear_entries(entries: &mut Entries<'_>, table: &str) -> StoreResult<()> {
    let end = [keys::END];
    entries.retain_in((table, &[][..])..(table, &end[..]), |_, _| false).map_err(internal)
}

/// Apply `op` if its condition holds, adding what it changed to `effects`.
/// What the writer keeps between writes besides the database.
struct Applying<'a> {
    recent: &'a mut Recent,
    positions: &'a mut HashMap<String, u64>,
    deferred: &'a mut Deferred,
}

/// The index of log collection `coll` that keeps positions unique.
fn position_index<'a>(specs: &'a [IndexSpec], coll: &str) -> StoreResult<&'a IndexSpec> {
    specs
        .iter()
        .find(|s| s.unique && s.fields.len() == 1 && s.fields[0] == super::LOG_SEQ)
        .ok_or_else(|| StoreError::Rejected(format!("{coll} is no log: it has no unique index on {}", super::LOG_SEQ)))
}

/// The position after the last record of log collection `coll`.
fn next_position(
    table: &redb::Table<(&str, &str), &[u8]>,
    entries: &Entries<'_>,
    spec: &IndexSpec,
    coll: &str,
) -> StoreResult<u64> {
    let name = entries_name(coll, &spec.name);
    let end = [keys::END];
    let mut range = entries.range((name.as_str(), &[][..])..(name.as_str(), &end[..])).map_err(internal)?;
    let Some(last) = range.next_back() else { return Ok(1) };
    let (_, id) = last.map_err(internal)?;
    let id = id.value().to_owned();
    let record = table
        .get((coll, id.as_str()))
        .map_err(internal)?
        .ok_or_else(|| StoreError::Internal(format!("{coll}: index {} names {id}, which is not there", spec.name)))?;
    let seq = decode(record.value())?.get_i64(super::LOG_SEQ).ok().and_then(|n| u64::try_from(n).ok());
    seq.map(|n| n + 1).ok_or_else(|| StoreError::Internal(format!("{coll}/{id} has no position")))
}

fn apply(
    table: &mut redb::Table<(&str, &str), &[u8]>,
    entries: &mut Entries<'_>,
    catalog: &HashMap<String, Vec<IndexSpec>>,
    state: &mut Applying<'_>,
    op: &WriteOp,
    effects: &mut Effects,
) -> StoreResult<bool> {
    let recent = &mut *state.recent;
    // The current record, taken out of `recent` (put back by the caller
    // unless the write fails).
    let mut current = |coll: &str, id: &str| -> StoreResult<Option<(Record, usize)>> {
        if let Some(held) = recent.take(coll, id) {
            return Ok(Some(held));
        }
        match table.get((coll, id)).map_err(internal)? {
            Some(v) => decode(v.value()).map(|r| Some((r, v.value().len()))),
            None => Ok(None),
        }
    };
    let specs = |coll: &str| catalog.get(coll).map_or(&[][..], Vec::as_slice);
    match op {
        WriteOp::Insert { coll, record } => {
            let id = record.get_str("_id").map_err(|_| StoreError::Rejected("record has no string _id".into()))?;
            if recent.contains(coll, id) || table.get((coll.as_str(), id)).map_err(internal)?.is_some() {
                return Ok(false);
            }
            let bytes = encode(record)?;
            reindex(entries, specs(coll), coll, id, None, Some(record), Some(&mut *state.deferred))?;
            table.insert((coll.as_str(), id), bytes.as_slice()).map_err(internal)?;
            effects.put(coll, id, &bytes);
            recent.put(coll, id, record.clone(), bytes.len());
            Ok(true)
        }
        WriteOp::Replace { coll, id, filter, record } => {
            let Some((existing, size)) = current(coll, id)? else { return Ok(false) };
            if !matches(&existing, filter)? {
                recent.put(coll, id, existing, size);
                return Ok(false);
            }
            let mut record = record.clone();
            record.insert("_id", id.as_str());
            let bytes = encode(&record)?;
            let old = keys_of(specs(coll), &existing, id);
            reindex(entries, specs(coll), coll, id, Some(old), Some(&record), Some(&mut *state.deferred))?;
            table.insert((coll.as_str(), id.as_str()), bytes.as_slice()).map_err(internal)?;
            effects.put(coll, id, &bytes);
            recent.put(coll, id, record, bytes.len());
            Ok(true)
        }
        WriteOp::Update { coll, id, filter, update } => {
            let Some((mut record, size)) = current(coll, id)? else { return Ok(false) };
            if !matches(&record, filter)? {
                recent.put(coll, id, record, size);
                return Ok(false);
            }
            let old = keys_of(specs(coll), &record, id);
            apply_update(&mut record, update)?;
            let bytes = encode(&record)?;
            reindex(entries, specs(coll), coll, id, Some(old), Some(&record), Some(&mut *state.deferred))?;
            table.insert((coll.as_str(), id.as_str()), bytes.as_slice()).map_err(internal)?;
            effects.put(coll, id, &bytes);
            recent.put(coll, id, record, bytes.len());
            Ok(true)
        }
        WriteOp::Delete { coll, id, filter } => {
            let Some((existing, size)) = current(coll, id)? else { return Ok(false) };
            if !matches(&existing, filter)? {
                recent.put(coll, id, existing, size);
                return Ok(false);
            }
            let old = keys_of(specs(coll), &existing, id);
            reindex(entries, specs(coll), coll, id, Some(old), None, Some(&mut *state.deferred))?;
            table.remove((coll.as_str(), id.as_str())).map_err(internal)?;
            effects.delete(coll, id);
            Ok(true)
        }
        WriteOp::Append { coll, record } => {
            let id = record.get_str("_id").map_err(|_| StoreError::Rejected("record has no string _id".into()))?;
            if recent.contains(coll, id) || table.get((coll.as_str(), id)).map_err(internal)?.is_some() {
                return Ok(false);
            }
            let index = position_index(specs(coll), coll)?;
            let mut seq = match state.positions.get(coll) {
                Some(next) => *next,
                None => next_position(table, entries, index, coll)?,
            };
            let taken = format!("{coll}.{}", index.name);
            let mut record = record.clone();
            loop {
                record.insert(super::LOG_SEQ, i64::try_from(seq).map_err(internal)?);
                match reindex(entries, specs(coll), coll, id, None, Some(&record), Some(&mut *state.deferred)) {
                    // A reader closed this position (a void entry).
                    Err(StoreError::Duplicate(which)) if which == taken => seq += 1,
                    other => break other?,
                }
            }
            let bytes = encode(&record)?;
            table.insert((coll.as_str(), id), bytes.as_slice()).map_err(internal)?;
            effects.put(coll, id, &bytes);
            state.positions.insert(coll.clone(), seq + 1);
            Ok(true)
        }
        // Syncing the journal with the batch is all a sync asks.
        WriteOp::Sync => Ok(true),
        WriteOp::EnsureIndex { .. } | WriteOp::DropIndex { .. } | WriteOp::Snapshot(_) | WriteOp::Close => {
            unreachable!("index changes commit on their own")
        }
    }
}

/// The byte range of index entries a scan reads: its equality prefix, then
/// the bounds on the order field, each bracketed by its type.
fn entry_range(prefix: &[u8], lower: &Bound<Bson>, upper: &Bound<Bson>) -> (Vec<u8>, Vec<u8>) {
    let with = |v: &Bson, tail: Option<u8>| {
        let mut k = prefix.to_vec();
        keys::push(&mut k, Some(v));
        k.extend(tail);
        k
    };
    let bracket = |b: &Bound<Bson>| match b {
        Bound::Included(v) | Bound::Excluded(v) => Some(keys::tag(Some(v))),
        Bound::Unbounded => None,
    };
    let start = match lower {
        Bound::Included(v) => with(v, None),
        Bound::Excluded(v) => with(v, Some(keys::END)),
        Bound::Unbounded => {
            let mut k = prefix.to_vec();
            k.extend(bracket(upper));
            k
        }
    };
    let end = match upper {
        Bound::Included(v) => with(v, Some(keys::END)),
        Bound::Excluded(v) => with(v, None),
        Bound::Unbounded => {
            let mut k = prefix.to_vec();
            k.push(bracket(lower).map_or(keys::END, |t| t + 1));
            k
        }
    };
    (start, end)
}

fn id_bound(b: &Bound<Bson>, after: bool) -> Bound<String> {
    match b {
        Bound::Included(Bson::String(s)) => Bound::Included(s.clone()),
        Bound::Excluded(Bson::String(s)) if after => Bound::Included(format!("{s}\0")),
        Bound::Excluded(Bson::String(s)) => Bound::Excluded(s.clone()),
        _ => Bound::Unbounded,
    }
}

/// Whether `scan` can only match records whose first index field is set
/// (what a sparse index holds).
fn excludes_null(scan: &Scan) -> bool {
    let not_null = |b: &Bound<Bson>| matches!(b, Bound::Included(v) | Bound::Excluded(v) if *v != Bson::Null);
    match scan.eq().first() {
        Some((_, v)) => *v != Bson::Null,
        None => {
            let (lower, upper) = scan.bounds();
            not_null(lower) || not_null(upper)
        }
    }
}

/// Hand the first `scan.max()` entries of `range` after the first
/// `scan.skipped()`, in the scan's order, to `f`: the skip and the limit
/// are applied while reading, so a skipped entry is never handed on.
fn in_order<T>(
    range: impl DoubleEndedIterator<Item = Result<T, redb::StorageError>>,
    scan: &Scan,
    mut f: impl FnMut(T) -> StoreResult<()>,
) -> StoreResult<()> {
    let mut entries: Box<dyn Iterator<Item = _>> =
        if scan.order() == Order::Desc { Box::new(range.rev()) } else { Box::new(range) };
    for _ in 0..scan.skipped() {
        match entries.next() {
            Some(entry) => drop(entry.map_err(internal)?),
            None => return Ok(()),
        }
    }
    for entry in entries.take(scan.max()) {
        f(entry.map_err(internal)?)?;
    }
    Ok(())
}

/// The records of a scan along the primary index.
fn scan_primary(
    table: &redb::ReadOnlyTable<(&'static str, &'static str), &'static [u8]>,
    coll: &str,
    scan: &Scan,
    reads: &Reads,
) -> StoreResult<Vec<Record>> {
    let (lower, upper) = scan.bounds();
    let end = after_collection(coll);
    let lo = id_bound(lower, true);
    let hi = id_bound(upper, false);
    let start = match &lo {
        Bound::Included(s) => Bound::Included((coll, s.as_str())),
        Bound::Excluded(s) => Bound::Excluded((coll, s.as_str())),
        Bound::Unbounded => Bound::Included((coll, "")),
    };
    let stop = match &hi {
        Bound::Included(s) => Bound::Included((coll, s.as_str())),
        Bound::Excluded(s) => Bound::Excluded((coll, s.as_str())),
        Bound::Unbounded => Bound::Excluded((end.as_str(), "")),
    };
    let range = table.range::<(&str, &str)>((start, stop)).map_err(internal)?;
    let mut out = Vec::new();
    in_order(range, scan, |(key, value)| {
        reads.scanned(coll, key.value().1, value.value(), &mut out);
        Ok(())
    })?;
    Ok(out)
}

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn ping(&self) -> StoreResult<()> {
        self.read(|_, _| Ok(())).await
    }

    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>> {
        self.read_now(|txn, reads| {
            let table = txn.open_table(RECORDS).map_err(internal)?;
            match table.get((coll, id)).map_err(internal)? {
                Some(v) => reads.get(coll, id, v.value()).map(Some),
                None => Ok(None),
            }
        })
    }

    async fn get_many(&self, coll: &str, ids: &[String]) -> StoreResult<Vec<Record>> {
        self.read_now(|txn, reads| {
            let table = txn.open_table(RECORDS).map_err(internal)?;
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                if let Some(v) = table.get((coll, id.as_str())).map_err(internal)? {
                    reads.scanned(coll, id, v.value(), &mut out);
                }
            }
            Ok(out)
        })
    }

    async fn write(&self, coll: &str, write: Write<'_>, durability: Durability) -> StoreResult<bool> {
        self.queue(WriteOp::of(coll, write), durability).await
    }

    fn chains_cheaply(&self) -> bool {
        true
    }
    fn syncs(&self) -> Option<u64> {
        Some(self.stats().syncs.load(Ordering::Relaxed))
    }
    fn unreadable(&self) -> u64 {
        self.reads.unreadable.load(Ordering::Relaxed)
    }

    /// One queued chain: one group commit for all of it.
    async fn write_in_order(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<usize> {
        if writes.is_empty() {
            return Ok(0);
        }
        let ops = writes.into_iter().map(|(coll, write)| WriteOp::of(coll, write)).collect();
        self.queue_chain(ops, durability).await
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

    async fn scan(&self, coll: &str, scan: Scan) -> StoreResult<Vec<Record>> {
        let coll = coll.to_owned();
        // The catalog is read before the snapshot: an index it names was
        // committed before the snapshot begins.
        let spec = if scan.index() == super::scans::PRIMARY { None } else { Some(self.spec(&coll, scan.index())) };
        self.read(move |txn, reads| {
            let records = txn.open_table(RECORDS).map_err(internal)?;
            let Some(spec) = spec else { return scan_primary(&records, &coll, &scan, reads) };
            let Some(spec) = spec else {
                // A collection without records has no indexes yet.
                let end = after_collection(&coll);
                let mut any = records.range((coll.as_str(), "")..(end.as_str(), "")).map_err(internal)?;
                return match any.next() {
                    None => Ok(Vec::new()),
                    Some(_) => Err(StoreError::Internal(format!("{coll} has no index {}", scan.index()))),
                };
            };
            let eq: Vec<&str> = scan.eq().iter().map(|(f, _)| *f).collect();
            if spec.sparse && !excludes_null(&scan) {
                return Err(StoreError::Internal(format!(
                    "sparse index {} of {coll} cannot answer a scan that may match null",
                    spec.name
                )));
            }
            let n = eq.len();
            let by_ok = spec.fields.get(n).map_or(scan.by() == "_id", |f| f == scan.by());
            if spec.fields.len() < n || spec.fields[..n] != eq[..] || !by_ok {
                return Err(StoreError::Internal(format!(
                    "index {} of {coll} ({:?}) does not serve equality on {eq:?} ordered by {}",
                    spec.name,
                    spec.fields,
                    scan.by()
                )));
            }
            let prefix = keys::encode(scan.eq().iter().map(|(_, v)| Some(v)));
            let (lower, upper) = scan.bounds();
            let (start, end) = entry_range(&prefix, lower, upper);
            if start >= end {
                return Ok(Vec::new());
            }
            let name = entries_name(&coll, &spec.name);
            let entries = txn.open_table(ENTRIES).map_err(internal)?;
            let range =
                entries.range((name.as_str(), start.as_slice())..(name.as_str(), end.as_slice())).map_err(internal)?;
            let mut out = Vec::new();
            in_order(range, &scan, |(_, id)| {
                let value = records.get((coll.as_str(), id.value())).map_err(internal)?.ok_or_else(|| {
                    StoreError::Internal(format!("index {name:?} names a missing record {}", id.value()))
                })?;
                reads.scanned(&coll, id.value(), value.value(), &mut out);
                Ok(())
            })?;
            Ok(out)
        })
        .await
    }

    async fn collections(&self) -> StoreResult<Vec<String>> {
        self.read(|txn, _| {
            let table = txn.open_table(RECORDS).map_err(internal)?;
            let mut names = Vec::new();
            let mut from = String::new();
            loop {
                let mut range = table.range((from.as_str(), "")..).map_err(internal)?;
                let Some(entry) = range.next() else { break };
                let (key, _) = entry.map_err(internal)?;
                let name = key.value().0.to_owned();
                from = after_collection(&name);
                names.push(name);
            }
            Ok(names)
        })
        .await
    }

    async fn ensure_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        if self.spec(coll, &index.name).as_ref() == Some(&index) {
            return Ok(());
        }
        self.queue(WriteOp::EnsureIndex { coll: coll.to_owned(), spec: index }, Durability::Synced).await.map(|_| ())
    }

    async fn indexes(&self, coll: &str) -> StoreResult<Vec<IndexSpec>> {
        Ok(self.catalog.read().expect("index catalog").get(coll).cloned().unwrap_or_default())
    }

    async fn drop_index(&self, coll: &str, name: &str) -> StoreResult<()> {
        if self.spec(coll, name).is_none() {
            return Ok(());
        }
        self.queue(WriteOp::DropIndex { coll: coll.to_owned(), name: name.to_owned() }, Durability::Synced)
            .await
            .map(|_| ())
    }
}
