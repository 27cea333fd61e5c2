//! Running one transaction (DESIGN §3 steps 1–4): prepare the record, lock
//! and stage every member in parallel, resolve conflicts (helping committed
//! holders, clearing dead ones, wound-wait between live ones), then pass the
//! commit point with one CAS on the record. Roll-forward (step 5) continues
//! in the background after the answer.

use crate::txn::record::Transition;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::try_join_all;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::documents::model::{Staged, StagedOp, StoredDoc, View};
use crate::store::{DateTime, Durability, StoreError, Write};

use super::Engine;
use super::locks::Settled;
use super::plan::{Action, ActionOp, Plan};
use super::record::{Failure, FailureCode, Member, MemberResult, Status, TXNS, TxnRecord};

/// Why a transaction did not commit.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// 409: nothing applied. `failure.code` says why.
    #[error("transaction {txn} aborted: {}", failure.detail)]
    Aborted { txn: String, failure: Failure },
    /// 422 `invalid_change`: a staged change cannot apply; nothing applied.
    #[error("transaction {txn}: {}", failure.detail)]
    InvalidChange { txn: String, failure: Failure },
    /// The store failed before the commit point: nothing applied.
    #[error("transaction {txn}: store error: {source}")]
    Store { txn: String, source: StoreError },
    /// The commit CAS could not be confirmed either way.
    #[error("transaction {txn}: outcome unknown")]
    OutcomeUnknown { txn: String },
}

/// Extends a running attempt's lease every lease/3, never past its hard
/// cap, and tells the attempt as soon as it sees its record aborted.
struct Heartbeat {
    engine: Arc<Engine>,
    txn: String,
    hard_end: DateTime,
    /// Cancelled when the record is seen aborted (wounded, expired, ...).
    wounded: CancellationToken,
}

