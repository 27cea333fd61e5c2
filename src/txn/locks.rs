//! What anyone who meets a locked document does about it (docs/design.md §3 step 3
//! and §2): finish a committed holder's change on that document, clear the
//! lock of a holder that is aborted, rolled back or gone, abort a holder
//! whose lease ran out, and otherwise report it busy.
//!
//! Rule zero holds throughout: a lock is applied only after its holder was
//! seen committed, and dropped only after it was seen aborted, rolled back
//! or missing.

use std::sync::Arc;
use std::time::Duration;

use crate::document::StoredDoc;
use crate::metrics::Metrics;
use crate::store::{DateTime, DynStore, StoreResult};

use super::TxnConfig;
use super::age::older;
use super::finish::Finish;
use super::record::{AbortReason, Status, TXNS, Transition, TxnRecord};
use super::signals::Signals;

/// The outcome of meeting a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settled {
    /// The lock was dealt with (or changed under us): read again.
    Retry,
    /// Held by a live transaction.
    Busy { holder: String },
}

/// The locks service: what anyone who meets a locked document does about
/// it, and the transaction records it judges by.
pub struct Locks {
    store: DynStore,
    cfg: TxnConfig,
    metrics: Arc<Metrics>,
    signals: Arc<Signals>,
    finish: Arc<Finish>,
}

impl Locks {
    pub(super) fn new(
        store: DynStore,
        cfg: TxnConfig,
        metrics: Arc<Metrics>,
        signals: Arc<Signals>,
        finish: Arc<Finish>,
    ) -> Arc<Self> {
        Arc::new(Self { store, cfg, metrics, signals, finish })
    }

    fn now(&self) -> DateTime {
        self.cfg.clock.now()
    }

    /// Wait until `coll`/`id` is released in this process, or `max` passes.
    pub async fn wait_release(&self, coll: &str, id: &str, max: Duration) {
        self.signals.wait_release(coll, id, max).await;
    }

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
        reason: AbortReason,
    ) -> StoreResult<Option<TxnRecord>> {
        let abort = Transition::Abort { reason, failure: None, lease: expires_at };
        let done = abort.apply(self.store.as_ref(), txn).await?;
        if done {
            self.signals.aborted(txn);
            self.metrics.aborted(reason.as_str());
            if reason == AbortReason::Wounded {
                self.metrics.count(&crate::metrics::WOUNDS, &[], 1);
            }
            tracing::info!(txn.id = %txn, reason = reason.as_str(), "transaction aborted");
        }
        self.record(txn).await
    }

    /// For a reader who met `holder`'s lock: when `holder` committed, if it
    /// did (the reader then sees its post-image), with its roll-forward
    /// started in the background, never on the read path; `None` while it
    /// is not committed.
    pub async fn committed_at(&self, holder: &str) -> StoreResult<Option<DateTime>> {
        match self.record(holder).await? {
            Some(rec) if rec.status.is_committed() => {
                let at = rec.committed_at.unwrap_or_else(|| self.now());
                self.finish.help_roll_forward(rec);
                Ok(Some(at))
            }
            _ => Ok(None),
        }
    }

    /// Finish committed `rec` now, on the caller's path (a query that must
    /// see its writes): its outputs, then every member still held.
    pub async fn finish_committed(&self, rec: &TxnRecord) -> StoreResult<()> {
        self.finish.roll_forward(rec).await
    }

    /// How long a live holder's lock may last before it can be judged
    /// expired: what a 423 tells a client to wait.
    pub fn lease(&self) -> Duration {
        self.cfg.lease
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
                    self.finish.release_stale(&holder, coll, doc).await?;
                    return Ok(Settled::Retry);
                }
                Some(r) if matches!(r.status, Status::Aborted | Status::RolledBack) => {
                    self.finish.release_stale(&holder, coll, doc).await?;
                    return Ok(Settled::Retry);
                }
                Some(r) if r.status.is_committed() => {
                    self.finish.roll_forward_member(r, coll, doc).await?;
                    return Ok(Settled::Retry);
                }
                Some(r) if self.lease_expired(r, self.now()) => {
                    rec = self.abort_pending(&holder, Some(r.expires_at), AbortReason::Expired).await?;
                }
                Some(_) => match wounder {
                    Some(txn) if older(txn, &holder) => {
                        tracing::debug!(txn.id = %txn, wounded = %holder, "wounding a younger transaction");
                        rec = self.abort_pending(&holder, None, AbortReason::Wounded).await?;
                    }
                    _ => return Ok(Settled::Busy { holder }),
                },
            }
        }
    }
}
