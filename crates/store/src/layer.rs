//! The store stack's forwarding, written once. A layer of the stack (index
//! templates, deadlines, the event log's tap, a bench's counters) says
//! only what it changes, through [`Layer`]; [`Layered`] makes it a
//! [`Store`] over the store below, forwarding everything else, so that no
//! layer can forget an operation.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use super::{
    BackupInfo, Document, Durability, DynStore, IndexQuery, IndexSpec, Record, Scan, Store, StoreResult, Write,
    WriteKind,
};

/// One store operation, as a layer sees it on its way down.
#[derive(Clone, Copy, Debug)]
pub struct Op<'a> {
    /// `get`, `scan`, a write's kind (`insert`, `update`, ...),
    /// `write_in_order`, `append_all`, `sync`, ...
    pub name: &'static str,
    /// The collection, where the operation has one (the first write's, for
    /// a chain).
    pub coll: &'a str,
    /// Writes it carries (a chain's length, a batch's records).
    pub writes: usize,
    /// How many of them are appends to a log ([`Write::Append`]).
    pub appends: usize,
    /// For writes: whether they must be durable before the answer.
    pub durability: Option<Durability>,
    /// Whether it is bounded by a request's time: `false` for a sync, the
    /// close, a backup and building an index, which take what the disk or
    /// the records take.
    pub bounded: bool,
    /// For a single read or write, the record it is about, where the
    /// layer asks for it ([`Layer::inspects`]).
    pub detail: Option<&'a Detail>,
}

/// The record a single read or write is about, for a layer that decides
/// by it (a fault injector's rules).
#[derive(Clone, Debug, Default)]
pub struct Detail {
    /// The `_id` read or written.
    pub id: Option<String>,
    /// The fields an update sets.
    pub set: Option<Document>,
}

impl<'a> Op<'a> {
    fn read(name: &'static str, coll: &'a str) -> Self {
        Self { name, coll, writes: 0, appends: 0, durability: None, bounded: true, detail: None }
    }

    fn unbounded(name: &'static str, coll: &'a str) -> Self {
        Self { name, coll, writes: 0, appends: 0, durability: None, bounded: false, detail: None }
    }
}

/// What one layer of the store stack changes; every method has a default
/// that changes nothing.
pub trait Layer: Send + Sync + 'static {
    /// Run `run` (the operation on `below`, the store below): time it,
    /// bound it, count it, fail it.
    fn around<T: Send>(
        &self,
        below: &dyn Store,
        op: &Op<'_>,
        run: impl Future<Output = StoreResult<T>> + Send,
    ) -> impl Future<Output = StoreResult<T>> + Send {
        let _ = (below, op);
        run
    }

    /// Whether [`Op::detail`] is filled in for single reads and writes (it
    /// costs a copy of the id and of an update's fields).
    fn inspects(&self) -> bool {
        false
    }

    /// Before a write of `kind` to `coll` goes down (each write of a chain
    /// and each batch of appends included), with the store below at hand.
    fn before_write(
        &self,
        below: &dyn Store,
        coll: &str,
        kind: WriteKind,
    ) -> impl Future<Output = StoreResult<()>> + Send {
        let _ = (below, coll, kind);
        async { Ok(()) }
    }

    /// After writes landed: the collection and kind of each one applied
    /// (one per appended record of a batch).
    fn after_write(&self, landed: &[(&str, WriteKind)]) {
        let _ = landed;
    }

    /// Whether chains ([`Store::write_in_order`]) and batches of appends
    /// ([`Store::append_all`]) go down write by write, each through this
    /// layer on its own (a fault injector's points), rather than whole.
    fn splits_chains(&self) -> bool {
        false
    }
}

/// The collection and kind of each write of a chain.
fn kinds_of<'w>(writes: &[(&'w str, Write<'_>)]) -> Vec<(&'w str, WriteKind)> {
    writes.iter().map(|(coll, write)| (*coll, write.kind())).collect()
}

/// `layer` over the store `inner`.
pub struct Layered<L> {
    inner: DynStore,
    /// Shared with the layer over a snapshot of the store below.
    layer: Arc<L>,
}

