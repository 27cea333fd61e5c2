//! Helpers over any [`Store`]: writes one after another, a page of a scan,
//! reads over collections within a budget, purges.

use crate::{Durability, Record, Scan, Store, StoreError, StoreResult, Write, report_unreadable};

/// [`Store::write_in_order`] as one write after another: how many were
/// applied before the first that was not.
pub async fn write_each<S: Store + ?Sized>(
    store: &S,
    writes: Vec<(&str, Write<'_>)>,
    durability: Durability,
) -> StoreResult<usize> {
    let mut applied = 0;
    for (coll, write) in writes {
        if !store.write(coll, write, durability).await? {
            break;
        }
        applied += 1;
    }
    Ok(applied)
}

/// One page of an `_id`-ordered `scan` of `coll`: up to `limit` records
/// after id `after`, decoded, and the id to continue after when more exist.
/// A record `decode` refuses is left out of the page and reported.
pub async fn page<T>(
    store: &dyn Store,
    coll: &str,
    scan: Scan,
    after: Option<&str>,
    limit: usize,
    decode: impl Fn(Record) -> StoreResult<T>,
) -> StoreResult<(Vec<T>, Option<String>)> {
    let mut records = store.scan(coll, scan.after(after).limit(limit + 1)).await?;
    let next = if records.len() > limit {
        records.truncate(limit);
        records.last().and_then(record_id).map(str::to_owned)
    } else {
        None
    };
    let decoded = records.into_iter().filter_map(|record| {
        let id = record_id(&record).unwrap_or_default().to_owned();
        decode(record).map_err(|e| report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}")))).ok()
    });
    Ok((decoded.collect(), next))
}

/// Collections [`get_all_within`] reads side by side.
const READS_AT_ONCE: usize = 8;

/// The records of `wanted` (ids by collection; missing ones are left out),
/// read [`READS_AT_ONCE`] collections side by side, each within an equal
/// share of what is left of `budget` bytes as stored; a collection that its
/// share cut short is read on in a later round. `None` when the records
/// hold more than `budget` in all: the read stops there, having held at
/// most `budget` and one record per collection of a round.
pub async fn get_all_within<'c>(
    store: &(impl Store + ?Sized),
    wanted: impl IntoIterator<Item = (&'c str, Vec<String>)>,
    budget: usize,
) -> StoreResult<Option<Vec<(&'c str, Record)>>> {
    let mut queue: std::collections::VecDeque<(&'c str, Vec<String>)> = wanted.into_iter().collect();
    let (mut spent, mut out) = (0usize, Vec::new());
    while !queue.is_empty() {
        if spent > budget {
            return Ok(None);
        }
        let round: Vec<(&'c str, Vec<String>)> = queue.drain(..queue.len().min(READS_AT_ONCE)).collect();
        // At least one byte: a budget spent exactly still finds out
        // whether anything is left.
        let share = ((budget - spent) / round.len()).max(1);
        let reads = round.iter().map(|(coll, ids)| store.get_many_within(coll, ids, share));
        let found = futures::future::try_join_all(reads).await?;
        for ((coll, ids), found) in round.into_iter().zip(found) {
            spent = spent.saturating_add(found.bytes);
            if found.cut {
                let got: std::collections::HashSet<&str> = found.records.iter().filter_map(record_id).collect();
                let left: Vec<String> = ids.into_iter().filter(|id| !got.contains(id.as_str())).collect();
                queue.push_back((coll, left));
            }
            out.extend(found.records.into_iter().map(|record| (coll, record)));
        }
    }
    Ok((spent <= budget).then_some(out))
}

/// Records one background step reads or deletes at a time: recovery's
/// scans, the lock sweep, purges. Steps repeat batches while there is work.
pub const BATCH: usize = 200;

/// Delete every record of `coll` that `scan` finds (it must be bounded so
/// that what it finds stays found: a cutoff), in batches of [`BATCH`] while
/// batches come back full. Each delete is conditional on the scan's own
/// filter, so a record changed meanwhile is kept. Returns how many went.
pub async fn purge(store: &dyn Store, coll: &str, scan: Scan) -> StoreResult<usize> {
    let (filter, _) = scan.to_query();
    let mut purged = 0;
    loop {
        let batch = store.scan(coll, scan.clone().limit(BATCH)).await?;
        let full = batch.len() == BATCH;
        // The deletes of a batch go together: one group commit (or one
        // round of requests) for all of them, not one each.
        // Unsynced: a purge lost in a crash is done again by the next pass.
        let unsynced = store.unsynced();
        let deletes = batch.iter().filter_map(record_id).map(|id| unsynced.delete(coll, id, filter.clone()));
        let mut deleted = 0;
        for done in futures::future::join_all(deletes).await {
            deleted += usize::from(done?);
        }
        purged += deleted;
        // A full batch none of which could go would be read again forever.
        if !full || deleted == 0 {
            return Ok(purged);
        }
    }
}

/// The `_id` of a record, when it is a string.
pub fn record_id(record: &Record) -> Option<&str> {
    record.get_str("_id").ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{doc, memory, scans};

    /// Records of `n` bytes each as stored, `count` of them in `coll`.
    async fn fill(store: &memory::MemoryStore, coll: &str, count: usize) -> usize {
        let mut size = 0;
        for i in 0..count {
            let record = doc! {"_id": format!("{coll}-{i}"), "pad": "x".repeat(100)};
            size = mongodb::bson::to_vec(&record).expect("bson").len();
            store.insert(coll, record).await.expect("insert");
        }
        size
    }

    fn ids(coll: &'static str, count: usize) -> (&'static str, Vec<String>) {
        (coll, (0..count).map(|i| format!("{coll}-{i}")).collect())
    }

    #[tokio::test]
    async fn a_page_leaves_out_a_record_it_cannot_decode() {
        let store = memory::MemoryStore::default();
        fill(&store, "l", 4).await;
        let decode = |r: Record| match record_id(&r) {
            Some("l-1") => Err(StoreError::Internal("not a record of this list".into())),
            id => Ok(id.unwrap_or_default().to_owned()),
        };
        let (got, next) = page(&store, "l", scans::SUBSCRIPTIONS.scan(Vec::new()), None, 3, decode).await.unwrap();
        assert_eq!((got, next.as_deref()), (vec!["l-0".to_owned(), "l-2".into()], Some("l-2")));
    }

    #[tokio::test]
    async fn reads_over_collections_are_refused_exactly_past_their_budget() {
        let store = memory::MemoryStore::default();
        let names = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"];
        let mut size = 0;
        for (i, coll) in names.iter().enumerate() {
            size = fill(&store, coll, i + 1).await;
        }
        // 10 collections (two rounds), 55 records; one asks for a missing id.
        let mut wanted: Vec<(&str, Vec<String>)> = names.iter().enumerate().map(|(i, c)| ids(c, i + 1)).collect();
        wanted[0].1.push("nobody".into());
        let read = |budget| get_all_within(&store, wanted.clone(), budget);
        let all = read(55 * size).await.unwrap().expect("exactly the budget is within it");
        assert_eq!(all.len(), 55);
        let mut got: Vec<String> = all.iter().map(|(c, r)| format!("{c}:{}", record_id(r).unwrap())).collect();
        got.sort();
        got.dedup();
        assert_eq!(got.len(), 55);
        assert!(read(55 * size - 1).await.unwrap().is_none(), "one byte short");
        assert!(read(1).await.unwrap().is_none());
        // One collection whose share is cut (one of 9 records against the
        // share of two collections) is read on: all within the budget.
        let uneven = vec![ids("i", 9), ids("a", 1)];
        let found = get_all_within(&store, uneven.clone(), 10 * size).await.unwrap().expect("within");
        assert_eq!(found.len(), 10);
        assert!(get_all_within(&store, uneven, 10 * size - 1).await.unwrap().is_none());
        assert_eq!(
            get_all_within(&store, Vec::<(&str, Vec<String>)>::new(), 0).await.unwrap().map(|r| r.len()),
            Some(0)
        );
    }
}
