//! Index entries: their keys, and keeping them equal to the records.

use std::collections::HashMap;

use redb::ReadableTable;

use super::{internal, keys};
use crate::store::filter::lookup;
use crate::store::{Bson, IndexSpec, Record, StoreError, StoreResult};

/// The entry-table name of index `name` of `coll`.
pub(super) fn entries_name(coll: &str, name: &str) -> String {
    format!("{coll}\0{name}")
}

/// The entry key of `record` (with `_id` `id`) in index `spec`; none in a
/// sparse index when its first field is null or missing.
pub(super) fn entry_key(spec: &IndexSpec, record: &Record, id: &str) -> Option<Vec<u8>> {
    if spec.sparse && spec.keys().next().is_some_and(|(f, _)| matches!(lookup(record, f), None | Some(Bson::Null))) {
        return None;
    }
    let mut key = Vec::new();
    for (path, desc) in spec.keys() {
        keys::push_dir(&mut key, lookup(record, path), desc);
    }
    if !spec.unique && spec.keys().last().is_none_or(|(f, _)| f != "_id") {
        keys::push(&mut key, Some(&Bson::String(id.to_owned())));
    }
    Some(key)
}

pub(super) type Entries<'t> = redb::Table<'t, (&'static str, &'static [u8]), &'static str>;

/// The entry keys of `record` in each of `specs`.
pub(super) fn keys_of(specs: &[IndexSpec], record: &Record, id: &str) -> Vec<Option<Vec<u8>>> {
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
    pub(super) fn flush(self, entries: &mut Entries<'_>) -> StoreResult<()> {
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
pub(super) fn reindex(
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
