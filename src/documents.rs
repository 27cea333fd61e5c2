//! Single-document reads and writes of user documents (docs/design.md §2);
//! their stored shape and the rules for names and changes are
//! [`crate::document`]'s.
//!
//! A single-document write is one compare-and-set filtered on
//! `{_meta.txn: null, _meta.v: <version read>}`; when it meets a
//! transaction's lock it settles it (finishing committed holders, clearing
//! dead ones) or waits up to `lock_wait` for a live one.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};

use crate::actor::Actor;
use crate::clock::Clock;
use crate::document::rules::{self, Invalid, Patch};
use crate::document::{Live, PageItem, StagedOp, StoredDoc, StoredLive, StoredView, View};
use crate::events::{self, EventType};
use crate::follow_ups::SETTLE_WAIT;
use crate::indexes::{Indexes, Refusal};
use crate::metrics::Metrics;
use crate::store::DynStore;
use crate::store::scans::{DOCS_LIVE, DOCS_STAGED};
use crate::store::{Bson, DateTime, Document, Durability, PAGE_BYTES, StoreError, Write};
use crate::txn::locks::{Locks, Settled};
use crate::txn::record::{TXNS, TxnRecord};
use mongodb::bson::RawDocumentBuf;

#[derive(Debug, thiserror::Error)]
pub enum DocError {
    #[error(transparent)]
    Invalid(#[from] Invalid),
    #[error("document not found")]
    NotFound,
    #[error("document was deleted")]
    Deleted { version: i64, deleted_at: Option<DateTime> },
    #[error("a document with this id already exists")]
    AlreadyExists { version: i64 },
    #[error("version conflict: expected {expected}, document is at {actual}")]
    VersionConflict { expected: i64, actual: i64 },
    #[error("document is locked by transaction {holder}")]
    Locked { holder: String, retry_after: Duration },
    #[error("{0}")]
    InvalidChange(String),
    #[error("the value of unique index {index} is held by document {existing}")]
    Duplicate { index: String, existing: String },
    /// Refused by the collection's rules (docs/guides/rules.md).
    #[error("{detail}")]
    Denied { detail: String, pointer: Option<String> },
    /// The document the write would produce does not satisfy its
    /// collection's schema (docs/guides/validation.md).
    #[error("{0}")]
    Schema(crate::schemas::Refusal),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<Refusal> for DocError {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Rule(why) => DocError::InvalidChange(why),
            Refusal::Duplicate(dup) => DocError::Duplicate { index: dup.index, existing: dup.existing },
            Refusal::Store(err) => err.into(),
        }
    }
}

/// A judge of a change ([`Documents::change`]): the document's data as
/// read, and (once computed) the data it would have, which it may amend.
pub(crate) type Guard<'a> = &'a (dyn Fn(&Document, Option<&mut Document>) -> Result<(), DocError> + Sync);

/// A change to one existing document.
#[derive(Debug, Clone)]
pub(crate) enum Change {
    Replace { data: Document, sv: Option<i64> },
    Patch { patch: Patch, sv: Option<i64> },
    Merge { patch: Map<String, Value>, sv: Option<i64> },
    Delete,
}

/// The result of a successful write.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Written {
    Live(Live),
    Deleted { version: i64 },
}

pub(crate) use crate::document::ReadAt;

/// Single-document reads and writes. Of the transaction protocol they
/// need only what to do about a lock they meet ([`Locks`]).
pub struct Documents {
    store: DynStore,
    locks: Arc<Locks>,
    /// Where a write's event goes on to the log after the answer.
    publisher: Arc<events::Publisher>,
    clock: Clock,
    metrics: Arc<Metrics>,
    /// How long a write waits for a live transaction's lock.
    lock_wait: Duration,
    /// The declared indexes, whose rule every write keeps.
    indexes: Arc<Indexes>,
    /// The collections' schemas, which every write's result satisfies.
    schemas: Arc<crate::schemas::Schemas>,
    /// Records lists and queries skipped as not documents (see
    /// [`Self::skip_unreadable`]).
    unreadable: Arc<std::sync::atomic::AtomicU64>,
}

const MAX_BACKOFF: Duration = Duration::from_millis(100);

/// When a write's event goes from the outbox to the log.
#[derive(Clone, Copy, PartialEq)]
enum Publish {
    /// Before the write returns, or the write returns the error: nobody
    /// waits for the answer (the TTL sweeper), and what comes next (its
    /// `max_count` cut) reads counts, which must include the expiry.
    Now,
    /// After the answer, queued behind the events of writes answered
    /// before ([`events::Publisher`]).
    AfterAnswer,
}

