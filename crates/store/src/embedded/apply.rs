//! Applying a write, or an index change, to the redb tables.

use std::collections::HashMap;

use redb::{Database, ReadableTable};

use super::index::{Deferred, Entries, entries_name, keys_of, reindex};
use super::journal::Effects;
use super::scan::after_collection;
use super::{CATALOG, Catalog, RECORDS, internal, keys};
use crate::filter::{apply_update, matches};
use crate::{Document, IndexSpec, LOG_SEQ, Record, StoreError, StoreResult, Update, Write, convert, report_unreadable};

/// Records the writer wrote lately, decoded: the next conditional write of
/// one of them (a transaction's record moving on, a locked document rolled
/// forward, a hot document) takes it from here instead of decoding it
/// again. Only the writer thread changes records, and it keeps this equal
/// to what it committed: a write takes its record out and puts the new one
/// back once applied; a write that fails leaves it out; a batch that fails
/// empties it. Every record it holds counts its encoded size against the
/// byte bound, a record put back unchanged included.
#[derive(Default)]
pub(super) struct Recent {
    pub(super) records: HashMap<String, (Record, usize)>,
    pub(super) bytes: usize,
}

impl Recent {
    const MAX_RECORDS: usize = 4096;
    const MAX_BYTES: usize = 32 << 20;
    /// Larger records are not kept.
    const MAX_RECORD: usize = 64 << 10;

    fn key(coll: &str, id: &str) -> String {
        format!("{coll}\0{id}")
    }

    pub(super) fn contains(&self, coll: &str, id: &str) -> bool {
        self.records.contains_key(&Self::key(coll, id))
    }

    fn peek(&self, coll: &str, id: &str) -> Option<&Record> {
        self.records.get(&Self::key(coll, id)).map(|(record, _)| record)
    }

    /// The record and its encoded size.
    pub(super) fn take(&mut self, coll: &str, id: &str) -> Option<(Record, usize)> {
        let (record, size) = self.records.remove(&Self::key(coll, id))?;
        self.bytes -= size;
        Some((record, size))
    }

    /// Keep `record` (encoded in `size` bytes) as the current `coll`/`id`.
    pub(super) fn put(&mut self, coll: &str, id: &str, record: Record, size: usize) {
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

    pub(super) fn clear(&mut self) {
        self.records.clear();
        self.bytes = 0;
    }
}

pub(super) enum WriteOp {
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
        /// Declared only: writes keep its entries from now on, and
        /// [`WriteOp::BuildIndex`] steps add those of the records there.
        online: bool,
    },
    /// One step of an online build: add the entries of a run, in key
    /// order, each only if its record still gives it (see [`super::build`]),
    /// committed without a sync. With no entries: make every step so far
    /// durable (a checkpoint).
    BuildIndex {
        coll: String,
        name: String,
        entries: Option<Vec<super::build::RunEntry>>,
    },
    DropIndex {
        coll: String,
        name: String,
    },
    /// Nothing to apply: make every write so far durable.
    Sync,
    /// Make every write so far durable and open a read transaction on
    /// that state (a backup's snapshot); commits on its own.
    Snapshot(tokio::sync::oneshot::Sender<StoreResult<redb::ReadTransaction>>),
    /// Checkpoint and stop the writer (the store closes).
    Close,
}

