//! Index entries: their keys, and keeping them equal to the records.

use std::collections::HashMap;

use redb::ReadableTable;

use super::keys::Numbers;
use super::{COUNTS, ENTRIES, RECORDS, internal, keys};
use crate::filter::{lookup, lookup_raw};
use crate::{Bson, IndexSpec, Record, StoreError, StoreResult, convert, report_unreadable};

/// The entry-table name of index `name` of `coll`.
pub(super) fn entries_name(coll: &str, name: &str) -> String {
    format!("{coll}\0{name}")
}

/// An index entry's key: the record's values in the index's fields, in
/// their order-preserving encoding ([`keys`]), then its `_id` (left out by
/// a unique index, or one that ends with `_id`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Key {
    pub(super) bytes: Vec<u8>,
    /// Where each leading group of values a counted index keeps a count
    /// for ends in `bytes` (empty for other indexes): after the first
    /// field, the first two, … all but the last.
    cuts: Vec<usize>,
}

impl Key {
    /// The leading groups of values a count is kept for, as key bytes.
    pub(super) fn counted_prefixes(&self) -> impl Iterator<Item = &[u8]> {
        self.cuts.iter().map(|&cut| &self.bytes[..cut])
    }
}

/// The entry key of `record` (with `_id` `id`) in index `spec`; none in a
/// sparse index when its first field is null or missing.
pub(super) fn entry_key(spec: &IndexSpec, record: &Record, id: &str) -> Option<Key> {
    entry_key_in(spec, record, id, Numbers::Exact)
}

/// [`entry_key`], numbers encoded as `numbers` says.
fn entry_key_in(spec: &IndexSpec, record: &Record, id: &str, numbers: Numbers) -> Option<Key> {
    if spec.sparse && spec.keys().next().is_some_and(|(f, _)| matches!(lookup(record, f), None | Some(Bson::Null))) {
        return None;
    }
    let mut key = Vec::new();
    let mut cuts = Vec::new();
    let fields = spec.fields.len();
    for (i, (path, desc)) in spec.keys().enumerate() {
        keys::push_dir_in(&mut key, lookup(record, path), desc, numbers);
        if spec.counted && i + 1 < fields {
            cuts.push(key.len());
        }
    }
    if !spec.unique && spec.keys().last().is_none_or(|(f, _)| f != "_id") {
        keys::push(&mut key, Some(&Bson::String(id.to_owned())));
    }
    Some(Key { bytes: key, cuts })
}

/// `("<collection>\0<index>", key bytes) -> _id`.
type EntryTable<'t> = redb::Table<'t, (&'static str, &'static [u8]), &'static str>;
/// `("<collection>\0<index>", key bytes of leading values) -> entries`.
type CountTable<'t> = redb::Table<'t, (&'static str, &'static [u8]), u64>;

/// The index entries in a write transaction, with the counts of counted
/// indexes ([`IndexSpec::counted`]): for each value of each leading group
/// of fields short of the whole key, the number of entries that start
/// with it. Every entry added or taken away here changes its counts in
/// the same transaction ([`Entries::finish`] writes them, net, once per
/// count), so a count read in a snapshot is the number of that snapshot's
/// entries in the range, read without walking them.
pub(super) struct Entries<'t> {
    table: EntryTable<'t>,
    counts: CountTable<'t>,
    /// Net changes to counts not written yet: index table → prefix → change.
    changes: HashMap<String, HashMap<Vec<u8>, i64>>,
}

impl<'t> Entries<'t> {
    /// The entries of `txn`; [`Entries::finish`] before it commits.
    pub(super) fn open(txn: &'t redb::WriteTransaction) -> StoreResult<Self> {
        Ok(Self {
            table: txn.open_table(ENTRIES).map_err(internal)?,
            counts: txn.open_table(COUNTS).map_err(internal)?,
            changes: HashMap::new(),
        })
    }

    /// The entry table, to read.
    pub(super) fn table(&self) -> &EntryTable<'t> {
        &self.table
    }

    /// The `_id` the entry `key` of `table` names, if there is one.
    pub(super) fn holder(&self, table: &str, key: &Key) -> StoreResult<Option<String>> {
        Ok(self.table.get((table, key.bytes.as_slice())).map_err(internal)?.map(|v| v.value().to_owned()))
    }

    /// Add the entry `key` → `id` to `table` (one already there is kept,
    /// and counted once).
    pub(super) fn put(&mut self, table: &str, key: &Key, id: &str) -> StoreResult<()> {
        let was = self.table.insert((table, key.bytes.as_slice()), id).map_err(internal)?.is_some();
        if !was {
            self.count(table, key, 1);
        }
        Ok(())
    }

    /// Take the entry `key` out of `table`, if it is there.
    pub(super) fn take(&mut self, table: &str, key: &Key) -> StoreResult<()> {
        let was = self.table.remove((table, key.bytes.as_slice())).map_err(internal)?.is_some();
        if was {
            self.count(table, key, -1);
        }
        Ok(())
    }

    fn count(&mut self, table: &str, key: &Key, delta: i64) {
        if key.cuts.is_empty() {
            return;
        }
        let changes = match self.changes.get_mut(table) {
            Some(changes) => changes,
            None => self.changes.entry(table.to_owned()).or_default(),
        };
        for prefix in key.counted_prefixes() {
            match changes.get_mut(prefix) {
                Some(n) => *n += delta,
                None => {
                    changes.insert(prefix.to_vec(), delta);
                }
            }
        }
    }

    /// Write the counts' net changes: due before the transaction commits.
    pub(super) fn finish(mut self) -> StoreResult<()> {
        for (table, changes) in std::mem::take(&mut self.changes) {
            for (prefix, delta) in changes {
                if delta == 0 {
                    continue;
                }
                let at = (table.as_str(), prefix.as_slice());
                let n = self.counts.get(at).map_err(internal)?.map_or(0, |v| v.value());
                let n = n
                    .checked_add_signed(delta)
                    .ok_or_else(|| StoreError::Internal(format!("index {table:?}: a count would go below zero")))?;
                if n == 0 {
                    self.counts.remove(at).map_err(internal)?;
                } else {
                    self.counts.insert(at, n).map_err(internal)?;
                }
            }
        }
        Ok(())
    }

    /// Take every entry of `table` out, and its counts.
    pub(super) fn clear(&mut self, table: &str) -> StoreResult<()> {
        self.changes.remove(table);
        let end = [keys::END];
        self.table.retain_in((table, &[][..])..(table, &end[..]), |_, _| false).map_err(internal)?;
        self.counts.retain_in((table, &[][..])..(table, &end[..]), |_, _| false).map_err(internal)
    }
}