impl<L: Layer> Layered<L> {
    /// Every write of a chain (`kinds`: collection and kind of each)
    /// announced to the layer; the operation the whole chain is to it.
    async fn before_chain<'k>(
        &self,
        name: &'static str,
        kinds: &'k [(&'k str, WriteKind)],
        durability: Durability,
    ) -> StoreResult<Op<'k>> {
        for (coll, kind) in kinds {
            self.layer.before_write(self.inner.as_ref(), coll, *kind).await?;
        }
        Ok(Op {
            name,
            coll: kinds.first().map_or("", |(coll, _)| *coll),
            writes: kinds.len(),
            appends: kinds.iter().filter(|(_, kind)| *kind == WriteKind::Append).count(),
            durability: Some(durability),
            bounded: true,
            detail: None,
        })
    }

    pub fn new(inner: DynStore, layer: L) -> Self {
        Self { inner, layer: Arc::new(layer) }
    }

    pub fn layer(&self) -> &L {
        &self.layer
    }

    /// The store below this layer.
    pub fn inner(&self) -> &DynStore {
        &self.inner
    }
}

#[async_trait]
impl<L: Layer> Store for Layered<L> {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn ping(&self) -> StoreResult<()> {
        self.layer.around(self.inner.as_ref(), &Op::read("ping", ""), self.inner.ping()).await
    }

    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>> {
        let detail = self.layer.inspects().then(|| Detail { id: Some(id.to_owned()), set: None });
        let op = Op { detail: detail.as_ref(), ..Op::read("get", coll) };
        self.layer.around(self.inner.as_ref(), &op, self.inner.get(coll, id)).await
    }

    async fn write(&self, coll: &str, write: Write<'_>, durability: Durability) -> StoreResult<bool> {
        let kind = write.kind();
        self.layer.before_write(self.inner.as_ref(), coll, kind).await?;
        let appends = usize::from(kind == WriteKind::Append);
        let detail = self.layer.inspects().then(|| Detail {
            id: write.id().map(str::to_owned),
            set: match &write {
                Write::Update { update, .. } => Some(update.set.clone()),
                _ => None,
            },
        });
        let op = Op {
            name: kind.as_str(),
            coll,
            writes: 1,
            appends,
            durability: Some(durability),
            bounded: true,
            detail: detail.as_ref(),
        };
        let done = self.layer.around(self.inner.as_ref(), &op, self.inner.write(coll, write, durability)).await?;
        if done {
            self.layer.after_write(&[(coll, kind)]);
        }
        Ok(done)
    }