/// A document [`Documents::create`] makes: its id, data and schema version.
#[derive(Clone, Copy)]
struct NewDoc<'a> {
    id: &'a str,
    data: &'a Document,
    sv: i64,
}

impl Documents {
    pub(crate) fn new(
        store: DynStore,
        locks: Arc<Locks>,
        publisher: Arc<events::Publisher>,
        clock: Clock,
        metrics: Arc<Metrics>,
        lock_wait: Duration,
        (indexes, schemas): (Arc<Indexes>, Arc<crate::schemas::Schemas>),
    ) -> Self {
        Self { store, locks, publisher, clock, metrics, lock_wait, indexes, schemas, unreadable: Default::default() }
    }

    /// The collections' schemas, as this instance knows them.
    pub(crate) fn schemas(&self) -> &Arc<crate::schemas::Schemas> {
        &self.schemas
    }

    /// Skip and report a record a read of many met that cannot be read as
    /// a document (`err`, [`StoreError::Undecodable`]; other errors are
    /// handed back): the read goes on with the others.
    pub(crate) fn skip_unreadable(&self, err: StoreError) -> Result<(), StoreError> {
        match err {
            StoreError::Undecodable(_) => {
                self.unreadable.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                crate::store::report_unreadable(&err);
                Ok(())
            }
            other => Err(other),
        }
    }

    /// The count of records lists and queries skipped as not documents
    /// (the store counts those it cannot decode at all).
    pub(crate) fn unreadable(&self) -> Arc<std::sync::atomic::AtomicU64> {
        Arc::clone(&self.unreadable)
    }

    pub(crate) fn store(&self) -> &dyn crate::store::Store {
        self.store.as_ref()
    }

    fn now(&self) -> DateTime {
        self.clock.now()
    }

    async fn load(&self, coll: &str, id: &str) -> Result<Option<StoredDoc>, DocError> {
        match self.store().get(coll, id).await? {
            Some(rec) => Ok(Some(StoredDoc::from_record(rec)?)),
            None => Ok(None),
        }
    }

    /// What a reader sees: the last committed state. A document held by a
    /// committed transaction reads as that transaction's post-image; its
    /// roll-forward is finished in the background, never on the read path.
    pub async fn get(&self, coll: &str, id: &str) -> Result<View, DocError> {
        match self.load(coll, id).await? {
            None => Ok(View::NotFound),
            Some(doc) => self.view(doc, &mut HashMap::new()).await,
        }
    }

    /// What a reader sees of `doc` (a query's): see [`Documents::get`];
    /// `holders` remembers the transactions met (commit time or none).
    pub(crate) async fn view_of(
        &self,
        doc: StoredDoc,
        holders: &mut HashMap<String, Option<DateTime>>,
    ) -> Result<View, DocError> {
        self.view(doc, holders).await
    }

    /// `doc`, read in `snapshot` whose last log position is the answer's,
    /// as a reader sees it at that position: a document a transaction
    /// holds shows its holder's change when the snapshot holds the
    /// change's event, and its data from before the holder when the holder
    /// is not committed in the snapshot. `Err(holder)` when the holder is
    /// committed there but its change is not logged (a roll-forward on
    /// its way). `holders`: the holders' records looked up so far.
    pub(crate) async fn view_in(
        &self,
        snapshot: &dyn crate::store::Store,
        coll: &str,
        doc: StoredDoc,
        holders: &mut HashMap<String, Option<TxnRecord>>,
    ) -> Result<Result<View, TxnRecord>, DocError> {
        let Some(holder) = doc.meta.txn.clone() else { return Ok(Ok(doc.into_committed_view())) };
        if !holders.contains_key(&holder) {
            let rec = match snapshot.get(TXNS, &holder).await? {
                Some(rec) => Some(TxnRecord::from_record(rec)?),
                None => None,
            };
            holders.insert(holder.clone(), rec);
        }
        let Some(rec) = holders.get(&holder).and_then(Option::as_ref).filter(|r| r.status.is_committed()) else {
            return Ok(Ok(doc.into_committed_view()));
        };
        let forwarded = doc.rolled_forward(rec.committed_at.unwrap_or_else(|| self.now()));
        if forwarded.meta.v == doc.meta.v {
            // A check: nothing changes.
            return Ok(Ok(doc.into_committed_view()));
        }
        let event = crate::events::model::document_event_id(coll, &doc.id, forwarded.meta.v);
        if snapshot.get(crate::events::EVENTS, &event).await?.is_some() {
            Ok(Ok(forwarded.into_committed_view()))
        } else {
            Ok(Err(rec.clone()))
        }
    }