/// The entry keys of `record` in each of `specs`.
pub(super) fn keys_of(specs: &[IndexSpec], record: &Record, id: &str) -> Vec<Option<Key>> {
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
pub(super) struct Deferred {
    /// (index table, record id) → (key before the batch, key after it).
    changes: HashMap<(String, String), (EntryKey, EntryKey)>,
}

/// An index entry's key; `None`: the record has no entry in that index.
type EntryKey = Option<Key>;

impl Deferred {
    fn change(&mut self, table: String, id: &str, old: EntryKey, new: EntryKey) {
        match self.changes.entry((table, id.to_owned())) {
            std::collections::hash_map::Entry::Occupied(mut e) => e.get_mut().1 = new,
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert((old, new));
            }
        }
    }

    /// Write the net changes.
    pub(super) fn flush(self, entries: &mut Entries<'_>) -> StoreResult<()> {
        for ((table, id), (old, new)) in self.changes {
            if old == new {
                continue;
            }
            if let Some(key) = old {
                entries.take(&table, &key)?;
            }
            if let Some(key) = new {
                entries.put(&table, &key, &id)?;
            }
        }
        Ok(())
    }
}

/// Keep the entries of every index of `coll` equal to the record `id`
/// becoming `new` (from the record whose keys are `old`). Unique indexes are checked before anything
/// is changed, so a refused write leaves no trace. With `deferred`, the
/// entries of non-unique indexes change at the end of the batch.
pub(super) fn reindex(
    entries: &mut Entries<'_>,
    specs: &[IndexSpec],
    coll: &str,
    id: &str,
    old: Option<Vec<EntryKey>>,
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
            if let Some(holder) = entries.holder(&table, key)? {
                if holder != id {
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
            entries.take(&table, &key)?;
        }
        if let Some(key) = new_key {
            entries.put(&table, &key, id)?;
        }
    }
    Ok(())
}

/// Store layout 3 (numbers encoded exactly, [`Numbers`]) over the entries
/// of a store of layout 1 or 2, in `txn`: every record that holds, at a
/// path of one of its collection's indexes (`catalog`), an integer those
/// layouts encoded otherwise (2^63 − 512 to 2^63 − 1) has its entries
/// taken out under their old keys, then put under the new ones (their
/// counts follow). All old keys go before any new one is put: a unique
/// index's new key may be another renumbered record's old one. A record
/// that cannot be decoded is reported and keeps its entries (no read shows
/// it). Returns how many records were renumbered.
pub(super) fn renumber(txn: &redb::WriteTransaction, catalog: &HashMap<String, Vec<IndexSpec>>) -> StoreResult<usize> {
    let mut moved = Vec::new();
    {
        let records = txn.open_table(RECORDS).map_err(internal)?;
        for (coll, specs) in catalog {
            let paths: Vec<&str> = specs.iter().flat_map(|spec| spec.keys().map(|(path, _)| path)).collect();
            let end = super::scan::after_collection(coll);
            for row in records.range((coll.as_str(), "")..(end.as_str(), "")).map_err(internal)? {
                let (key, value) = row.map_err(internal)?;
                let Ok(raw) = mongodb::bson::RawDocument::from_bytes(value.value()) else { continue };
                let renumbered = |path: &&str| {
                    let value = lookup_raw(raw, path).and_then(|v| Bson::try_from(v).ok());
                    keys::renumbered(value.as_ref())
                };
                if !paths.iter().any(renumbered) {
                    continue;
                }
                let id = key.value().1.to_owned();
                match convert::decode(value.value()) {
                    Ok(record) => moved.push((coll, id, record)),
                    Err(e) => report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}"))),
                }
            }
        }
    }
    let mut entries = Entries::open(txn)?;
    let mut puts = Vec::new();
    for (coll, id, record) in &moved {
        for spec in &catalog[*coll] {
            let old = entry_key_in(spec, record, id, Numbers::Layout2);
            let new = entry_key(spec, record, id);
            if old == new {
                continue;
            }
            let table = entries_name(coll, &spec.name);
            if let Some(key) = old {
                entries.take(&table, &key)?;
            }
            if let Some(key) = new {
                puts.push((table, key, id));
            }
        }
    }
    for (table, key, id) in puts {
        entries.put(&table, &key, id)?;
    }
    entries.finish()?;
    Ok(moved.len())
}
