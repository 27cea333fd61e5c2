//! Locking and staging members (§3 steps 2–3): all at once without
//! waiting first, then the busy ones in one global order, settling the
//! locks met on the way (helping committed holders, clearing dead ones,
//! wound-wait between live ones).

use std::sync::Arc;
use std::time::Duration;

use futures::future::try_join_all;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::document::{Staged, StagedOp, StoredDoc, View};
use crate::store::{DateTime, Document, StoreError};
use crate::txn::locks::Settled;
use crate::txn::plan::{Action, ActionOp, Claimed, Plan};
use crate::txn::record::{AbortReason, Failure, FailureCode, Status, TxnRecord};

use super::{Commit, Committed, TxnError, aborted};

/// A member failed; carries what the 409/422 body says.
pub(super) struct MemberFailure {
    failure: Box<Failure>,
    invalid: bool,
}

/// What locking the members of one attempt works with.
#[derive(Clone, Copy)]
struct Locking<'a> {
    txn: &'a str,
    plan: &'a Plan,
    /// When waiting for held locks ends.
    deadline: Instant,
    /// Cancelled when an older transaction wounds this one.
    wounded: &'a CancellationToken,
}

pub(super) enum Step {
    Locked {
        base_v: i64,
    },
    /// Held by a live transaction, and this pass does not wait.
    Busy,
    Failed(MemberFailure),
}

const MAX_BACKOFF: Duration = Duration::from_millis(8);

impl Commit {
    /// How long an older transaction waits for a younger live holder
    /// before wounding it: most holders are about to finish, and a wound
    /// throws their work away. Deadlocks are still broken after this wait.
    fn wound_after(&self) -> Duration {
        self.cfg.lock_wait / 40
    }

    pub(super) async fn lock_and_commit(
        self: &Arc<Self>,
        plan: &Plan,
        record: TxnRecord,
        wounded: &CancellationToken,
        locked: Vec<(usize, i64)>,
        seen: Vec<Option<StoredDoc>>,
        left: Duration,
    ) -> Result<Committed, TxnError> {
        let txn = record.id.clone();
        let lock_all = self.lock_all(plan, &txn, wounded, locked, seen);
        let bases = match tokio::time::timeout(left, lock_all).await {
            Ok(Ok(bases)) => bases,
            Ok(Err(err)) => return Err(self.give_up(&txn, err).await),
            Err(_) => {
                let failure = aborted(
                    AbortReason::Timeout,
                    "the transaction ran longer than its maximum duration (TXGATE_TXN_MAX_MS)",
                );
                return Err(self.give_up(&txn, TxnError::Aborted { txn: txn.clone(), failure }).await);
            }
        };
        self.commit(plan, record, bases).await
    }

    /// Steps 2–3: lock and stage every member not `locked` yet (by the
    /// chain with the record), starting from the document as `seen` (when
    /// it is still worth trusting); the base version of each.
    async fn lock_all(
        self: &Arc<Self>,
        plan: &Plan,
        txn: &str,
        wounded: &CancellationToken,
        locked: Vec<(usize, i64)>,
        mut seen: Vec<Option<StoredDoc>>,
    ) -> Result<Vec<(usize, i64)>, TxnError> {
        let store_err = |source| TxnError::Store { txn: txn.to_owned(), source };
        let deadline = Instant::now() + self.cfg.lock_wait;
        let mut done = vec![None; plan.actions.len()];
        for (i, base_v) in locked {
            done[i] = Some(base_v);
        }
        // 2–3. Lock and stage every member: first all at once without
        // waiting (the uncontended case ends here); then, if some are held
        // by live transactions, in one global order (collection, id),
        // waiting for each. Locks taken in the first pass above the first
        // busy member are given back first, so a transaction only ever
        // waits while holding locks that sort below the one it waits for:
        // waits cannot form a cycle, and wound-wait is left to break only
        // the waits on slow or stuck holders.
        let attempt = Locking { txn, plan, deadline, wounded };
        let attempt = &attempt;
        let lock_one = |i: usize, seen: Option<StoredDoc>, wait: bool| {
            let action = &plan.actions[i];
            async move {
                match self.lock_member(attempt, action, seen, wait).await.map_err(Err)? {
                    Step::Locked { base_v } => Ok((i, Some(base_v))),
                    Step::Busy => Ok((i, None)),
                    Step::Failed(mut f) => {
                        f.failure.action = Some(i as i64);
                        f.failure.collection = Some(action.collection.clone());
                        f.failure.id = Some(action.id.clone());
                        Err(Ok(f))
                    }
                }
            }
        };
        let key = |i: &usize| (&plan.actions[*i].collection, &plan.actions[*i].id);
        let first_pass = try_join_all((0..plan.actions.len()).map(|i| {
            let seen = seen[i].take();
            let done = done[i];
            async move {
                match done {
                    Some(base_v) => Ok((i, Some(base_v))),
                    None => lock_one(i, seen, false).await,
                }
            }
        }))
        .await;
        let steps: Result<Vec<(usize, i64)>, Result<MemberFailure, StoreError>> = async {
            let (mut bases, mut rest) = (Vec::new(), Vec::new());
            for (i, base) in first_pass? {
                match base {
                    Some(b) => bases.push((i, b)),
                    None => rest.push(i),
                }
            }
            let Some(lowest) = rest.iter().min_by_key(|i| key(i)).copied() else { return Ok(bases) };
            let (keep, give_back): (Vec<_>, Vec<_>) = bases.into_iter().partition(|(i, _)| key(i) < key(&lowest));
            try_join_all(
                give_back
                    .iter()
                    .map(|(i, _)| self.finish.unlock_own(txn, &plan.actions[*i].collection, &plan.actions[*i].id)),
            )
            .await
            .map_err(Err)?;
            bases = keep;
            rest.extend(give_back.into_iter().map(|(i, _)| i));
            rest.sort_by_key(|i| key(i));
            for i in rest {
                let (i, base) = lock_one(i, None, true).await?;
                bases.push((i, base.expect("a waiting pass never answers busy")));
            }
            Ok(bases)
        }
        .await;
        match steps {
            Ok(bases) => Ok(bases),
            Err(Ok(member)) if member.invalid => {
                Err(TxnError::InvalidChange { txn: txn.to_owned(), failure: *member.failure })
            }
            Err(Ok(member)) => Err(TxnError::Aborted { txn: txn.to_owned(), failure: *member.failure }),
            Err(Err(source)) => Err(store_err(source)),
        }
    }

