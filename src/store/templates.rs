//! Index templates: user collections are created at run time, by their
//! first write, and each gets the indexes the migrations declare for `*`
//! (see [`super::scans`]) before that write lands, on either backend.
//! Which collections are done is remembered per process; ensuring an index
//! that exists is a no-op, so instances and restarts may repeat it.

use std::collections::HashSet;
use std::sync::RwLock;

use async_trait::async_trait;

use super::{Durability, DynStore, IndexSpec, Record, Scan, Store, StoreResult, Write};

pub struct Templates {
    inner: DynStore,
    templates: Vec<IndexSpec>,
    done: RwLock<HashSet<String>>,
}

impl Templates {
    pub fn new(inner: DynStore, templates: Vec<IndexSpec>) -> Self {
        Self { inner, templates, done: RwLock::default() }
    }

    /// Make sure user collection `coll` has every template index.
    async fn prepare(&self, coll: &str) -> StoreResult<()> {
        if coll.starts_with('_') || self.done.read().expect("template set").contains(coll) {
            return Ok(());
        }
        for index in &self.templates {
            self.inner.ensure_index(coll, index.clone()).await?;
        }
        self.done.write().expect("template set").insert(coll.to_owned());
        Ok(())
    }
}

#[async_trait]
impl Store for Templates {
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
        // A delete needs no index: it can only remove what a write put there.
        if !matches!(write, Write::Delete { .. }) {
            self.prepare(coll).await?;
        }
        self.inner.write(coll, write, durability).await
    }
    async fn write_in_order(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<usize> {
        for (coll, write) in &writes {
            if !matches!(write, Write::Delete { .. }) {
                self.prepare(coll).await?;
            }
        }
        self.inner.write_in_order(writes, durability).await
    }
    async fn append_all(&self, coll: &str, records: Vec<Record>) -> StoreResult<Vec<bool>> {
        self.prepare(coll).await?;
        self.inner.append_all(coll, records).await
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
    async fn backup(&self, dest: &std::path::Path) -> StoreResult<Option<super::BackupInfo>> {
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
