//! What anyone who meets a locked document does about it (DESIGN §3 step 3
//! and §2): finish a committed holder's change on that document, clear the
//! lock of a holder that is aborted, rolled back or gone, abort a holder
//! whose lease ran out, and otherwise report it busy.
//!
//! Rule zero holds throughout: a lock is applied only after its holder was
//! seen committed, and dropped only after it was seen aborted, rolled back
//! or missing.

use crate::documents::model::StoredDoc;
use crate::store::{DateTime, StoreResult};
use crate::txn::record::Transition;

use super::Engine;
use super::record::{Status, TXNS, TxnRecord};

/// The outcome of meeting a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The lock was dealt with (or changed under us): read again.
    Retry,
    /// Held by a live transaction.
    Busy { holder: String },
}

impl Engine {
    /// The transaction record of `txn`, if it exists.
    pub async fn record(&self, txn: &str) -> StoreResult<Option<TxnRecord>> {
        match self.store.get(TXNS, txn).await? {
            Some(rec) => TxnRecord::from_record(rec).map(Some),
            None => Ok(None),
        }
    }

    /// Whether a pending record's lease ran out by this instance's clock,
    /// allowing for `clock_skew`.
    pub fn lease_expired(&self, rec: &TxnRecord, now: DateTime) -> bool {
        let skew = i64::try_from(self.cfg.clock_skew.as_millis()).unwrap_or(i64::MAX);
        rec.expires_at.timestamp_millis().saturating_add(skew) < now.timestamp_millis()
    }

    /// CAS a pending record to aborted. `expires_at` pins the lease that was
    /// judged expired, so a heartbeat that landed first wins. Returns the
    /// record as it is afterwards (re-read: rule zero).
    pub async fn abort_pending(
        &self,
        txn: &str,
        expires_at: Option<DateTime>,
        reason: &str,
    ) -> StoreResult<Option<TxnRecord>> {
        let abort = Transition::Abort { reason, failure: None, lease: expires_at };
        let done = abort.apply(self.store.as_ref(), txn).await?;
        if done {
            self.signals.aborted(txn);
            self.metrics.aborted(reason);
            if reason == "wounded" {
                self.metrics.count("txgate_wounds_total", &[], 1);
            }
            tracing::info!(txn.id = %txn, reason, "transaction aborted");
        }
        self.record(txn).await
    }

    /// Deal with the lock on `doc` (which must carry one). `wounder` is a
    /// transaction that waits for this lock and may wound its holder: if it
    /// is older than a live holder, the holder is aborted (wound-wait).
    pub async fn settle(&self, coll: &str, doc: &StoredDoc, wounder: Option<&str>) -> StoreResult<Settled> {
        let Some(holder) = doc.meta.txn.clone() else { return Ok(Settled::Retry) };
        let mut rec = self.record(&holder).await?;
        loop {
            match &rec {
                None => {
                    self.release_stale(&holder, coll, doc).await?;
                    return Ok(Settled::Retry);
                }
                Some(r) if matches!(r.status, Status::Aborted | Status::RolledBack) => {
                    self.release_stale(&holder, coll, doc).await?;
                    return Ok(Settled::Retry);
                }
                Some(r) if r.status.is_committed() => {
                    self.roll_forward_member(r, coll, doc).await?;
                    return Ok(Settled::Retry);
                }
                Some(r) if self.lease_expired(r, self.now()) => {
                    rec = self.abort_pending(&holder, Some(r.expires_at), "expired").await?;
                }
                Some(_) => match wounder {
                    Some(txn) if super::commit::older(txn, &holder) => {
                        tracing::debug!(txn.id = %txn, wounded = %holder, "wounding a younger transaction");
                        rec = self.abort_pending(&holder, None, "wounded").await?;
                    }
                    _ => return Ok(Settled::Busy { holder }),
                },
            }
        }
    }

    /// Apply the staged change of committed `rec` to `doc` and release it.
    /// The transaction's deliveries are made sure of first, so a lock is
    /// never released before its hooks are recorded.
    pub async fn roll_forward_member(&self, rec: &TxnRecord, coll: &str, doc: &StoredDoc) -> StoreResult<bool> {
        if rec.status == Status::Committed {
            self.ensure_outputs(rec).await?;
        }
        let at = rec.committed_at.unwrap_or_else(|| self.now());
        let next = doc.rolled_forward(at);
        let filter = doc.unchanged_filter(Some(&rec.id));
        // Unsynced: recovery rolls forward again from the committed record.
        let done = self.store.unsynced().replace(coll, &doc.id, filter, next.to_record()).await?;
        if done {
            self.signals.released(coll, &doc.id);
        }
        Ok(done)
    }

    /// Drop the lock of a holder seen aborted, rolled back or missing.
    pub async fn release_stale(&self, holder: &str, coll: &str, doc: &StoredDoc) -> StoreResult<bool> {
        let done = self.unlock(holder, coll, doc).await?;
        if done {
            self.metrics.recovery_action("lock_released");
        }
        Ok(done)
    }

    /// A running transaction gives back its own lock on `coll`/`id` (to take
    /// it again later, in order).
    pub async fn unlock_own(&self, txn: &str, coll: &str, id: &str) -> StoreResult<()> {
        while let Some(rec) = self.store.get(coll, id).await? {
            let doc = StoredDoc::from_record(rec)?;
            if doc.meta.txn.as_deref() != Some(txn) || self.unlock(txn, coll, &doc).await? {
                break;
            }
        }
        Ok(())
    }

    /// Restore `doc` as it was before `holder` locked it (or remove the
    /// placeholder `holder` inserted).
    async fn unlock(&self, holder: &str, coll: &str, doc: &StoredDoc) -> StoreResult<bool> {
        let filter = doc.unchanged_filter(Some(holder));
        // Unsynced: a lock lost in a crash is one recovery releases again.
        let done = match doc.rolled_back() {
            Some(restored) => self.store.unsynced().replace(coll, &doc.id, filter, restored.to_record()).await?,
            None => self.store.unsynced().delete(coll, &doc.id, filter).await?,
        };
        if done {
            self.signals.released(coll, &doc.id);
        }
        Ok(done)
    }
}
