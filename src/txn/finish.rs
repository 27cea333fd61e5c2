//! Finishing a decided transaction: roll-forward of a committed one (§3
//! step 5) and roll-back of an aborted one (step 6). Both are idempotent and
//! keyed by the transaction id, so any instance may run them, any number of
//! times, concurrently.

use crate::txn::record::Transition;
use std::sync::Arc;

use futures::future::join_all;

use crate::documents::model::StoredDoc;
use crate::store::{StoreResult, Write};

use super::Engine;
use super::record::{Member, Status, TXNS, TxnRecord};

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
        if self.store.chains_cheaply() && self.roll_forward_at_once(rec).await? {
            return Ok(());
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

    /// The usual case of a roll-forward, in one round trip: every member
    /// still held is rolled forward and the record finished, as one chain
    /// (each write conditional on its own, in order, the finish last).
    /// `false` when some member was not held as read (another instance
    /// finished it meanwhile, or it was never locked): the caller then
    /// goes member by member.
    async fn roll_forward_at_once(&self, rec: &TxnRecord) -> StoreResult<bool> {
        let at = rec.committed_at.unwrap_or_else(|| self.now());
        let mut held = Vec::with_capacity(rec.members.len());
        for m in &rec.members {
            // Anything unusual (a record that cannot be read) is left to the
            // member-by-member path, which finishes the others.
            match self.member_doc(m).await {
                Ok(Some(doc)) if doc.meta.txn.as_deref() == Some(rec.id.as_str()) => held.push((m, doc)),
                _ => return Ok(false),
            }
        }
        let mut chain: Vec<(&str, Write<'_>)> = held
            .iter()
            .map(|(m, doc)| {
                let write = Write::Replace {
                    id: &m.id,
                    filter: doc.unchanged_filter(Some(&rec.id)),
                    record: doc.rolled_forward(at).to_record(),
                };
                (m.collection.as_str(), write)
            })
            .collect();
        let (filter, update) = Transition::Finish { from: Status::Committed, at: self.now() }.cas();
        chain.push((TXNS, Write::Update { id: &rec.id, filter, update }));
        // Unsynced: recovery rolls forward again from the committed record.
        let applied = self.store.unsynced().in_order(chain).await?;
        for (m, _) in held.iter().take(applied) {
            self.signals.released(&m.collection, &m.id);
        }
        if applied < held.len() {
            return Ok(false);
        }
        if applied > held.len() {
            self.metrics.incr("txgate_transactions_finished_total", "done");
        }
        Ok(true)
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
