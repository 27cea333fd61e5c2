//! The embedded backend: records as BSON in one redb table, keyed by
//! `(collection, id)`.
//!
//! Writes go through one writer thread that applies every queued operation
//! in a single redb write transaction and commits it with
//! `Durability::Immediate` (fsync) before answering any of them: group
//! commit. Each operation is still checked and applied on its own, in queue
//! order, so it is atomic on its one record; it is acknowledged only once it
//! is on disk. Reads use redb's MVCC read transactions and never wait for
//! the writer.

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

use async_trait::async_trait;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use tokio::sync::oneshot;

use super::filter::{apply_update, matches, sort_order};
use super::{Document, IndexSpec, Order, Record, Scan, Store, StoreError, StoreResult, Update};

const RECORDS: TableDefinition<(&str, &str), &[u8]> = TableDefinition::new("records");

/// Upper bound on operations committed together.
const MAX_BATCH: usize = 512;

enum WriteOp {
    Insert { coll: String, record: Record },
    Replace { coll: String, id: String, filter: Document, record: Record },
    Update { coll: String, id: String, filter: Document, update: Update },
    Delete { coll: String, id: String, filter: Document },
}

type Reply = oneshot::Sender<StoreResult<bool>>;

/// A store in one redb file under the data directory.
pub struct EmbeddedStore {
    db: Arc<Database>,
    writer: mpsc::Sender<(WriteOp, Reply)>,
    path: PathBuf,
}

fn internal(err: impl std::fmt::Display) -> StoreError {
    StoreError::Internal(err.to_string())
}