    /// Lock `action`'s document for the attempt and stage its post-image,
    /// starting from `seen` (the document as read, if it was). Waits for a
    /// live holder only when `wait`.
    async fn lock_member(
        &self,
        attempt: &Locking<'_>,
        action: &Action,
        mut seen: Option<StoredDoc>,
        wait: bool,
    ) -> Result<Step, StoreError> {
        let Locking { txn, plan, deadline, wounded } = *attempt;
        let mut known = seen.is_some();
        let coll = action.collection.as_str();
        let mut backoff = Duration::from_millis(2);
        let mut waits = 0u32;
        // The live holder this member waits for, and since when.
        let mut blocked: Option<(String, Instant)> = None;
        let mut waited = LockWait { metrics: &self.metrics, since: None };
        loop {
            if wounded.is_cancelled() {
                return Ok(Step::Failed(MemberFailure {
                    failure: Box::new(aborted(AbortReason::Wounded, "the transaction was wounded by an older one")),
                    invalid: false,
                }));
            }
            let doc = if known {
                known = false;
                seen.take()
            } else {
                match self.store.get(coll, &action.id).await? {
                    Some(rec) => Some(StoredDoc::from_record(rec)?),
                    None => None,
                }
            };
            let Some(doc) = doc else {
                if !matches!(action.op, ActionOp::Insert(_)) {
                    return Ok(fail(FailureCode::NotFound, "the document does not exist", action.if_version, None));
                }
                if let Some(expected) = action.if_version.filter(|v| *v != 0) {
                    return Ok(fail(
                        FailureCode::VersionConflict,
                        "the document does not exist",
                        Some(expected),
                        Some(0),
                    ));
                }
                let staged = match staged_checked(plan, action, None) {
                    Ok(s) => s,
                    Err(why) => return Ok(unstaged(plan, why)),
                };
                let placeholder = placeholder(&action.id, txn, staged, self.cfg.clock.now());
                if self.store.unsynced().insert(coll, placeholder.to_record()).await? {
                    return Ok(Step::Locked { base_v: 0 });
                }
                continue;
            };
            match doc.meta.txn.as_deref() {
                Some(holder) if holder == txn => return Ok(Step::Locked { base_v: doc.meta.v }),
                Some(holder) => {
                    let holder = holder.to_owned();
                    let since = match &blocked {
                        Some((h, since)) if *h == holder => *since,
                        _ => Instant::now(),
                    };
                    let may_wound = since.elapsed() >= self.wound_after();
                    let wounder = may_wound.then_some(txn);
                    if self.locks.settle(coll, &doc, wounder).await? == Settled::Retry {
                        blocked = None;
                        continue;
                    }
                    if !wait {
                        return Ok(Step::Busy);
                    }
                    blocked = Some((holder.clone(), since));
                    // A live, older holder: wait for it, up to the lock wait.
                    if Instant::now() >= deadline {
                        let mut f = Failure::new(
                            FailureCode::Locked,
                            format!("the document is locked by transaction {holder}"),
                            true,
                        );
                        f.holder = Some(holder);
                        return Ok(Step::Failed(MemberFailure { failure: Box::new(f), invalid: false }));
                    }
                    waited.start();
                    tokio::select! {
                        () = self.signals.wait_release(coll, &action.id, backoff.min(deadline - Instant::now())) => {}
                        () = wounded.cancelled() => {}
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    // While waiting, an older transaction in another instance
                    // may have wounded this one (one here cancels `wounded`
                    // at once): find out now and then rather than at the
                    // next heartbeat.
                    waits += 1;
                    if waits % 4 == 0
                        && let Ok(Some(own)) = self.locks.record(txn).await
                        && own.status != Status::Pending
                    {
                        wounded.cancel();
                    }
                    continue;
                }
                None => {}
            }
            // Unlocked: check the preconditions on the committed state.
            let current = doc.committed_view();
            if let Some(step) = precondition(action, &current, doc.meta.v) {
                return Ok(step);
            }
            let base = match current {
                View::Live(_) => Some(&doc),
                _ => None,
            };
            let staged = match staged_checked(plan, action, base) {
                Ok(s) => s,
                Err(why) => return Ok(unstaged(plan, why)),
            };
            if doc.meta.outbox.is_some() {
                // A write this instance answered may still have the event
                // in its queue: let the queue append it rather than race it
                // with a second append of the same event.
                self.follow_ups.settle(crate::follow_ups::SETTLE_WAIT).await;
                crate::events::publish_outbox(self.store.as_ref(), coll, &doc, self.cfg.clock.now()).await?;
            }
            let locked = locked_by(&doc, txn, staged);
            let filter = doc.unchanged_filter(None);
            if self.store.unsynced().replace(coll, &doc.id, filter, locked.to_record()).await? {
                return Ok(Step::Locked { base_v: doc.meta.v });
            }
        }
    }
}

/// Counts a member's wait for a held document once, and how long it
/// lasted (until the member locked it or gave up) when dropped.
struct LockWait<'a> {
    metrics: &'a crate::metrics::Metrics,
    since: Option<Instant>,
}

