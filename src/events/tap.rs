//! A store layer that tells this process's log readers when an append to
//! the event log has landed, so that streams wake at once instead of
//! polling (appends by other instances are found by a stream's poll).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use tokio::sync::watch;

use crate::store::{Durability, DynStore, IndexSpec, Record, Scan, Store, StoreResult, Write};

use super::EVENTS;

pub struct Tap {
    inner: DynStore,
    appended: watch::Sender<u64>,
    /// Events appended through this layer (`txgate_events_written_total`).
    written: Arc<AtomicU64>,
}

impl Tap {
    pub fn new(inner: DynStore, appended: watch::Sender<u64>, written: Arc<AtomicU64>) -> Self {
        Self { inner, appended, written }
    }

    /// The log changed (`events` appended): readers wake.
    fn wake(&self, events: u64) {
        self.written.fetch_add(events, Ordering::Relaxed);
        self.appended.send_modify(|n| *n = n.wrapping_add(1));
    }
}

#[async_trait]
impl Store for Tap {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn ping(&self) -> StoreResult<()> {
        self.inner.ping().await
    }
    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>> {
        self.inner.get(coll, id).await
    }
    async fn write(&self, coll: &str, write: Write<'_>, durability: Durability) -> StoreResult<bool> {
        let (log, append) = (coll == EVENTS, matches!(write, Write::Append(_)));
        let done = self.inner.write(coll, write, durability).await?;
        if log && done {
            self.wake(u64::from(append));
        }
        Ok(done)
    }
    async fn write_in_order(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<usize> {
        let logged: Vec<(bool, bool)> =
            writes.iter().map(|(coll, w)| (*coll == EVENTS, matches!(w, Write::Append(_)))).collect();
        let applied = self.inner.write_in_order(writes, durability).await?;
        let logged = &logged[..applied.min(logged.len())];
        if logged.iter().any(|(log, _)| *log) {
            self.wake(logged.iter().filter(|(log, append)| *log && *append).count() as u64);
        }
        Ok(applied)
    }
    async fn append_all(&self, coll: &str, records: Vec<Record>) -> StoreResult<Vec<bool>> {
        let appended = self.inner.append_all(coll, records).await?;
        let n = appended.iter().filter(|a| **a).count() as u64;
        if coll == EVENTS && n > 0 {
            self.wake(n);
        }
        Ok(appended)
    }
    fn chains_cheaply(&self) -> bool {
        self.inner.chains_cheaply()
    }
    fn syncs(&self) -> Option<u64> {
        self.inner.syncs()
    }
    fn unreadable(&self) -> u64 {
        self.inner.unreadable()
    }
    async fn sync(&self) -> StoreResult<()> {
        self.inner.sync().await
    }
    async fn close(&self) -> StoreResult<()> {
        self.inner.close().await
    }
    async fn backup(&self, dest: &std::path::Path) -> StoreResult<Option<crate::store::BackupInfo>> {
        self.inner.backup(dest).await
    }
    async fn scan(&self, coll: &str, scan: Scan) -> StoreResult<Vec<Record>> {
        self.inner.scan(coll, scan).await
    }
    async fn get_many(&self, coll: &str, ids: &[String]) -> StoreResult<Vec<Record>> {
        self.inner.get_many(coll, ids).await
    }
    async fn collections(&self) -> StoreResult<Vec<String>> {
        self.inner.collections().await
    }
    async fn ensure_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        self.inner.ensure_index(coll, index).await
    }
    async fn drop_index(&self, coll: &str, name: &str) -> StoreResult<()> {
        self.inner.drop_index(coll, name).await
    }
    async fn indexes(&self, coll: &str) -> StoreResult<Vec<IndexSpec>> {
        self.inner.indexes(coll).await
    }
}
