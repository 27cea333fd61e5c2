//! The purge worker: deletes what the gateway keeps only for a while —
//! finished transaction records, idempotency claims, finished deliveries —
//! once past its retention. Every instance runs one; deletes are
//! conditional on the record still qualifying, so instances may overlap.
//! Each kind is purged along its index in batches that repeat while there
//! is work ([`crate::store::purge`]), so purges keep up with any commit
//! rate and cost nothing when there is nothing to purge.

use crate::worker::Worker;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::clock::Clock;
use crate::metrics::Metrics;
use crate::store::scans::ScanDecl;
use crate::store::{Bound, Bson, DateTime, DynStore, StoreResult};

/// One kind of record to purge: those found by `decl` with one of `eq`
/// (or none) whose order field is older than `retention`.
pub(crate) struct Rule {
    /// The metric label.
    pub what: &'static str,
    pub decl: &'static ScanDecl,
    /// Equality values; one scan per entry.
    pub eq: Vec<Vec<Bson>>,
    pub retention: Duration,
}

pub(crate) struct Purger {
    store: DynStore,
    clock: Clock,
    metrics: Arc<Metrics>,
    rules: Vec<Rule>,
    interval: Duration,
}

impl Purger {
    pub(crate) fn new(
        store: DynStore,
        clock: Clock,
        metrics: Arc<Metrics>,
        rules: Vec<Rule>,
        interval: Duration,
    ) -> Self {
        Self { store, clock, metrics, rules, interval }
    }

    /// One pass over every rule; how many records went.
    pub(crate) async fn purge_once(&self) -> StoreResult<usize> {
        let now = self.clock.now().timestamp_millis();
        let mut total = 0;
        for rule in &self.rules {
            let retention = i64::try_from(rule.retention.as_millis()).unwrap_or(i64::MAX);
            let cutoff = Bson::DateTime(DateTime::from_millis(now.saturating_sub(retention)));
            for eq in &rule.eq {
                let scan = rule.decl.scan(eq.clone()).to(Bound::Excluded(cutoff.clone()));
                let n = crate::store::purge(self.store.as_ref(), rule.decl.coll, scan).await?;
                self.metrics.add(&crate::metrics::PURGED, rule.what, n as u64);
                total += n;
            }
        }
        Ok(total)
    }
}

#[async_trait::async_trait]
impl Worker for Purger {
    fn name(&self) -> &'static str {
        "purge"
    }

    async fn run_once(&self) -> StoreResult<()> {
        self.purge_once().await.map(|_| ())
    }

    /// A pass every `interval` until `shutdown`.
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(self.interval) => {}
            }
            match self.purge_once().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(purged = n, "purge pass"),
                Err(err) => tracing::warn!(error = %err, "purge pass failed; retrying next interval"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::scans::TXNS_BY_FINISH;
    use crate::txn::record::{Status, TXNS, TxnRecord};

    /// More than a batch past retention goes in one pass; what is newer,
    /// or not finished, stays.
    #[tokio::test]
    async fn a_pass_purges_every_batch_past_the_cutoff() {
        let store: DynStore = Arc::new(MemoryStore::default());
        let now = DateTime::now().timestamp_millis();
        let old = DateTime::from_millis(now - 120_000);
        let recent = DateTime::from_millis(now - 1_000);
        let txn = |id: &str, status: Status, finished_at: DateTime| {
            TxnRecord { status, finished_at: Some(finished_at), ..TxnRecord::fenced(id, finished_at) }.to_record()
        };
        for i in 0..(crate::store::BATCH * 2 + 50) {
            store.insert(TXNS, txn(&format!("old{i:04}"), Status::Done, old)).await.unwrap();
        }
        store.insert(TXNS, txn("recent", Status::Done, recent)).await.unwrap();
        store.insert(TXNS, txn("running", Status::Pending, old)).await.unwrap();
        let rule = Rule {
            what: "transactions",
            decl: &TXNS_BY_FINISH,
            eq: vec![vec![Bson::String("done".into())]],
            retention: Duration::from_secs(60),
        };
        let metrics = Arc::new(Metrics::default());
        let purger =
            Purger::new(Arc::clone(&store), Clock::System, Arc::clone(&metrics), vec![rule], Duration::from_secs(1));
        assert_eq!(purger.purge_once().await.unwrap(), crate::store::BATCH * 2 + 50);
        assert_eq!(metrics.get(&crate::metrics::PURGED, &["transactions"]), (crate::store::BATCH * 2 + 50) as u64);
        assert!(store.get("_txns", "recent").await.unwrap().is_some());
        assert!(store.get("_txns", "running").await.unwrap().is_some());
        assert!(store.get("_txns", "old0000").await.unwrap().is_none());
        assert_eq!(purger.purge_once().await.unwrap(), 0);
    }
}