impl WriteOp {
    pub(super) fn of(coll: &str, write: Write<'_>) -> Self {
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
    pub(super) fn is_schema(&self) -> bool {
        matches!(
            self,
            WriteOp::EnsureIndex { .. }
                | WriteOp::BuildIndex { .. }
                | WriteOp::DropIndex { .. }
                | WriteOp::Snapshot(_)
                | WriteOp::Close
        )
    }
}

/// Decode a record the store wrote (the writer's own reads).
fn decode(bytes: &[u8]) -> StoreResult<Record> {
    convert::decode(bytes).map_err(|e| StoreError::Undecodable(e.0))
}

fn encode(record: &Record) -> StoreResult<Vec<u8>> {
    let mut out = Vec::new();
    record.to_writer(&mut out).map_err(|e| StoreError::Rejected(e.to_string()))?;
    Ok(out)
}

/// Create or drop an index in a write transaction of its own; the
/// in-memory catalog changes once it is committed.
pub(super) fn schema_change(db: &Database, catalog: &Catalog, op: WriteOp, quick_repair: bool) -> StoreResult<bool> {
    match op {
        WriteOp::BuildIndex { coll, name, entries } => {
            let spec = catalog
                .read()
                .expect("index catalog")
                .get(&coll)
                .and_then(|specs| specs.iter().find(|s| s.name == name).cloned())
                .ok_or_else(|| StoreError::Internal(format!("{coll} has no index {name} to build")))?;
            let mut txn = db.begin_write().map_err(internal)?;
            if entries.is_some() {
                // Lost in a crash with the build that made it, which then
                // starts over; the last step (no entries) is durable.
                txn.set_durability(redb::Durability::None).map_err(internal)?;
            } else {
                txn.set_quick_repair(quick_repair);
            }
            if let Some(entries) = entries {
                super::build::add_entries(&txn, &coll, &spec, &entries)?;
            }
            txn.commit().map_err(|e| StoreError::Unavailable(format!("commit failed: {e}")))?;
            Ok(true)
        }
        WriteOp::EnsureIndex { coll, spec, online } => {
            let existing = catalog
                .read()
                .expect("index catalog")
                .get(&coll)
                .and_then(|specs| specs.iter().find(|s| s.name == spec.name).cloned());
            match existing {
                Some(s) if s == spec => return Ok(false),
                // An index made before it was counted is made again,
                // counted (its entries are rebuilt below, or by the build
                // an online declaration is followed by).
                Some(s) if IndexSpec { counted: true, ..s.clone() } == spec => {
                    tracing::info!(collection = %coll, index = %spec.name, "index made again, with counts");
                }
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
                let mut entries = Entries::open(&txn)?;
                entries.clear(&entries_name(&coll, &spec.name))?;
                let end = after_collection(&coll);
                let all = records.range((coll.as_str(), "")..(end.as_str(), "")).map_err(internal)?;
                for entry in all.take(if online { 0 } else { usize::MAX }) {
                    let (key, value) = entry.map_err(internal)?;
                    let id = key.value().1;
                    let record = match convert::decode(value.value()) {
                        Ok(record) => record,
                        Err(e) => {
                            report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}")));
                            continue;
                        }
                    };
                    reindex(&mut entries, std::slice::from_ref(&spec), &coll, id, None, Some(&record), None)?;
                    built += 1;
                    if built % 100_000 == 0 {
                        tracing::info!(collection = %coll, index = %spec.name, records = built, "building index");
                    }
                }
                entries.finish()?;
                let mut cat = txn.open_table(CATALOG).map_err(internal)?;
                let json = serde_json::to_vec(&spec).map_err(internal)?;
                cat.insert((coll.as_str(), spec.name.as_str()), json.as_slice()).map_err(internal)?;
            }
            txn.commit().map_err(|e| StoreError::Unavailable(format!("commit failed: {e}")))?;
            if built > 0 {
                tracing::info!(collection = %coll, index = %spec.name, records = built, "index built");
            }
            let mut catalog = catalog.write().expect("index catalog");
            let specs = catalog.entry(coll).or_default();
            specs.retain(|s| s.name != spec.name);
            specs.push(spec);
            Ok(true)
        }
        WriteOp::DropIndex { coll, name } => {
            let mut txn = db.begin_write().map_err(internal)?;
            txn.set_quick_repair(quick_repair);
            {
                let mut entries = Entries::open(&txn)?;
                entries.clear(&entries_name(&coll, &name))?;
                entries.finish()?;
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

/// Whether the condition of every one of `ops` holds now, nothing applied:
/// the check of an all-or-nothing chain, each of whose writes is about
/// another record (so applying one cannot change another's condition).
pub(super) fn all_hold(
    table: &redb::Table<(&str, &str), &[u8]>,
    recent: &Recent,
    ops: &[WriteOp],
) -> StoreResult<bool> {
    let mut seen = std::collections::HashSet::with_capacity(ops.len());
    for op in ops {
        let (coll, id, filter) = match op {
            WriteOp::Insert { coll, record } | WriteOp::Append { coll, record } => {
                let id = record.get_str("_id").map_err(|_| StoreError::Rejected("record has no string _id".into()))?;
                (coll, id, None)
            }
            WriteOp::Replace { coll, id, filter, .. }
            | WriteOp::Update { coll, id, filter, .. }
            | WriteOp::Delete { coll, id, filter } => (coll, id.as_str(), Some(filter)),
            _ => return Err(StoreError::Rejected("an all-or-nothing chain holds only writes of records".into())),
        };
        if !seen.insert((coll.as_str(), id)) {
            return Err(StoreError::Rejected(format!("{coll}/{id} is written twice in an all-or-nothing chain")));
        }
        let holds = match (recent.peek(coll, id), filter) {
            (Some(_), None) => false,
            (Some(current), Some(filter)) => matches(current, filter)?,
            (None, filter) => match (table.get((coll.as_str(), id)).map_err(internal)?, filter) {
                (None, None) => true,
                (Some(_), None) | (None, Some(_)) => false,
                (Some(value), Some(filter)) => matches(&decode(value.value())?, filter)?,
            },
        };
        if !holds {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Apply `op` if its condition holds, adding what it changed to `effects`.
/// What the writer keeps between writes besides the database.
pub(super) struct Applying<'a> {
    pub(super) recent: &'a mut Recent,
    pub(super) positions: &'a mut HashMap<String, u64>,
    pub(super) deferred: &'a mut Deferred,
}

/// The index of log collection `coll` that keeps positions unique.
fn position_index<'a>(specs: &'a [IndexSpec], coll: &str) -> StoreResult<&'a IndexSpec> {
    specs
        .iter()
        .find(|s| s.unique && s.fields.len() == 1 && s.fields[0] == LOG_SEQ)
        .ok_or_else(|| StoreError::Rejected(format!("{coll} is no log: it has no unique index on {}", LOG_SEQ)))
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
    let mut range = entries.table().range((name.as_str(), &[][..])..(name.as_str(), &end[..])).map_err(internal)?;
    let Some(last) = range.next_back() else { return Ok(1) };
    let (_, id) = last.map_err(internal)?;
    let id = id.value().to_owned();
    let record = table
        .get((coll, id.as_str()))
        .map_err(internal)?
        .ok_or_else(|| StoreError::Internal(format!("{coll}: index {} names {id}, which is not there", spec.name)))?;
    let seq = decode(record.value())?.get_i64(LOG_SEQ).ok().and_then(|n| u64::try_from(n).ok());
    seq.map(|n| n + 1).ok_or_else(|| StoreError::Internal(format!("{coll}/{id} has no position")))
}

pub(super) fn apply(
    table: &mut redb::Table<(&str, &str), &[u8]>,
    entries: &mut Entries<'_>,
    catalog: &HashMap<String, Vec<IndexSpec>>,
    state: &mut Applying<'_>,
    op: WriteOp,
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
        WriteOp::Insert { ref coll, record } => {
            let id = record.get_str("_id").map_err(|_| StoreError::Rejected("record has no string _id".into()))?;
            if recent.contains(coll, id) || table.get((coll.as_str(), id)).map_err(internal)?.is_some() {
                return Ok(false);
            }
            let bytes = encode(&record)?;
            reindex(entries, specs(coll), coll, id, None, Some(&record), Some(&mut *state.deferred))?;
            table.insert((coll.as_str(), id), bytes.as_slice()).map_err(internal)?;
            effects.put(coll, id, &bytes);
            let id = id.to_owned();
            recent.put(coll, &id, record, bytes.len());
            Ok(true)
        }
        WriteOp::Replace { ref coll, ref id, ref filter, record } => {
            let Some((existing, size)) = current(coll, id)? else { return Ok(false) };
            if !matches(&existing, filter)? {
                recent.put(coll, id, existing, size);
                return Ok(false);
            }
            let mut record = record;
            record.insert("_id", id.as_str());
            let bytes = encode(&record)?;
            let old = keys_of(specs(coll), &existing, id);
            reindex(entries, specs(coll), coll, id, Some(old), Some(&record), Some(&mut *state.deferred))?;
            table.insert((coll.as_str(), id.as_str()), bytes.as_slice()).map_err(internal)?;
            effects.put(coll, id, &bytes);
            recent.put(coll, id, record, bytes.len());
            Ok(true)
        }
        WriteOp::Update { ref coll, ref id, ref filter, ref update } => {
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
        WriteOp::Delete { ref coll, ref id, ref filter } => {
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
        WriteOp::Append { ref coll, mut record } => {
            let id = record.get_str("_id").map_err(|_| StoreError::Rejected("record has no string _id".into()))?;
            let id = id.to_owned();
            let id = id.as_str();
            if recent.contains(coll, id) || table.get((coll.as_str(), id)).map_err(internal)?.is_some() {
                return Ok(false);
            }
            let index = position_index(specs(coll), coll)?;
            let mut seq = match state.positions.get(coll) {
                Some(next) => *next,
                None => next_position(table, entries, index, coll)?,
            };
            let taken = format!("{coll}.{}", index.name);
            loop {
                record.insert(LOG_SEQ, i64::try_from(seq).map_err(internal)?);
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
        WriteOp::EnsureIndex { .. }
        | WriteOp::BuildIndex { .. }
        | WriteOp::DropIndex { .. }
        | WriteOp::Snapshot(_)
        | WriteOp::Close => {
            unreachable!("index changes commit on their own")
        }
    }
}
