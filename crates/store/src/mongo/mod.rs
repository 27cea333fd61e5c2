//! The MongoDB backend: each store operation is one single-document command
//! (`insertOne`, `replaceOne`, `updateOne`, `deleteOne`, `find`), so it
//! works on a standalone server and never needs a replica set.
//!
//! The backend relies on two of MongoDB's guarantees, which hold across
//! every gateway instance on one server, not only within a process:
//!
//! - a filtered single-document write (`updateOne`, `replaceOne`,
//!   `deleteOne`, `findOneAndUpdate`) checks its filter and writes as one
//!   atomic step, so a compare-and-set on `_meta.v` or `_meta.txn` never
//!   loses a concurrent one;
//! - a unique index (`_id` among them) refuses a second record with one key.
//!
//! A server that lacks the first (FerretDB 1.x runs the filter and the
//! write as two statements) loses updates between instances;
//! [`MongoStore::server`] tells which server this is and the gateway warns
//! at start (docs/operating.md, "Servers").
//!
//! Two more rules keep the backend correct on DocumentDB (FerretDB 2.x),
//! which MongoDB does not need but costs it nothing:
//!
//! - no upsert: concurrent upserts of one new `_id` on DocumentDB 0.107 can
//!   lose updates, so a record that may not exist yet is created by an
//!   insert that tolerates a duplicate key, then updated without upsert
//!   ([`MongoStore::counter_add`]);
//! - every read of many records is sorted (or hinted along an index): an
//!   unsorted multi-batch `find` on DocumentDB can return a record twice
//!   when it is updated during the read.
//!
//! And one rule only on FerretDB, which serves a sort from an index only on
//! `_id` (DocumentDB 0.107, with `documentdb.enableIndexOrderbyPushdown`;
//! other sorts read every record the filter matches, then sort them): the
//! reads of live documents in `_id` order (a collection's listing, an index
//! build's and a TTL pass's scans) walk the `_id` index and skip tombstones,
//! rather than the `live` index they use on MongoDB
//! ([`MongoStore::for_server`]).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use mongodb::bson::{RawDocument, RawDocumentBuf};
use mongodb::options::{ClientOptions, IndexOptions, ReadConcern, WriteConcern};
use mongodb::{Client, Collection, Database, IndexModel};

mod errors;
mod index_query;

use self::errors::{DUPLICATE_KEY, REJECTED_CODES, duplicate, is_duplicate, map_err, missing_hint};
use self::index_query::{after_condition, query_filter};
use super::server::ServerInfo;
use super::{
    Bson, Document, Durability, Found, FoundRaw, IndexQuery, IndexSpec, Record, Scan, Store, StoreError, StoreResult,
    Update, Write, doc,
};
use mongodb::error::ErrorKind;

/// Where [`Write::Append`] keeps the next position of each log: one
/// record per log collection, `{_id: <collection>, n: <last position taken>}`.
pub const COUNTERS: &str = "_counters";

pub struct MongoStore {
    db: Database,
    /// Records reads could not decode.
    unreadable: Arc<std::sync::atomic::AtomicU64>,
    /// The server serves a sort from an index only on `_id` (FerretDB).
    orders_by_id_only: bool,
}

/// The index every user collection has on `{_meta.deleted, _id}`.
const LIVE: &str = "live";

/// A conditional single-record write: one command, which the server
/// applies atomically (filter checked and record written as one step).
enum Guarded {
    Replace(Record),
    Update(Update),
    Delete,
}

/// A conditional write to record `(coll, id)`: one command, which the
/// server applies atomically.
async fn conditional_write(
    coll: &Collection<Document>,
    id: &str,
    filter: Document,
    write: Guarded,
) -> StoreResult<bool> {
    let filter = with_id(id, filter);
    Ok(match write {
        Guarded::Replace(record) => coll.replace_one(filter, record).await.map_err(map_err)?.matched_count == 1,
        Guarded::Update(update) => {
            let mut spec = Document::new();
            if !update.set.is_empty() {
                spec.insert("$set", update.set);
            }
            if !update.unset.is_empty() {
                let unset: Document = update.unset.into_iter().map(|path| (path, "".into())).collect();
                spec.insert("$unset", unset);
            }
            if spec.is_empty() {
                coll.count_documents(filter).await.map_err(map_err)? == 1
            } else {
                coll.update_one(filter, spec).await.map_err(map_err)?.matched_count == 1
            }
        }
        Guarded::Delete => coll.delete_one(filter).await.map_err(map_err)?.deleted_count == 1,
    })
}

