//! An in-memory store for tests: every operation completes on the calling
//! task, with no thread or socket to wait for, so the protocol can run
//! under tokio's paused time (a backend that waits for I/O would let paused
//! time jump ahead to the next timer). Nothing is kept on disk.

use std::collections::BTreeMap;
use std::sync::Mutex;

use async_trait::async_trait;

use super::filter::{apply_update, lookup, matches, sort_order};
use super::{
    Document, Durability, Found, IndexQuery, IndexSpec, Order, Record, Scan, Store, StoreError, StoreResult, Write,
};

#[derive(Default)]
pub struct MemoryStore {
    records: Mutex<BTreeMap<(String, String), Record>>,
    /// The indexes made per collection: listed as a backend lists its
    /// catalog (scans here filter every record anyway).
    indexes: Mutex<BTreeMap<String, Vec<IndexSpec>>>,
}

impl MemoryStore {
    fn with<T>(&self, f: impl FnOnce(&mut BTreeMap<(String, String), Record>) -> T) -> T {
        f(&mut self.records.lock().expect("memory store"))
    }

    /// The records of `coll` that `query` reads, in its order: as the
    /// embedded store's index would hold them.
    fn along_index(&self, coll: &str, query: &IndexQuery) -> StoreResult<Vec<Record>> {
        self.with(|records| {
            let of_coll = records.range((coll.to_owned(), String::new())..).take_while(|((c, _), _)| c == coll);
            let found = super::embedded::along_index(query, of_coll.map(|(_, r)| r))?;
            Ok(found.into_iter().cloned().collect())
        })
    }

    /// Apply `change` to record `(coll, id)` if it exists and matches `filter`.
    fn conditional(
        &self,
        coll: &str,
        id: &str,
        filter: &Document,
        change: impl FnOnce(&mut Record) -> StoreResult<Option<()>>,
    ) -> StoreResult<bool> {
        self.with(|records| {
            let key = (coll.to_owned(), id.to_owned());
            let Some(current) = records.get_mut(&key) else { return Ok(false) };
            if !matches(current, filter)? {
                return Ok(false);
            }
            // Changed on a copy: a change that fails halfway leaves the
            // record as it was, as every backend does.
            let mut next = current.clone();
            match change(&mut next)? {
                Some(()) => *current = next,
                None => {
                    records.remove(&key);
                }
            }
            Ok(true)
        })
    }
}

#[async_trait]
impl Store for MemoryStore {
    fn backend(&self) -> &'static str {
        "memory"
    }

    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>> {
        Ok(self.with(|r| r.get(&(coll.to_owned(), id.to_owned())).cloned()))
    }

    /// Memory has nothing to sync: every write is as durable as the store.
    async fn write(&self, coll: &str, write: Write<'_>, _: Durability) -> StoreResult<bool> {
        match write {
            Write::Insert(record) => {
                let id = record
                    .get_str("_id")
                    .map_err(|_| StoreError::Rejected("record has no string _id".into()))?
                    .to_owned();
                Ok(self.with(|r| match r.entry((coll.to_owned(), id)) {
                    std::collections::btree_map::Entry::Occupied(_) => false,
                    std::collections::btree_map::Entry::Vacant(v) => {
                        v.insert(record);
                        true
                    }
                }))
            }
            Write::Replace { id, filter, mut record } => {
                record.insert("_id", id);
                self.conditional(coll, id, &filter, |current| {
                    *current = record;
                    Ok(Some(()))
                })
            }
            Write::Update { id, filter, update } => {
                self.conditional(coll, id, &filter, |current| apply_update(current, &update).map(Some))
            }
            Write::Delete { id, filter } => self.conditional(coll, id, &filter, |_| Ok(None)),
            Write::Append(mut record) => {
                let id = record
                    .get_str("_id")
                    .map_err(|_| StoreError::Rejected("record has no string _id".into()))?
                    .to_owned();
                Ok(self.with(|r| {
                    if r.contains_key(&(coll.to_owned(), id.clone())) {
                        return false;
                    }
                    let mut next = 1;
                    for ((c, _), existing) in r.range((coll.to_owned(), String::new())..) {
                        if c != coll {
                            break;
                        }
                        let seq = existing.get_i64(super::LOG_SEQ).unwrap_or_default();
                        next = next.max(seq + 1);
                    }
                    record.insert(super::LOG_SEQ, next);
                    r.insert((coll.to_owned(), id), record);
                    true
                }))
            }
        }
    }

    async fn sync(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn query(&self, coll: &str, query: &IndexQuery) -> StoreResult<Found> {
        let out = self.along_index(coll, query)?;
        taken(out, query.limit, query.budget)
    }

    async fn count(&self, coll: &str, query: &IndexQuery) -> StoreResult<u64> {
        Ok(self.along_index(coll, query)?.len() as u64)
    }

    async fn scan_found(&self, coll: &str, scan: Scan) -> StoreResult<Found> {
        let (filter, _) = scan.to_query();
        let mut out = self.with(|records| {
            let mut out = Vec::new();
            for ((c, _), record) in records.range((coll.to_owned(), String::new())..) {
                if c != coll {
                    break;
                }
                if matches(record, &filter)? {
                    out.push(record.clone());
                }
            }
            StoreResult::Ok(out)
        })?;
        let field = scan.by();
        out.sort_by(|a, b| {
            let ord = sort_order(lookup(a, field), lookup(b, field))
                .then_with(|| a.get_str("_id").unwrap_or("").cmp(b.get_str("_id").unwrap_or("")));
            if scan.order() == Order::Desc { ord.reverse() } else { ord }
        });
        out.drain(..scan.skipped().min(out.len()));
        taken(out, scan.max(), scan.budget())
    }

    async fn get_many_within(&self, coll: &str, ids: &[String], budget: usize) -> StoreResult<Found> {
        let records: Vec<Record> =
            self.with(|r| ids.iter().filter_map(|id| r.get(&(coll.to_owned(), id.clone())).cloned()).collect());
        taken(records, ids.len(), budget)
    }

    async fn collections(&self) -> StoreResult<Vec<String>> {
        let mut names: Vec<String> = self.with(|r| r.keys().map(|(c, _)| c.clone()).collect());
        names.dedup();
        Ok(names)
    }

    async fn ensure_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        let mut indexes = self.indexes.lock().expect("memory store indexes");
        let made = indexes.entry(coll.to_owned()).or_default();
        if !made.iter().any(|i| i.name == index.name) {
            made.push(index);
        }
        Ok(())
    }

    async fn drop_index(&self, coll: &str, name: &str) -> StoreResult<()> {
        if let Some(made) = self.indexes.lock().expect("memory store indexes").get_mut(coll) {
            made.retain(|i| i.name != name);
        }
        Ok(())
    }

    async fn indexes(&self, coll: &str) -> StoreResult<Vec<IndexSpec>> {
        Ok(self.indexes.lock().expect("memory store indexes").get(coll).cloned().unwrap_or_default())
    }
}

/// The first of `records` up to `limit` of them and `budget` bytes (as
/// encoded), as a store finds them.
fn taken(records: Vec<Record>, limit: usize, budget: usize) -> StoreResult<Found> {
    let mut found = Found::default();
    if limit == 0 {
        return Ok(found);
    }
    for record in records {
        let size = mongodb::bson::to_vec(&record).map_err(|e| StoreError::Internal(e.to_string()))?.len();
        if !found.take(record, size, limit, budget) {
            break;
        }
    }
    Ok(found)
}
