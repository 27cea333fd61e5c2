//! Deciding (§3 step 4): the commit CAS, the outcome of one that failed
//! or could not be confirmed, giving up an attempt that cannot commit, and
//! starting its roll-forward or roll-back in the background.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::store::StoreError;
use crate::txn::plan::Plan;
use crate::txn::record::{AbortReason, Failure, Status, TXNS, Transition, TxnRecord};

use super::prepare::member_results;
use super::{Commit, Committed, TxnError};
use super::{aborted, aborted_as};

impl Commit {
    /// Step 4, the commit point, for `record` whose members are locked at
    /// `bases`; then step 5 starts in the background.
    pub(super) async fn commit(
        self: &Arc<Self>,
        plan: &Plan,
        mut record: TxnRecord,
        bases: Vec<(usize, i64)>,
    ) -> Result<Committed, TxnError> {
        let txn = record.id.clone();
        // A write under way (for readers that wait for none) until the
        // roll-forward is ticketed.
        let _writing = self.follow_ups.writing().await;
        // 4. Commit point.
        let committed_at = self.cfg.clock.now();
        let results = member_results(plan, &mut record.members, &bases);
        let commit = Transition::Commit { at: committed_at, results: &results, members: &record.members };
        let cas = commit.apply(self.store.as_ref(), &txn).await;
        let decided = match cas {
            Ok(true) => None,
            // Lost the CAS or cannot tell: re-read until the outcome is known.
            Ok(false) | Err(_) => Some(self.outcome_after_commit_attempt(&txn, AbortReason::CommitUnconfirmed).await),
        };
        let record = match decided {
            None => {
                record.status = Status::Committed;
                record.committed_at = Some(committed_at);
                record.results = Some(results);
                record
            }
            Some(Ok(rec)) if rec.status.is_committed() => rec,
            Some(Ok(rec)) => return Err(self.found_aborted(rec)),
            Some(Err(err)) => return Err(err),
        };
        let record = self.committed_then_forward(plan, record);
        Ok(Committed { record })
    }

    /// After a commit CAS that failed or errored: read the record until its
    /// status is decided. A still-pending record means the CAS did not land;
    /// the outcome is then settled as an abort. Gives up (outcome unknown)
    /// after the store deadline: the client is told to read the record, and
    /// its Idempotency-Key stays with this attempt.
    /// A record still pending is aborted with `reason`.
    pub(super) async fn outcome_after_commit_attempt(
        &self,
        txn: &str,
        reason: AbortReason,
    ) -> Result<TxnRecord, TxnError> {
        let give_up_at = Instant::now() + self.cfg.store_timeout;
        let mut backoff = Duration::from_millis(10);
        loop {
            match self.locks.record(txn).await {
                Ok(Some(rec)) if rec.status != Status::Pending => return Ok(rec),
                Ok(Some(_)) => {
                    // Still pending: our CAS did not land. Try the decision again
                    // as an abort so the outcome is settled one way.
                    let _ = self.locks.abort_pending(txn, None, reason).await;
                }
                Ok(None) => {
                    return Err(TxnError::Store {
                        txn: txn.to_owned(),
                        source: StoreError::Internal("transaction record vanished".into()),
                    });
                }
                Err(_) => {}
            }
            if Instant::now() >= give_up_at {
                return Err(TxnError::OutcomeUnknown { txn: txn.to_owned() });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(500));
        }
    }

    /// Abort `txn` (it did not reach its commit point) and roll it back in
    /// the background. If the record turns out committed after all (it
    /// cannot, since only this path commits it), its roll-forward wins.
    pub(super) async fn give_up(self: &Arc<Self>, txn: &str, err: TxnError) -> TxnError {
        if matches!(err, TxnError::Store { .. }) {
            // The store is failing: answer now rather than after more calls
            // to it. The abort and roll-back go on in the background; if they
            // fail too, the lease (no longer extended) runs out and recovery
            // does them.
            let (commit, txn) = (Arc::clone(self), txn.to_owned());
            self.follow_ups.spawn(async move {
                if let Ok(Some(rec)) = commit.locks.abort_pending(&txn, None, AbortReason::StoreError).await {
                    commit.roll_back_in_background(rec);
                }
            });
            return err;
        }
        let (reason, stored) = match &err {
            TxnError::Aborted { failure, .. } | TxnError::InvalidChange { failure, .. } => {
                (failure.abort_reason().unwrap_or(AbortReason::Failed(failure.code)), Some(failure.clone()))
            }
            _ => (AbortReason::StoreError, None),
        };
        let abort = Transition::Abort { reason, failure: stored.as_ref(), lease: None };
        if let Ok(true) = abort.apply(self.store.as_ref(), txn).await {
            self.metrics.aborted(reason.as_str());
        }
        match self.locks.record(txn).await {
            Ok(Some(rec)) if matches!(rec.status, Status::Aborted | Status::RolledBack) => {
                // A wound or expiry got there first: report that instead.
                let own = rec.abort_reason.as_deref() == Some(reason.as_str());
                self.roll_back_in_background(rec.clone());
                if !own && rec.abort_reason.is_some() {
                    let why = rec.abort_reason.unwrap_or_default();
                    return TxnError::Aborted {
                        txn: txn.to_owned(),
                        failure: aborted_as(&why, format!("the transaction was aborted ({why})")),
                    };
                }
                err
            }
            // Not decided here (the store is failing): recovery aborts it
            // once its lease runs out.
            _ => err,
        }
    }

