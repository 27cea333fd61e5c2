//! Opening the store: the database and its tables, the journal's missing
//! entries replayed into it, and the writer thread started.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use redb::{Database, ReadableDatabase, ReadableTable};

use super::apply::Recent;
use super::index::{Entries, keys_of, reindex};
use super::journal::{self, Effect, Journal};
use super::lead::Lead;
use super::reader::Reader;
use super::writer::{Writer, WriterStats};
use super::{
    APPLIED, CATALOG, COUNTS, Catalog, DATABASE_FILE, ENTRIES, EmbeddedStore, JOURNAL_FILE, JOURNAL_STATE, LAYOUT,
    LAYOUT_KEY, NEW_DATABASE_FILE, Options, RECORDS, internal,
};
use crate::disk::{Disk, Fence};
use crate::{IndexSpec, StoreError, StoreResult, convert, report_unreadable};

impl EmbeddedStore {
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
            // open under the database's name. It is made durable by a
            // commit and left as a crash would leave it, never closed by
            // redb (see `disk::Fence`).
            disk.remove(NEW_DATABASE_FILE).map_err(unavailable)?;
            let made = Fence::default();
            let db = disk.open_database(&builder, NEW_DATABASE_FILE, &made).map_err(opened)?;
            let mut txn = db.begin_write().map_err(internal)?;
            txn.set_quick_repair(options.quick_repair);
            txn.commit().map_err(internal)?;
            made.raise();
            drop(db);
            disk.rename(NEW_DATABASE_FILE, DATABASE_FILE).map_err(unavailable)?;
        }
        let journal_existed = disk.exists(JOURNAL_FILE).map_err(unavailable)?;
        let opening = Instant::now();
        let fence = Fence::default();
        let db = disk.open_database(&builder, DATABASE_FILE, &fence).map_err(opened)?;
        // An open that fails from here on leaves the file as its last
        // commit left it: redb's close writes nothing (declared after
        // `db`, so dropped, and raised, before it).
        let mut refused = RaiseOnDrop(Some(fence.clone()));
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
        // The journal is read before anything is written: a damaged one
        // refuses to open with the database as it was.
        let journal_name = disk.describe(JOURNAL_FILE);
        let applied = applied(&db)?;
        let opened_journal = Journal::open(journal_file, applied)
            .map_err(|e| StoreError::Unavailable(format!("journal {journal_name}: {e}")))?;
        let quick_repair = options.quick_repair;
        let mut txn = db.begin_write().map_err(internal)?;
        txn.set_quick_repair(quick_repair);
        txn.open_table(RECORDS).map_err(internal)?;
        txn.open_table(ENTRIES).map_err(internal)?;
        txn.open_table(COUNTS).map_err(internal)?;
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
                Some(LAYOUT) => {}
                // Layout 1 (recorded, or a store from before versions were):
                // it has no counted index, so the new count table is exact
                // empty; layouts 1 and 2: the entries of the few integers
                // they encoded otherwise are encoded again (see [`LAYOUT`]).
                older => {
                    let started = Instant::now();
                    let renumbered = if db_existed { super::index::renumber(&txn, &catalog)? } else { 0 };
                    state.insert(LAYOUT_KEY, LAYOUT).map_err(internal)?;
                    if older.is_some() || renumbered > 0 {
                        tracing::info!(
                            database = %db_name,
                            from = older.unwrap_or(1),
                            to = LAYOUT,
                            renumbered,
                            took_ms = started.elapsed().as_millis() as u64,
                            "store layout upgraded"
                        );
                    }
                }
            }
        }
        txn.commit().map_err(internal)?;
        let journal = replay(&db, &catalog, opened_journal, applied, &journal_name, quick_repair)?;
        // Opened: the writer raises the fence after its last checkpoint.
        refused.0 = None;
        let db = Arc::new(db);
        let catalog: Catalog = Arc::new(RwLock::new(catalog));
        let stats: Arc<WriterStats> = Arc::default();
        let writer = Writer {
            db: Arc::clone(&db),
            catalog: Arc::clone(&catalog),
            stats: Arc::clone(&stats),
            interval: options.sync_interval,
            seal_delay: options.seal_delay,
            on_answer: options.on_answer.clone(),
            checkpoint_bytes: options.checkpoint_bytes,
            checkpoint_interval: options.checkpoint_interval,
            uncheckpointed_since: None,
            quick_repair,
            fence: fence.clone(),
            unsynced_since: None,
            synced_at: None,
            journal,
            recent: Recent::default(),
            positions: HashMap::new(),
            // Unknown: the first snapshot writes it down.
            applied_noted: u64::MAX,
        };
        let lead = Lead::new(writer);
        let background = Arc::clone(&lead);
        let thread = std::thread::Builder::new()
            .name("txgate-embedded-writer".into())
            .spawn(move || super::lead::or_stop(|| background.run()))
            .map_err(internal)?;
        Ok(Self {
            reader: Reader::new(db, catalog),
            repaired,
            lead,
            fence,
            thread: Mutex::new(Some(thread)),
            path: PathBuf::from(db_name),
            stats,
            runs: super::build::Runs::default(),
            run_records: options.run_records.max(1),
            opening: uuid::Uuid::new_v4().to_string(),
        })
    }
}