impl LockWait<'_> {
    fn start(&mut self) {
        if self.since.is_none() {
            self.since = Some(Instant::now());
            self.metrics.count(&crate::metrics::LOCK_WAITS, &[], 1);
        }
    }
}

impl Drop for LockWait<'_> {
    fn drop(&mut self) {
        if let Some(since) = self.since {
            self.metrics.observe(&crate::metrics::LOCK_WAIT, &[], since.elapsed());
        }
    }
}

/// `doc` locked by `txn` with `staged` as its pending change (its outbox,
/// if any, must be in the event log: the lock drops it).
pub(super) fn locked_by(doc: &StoredDoc, txn: &str, staged: Staged) -> StoredDoc {
    let mut locked = doc.clone();
    locked.meta.outbox = None;
    locked.meta.txn = Some(txn.to_owned());
    locked.meta.deleting = staged.op == StagedOp::Delete;
    locked.meta.pending = Some(staged);
    locked
}

fn fail(code: FailureCode, detail: &str, expected: Option<i64>, actual: Option<i64>) -> Step {
    let mut f = Failure::new(code, detail, false);
    f.expected = expected;
    f.actual = actual;
    Step::Failed(MemberFailure { failure: Box::new(f), invalid: false })
}

/// `None` when `action` may proceed on a document whose committed state is
/// `current` at version `v`.
pub(super) fn precondition(action: &Action, current: &View, v: i64) -> Option<Step> {
    let version_ok = |actual: i64| action.if_version.is_none_or(|expected| expected == actual);
    match (&action.op, current) {
        (ActionOp::Insert(_), View::Live(_)) => {
            Some(fail(FailureCode::AlreadyExists, "a document with this id already exists", action.if_version, Some(v)))
        }
        (ActionOp::Insert(_), View::Deleted { version, .. }) if !version_ok(*version) => Some(fail(
            FailureCode::VersionConflict,
            "the tombstone is at another version",
            action.if_version,
            Some(*version),
        )),
        (ActionOp::Insert(_), _) => None,
        (_, View::NotFound) => {
            Some(fail(FailureCode::NotFound, "the document does not exist", action.if_version, None))
        }
        (_, View::Deleted { version, .. }) => {
            Some(fail(FailureCode::Deleted, "the document was deleted", action.if_version, Some(*version)))
        }
        (_, View::Live(l)) if !version_ok(l.version) => Some(fail(
            FailureCode::VersionConflict,
            &format!("expected version {}, the document is at {}", action.if_version.unwrap_or_default(), l.version),
            action.if_version,
            Some(l.version),
        )),
        _ => None,
    }
}