    pub(crate) fn roll_back_in_background(self: &Arc<Self>, rec: TxnRecord) {
        let commit = Arc::clone(self);
        self.follow_ups.spawn(async move {
            let rec = match rec.status {
                Status::Aborted | Status::RolledBack => rec,
                _ => return,
            };
            if let Err(err) = commit.finish.roll_back(&rec).await {
                tracing::warn!(txn.id = %rec.id, error = %err, "roll-back failed; recovery will finish it");
            }
        });
    }

    /// The answer for a transaction whose commit CAS did not land and whose
    /// record `rec` was then found aborted: 409 with its reason; the
    /// roll-back goes on in the background.
    pub(super) fn found_aborted(self: &Arc<Self>, rec: TxnRecord) -> TxnError {
        let reason = rec.abort_reason.clone().unwrap_or_else(|| "aborted".into());
        let err = TxnError::Aborted {
            txn: rec.id.clone(),
            failure: aborted_as(&reason, format!("the transaction was aborted ({reason})")),
        };
        self.roll_back_in_background(rec);
        err
    }

    /// Committed `rec` whose roll-forward is not known to be done: waiters
    /// are told (they may now apply the change and go on), and step 5 runs
    /// in the background, after the answer; recovery finishes it if this
    /// fails.
    pub(super) fn committed_then_forward(self: &Arc<Self>, plan: &Plan, rec: TxnRecord) -> TxnRecord {
        let txn = rec.id.as_str();
        tracing::info!(txn.id = %txn, "transaction committed");
        for a in &plan.actions {
            self.signals.released(&a.collection, &a.id);
        }
        let commit = Arc::clone(self);
        let forward = rec.clone();
        self.follow_ups.spawn_settled(async move {
            if let Err(err) = commit.finish.roll_forward(&forward).await {
                tracing::warn!(txn.id = %forward.id, error = %err, "roll-forward failed; recovery will finish it");
            }
        });
        rec
    }

    /// The maximum duration ran out before the record was known to be
    /// written: the transaction is aborted (`timeout`) either way. Its
    /// record is inserted aborted if it is not there, so the answer's
    /// transaction id can be looked up, and the chain, if it lands later,
    /// finds the id taken and locks nothing; if the record is there, it is
    /// aborted as any other.
    pub(super) async fn timed_out_preparing(
        self: &Arc<Self>,
        plan: &Plan,
        record: TxnRecord,
    ) -> Result<Committed, TxnError> {
        let failure =
            aborted(AbortReason::Timeout, "the transaction ran longer than its maximum duration (TXGATE_TXN_MAX_MS)");
        let txn = record.id.clone();
        match self.fence(&record, failure.clone()).await {
            // A chain that wrote the whole transaction landed first.
            Ok(Some(rec)) if rec.status.is_committed() => {
                Ok(Committed { record: self.committed_then_forward(plan, rec) })
            }
            _ => Err(self.give_up(&txn, TxnError::Aborted { txn: txn.clone(), failure }).await),
        }
    }

    /// Insert `record` aborted with `failure` unless a record with its id
    /// exists, so that a write of it still under way (its outcome unknown)
    /// finds the id taken. `None`: fenced now; else the record as it is.
    pub(super) async fn fence(&self, record: &TxnRecord, failure: Failure) -> Result<Option<TxnRecord>, TxnError> {
        let mut fenced = record.clone();
        fenced.status = Status::Aborted;
        fenced.abort_reason = failure.reason.clone();
        fenced.failure = Some(failure);
        let unknown = || TxnError::OutcomeUnknown { txn: record.id.clone() };
        match self.store.unsynced().insert(TXNS, fenced.to_record()).await {
            Ok(true) => Ok(None),
            Ok(false) => match self.locks.record(&record.id).await {
                Ok(Some(rec)) => Ok(Some(rec)),
                _ => Err(unknown()),
            },
            Err(_) => Err(unknown()),
        }
    }
}
