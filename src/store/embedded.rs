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
use std::sync::{Arc, RwLock, mpsc};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

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

/// `"applied" -> ` the number of the last journal entry this state holds.
const JOURNAL_STATE: TableDefinition<&str, u64> = TableDefinition::new("journal_state");
const APPLIED: &str = "applied";

/// Upper bound on operations committed together.
const MAX_BATCH: usize = 512;

/// Journal bytes after which a checkpoint makes redb durable and the
/// journal starts over; it bounds what opening the store replays.
const CHECKPOINT_BYTES: u64 = 16 << 20;

/// The indexes of each collection, as committed.
type Catalog = Arc<RwLock<HashMap<String, Vec<IndexSpec>>>>;

/// Records the writer wrote lately, decoded: the next conditional write of
/// one of them (a transaction's record moving on, a locked document rolled
/// forward, a hot document) takes it from here instead of decoding it
/// again. Only the writer thread changes records, and it keeps this equal
/// to what it committed: a write takes its record out and puts the new one
/// back once applied; a write that fails leaves it out; a batch that fails
/// empties it.
#[derive(Default)]
struct Recent {
    records: HashMap<String, Record>,
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

    fn take(&mut self, coll: &str, id: &str) -> Option<Record> {
        self.records.remove(&Self::key(coll, id))
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
        self.records.insert(Self::key(coll, id), record);
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

    fn is_schema(&self) -> bool {
        matches!(self, WriteOp::EnsureIndex { .. } | WriteOp::DropIndex { .. })
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
    writer: mpsc::Sender<Queued>,
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
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Unavailable(format!("cannot create data directory {}: {e}", dir.display())))?;
        let path = dir.join("txgate.redb");
        let cache = usize::try_from(cache_bytes).unwrap_or(usize::MAX);
        let db = redb::Builder::new().set_cache_size(cache).create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable(format!(
                "{} is already open in another process (the embedded store serves one instance)",
                path.display()
            )),
            other => StoreError::Unavailable(format!("cannot open {}: {other}", path.display())),
        })?;
        let txn = db.begin_write().map_err(internal)?;
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
        txn.open_table(JOURNAL_STATE).map_err(internal)?;
        txn.commit().map_err(internal)?;
        let journal = replay(&db, &catalog, &dir.join("txgate.journal"))?;
        let db = Arc::new(db);
        let catalog: Catalog = Arc::new(RwLock::new(catalog));
        let (tx, rx) = mpsc::channel();
        let stats: Arc<WriterStats> = Arc::default();
        let writer = Writer {
            db: Arc::clone(&db),
            catalog: Arc::clone(&catalog),
            stats: Arc::clone(&stats),
            interval: sync_interval,
            unsynced_since: None,
            journal,
            recent: Recent::default(),
            positions: HashMap::new(),
        };
        std::thread::Builder::new()
            .name("txgate-embedded-writer".into())
            .spawn(move || writer.run(&rx))
            .map_err(internal)?;
        Ok(Self { db, writer: tx, path, catalog, reads: Arc::default(), stats })
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
                        return;
                    }
                },
            };
            if first.is_schema() {
                // Schema changes commit on their own, durable, after
                // everything before them is; the journal never spans one.
                self.checkpoint_or_stop();
                let op = first.ops.into_iter().next().expect("a schema change");
                let _ = first.reply.send(schema_change(&self.db, &self.catalog, op).map(usize::from));
                continue;
            }
            let mut batch = vec![first];
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(item) if item.is_schema() => {
                        held = Some(item);
                        break;
                    }
                    Ok(item) => batch.push(item),
                    Err(_) => break,
                }
            }
            self.commit(batch);
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

    /// Commit a batch: its effects go to the journal before the commit is
    /// visible, and the journal is synced first when the batch holds a
    /// write that must be durable.
    fn commit(&mut self, batch: Vec<Queued>) {
        let started = Instant::now();
        let durable = batch.iter().any(|q| q.durability == Durability::Synced);
        let mut results = Vec::with_capacity(batch.len());
        let mut effects = Effects::default();
        let prepared = (|| -> StoreResult<redb::WriteTransaction> {
            let mut txn = self.db.begin_write().map_err(internal)?;
            txn.set_durability(redb::Durability::None).map_err(internal)?;
            {
                let specs = self.catalog.read().expect("index catalog");
                let mut table = txn.open_table(RECORDS).map_err(internal)?;
                let mut entries = txn.open_table(ENTRIES).map_err(internal)?;
                let mut deferred = Deferred::default();
                for queued in &batch {
                    let mut applied = 0;
                    let mut result = Ok(());
                    for op in &queued.ops {
                        let mut state = Applying {
                            recent: &mut self.recent,
                            positions: &mut self.positions,
                            deferred: &mut deferred,
                        };
                        match apply(&mut table, &mut entries, &specs, &mut state, op, &mut effects) {
                            Ok(true) => applied += 1,
                            Ok(false) => break,
                            Err(err) => {
                                result = Err(err);
                                break;
                            }
                        }
                    }
                    results.push(result.map(|()| applied));
                }
                deferred.flush(&mut entries)?;
            }
            if !effects.is_empty() {
                let mut state = txn.open_table(JOURNAL_STATE).map_err(internal)?;
                state.insert(APPLIED, self.journal.next_lsn()).map_err(internal)?;
            }
            Ok(txn)
        })();
        let mut phase = WriterStats::add(&self.stats.apply_nanos, started);
        let writes: usize = batch.iter().map(|q| q.ops.len()).sum();
        self.stats.writes.fetch_add(writes as u64, Ordering::Relaxed);
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
        let txn = if effects.is_empty() {
            // Only refusals and syncs: nothing to commit.
            if let Err(err) = txn.abort() {
                tracing::warn!(error = %err, "aborting an empty embedded write transaction failed");
            }
            None
        } else {
            if let Err(err) = self.journal.append(&effects) {
                stop(&StoreError::Unavailable(format!("journal write failed: {err}")));
            }
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
        for (queued, result) in batch.into_iter().zip(results) {
            let _ = queued.reply.send(result);
        }
        if self.journal.written() >= CHECKPOINT_BYTES {
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
            txn.commit().map_err(internal)
        })();
        if let Err(err) = done {
            stop(&err);
        }
        self.journal.restart(self.journal.next_lsn());
        self.unsynced_since = None;
        self.stats.unsynced.store(false, Ordering::SeqCst);
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        WriterStats::add(&self.stats.checkpoint_nanos, started);
        self.stats.count(started, true);
    }
}

