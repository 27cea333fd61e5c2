//! Finishing a decided transaction: roll-forward of a committed one (§3
//! step 5) and roll-back of an aborted one (step 6). Both are idempotent and
//! keyed by the transaction id, so any instance may run them, any number of
//! times, concurrently.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures::future::join_all;

use crate::clock::Clock;
use crate::document::StoredDoc;
use crate::follow_ups::FollowUps;
use crate::metrics::Metrics;
use crate::store::{DynStore, StoreResult, Write};

use super::outputs::Outputs;
use super::record::{Member, Status, TXNS, Transition, TxnRecord};
use super::signals::Signals;

/// The finishing service: applies a decided transaction to its members
/// and releases them, and makes its outputs exist first.
pub struct Finish {
    store: DynStore,
    clock: Clock,
    metrics: Arc<Metrics>,
    signals: Arc<Signals>,
    /// What a committed transaction leaves behind besides its documents.
    outputs: Arc<[Arc<dyn Outputs>]>,
    /// Background roll-forwards started for readers; awaited at shutdown.
    follow_ups: FollowUps,
    /// Transactions this process is rolling forward in the background.
    helping: Mutex<HashSet<String>>,
}

impl Finish {
    pub(super) fn new(
        store: DynStore,
        clock: Clock,
        metrics: Arc<Metrics>,
        signals: Arc<Signals>,
        outputs: Arc<[Arc<dyn Outputs>]>,
        follow_ups: FollowUps,
    ) -> Arc<Self> {
        Arc::new(Self { store, clock, metrics, signals, outputs, follow_ups, helping: Mutex::default() })
    }

    fn now(&self) -> crate::store::DateTime {
        self.clock.now()
    }

    /// Make sure every output of committed `rec` exists: called before any
    /// of its locks is released.
    pub async fn ensure_outputs(&self, rec: &TxnRecord) -> StoreResult<()> {
        // Kinds of output are independent of one another: made at once.
        join_all(self.outputs.iter().map(|o| o.ensure(rec))).await.into_iter().collect()
    }

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
        if self.store.capabilities().cheap_chains && self.roll_forward_at_once(rec).await? {
            return Ok(());
        }
        self.for_each_held_member(
            rec,
            // The outputs were made above, once for every member.
            |m, doc| async move { self.forward_member(rec, &m.collection, &doc).await },
        )
        .await?;
        let finish = Transition::Finish { from: Status::Committed, at: self.now() };
        if finish.apply(self.store.as_ref(), &rec.id).await? {
            self.metrics.incr(&crate::metrics::TRANSACTIONS_FINISHED, "done");
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
            self.metrics.incr(&crate::metrics::TRANSACTIONS_FINISHED, "done");
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
            self.metrics.incr(&crate::metrics::TRANSACTIONS_FINISHED, "rolled_back");
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
        let finish = Arc::clone(self);
        self.follow_ups.spawn_settled(async move {
            if let Err(err) = finish.roll_forward(&rec).await {
                tracing::warn!(txn.id = %rec.id, error = %err, "background roll-forward failed; recovery will finish it");
            }
            finish.helping.lock().expect("helping set").remove(&rec.id);
        });
    }

    /// Apply the staged change of committed `rec` to `doc` and release it.
    /// The transaction's deliveries are made sure of first, so a lock is
    /// never released before its hooks are recorded.
    pub async fn roll_forward_member(&self, rec: &TxnRecord, coll: &str, doc: &StoredDoc) -> StoreResult<bool> {
        if rec.status == Status::Committed {
            self.ensure_outputs(rec).await?;
        }
        self.forward_member(rec, coll, doc).await
    }

    /// Apply the staged change of committed `rec` to `doc` and release it,
    /// its outputs made already.
    async fn forward_member(&self, rec: &TxnRecord, coll: &str, doc: &StoredDoc) -> StoreResult<bool> {
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