/// Why a member's change cannot be staged.
#[derive(Debug)]
pub(super) enum Unstaged {
    /// It cannot apply to the document as it is.
    Invalid(String),
    /// What it would produce does not satisfy the collection's schema.
    Schema(crate::schemas::Refusal),
}

impl From<String> for Unstaged {
    fn from(detail: String) -> Self {
        Unstaged::Invalid(detail)
    }
}

/// A member whose change cannot be staged: 422 `invalid_change`, or
/// `schema_violation`.
fn unstaged(plan: &Plan, why: Unstaged) -> Step {
    let failure = match why {
        Unstaged::Invalid(detail) => Failure::new(FailureCode::InvalidChange, detail, false),
        Unstaged::Schema(refusal) => {
            // The transaction's answer: counted (the all-at-once tries'
            // checks before it were not).
            if let Some(known) = plan.schemas.get(&refusal.collection) {
                known.count_refusal();
            }
            Failure {
                schema_version: Some(refusal.schema_version),
                errors: refusal.violations.clone(),
                ..Failure::new(FailureCode::SchemaViolation, refusal.to_string(), false)
            }
        }
    };
    Step::Failed(MemberFailure { failure: Box::new(failure), invalid: true })
}

/// The staged post-image of `action` over `base` (the live document, if
/// any), checked against the collection's schemas.
pub(super) fn staged_checked(plan: &Plan, action: &Action, base: Option<&StoredDoc>) -> Result<Staged, Unstaged> {
    let staged = staged_unchecked(plan, action, base)?;
    if let (Some(data), Some(known)) = (&staged.data, plan.schemas.get(&action.collection)) {
        let before = base.map(|d| (&d.data, d.meta.sv));
        let warned =
            known.judge(&action.collection, before, (data, staged.sv), &action.id).map_err(Unstaged::Schema)?;
        // Landed once, if the transaction commits: this check may be one
        // of several tries.
        plan.warned.checked(&action.collection, &action.id, warned);
    }
    Ok(staged)
}

fn staged_unchecked(plan: &Plan, action: &Action, base: Option<&StoredDoc>) -> Result<Staged, String> {
    let sv = plan.schema_version;
    let data = match &action.op {
        ActionOp::Insert(data) | ActionOp::Replace(data) => Some(data.clone()),
        ActionOp::Update(patch) => {
            let data = patch.apply(&base.map(|d| d.data.clone()).unwrap_or_default())?;
            crate::document::rules::check_data_size(&data, "/").map_err(|e| e.message)?;
            if let Some(detail) =
                plan.indexed.get(&action.collection).and_then(|paths| crate::query::rule::breaks_rule(paths, &data))
            {
                return Err(detail);
            }
            Some(data)
        }
        ActionOp::Delete | ActionOp::Check => None,
    };
    if let (Some(data), Some(uniques)) = (&data, plan.unique.get(&action.collection)) {
        let values = |data: Option<&Document>| -> Vec<Option<Vec<u8>>> {
            uniques.iter().map(|(_, paths)| data.and_then(|d| crate::query::rule::unique_key(paths, d))).collect()
        };
        // The values claimed, over the values the document held when they
        // were: a value kept was not claimed again, and one given up is
        // released as it was read (crate::indexes::unique).
        let staged = Claimed { taken: values(Some(data)), read: values(base.map(|d| &d.data)) };
        let key = (action.collection.clone(), action.id.clone());
        if plan.claimed.get(&key) != Some(&staged) {
            return Err(format!(
                "a unique value of {}/{} is not the one claimed for it: the document changed since the \
                 transaction read it; send the transaction again",
                action.collection, action.id
            ));
        }
    }
    let sv = if matches!(action.op, ActionOp::Check | ActionOp::Delete) { base.map_or(sv, |d| d.meta.sv) } else { sv };
    Ok(Staged { op: action.op.staged(), data, sv })
}

/// An invisible document holding an insert's lock. It has no creation
/// time (its roll-forward sets one), so the scans of live documents by
/// creation time (the TTL sweeper's) never meet it.
pub(super) fn placeholder(id: &str, txn: &str, staged: Staged, at: DateTime) -> StoredDoc {
    let mut d = StoredDoc::new_live(id.to_owned(), Default::default(), staged.sv, 0, at);
    d.meta.created_at = None;
    d.meta.txn = Some(txn.to_owned());
    d.meta.pending = Some(staged);
    d
}