/// Apply the journal entries at `path` that the state in `db` does not
/// hold yet, make them durable in redb, and hand back the journal, started
/// over.
fn replay(db: &Database, catalog: &HashMap<String, Vec<IndexSpec>>, path: &Path) -> StoreResult<Journal> {
    let unavailable = |e: std::io::Error| StoreError::Unavailable(format!("journal {}: {e}", path.display()));
    let (mut journal, entries) = Journal::open(path).map_err(unavailable)?;
    let applied = {
        let txn = db.begin_read().map_err(internal)?;
        let state = txn.open_table(JOURNAL_STATE).map_err(internal)?;
        state.get(APPLIED).map_err(internal)?.map_or(0, |v| v.value())
    };
    let missing: Vec<_> = entries.into_iter().filter(|(lsn, _)| *lsn > applied).collect();
    let Some(&(first, _)) = missing.first() else {
        journal.restart(applied + 1);
        return Ok(journal);
    };
    if first != applied + 1 {
        return Err(StoreError::Unavailable(format!(
            "journal {} starts at entry {first}, but the store holds entries up to {applied} only",
            path.display()
        )));
    }
    let last = missing.last().map_or(applied, |(lsn, _)| *lsn);
    let txn = db.begin_write().map_err(internal)?;
    {
        let mut table = txn.open_table(RECORDS).map_err(internal)?;
        let mut entries = txn.open_table(ENTRIES).map_err(internal)?;
        let specs = |coll: &str| catalog.get(coll).map_or(&[][..], Vec::as_slice);
        for (_, payload) in &missing {
            for effect in journal::effects(payload).map_err(unavailable)? {
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
    tracing::info!(entries = missing.len(), up_to = last, "replayed the embedded store's journal");
    journal.restart(last + 1);
    Ok(journal)
}

/// Unsynced commits that cannot be made durable: readers may have seen
/// them, so the process stops rather than go on past them.
fn stop(err: &StoreError) -> ! {
    tracing::error!(error = %err, "embedded store cannot sync; stopping");
    eprintln!("txgate: the embedded store cannot sync ({err}); stopping");
    std::process::exit(70)
}

/// Create or drop an index in a write transaction of its own; the
/// in-memory catalog changes once it is committed.
fn schema_change(db: &Database, catalog: &Catalog, op: WriteOp) -> StoreResult<bool> {
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
            let txn = db.begin_write().map_err(internal)?;
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
            let txn = db.begin_write().map_err(internal)?;
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
    let mut current = |coll: &str, id: &str| -> StoreResult<Option<Record>> {
        if let Some(record) = recent.take(coll, id) {
            return Ok(Some(record));
        }
        match table.get((coll, id)).map_err(internal)? {
            Some(v) => decode(v.value()).map(Some),
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
            let Some(existing) = current(coll, id)? else { return Ok(false) };
            if !matches(&existing, filter)? {
                recent.put(coll, id, existing, 0);
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
            let Some(mut record) = current(coll, id)? else { return Ok(false) };
            if !matches(&record, filter)? {
                recent.put(coll, id, record, 0);
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
            let Some(existing) = current(coll, id)? else { return Ok(false) };
            if !matches(&existing, filter)? {
                recent.put(coll, id, existing, 0);
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
        WriteOp::EnsureIndex { .. } | WriteOp::DropIndex { .. } => {
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
