//! Reads of the embedded store. Each read runs in a redb read transaction
//! (an MVCC snapshot) of its own, or, for a pinned reader
//! ([`Store::snapshot`]), every read in the one transaction taken when it
//! was pinned: they all see the store as it was then, whatever the writer
//! commits meanwhile.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use redb::{Database, ReadTransaction, ReadableDatabase};

use super::index::entries_name;
use super::keys;
use super::scan::{
    Reads, abandoned, after_collection, entries_in, entry_range, eq_prefix, excludes_null, in_order, query_ranges,
    scan_primary, watched,
};
use super::{COUNTS, Catalog, ENTRIES, RECORDS, SMALL_READ, internal};
use crate::{Bson, Edge, Found, FoundRaw, IndexQuery, IndexSpec, Record, Scan, Store, StoreError, StoreResult, Write};

/// What every read of the store needs.
#[derive(Clone)]
pub(super) struct Reader {
    pub(super) db: Arc<Database>,
    /// The read transaction every read of a pinned reader uses.
    pinned: Option<Arc<ReadTransaction>>,
    pub(super) catalog: Catalog,
    /// What reads (gets and scans) decoded and skipped since the store opened.
    pub(super) reads: Arc<Reads>,
}

impl Reader {
    pub(super) fn new(db: Arc<Database>, catalog: Catalog) -> Self {
        Self { db, pinned: None, catalog, reads: Arc::default() }
    }

    /// A reader whose every read sees the store as it is now.
    pub(super) fn pin(&self) -> StoreResult<Self> {
        let txn = self.db.begin_read().map_err(internal)?;
        Ok(Self { pinned: Some(Arc::new(txn)), ..self.clone() })
    }