fn with_id(id: &str, mut filter: Document) -> Document {
    filter.insert("_id", id);
    filter
}

impl MongoStore {
    /// Connect to `uri` and use database `database`. Fails fast (5 s server
    /// selection) when the server is unreachable.
    pub async fn connect(uri: &str, database: &str) -> StoreResult<Self> {
        Self::connect_monitored(uri, database, None).await
    }

    /// [`MongoStore::connect`], with `monitor` told of every command the
    /// driver sends and its answer (the bench counts a request's commands).
    pub async fn connect_monitored(
        uri: &str,
        database: &str,
        monitor: Option<mongodb::event::EventHandler<mongodb::event::command::CommandEvent>>,
    ) -> StoreResult<Self> {
        let mut options = ClientOptions::parse(uri).await.map_err(|e| StoreError::Unavailable(e.to_string()))?;
        options.command_event_handler = monitor;
        options.app_name.get_or_insert_with(|| "txgate".to_owned());
        options.server_selection_timeout.get_or_insert(Duration::from_secs(5));
        options.connect_timeout.get_or_insert(Duration::from_secs(5));
        // Nothing is relaxed here (docs/design.md §1): after a replica-set
        // failover, writes acknowledged by one member are rolled back while
        // later ones survive, so every write waits for a majority, and reads
        // see only what a majority has, whatever the URI asks.
        options.write_concern = Some(WriteConcern::majority());
        options.read_concern = Some(ReadConcern::majority());
        let client = Client::with_options(options).map_err(map_err)?;
        Ok(Self { db: client.database(database), unreadable: Arc::default(), orders_by_id_only: false })
    }

    /// This store, its reads shaped for `server`: on a server that serves a
    /// sort from an index only on `_id` (FerretDB 2.x over DocumentDB
    /// 0.107), the reads of live documents in `_id` order walk the `_id`
    /// index and skip tombstones (cost: the records returned and the
    /// tombstones between them) rather than read every live document and
    /// sort them, as the `live` index does there (cost: the whole
    /// collection, each batch).
    #[must_use]
    pub fn for_server(mut self, server: &ServerInfo) -> Self {
        self.orders_by_id_only = server.orders_by_id_only();
        self
    }

    /// The hint of a read along index `index` ordered by `by`.
    fn hint(&self, index: &str, by: &str) -> mongodb::options::Hint {
        if self.orders_by_id_only && index == LIVE && by == "_id" {
            mongodb::options::Hint::Keys(doc! {"_id": 1})
        } else {
            mongodb::options::Hint::Name(index.to_owned())
        }
    }

    /// The server's `buildInfo`: which server this is.
    pub async fn server(&self) -> StoreResult<ServerInfo> {
        let info = self.db.run_command(doc! {"buildInfo": 1}).await.map_err(map_err)?;
        Ok(ServerInfo::from_build_info(&info))
    }

    /// Add `n` to the counter of log `coll` in [`COUNTERS`] and return its
    /// new value. Without an upsert: the counter's record is created by an
    /// insert that tolerates a duplicate key (another instance created it
    /// first), then the update runs without upsert. On DocumentDB 0.107,
    /// concurrent upserts of one new `_id` can each create the record, and
    /// all but one of their increments are lost.
    async fn counter_add(&self, coll: &str, n: i64) -> StoreResult<i64> {
        let counters = self.coll(COUNTERS);
        for _ in 0..2 {
            let counter = counters
                .find_one_and_update(doc! {"_id": coll}, doc! {"$inc": {"n": n}})
                .return_document(mongodb::options::ReturnDocument::After)
                .await
                .map_err(map_err)?;
            if let Some(counter) = counter {
                return counter
                    .get_i64("n")
                    .ok()
                    .filter(|last| *last >= n && n >= 0)
                    .ok_or_else(|| StoreError::Internal(format!("counter of {coll} is not a position: {counter:?}")));
            }
            match counters.insert_one(doc! {"_id": coll, "n": 0_i64}).await {
                Ok(_) => {}
                Err(err) if is_duplicate(&err) => {}
                Err(err) => return Err(map_err(err)),
            }
        }
        Err(StoreError::Internal(format!("counter of {coll} vanished after it was created")))
    }

