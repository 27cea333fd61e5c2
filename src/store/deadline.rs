//! A deadline on every store operation: a store that stops answering (a
//! hung connection, a stalled disk) turns into `StoreError::Unavailable`
//! after `timeout` instead of a request, a heartbeat or a worker that waits
//! forever. The operation may still land later; the protocol treats that
//! like any write whose answer was lost (rule zero: re-read, then decide).
//! Every bounded operation is timed here
//! (`txgate_store_operation_duration_seconds`, `txgate_store_errors_total`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::layer::{Layer, Layered, Op};
use super::{DynStore, Store, StoreError, StoreResult};
use crate::metrics::Metrics;

/// The layer that bounds and times every bounded operation.
pub(crate) struct Deadline {
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl Deadline {
    /// A deadline of `timeout` on the operations of `inner`.
    pub(crate) fn over(inner: DynStore, timeout: Duration, metrics: Arc<Metrics>) -> Layered<Self> {
        Layered::new(inner, Self { timeout, metrics })
    }
}

impl Layer for Deadline {
    /// A sync, the close, a backup and building an index are not bounded:
    /// they take what the disk or the records take (migrations log their
    /// progress).
    async fn around<T: Send>(
        &self,
        _: &dyn Store,
        op: &Op<'_>,
        run: impl Future<Output = StoreResult<T>> + Send,
    ) -> StoreResult<T> {
        if !op.bounded {
            return run.await;
        }
        let started = Instant::now();
        let result = match tokio::time::timeout(self.timeout, run).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "the store did not answer {} within {} ms",
                op.name,
                self.timeout.as_millis()
            ))),
        };
        self.metrics.observe(&crate::metrics::STORE_OPERATION_DURATION, &[op.name], started.elapsed());
        if result.is_err() {
            self.metrics.count(&crate::metrics::STORE_ERRORS, &[op.name], 1);
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use async_trait::async_trait;

    use super::*;
    use crate::store::{Durability, IndexQuery, IndexSpec, Record, Scan, Write};

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
        async fn scan_found(&self, _: &str, _: Scan) -> StoreResult<crate::store::Found> {
            std::future::pending().await
        }
        async fn get_many_within(&self, _: &str, _: &[String], _: usize) -> StoreResult<crate::store::Found> {
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
        async fn query(&self, _: &str, _: &IndexQuery) -> StoreResult<crate::store::Found> {
            std::future::pending().await
        }
        async fn count(&self, _: &str, _: &IndexQuery) -> StoreResult<u64> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_hung_call_is_unavailable_at_its_deadline() {
        let metrics = Arc::new(Metrics::default());
        let store = Deadline::over(Arc::new(Hung), Duration::from_millis(5000), Arc::clone(&metrics));
        let started = tokio::time::Instant::now();
        let err = store.get("c", "a").await.unwrap_err();
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert_eq!(started.elapsed(), Duration::from_millis(5000));
        assert!(matches!(store.ping().await, Err(StoreError::Unavailable(_))));
        assert_eq!(metrics.get(&crate::metrics::STORE_ERRORS, &["get"]), 1);
        assert_eq!(metrics.get(&crate::metrics::STORE_ERRORS, &["ping"]), 1);
    }
}
