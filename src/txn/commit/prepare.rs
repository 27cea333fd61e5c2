//! Preparing a transaction (§3 step 1): the members as they are, read in
//! one round trip per collection, and the chains that write the record with
//! the free members' locks, or the whole protocol at once when every member
//! is free.

use std::collections::HashMap;
use std::sync::Arc;

use crate::document::{StoredDoc, View};
use crate::store::{DateTime, Durability, StoreError, Write, get_all_within};
use crate::txn::outputs::Forwarded;
use crate::txn::plan::{Action, ActionOp, Plan};
use crate::txn::record::{AbortReason, Member, MemberResult, Status, TXNS, Transition, TxnRecord};

use super::stage::{locked_by, placeholder, precondition, staged_checked};
use super::{Commit, TxnError, Whole, aborted};

impl Commit {
    /// Whether every output committed `rec` leaves behind can be made in
    /// the chain of a whole transaction ([`Outputs::chained`]).
    pub(super) fn outputs_chain(&self, rec: &TxnRecord) -> bool {
        self.outputs.iter().all(|o| !o.has_any(rec) || o.chained(rec, &[]).is_some())
    }

    /// A transaction whose members are all free and meet their
    /// preconditions, with no outputs, as one chain of the protocol's own
    /// steps, synced: the record, every lock, the commit CAS, every
    /// roll-forward, the finish. Each is the same conditional single-record
    /// write as on the long path, in the same order, and each is applied
    /// only if every one before it was; nothing relies on the chain being
    /// atomic (on the embedded store it is one group commit, so the
    /// transaction costs one sync and one writer round trip). A chain
    /// stopped before its commit CAS leaves the long path to go on from
    /// where it stopped.
    pub(super) async fn whole(
        self: &Arc<Self>,
        plan: &Plan,
        record: &TxnRecord,
        stages: Vec<(usize, PlainStage<'_>)>,
    ) -> Result<Whole, StoreError> {
        // A write under way until its roll-forward is ticketed.
        let _writing = self.follow_ups.writing().await;
        let txn = record.id.as_str();
        let chained: Vec<(usize, i64)> = stages.iter().map(|(i, s)| (*i, s.base_v)).collect();
        let mut members = record.members.clone();
        let results = member_results(plan, &mut members, &chained);
        let committed_at = self.cfg.clock.now();
        let mut chain = vec![(TXNS, Write::Insert(record.to_record()))];
        let mut forward = Vec::with_capacity(stages.len());
        let mut forwarded = Vec::with_capacity(stages.len());
        for (i, stage) in stages {
            let coll = plan.actions[i].collection.as_str();
            let id = plan.actions[i].id.as_str();
            let after = stage.locked.rolled_forward(committed_at);
            let write =
                Write::Replace { id, filter: stage.locked.unchanged_filter(Some(txn)), record: after.to_record() };
            forward.push((coll, write));
            forwarded.push((i, stage.locked, after));
            chain.push((coll, stage.write));
        }
        let locks = chain.len();
        let (filter, update) = Transition::Commit { at: committed_at, results: &results, members: &members }.cas();
        chain.push((TXNS, Write::Update { id: txn, filter, update }));
        // The outputs exist before any lock is released (step 5).
        let mut committed = record.clone();
        committed.status = Status::Committed;
        committed.committed_at = Some(committed_at);
        committed.members = members.clone();
        committed.results = Some(results.clone());
        let refs: Vec<Forwarded<'_>> =
            forwarded.iter().map(|(index, locked, after)| Forwarded { index: *index, locked, after }).collect();
        for output in self.outputs.iter().filter(|o| o.has_any(&committed)) {
            let appends = output.chained(&committed, &refs).expect("checked by outputs_chain");
            chain.extend(appends.into_iter().map(|(coll, r)| (coll, Write::Append(r))));
        }
        drop(refs);
        chain.extend(forward);
        let (filter, update) = Transition::Finish { from: Status::Committed, at: committed_at }.cas();
        chain.push((TXNS, Write::Update { id: txn, filter, update }));
        let total = chain.len();
        let applied = match self.store.write_in_order(chain, Durability::Synced).await {
            Ok(applied) => applied,
            // How far the chain got is unknown, the commit CAS included
            // (rule zero): re-read until the outcome is known.
            Err(source) => {
                return Ok(match self.outcome_after_commit_attempt(txn, AbortReason::StoreError).await {
                    Ok(rec) if rec.status.is_committed() => {
                        Whole::Committed(Box::new(self.committed_then_forward(plan, rec)))
                    }
                    // Aborted here: the commit point was not reached, for
                    // the store failed before it.
                    Ok(rec) if rec.reason() == Some(AbortReason::StoreError) => {
                        self.roll_back_in_background(rec);
                        Whole::Failed(Box::new(TxnError::Store { txn: txn.to_owned(), source }))
                    }
                    Ok(rec) => Whole::Failed(Box::new(self.found_aborted(rec))),
                    Err(err) => Whole::Failed(Box::new(err)),
                });
            }
        };
        if applied <= locks {
            // Stopped at a lock (the member changed since it was read) or at
            // the commit CAS (the record is no longer pending): the long
            // path goes on, and settles a failed commit as it always does.
            return Ok(Whole::Partly { chained, applied });
        }
        let rec = committed;
        if applied == total {
            self.metrics.incr(&crate::metrics::TRANSACTIONS_FINISHED, "done");
            tracing::info!(txn.id = %txn, "transaction committed");
            for a in &plan.actions {
                self.signals.released(&a.collection, &a.id);
            }
            return Ok(Whole::Committed(Box::new(rec)));
        }
        // Another instance finished part of it meanwhile (a store that
        // applies the chain write by write): finish the rest.
        Ok(Whole::Committed(Box::new(self.committed_then_forward(plan, rec))))
    }

    /// A transaction whose members are all free and meet their
    /// preconditions, with outputs that can be chained, where the store
    /// applies writes all or nothing ([`Store::write_all_or_nothing`]):
    /// each member's post-image by compare-and-set on the document as
    /// first read, the outputs, and the record inserted finished, in one
    /// synced commit. No lock is taken, so no reader ever meets one: either
    /// every member is still as read and all of it lands, or none of it
    /// does (`None`: the whole chain of [`Commit::whole`] then finds which
    /// member moved). The record's insert fences the id: an attempt
    /// superseded by a later request with its Idempotency-Key writes
    /// nothing (docs/design.md §1, §3).
    ///
    /// [`Store::write_all_or_nothing`]: crate::store::Store::write_all_or_nothing
    pub(super) async fn at_once(
        self: &Arc<Self>,
        plan: &Plan,
        record: &TxnRecord,
        stages: &[(usize, PlainStage<'_>)],
    ) -> Result<Option<Whole>, StoreError> {
        let _writing = self.follow_ups.writing().await;
        let txn = record.id.as_str();
        let chained: Vec<(usize, i64)> = stages.iter().map(|(i, s)| (*i, s.base_v)).collect();
        let mut committed = record.clone();
        let results = member_results(plan, &mut committed.members, &chained);
        let at = self.cfg.clock.now();
        committed.status = Status::Committed;
        committed.committed_at = Some(at);
        committed.results = Some(results);
        let mut chain = Vec::with_capacity(2 * stages.len() + 2);
        let mut forwarded = Vec::with_capacity(stages.len());
        for (i, stage) in stages {
            let coll = plan.actions[*i].collection.as_str();
            let after = stage.locked.rolled_forward(at);
            let write = match &stage.write {
                Write::Replace { id, filter, .. } => {
                    Write::Replace { id, filter: filter.clone(), record: after.to_record() }
                }
                _ => Write::Insert(after.to_record()),
            };
            chain.push((coll, write));
            forwarded.push((*i, &stage.locked, after));
        }
        let refs: Vec<Forwarded<'_>> =
            forwarded.iter().map(|(index, locked, after)| Forwarded { index: *index, locked, after }).collect();
        for output in self.outputs.iter().filter(|o| o.has_any(&committed)) {
            let appends = output.chained(&committed, &refs).expect("checked by outputs_chain");
            chain.extend(appends.into_iter().map(|(coll, r)| (coll, Write::Append(r))));
        }
        let mut done = committed.clone();
        done.status = Status::Done;
        done.finished_at = Some(at);
        chain.push((TXNS, Write::Insert(done.to_record())));
        match self.store.write_all_or_nothing(chain, Durability::Synced).await {
            Ok(true) => {
                self.metrics.incr(&crate::metrics::TRANSACTIONS_FINISHED, "done");
                tracing::info!(txn.id = %txn, "transaction committed");
                Ok(Some(Whole::Committed(Box::new(committed))))
            }
            Ok(false) => Ok(None),
            // All of it or none landed, or may still land: fence the id.
            Err(source) => {
                let failure = aborted(AbortReason::StoreError, format!("the store failed: {source}"));
                Ok(Some(match self.fence(record, failure).await {
                    Ok(None) => Whole::Failed(Box::new(TxnError::Store { txn: txn.to_owned(), source })),
                    Ok(Some(rec)) if rec.status.is_committed() => {
                        Whole::Committed(Box::new(self.committed_then_forward(plan, rec)))
                    }
                    Ok(Some(rec)) => Whole::Failed(Box::new(self.found_aborted(rec))),
                    Err(err) => Whole::Failed(Box::new(err)),
                }))
            }
        }
    }

    /// Every member document of `plan` that exists, by (collection, id):
    /// one read per collection, side by side, refused once they hold more
    /// than [`MAX_FIRST_READ_BYTES`].
    pub(super) async fn first_reads(&self, plan: &Plan) -> Result<HashMap<(String, String), StoredDoc>, StoreError> {
        let mut by_coll: std::collections::BTreeMap<&str, Vec<String>> = std::collections::BTreeMap::new();
        for a in &plan.actions {
            by_coll.entry(&a.collection).or_default().push(a.id.clone());
        }
        let Some(records) = get_all_within(self.store.as_ref(), by_coll, MAX_FIRST_READ_BYTES).await? else {
            return Err(StoreError::Rejected(format!(
                "the transaction's documents hold more than {} MiB as stored",
                MAX_FIRST_READ_BYTES >> 20
            )));
        };
        let mut first = HashMap::new();
        for (coll, rec) in records {
            let d = StoredDoc::from_record(rec)?;
            first.insert((coll.to_owned(), d.id.clone()), d);
        }
        Ok(first)
    }
}

/// The one write that locks and stages an action on its document.
pub(super) struct PlainStage<'p> {
    pub(super) write: Write<'p>,
    /// The document as the write leaves it (locked, its change staged).
    pub(super) locked: StoredDoc,
    pub(super) base_v: i64,
}

/// The one write that locks and stages `action` on its document as read
/// (`None`: absent), when nothing else is needed: the document is free and
/// every precondition holds. `None` otherwise: [`Commit::lock_member`]
/// takes it from there.
pub(super) fn plain_stage<'p>(
    plan: &Plan,
    action: &'p Action,
    doc: Option<&StoredDoc>,
    txn: &str,
    at: DateTime,
) -> Option<PlainStage<'p>> {
    match doc {
        None => {
            let fresh = matches!(action.op, ActionOp::Insert(_)) && action.if_version.is_none_or(|v| v == 0);
            if !fresh {
                return None;
            }
            let locked = placeholder(&action.id, txn, staged_checked(plan, action, None).ok()?, at);
            Some(PlainStage { write: Write::Insert(locked.to_record()), locked, base_v: 0 })
        }
        // An outbox goes to the event log before the document is locked.
        Some(doc) if doc.meta.txn.is_none() && doc.meta.outbox.is_none() => {
            let current = doc.committed_view();
            if precondition(action, &current, doc.meta.v).is_some() {
                return None;
            }
            let base = matches!(current, View::Live(_)).then_some(doc);
            let staged = staged_checked(plan, action, base).ok()?;
            let locked = locked_by(doc, txn, staged);
            let write =
                Write::Replace { id: &action.id, filter: doc.unchanged_filter(None), record: locked.to_record() };
            Some(PlainStage { write, locked, base_v: doc.meta.v })
        }
        Some(_) => None,
    }
}