    /// [`Write::Append`]: unless the record is there already, take the
    /// next position of `coll` from its counter in [`COUNTERS`] and insert
    /// the record at it. A position found taken (a reader voided it, or the
    /// counter was behind) moves the counter past the log's last position
    /// and takes another; a record another appender inserted meanwhile
    /// leaves the position taken for it void at once, so no reader waits
    /// for it.
    async fn append(&self, coll: &str, mut record: Record) -> StoreResult<bool> {
        let log = self.coll(coll);
        let id = record.get_str("_id").map_err(|_| StoreError::Rejected("record has no string _id".into()))?.to_owned();
        if log.find_one(doc! {"_id": &id}).await.map_err(map_err)?.is_some() {
            return Ok(false);
        }
        loop {
            let seq = self.counter_add(coll, 1).await?;
            record.insert(super::LOG_SEQ, seq);
            match log.insert_one(&record).await {
                Ok(_) => return Ok(true),
                Err(err) if duplicate(&err).is_none() => return Err(map_err(err)),
                Err(_) if log.find_one(doc! {"_id": &id}).await.map_err(map_err)?.is_some() => {
                    // Another appender inserted it meanwhile: close the
                    // position this one took.
                    let void = super::void_entry(seq as u64, mongodb::bson::DateTime::now());
                    match log.insert_one(void).await {
                        Ok(_) => {}
                        Err(err) if duplicate(&err).is_some() => {}
                        Err(err) => return Err(map_err(err)),
                    }
                    return Ok(false);
                }
                Err(_) => {
                    // The position is taken: move the counter past the
                    // last one, then take the next.
                    let last = log
                        .find_one(doc! {})
                        .sort(doc! {super::LOG_SEQ: -1})
                        .await
                        .map_err(map_err)?
                        .and_then(|r| r.get_i64(super::LOG_SEQ).ok())
                        .unwrap_or(0);
                    self.coll(COUNTERS)
                        .update_one(doc! {"_id": coll}, doc! {"$max": {"n": last}})
                        .await
                        .map_err(map_err)?;
                }
            }
        }
    }

    /// Reads take records as raw BSON and decode them with
    /// [`super::convert::decode_raw`], which bounds their depth.
    fn raw(&self, name: &str) -> Collection<RawDocumentBuf> {
        self.db.collection(name)
    }

    fn decode(&self, coll: &str, raw: &RawDocument) -> StoreResult<Record> {
        super::convert::decode_raw(raw, 1).map_err(|e| {
            self.unreadable.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            StoreError::Undecodable(format!("{coll}/{}: {e}", super::convert::raw_id(raw)))
        })
    }

    /// The records of a read of many: one that cannot be decoded is
    /// skipped and reported (see [`super::report_unreadable`]).
    /// The records of `cursor` up to `limit` of them and `budget` bytes
    /// (see [`Found::take`]); one that cannot be decoded is skipped and
    /// reported.
    async fn found(
        &self,
        coll: &str,
        mut cursor: mongodb::Cursor<RawDocumentBuf>,
        limit: usize,
        budget: usize,
    ) -> StoreResult<Found> {
        let mut found = Found::default();
        while cursor.advance().await.map_err(map_err)? {
            let raw = cursor.current();
            match self.decode(coll, raw) {
                // Dropping the cursor kills it on the server.
                Ok(record) => {
                    if !found.take(record, raw.as_bytes().len(), limit, budget) {
                        break;
                    }
                }
                Err(err) => super::report_unreadable(&err),
            }
        }
        Ok(found)
    }

    /// The records of index query `query`, read along its index (hinted).
    /// `None` when the query's intervals admit no value.
    async fn query_cursor(
        &self,
        coll: &str,
        query: &IndexQuery,
    ) -> StoreResult<Option<mongodb::Cursor<RawDocumentBuf>>> {
        let order = query.order();
        let Some(mut filter) = query_filter(query) else { return Ok(None) };
        if let Some(after) = &query.after {
            filter = doc! {"$and": [filter, after_condition(&order, after)]};
        }
        let sort: Document = order.iter().map(|(f, d)| (f.clone(), Bson::Int32(*d))).collect();
        let limit = i64::try_from(query.limit).unwrap_or(i64::MAX);
        let by = order.first().map_or("", |(f, _)| f.as_str());
        let raw = self.raw(coll);
        let cursor = match raw
            .find(filter.clone())
            .sort(sort.clone())
            .hint(self.hint(&query.index, by))
            .limit(limit)
            .await
        {
            Err(err) if missing_hint(&err) => {
                tracing::debug!(collection = coll, index = %query.index, "the hinted index is not there: read without the hint");
                raw.find(filter).sort(sort).limit(limit).await.map_err(map_err)
            }
            read => read.map_err(map_err),
        };
        cursor.map(Some)
    }

