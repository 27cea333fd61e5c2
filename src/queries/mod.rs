//! Queries and counts over declared indexes (docs/design.md §7): a page of
//! the live documents a filter matches, in a sort order, read along the
//! ready index that serves the query exactly ([`crate::query::plan`]), or
//! refused with the index that would serve it.
//!
//! A page reads its index entries and the documents they name, one more
//! than it returns (to know whether another page follows). Each document
//! read is shown as a reader sees it: one a committed transaction holds
//! shows that transaction's change; a transaction's uncommitted insert
//! (an entry of empty data) is not shown. Before it reads, a query waits
//! (bounded) for the roll-forwards of the transactions this instance
//! answered, so it sees every write whose 200 was sent.
//!
//! A page's (and a count's) `position` is exact: every change to the
//! collection logged at or before it is reflected, and none after it.
//!
//! Where the store has snapshots (the embedded store), the page and the
//! log's last position `H` are read in one snapshot ([`Queries::snapshot`]),
//! taken once this instance's answered work is in place, and checked to
//! hold no outbox in the collection and no transaction over it committed,
//! with events logged, but not rolled forward (one found is finished, and
//! another snapshot taken). Why the page is then exactly the log up to
//! `H`: the snapshot's index entries and records are those of one commit.
//! A change logged at or before `H` is in its records: a single write and
//! its event land in one commit (outboxes exist only where they cannot),
//! and a transaction whose events are logged is rolled forward there, by
//! the check. No change logged after `H` is reflected: every record's data
//! was written with its event or after it (a transaction logs its events
//! at its commit or before it releases a lock), and a document held by a
//! transaction whose events are not logged shows its data from before its
//! holder ([`ReadAt::Pinned`]); that holder was not answered before the
//! query began, or the answered work would not be in place. When no
//! snapshot passes, the read is bracketed instead:
//!
//! 1. the log's last position `H` is read once this instance's answered
//!    work is in place and every committed transaction over the
//!    collection is rolled forward (else `H` is capped below the first
//!    event of one still not rolled forward, and the page is only a lower
//!    bound: see [`Queries::settled_position`]);
//! 2. the page is read;
//! 3. no document of the collection holds an unlogged event (an outbox),
//!    no committed transaction over it is still not rolled forward, and
//!    then no event of the collection is logged after `H`.
//!
//! Why 3 proves that no change after `H` is reflected: a change is made
//! before its event is logged. A single write's document keeps its event
//! in its outbox until the event is logged; a transaction's events are
//! logged before any of its locks is released, and it is rolled forward
//! (no longer "committed") only after. So a change the read reflected is,
//! at step 3, either still an outbox or an unapplied transaction, or
//! logged before the log's position is read again, hence after `H` only
//! if step 3 sees it. When step 3 fails (or `H` was capped) the read is
//! made again, up to [`EXACT_READS`] times. The last is made *quiet*
//! ([`FollowUps::quiesce`]): no write of this instance is under way or
//! starts during it, and every follow-up of one is finished, so only
//! another instance's writes (or an expiry) can land during it; it is not
//! checked, and its `H` is a lower bound only when they did.
//!
//! Cursors are opaque: the values of the page's last entry in the
//! index's order fields, and its id. The next page starts strictly after
//! that entry, so a document present for the whole listing whose sort
//! values do not change is returned exactly once, whatever else is
//! written meanwhile. A cursor also holds a digest of its query (its
//! collection, the filter's conditions and the order the index is read
//! in): passed with another query, or to another collection, it is
//! refused rather than read as a position in an order it was not taken
//! in.

mod cursor;
mod project;

use std::collections::HashMap;
use std::sync::Arc;

use self::cursor::{Cursor, Forms, ID_ORDER, another_query, decode_cursor, encode_cursor};
use self::project::trim;

use crate::document::{PageItem, StagedOp, StoredDoc, StoredLive, StoredView, View};
use crate::documents::{DocError, Documents, ReadAt};
use crate::events::Log;
use crate::events::model::document_event_id;
use crate::follow_ups::{FollowUps, QUIET_WAIT, SETTLE_WAIT};
use crate::indexes::Indexes;
use crate::query::filter::Filter;
use crate::query::plan::{Plan, Planning, SortKey, Unserved};
use crate::store::scans::{DOCS_OUTBOX, DOCS_STAGED, TXNS_BY_COMMIT};
use crate::store::{Bound, Bson, Document, DynStore, IndexQuery, PAGE_BYTES, Store, StoreError};
use crate::txn::record::{Status, TXNS, TxnRecord};

