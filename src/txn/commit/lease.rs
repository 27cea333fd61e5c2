//! The heartbeat: a running attempt's lease is extended every lease/3,
//! never past the transaction's hard cap, so recovery can judge any
//! attempt that stops beating.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::store::DateTime;

use super::Commit;
use crate::txn::record::{Status, Transition};

/// Extends a running attempt's lease every lease/3, never past its hard
/// cap, and tells the attempt as soon as it sees its record aborted.
pub(super) struct Heartbeat {
    pub(super) commit: Arc<Commit>,
    pub(super) txn: String,
    pub(super) hard_end: DateTime,
    /// Cancelled when the record is seen aborted (wounded, expired, ...).
    pub(super) wounded: CancellationToken,
}

impl Heartbeat {
    /// Beat until `stop` (the attempt ended), the hard cap, or the record
    /// is no longer pending.
    pub(super) async fn run(self, stop: CancellationToken) {
        let Self { commit, txn, hard_end, wounded } = self;
        let period = commit.cfg.lease / 3;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            let at = commit.cfg.clock.now();
            if at >= hard_end {
                // The hard cap is reached: the lease may not grow any more.
                return;
            }
            let beat = Transition::Heartbeat { expires_at: commit.lease_from(at).min(hard_end) };
            let beat = beat.apply(commit.store.as_ref(), &txn);
            let beat = tokio::select! {
                () = stop.cancelled() => return,
                beat = beat => beat,
            };
            match beat {
                Ok(true) => {}
                Ok(false) => {
                    // Not pending any more: find out why (rule zero).
                    if let Ok(Some(rec)) = commit.locks.record(&txn).await
                        && matches!(rec.status, Status::Aborted | Status::RolledBack)
                    {
                        wounded.cancel();
                    }
                    return;
                }
                Err(err) => tracing::warn!(txn.id = %txn, error = %err, "heartbeat failed"),
            }
        }
    }
}

impl Commit {
    /// The wall-clock time past which a transaction started at `started_at`
    /// may not live: its lease is never extended beyond it.
    pub(super) fn hard_end(&self, started_at: DateTime) -> DateTime {
        let max = i64::try_from(self.cfg.max_duration.as_millis()).unwrap_or(i64::MAX);
        DateTime::from_millis(started_at.timestamp_millis().saturating_add(max))
    }

    pub(super) fn lease_from(&self, at: DateTime) -> DateTime {
        let lease = i64::try_from(self.cfg.lease.as_millis()).unwrap_or(i64::MAX);
        DateTime::from_millis(at.timestamp_millis().saturating_add(lease))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::txn::record::{Status, TXNS, TxnRecord};

    #[tokio::test(start_paused = true)]
    async fn the_heartbeat_extends_the_lease_but_never_past_the_hard_cap() {
        use crate::store::{DynStore, memory::MemoryStore};
        let store: DynStore = Arc::new(MemoryStore::default());
        let cfg = super::super::TxnConfig {
            lease: Duration::from_millis(300),
            max_duration: Duration::from_millis(1000),
            clock: crate::clock::Clock::following_tokio(),
            ..Default::default()
        };
        let txns = crate::transactions(Arc::clone(&store), cfg, Arc::new(crate::metrics::Metrics::default())).0;
        let engine = Arc::clone(&txns.commit);
        let txn = uuid::Uuid::now_v7().to_string();
        let started = engine.cfg.clock.now();
        let rec = TxnRecord {
            status: Status::Pending,
            expires_at: engine.lease_from(started),
            ..TxnRecord::fenced(&txn, started)
        };
        store.insert(TXNS, rec.to_record()).await.unwrap();
        let hard_end = engine.hard_end(started);
        let stop = CancellationToken::new();
        let beat =
            Heartbeat { commit: Arc::clone(&engine), txn: txn.clone(), hard_end, wounded: CancellationToken::new() };
        let task = tokio::spawn(beat.run(stop.clone()));
        let mut latest = 0;
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let expires = engine.locks.record(&txn).await.unwrap().unwrap().expires_at.timestamp_millis();
            assert!(expires <= hard_end.timestamp_millis(), "lease extended past the hard cap");
            let now = engine.cfg.clock.now().timestamp_millis();
            if now < hard_end.timestamp_millis() {
                assert!(expires > now, "the lease ran out while the attempt was alive");
            }
            latest = expires;
        }
        assert_eq!(latest, hard_end.timestamp_millis(), "extended up to the cap");
        assert!(task.is_finished(), "the heartbeat stops at the hard cap");
        stop.cancel();
    }
}
