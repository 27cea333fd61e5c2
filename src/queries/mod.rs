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
//! collection logged at or before it is reflected, and none after it. The
//! read is made through [`Positioned::collection`], which says how.
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
pub(crate) mod project;
pub(crate) mod ruled;

use std::collections::HashMap;
use std::sync::Arc;

use self::cursor::{Cursor, Forms, ID_ORDER, another_query, decode_cursor, encode_cursor};
use self::project::trim;

use crate::document::{PageItem, StagedOp, StoredDoc, StoredLive, StoredView, View};
use crate::documents::{DocError, Documents, ReadAt};
use crate::indexes::Indexes;
use crate::positioned::Positioned;
use crate::query::filter::Filter;
use crate::query::plan::{Plan, Planning, SortKey, Unserved};
use crate::store::scans::DOCS_STAGED;
use crate::store::{Bson, Document, IndexQuery, PAGE_BYTES, StoreError};

/// How many times a page reads on when the documents it read are not
/// shown (uncommitted inserts, changed by a committed transaction).
const MAX_REFILLS: usize = 8;
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
    positioned: Arc<Positioned>,
}

impl Queries {
    pub(crate) fn new(documents: Arc<Documents>, indexes: Arc<Indexes>, positioned: Arc<Positioned>) -> Self {
        Self { documents, indexes, positioned }
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
        let mut reading = self.positioned.collection(coll).await?;
        loop {
            let page = self.read_page(coll, query, plan.as_ref(), reading.at(), reading.position()).await?;
            if reading.stands().await? {
                return Ok(page);
            }
        }
    }

    /// [`Self::page`] along `plan` (`None`: the id order), read once `at`,
    /// named `position`.
    async fn read_page(
        &self,
        coll: &str,
        query: &Query,
        plan: Option<&Plan>,
        at: &ReadAt,
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
        let mut reading = self.positioned.collection(coll).await?;
        loop {
            let n = self.read_count(coll, filter, &query, reading.at()).await?;
            if reading.stands().await? {
                return Ok((n, reading.position()));
            }
        }
    }

    /// [`Self::count`] along `query`, read once `at`.
    async fn read_count(
        &self,
        coll: &str,
        filter: &Filter,
        query: &IndexQuery,
        at: &ReadAt,
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

/// The read of `plan` along its index in the store (whose fields are
/// those of [`crate::indexes::Declaration::spec`]: `_meta.deleted`, pinned
/// to false for live documents, the declared fields, then `_id`).
fn store_query(plan: &Plan) -> IndexQuery {
    let mut eq = vec![Bson::Boolean(false)];
    eq.extend(plan.eq.iter().cloned());
    let mut keys = vec![("_meta.deleted".to_owned(), false)];
    keys.extend(plan.keys.iter().map(|k| (k.path.clone(), k.desc)));
    keys.push(("_id".to_owned(), false));
    IndexQuery {
        index: plan.index.clone(),
        keys,
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