impl EmbeddedStore {
    /// Open (or create) the store in `dir`.
    pub fn open(dir: &Path) -> StoreResult<Self> {
        std::fs::create_dir_all(dir)
            .map_err(|e| StoreError::Unavailable(format!("cannot create data directory {}: {e}", dir.display())))?;
        let path = dir.join("txgate.redb");
        let db = Database::create(&path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Unavailable(format!(
                "{} is already open in another process (the embedded store serves one instance)",
                path.display()
            )),
            other => StoreError::Unavailable(format!("cannot open {}: {other}", path.display())),
        })?;
        let txn = db.begin_write().map_err(internal)?;
        txn.open_table(RECORDS).map_err(internal)?;
        txn.commit().map_err(internal)?;
        let db = Arc::new(db);
        let (tx, rx) = mpsc::channel();
        let writer_db = Arc::clone(&db);
        std::thread::Builder::new()
            .name("txgate-embedded-writer".into())
            .spawn(move || writer_loop(&writer_db, &rx))
            .map_err(internal)?;
        Ok(Self { db, writer: tx, path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn write(&self, op: WriteOp) -> StoreResult<bool> {
        let (tx, rx) = oneshot::channel();
        self.writer.send((op, tx)).map_err(|_| StoreError::Unavailable("embedded writer stopped".into()))?;
        rx.await.map_err(|_| StoreError::Unavailable("embedded writer stopped".into()))?
    }

    async fn read<T: Send + 'static>(
        &self,
        f: impl FnOnce(&redb::ReadOnlyTable<(&'static str, &'static str), &'static [u8]>) -> StoreResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let db = Arc::clone(&self.db);
        tokio::task::spawn_blocking(move || {
            let txn = db.begin_read().map_err(internal)?;
            let table = txn.open_table(RECORDS).map_err(internal)?;
            f(&table)
        })
        .await
        .map_err(internal)?
    }
}

fn decode(bytes: &[u8]) -> StoreResult<Record> {
    Document::from_reader(bytes).map_err(|e| StoreError::Internal(format!("corrupt record: {e}")))
}

fn encode(record: &Record) -> StoreResult<Vec<u8>> {
    let mut out = Vec::new();
    record.to_writer(&mut out).map_err(|e| StoreError::Rejected(e.to_string()))?;
    Ok(out)
}

/// The smallest collection name ordered after `coll` and all its keys.
fn after_collection(coll: &str) -> String {
    format!("{coll}\0")
}

fn writer_loop(db: &Database, rx: &mpsc::Receiver<(WriteOp, Reply)>) {
    while let Ok(first) = rx.recv() {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let mut results = Vec::with_capacity(batch.len());
        let outcome = (|| -> StoreResult<()> {
            let txn = db.begin_write().map_err(internal)?;
            {
                let mut table = txn.open_table(RECORDS).map_err(internal)?;
                for (op, _) in &batch {
                    results.push(apply(&mut table, op));
                }
            }
            txn.commit().map_err(|e| StoreError::Unavailable(format!("commit failed: {e}")))
        })();
        match outcome {
            Ok(()) => {
                for ((_, reply), result) in batch.into_iter().zip(results) {
                    let _ = reply.send(result);
                }
            }
            Err(err) => {
                tracing::error!(error = %err, "embedded store commit failed; batch not applied");
                for (_, reply) in batch {
                    let _ = reply.send(Err(StoreError::Unavailable(err.to_string())));
                }
            }
        }
    }
}

fn apply(table: &mut redb::Table<(&str, &str), &[u8]>, op: &WriteOp) -> StoreResult<bool> {
    let current = |table: &redb::Table<(&str, &str), &[u8]>, coll: &str, id: &str| -> StoreResult<Option<Record>> {
        match table.get((coll, id)).map_err(internal)? {
            Some(v) => decode(v.value()).map(Some),
            None => Ok(None),
        }
    };
    match op {
        WriteOp::Insert { coll, record } => {
            let id = record.get_str("_id").map_err(|_| StoreError::Rejected("record has no string _id".into()))?;
            if table.get((coll.as_str(), id)).map_err(internal)?.is_some() {
                return Ok(false);
            }
            let bytes = encode(record)?;
            table.insert((coll.as_str(), id), bytes.as_slice()).map_err(internal)?;
            Ok(true)
        }
        WriteOp::Replace { coll, id, filter, record } => {
            let Some(existing) = current(table, coll, id)? else { return Ok(false) };
            if !matches(&existing, filter)? {
                return Ok(false);
            }
            let mut record = record.clone();
            record.insert("_id", id.as_str());
            let bytes = encode(&record)?;
            table.insert((coll.as_str(), id.as_str()), bytes.as_slice()).map_err(internal)?;
            Ok(true)
        }
        WriteOp::Update { coll, id, filter, update } => {
            let Some(mut existing) = current(table, coll, id)? else { return Ok(false) };
            if !matches(&existing, filter)? {
                return Ok(false);
            }
            apply_update(&mut existing, update)?;
            let bytes = encode(&existing)?;
            table.insert((coll.as_str(), id.as_str()), bytes.as_slice()).map_err(internal)?;
            Ok(true)
        }
        WriteOp::Delete { coll, id, filter } => {
            let Some(existing) = current(table, coll, id)? else { return Ok(false) };
            if !matches(&existing, filter)? {
                return Ok(false);
            }
            table.remove((coll.as_str(), id.as_str())).map_err(internal)?;
            Ok(true)
        }
    }
}

/// The lower bound of an `_id` scan when the filter pins `_id > x`.
fn id_lower_bound(filter: &Document) -> Option<String> {
    filter.get_document("_id").ok()?.get_str("$gt").ok().map(str::to_owned)
}

#[async_trait]
impl Store for EmbeddedStore {
    fn backend(&self) -> &'static str {
        "embedded"
    }

    async fn ping(&self) -> StoreResult<()> {
        self.read(|_| Ok(())).await
    }

    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>> {
        let (coll, id) = (coll.to_owned(), id.to_owned());
        self.read(move |table| match table.get((coll.as_str(), id.as_str())).map_err(internal)? {
            Some(v) => decode(v.value()).map(Some),
            None => Ok(None),
        })
        .await
    }

    async fn get_many(&self, coll: &str, ids: &[String]) -> StoreResult<Vec<Record>> {
        let (coll, ids) = (coll.to_owned(), ids.to_vec());
        self.read(move |table| {
            let mut out = Vec::with_capacity(ids.len());
            for id in &ids {
                if let Some(v) = table.get((coll.as_str(), id.as_str())).map_err(internal)? {
                    out.push(decode(v.value())?);
                }
            }
            Ok(out)
        })
        .await
    }

    async fn insert(&self, coll: &str, record: Record) -> StoreResult<bool> {
        self.write(WriteOp::Insert { coll: coll.to_owned(), record }).await
    }

    async fn replace(&self, coll: &str, id: &str, filter: Document, record: Record) -> StoreResult<bool> {
        self.write(WriteOp::Replace { coll: coll.to_owned(), id: id.to_owned(), filter, record }).await
    }

    async fn update(&self, coll: &str, id: &str, filter: Document, update: Update) -> StoreResult<bool> {
        self.write(WriteOp::Update { coll: coll.to_owned(), id: id.to_owned(), filter, update }).await
    }

    async fn delete(&self, coll: &str, id: &str, filter: Document) -> StoreResult<bool> {
        self.write(WriteOp::Delete { coll: coll.to_owned(), id: id.to_owned(), filter }).await
    }

    async fn scan(&self, coll: &str, scan: Scan) -> StoreResult<Vec<Record>> {
        let coll = coll.to_owned();
        self.read(move |table| {
            let by_id = scan.sort.0 == "_id";
            let start = if by_id && scan.sort.1 == Order::Asc { id_lower_bound(&scan.filter) } else { None };
            let end = after_collection(&coll);
            let lower = start.as_deref().unwrap_or("");
            let range = table.range((coll.as_str(), lower)..(end.as_str(), "")).map_err(internal)?;
            let mut out = Vec::new();
            let mut push = |entry: Result<
                (redb::AccessGuard<(&str, &str)>, redb::AccessGuard<&[u8]>),
                redb::StorageError,
            >|
             -> StoreResult<bool> {
                let (_, value) = entry.map_err(internal)?;
                let record = decode(value.value())?;
                if matches(&record, &scan.filter)? {
                    out.push(record);
                }
                // With the key order being the scan order, stop once full.
                Ok(by_id && out.len() >= scan.limit)
            };
            if by_id && scan.sort.1 == Order::Desc {
                for entry in range.rev() {
                    if push(entry)? {
                        break;
                    }
                }
            } else {
                for entry in range {
                    if push(entry)? {
                        break;
                    }
                }
            }
            if !by_id {
                let field = scan.sort.0.as_str();
                out.sort_by(|a, b| {
                    let ord = sort_order(super::filter::lookup(a, field), super::filter::lookup(b, field))
                        .then_with(|| a.get_str("_id").unwrap_or("").cmp(b.get_str("_id").unwrap_or("")));
                    if scan.sort.1 == Order::Desc { ord.reverse() } else { ord }
                });
            }
            out.truncate(scan.limit);
            Ok(out)
        })
        .await
    }

    async fn collections(&self) -> StoreResult<Vec<String>> {
        self.read(|table| {
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

    async fn ensure_index(&self, _coll: &str, _index: IndexSpec) -> StoreResult<()> {
        Ok(())
    }
}
