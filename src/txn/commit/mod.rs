//! Running one transaction (docs/design.md §3 steps 1–4): prepare the
//! record, lock and stage every member in parallel, resolve conflicts
//! (helping committed holders, clearing dead ones, wound-wait between live
//! ones), then pass the commit point with one CAS on the record.
//! Roll-forward (step 5) continues in the background after the answer.
//!
//! - [`prepare`]: the first reads, and the chains that write the record
//!   and the free members' locks (or the whole transaction) at once;
//! - [`stage`]: locking and staging the members the chain did not lock;
//! - [`decide`]: the commit CAS, and settling an outcome that is unclear;
//! - [`lease`]: the heartbeat that keeps a running attempt's lease.

mod decide;
mod lease;
mod prepare;
mod stage;

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::document::StoredDoc;
use crate::follow_ups::FollowUps;
use crate::metrics::Metrics;
use crate::store::{DynStore, StoreError, Write};

use super::TxnConfig;
use super::age::same_age;
use super::finish::Finish;
use super::idem::Idempotency;
use super::locks::Locks;
use super::outputs::Outputs;
use super::plan::Plan;
use super::record::{AbortReason, Failure, FailureCode, Member, Status, TXNS, TxnRecord};
use super::signals::Signals;

use lease::Heartbeat;
use prepare::{bound_holds_unread, plain_stage, within_write_bound};

/// The commit service: runs a plan as a transaction, up to its commit
/// point, and leaves its roll-forward or roll-back to run in the
/// background. Built by [`super::Transactions::build`] from the parts it
/// needs.
pub(crate) struct Commit {
    pub(in crate::txn) store: DynStore,
    pub(in crate::txn) cfg: TxnConfig,
    pub(in crate::txn) metrics: Arc<Metrics>,
    pub(in crate::txn) signals: Arc<Signals>,
    /// Work started on a request's behalf (roll-forward after the answer).
    pub(in crate::txn) follow_ups: FollowUps,
    pub(in crate::txn) outputs: Arc<[Arc<dyn Outputs>]>,
    pub(in crate::txn) locks: Arc<Locks>,
    pub(in crate::txn) finish: Arc<Finish>,
    pub(in crate::txn) keys: Arc<Idempotency>,
}

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

impl TxnError {
    /// The attempt the error is about.
    pub fn txn(&self) -> &str {
        match self {
            Self::Aborted { txn, .. }
            | Self::InvalidChange { txn, .. }
            | Self::Store { txn, .. }
            | Self::OutcomeUnknown { txn } => txn,
        }
    }
}

/// A committed transaction, as answered to the client.
#[derive(Clone, Debug)]
pub struct Committed {
    pub record: TxnRecord,
}

/// The 409 `aborted` failure for an abort with `reason`.
fn aborted(reason: AbortReason, detail: impl Into<String>) -> Failure {
    aborted_as(reason.as_str(), detail)
}

/// The 409 `aborted` failure for an abort whose reason a record gives, as
/// it gives it.
fn aborted_as(reason: &str, detail: impl Into<String>) -> Failure {
    Failure { reason: Some(reason.to_owned()), ..Failure::new(FailureCode::Aborted, detail, true) }
}