/// How many times a page reads on when the documents it read are not
/// shown (uncommitted inserts, changed by a committed transaction).
const MAX_REFILLS: usize = 8;
/// Committed transactions not rolled forward a position considers at
/// most (they are rolled forward within moments of their commit).
const UNAPPLIED_SCAN: usize = 1000;
/// Reads a page or count makes, at most, for an exact position (each
/// one after the first follows writes to the collection during the one
/// before).
const EXACT_READS: usize = 3;
/// Snapshots a page or count takes, at most, for one holding no
/// transaction over its collection between its events and its
/// roll-forward (each such one is finished before the next).
const SNAPSHOTS: usize = 5;

/// Events after a read's position looked at for one of its collection;
/// more means the collection changed.
const CHANGES_SCAN: usize = 128;
/// Longest cursor taken.
pub(crate) const MAX_CURSOR: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub(crate) enum QueryError {
    /// No ready index serves the query.
    #[error("index required")]
    Unserved(Unserved),
    /// No ready index serves the query; none is declared that would, and
    /// `name` is free in the collection for the one that would.
    #[error("index required: {name} on {fields:?}")]
    Suggested { name: String, fields: Vec<String>, detail: String },
    /// No ready index serves the query; this declared one would, once
    /// ready (building), or would have (failed).
    #[error("index required: {} is {:?}", .index.name, .index.state)]
    NotReady { why: Unserved, index: Box<crate::indexes::Declaration> },
    /// The cursor is not one this query gave.
    #[error("{0}")]
    Cursor(String),
    #[error(transparent)]
    Doc(#[from] DocError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A query, validated.
#[derive(Debug, Clone, Default)]
pub(crate) struct Query {
    pub filter: Filter,
    pub sort: Vec<SortKey>,
    /// The data paths a page keeps (`None`: all of it).
    pub fields: Option<Vec<String>>,
    pub limit: usize,
    pub after: Option<String>,
}

/// One page: its documents, the cursor of the next (when more may
/// follow), and the log position it was read at.
#[derive(Debug)]
pub(crate) struct QueryPage {
    pub items: Vec<PageItem>,
    pub next: Option<String>,
    pub position: u64,
}

pub struct Queries {
    documents: Arc<Documents>,
    indexes: Arc<Indexes>,
    log: Arc<Log>,
    follow_ups: FollowUps,
}

impl Queries {
    pub(crate) fn new(documents: Arc<Documents>, indexes: Arc<Indexes>, log: Arc<Log>, follow_ups: FollowUps) -> Self {
        Self { documents, indexes, log, follow_ups }
    }

    /// Finish committed transactions `unapplied` over `coll` (bounded):
    /// whether all of them were.
    async fn finish(&self, coll: &str, unapplied: &[TxnRecord]) -> bool {
        match self.documents.finish_committed(unapplied, SETTLE_WAIT).await {
            Ok(()) => true,
            Err(err) => {
                tracing::warn!(collection = %coll, error = %err, "a query could not finish the committed transactions over its collection");
                false
            }
        }
    }

    /// A snapshot of the store in which a read of `coll` is exact at the
    /// snapshot's last log position, and that position (module docs): one
    /// in which no document of `coll` holds an outbox and no transaction
    /// over `coll` is committed, with events logged, but not rolled
    /// forward. Such a transaction found in a snapshot is finished here,
    /// and a new snapshot taken (up to [`SNAPSHOTS`]).
    ///
    /// `None` where the store has no snapshots (MongoDB), or where none
    /// passed: the read is then bracketed.
    async fn snapshot(&self, coll: &str) -> Result<Option<(DynStore, u64)>, QueryError> {
        let store = self.documents.store();
        if !store.capabilities().snapshots {
            return Ok(None);
        }
        // This instance's answered work in place: a transaction committed
        // in the snapshot whose events are not logged there was not answered
        // before the query began, and may be shown as before it.
        let settled = self.follow_ups.settle(SETTLE_WAIT).await;
        for _ in 0..SNAPSHOTS {
            let Some(snapshot) = store.snapshot().await? else { return Ok(None) };
            let at = snapshot.as_ref();
            if holds_outbox(at, coll).await? {
                return Ok(None);
            }
            let (mut unapplied, complete) = self.unapplied(at, coll).await?;
            if !complete {
                return Ok(None);
            }
            if settled && !unapplied.is_empty() {
                // Those with no event logged yet are shown as before them.
                let mut logged = Vec::with_capacity(unapplied.len());
                for rec in unapplied {
                    let Some(events) = member_events(&rec, coll) else { return Ok(None) };
                    if !Log::positions_in(at, &events).await?.is_empty() {
                        logged.push(rec);
                    }
                }
                unapplied = logged;
            }
            if unapplied.is_empty() {
                let head = Log::head_in(at).await?;
                return Ok(Some((snapshot, head)));
            }
            if !self.finish(coll, &unapplied).await {
                return Ok(None);
            }
        }
        Ok(None)
    }

    /// Wait (bounded) for this instance's answered work to be in place and
    /// finish (bounded) any committed transaction over `coll` still not
    /// rolled forward (another instance's, or a roll-forward slower than
    /// the wait: a query sees a transaction's writes once its 200 is sent,
    /// whoever sent it), then learn the position a read of `coll` made now
    /// is at: the log's last position, capped below the first event of any
    /// committed transaction over `coll` still not rolled forward after
    /// [`EXACT_READS`] such rounds (its documents' index entries may not
    /// have moved: a page read now could miss a document that newly
    /// matches though its event is in the log). Every change at or before
    /// the position is reflected in what is read after.
    ///
    /// Also whether the position is the log's last one (not capped): only
    /// then can the read made after it be exact.
    async fn settled_position(&self, coll: &str) -> Result<(u64, bool), QueryError> {
        self.follow_ups.settle(SETTLE_WAIT).await;
        let store = self.documents.store();
        let mut round = 1;
        // The log's last position first, then the committed transactions
        // over `coll` not rolled forward yet (a transaction missed that way
        // committed after `head`: its events are past it).
        let (head, unapplied) = loop {
            let head = self.log.head().await?;
            let (unapplied, _) = self.unapplied(store, coll).await?;
            if unapplied.is_empty() {
                return Ok((head, true));
            }
            if round == EXACT_READS || !self.finish(coll, &unapplied).await {
                break (head, unapplied);
            }
            round += 1;
        };
        let wanted: Vec<String> = unapplied.iter().filter_map(|rec| member_events(rec, coll)).flatten().collect();
        if wanted.is_empty() {
            return Ok((head, true));
        }
        // Their events are appended right after the commit: wait (bounded)
        // for those on their way.
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        loop {
            let found = self.log.positions_of(&wanted).await?;
            if found.len() == wanted.len() || tokio::time::Instant::now() >= deadline {
                let first = found.values().map(|(seq, _)| *seq).min();
                return Ok((first.map_or(head, |s| head.min(s.saturating_sub(1))), false));
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    /// Committed transactions not rolled forward yet that changed `coll`,
    /// read in `store`, and whether that is all of them: up to
    /// [`UNAPPLIED_SCAN`] of all such transactions are looked at, and a
    /// record that cannot be read is left out.
    async fn unapplied(&self, store: &dyn Store, coll: &str) -> Result<(Vec<TxnRecord>, bool), QueryError> {
        let committed = || TXNS_BY_COMMIT.scan(vec![Status::Committed.to_bson()]);
        // Usually there is none: one entry looked for first, a point read.
        if store.scan(TXNS, committed().limit(1)).await?.is_empty() {
            return Ok((Vec::new(), true));
        }
        let found = store.scan(TXNS, committed().limit(UNAPPLIED_SCAN)).await?;
        let mut complete = found.len() < UNAPPLIED_SCAN;
        let mut out = Vec::new();
        for rec in found {
            match TxnRecord::from_record(rec) {
                Ok(rec) if rec.members.iter().any(|m| m.collection == coll && m.op != StagedOp::Check) => out.push(rec),
                Ok(_) => {}
                Err(err) => {
                    complete = false;
                    tracing::warn!(error = %err, "a transaction record that cannot be read was left out of a query's position");
                }
            }
        }
        Ok((out, complete))
    }

    /// Step 3 of the bracket (module docs): nothing the read after
    /// position `head` may have reflected is logged after `head`.
    async fn unchanged_since(&self, coll: &str, head: u64) -> Result<bool, QueryError> {
        let store = self.documents.store();
        if holds_outbox(store, coll).await? || !self.unapplied(store, coll).await?.0.is_empty() {
            return Ok(false);
        }
        let now = self.log.head().await?;
        Ok(now == head || !self.log.changed(coll, head, now, CHANGES_SCAN).await?)
    }

    /// Read with `read` at a settled position until the read is exact
    /// (or [`EXACT_READS`] reads were made): its answer and position.
    async fn bracketed<T, F, Fut>(&self, coll: &str, mut read: F) -> Result<(T, u64), QueryError>
    where
        F: FnMut(u64) -> Fut,
        Fut: std::future::Future<Output = Result<T, QueryError>>,
    {
        for attempt in 1.. {
            // The last read is made with this instance's writes held
            // back: writes that keep landing here cannot make every read
            // inexact (another instance's still can).
            let quiet = if attempt == EXACT_READS { self.follow_ups.quiesce(QUIET_WAIT).await } else { None };
            let (position, settled) = self.settled_position(coll).await?;
            let answer = read(position).await?;
            // A position capped below a transaction not rolled forward is
            // read again too, as one a write landed after.
            if attempt >= EXACT_READS || (settled && self.unchanged_since(coll, position).await?) {
                if attempt >= EXACT_READS && quiet.is_none() {
                    tracing::debug!(collection = %coll, "a query's last read was made with this instance's writes going on: its position is a lower bound");
                }
                return Ok((answer, position));
            }
        }
        unreachable!("the loop returns by its last attempt")
    }

    /// The answer to a query of `coll` no ready index serves (`why`):
    /// with the declared index `plan` would take once ready, when there
    /// is one (building, or failed).
    pub(crate) async fn unserved(&self, coll: &str, why: Unserved, planning: Planning<'_>) -> QueryError {
        let detail = why.detail();
        let Unserved::Needs { fields, why: because } = why else { return QueryError::Unserved(why) };
        match self.indexes.declared(coll).await {
            Ok(declared) => {
                if let Some(index) = crate::indexes::pending(&declared, planning) {
                    let why = Unserved::Needs { fields, why: because };
                    return QueryError::NotReady { why, index: Box::new(index.clone()) };
                }
                // A name no declaration of the collection has (whatever its
                // state), so the suggestion can be PUT as it is.
                let name = crate::indexes::free_name(&fields, |name| declared.iter().any(|d| d.name == name));
                QueryError::Suggested { name, fields, detail }
            }
            // Only a hint: the answer stays what it is without it.
            Err(err) => {
                tracing::debug!(error = %err, "declared indexes not read for an index_required answer");
                QueryError::Unserved(Unserved::Needs { fields, why: because })
            }
        }
    }

    /// One page of `query` over collection `coll`.
    pub(crate) async fn page(&self, coll: &str, query: &Query) -> Result<QueryPage, QueryError> {
        // Planned before any snapshot is taken: an index ready now has all
        // its entries in it.
        let plan = if query.filter.paths.is_empty() && query.sort.is_empty() {
            None
        } else {
            let planning = Planning::Page { filter: &query.filter, sort: &query.sort };
            match self.indexes.plan(coll, planning).await? {
                Ok(plan) => Some(plan),
                Err(why) => return Err(self.unserved(coll, why, planning).await),
            }
        };
        if let Some((snapshot, position)) = self.snapshot(coll).await? {
            let at = ReadAt::Pinned(snapshot.as_ref());
            return self.read_page(coll, query, plan.as_ref(), at, position).await;
        }
        let read = |position| self.read_page(coll, query, plan.as_ref(), ReadAt::Now, position);
        let (page, _) = self.bracketed(coll, read).await?;
        Ok(page)
    }

    /// [`Self::page`] along `plan` (`None`: the id order), read once `at`,
    /// named `position`.
    async fn read_page(
        &self,
        coll: &str,
        query: &Query,
        plan: Option<&Plan>,
        at: ReadAt<'_>,
        position: u64,
    ) -> Result<QueryPage, QueryError> {
        let forms = Forms::of(&query.filter, query.after.is_some());
        let Some(plan) = plan else {
            // The id order: every collection has it.
            let id_order = ID_ORDER.map(|(p, d)| (p.to_owned(), d));
            let digest = forms.digest(Some(coll), &id_order);
            let after = query.after.as_deref().map(decode_cursor).transpose()?;
            let after = match after {
                None => None,
                Some(cursor) if cursor.of_another(&forms.digests(Some(coll), &id_order)) => {
                    return Err(another_query());
                }
                Some(Cursor { key, .. }) => match key.as_slice() {
                    [Bson::String(id)] => Some(id.clone()),
                    _ => return Err(QueryError::Cursor("not a cursor of this query".into())),
                },
            };
            let (items, next) = self.documents.list_at(at, coll, after.as_deref(), query.limit).await?;
            let items = trim(items, query.fields.as_deref())?;
            let next = next.map(|id| encode_cursor(&[Bson::String(id)], Some(digest)));
            return Ok(QueryPage { items, next, position });
        };
        let store = at.store(self.documents.store());
        let mut store_query = store_query(plan);
        let order = store_query.order();
        let digest = forms.digest(Some(coll), &order);
        let mut after = match query.after.as_deref().map(decode_cursor).transpose()? {
            None => None,
            Some(Cursor { key, .. }) if key.len() != order.len() => {
                return Err(QueryError::Cursor("not a cursor of this query".into()));
            }
            Some(cursor) if cursor.of_another(&forms.digests(Some(coll), &order)) => {
                return Err(another_query());
            }
            Some(Cursor { key, .. }) => Some(key),
        };
        let matcher = query.filter.matcher();
        let mut items = Vec::with_capacity(query.limit);
        let mut holders = HashMap::new();
        let mut last_key: Option<Vec<Bson>> = None;
        let mut bytes = 0;
        let fields = query.fields.as_deref();
        let next_after = |last_key: &Option<Vec<Bson>>| last_key.as_deref().map(|key| encode_cursor(key, Some(digest)));
        for _ in 0..MAX_REFILLS {
            store_query.after = after.clone();
            store_query.limit = query.limit - items.len() + 1;
            store_query.budget = PAGE_BYTES.saturating_sub(bytes).max(1);
            // As stored: a record no transaction holds is written out
            // without being built.
            let found = store.query_raw(coll, &store_query).await?;
            bytes += found.bytes;
            let read = found.records.len();
            let full = read == store_query.limit;
            for (i, record) in found.records.into_iter().enumerate() {
                if items.len() == query.limit {
                    // One more entry exists: a next page follows the last shown.
                    let next = next_after(&last_key);
                    return Ok(QueryPage { items: trim(items, fields)?, next, position });
                }
                // Only two keys are ever asked for: the one of the entry
                // that may fill the page (the cursor past it) and the one of
                // the last entry read (where the next read goes on).
                if i + 1 == read || items.len() + 1 == query.limit {
                    let key = key_of_raw(&record, &order);
                    after = Some(key.clone());
                    last_key = Some(key);
                }
                match StoredLive::view(record) {
                    StoredView::Live(live) => {
                        if matcher.matches_raw(&live.record) {
                            items.push(PageItem::Stored(live));
                        }
                    }
                    StoredView::Hidden => {}
                    StoredView::Built(record) => {
                        let doc = StoredDoc::from_raw(&record);
                        let doc = match doc {
                            Ok(doc) => doc,
                            Err(err) => {
                                // Not a document (another tool's record):
                                // skipped, as a list skips it.
                                self.documents.skip_unreadable(err).map_err(DocError::Store)?;
                                continue;
                            }
                        };
                        if let View::Live(live) = self.documents.view_at(at, doc, &mut holders).await? {
                            // A committed transaction's change not rolled forward
                            // yet may have taken the document out of the set.
                            if matcher.matches(&live.data) {
                                items.push(PageItem::Built(live));
                            }
                        }
                    }
                }
            }
            if found.cut {
                // The page holds its bytes: the next goes on after the last read.
                let next = next_after(&last_key);
                return Ok(QueryPage { items: trim(items, fields)?, next, position });
            }
            if !full {
                return Ok(QueryPage { items: trim(items, fields)?, next: None, position });
            }
        }
        // Entries not shown fill the page: hand the client a cursor past them.
        let next = next_after(&last_key);
        Ok(QueryPage { items: trim(items, fields)?, next, position })
    }

    /// How many live documents match `filter`, from index entries, and the
    /// log position it was counted at.
    pub(crate) async fn count(&self, coll: &str, filter: &Filter) -> Result<(u64, u64), QueryError> {
        // Planned before any snapshot is taken (see [`Self::page`]). Every
        // live document has an entry in every declared index, so without a
        // filter a ready one counts them (from the count it keeps, where it
        // keeps them), and the gateway's own index of live documents where
        // none is ready.
        let planning = Planning::Count { filter };
        let query = match self.indexes.plan(coll, planning).await? {
            Ok(plan) => store_query(&plan),
            Err(_) if filter.paths.is_empty() => IndexQuery::live(),
            Err(why) => return Err(self.unserved(coll, why, planning).await),
        };
        if let Some((snapshot, position)) = self.snapshot(coll).await? {
            let n = self.read_count(coll, filter, &query, ReadAt::Pinned(snapshot.as_ref())).await?;
            return Ok((n, position));
        }
        self.bracketed(coll, |_| self.read_count(coll, filter, &query, ReadAt::Now)).await
    }

    /// [`Self::count`] along `query`, read once `at`.
    async fn read_count(
        &self,
        coll: &str,
        filter: &Filter,
        query: &IndexQuery,
        at: ReadAt<'_>,
    ) -> Result<u64, QueryError> {
        let store = at.store(self.documents.store());
        let mut n = store.count(coll, query).await?;
        // Inserts staged by transactions have entries (of empty data) that
        // readers do not see: take away those the filter matches.
        let staged_inserts = || DOCS_STAGED.scan(vec![StagedOp::Insert.to_bson()]);
        // Usually there is none: one entry looked for first, a point read.
        if filter.matches(&Document::new()) && !store.scan(coll, staged_inserts().limit(1)).await?.is_empty() {
            let staged = store.scan(coll, staged_inserts().limit(10_000)).await?;
            let hidden = staged
                .into_iter()
                .filter_map(|r| StoredDoc::from_record(r).ok())
                .filter(|d| !d.meta.deleted && d.meta.v == 0)
                .count() as u64;
            n = n.saturating_sub(hidden);
        }
        Ok(n)
    }
}

/// Whether a document of `coll`, read in `store`, holds an event not
/// logged yet (an outbox).
async fn holds_outbox(store: &dyn Store, coll: &str) -> Result<bool, StoreError> {
    let outbox = DOCS_OUTBOX.scan(Vec::new()).from(Bound::Included(Bson::String(String::new()))).limit(1);
    Ok(!store.scan(coll, outbox).await?.is_empty())
}

/// The event ids of the changes committed transaction `rec` made to
/// `coll`; `None` when the record does not say (no results).
fn member_events(rec: &TxnRecord, coll: &str) -> Option<Vec<String>> {
    let results = rec.results.as_ref()?;
    Some(
        rec.members
            .iter()
            .zip(results)
            .filter(|(member, _)| member.collection == coll && member.op != StagedOp::Check)
            .map(|(_, result)| document_event_id(coll, &result.id, result.version))
            .collect(),
    )
}

/// The read of `plan` along its index in the store (where every declared
/// index begins with `_meta.deleted`, pinned to false: live documents).
fn store_query(plan: &Plan) -> IndexQuery {
    let mut eq = vec![Bson::Boolean(false)];
    eq.extend(plan.eq.iter().cloned());
    IndexQuery {
        index: plan.index.clone(),
        fields: crate::indexes::store_fields(&plan.fields),
        eq,
        slot: plan.slot.clone(),
        reverse: plan.reverse,
        after: None,
        limit: 0,
        budget: usize::MAX,
    }
}

/// The values of a record as stored in the index's `order` fields: its
/// place in the index (a missing value is `null`, as the index keeps it).
fn key_of_raw(record: &mongodb::bson::RawDocument, order: &[(String, i32)]) -> Vec<Bson> {
    order
        .iter()
        .map(|(f, _)| {
            crate::store::filter::lookup_raw(record, f).and_then(|v| Bson::try_from(v).ok()).unwrap_or(Bson::Null)
        })
        .collect()
}
