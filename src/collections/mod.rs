//! Collections (docs/design.md §5): per-collection TTL policies, live counts, and
//! the TTL sweeper ([`ttl`]).
//!
//! A user collection's record in `_collections` holds its TTL policy and
//! its live count. The count is kept, never scanned: it is the sum of the
//! collection's change events (`document.created` +1, `document.deleted`
//! and `document.expired` −1), folded from the event log in position
//! order. Every committed change leaves exactly one event at one position,
//! and the fold applies a position to a collection's count only if it lies
//! after the position that count was last folded to (`at`, moved with a
//! compare-and-set), so counts are exact however many instances fold at
//! once and wherever one of them stopped. The log position up to which
//! every count is folded is kept in [`events::COUNTED`]; the log's purge
//! never passes it. Readers fold up to the log's head before they answer,
//! so a count includes every change whose event is logged.

pub(crate) mod ttl;

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::clock::Clock;
use crate::events::{self, EventType, Log, ReadError, counter};
use crate::store::scans::{COLLECTIONS as BY_NAME, DOCS_LIVE};
use crate::store::shape::{any, fields};
use crate::store::{Bson, DateTime, DynStore, Record, StoreError, StoreResult, Update, record_id};

/// The collection of collection records.
pub(crate) const COLLECTIONS: &str = "_collections";

/// Positions one fold step reads at most.
const FOLD_BATCH: usize = 5000;
/// A fold this many positions long logs its progress.
const LOG_PROGRESS_EVERY: u64 = 100_000;

/// A TTL policy: a maximum age, a maximum count, or both (seed 004's
/// MaxTime and MaxCount).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Documents created longer ago than this many seconds expire.
    pub max_age_seconds: Option<u64>,
    /// Only this many of the newest live documents are kept.
    pub max_count: Option<u64>,
}

impl Policy {
    /// Whether the policy sets no limit at all.
    pub fn is_empty(&self) -> bool {
        self.max_age_seconds.is_none() && self.max_count.is_none()
    }

    fn stored(self) -> shapes::Ttl {
        let stored = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        shapes::Ttl { max_age_seconds: self.max_age_seconds.map(stored), max_count: self.max_count.map(stored) }
    }

    fn from_document(doc: &mongodb::bson::Document) -> Self {
        let field = |name| doc.get_i64(name).ok().and_then(|n| u64::try_from(n).ok());
        Self { max_age_seconds: field("max_age_seconds"), max_count: field("max_count") }
    }
}

/// The fields of a collection's record in [`COLLECTIONS`], as stored.
mod shapes {
    use serde::Serialize;

    use crate::store::DateTime;

    /// A TTL policy.
    #[derive(Serialize, Clone, Copy)]
    pub(super) struct Ttl {
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_age_seconds: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub max_count: Option<i64>,
    }

    /// A collection's record: its count folded to log position `at`, and
    /// its policy (`expiring` while it has one), set at `policy_at`.
    #[derive(Serialize)]
    pub(super) struct Collection<'a> {
        #[serde(rename = "_id")]
        pub name: &'a str,
        pub count: i64,
        pub at: i64,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub policy_at: Option<DateTime>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub ttl: Option<Ttl>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pub expiring: Option<bool>,
    }

    /// A policy set at `policy_at`.
    #[derive(Serialize)]
    pub(super) struct PolicySet {
        pub ttl: Ttl,
        pub expiring: bool,
        pub policy_at: DateTime,
    }

    /// A policy removed at `policy_at` (with `ttl` and `expiring` unset).
    #[derive(Serialize)]
    pub(super) struct PolicyAt {
        pub policy_at: DateTime,
    }

    /// A count folded to log position `at`.
    #[derive(Serialize)]
    pub(super) struct Folded {
        pub count: i64,
        pub at: i64,
    }

    /// Folded to log position `at`.
    #[derive(Serialize)]
    pub(super) struct FoldedTo {
        pub at: i64,
    }
}