    pub(super) async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction, &Reads) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let (db, pinned, reads) = (Arc::clone(&self.db), self.pinned.clone(), Arc::clone(&self.reads));
        // Set once nobody waits for the answer (the store's deadline gave
        // up, or the request went away): a read not started yet does not
        // start, one under way stops at its next records (`abandoned`).
        let gone = Abandon(Arc::new(AtomicBool::new(false)));
        let flag = Arc::clone(&gone.0);
        tokio::task::spawn_blocking(move || {
            if flag.load(Ordering::Relaxed) {
                return Err(abandoned());
            }
            watched(flag, || match pinned {
                Some(txn) => f(&txn, &reads),
                None => db.begin_read().map_err(internal).and_then(|txn| f(&txn, &reads)),
            })
        })
        .await
        .map_err(internal)?
    }

    /// A point read (one record, or a few by id), on the calling thread:
    /// redb serves it from its page cache in microseconds, less than
    /// handing it to the blocking pool costs (a page not in the cache is
    /// read from disk on this thread). Scans, which may read many pages,
    /// go to the blocking pool.
    pub(super) fn read_now<T>(
        &self,
        f: impl FnOnce(&redb::ReadTransaction, &Reads) -> StoreResult<T>,
    ) -> StoreResult<T> {
        match &self.pinned {
            Some(txn) => f(txn, &self.reads),
            None => f(&self.db.begin_read().map_err(internal)?, &self.reads),
        }
    }

    /// A read of at most `records` records: on the calling thread when
    /// that is a few point reads' worth ([`SMALL_READ`], a page of a
    /// query, the last event), in the blocking pool otherwise. Each hop
    /// to the pool and back costs two thread wake-ups, more than reading
    /// a few dozen cached records does.
    pub(super) async fn read_sized<T: Send + 'static>(
        &self,
        records: usize,
        f: impl FnOnce(&redb::ReadTransaction, &Reads) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        if records <= SMALL_READ { self.read_now(f) } else { self.read(f).await }
    }

    /// The spec of index `name` of `coll`, which a query names: `None`
    /// for a collection without records (its indexes come with its first
    /// record), an error for another (the planner names only declared
    /// indexes, so the index was dropped since).
    pub(super) async fn queried_spec(&self, coll: &str, name: &str) -> StoreResult<Option<IndexSpec>> {
        if let Some(spec) = self.spec(coll, name) {
            return Ok(Some(spec));
        }
        let coll = coll.to_owned();
        let empty = self
            .read(move |txn, _| {
                let records = txn.open_table(RECORDS).map_err(internal)?;
                let end = after_collection(&coll);
                let mut any = records.range((coll.as_str(), "")..(end.as_str(), "")).map_err(internal)?;
                Ok(any.next().is_none())
            })
            .await?;
        // Dropped since the query was planned (a drop waits out every
        // instance's cache first, so only a query that ran that long meets
        // it): a retry plans again.
        if empty {
            Ok(None)
        } else {
            Err(StoreError::Unavailable(format!("index {name} was dropped during the query")))
        }
    }

    /// The committed spec of index `name` of `coll`.
    pub(super) fn spec(&self, coll: &str, name: &str) -> Option<IndexSpec> {
        let catalog = self.catalog.read().expect("index catalog");
        catalog.get(coll)?.iter().find(|s| s.name == name).cloned()
    }

    pub(super) async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>> {
        self.read_now(|txn, reads| {
            let table = txn.open_table(RECORDS).map_err(internal)?;
            match table.get((coll, id)).map_err(internal)? {
                Some(v) => reads.get(coll, id, v.value()).map(Some),
                None => Ok(None),
            }
        })
    }

    pub(super) async fn get_many(&self, coll: &str, ids: &[String], budget: usize) -> StoreResult<Found> {
        self.read_now(|txn, reads| {
            let table = txn.open_table(RECORDS).map_err(internal)?;
            let mut found = Found::default();
            for (i, id) in ids.iter().enumerate() {
                if let Some(v) = table.get((coll, id.as_str())).map_err(internal)?
                    && !reads.scanned_into((coll, id, v.value()), &[], (usize::MAX, budget), &mut found)
                {
                    // The budget is spent: cut only with ids left to read.
                    found.cut = i + 1 < ids.len();
                    break;
                }
            }
            Ok(found)
        })
    }

    pub(super) async fn scan(&self, coll: &str, scan: Scan) -> StoreResult<Found> {
        let coll = coll.to_owned();
        // The catalog is read before the snapshot: an index it names was
        // committed before the snapshot begins.
        let spec = if scan.index() == crate::scans::PRIMARY { None } else { Some(self.spec(&coll, scan.index())) };
        let most = scan.skipped().saturating_add(scan.max());
        self.read_sized(most, move |txn, reads| {
            let records = txn.open_table(RECORDS).map_err(internal)?;
            let Some(spec) = spec else { return scan_primary(&records, &coll, &scan, reads) };
            let Some(spec) = spec else {
                // A collection without records has no indexes yet.
                let end = after_collection(&coll);
                let mut any = records.range((coll.as_str(), "")..(end.as_str(), "")).map_err(internal)?;
                return match any.next() {
                    None => Ok(Found::default()),
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
                return Ok(Found::default());
            }
            let name = entries_name(&coll, &spec.name);
            let entries = txn.open_table(ENTRIES).map_err(internal)?;
            let range =
                entries.range((name.as_str(), start.as_slice())..(name.as_str(), end.as_slice())).map_err(internal)?;
            let mut found = Found::default();
            let bounds = (scan.max(), scan.budget());
            in_order(range, &scan, |(_, id)| {
                let value = records.get((coll.as_str(), id.value())).map_err(internal)?.ok_or_else(|| {
                    StoreError::Internal(format!("index {name:?} names a missing record {}", id.value()))
                })?;
                Ok(reads.scanned_into((&coll, id.value(), value.value()), scan.wanted(), bounds, &mut found))
            })?;
            Ok(found)
        })
        .await
    }

    pub(super) async fn collections(&self) -> StoreResult<Vec<String>> {
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

    pub(super) async fn query(&self, coll: &str, query: &IndexQuery) -> StoreResult<Found> {
        self.query_with(coll, query, |reads, (coll, id, bytes), bounds, found: &mut Found| {
            reads.scanned_into((coll, id, bytes), &[], bounds, found)
        })
        .await
    }

    /// [`Self::query`] with the records as stored, checked, not built.
    pub(super) async fn query_raw(&self, coll: &str, query: &IndexQuery) -> StoreResult<FoundRaw> {
        self.query_with(coll, query, |reads, record, (limit, budget), found: &mut FoundRaw| {
            match reads.checked(record) {
                Some(raw) => found.take(raw, limit, budget),
                None => true,
            }
        })
        .await
    }

    /// The records along `query`'s index, each taken into `F` by `take`
    /// (whether the read goes on).
    async fn query_with<F: Default + Send + 'static>(
        &self,
        coll: &str,
        query: &IndexQuery,
        take: impl Fn(&Reads, (&str, &str, &[u8]), (usize, usize), &mut F) -> bool + Send + 'static,
    ) -> StoreResult<F> {
        let Some(spec) = self.queried_spec(coll, &query.index).await? else { return Ok(F::default()) };
        let ranges = query_ranges(&spec, query)?;
        let (coll, limit, budget, reverse) = (coll.to_owned(), query.limit, query.budget, query.reverse);
        self.read_sized(limit, move |txn, reads| {
            let records = txn.open_table(RECORDS).map_err(internal)?;
            let entries = txn.open_table(ENTRIES).map_err(internal)?;
            let name = entries_name(&coll, &spec.name);
            let mut found = F::default();
            if limit == 0 {
                return Ok(found);
            }
            entries_in(&entries, &name, &ranges, reverse, |id| {
                let value = records
                    .get((coll.as_str(), id))
                    .map_err(internal)?
                    .ok_or_else(|| StoreError::Internal(format!("index {name:?} names a missing record {id}")))?;
                reads.queried.fetch_add(1, Ordering::Relaxed);
                Ok(take(reads, (&coll, id, value.value()), (limit, budget), &mut found))
            })?;
            Ok(found)
        })
        .await
    }

    pub(super) async fn count(&self, coll: &str, query: &IndexQuery) -> StoreResult<u64> {
        let Some(spec) = self.queried_spec(coll, &query.index).await? else { return Ok(0) };
        let query = IndexQuery { after: None, ..query.clone() };
        let ranges = query_ranges(&spec, &query)?;
        let name = entries_name(coll, &spec.name);
        if let Some(kept) = kept_counts(&spec, &query) {
            // A few point reads: on this thread, as a get is.
            return self
                .read_sized(kept.plus.len() + kept.minus.len(), move |txn, _| {
                    let counts = txn.open_table(COUNTS).map_err(internal)?;
                    let count = |prefix: &Vec<u8>| -> StoreResult<u64> {
                        Ok(counts.get((name.as_str(), prefix.as_slice())).map_err(internal)?.map_or(0, |v| v.value()))
                    };
                    let (mut plus, mut minus) = (0u64, 0u64);
                    for prefix in &kept.plus {
                        plus += count(prefix)?;
                    }
                    for prefix in &kept.minus {
                        minus += count(prefix)?;
                    }
                    plus.checked_sub(minus).ok_or_else(|| {
                        StoreError::Internal(format!(
                            "index {name:?} counts fewer entries than some of its values hold"
                        ))
                    })
                })
                .await;
        }
        // Where the index keeps the count of the pinned prefix, the rest of
        // the prefix's entries (outside `ranges`) is walked alongside,
        // [`WALK_INSIDE`] entries of the range for each of the rest, and the
        // count is whichever walk ends first: the other side is the kept
        // count less it. A count walks at most a quarter more than walking
        // its range alone, and little for a range holding nearly all of its
        // prefix (less than alone once it holds five sixths).
        let rest = (spec.counted && !query.eq.is_empty()).then(|| {
            let prefix = eq_prefix(&spec, &query.eq);
            (outside(&prefix, &ranges), prefix)
        });
        // Walking entries may read many pages: in the blocking pool.
        self.read(move |txn, _| {
            let entries = txn.open_table(ENTRIES).map_err(internal)?;
            let mut inside = walk(&entries, &name, &ranges);
            let Some((outside, prefix)) = rest else {
                return inside.try_fold(0u64, |n, entry| entry.map(|()| n + 1));
            };
            let counts = txn.open_table(COUNTS).map_err(internal)?;
            let kept = counts.get((name.as_str(), prefix.as_slice())).map_err(internal)?.map_or(0, |v| v.value());
            let mut outside = walk(&entries, &name, &outside);
            // A stretch of each side in turn, each walk going on where it
            // stopped.
            let stretch = |side: &mut dyn Iterator<Item = StoreResult<()>>, most: usize| -> StoreResult<(u64, bool)> {
                let mut n = 0;
                for entry in side.take(most) {
                    entry?;
                    n += 1;
                }
                Ok((n, n < most as u64))
            };
            let (mut n, mut m) = (0u64, 0u64);
            loop {
                let (walked, ended) = stretch(&mut inside, WALK_STRETCH * WALK_INSIDE)?;
                n += walked;
                if ended {
                    return Ok(n);
                }
                let (walked, ended) = stretch(&mut outside, WALK_STRETCH)?;
                m += walked;
                if ended {
                    return kept.checked_sub(m).ok_or_else(|| {
                        StoreError::Internal(format!("index {name:?} counts fewer entries than it holds"))
                    });
                }
            }
        })
        .await
    }

    pub(super) fn indexes(&self, coll: &str) -> Vec<IndexSpec> {
        self.catalog.read().expect("index catalog").get(coll).cloned().unwrap_or_default()
    }
}

