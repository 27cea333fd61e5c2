//! Finishing a decided transaction: roll-forward of a committed one (§3
//! step 5) and roll-back of an aborted one (step 6). Both are idempotent and
//! keyed by the transaction id, so any instance may run them, any number of
//! times, concurrently.

use crate::txn::record::Transition;
use std::sync::Arc;

use futures::future::join_all;

use crate::documents::model::StoredDoc;
use crate::store::StoreResult;

use super::Engine;
use super::record::{Member, Status, TxnRecord};

impl Engine {
    async fn member_doc(&self, m: &Member) -> StoreResult<Option<StoredDoc>> {
        match self.store.get(&m.collection, &m.id).await? {
            Some(rec) => StoredDoc::from_record(rec).map(Some),
            None => Ok(None),
        }
    }

    /// Run `step` on each member document still held by `rec`, all members
    /// concurrently, until it succeeds or the document is no longer held
    /// (someone else finished it). A member that fails does not stop the
    /// others; the first failure is returned once all have run.
    async fn for_each_held_member<'a, F, Fut>(&'a self, rec: &'a TxnRecord, step: F) -> StoreResult<()>
    where
        F: Fn(&'a Member, StoredDoc) -> Fut,
        Fut: std::future::Future<Output = StoreResult<bool>>,
    {
        join_all(rec.members.iter().map(|m| {
            let step = &step;
            async move {
                while let Some(doc) = self.member_doc(m).await? {
                    if doc.meta.txn.as_deref() != Some(rec.id.as_str()) || step(m, doc).await? {
                        break;
                    }
                }
                StoreResult::Ok(())
            }
        }))
        .await
        .into_iter()
        .collect()
    }

    /// Apply every staged change of committed `rec`, release its locks, then
    /// mark it done.
    pub async fn roll_forward(&self, rec: &TxnRecord) -> StoreResult<()> {
        debug_assert!(rec.status.is_committed());
        if rec.status == Status::Committed {
            self.ensure_outputs(rec).await?;
        }
        self.for_each_held_member(
            rec,
            |m, doc| async move { self.roll_forward_member(rec, &m.collection, &doc).await },
        )
        .await?;
        let finish = Transition::Finish { from: Status::Committed, at: self.now() };
        if finish.apply(self.store.as_ref(), &rec.id).await? {
            self.metrics.incr("txgate_transactions_finished_total", "done");
        }
        Ok(())
    }

    /// Drop every lock and staged change of aborted `rec`, then mark it
    /// rolled back.
    pub async fn roll_back(&self, rec: &TxnRecord) -> StoreResult<()> {
        debug_assert!(matches!(rec.status, Status::Aborted | Status::RolledBack));
        self.for_each_held_member(rec, |m, doc| async move { self.release_stale(&rec.id, &m.collection, &doc).await })
            .await?;
        let finish = Transition::Finish { from: Status::Aborted, at: self.now() };
        if finish.apply(self.store.as_ref(), &rec.id).await? {
            self.metrics.incr("txgate_transactions_finished_total", "rolled_back");
        }
        Ok(())
    }

    /// Finish committed `rec` in the background (a reader met one of its
    /// locks). At most one such task runs per transaction in this process;
    /// a failure is left to recovery.
    pub fn help_roll_forward(self: &Arc<Self>, rec: TxnRecord) {
        if rec.status != Status::Committed || !self.helping.lock().expect("helping set").insert(rec.id.clone()) {
            return;
        }
        let engine = Arc::clone(self);
        self.tasks.spawn(async move {
            if let Err(err) = engine.roll_forward(&rec).await {
                tracing::warn!(txn.id = %rec.id, error = %err, "background roll-forward failed; recovery will finish it");
            }
            engine.helping.lock().expect("helping set").remove(&rec.id);
        });
    }
}