    fn coll(&self, name: &str) -> Collection<Document> {
        self.db.collection(name)
    }

    /// Drop the whole database (tests use one database each).
    pub async fn drop_database(&self) -> StoreResult<()> {
        self.db.drop().await.map_err(map_err)
    }
}

#[async_trait]
impl Store for MongoStore {
    fn backend(&self) -> &'static str {
        "mongodb"
    }

    async fn ping(&self) -> StoreResult<()> {
        self.db.run_command(doc! {"ping": 1}).await.map(|_| ()).map_err(map_err)
    }

    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>> {
        match self.raw(coll).find_one(doc! {"_id": id}).await.map_err(map_err)? {
            Some(raw) => self.decode(coll, &raw).map(Some),
            None => Ok(None),
        }
    }

    /// In the order of their ids, not that of `ids`.
    async fn get_many_within(&self, coll: &str, ids: &[String], budget: usize) -> StoreResult<Found> {
        if ids.is_empty() {
            return Ok(Found::default());
        }
        // Sorted: see the module's doc.
        let cursor = self.raw(coll).find(doc! {"_id": {"$in": ids}}).sort(doc! {"_id": 1}).await.map_err(map_err)?;
        self.found(coll, cursor, ids.len(), budget).await
    }

    /// Every write is majority-acknowledged, whatever `durability` says.
    async fn write(&self, coll: &str, write: Write<'_>, _: Durability) -> StoreResult<bool> {
        match write {
            Write::Insert(record) => match self.coll(coll).insert_one(record).await {
                Ok(_) => Ok(true),
                Err(err) => match duplicate(&err) {
                    Some(true) => Ok(false),
                    _ => Err(map_err(err)),
                },
            },
            Write::Replace { id, filter, mut record } => {
                record.insert("_id", id);
                conditional_write(&self.coll(coll), id, filter, Guarded::Replace(record)).await
            }
            Write::Update { id, filter, update } => {
                conditional_write(&self.coll(coll), id, filter, Guarded::Update(update)).await
            }
            Write::Delete { id, filter } => conditional_write(&self.coll(coll), id, filter, Guarded::Delete).await,
            Write::Append(record) => self.append(coll, record).await,
        }
    }

    /// Inserts into one collection go as one ordered `insertMany`, which
    /// stops at the first refused insert just as one write after another
    /// does (a unique build claims a batch of values this way); any other
    /// chain goes write by write.
    async fn write_in_order(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<usize> {
        let one_coll = writes.first().map(|(coll, _)| *coll).filter(|first| writes.iter().all(|(c, _)| c == first));
        let all_inserts = writes.iter().all(|(_, w)| matches!(w, Write::Insert(_)));
        let (Some(coll), true, 2..) = (one_coll, all_inserts, writes.len()) else {
            return super::write_each(self, writes, durability).await;
        };
        let coll = self.coll(coll);
        let records: Vec<Record> = writes
            .into_iter()
            .filter_map(|(_, write)| match write {
                Write::Insert(record) => Some(record),
                _ => None,
            })
            .collect();
        let n = records.len();
        match coll.insert_many(records).ordered(true).await {
            Ok(_) => Ok(n),
            Err(err) => match err.kind.as_ref() {
                ErrorKind::InsertMany(failure) => {
                    let first = failure.write_errors.as_ref().and_then(|errs| errs.iter().min_by_key(|e| e.index));
                    match first {
                        // The record exists: the inserts before it landed, none after.
                        Some(e)
                            if e.code == DUPLICATE_KEY
                                && (e.message.contains("_id_") || !e.message.contains("index:")) =>
                        {
                            Ok(e.index)
                        }
                        Some(e) if e.code == DUPLICATE_KEY => Err(StoreError::Duplicate(e.message.clone())),
                        Some(e) if REJECTED_CODES.contains(&e.code) => Err(StoreError::Rejected(e.message.clone())),
                        Some(e) => {
                            Err(StoreError::Internal(format!("insert {} of {n} failed: {}", e.index, e.message)))
                        }
                        None => Err(map_err(err)),
                    }
                }
                _ => Err(map_err(err)),
            },
        }
    }

    /// One round trip to learn which are there, one to take positions for
    /// the rest, then their inserts at once.
    async fn append_all(&self, coll: &str, records: Vec<Record>) -> StoreResult<Vec<bool>> {
        if records.len() < 2 {
            let mut out = Vec::new();
            for record in records {
                out.push(self.append(coll, record).await?);
            }
            return Ok(out);
        }
        let log = self.coll(coll);
        let ids: Vec<String> = records.iter().filter_map(|r| r.get_str("_id").ok().map(str::to_owned)).collect();
        if ids.len() != records.len() {
            return Err(StoreError::Rejected("record has no string _id".into()));
        }
        // One lookup per id, at once: an `_id` equality is what every
        // MongoDB-wire server answers from its primary index.
        let lookups = ids.iter().map(|id| {
            let log = log.clone();
            async move { log.find_one(doc! {"_id": id}).await.map(|found| found.is_some()) }
        });
        let mut absent = Vec::with_capacity(ids.len());
        for (i, there) in futures::future::join_all(lookups).await.into_iter().enumerate() {
            if !there.map_err(map_err)? {
                absent.push(i);
            }
        }
        if absent.is_empty() {
            return Ok(vec![false; records.len()]);
        }
        let n = i64::try_from(absent.len()).unwrap_or(i64::MAX);
        let last = self.counter_add(coll, n).await?;
        let mut records: Vec<Option<Record>> = records.into_iter().map(Some).collect();
        let inserts = absent.iter().enumerate().map(|(k, &i)| {
            let mut record = records[i].take().expect("each record once");
            let seq = last - n + 1 + k as i64;
            record.insert(super::LOG_SEQ, seq);
            let log = log.clone();
            async move {
                match log.insert_one(&record).await {
                    Ok(_) => Ok((i, true, None)),
                    Err(err) if duplicate(&err).is_some() => Ok((i, false, Some((seq, record)))),
                    Err(err) => Err(map_err(err)),
                }
            }
        });
        let mut out = vec![false; ids.len()];
        for done in futures::future::join_all(inserts).await {
            let (i, appended, retry) = done?;
            out[i] = appended;
            if let Some((seq, mut record)) = retry {
                // Inserted by another appender meanwhile, or the position
                // was taken: settle it the way one append does, after
                // closing the position it was given if it is still free.
                record.remove(super::LOG_SEQ);
                let taken = log.find_one(doc! {"_id": &ids[i]}).await.map_err(map_err)?.is_some();
                match log.insert_one(super::void_entry(seq as u64, mongodb::bson::DateTime::now())).await {
                    Ok(_) => {}
                    Err(err) if duplicate(&err).is_some() => {}
                    Err(err) => return Err(map_err(err)),
                }
                out[i] = !taken && self.append(coll, record).await?;
            }
        }
        Ok(out)
    }

    /// Each write was durable when it returned.
    async fn sync(&self) -> StoreResult<()> {
        Ok(())
    }

    fn unreadable(&self) -> u64 {
        self.unreadable.load(std::sync::atomic::Ordering::Relaxed)
    }

    async fn scan_found(&self, coll: &str, scan: Scan) -> StoreResult<Found> {
        let (filter, sort) = scan.to_query();
        let limit = i64::try_from(scan.max()).unwrap_or(i64::MAX);
        let skip = u64::try_from(scan.skipped()).unwrap_or(u64::MAX);
        if limit == 0 {
            return Ok(Found::default());
        }
        let raw = self.raw(coll);
        let mut find = raw.find(filter).sort(sort).skip(skip).limit(limit);
        if self.orders_by_id_only && scan.index() == LIVE {
            // Other scans are sorted without a hint (see the module's doc).
            find = find.hint(self.hint(scan.index(), scan.by()));
        }
        if !scan.wanted().is_empty() {
            find =
                find.projection(scan.wanted().iter().map(|f| ((*f).to_owned(), Bson::Int32(1))).collect::<Document>());
        }
        let cursor = find.await.map_err(map_err)?;
        self.found(coll, cursor, scan.max(), scan.budget()).await
    }

    async fn collections(&self) -> StoreResult<Vec<String>> {
        let mut names = self.db.list_collection_names().await.map_err(map_err)?;
        names.sort();
        Ok(names)
    }

    async fn query(&self, coll: &str, query: &IndexQuery) -> StoreResult<Found> {
        if query.limit == 0 {
            return Ok(Found::default());
        }
        let Some(cursor) = self.query_cursor(coll, query).await? else { return Ok(Found::default()) };
        self.found(coll, cursor, query.limit, query.budget).await
    }

    async fn query_raw(&self, coll: &str, query: &IndexQuery) -> StoreResult<FoundRaw> {
        let mut found = FoundRaw::default();
        if query.limit == 0 {
            return Ok(found);
        }
        let Some(mut cursor) = self.query_cursor(coll, query).await? else { return Ok(found) };
        while cursor.advance().await.map_err(map_err)? {
            let raw = cursor.current();
            match super::convert::check(raw.as_bytes()) {
                // Dropping the cursor kills it on the server.
                Ok(raw) => {
                    if !found.take(raw.to_raw_document_buf(), query.limit, query.budget) {
                        break;
                    }
                }
                Err(e) => {
                    self.unreadable.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let id = super::convert::raw_id(raw);
                    super::report_unreadable(&StoreError::Undecodable(format!("{coll}/{id}: {e}")));
                }
            }
        }
        Ok(found)
    }

    async fn count(&self, coll: &str, query: &IndexQuery) -> StoreResult<u64> {
        let Some(filter) = query_filter(query) else { return Ok(0) };
        let collection = self.coll(coll);
        let hint = mongodb::options::Hint::Name(query.index.clone());
        match collection.count_documents(filter.clone()).hint(hint).await {
            Err(err) if missing_hint(&err) => {
                tracing::debug!(collection = coll, index = %query.index, "the hinted index is not there: count without the hint");
                collection.count_documents(filter).await.map_err(map_err)
            }
            count => count.map_err(map_err),
        }
    }

    async fn ensure_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        let keys: Document =
            index.keys().map(|(f, desc)| (f.to_owned(), Bson::Int32(if desc { -1 } else { 1 }))).collect();
        let options = IndexOptions::builder().name(index.name).unique(index.unique.then_some(true)).build();
        let model = IndexModel::builder().keys(keys).options(options).build();
        self.coll(coll).create_index(model).await.map(|_| ()).map_err(map_err)
    }

    async fn indexes(&self, coll: &str) -> StoreResult<Vec<IndexSpec>> {
        let mut out = Vec::new();
        let mut cursor = match self.coll(coll).list_indexes().await {
            Ok(cursor) => cursor,
            // NamespaceNotFound: no collection, no indexes.
            Err(err) if matches!(err.kind.as_ref(), ErrorKind::Command(e) if e.code == 26) => return Ok(out),
            Err(err) => return Err(map_err(err)),
        };
        while let Some(model) = cursor.try_next().await.map_err(map_err)? {
            let name = model.options.as_ref().and_then(|o| o.name.clone()).unwrap_or_default();
            if name == "_id_" {
                continue;
            }
            let unique = model.options.as_ref().and_then(|o| o.unique).unwrap_or(false);
            out.push(IndexSpec {
                name,
                fields: model.keys.keys().cloned().collect(),
                unique,
                sparse: false,
                counted: false,
            });
        }
        Ok(out)
    }

    async fn drop_index(&self, coll: &str, name: &str) -> StoreResult<()> {
        match self.coll(coll).drop_index(name).await {
            Ok(()) => Ok(()),
            // FerretDB 2.7 answers `ok: true` where MongoDB says `1.0`, a
            // reply the driver refuses after the server has dropped the
            // index: the index being gone is the answer.
            Err(err) if matches!(err.kind.as_ref(), ErrorKind::InvalidResponse { .. }) => {
                let names = self.coll(coll).list_index_names().await.map_err(map_err)?;
                if names.iter().any(|n| n == name) { Err(map_err(err)) } else { Ok(()) }
            }
            // IndexNotFound, NamespaceNotFound: nothing to drop.
            Err(err) if matches!(err.kind.as_ref(), ErrorKind::Command(e) if e.code == 27 || e.code == 26) => Ok(()),
            Err(err) => Err(map_err(err)),
        }
    }
}
