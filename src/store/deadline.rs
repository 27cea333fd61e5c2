//! A deadline on every store operation: a store that stops answering (a
//! hung connection, a stalled disk) turns into `StoreError::Unavailable`
//! after `timeout` instead of a request, a heartbeat or a worker that waits
//! forever. The operation may still land later; the protocol treats that
//! like any write whose answer was lost (rule zero: re-read, then decide).
//! Every bounded operation is timed here
//! (`txgate_store_operation_duration_seconds`, `txgate_store_errors_total`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{Durability, DynStore, IndexSpec, Record, Scan, Store, StoreError, StoreResult, Write};
use crate::metrics::Metrics;

pub struct Deadline {
    inner: DynStore,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Deadline {
    pub fn new(inner: DynStore, timeout: Duration, metrics: Arc<Metrics>) -> Self {
        Self { inner, timeout, metrics }
    }

    async fn within<T>(&self, op: &str, fut: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
        let started = Instant::now();
        let result = match tokio::time::timeout(self.timeout, fut).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "the store did not answer {op} within {} ms",
                self.timeout.as_millis()
            ))),
        };
        self.metrics.observe("txgate_store_operation_duration_seconds", &[op], started.elapsed());
        if result.is_err() {
            self.metrics.count("txgate_store_errors_total", &[op], 1);
        }
        result
    }
}

#[async_trait]
impl Store for Deadline {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn ping(&self) -> StoreResult<()> {
        self.within("ping", self.inner.ping()).await
    }
    async fn get(&self, coll: &str, id: &str) -> StoreResult<Option<Record>> {
        self.within("get", self.inner.get(coll, id)).await
    }
    async fn write(&self, coll: &str, write: Write<'_>, durability: Durability) -> StoreResult<bool> {
        self.within(write.kind(), self.inner.write(coll, write, durability)).await
    }
    async fn write_in_order(&self, writes: Vec<(&str, Write<'_>)>, durability: Durability) -> StoreResult<usize> {
        self.within("write_in_order", self.inner.write_in_order(writes, durability)).await
    }
    async fn append_all(&self, coll: &str, records: Vec<Record>) -> StoreResult<Vec<bool>> {
        self.within("append_all", self.inner.append_all(coll, records)).await
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
    /// Not bounded: a sync at shutdown takes what the disk takes.
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
        self.within("scan", self.inner.scan(coll, scan)).await
    }
    async fn get_many(&self, coll: &str, ids: &[String]) -> StoreResult<Vec<Record>> {
        self.within("get_many", self.inner.get_many(coll, ids)).await
    }
    async fn collections(&self) -> StoreResult<Vec<String>> {
        self.within("collections", self.inner.collections()).await
    }
    /// Not bounded: building an index over existing records takes as long
    /// as the records take (migrations log their progress).
    async fn ensure_index(&self, coll: &str, index: IndexSpec) -> StoreResult<()> {
        self.inner.ensure_index(coll, index).await
    }
    async fn drop_index(&self, coll: &str, name: &str) -> StoreResult<()> {
        self.within("drop_index", self.inner.drop_index(coll, name)).await
    }
    async fn indexes(&self, coll: &str) -> StoreResult<Vec<IndexSpec>> {
        self.within("indexes", self.inner.indexes(coll)).await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A store whose every call hangs.
    struct Hung;

    #[async_trait]
    impl Store for Hung {
        fn backend(&self) -> &'static str {
            "hung"
        }
        async fn ping(&self) -> StoreResult<()> {
            std::future::pending().await
        }
        async fn get(&self, _: &str, _: &str) -> StoreResult<Option<Record>> {
            std::future::pending().await
        }
        async fn write(&self, _: &str, _: Write<'_>, _: Durability) -> StoreResult<bool> {
            std::future::pending().await
        }
        async fn sync(&self) -> StoreResult<()> {
            std::future::pending().await
        }
        async fn scan(&self, _: &str, _: Scan) -> StoreResult<Vec<Record>> {
            std::future::pending().await
        }
        async fn get_many(&self, _: &str, _: &[String]) -> StoreResult<Vec<Record>> {
            std::future::pending().await
        }
        async fn collections(&self) -> StoreResult<Vec<String>> {
            std::future::pending().await
        }
        async fn drop_index(&self, _: &str, _: &str) -> StoreResult<()> {
            Ok(())
        }
        async fn indexes(&self, _: &str) -> StoreResult<Vec<IndexSpec>> {
            Ok(Vec::new())
        }
        async fn ensure_index(&self, _: &str, _: IndexSpec) -> StoreResult<()> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_call_is_unavailable_at_its_deadline() {
        let metrics = Arc::new(Metrics::default());
        let store = Deadline::new(Arc::new(Hung), Duration::from_millis(5000), Arc::clone(&metrics));
        let started = tokio::time::Instant::now();
        let err = store.get("c", "a").await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert_eq!(started.elapsed(), Duration::from_millis(5000));
        assert!(matches!(store.ping().await, Err(StoreError::Unavailable(_))));
        assert_eq!(metrics.get("txgate_store_errors_total", &["get"]), 1);
        assert_eq!(metrics.get("txgate_store_errors_total", &["ping"]), 1);
    }
}