/// Entries a count walks of the rest of its prefix before it turns to its
/// range again (see [`Reader::count`]): enough that turning costs nothing
/// beside them.
const WALK_STRETCH: usize = 512;
/// Entries of its range a count walks for each of the rest of its prefix.
const WALK_INSIDE: usize = 4;

/// The entries of `ranges` of index table `name`, in order: entries only,
/// neither their ids nor any record is read.
fn walk<'t>(
    entries: &'t redb::ReadOnlyTable<(&'static str, &'static [u8]), &'static str>,
    name: &'t str,
    ranges: &'t [(Vec<u8>, Vec<u8>)],
) -> impl Iterator<Item = StoreResult<()>> + 't {
    ranges.iter().flat_map(move |(start, end)| {
        let range = entries.range((name, start.as_slice())..(name, end.as_slice())).map_err(internal);
        let (range, err) = match range {
            Ok(range) => (Some(range), None),
            Err(err) => (None, Some(Err(err))),
        };
        range.into_iter().flatten().map(|entry| entry.map(drop).map_err(internal)).chain(err)
    })
}

/// The byte ranges of the entries that start with `prefix` and lie outside
/// `ranges` (sorted, each within the prefix's, as [`query_ranges`] makes
/// them).
fn outside(prefix: &[u8], ranges: &[(Vec<u8>, Vec<u8>)]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut end = prefix.to_vec();
    end.push(keys::END);
    let mut out = Vec::new();
    let mut at = prefix.to_vec();
    for (start, stop) in ranges {
        if *start > at {
            out.push((at.clone(), start.clone()));
        }
        if *stop > at {
            at.clone_from(stop);
        }
    }
    if end > at {
        out.push((at, end));
    }
    out
}