    /// [`Self::view_of`], read `at`.
    pub(crate) async fn view_at(
        &self,
        at: &ReadAt,
        doc: StoredDoc,
        holders: &mut HashMap<String, Option<DateTime>>,
    ) -> Result<View, DocError> {
        match at {
            ReadAt::Now => self.view(doc, holders).await,
            ReadAt::Pinned(_) => Ok(doc.into_committed_view()),
        }
    }

    async fn view(&self, doc: StoredDoc, holders: &mut HashMap<String, Option<DateTime>>) -> Result<View, DocError> {
        let Some(holder) = doc.meta.txn.clone() else { return Ok(doc.into_committed_view()) };
        if !holders.contains_key(&holder) {
            let committed_at = self.locks.committed_at(&holder).await?;
            holders.insert(holder.clone(), committed_at);
        }
        match holders.get(&holder).copied().flatten() {
            Some(at) => Ok(doc.rolled_forward(at).into_committed_view()),
            None => Ok(doc.into_committed_view()),
        }
    }

    /// Finish committed transactions `recs` now (see
    /// [`Locks::finish_committed`]), side by side, within `wait`: what kept
    /// one from finishing, if any did.
    pub(crate) async fn finish_committed(&self, recs: &[TxnRecord], wait: Duration) -> Result<(), StoreError> {
        let finishing = futures::future::join_all(recs.iter().map(|rec| self.locks.finish_committed(rec)));
        match tokio::time::timeout(wait, finishing).await {
            Ok(done) => done.into_iter().find_map(Result::err).map_or(Ok(()), Err),
            Err(_) => Err(StoreError::Unavailable(format!("finishing took longer than {} ms", wait.as_millis()))),
        }
    }