impl Commit {
    /// Run `plan` as a transaction: `Ok` once its commit point is passed.
    ///
    /// An attempt wounded by an older transaction is retried here, within
    /// the lock wait, under a new id that keeps the first attempt's age, so
    /// that it becomes the oldest in time and cannot starve (wound-wait
    /// restarts keep their timestamp). With an idempotency key, the claim
    /// is moved to each new attempt first.
    pub(crate) async fn execute(
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
            let wounded = matches!(&result, Err(TxnError::Aborted { failure, .. }) if failure.abort_reason() == Some(AbortReason::Wounded));
            if !wounded || Instant::now() >= give_up_at {
                return result;
            }
            let next = same_age(&first);
            if let Some(key) = idempotency_key
                && !matches!(self.keys.repoint_key(key, &txn, &next).await, Ok(true))
            {
                return result;
            }
            self.metrics.incr(&crate::metrics::TRANSACTION_RETRIES, "wounded");
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
                self.metrics.incr(&crate::metrics::CONFLICTS, failure.code.as_str());
                "aborted"
            }
            Err(_) => "error",
        };
        self.metrics.incr(&crate::metrics::TRANSACTIONS, outcome);
        self.metrics.observe(&crate::metrics::TRANSACTION_DURATION, &[outcome], started.elapsed());
        result
    }

    async fn run(self: &Arc<Self>, plan: &Plan, txn: &str) -> Result<Committed, TxnError> {
        let store_err = |source| TxnError::Store { txn: txn.to_owned(), source };
        // 1. Prepare: the record with the whole worklist exists before any lock.
        let started_at = self.cfg.clock.now();
        let record = TxnRecord {
            id: txn.to_owned(),
            status: Status::Pending,
            started_at,
            expires_at: self.lease_from(started_at).min(self.hard_end(started_at)),
            committed_at: None,
            finished_at: None,
            request: plan.request.clone(),
            key: plan.key.clone(),
            user: plan.user.clone(),
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
        // The members as they are now, one read per collection, side by
        // side. Where the store takes a chain of writes in one round trip
        // and every member is free (with outputs that chain), the whole
        // transaction goes as one commit (`at_once`, where the store writes
        // all or nothing) or one chain of the protocol's steps (`whole`);
        // otherwise the record and the locks of the free members go as
        // one, the record first (it must exist before any lock). Unsynced,
        // like every step before the commit point: a crash before the
        // synced commit CAS leaves a transaction recovery aborts.
        let wounded = CancellationToken::new();
        let _running = self.signals.run(txn, wounded.clone());
        let began = Instant::now();
        let prepare = async {
            let chains = self.store.capabilities().cheap_chains;
            if !chains && bound_holds_unread(plan) {
                // Where a chain costs a round trip per write, the record goes
                // alone, side by side with the first reads (it needs nothing
                // from them, for the data bound holds whatever they find),
                // and the members are then locked in parallel.
                let unsynced = self.store.unsynced();
                let insert = unsynced.insert(TXNS, record.to_record());
                let (first, inserted) = tokio::join!(self.first_reads(plan), insert);
                return Ok(match (first, inserted) {
                    (Ok(first), Ok(inserted)) => match within_write_bound(plan, &first) {
                        Ok(()) => Prepared::Chained { first, chained: Vec::new(), applied: usize::from(inserted) },
                        Err(err) => Prepared::Refused(err),
                    },
                    (Err(err), _) | (_, Err(err)) => Prepared::Refused(err),
                });
            }
            let mut tries = 0;
            let (first, stages) = loop {
                let first = self.first_reads(plan).await?;
                within_write_bound(plan, &first)?;
                let at = self.cfg.clock.now();
                let mut stages = Vec::new();
                for (i, action) in plan.actions.iter().enumerate().filter(|_| chains) {
                    let seen = first.get(&(action.collection.clone(), action.id.clone()));
                    if let Some(stage) = plain_stage(plan, action, seen, txn, at) {
                        stages.push((i, stage));
                    }
                }
                if stages.len() < plan.actions.len() || !self.outputs_chain(&record) {
                    break (first, stages);
                }
                // Every member is free: the transaction as one commit, all
                // or nothing, where the store can (read again and tried
                // again while members move under it, as they do when
                // transactions contend: a read is cheap there); else the
                // whole protocol in one chain.
                if self.store.capabilities().all_or_nothing && tries < AT_ONCE_TRIES {
                    if let Some(done) = self.at_once(plan, &record, &stages).await? {
                        return Ok(Prepared::Whole(done));
                    }
                    tries += 1;
                    continue;
                }
                return Ok(Prepared::Whole(self.whole(plan, &record, stages).await?));
            };
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
            Ok(Ok(Prepared::Refused(err))) => return Err(self.give_up(txn, store_err(err)).await),
            Ok(Err(err)) => return Err(store_err(err)),
            Err(_) => return self.timed_out_preparing(plan, record).await,
        };
        if applied == 0 {
            // The id is taken: a later request that took over this one's
            // Idempotency-Key fenced this attempt with an aborted record.
            let reason = match self.locks.record(txn).await {
                Ok(Some(rec)) => rec.abort_reason.unwrap_or_else(|| AbortReason::Superseded.as_str().into()),
                _ => AbortReason::Superseded.as_str().into(),
            };
            return Err(TxnError::Aborted {
                txn: txn.to_owned(),
                failure: aborted_as(
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
            commit: Arc::clone(self),
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
}

/// How many times a transaction of free members is read and tried as one
/// all-or-nothing commit before it takes the protocol's path. A try costs
/// a read and the writer's check; the protocol's path costs locks, a
/// commit and a roll-forward, and its locks send every transaction that
/// reads one of them down the same path. In the contended bank (16
/// clients, 100 accounts) about half the tries find a member moved: with
/// 3 tries one transfer in ten took the locks and the bank ran 30–40%
/// slower than with 8; 16 did no better than 8 (docs/benchmarks.md).
const AT_ONCE_TRIES: usize = 8;

/// Where preparing a transaction got to.
enum Prepared {
    /// The record and the locks of the free members went as one chain, of
    /// which `applied` writes were applied; `first` holds the members as
    /// read.
    Chained { first: HashMap<(String, String), StoredDoc>, chained: Vec<(usize, i64)>, applied: usize },
    /// Every member was free: see [`Commit::whole`].
    Whole(Whole),
    /// The record may have been written beside the first reads, which
    /// failed or found more data than a transaction may write: it is
    /// aborted in the background.
    Refused(StoreError),
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
