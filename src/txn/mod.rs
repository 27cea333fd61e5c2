//! Multi-document transactions over single-document compare-and-set: the
//! commit protocol, lock conflicts and wound-wait, roll-forward, roll-back
//! and recovery (DESIGN §3).

pub mod commit;
pub mod finish;
pub mod idem;
pub mod locks;
pub mod outputs;
pub mod plan;
pub mod record;
pub mod recovery;
pub mod signals;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::metrics::Metrics;
use crate::store::{DynStore, StoreResult};

pub use record::{Status, TxnRecord};

/// Protocol timings.
#[derive(Clone, Debug)]
pub struct TxnConfig {
    pub lease: Duration,
    pub lock_wait: Duration,
    pub clock_skew: Duration,
    pub recovery_interval: Duration,
    /// Hard cap on one transaction's life: past it, it aborts itself, and
    /// its lease is never extended beyond it.
    pub max_duration: Duration,
    /// Deadline of every store operation.
    pub store_timeout: Duration,
    /// How long finished records are kept.
    pub retention: Duration,
    /// How long idempotency keys are remembered.
    pub idempotency_retention: Duration,
    /// Most actions one transaction may have.
    pub max_actions: usize,
    /// Most hooks one transaction may have.
    pub max_hooks: usize,
    /// Where timestamps come from.
    pub clock: crate::clock::Clock,
}

impl Default for TxnConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_millis(5000),
            lock_wait: Duration::from_millis(2000),
            clock_skew: Duration::from_millis(1000),
            recovery_interval: Duration::from_millis(1000),
            max_duration: Duration::from_millis(30_000),
            store_timeout: Duration::from_millis(5000),
            retention: Duration::from_secs(24 * 3600),
            idempotency_retention: Duration::from_secs(24 * 3600),
            max_actions: 1000,
            max_hooks: 16,
            clock: crate::clock::Clock::System,
        }
    }
}

/// The protocol engine shared by the HTTP handlers and the workers. Its
/// state is reached from outside `txn/` only through the methods below.
pub struct Engine {
    store: DynStore,
    cfg: TxnConfig,
    metrics: Arc<Metrics>,
    /// Background work started on a request's behalf (roll-forward after
    /// the answer); awaited at shutdown.
    tasks: TaskTracker,
    /// Transactions this process is rolling forward in the background.
    helping: Mutex<HashSet<String>>,
    /// In-process wake-ups for wounds and lock releases.
    signals: signals::Signals,
    /// What a committed transaction leaves behind besides its documents.
    outputs: Vec<Arc<dyn outputs::Outputs>>,
}

impl Engine {
    pub fn new(
        store: DynStore,
        cfg: TxnConfig,
        metrics: Arc<Metrics>,
        outputs: Vec<Arc<dyn outputs::Outputs>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            cfg,
            metrics,
            tasks: TaskTracker::new(),
            helping: Mutex::default(),
            signals: Default::default(),
            outputs,
        })
    }

    /// A page of transaction records, oldest first, optionally only those
    /// with `status`.
    pub async fn list_transactions(
        &self,
        status: Option<Status>,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<(Vec<TxnRecord>, Option<String>)> {
        let scan = match status {
            Some(s) => crate::store::scans::TXNS_BY_STATUS.scan(vec![s.to_bson()]),
            None => crate::store::scans::TXNS.scan(Vec::new()),
        };
        crate::store::page(self.store.as_ref(), record::TXNS, scan, after, limit, TxnRecord::from_record).await
    }

    pub fn store(&self) -> &DynStore {
        &self.store
    }

    pub fn config(&self) -> &TxnConfig {
        &self.cfg
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Background work started on a request's behalf; a caller that stops
    /// the engine closes it and waits.
    pub fn tasks(&self) -> &TaskTracker {
        &self.tasks
    }

    /// Wait until `coll`/`id` is released in this process, or `max` passes.
    pub async fn wait_release(&self, coll: &str, id: &str, max: std::time::Duration) {
        self.signals.wait_release(coll, id, max).await;
    }

    /// The current time by this engine's clock.
    pub fn now(&self) -> crate::store::DateTime {
        self.cfg.clock.now()
    }

    /// Make sure every output of committed `rec` exists: called before any
    /// of its locks is released.
    pub async fn ensure_outputs(&self, rec: &TxnRecord) -> StoreResult<()> {
        // Kinds of output are independent of one another: made at once.
        futures::future::join_all(self.outputs.iter().map(|o| o.ensure(rec))).await.into_iter().collect()
    }
}

/// The commit summary: the 200 answer, and the default hook body.
pub fn summary(rec: &TxnRecord) -> serde_json::Value {
    use crate::clock::rfc3339;
    let results: Vec<_> = rec
        .results
        .iter()
        .flatten()
        .map(|r| serde_json::json!({"collection": r.collection, "id": r.id, "version": r.version}))
        .collect();
    let hooks: Vec<_> = (0..rec.hook_count)
        .map(|i| serde_json::json!({"id": format!("{}:{i}", rec.id), "status": "pending"}))
        .collect();
    serde_json::json!({
        "id": rec.id,
        "status": "committed",
        "committed_at": rec.committed_at.map(rfc3339),
        "results": results,
        "hooks": hooks,
    })
}