    async fn write_in_order(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<usize> {
        if self.layer.splits_chains() {
            return super::write_each(self, writes, durability).await;
        }
        let kinds = kinds_of(&writes);
        let op = self.before_chain("write_in_order", &kinds, durability).await?;
        let applied =
            self.layer.around(self.inner.as_ref(), &op, self.inner.write_in_order(writes, durability)).await?;
        self.layer.after_write(&kinds[..applied.min(kinds.len())]);
        Ok(applied)
    }

    /// The store's below, less what a layer that takes chains apart (a
    /// fault injector) takes away: chains then land write by write.
    fn capabilities(&self) -> super::Capabilities {
        let below = self.inner.capabilities();
        if self.layer.splits_chains() {
            super::Capabilities { atomic_chains: false, all_or_nothing: false, ..below }
        } else {
            below
        }
    }

    fn opening(&self) -> Option<&str> {
        self.inner.opening()
    }

    /// The snapshot below, through this same layer: its reads are timed,
    /// bounded, counted and failed as every other read.
    async fn snapshot(&self) -> StoreResult<Option<DynStore>> {
        let below = self.layer.around(self.inner.as_ref(), &Op::read("snapshot", ""), self.inner.snapshot()).await?;
        Ok(below.map(|inner| Arc::new(Self { inner, layer: Arc::clone(&self.layer) }) as DynStore))
    }

    async fn write_all_or_nothing(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<bool> {
        if self.layer.splits_chains() {
            return Err(super::StoreError::Internal(
                "a layer that takes chains apart cannot apply writes all or nothing".into(),
            ));
        }
        let kinds = kinds_of(&writes);
        let op = self.before_chain("write_all_or_nothing", &kinds, durability).await?;
        let applied =
            self.layer.around(self.inner.as_ref(), &op, self.inner.write_all_or_nothing(writes, durability)).await?;
        if applied {
            self.layer.after_write(&kinds);
        }
        Ok(applied)
    }

    async fn append_all(&self, coll: &str, records: Vec<Record>) -> StoreResult<Vec<bool>> {
        if self.layer.splits_chains() {
            let mut out = Vec::with_capacity(records.len());
            for record in records {
                out.push(self.write(coll, Write::Append(record), Durability::Unsynced).await?);
            }
            return Ok(out);
        }
        self.layer.before_write(self.inner.as_ref(), coll, WriteKind::Append).await?;
        let op = Op {
            name: "append_all",
            coll,
            writes: records.len(),
            appends: records.len(),
            durability: Some(Durability::Unsynced),
            bounded: true,
            detail: None,
        };
        let appended = self.layer.around(self.inner.as_ref(), &op, self.inner.append_all(coll, records)).await?;
        let landed: Vec<(&str, WriteKind)> =
            appended.iter().filter(|a| **a).map(|_| (coll, WriteKind::Append)).collect();
        if !landed.is_empty() {
            self.layer.after_write(&landed);
        }
        Ok(appended)
    }

    async fn sync(&self) -> StoreResult<()> {
        self.layer.around(self.inner.as_ref(), &Op::unbounded("sync", ""), self.inner.sync()).await
    }

    async fn close(&self) -> StoreResult<()> {
        self.layer.around(self.inner.as_ref(), &Op::unbounded("close", ""), self.inner.close()).await
    }

    async fn backup(&self, dest: &Path) -> StoreResult<Option<BackupInfo>> {
        self.layer.around(self.inner.as_ref(), &Op::unbounded("backup", ""), self.inner.backup(dest)).await
    }

    fn syncs(&self) -> Option<u64> {
        self.inner.syncs()
    }

    fn checkpoints(&self) -> Option<(u64, std::time::Duration)> {
        self.inner.checkpoints()
    }

    fn unreadable(&self) -> u64 {
        self.inner.unreadable()
    }

    async fn scan_found(&self, coll: &str, scan: Scan) -> StoreResult<super::Found> {
        self.layer.around(self.inner.as_ref(), &Op::read("scan", coll), self.inner.scan_found(coll, scan)).await
    }

    async fn get_many_within(&self, coll: &str, ids: &[String], budget: usize) -> StoreResult<super::Found> {
        let read = self.inner.get_many_within(coll, ids, budget);
        self.layer.around(self.inner.as_ref(), &Op::read("get_many", coll), read).await
    }

    async fn collections(&self) -> StoreResult<Vec<String>> {
        self.layer.around(self.inner.as_ref(), &Op::read("collections", ""), self.inner.collections()).await
    }

    async fn ensure_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        self.layer
            .around(self.inner.as_ref(), &Op::unbounded("ensure_index", coll), self.inner.ensure_index(coll, index))
            .await
    }

    async fn drop_index(&self, coll: &str, name: &str) -> StoreResult<()> {
        self.layer.around(self.inner.as_ref(), &Op::read("drop_index", coll), self.inner.drop_index(coll, name)).await
    }

    async fn indexes(&self, coll: &str) -> StoreResult<Vec<IndexSpec>> {
        self.layer.around(self.inner.as_ref(), &Op::read("indexes", coll), self.inner.indexes(coll)).await
    }

    async fn query(&self, coll: &str, query: &IndexQuery) -> StoreResult<super::Found> {
        self.layer.around(self.inner.as_ref(), &Op::read("query", coll), self.inner.query(coll, query)).await
    }

    async fn query_raw(&self, coll: &str, query: &IndexQuery) -> StoreResult<super::FoundRaw> {
        self.layer.around(self.inner.as_ref(), &Op::read("query", coll), self.inner.query_raw(coll, query)).await
    }

    async fn count(&self, coll: &str, query: &IndexQuery) -> StoreResult<u64> {
        self.layer.around(self.inner.as_ref(), &Op::read("count", coll), self.inner.count(coll, query)).await
    }

    async fn declare_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        self.layer
            .around(self.inner.as_ref(), &Op::unbounded("declare_index", coll), self.inner.declare_index(coll, index))
            .await
    }

    async fn build_index_step(
        &self,
        coll: &str,
        name: &str,
        after: Option<&str>,
        batch: usize,
    ) -> StoreResult<Option<String>> {
        self.layer
            .around(
                self.inner.as_ref(),
                &Op::unbounded("build_index_step", coll),
                self.inner.build_index_step(coll, name, after, batch),
            )
            .await
    }
}