    /// Wait for the lock on `doc` to clear; `Ok(())` means read again.
    async fn wait_lock(
        &self,
        coll: &str,
        doc: &StoredDoc,
        deadline: tokio::time::Instant,
        backoff: &mut Duration,
    ) -> Result<(), DocError> {
        match self.locks.settle(coll, doc, None).await? {
            Settled::Retry => Ok(()),
            Settled::Busy { holder } => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    self.metrics.incr(&crate::metrics::CONFLICTS, "locked");
                    return Err(DocError::Locked { holder, retry_after: self.locks.lease() });
                }
                self.locks.wait_release(coll, &doc.id, (*backoff).min(left)).await;
                *backoff = (*backoff * 2).min(MAX_BACKOFF);
                Ok(())
            }
        }
    }

    fn deadline(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.lock_wait
    }

    /// Create a document. Over a tombstone the document is re-created and
    /// its version continues from the tombstone's.
    pub(crate) async fn create(
        &self,
        actor: &Actor,
        coll: &str,
        id: Option<String>,
        data: Document,
        sv: i64,
    ) -> Result<Live, DocError> {
        let id = id.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        // Checked first: a create (over a tombstone too) makes a new document.
        let mut warned = self.schemas.admit(coll, None, (&data, sv), &id).await?.map_err(DocError::Schema)?;
        let deadline = self.deadline();
        let mut backoff = Duration::from_millis(5);
        // The admission held across waits for a lock: checked again after
        // each, and its claims made again where the unique indexes changed
        // meanwhile (an index declared during the wait is then kept: a
        // build checks the documents a few seconds after its declaration,
        // sooner than a check made before a wait may be).
        let mut admitted = None;
        loop {
            let again = admitted.take();
            let this = self.indexes.admit(coll, &id, (None, Some(&data)), again).await.map_err(DocError::from)?;
            let new = NewDoc { id: &id, data: &data, sv };
            match self.create_claimed(actor, coll, new, deadline, &mut backoff).await {
                Ok(Some(live)) => {
                    this.settle(true).await;
                    if let Some(warned) = warned.take() {
                        warned.landed();
                    }
                    return Ok(live);
                }
                Ok(None) => admitted = Some(this),
                Err(e) => {
                    this.settle(false).await;
                    return Err(e);
                }
            }
        }
    }

    /// [`Self::create`] with its values claimed: `None` once it waited for
    /// a transaction's lock on the document (to be checked again).
    async fn create_claimed(
        &self,
        actor: &Actor,
        coll: &str,
        new: NewDoc<'_>,
        deadline: tokio::time::Instant,
        backoff: &mut Duration,
    ) -> Result<Option<Live>, DocError> {
        let NewDoc { id, data, sv } = new;
        loop {
            let at = self.now();
            let fresh = StoredDoc::new_live(id.to_owned(), data.clone(), sv, 1, at);
            if self.write_with_event(actor, coll, None, fresh.clone(), EventType::Created, Publish::AfterAnswer).await?
            {
                return Ok(Some(live(fresh)));
            }
            let Some(existing) = self.load(coll, id).await? else { continue };
            if existing.meta.txn.is_some() {
                self.wait_lock(coll, &existing, deadline, backoff).await?;
                return Ok(None);
            }
            let version = match existing.committed_view() {
                View::Live(l) => return Err(DocError::AlreadyExists { version: l.version }),
                View::Deleted { version, .. } => version,
                View::NotFound => 0,
            };
            let next = StoredDoc::new_live(id.to_owned(), data.clone(), sv, version + 1, at);
            let created = EventType::Created;
            if self.write_with_event(actor, coll, Some(&existing), next.clone(), created, Publish::AfterAnswer).await? {
                return Ok(Some(live(next)));
            }
        }
    }

    /// Write `next` over `current` as read (`None`: insert it where
    /// nothing is), as one compare-and-set that also stores its change
    /// event in the outbox; then, as `publish` says, move the event to the
    /// log and clear the outbox (docs/design.md §2). An outbox `current`
    /// still holds goes to the log first, so a document's events follow
    /// its versions. Synced: the answer depends on it. Where a chain of
    /// writes lands whole or not at all, the write and the event's append
    /// are one chain and the outbox is left out. `false`: the document
    /// changed since it was read.
    async fn write_with_event(
        &self,
        actor: &Actor,
        coll: &str,
        current: Option<&StoredDoc>,
        mut next: StoredDoc,
        kind: EventType,
        publish: Publish,
    ) -> Result<bool, DocError> {
        // A write under way until its event is logged or ticketed
        // (`FollowUps::quiesce` waits for it).
        let _writing = self.publisher.writing().await;
        let store = self.store();
        if let Some(cur) = current.filter(|c| c.meta.outbox.is_some()) {
            // Behind the events of writes answered before it, if it is
            // still queued here.
            self.publisher.flush(SETTLE_WAIT).await;
            events::publish_outbox(store, coll, cur, self.now()).await?;
        }
        let at = next.meta.updated_at.unwrap_or_else(|| self.now());
        let mut event = events::model::document_event(kind, coll, &next, None, actor.name(), actor.user(), at);
        if let Some(cur) = current
            && let Some(named) = self.publisher.named(coll).await?
        {
            events::model::keep_before(&mut event, &named, cur);
        }
        let write_of = |next: &StoredDoc| match current {
            None => Write::Insert(next.to_record()),
            Some(cur) => Write::Replace { id: &cur.id, filter: cur.unchanged_filter(None), record: next.to_record() },
        };
        if store.capabilities().atomic_chains {
            // The write and its event land together or not at all: no
            // outbox to fill and empty (docs/design.md §1).
            let mut logged = event;
            logged.insert("logged_at", self.now());
            let chain = vec![(coll, write_of(&next)), (events::EVENTS, Write::Append(logged))];
            return Ok(store.write_in_order(chain, Durability::Synced).await? > 0);
        }
        next.meta.outbox = Some(event);
        if !store.write(coll, write_of(&next), Durability::Synced).await? {
            return Ok(false);
        }
        match publish {
            // In the log before the write returns, or an error: a count
            // read next must never miss an expiry (it would expire more).
            Publish::Now => events::publish_outbox(store, coll, &next, self.now()).await?,
            Publish::AfterAnswer => {
                if self.publisher.publish(coll, next) {
                    // The queue is as long as it may be: wait for it.
                    self.publisher.flush(SETTLE_WAIT).await;
                }
            }
        }
        Ok(true)
    }

    /// Replace, patch or delete an existing document, optionally only at
    /// version `if_match`; `guard` (the collection's rules) judges the
    /// document as read (with `None`), before its version is compared,
    /// then the change (with the data it would have), which it may amend.
    pub(crate) async fn change(
        &self,
        actor: &Actor,
        coll: &str,
        id: &str,
        if_match: Option<i64>,
        change: &Change,
        guard: Option<Guard<'_>>,
    ) -> Result<Written, DocError> {
        let deadline = self.deadline();
        let mut backoff = Duration::from_millis(5);
        loop {
            let Some(doc) = self.load(coll, id).await? else { return Err(DocError::NotFound) };
            if doc.meta.txn.is_some() {
                // Judged as committed first: a document the caller may not
                // read is not found, never locked by a named transaction.
                if let (Some(guard), View::Live(live)) = (guard, doc.committed_view()) {
                    guard(&live.data, None)?;
                }
                self.wait_lock(coll, &doc, deadline, &mut backoff).await?;
                continue;
            }
            match doc.absent_view() {
                Some(View::Deleted { version, deleted_at }) => return Err(DocError::Deleted { version, deleted_at }),
                Some(_) => return Err(DocError::NotFound),
                None => {}
            }
            if let Some(guard) = guard {
                guard(&doc.data, None)?;
            }
            if let Some(expected) = if_match.filter(|v| *v != doc.meta.v) {
                self.metrics.incr(&crate::metrics::CONFLICTS, "version_conflict");
                return Err(DocError::VersionConflict { expected, actual: doc.meta.v });
            }
            let at = self.now();
            let mut next = apply_change(&doc, change, at)?;
            let deleting = matches!(change, Change::Delete);
            if let Some(guard) = guard.filter(|_| !deleting) {
                guard(&doc.data, Some(&mut next.data))?;
            }
            let warned = if deleting {
                None
            } else {
                // As the rules left it (a grant's `set` applied).
                let (before, after) = ((&doc.data, doc.meta.sv), (&next.data, next.meta.sv));
                self.schemas.admit(coll, Some(before), after, id).await?.map_err(DocError::Schema)?
            };
            let becomes = (!deleting).then_some(&next.data);
            let admitted = self.indexes.admit(coll, id, (Some(&doc.data), becomes), None).await?;
            let kind = if deleting { EventType::Deleted } else { EventType::Updated };
            let written =
                self.write_with_event(actor, coll, Some(&doc), next.clone(), kind, Publish::AfterAnswer).await;
            admitted.settle(matches!(written, Ok(true))).await;
            if written? {
                if let Some(warned) = warned {
                    warned.landed();
                }
                let version = next.meta.v;
                return Ok(match next.into_committed_view() {
                    View::Live(l) => Written::Live(l),
                    _ => Written::Deleted { version },
                });
            }
        }
    }

    /// Expire `doc` as read by the TTL sweeper: the same compare-and-set
    /// as a delete (so only if it is still unlocked and at the version
    /// read), leaving a tombstone and a `document.expired` event. A
    /// document a transaction holds, a tombstone or a placeholder is left
    /// alone. Synced, as every TTL delete (docs/design.md §1). `true` when it went.
    pub async fn expire(&self, coll: &str, doc: &StoredDoc) -> Result<bool, DocError> {
        if doc.meta.txn.is_some() || doc.absent_view().is_some() {
            return Ok(false);
        }
        let next = apply_change(doc, &Change::Delete, self.now())?;
        // As a delete: the values it held in unique indexes are given up
        // once the tombstone has landed.
        let admitted = self.indexes.admit(coll, &doc.id, (Some(&doc.data), None), None).await?;
        let went =
            self.write_with_event(&Actor::Gateway, coll, Some(doc), next, EventType::Expired, Publish::Now).await;
        admitted.settle(matches!(went, Ok(true))).await;
        went
    }

    /// Live documents in id order after `after`, and the cursor of the next
    /// page (`None` at the end). Read along two indexes merged by id: the
    /// documents that are not tombstones, and those with a staged insert (a
    /// tombstone a committed transaction is re-creating is live before its
    /// roll-forward). Tombstones are never read, however many there are.
    pub async fn list(
        &self,
        coll: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Live>, Option<String>), DocError> {
        let (items, next) = self.list_at(&ReadAt::Now, coll, after, limit).await?;
        let items = items.into_iter().map(PageItem::into_live).collect::<Result<_, _>>()?;
        Ok((items, next))
    }

    /// [`Self::list`], read `at`, each document no transaction holds as
    /// stored (see [`StoredLive::view`]).
    pub(crate) async fn list_at(
        &self,
        at: &ReadAt,
        coll: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<PageItem>, Option<String>), DocError> {
        let store = at.store(self.store());
        let mut items = Vec::with_capacity(limit);
        let mut holders = HashMap::new();
        let mut cursor = after.map(str::to_owned);
        let batch = (limit + 1).clamp(16, 1000);
        let mut bytes = 0;
        let id_of = |record: &RawDocumentBuf| record.get_str("_id").ok().map(str::to_owned);
        loop {
            let budget = PAGE_BYTES.saturating_sub(bytes).max(1);
            let live = DOCS_LIVE.query(Bson::Boolean(false), cursor.as_deref(), batch, budget);
            let staged = DOCS_STAGED.query(StagedOp::Insert.to_bson(), cursor.as_deref(), batch, budget);
            let (live, staged) = (store.query_raw(coll, &live).await?, store.query_raw(coll, &staged).await?);
            bytes += live.bytes + staged.bytes;
            // Both lists are complete up to the last id of one that is
            // full or cut short by its bytes.
            let horizon = [&live, &staged]
                .into_iter()
                .filter(|f| f.cut || f.records.len() == batch)
                .filter_map(|f| f.records.last().and_then(id_of))
                .min();
            let mut merged: Vec<(Option<String>, RawDocumentBuf)> =
                live.records.into_iter().chain(staged.records).map(|r| (id_of(&r), r)).collect();
            merged.sort_by(|a, b| a.0.cmp(&b.0));
            merged.dedup_by(|a, b| a.0 == b.0);
            for (id, rec) in merged {
                if horizon.as_deref().is_some_and(|h| id.as_deref().is_some_and(|id| id > h)) {
                    break;
                }
                let shown = match StoredLive::view(rec) {
                    StoredView::Live(stored) => {
                        cursor = Some(stored.id.clone());
                        Some(PageItem::Stored(stored))
                    }
                    StoredView::Hidden => {
                        cursor = id;
                        None
                    }
                    StoredView::Built(rec) => {
                        let doc = StoredDoc::from_raw(&rec);
                        match doc {
                            Ok(doc) => {
                                cursor = Some(doc.id.clone());
                                match self.view_at(at, doc, &mut holders).await? {
                                    View::Live(l) => Some(PageItem::Built(l)),
                                    _ => None,
                                }
                            }
                            Err(err) => {
                                // Not a document (another tool's record):
                                // skipped, and the list goes on past it.
                                self.skip_unreadable(err)?;
                                if id.is_some() {
                                    cursor = id;
                                }
                                None
                            }
                        }
                    }
                };
                if let Some(item) = shown {
                    if items.len() == limit {
                        // One more live document exists: there is a next page.
                        let last = items.last().map(|l: &PageItem| l.id().to_owned());
                        return Ok((items, last));
                    }
                    items.push(item);
                }
            }
            if horizon.is_none() {
                return Ok((items, None));
            }
            if bytes >= PAGE_BYTES {
                // The page holds its bytes: the next goes on after the last read.
                return Ok((items, cursor));
            }
        }
    }
}