/// Each member's version once committed (the new one; the current one for
/// a check), with `members` given their base versions.
pub(super) fn member_results(plan: &Plan, members: &mut [Member], bases: &[(usize, i64)]) -> Vec<MemberResult> {
    let mut results = vec![None; plan.actions.len()];
    for &(i, base_v) in bases {
        let a = &plan.actions[i];
        let version = if matches!(a.op, ActionOp::Check) { base_v } else { base_v + 1 };
        results[i] = Some(MemberResult { collection: a.collection.clone(), id: a.id.clone(), version });
        members[i].base_v = Some(base_v);
    }
    results.into_iter().map(|r| r.expect("every member locked")).collect()
}

/// What one transaction may write in all, its members' data as BSON: a
/// transaction's writes are applied in one write batch of the embedded
/// store (and its records on MongoDB), whose memory this bounds.
pub(super) const MAX_TXN_DATA_BYTES: usize = 64 << 20;

/// What a transaction's members may hold in all, as stored, when they are
/// first read (deletes and checks read documents they do not write):
/// memory one transaction may take before it stages anything.
pub(super) const MAX_FIRST_READ_BYTES: usize = 4 * MAX_TXN_DATA_BYTES;

/// Whether [`within_write_bound`] holds whatever the first reads find:
/// an update counted at the largest data a document may hold. Then the
/// record can be written before they answer.
pub(super) fn bound_holds_unread(plan: &Plan) -> bool {
    use crate::document::rules::{MAX_DATA_BYTES, data_size};
    let total = plan.actions.iter().fold(0usize, |total, action| {
        total.saturating_add(match &action.op {
            ActionOp::Insert(data) | ActionOp::Replace(data) => data_size(data),
            ActionOp::Update(_) => MAX_DATA_BYTES,
            ActionOp::Delete | ActionOp::Check => 0,
        })
    });
    total <= MAX_TXN_DATA_BYTES
}

/// Refuse, before anything is written, a transaction whose members' data
/// would exceed [`MAX_TXN_DATA_BYTES`]: the data an insert or replace
/// brings, and for an update the document as first read (a patch adds at
/// most the request's body to it).
pub(super) fn within_write_bound(plan: &Plan, first: &HashMap<(String, String), StoredDoc>) -> Result<(), StoreError> {
    use crate::document::rules::data_size;
    let mut total = 0usize;
    for action in &plan.actions {
        total = total.saturating_add(match &action.op {
            ActionOp::Insert(data) | ActionOp::Replace(data) => data_size(data),
            ActionOp::Update(_) => {
                first.get(&(action.collection.clone(), action.id.clone())).map_or(0, |d| data_size(&d.data))
            }
            ActionOp::Delete | ActionOp::Check => 0,
        });
    }
    if total > MAX_TXN_DATA_BYTES {
        return Err(StoreError::Rejected(format!(
            "the transaction would write {total} bytes of document data, over the limit of {MAX_TXN_DATA_BYTES}"
        )));
    }
    Ok(())
}