/// A user collection: its policy and its number of live documents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Collection {
    pub name: String,
    /// `None`: documents never expire.
    pub ttl: Option<Policy>,
    pub count: u64,
}

impl Collection {
    fn from_record(rec: &Record) -> Self {
        Self {
            name: record_id(rec).unwrap_or_default().to_owned(),
            ttl: rec.get_document("ttl").ok().map(Policy::from_document).filter(|p| !p.is_empty()),
            count: u64::try_from(rec.get_i64("count").unwrap_or(0)).unwrap_or(0),
        }
    }
}

/// Policies and counts of user collections.
pub struct Collections {
    store: DynStore,
    log: Arc<Log>,
    clock: Clock,
    /// Held by this process's one fold at a time.
    folding: tokio::sync::Mutex<()>,
}

impl Collections {
    pub fn new(store: DynStore, log: Arc<Log>, clock: Clock) -> Arc<Self> {
        Arc::new(Self { store, log, clock, folding: tokio::sync::Mutex::new(()) })
    }

    pub fn store(&self) -> &DynStore {
        &self.store
    }

    /// Collection `name` as it is now (a collection nothing was ever
    /// written to has no policy and no documents). Its count includes
    /// every change this instance answered before.
    pub async fn get(&self, name: &str) -> StoreResult<Collection> {
        self.log.settle().await;
        self.count_changes().await?;
        Ok(self.store.get(COLLECTIONS, name).await?.map_or_else(
            || Collection { name: name.to_owned(), ttl: None, count: 0 },
            |rec| Collection::from_record(&rec),
        ))
    }

    /// Collections with documents (or once with documents) or a policy, by
    /// name after `after`, and the name to continue after.
    pub async fn list(&self, after: Option<&str>, limit: usize) -> StoreResult<(Vec<Collection>, Option<String>)> {
        self.log.settle().await;
        self.count_changes().await?;
        crate::store::page(self.store.as_ref(), COLLECTIONS, BY_NAME.scan(Vec::new()), after, limit, |rec| {
            Ok(Collection::from_record(&rec))
        })
        .await
    }