fn live(doc: StoredDoc) -> Live {
    match doc.into_committed_view() {
        View::Live(l) => l,
        other => unreachable!("a freshly written document is live, got {other:?}"),
    }
}

/// The document after `change`, at version `v + 1`, unlocked.
fn apply_change(doc: &StoredDoc, change: &Change, at: DateTime) -> Result<StoredDoc, DocError> {
    let mut next = doc.clone();
    next.meta.v += 1;
    next.meta.updated_at = Some(at);
    match change {
        Change::Replace { data, sv } => {
            next.data = data.clone();
            next.meta.sv = sv.unwrap_or(next.meta.sv);
        }
        Change::Patch { patch, sv } => {
            next.data = patch.apply(&doc.data).map_err(DocError::InvalidChange)?;
            rules::check_data_size(&next.data, "/")?;
            next.meta.sv = sv.unwrap_or(next.meta.sv);
        }
        Change::Merge { patch, sv } => {
            next.data = rules::merge_patch(&doc.data, patch, "")?;
            rules::check_data_size(&next.data, "/")?;
            next.meta.sv = sv.unwrap_or(next.meta.sv);
        }
        Change::Delete => {
            next.data = Document::new();
            next.meta.deleted = true;
            next.meta.deleted_at = Some(at);
        }
    }
    Ok(next)
}

#[async_trait::async_trait]
impl crate::indexes::LiveData for Documents {
    async fn live_data(&self, coll: &str, id: &str) -> crate::store::StoreResult<Option<Document>> {
        match self.get(coll, id).await {
            Ok(View::Live(live)) => Ok(Some(live.data)),
            Ok(_) => Ok(None),
            Err(DocError::Store(err)) => Err(err),
            Err(err) => Err(crate::store::StoreError::Internal(format!("{coll}/{id} could not be read: {err}"))),
        }
    }
}