impl Heartbeat {
    /// Beat until `stop` (the attempt ended), the hard cap, or the record
    /// is no longer pending.
    async fn run(self, stop: CancellationToken) {
        let Self { engine, txn, hard_end, wounded } = self;
        let period = engine.cfg.lease / 3;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(period) => {}
            }
            let at = engine.now();
            if at >= hard_end {
                // The hard cap is reached: the lease may not grow any more.
                return;
            }
            let beat = Transition::Heartbeat { expires_at: engine.lease_from(at).min(hard_end) };
            let beat = beat.apply(engine.store.as_ref(), &txn);
            let beat = tokio::select! {
                () = stop.cancelled() => return,
                beat = beat => beat,
            };
            match beat {
                Ok(true) => {}
                Ok(false) => {
                    // Not pending any more: find out why (rule zero).
                    if let Ok(Some(rec)) = engine.record(&txn).await
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

/// A committed transaction, as answered to the client.
#[derive(Clone, Debug)]
pub struct Committed {
    pub record: TxnRecord,
}

/// A member failed; carries what the 409/422 body says.
struct MemberFailure {
    failure: Failure,
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

enum Step {
    Locked {
        base_v: i64,
    },
    /// Held by a live transaction, and this pass does not wait.
    Busy,
    Failed(MemberFailure),
}

/// The 409 `aborted` failure for an abort with `reason`.
fn aborted(reason: &str, detail: impl Into<String>) -> Failure {
    Failure { reason: Some(reason.to_owned()), ..Failure::new(FailureCode::Aborted, detail, true) }
}

/// The timestamp a UUIDv7 transaction id carries: its age for wound-wait.
pub fn txn_age(id: &str) -> (u64, &str) {
    let millis = uuid::Uuid::parse_str(id)
        .ok()
        .and_then(|u| u.get_timestamp())
        .map(|ts| {
            let (secs, nanos) = ts.to_unix();
            secs * 1000 + u64::from(nanos) / 1_000_000
        })
        .unwrap_or(u64::MAX);
    (millis, id)
}

/// A new transaction id with the same age (timestamp) as `id`.
pub fn same_age(id: &str) -> String {
    let ts = uuid::Uuid::parse_str(id).ok().and_then(|u| u.get_timestamp());
    match ts {
        Some(ts) => {
            let (secs, nanos) = ts.to_unix();
            uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, secs, nanos)).to_string()
        }
        None => uuid::Uuid::now_v7().to_string(),
    }
}

/// Whether transaction `a` is older than `b` (wound-wait priority).
pub fn older(a: &str, b: &str) -> bool {
    txn_age(a) < txn_age(b)
}

const MAX_BACKOFF: Duration = Duration::from_millis(8);

impl Engine {
    /// How long an older transaction waits for a younger live holder
    /// before wounding it: most holders are about to finish, and a wound
    /// throws their work away. Deadlocks are still broken after this wait.
    fn wound_after(&self) -> Duration {
        self.cfg.lock_wait / 40
    }
}

impl Engine {
    /// Run `plan` as a transaction: `Ok` once its commit point is passed.
    ///
    /// An attempt wounded by an older transaction is retried here, within
    /// the lock wait, under a new id that keeps the first attempt's age, so
    /// that it becomes the oldest in time and cannot starve (wound-wait
    /// restarts keep their timestamp). With an idempotency key, the claim
    /// is moved to each new attempt first.
    pub async fn execute(
        self: &Arc<Self>,
        plan: &Plan,
        txn: Option<String>,
        idempotency_key: Option<&str>,
    ) -> Result<Committed, TxnError> {
        let first = txn.unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
        let give_up_at = Instant::now() + self.cfg.lock_wait;
        let mut txn = first.clone();
        loop {
            let result = self.execute_once(plan, txn.clone()).await;
            let wounded = matches!(&result, Err(TxnError::Aborted { failure, .. }) if failure.reason.as_deref() == Some("wounded"));
            if !wounded || Instant::now() >= give_up_at {
                return result;
            }
            let next = same_age(&first);
            if let Some(key) = idempotency_key
                && !matches!(self.repoint_key(key, &txn, &next).await, Ok(true))
            {
                return result;
            }
            self.metrics.incr("txgate_transaction_retries_total", "wounded");
            tracing::debug!(txn.id = %txn, retry = %next, "wounded; retrying with the same age");
            txn = next;
        }
    }

    async fn execute_once(self: &Arc<Self>, plan: &Plan, txn: String) -> Result<Committed, TxnError> {
        let started = std::time::Instant::now();
        let span = tracing::info_span!("transaction", txn.id = %txn, members = plan.actions.len());
        let result = tracing::Instrument::instrument(self.run(plan, &txn), span).await;
        let outcome = match &result {
            Ok(_) => "committed",
            Err(TxnError::Aborted { failure, .. } | TxnError::InvalidChange { failure, .. }) => {
                self.metrics.incr("txgate_conflicts_total", failure.code.as_str());
                "aborted"
            }
            Err(_) => "error",
        };
        self.metrics.incr("txgate_transactions_total", outcome);
        self.metrics.observe("txgate_transaction_duration_seconds", &[outcome], started.elapsed());
        result
    }

    async fn run(self: &Arc<Self>, plan: &Plan, txn: &str) -> Result<Committed, TxnError> {
        let store_err = |source| TxnError::Store { txn: txn.to_owned(), source };
        // 1. Prepare: the record with the whole worklist exists before any lock.
        let started_at = self.now();
        let record = TxnRecord {
            id: txn.to_owned(),
            status: Status::Pending,
            started_at,
            expires_at: self.lease_from(started_at).min(self.hard_end(started_at)),
            committed_at: None,
            finished_at: None,
            request: plan.request.clone(),
            members: plan
                .actions
                .iter()
                .map(|a| Member {
                    collection: a.collection.clone(),
                    id: a.id.clone(),
                    op: a.op.staged(),
                    base_v: a.if_version,
                })
                .collect(),
            results: None,
            idempotency_key: plan.idempotency_key.clone(),
            abort_reason: None,
            failure: None,
            hook_count: plan.hooks.len() as i64,
            hooks: plan.hooks.clone(),
        };
        // The members as they are now, read in one round trip per
        // collection. Where the store takes a chain of writes in one round
        // trip: with every member free (and no outputs), the whole protocol
        // goes as one chain (`whole`); otherwise the record and the locks of
        // the free members go as one, the record first (it must exist
        // before any lock). Unsynced, like every step before the commit
        // point: a crash before the synced commit CAS leaves a transaction
        // recovery aborts.
        let wounded = CancellationToken::new();
        let _running = self.signals.run(txn, wounded.clone());
        let began = Instant::now();
        let prepare = async {
            let first = self.first_reads(plan).await?;
            within_write_bound(plan, &first)?;
            let at = self.now();
            let mut stages = Vec::new();
            // Where a chain costs a round trip per write, the record goes
            // alone and the members are locked in parallel.
            let chains = self.store.chains_cheaply();
            for (i, action) in plan.actions.iter().enumerate().filter(|_| chains) {
                let seen = first.get(&(action.collection.clone(), action.id.clone()));
                if let Some(stage) = plain_stage(plan, action, seen, txn, at) {
                    stages.push((i, stage));
                }
            }
            if stages.len() == plan.actions.len() && self.outputs_chain(&record) {
                // Every member is free: the whole protocol in one chain.
                return Ok(Prepared::Whole(self.whole(plan, &record, stages).await?));
            }
            let mut chain = vec![(TXNS, Write::Insert(record.to_record()))];
            let mut chained = Vec::new();
            for (i, stage) in stages {
                chain.push((plan.actions[i].collection.as_str(), stage.write));
                chained.push((i, stage.base_v));
            }
            let applied = self.store.unsynced().in_order(chain).await?;
            Ok::<_, StoreError>(Prepared::Chained { first, chained, applied })
        };
        let (first, chained, applied) = match tokio::time::timeout(self.cfg.max_duration, prepare).await {
            Ok(Ok(Prepared::Chained { first, chained, applied })) => (first, chained, applied),
            Ok(Ok(Prepared::Whole(Whole::Committed(record)))) => return Ok(Committed { record: *record }),
            Ok(Ok(Prepared::Whole(Whole::Failed(err)))) => return Err(*err),
            Ok(Ok(Prepared::Whole(Whole::Partly { chained, applied }))) => (HashMap::new(), chained, applied),
            Ok(Err(err)) => return Err(store_err(err)),
            Err(_) => return Err(self.timed_out_preparing(record).await),
        };
        if applied == 0 {
            // The id is taken: a later request that took over this one's
            // Idempotency-Key fenced this attempt with an aborted record.
            let reason = match self.record(txn).await {
                Ok(Some(rec)) => rec.abort_reason.unwrap_or_else(|| "superseded".into()),
                _ => "superseded".into(),
            };
            return Err(TxnError::Aborted {
                txn: txn.to_owned(),
                failure: aborted(
                    &reason,
                    "the attempt was superseded by a later request with the same Idempotency-Key",
                ),
            });
        }
        // Members locked by the chain; the others (held, failing a
        // precondition, or changed since they were read) go through the
        // full locking path, read again if the chain tried them.
        let locked: Vec<(usize, i64)> = chained[..applied - 1].to_vec();
        let mut seen: Vec<Option<StoredDoc>> =
            plan.actions.iter().map(|a| first.get(&(a.collection.clone(), a.id.clone())).cloned()).collect();
        for (i, _) in &chained[applied - 1..] {
            seen[*i] = None;
        }
        // The heartbeat lives exactly as long as this attempt: however the
        // attempt ends (answered, failed, cancelled, panicked), it stops
        // extending the lease, so recovery can always judge it.
        let heartbeat = Heartbeat {
            engine: Arc::clone(self),
            txn: txn.to_owned(),
            hard_end: self.hard_end(started_at),
            wounded: wounded.clone(),
        };
        let stop = CancellationToken::new();
        tokio::spawn(heartbeat.run(stop.clone()));
        let _heartbeat = stop.drop_guard();
        let left = self.cfg.max_duration.saturating_sub(began.elapsed());
        self.lock_and_commit(plan, record, &wounded, locked, seen, left).await
    }

    /// Whether every output committed `rec` leaves behind can be made in
    /// the chain of a whole transaction ([`Outputs::chained`]).
    fn outputs_chain(&self, rec: &TxnRecord) -> bool {
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
    async fn whole(
        self: &Arc<Self>,
        plan: &Plan,
        record: &TxnRecord,
        stages: Vec<(usize, PlainStage<'_>)>,
    ) -> Result<Whole, StoreError> {
        let txn = record.id.as_str();
        let chained: Vec<(usize, i64)> = stages.iter().map(|(i, s)| (*i, s.base_v)).collect();
        let mut members = record.members.clone();
        let results = member_results(plan, &mut members, &chained);
        let committed_at = self.now();
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
            forwarded.push((i, after));
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
        let refs: Vec<(usize, &StoredDoc)> = forwarded.iter().map(|(i, d)| (*i, d)).collect();
        for output in self.outputs.iter().filter(|o| o.has_any(&committed)) {
            let appends = output.chained(&committed, &refs).expect("checked by outputs_chain");
            chain.extend(appends.into_iter().map(|(coll, r)| (coll, Write::Append(r))));
        }
        chain.extend(forward);
        let (filter, update) = Transition::Finish { from: Status::Committed, at: committed_at }.cas();
        chain.push((TXNS, Write::Update { id: txn, filter, update }));
        let total = chain.len();
        let applied = match self.store.write_in_order(chain, Durability::Synced).await {
            Ok(applied) => applied,
            // How far the chain got is unknown, the commit CAS included
            // (rule zero): re-read until the outcome is known.
            Err(source) => {
                return Ok(match self.outcome_after_commit_attempt(txn, "store_error").await {
                    Ok(rec) if rec.status.is_committed() => {
                        Whole::Committed(Box::new(self.committed_then_forward(plan, rec)))
                    }
                    // Aborted here: the commit point was not reached, for
                    // the store failed before it.
                    Ok(rec) if rec.abort_reason.as_deref() == Some("store_error") => {
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
            self.metrics.incr("txgate_transactions_finished_total", "done");
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

    /// The answer for a transaction whose commit CAS did not land and whose
    /// record `rec` was then found aborted: 409 with its reason; the
    /// roll-back goes on in the background.
    fn found_aborted(self: &Arc<Self>, rec: TxnRecord) -> TxnError {
        let reason = rec.abort_reason.clone().unwrap_or_else(|| "aborted".into());
        let err = TxnError::Aborted {
            txn: rec.id.clone(),
            failure: aborted(&reason, format!("the transaction was aborted ({reason})")),
        };
        self.roll_back_in_background(rec);
        err
    }

    /// Committed `rec` whose roll-forward is not known to be done: waiters
    /// are told (they may now apply the change and go on), and step 5 runs
    /// in the background, after the answer; recovery finishes it if this
    /// fails.
    fn committed_then_forward(self: &Arc<Self>, plan: &Plan, rec: TxnRecord) -> TxnRecord {
        let txn = rec.id.as_str();
        tracing::info!(txn.id = %txn, "transaction committed");
        for a in &plan.actions {
            self.signals.released(&a.collection, &a.id);
        }
        let engine = Arc::clone(self);
        let forward = rec.clone();
        self.tasks.spawn(async move {
            if let Err(err) = engine.roll_forward(&forward).await {
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
    async fn timed_out_preparing(self: &Arc<Self>, mut record: TxnRecord) -> TxnError {
        let failure = aborted("timeout", "the transaction ran longer than its maximum duration (TXGATE_TXN_MAX_MS)");
        let txn = record.id.clone();
        record.status = Status::Aborted;
        record.abort_reason = failure.reason.clone();
        record.failure = Some(failure.clone());
        let _ = self.store.unsynced().insert(TXNS, record.to_record()).await;
        self.give_up(&txn, TxnError::Aborted { txn: txn.clone(), failure }).await
    }

    /// Every member document of `plan` that exists, by (collection, id):
    /// one read per collection.
    async fn first_reads(&self, plan: &Plan) -> Result<HashMap<(String, String), StoredDoc>, StoreError> {
        let mut first = HashMap::new();
        let mut by_coll: std::collections::BTreeMap<&str, Vec<String>> = std::collections::BTreeMap::new();
        for a in &plan.actions {
            by_coll.entry(&a.collection).or_default().push(a.id.clone());
        }
        for (coll, ids) in by_coll {
            for rec in self.store.get_many(coll, &ids).await? {
                let d = StoredDoc::from_record(rec)?;
                first.insert((coll.to_owned(), d.id.clone()), d);
            }
        }
        Ok(first)
    }

    /// The wall-clock time past which a transaction started at `started_at`
    /// may not live: its lease is never extended beyond it.
    fn hard_end(&self, started_at: DateTime) -> DateTime {
        let max = i64::try_from(self.cfg.max_duration.as_millis()).unwrap_or(i64::MAX);
        DateTime::from_millis(started_at.timestamp_millis().saturating_add(max))
    }

    fn lease_from(&self, at: DateTime) -> DateTime {
        let lease = i64::try_from(self.cfg.lease.as_millis()).unwrap_or(i64::MAX);
        DateTime::from_millis(at.timestamp_millis().saturating_add(lease))
    }

    async fn lock_and_commit(
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
                let failure =
                    aborted("timeout", "the transaction ran longer than its maximum duration (TXGATE_TXN_MAX_MS)");
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
                give_back.iter().map(|(i, _)| self.unlock_own(txn, &plan.actions[*i].collection, &plan.actions[*i].id)),
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
                Err(TxnError::InvalidChange { txn: txn.to_owned(), failure: member.failure })
            }
            Err(Ok(member)) => Err(TxnError::Aborted { txn: txn.to_owned(), failure: member.failure }),
            Err(Err(source)) => Err(store_err(source)),
        }
    }

    /// Step 4, the commit point, for `record` whose members are locked at
    /// `bases`; then step 5 starts in the background.
    async fn commit(
        self: &Arc<Self>,
        plan: &Plan,
        mut record: TxnRecord,
        bases: Vec<(usize, i64)>,
    ) -> Result<Committed, TxnError> {
        let txn = record.id.clone();
        // 4. Commit point.
        let committed_at = self.now();
        let results = member_results(plan, &mut record.members, &bases);
        let commit = Transition::Commit { at: committed_at, results: &results, members: &record.members };
        let cas = commit.apply(self.store.as_ref(), &txn).await;
        let decided = match cas {
            Ok(true) => None,
            // Lost the CAS or cannot tell: re-read until the outcome is known.
            Ok(false) | Err(_) => Some(self.outcome_after_commit_attempt(&txn, "commit_unconfirmed").await),
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
    async fn outcome_after_commit_attempt(&self, txn: &str, reason: &str) -> Result<TxnRecord, TxnError> {
        let give_up_at = Instant::now() + self.cfg.store_timeout;
        let mut backoff = Duration::from_millis(10);
        loop {
            match self.record(txn).await {
                Ok(Some(rec)) if rec.status != Status::Pending => return Ok(rec),
                Ok(Some(_)) => {
                    // Still pending: our CAS did not land. Try the decision again
                    // as an abort so the outcome is settled one way.
                    let _ = self.abort_pending(txn, None, reason).await;
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
    async fn give_up(self: &Arc<Self>, txn: &str, err: TxnError) -> TxnError {
        if matches!(err, TxnError::Store { .. }) {
            // The store is failing: answer now rather than after more calls
            // to it. The abort and roll-back go on in the background; if they
            // fail too, the lease (no longer extended) runs out and recovery
            // does them.
            let (engine, txn) = (Arc::clone(self), txn.to_owned());
            self.tasks.spawn(async move {
                if let Ok(Some(rec)) = engine.abort_pending(&txn, None, "store_error").await {
                    engine.roll_back_in_background(rec);
                }
            });
            return err;
        }
        let (reason, stored) = match &err {
            TxnError::Aborted { failure, .. } | TxnError::InvalidChange { failure, .. } => {
                (failure.reason.clone().unwrap_or_else(|| failure.code.as_str().to_owned()), Some(failure.clone()))
            }
            _ => ("store_error".to_owned(), None),
        };
        let abort = Transition::Abort { reason: &reason, failure: stored.as_ref(), lease: None };
        if let Ok(true) = abort.apply(self.store.as_ref(), txn).await {
            self.metrics.aborted(&reason);
        }
        match self.record(txn).await {
            Ok(Some(rec)) if matches!(rec.status, Status::Aborted | Status::RolledBack) => {
                // A wound or expiry got there first: report that instead.
                let own = rec.abort_reason.as_deref() == Some(reason.as_str());
                self.roll_back_in_background(rec.clone());
                if !own && rec.abort_reason.is_some() {
                    let why = rec.abort_reason.unwrap_or_default();
                    return TxnError::Aborted {
                        txn: txn.to_owned(),
                        failure: aborted(&why, format!("the transaction was aborted ({why})")),
                    };
                }
                err
            }
            // Not decided here (the store is failing): recovery aborts it
            // once its lease runs out.
            _ => err,
        }
    }

    pub fn roll_back_in_background(self: &Arc<Self>, rec: TxnRecord) {
        let engine = Arc::clone(self);
        self.tasks.spawn(async move {
            let rec = match rec.status {
                Status::Aborted | Status::RolledBack => rec,
                _ => return,
            };
            if let Err(err) = engine.roll_back(&rec).await {
                tracing::warn!(txn.id = %rec.id, error = %err, "roll-back failed; recovery will finish it");
            }
        });
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
                    failure: aborted("wounded", "the transaction was wounded by an older one"),
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
                let placeholder = placeholder(&action.id, txn, staged(plan, action, None), self.now());
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
                    if self.settle(coll, &doc, wounder).await? == Settled::Retry {
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
                        return Ok(Step::Failed(MemberFailure { failure: f, invalid: false }));
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
                        && let Ok(Some(own)) = self.record(txn).await
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
                Err(detail) => {
                    return Ok(Step::Failed(MemberFailure {
                        failure: Failure::new(FailureCode::InvalidChange, detail, false),
                        invalid: true,
                    }));
                }
            };
            if doc.meta.outbox.is_some() {
                crate::events::publish_outbox(self.store.as_ref(), coll, &doc, self.now()).await?;
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
            self.metrics.count("txgate_lock_waits_total", &[], 1);
        }
    }
}

impl Drop for LockWait<'_> {
    fn drop(&mut self) {
        if let Some(since) = self.since {
            self.metrics.observe("txgate_lock_wait_seconds", &[], since.elapsed());
        }
    }
}

/// Where preparing a transaction got to.
enum Prepared {
    /// The record and the locks of the free members went as one chain, of
    /// which `applied` writes were applied; `first` holds the members as
    /// read.
    Chained { first: HashMap<(String, String), StoredDoc>, chained: Vec<(usize, i64)>, applied: usize },
    /// Every member was free: see [`Engine::whole`].
    Whole(Whole),
}

/// What became of a whole-transaction chain.
enum Whole {
    /// Committed (and rolled forward, or being rolled forward).
    Committed(Box<TxnRecord>),
    /// Stopped at or before the commit CAS, after `applied` writes.
    Partly { chained: Vec<(usize, i64)>, applied: usize },
    /// The chain failed and the outcome was then settled as not committed
    /// (or could not be learned).
    Failed(Box<TxnError>),
}

/// The one write that locks and stages an action on its document.
struct PlainStage<'p> {
    write: Write<'p>,
    /// The document as the write leaves it (locked, its change staged).
    locked: StoredDoc,
    base_v: i64,
}

/// The one write that locks and stages `action` on its document as read
/// (`None`: absent), when nothing else is needed: the document is free and
/// every precondition holds. `None` otherwise: [`Engine::lock_member`]
/// takes it from there.
fn plain_stage<'p>(
    plan: &Plan,
    action: &'p Action,
    doc: Option<&StoredDoc>,
    txn: &str,
    at: DateTime,
) -> Option<PlainStage<'p>> {
    match doc {
        None => {
            let fresh = matches!(action.op, ActionOp::Insert(_)) && action.if_version.is_none_or(|v| v == 0);
            fresh.then(|| {
                let locked = placeholder(&action.id, txn, staged(plan, action, None), at);
                PlainStage { write: Write::Insert(locked.to_record()), locked, base_v: 0 }
            })
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
fn member_results(plan: &Plan, members: &mut [Member], bases: &[(usize, i64)]) -> Vec<MemberResult> {
    let mut results = vec![None; plan.actions.len()];
    for &(i, base_v) in bases {
        let a = &plan.actions[i];
        let version = if matches!(a.op, ActionOp::Check) { base_v } else { base_v + 1 };
        results[i] = Some(MemberResult { collection: a.collection.clone(), id: a.id.clone(), version });
        members[i].base_v = Some(base_v);
    }
    results.into_iter().map(|r| r.expect("every member locked")).collect()
}

/// `doc` locked by `txn` with `staged` as its pending change (its outbox,
/// if any, must be in the event log: the lock drops it).
fn locked_by(doc: &StoredDoc, txn: &str, staged: Staged) -> StoredDoc {
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
    Step::Failed(MemberFailure { failure: f, invalid: false })
}

/// `None` when `action` may proceed on a document whose committed state is
/// `current` at version `v`.
fn precondition(action: &Action, current: &View, v: i64) -> Option<Step> {
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

/// What one transaction may write in all, its members' data as BSON: a
/// transaction's writes are applied in one write batch of the embedded
/// store (and its records on MongoDB), whose memory this bounds.
pub const MAX_TXN_DATA_BYTES: usize = 64 << 20;

/// Refuse, before anything is written, a transaction whose members' data
/// would exceed [`MAX_TXN_DATA_BYTES`]: the data an insert or replace
/// brings, and for an update the document as first read (a patch adds at
/// most the request's body to it).
fn within_write_bound(plan: &Plan, first: &HashMap<(String, String), StoredDoc>) -> Result<(), StoreError> {
    use crate::documents::rules::data_size;
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

/// The staged post-image of `action` over `base` (the live document, if any).
fn staged_checked(plan: &Plan, action: &Action, base: Option<&StoredDoc>) -> Result<Staged, String> {
    let sv = plan.schema_version;
    let data = match &action.op {
        ActionOp::Insert(data) | ActionOp::Replace(data) => Some(data.clone()),
        ActionOp::Update(patch) => {
            let data = patch.apply(&base.map(|d| d.data.clone()).unwrap_or_default())?;
            crate::documents::rules::check_data_size(&data, "/").map_err(|e| e.message)?;
            Some(data)
        }
        ActionOp::Delete | ActionOp::Check => None,
    };
    let sv = if matches!(action.op, ActionOp::Check | ActionOp::Delete) { base.map_or(sv, |d| d.meta.sv) } else { sv };
    Ok(Staged { op: action.op.staged(), data, sv })
}

fn staged(plan: &Plan, action: &Action, base: Option<&StoredDoc>) -> Staged {
    staged_checked(plan, action, base).expect("an insert always stages")
}

/// An invisible document holding an insert's lock. It has no creation
/// time (its roll-forward sets one), so the scans of live documents by
/// creation time (the TTL sweeper's) never meet it.
fn placeholder(id: &str, txn: &str, staged: Staged, at: DateTime) -> StoredDoc {
    let mut d = StoredDoc::new_live(id.to_owned(), Default::default(), staged.sv, 0, at);
    d.meta.created_at = None;
    d.meta.txn = Some(txn.to_owned());
    d.meta.pending = Some(staged);
    d
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let engine = crate::engine(Arc::clone(&store), cfg, Arc::new(crate::metrics::Metrics::default())).0;
        let txn = uuid::Uuid::now_v7().to_string();
        let started = engine.now();
        let rec = TxnRecord {
            status: Status::Pending,
            expires_at: engine.lease_from(started),
            ..TxnRecord::fenced(&txn, started)
        };
        store.insert(TXNS, rec.to_record()).await.unwrap();
        let hard_end = engine.hard_end(started);
        let stop = CancellationToken::new();
        let beat =
            Heartbeat { engine: Arc::clone(&engine), txn: txn.clone(), hard_end, wounded: CancellationToken::new() };
        let task = tokio::spawn(beat.run(stop.clone()));
        let mut latest = 0;
        for _ in 0..40 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let expires = engine.record(&txn).await.unwrap().unwrap().expires_at.timestamp_millis();
            assert!(expires <= hard_end.timestamp_millis(), "lease extended past the hard cap");
            let now = engine.now().timestamp_millis();
            if now < hard_end.timestamp_millis() {
                assert!(expires > now, "the lease ran out while the attempt was alive");
            }
            latest = expires;
        }
        assert_eq!(latest, hard_end.timestamp_millis(), "extended up to the cap");
        assert!(task.is_finished(), "the heartbeat stops at the hard cap");
        stop.cancel();
    }

    #[test]
    fn same_age_keeps_the_timestamp() {
        let a = uuid::Uuid::now_v7().to_string();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = same_age(&a);
        assert_ne!(a, b);
        assert_eq!(txn_age(&a).0, txn_age(&b).0);
    }

    #[test]
    fn uuid_v7_ids_order_by_age() {
        let a = uuid::Uuid::now_v7().to_string();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = uuid::Uuid::now_v7().to_string();
        assert!(older(&a, &b));
        assert!(!older(&b, &a));
        assert!(!older(&a, &a));
    }
}