    /// [`Self::list`] among `names` (sorted, each once): those that exist,
    /// read one by one, so the name to continue after is always one of
    /// them. A key limited to some collections pages through its own this
    /// way: a page of all collections, filtered, would hand it a cursor
    /// naming another's.
    pub async fn list_among(
        &self,
        names: &[String],
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<(Vec<Collection>, Option<String>)> {
        self.log.settle().await;
        self.count_changes().await?;
        let mut items: Vec<Collection> = Vec::new();
        for name in names.iter().filter(|n| after.is_none_or(|a| n.as_str() > a)) {
            if items.len() == limit {
                let last = items.last().map(|c| c.name.clone());
                return Ok((items, last));
            }
            if let Some(rec) = self.store.get(COLLECTIONS, name).await? {
                items.push(Collection::from_record(&rec));
            }
        }
        Ok((items, None))
    }

    /// Set (or with `None`, remove) `name`'s TTL policy; synced
    /// (docs/design.md §1). Every instance's sweeper applies it from its next pass.
    pub async fn set_policy(&self, name: &str, policy: Option<Policy>) -> StoreResult<Collection> {
        let policy = policy.filter(|p| !p.is_empty());
        let now = self.clock.now();
        let update = match policy {
            Some(p) => Update::fields(&shapes::PolicySet { ttl: p.stored(), expiring: true, policy_at: now }),
            None => Update {
                set: fields(&shapes::PolicyAt { policy_at: now }),
                unset: vec!["ttl".into(), "expiring".into()],
            },
        };
        loop {
            if self.store.update(COLLECTIONS, name, any(), update.clone()).await? {
                break;
            }
            // No record yet: one with no count folded into it (`at` 0), so
            // the fold adds every change of the collection it reads.
            let rec = shapes::Collection {
                name,
                count: 0,
                at: 0,
                policy_at: Some(now),
                ttl: policy.map(Policy::stored),
                expiring: policy.map(|_| true),
            };
            if self.store.insert(COLLECTIONS, fields(&rec)).await? {
                break;
            }
        }
        self.get(name).await
    }

    /// Fold every change logged since the last fold into the counts, up to
    /// the log's head (what readers may see of it: durable, contiguous).
    pub async fn count_changes(&self) -> StoreResult<()> {
        let _one = self.folding.lock().await;
        let mut progress = None;
        loop {
            let from = self.counted().await?;
            // A long way behind (a first start over a long log): say how far.
            let start = *progress.get_or_insert(from);
            if from - start >= LOG_PROGRESS_EVERY && (from - start) % LOG_PROGRESS_EVERY < FOLD_BATCH as u64 {
                tracing::info!(position = from, counted = from - start, "counting collections' changes");
            }
            // From the store: what the log's readers read lately ends
            // where their last read did, and the fold must reach the head.
            let batch = match self.log.read_fresh(from, FOLD_BATCH).await {
                Ok(batch) => batch,
                Err(ReadError::Store(err)) => return Err(err),
                Err(err @ ReadError::Expired { .. }) => {
                    // The purge keeps what is not counted: this is a log
                    // purged by a gateway that did not count.
                    return Err(StoreError::Internal(format!("collection counts are behind the event log: {err}")));
                }
            };
            if batch.next == from {
                return Ok(());
            }
            let mut changes: BTreeMap<&str, Vec<(u64, i64)>> = BTreeMap::new();
            for ready in &batch.events {
                let event = &ready.event;
                let delta = match event.kind {
                    EventType::Created => 1,
                    EventType::Deleted | EventType::Expired => -1,
                    EventType::Updated | EventType::TransactionCommitted | EventType::ViewedAs => continue,
                };
                if let Some(coll) = event.collection.as_deref() {
                    changes.entry(coll).or_default().push((event.seq, delta));
                }
            }
            for (coll, changes) in changes {
                self.add(coll, &changes, batch.next).await?;
            }
            // Unsynced: counts lost in a crash are folded again from an
            // earlier position, and each count skips what it already has.
            let next = batch.next;
            self.store
                .unsynced()
                .update(events::STATE, events::COUNTED, counter::below(next), counter::set(next))
                .await?;
            if !batch.more {
                return Ok(());
            }
        }
    }

    /// Add to `coll`'s count the `changes` (position, ±1) after the
    /// position its count was folded to, and move that to `upto`.
    async fn add(&self, coll: &str, changes: &[(u64, i64)], upto: u64) -> StoreResult<()> {
        let unsynced = self.store.unsynced();
        loop {
            match self.store.get(COLLECTIONS, coll).await? {
                Some(rec) => {
                    let at = rec.get_i64("at").unwrap_or(0);
                    if at >= position_i64(upto) {
                        return Ok(());
                    }
                    let delta: i64 =
                        changes.iter().filter(|(seq, _)| position_i64(*seq) > at).map(|(_, delta)| delta).sum();
                    let count = rec.get_i64("count").unwrap_or(0) + delta;
                    let set = Update::fields(&shapes::Folded { count, at: position_i64(upto) });
                    if unsynced.update(COLLECTIONS, coll, fields(&shapes::FoldedTo { at }), set).await? {
                        return Ok(());
                    }
                }
                None => {
                    let count: i64 = changes.iter().map(|(_, delta)| delta).sum();
                    if unsynced.insert(COLLECTIONS, counted(coll, count, upto)).await? {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// The position every count is folded to. On a store that has never
    /// counted: 0 when the log still holds every change since its start,
    /// else the log's head after counting each collection's live documents
    /// once, by a scan (a store whose log was purged before it counted).
    async fn counted(&self) -> StoreResult<u64> {
        if let Some(rec) = self.store.get(events::STATE, events::COUNTED).await? {
            return Ok(counter::read(&rec));
        }
        let floor = self.log.floor().await?;
        let start = if floor == 0 { 0 } else { self.count_by_scan().await? };
        if !self.store.unsynced().insert(events::STATE, counter::record(events::COUNTED, start)).await? {
            // Another instance started counting first: go on from its.
            return Box::pin(self.counted()).await;
        }
        Ok(start)
    }

    /// Count every user collection's live documents by scanning them, as
    /// of the log's head read first; returns that head.
    async fn count_by_scan(&self) -> StoreResult<u64> {
        let head = self.log.head().await?;
        tracing::warn!(
            head,
            "the event log was purged before collections were counted: counting live documents by a scan, once"
        );
        let names: Vec<String> = self.store.collections().await?.into_iter().filter(|c| !c.starts_with('_')).collect();
        for (i, coll) in names.iter().enumerate() {
            let mut count = 0_i64;
            let mut after: Option<String> = None;
            loop {
                let scan =
                    DOCS_LIVE.scan(vec![Bson::Boolean(false)]).after(after.as_deref()).limit(crate::store::BATCH);
                let records = self.store.scan(coll, scan).await?;
                // A placeholder of an uncommitted insert (version 0) is not live.
                count += records
                    .iter()
                    .filter(|r| r.get_document("_meta").and_then(|m| m.get_i64("v")).unwrap_or(0) > 0)
                    .count() as i64;
                match records.last().and_then(record_id) {
                    Some(last) if records.len() == crate::store::BATCH => after = Some(last.to_owned()),
                    _ => break,
                }
            }
            tracing::info!(collection = %coll, count, progress = format!("{}/{}", i + 1, names.len()), "counted");
            let set = Update::fields(&shapes::Folded { count, at: position_i64(head) });
            if !self.store.unsynced().update(COLLECTIONS, coll, any(), set).await? {
                self.store.unsynced().insert(COLLECTIONS, counted(coll, count, head)).await?;
            }
        }
        Ok(head)
    }
}

fn position_i64(seq: u64) -> i64 {
    i64::try_from(seq).unwrap_or(i64::MAX)
}

/// A collection's first record: `count` live documents as of log position
/// `at`, no policy.
fn counted(name: &str, count: i64, at: u64) -> Record {
    fields(&shapes::Collection { name, count, at: position_i64(at), policy_at: None, ttl: None, expiring: None })
}

/// When `policy`'s maximum age makes a document created before it due, as
/// of `now`; `None` without a maximum age.
pub(crate) fn age_cutoff(policy: &Policy, now: DateTime) -> Option<DateTime> {
    let age = policy.max_age_seconds?;
    let ms = i64::try_from(age.saturating_mul(1000)).unwrap_or(i64::MAX);
    Some(DateTime::from_millis(now.timestamp_millis().saturating_sub(ms)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::EventsConfig;
    use crate::store::Write;
    use crate::store::memory::MemoryStore;

    /// A log over a fresh store, the store to write through, and
    /// `instances` fold states sharing it (as gateways do).
    fn setup(instances: usize) -> (DynStore, Vec<Arc<Collections>>) {
        let store: DynStore = Arc::new(MemoryStore::default());
        let tap = crate::events::Tap::default();
        let tapped: DynStore = Arc::new(tap.over(store));
        let log = Log::new(Arc::clone(&tapped), tap, EventsConfig::default());
        let folds =
            (0..instances).map(|_| Collections::new(Arc::clone(&tapped), Arc::clone(&log), Clock::System)).collect();
        (tapped, folds)
    }

    /// Append the event of `kind` for document `id` of `coll` at `v`.
    async fn change(store: &DynStore, kind: EventType, coll: &str, id: &str, v: i64) {
        let doc = crate::document::StoredDoc::new_live(id.into(), Default::default(), 1, v, DateTime::now());
        let mut rec = events::model::document_event(kind, coll, &doc, None, None, None, DateTime::now());
        rec.insert("logged_at", DateTime::now());
        assert!(store.write(events::EVENTS, Write::Append(rec), crate::store::Durability::Unsynced).await.unwrap());
    }

    async fn count(c: &Collections, coll: &str) -> u64 {
        c.get(coll).await.unwrap().count
    }

    #[tokio::test]
    async fn counts_add_creations_and_subtract_deletions_and_expiries() {
        let (store, folds) = setup(1);
        let c = &folds[0];
        for i in 0..5 {
            change(&store, EventType::Created, "a", &format!("d{i}"), 1).await;
        }
        change(&store, EventType::Updated, "a", "d0", 2).await;
        change(&store, EventType::Deleted, "a", "d1", 2).await;
        change(&store, EventType::Expired, "a", "d2", 2).await;
        change(&store, EventType::Created, "b", "x", 1).await;
        assert_eq!((count(c, "a").await, count(c, "b").await, count(c, "none").await), (3, 1, 0));
        let (list, next) = c.list(None, 10).await.unwrap();
        assert_eq!(list.iter().map(|c| (c.name.as_str(), c.count)).collect::<Vec<_>>(), [("a", 3), ("b", 1)]);
        assert!(next.is_none());
    }

    /// A fold whose last step (moving the shared position) was lost, as in
    /// a crash, is done again without counting anything twice; and so is
    /// one that stopped after some collections only.
    #[tokio::test]
    async fn a_fold_done_again_counts_nothing_twice() {
        let (store, folds) = setup(1);
        let c = &folds[0];
        for i in 0..4 {
            change(&store, EventType::Created, "a", &format!("d{i}"), 1).await;
            change(&store, EventType::Created, "b", &format!("d{i}"), 1).await;
        }
        c.count_changes().await.unwrap();
        // The position goes back to 2; collection "a" also lost its fold.
        assert!(store.update(events::STATE, events::COUNTED, any(), counter::set(2)).await.unwrap());
        let lost = Update::fields(&shapes::Folded { count: 1, at: 2 });
        assert!(store.update(COLLECTIONS, "a", any(), lost).await.unwrap());
        change(&store, EventType::Deleted, "b", "d0", 2).await;
        assert_eq!((count(c, "a").await, count(c, "b").await), (4, 3));
    }

    /// Instances folding at once, while changes go on, end with the same,
    /// exact counts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn instances_folding_at_once_count_each_change_once() {
        let (store, folds) = setup(3);
        let writer = {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for i in 0..300 {
                    let coll = ["a", "b", "c"][i % 3];
                    change(&store, EventType::Created, coll, &format!("d{i}"), 1).await;
                    if i % 4 == 0 {
                        change(&store, EventType::Deleted, coll, &format!("d{i}"), 2).await;
                    }
                    if i % 10 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            })
        };
        let folders: Vec<_> = folds
            .iter()
            .map(|c| {
                let c = Arc::clone(c);
                tokio::spawn(async move {
                    for _ in 0..50 {
                        c.count_changes().await.unwrap();
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        writer.await.unwrap();
        for f in folders {
            f.await.unwrap();
        }
        for c in &folds {
            // 100 each, a quarter of them deleted.
            assert_eq!((count(c, "a").await, count(c, "b").await, count(c, "c").await), (75, 75, 75));
        }
    }

    #[test]
    fn a_policy_round_trips_and_gives_the_age_cutoff() {
        let p = Policy { max_age_seconds: Some(60), max_count: None };
        assert_eq!(Policy::from_document(&fields(&p.stored())), p);
        assert_eq!(age_cutoff(&p, DateTime::from_millis(100_000)), Some(DateTime::from_millis(40_000)));
        assert_eq!(age_cutoff(&Policy { max_age_seconds: None, max_count: Some(3) }, DateTime::now()), None);
        assert!(Policy::default().is_empty());
    }
}