/// The kept counts a count is made of: the sum of `plus` less the sum of
/// `minus`, each a prefix of the index's keys.
struct Kept {
    plus: Vec<Vec<u8>>,
    minus: Vec<Vec<u8>>,
}

/// The kept counts a count along `query` is made of, where its index keeps
/// them (`None`: it walks the entries). A counted index keeps the number of
/// entries of each value of each leading group of its fields short of the
/// whole key, so a count that pins some of them by equality and bounds
/// nothing after them reads one number. When the next field is bounded:
/// by single values (`$in`), it reads one per value (the intervals are
/// disjoint); by everything but single values (`$ne`, `$nin`), the pinned
/// fields' count less one per value. Anything else walks.
fn kept_counts(spec: &IndexSpec, query: &IndexQuery) -> Option<Kept> {
    if !spec.counted || query.eq.is_empty() {
        return None;
    }
    let prefix = eq_prefix(spec, &query.eq);
    let Some(intervals) = &query.slot else { return Some(Kept { plus: vec![prefix], minus: Vec::new() }) };
    if query.eq.len() + 1 >= spec.fields.len() {
        return None;
    }
    let (_, desc) = spec.keys().nth(query.eq.len())?;
    let pinned = |value: &Bson| {
        let mut key = prefix.clone();
        keys::push_dir(&mut key, Some(value), desc);
        key
    };
    // The key of one value, where both edges are that value (`inclusive`).
    let one = |lower: &Edge, upper: &Edge, inclusive: bool| match (lower, upper) {
        (Edge::Value { value: a, inclusive: i }, Edge::Value { value: b, inclusive: j })
            if *i == inclusive && *j == inclusive =>
        {
            let key = pinned(a);
            (key == pinned(b)).then_some(key)
        }
        _ => None,
    };
    let points: Option<Vec<Vec<u8>>> = intervals.iter().map(|i| one(&i.lower, &i.upper, true)).collect();
    if let Some(plus) = points {
        return Some(Kept { plus, minus: Vec::new() });
    }
    let (first, last) = (intervals.first()?, intervals.last()?);
    if first.lower != Edge::Unbounded || last.upper != Edge::Unbounded {
        return None;
    }
    let minus: Option<Vec<Vec<u8>>> = intervals.windows(2).map(|w| one(&w[0].upper, &w[1].lower, false)).collect();
    Some(Kept { plus: vec![prefix], minus: minus? })
}