/// Raises its fence when dropped, unless taken out first.
pub(super) struct RaiseOnDrop(pub(super) Option<Fence>);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        if let Some(fence) = &self.0 {
            fence.raise();
        }
    }
}

/// The last journal entry the database holds (0: none, or a new database).
fn applied(db: &Database) -> StoreResult<u64> {
    let txn = db.begin_read().map_err(internal)?;
    let state = match txn.open_table(JOURNAL_STATE) {
        Ok(state) => state,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(err) => return Err(internal(err)),
    };
    Ok(state.get(APPLIED).map_err(internal)?.map_or(0, |v| v.value()))
}

/// Apply the journal entries read (`read`) that the state in `db` does not
/// hold yet, make them durable in redb, and hand back the journal, started
/// over in a new generation.
fn replay(
    db: &Database,
    catalog: &HashMap<String, Vec<IndexSpec>>,
    (mut journal, read): (Journal, journal::Read),
    applied: u64,
    name: &str,
    quick_repair: bool,
) -> StoreResult<Journal> {
    let unavailable = |e: &dyn std::fmt::Display| StoreError::Unavailable(format!("journal {name}: {e}"));
    if read.version == 0 && read.header_lost {
        tracing::warn!(
            journal = name,
            applied,
            "the journal's header was unreadable, and nothing in it records a synced entry past the database's: a \
             generation's start cut short by power loss; nothing acknowledged is lost, and a new generation starts"
        );
    }
    if read.dropped > 0 {
        tracing::warn!(
            journal = name,
            entries = read.dropped,
            "dropped journal entries written after one that was lost, none of them synced (power loss)"
        );
    }
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
        let mut entries = Entries::open(&txn)?;
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
                    convert::decode(bytes)
                        .map_err(|e| report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}"))))
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
        entries.finish()?;
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

/// `txgate journal truncate`: cut the journal of the store on `disk` at
/// `offset` (see [`journal::truncate_on`]), or, with `dry_run`, say what
/// the cut would keep and drop. Refused when the database is missing (an
/// empty one beside the journal would drop every record the journal does
/// not hold) or open in another process. The database is opened only to
/// learn that, behind a fence raised before it opens and with any repair
/// refused: nothing reaches its file. Its lock is then held until the
/// process ends, so no gateway starts while the journal is cut, except
/// for a database that needs a full repair (an earlier release's, or one
/// left without quick-repair state): redb lets go of its lock when the
/// repair is refused, so that check is made once, before the cut (a
/// gateway started during the cut reads the journal either refused or
/// cut). A dry run opens neither file for writing.
pub fn truncate_journal(disk: &dyn Disk, offset: u64, dry_run: bool) -> Result<journal::Truncation, String> {
    let journal_name = disk.describe(JOURNAL_FILE);
    let db_name = disk.describe(DATABASE_FILE);
    if !disk.exists(JOURNAL_FILE).map_err(|e| format!("{journal_name}: {e}"))? {
        return Err(format!("{journal_name} does not exist"));
    }
    if !disk.exists(DATABASE_FILE).map_err(|e| format!("{db_name}: {e}"))? {
        return Err(format!(
            "{db_name} does not exist: not the data directory of an embedded store, or its database is lost (restore a \
             backup)"
        ));
    }
    if !dry_run {
        let fence = Fence::default();
        fence.raise();
        let mut builder = redb::Builder::new();
        builder.set_repair_callback(|session| session.abort());
        match disk.open_database(&builder, DATABASE_FILE, &fence) {
            // Held (never closed by redb, and fenced) until the process
            // ends: the lock keeps a gateway from starting meanwhile.
            Ok(held) => std::mem::forget(held),
            // Free when asked (redb took its lock before the repair check
            // and let it go): a file that needs a repair is repaired by
            // the store's next open, not here.
            Err(redb::DatabaseError::RepairAborted) => {}
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(format!("{db_name} is in use: stop the gateway first"));
            }
            Err(err) => return Err(format!("cannot open {db_name}: {err}")),
        }
    }
    if dry_run {
        // Read only: a dry run works on a read-only copy too.
        let data = disk.read_file(JOURNAL_FILE).map_err(|e| format!("{journal_name}: {e}"))?;
        let copy = redb::backends::InMemoryBackend::new();
        redb::StorageBackend::set_len(&copy, data.len() as u64).map_err(|e| e.to_string())?;
        redb::StorageBackend::write(&copy, 0, &data).map_err(|e| e.to_string())?;
        return journal::truncate_on(&copy, &journal_name, offset, true);
    }
    let file = disk.open_file(JOURNAL_FILE).map_err(|e| format!("{journal_name}: {e}"))?;
    journal::truncate_on(file.as_ref(), &journal_name, offset, false)
}
