//! The MongoDB backend: each store operation is one single-document command
//! (`insertOne`, `replaceOne`, `updateOne`, `deleteOne`, `find`), so it
//! works on a standalone server and never needs a replica set.
//!
//! MongoDB applies a filtered single-document write atomically. Some
//! MongoDB-wire servers do not (FerretDB 1.x runs the filter and the write
//! as two statements), so this backend also serializes its own conditional
//! writes per record: within one process a conditional write is atomic on
//! any such server, and on MongoDB the extra ordering costs nothing but a
//! little queueing on a hot document. A write holds its record's stripe at
//! most for the store deadline, so a hung call cannot stop the writes that
//! share its stripe.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::TryStreamExt;
use mongodb::error::{Error as MongoError, ErrorKind, WriteFailure};
use mongodb::options::{ClientOptions, IndexOptions, ReadConcern, WriteConcern};
use mongodb::{Client, Collection, Database, IndexModel};

use super::{Bson, Document, Durability, IndexSpec, Record, Scan, Store, StoreError, StoreResult, Update, Write, doc};

const DUPLICATE_KEY: i32 = 11000;

/// Error codes meaning "this document cannot be stored as it is".
const REJECTED_CODES: &[i32] = &[2, 14, 52, 55, 56, 57, 10334, 15974, 16755, 17419, 238];

/// Stripes of the per-record write serialization.
const WRITE_STRIPES: usize = 1024;

pub struct MongoStore {
    db: Database,
    /// Longest time one write holds its stripe (the store deadline).
    hold: Duration,
    stripes: Vec<Arc<tokio::sync::Mutex<()>>>,
}

fn map_err(err: MongoError) -> StoreError {
    match err.kind.as_ref() {
        ErrorKind::ServerSelection { .. }
        | ErrorKind::Io(_)
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::DnsResolve { .. } => StoreError::Unavailable(err.to_string()),
        ErrorKind::Write(WriteFailure::WriteError(e)) if REJECTED_CODES.contains(&e.code) => {
            StoreError::Rejected(e.message.clone())
        }
        ErrorKind::Command(e) if REJECTED_CODES.contains(&e.code) => StoreError::Rejected(e.message.clone()),
        ErrorKind::BsonSerialization(e) => StoreError::Rejected(e.to_string()),
        ErrorKind::Write(WriteFailure::WriteError(e)) if e.code == DUPLICATE_KEY => {
            StoreError::Duplicate(e.message.clone())
        }
        _ => StoreError::Internal(err.to_string()),
    }
}

/// A duplicate key: `Some(true)` on `_id` (the record exists), `Some(false)`
/// on a secondary unique index.
fn duplicate(err: &MongoError) -> Option<bool> {
    match err.kind.as_ref() {
        ErrorKind::Write(WriteFailure::WriteError(e)) if e.code == DUPLICATE_KEY => {
            Some(e.message.contains("_id_") || !e.message.contains("index:"))
        }
        _ => None,
    }
}

/// A conditional single-record write, as the stripe holder issues it.
enum Guarded {
    Replace(Record),
    Update(Update),
    Delete,
}

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
    /// selection) when the server is unreachable. `hold` bounds how long one
    /// write may hold its record's write stripe.
    pub async fn connect(uri: &str, database: &str, hold: Duration) -> StoreResult<Self> {
        let mut options = ClientOptions::parse(uri).await.map_err(|e| StoreError::Unavailable(e.to_string()))?;
        options.app_name.get_or_insert_with(|| "txgate".to_owned());
        options.server_selection_timeout.get_or_insert(Duration::from_secs(5));
        options.connect_timeout.get_or_insert(Duration::from_secs(5));
        // Nothing is relaxed here (DESIGN.md §1): after a replica-set
        // failover, writes acknowledged by one member are rolled back while
        // later ones survive, so every write waits for a majority, and reads
        // see only what a majority has, whatever the URI asks.
        options.write_concern = Some(WriteConcern::majority());
        options.read_concern = Some(ReadConcern::majority());
        let client = Client::with_options(options).map_err(map_err)?;
        Ok(Self {
            db: client.database(database),
            hold,
            stripes: (0..WRITE_STRIPES).map(|_| Arc::new(tokio::sync::Mutex::new(()))).collect(),
        })
    }

    /// Issue a conditional write to record `(coll, id)` while holding its
    /// stripe. The write runs in its own task, so the stripe stays held until
    /// the server has answered even when the caller stops waiting (a server
    /// that checks the filter and writes in two steps must not see a second
    /// write to the record overlap an abandoned one), but never longer than
    /// the store deadline: a call that hangs past it gives its stripe up.
    async fn guarded(&self, coll: &str, id: &str, filter: Document, write: Guarded) -> StoreResult<bool> {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (coll, id).hash(&mut hasher);
        let stripe = Arc::clone(&self.stripes[(hasher.finish() as usize) % WRITE_STRIPES]);
        let (collection, id, hold) = (self.coll(coll), id.to_owned(), self.hold);
        tokio::spawn(async move {
            let _turn = stripe.lock_owned().await;
            tokio::time::timeout(hold, conditional_write(&collection, &id, filter, write)).await.unwrap_or_else(|_| {
                Err(StoreError::Unavailable(format!("no answer to a write within {} ms", hold.as_millis())))
            })
        })
        .await
        .map_err(|e| StoreError::Internal(format!("write task failed: {e}")))?
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
        self.coll(coll).find_one(doc! {"_id": id}).await.map_err(map_err)
    }

    async fn get_many(&self, coll: &str, ids: &[String]) -> StoreResult<Vec<Record>> {
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let cursor = self.coll(coll).find(doc! {"_id": {"$in": ids}}).await.map_err(map_err)?;
        cursor.try_collect().await.map_err(map_err)
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
                self.guarded(coll, id, filter, Guarded::Replace(record)).await
            }
            Write::Update { id, filter, update } => self.guarded(coll, id, filter, Guarded::Update(update)).await,
            Write::Delete { id, filter } => self.guarded(coll, id, filter, Guarded::Delete).await,
        }
    }

    /// Each write was durable when it returned.
    async fn sync(&self) -> StoreResult<()> {
        Ok(())
    }

    async fn scan(&self, coll: &str, scan: Scan) -> StoreResult<Vec<Record>> {
        let (filter, sort) = scan.to_query();
        let limit = i64::try_from(scan.max()).unwrap_or(i64::MAX);
        let cursor = self.coll(coll).find(filter).sort(sort).limit(limit).await.map_err(map_err)?;
        cursor.try_collect().await.map_err(map_err)
    }

    async fn collections(&self) -> StoreResult<Vec<String>> {
        let mut names = self.db.list_collection_names().await.map_err(map_err)?;
        names.sort();
        Ok(names)
    }

    async fn ensure_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        let keys: Document = index.fields.iter().map(|f| (f.clone(), Bson::Int32(1))).collect();
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
            out.push(IndexSpec { name, fields: model.keys.keys().cloned().collect(), unique, sparse: false });
        }
        Ok(out)
    }

    async fn drop_index(&self, coll: &str, name: &str) -> StoreResult<()> {
        match self.coll(coll).drop_index(name).await {
            Ok(()) => Ok(()),
            // IndexNotFound, NamespaceNotFound: nothing to drop.
            Err(err) if matches!(err.kind.as_ref(), ErrorKind::Command(e) if e.code == 27 || e.code == 26) => Ok(()),
            Err(err) => Err(map_err(err)),
        }
    }
}