/// The store as one pinned reader sees it ([`Store::snapshot`]): reads
/// only; a write is refused.
pub(super) struct Pinned(pub(super) Reader);

fn read_only() -> StoreError {
    StoreError::Internal("a snapshot of the store is read-only".into())
}

#[async_trait]
impl Store for Pinned {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn ping(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>> {
        self.0.get(coll, id).await
    }

    async fn get_many_within(&self, coll: &str, ids: &[String], budget: usize) -> StoreResult<Found> {
        self.0.get_many(coll, ids, budget).await
    }

    async fn write(&self, _: &str, _: Write<'_>, _: crate::Durability) -> StoreResult<bool> {
        Err(read_only())
    }

    async fn sync(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn scan_found(&self, coll: &str, scan: Scan) -> StoreResult<Found> {
        self.0.scan(coll, scan).await
    }

    async fn query(&self, coll: &str, query: &IndexQuery) -> StoreResult<Found> {
        self.0.query(coll, query).await
    }

    async fn query_raw(&self, coll: &str, query: &IndexQuery) -> StoreResult<FoundRaw> {
        self.0.query_raw(coll, query).await
    }

    async fn count(&self, coll: &str, query: &IndexQuery) -> StoreResult<u64> {
        self.0.count(coll, query).await
    }

    async fn collections(&self) -> StoreResult<Vec<String>> {
        self.0.collections().await
    }

    async fn ensure_index(&self, _: &str, _: IndexSpec) -> StoreResult<()> {
        Err(read_only())
    }

    async fn drop_index(&self, _: &str, _: &str) -> StoreResult<()> {
        Err(read_only())
    }

    async fn indexes(&self, coll: &str) -> StoreResult<Vec<IndexSpec>> {
        Ok(self.0.indexes(coll))
    }
}

/// Sets its flag when dropped: the future waiting for a read is gone.
struct Abandon(Arc<AtomicBool>);

impl Drop for Abandon {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::Store;
    use crate::embedded::scan::check_abandoned;

    /// A read nobody waits for any more (its deadline passed) stops at its
    /// next look, and one not started yet never starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_abandoned_read_stops() {
        let dir = tempfile::tempdir().unwrap();
        let store = super::super::EmbeddedStore::open(dir.path()).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let looking = store.reader.read(move |_, _| -> StoreResult<()> {
            let started = std::time::Instant::now();
            loop {
                if let Err(e) = check_abandoned() {
                    tx.send(started.elapsed()).unwrap();
                    return Err(e);
                }
                assert!(started.elapsed() < Duration::from_secs(10), "never told");
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        assert!(tokio::time::timeout(Duration::from_millis(50), looking).await.is_err(), "it runs until abandoned");
        let ran = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(5))).await.unwrap();
        assert!(ran.expect("the read stopped once abandoned") < Duration::from_secs(1));
        // Outside a read there is nothing to abandon.
        assert!(check_abandoned().is_ok());
        store.close().await.unwrap();
    }
}
