//! Multi-document transactions over single-document compare-and-set: the
//! commit protocol, lock conflicts and wound-wait, roll-forward, roll-back
//! and recovery (docs/design.md §3).

pub(crate) mod age;
pub(crate) mod answer;
pub(crate) mod commit;
pub(crate) mod events;
pub(crate) mod finish;
pub(crate) mod hook;
pub(crate) mod idem;
pub(crate) mod locks;
pub(crate) mod outputs;
pub(crate) mod plan;
pub(crate) mod record;
pub(crate) mod recovery;
pub(crate) mod signals;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::follow_ups::FollowUps;

use crate::metrics::Metrics;
use crate::store::{DynStore, StoreResult};

pub(crate) use commit::{Commit, Committed, TxnError};
pub(crate) use events::TxnEvents;
pub(crate) use finish::Finish;
pub(crate) use idem::{Fingerprint, Idempotency};
pub(crate) use locks::Locks;
pub(crate) use plan::Plan;
pub(crate) use record::{Status, TxnRecord};
pub(crate) use recovery::Recovery;

/// Protocol timings.
#[derive(Clone, Debug)]
pub struct TxnConfig {
    pub lease: Duration,
    pub lock_wait: Duration,
    pub clock_skew: Duration,
    pub recovery_interval: Duration,
    /// Hard cap on one transaction's life: past it, it aborts itself, and
    /// its lease is never extended beyond it.
    pub max_duration: Duration,
    /// Deadline of every store operation.
    pub store_timeout: Duration,
    /// How long finished records are kept.
    pub retention: Duration,
    /// How long idempotency keys are remembered.
    pub idempotency_retention: Duration,
    /// Most actions one transaction may have.
    pub max_actions: usize,
    /// Most hooks one transaction may have.
    pub max_hooks: usize,
    /// Where timestamps come from.
    pub clock: crate::clock::Clock,
}

impl Default for TxnConfig {
    fn default() -> Self {
        Self {
            lease: Duration::from_millis(5000),
            lock_wait: Duration::from_millis(2000),
            clock_skew: Duration::from_millis(1000),
            recovery_interval: Duration::from_millis(1000),
            max_duration: Duration::from_millis(30_000),
            store_timeout: Duration::from_millis(5000),
            retention: Duration::from_secs(24 * 3600),
            idempotency_retention: Duration::from_secs(24 * 3600),
            max_actions: 1000,
            max_hooks: 16,
            clock: crate::clock::Clock::System,
        }
    }
}

/// The transaction services, built here and only here, each from the
/// narrow parts it needs: [`Finish`] (roll-forward and roll-back) below
/// [`Locks`] (meeting a lock), [`Idempotency`] (keys) over the locks,
/// [`Commit`] (running a plan) over all three, and [`Recovery`] (the
/// worker) over locks and finish. The workflows a request runs through
/// them (a transaction with its Idempotency-Key, an operator's abort) are
/// methods here.
pub struct Transactions {
    store: DynStore,
    cfg: TxnConfig,
    follow_ups: FollowUps,
    finish: Arc<Finish>,
    locks: Arc<Locks>,
    keys: Arc<Idempotency>,
    commit: Arc<Commit>,
    recovery: Arc<Recovery>,
}

/// A request's Idempotency-Key, scoped to its API key, with the
/// fingerprint of the body it came with.
pub struct Keyed {
    pub key: String,
    pub fingerprint: Fingerprint,
}

/// What a submitted transaction came to.
pub enum Submitted {
    /// Run now: committed, or not, with the error that says why; with the
    /// answer a refusal is to keep for its key, when it is.
    Ran(Box<Result<Committed, TxnError>>, Option<KeepAnswer>),
    /// The outcome stored for the key, answered again.
    Replay { status: u16, body: serde_json::Value },
    /// The first request with the key is still running.
    InProgress { txn: String },
    /// The key was used with another body.
    KeyReused,
}

/// The key of a refused transaction, claimed until its answer is stored:
/// the caller, which renders the answer, stores it before it answers
/// ([`KeepAnswer::keep`]), so a retry with the key gets the same answer.
/// One dropped unkept leaves the key held by the attempt, as a crash at
/// that point would.
#[must_use = "the key holds its claim until the answer is kept"]
pub struct KeepAnswer {
    keys: Arc<Idempotency>,
    key: String,
    txn: String,
}

impl KeepAnswer {
    /// Store `status` and `body`, the refusal's answer, for the key.
    pub async fn keep(self, status: u16, body: &serde_json::Value) {
        if let Err(err) = self.keys.complete_key(&self.key, &self.txn, status, body).await {
            tracing::warn!(txn.id = %self.txn, error = %err, "could not record the idempotency outcome");
        }
    }
}

/// What an operator's abort found.
pub enum Aborted {
    /// Aborted now or before (its roll-back runs in the background), or
    /// already rolled back or pending: the record as it is.
    Record(Box<TxnRecord>),
    /// It committed: it cannot be aborted.
    Committed(Box<TxnRecord>),
}

impl Transactions {
    /// The services over `store`, recording into `metrics`; `outputs` are
    /// what a committed transaction leaves besides its documents.
    pub(crate) fn build(
        store: DynStore,
        cfg: TxnConfig,
        metrics: Arc<Metrics>,
        outputs: Vec<Arc<dyn outputs::Outputs>>,
    ) -> Arc<Self> {
        let follow_ups = FollowUps::default();
        let signals = Arc::new(signals::Signals::default());
        let outputs: Arc<[Arc<dyn outputs::Outputs>]> = outputs.into();
        let clock = cfg.clock.clone();
        let finish = Finish::new(
            store.clone(),
            clock.clone(),
            metrics.clone(),
            signals.clone(),
            outputs.clone(),
            follow_ups.clone(),
        );
        let locks = Locks::new(store.clone(), cfg.clone(), metrics.clone(), signals.clone(), finish.clone());
        let keys = Idempotency::new(store.clone(), clock, cfg.lease, locks.clone());
        let commit = Arc::new(Commit {
            store: store.clone(),
            cfg: cfg.clone(),
            metrics: metrics.clone(),
            signals,
            follow_ups: follow_ups.clone(),
            outputs,
            locks: locks.clone(),
            finish: finish.clone(),
            keys: keys.clone(),
        });
        let recovery = Recovery::new(store.clone(), cfg.clone(), metrics, locks.clone(), finish.clone());
        Arc::new(Self { store, cfg, follow_ups, finish, locks, keys, commit, recovery })
    }

    pub fn config(&self) -> &TxnConfig {
        &self.cfg
    }

    /// Background work started on a request's behalf (a transaction that
    /// outlives its connection, a roll-forward after the answer); a caller
    /// that stops the gateway closes it and waits.
    pub fn tasks(&self) -> &TaskTracker {
        self.follow_ups.tasks()
    }

    /// Until no background work of this engine is under way.
    pub async fn idle(&self) {
        self.follow_ups.idle().await;
    }

    /// The follow-ups of answers (docs/design.md §3), shared with the
    /// single-document service and the log's readers.
    pub(crate) fn follow_ups(&self) -> &FollowUps {
        &self.follow_ups
    }

    /// The locks service, for single-document reads and writes.
    pub fn locks(&self) -> &Arc<Locks> {
        &self.locks
    }

    /// The finishing service (roll-forward, roll-back).
    pub fn finish(&self) -> &Arc<Finish> {
        &self.finish
    }

    /// The recovery service; its worker is started by the gateway.
    pub fn recovery(&self) -> &Arc<Recovery> {
        &self.recovery
    }

    /// Run `plan` as a transaction, without an Idempotency-Key: see
    /// [`Commit::execute`].
    pub async fn execute(&self, plan: &Plan, txn: Option<String>) -> Result<Committed, TxnError> {
        self.commit.execute(plan, txn, None).await
    }

    /// One recovery pass, the outbox sweep included.
    pub async fn recover_once(&self) -> StoreResult<recovery::Pass> {
        self.recovery.recover_once().await
    }

    /// Transaction `id`'s record, if it exists.
    pub async fn get(&self, id: &str) -> StoreResult<Option<TxnRecord>> {
        self.locks.record(id).await
    }

    /// A page of transaction records, oldest first, optionally only those
    /// with `status`.
    pub async fn list(
        &self,
        status: Option<Status>,
        after: Option<&str>,
        limit: usize,
    ) -> StoreResult<(Vec<TxnRecord>, Option<String>)> {
        let scan = match status {
            Some(s) => crate::store::scans::TXNS_BY_STATUS.scan(vec![s.to_bson()]),
            None => crate::store::scans::TXNS.scan(Vec::new()),
        };
        crate::store::page(self.store.as_ref(), record::TXNS, scan, after, limit, TxnRecord::from_record).await
    }

    /// Run `plan` for a request, with its Idempotency-Key if it has one
    /// (docs/design.md §3): the key is claimed first; a stored outcome is
    /// answered again; after the run, a commit (after the answer: the
    /// committed record answers a retry until then) or a failure a retry
    /// cannot change is stored for the key (by the caller, which renders its
    /// answer: [`KeepAnswer`]), a retryable failure frees the
    /// key, and an outcome that is unknown leaves it with the attempt, so
    /// a retry learns it from the record instead of running again.
    pub async fn submit(&self, plan: &Plan, keyed: Option<&Keyed>) -> StoreResult<Submitted> {
        let txn = uuid::Uuid::now_v7().to_string();
        let Some(Keyed { key, fingerprint }) = keyed else {
            return Ok(Submitted::Ran(Box::new(self.commit.execute(plan, Some(txn), None).await), None));
        };
        match self.keys.claim_key(key, fingerprint, &txn).await? {
            idem::Claim::Fresh => {}
            idem::Claim::Replay { status, body } => return Ok(Submitted::Replay { status, body }),
            idem::Claim::InProgress { txn } => return Ok(Submitted::InProgress { txn }),
            idem::Claim::Reused => return Ok(Submitted::KeyReused),
        }
        let result = self.commit.execute(plan, Some(txn), Some(key)).await;
        // The attempt that decided the outcome (a wounded attempt is retried).
        let txn = match &result {
            Ok(c) => c.record.id.as_str(),
            Err(err) => err.txn(),
        };
        let mut keep = None;
        let stored = match &result {
            Ok(committed) => {
                // After the answer: until it is stored, a retry with the key
                // finds the committed record and replays its summary.
                let (keys, key, txn) = (Arc::clone(&self.keys), key.clone(), txn.to_owned());
                let body = answer::CommittedOut::of(&committed.record).to_json();
                self.follow_ups.spawn(async move {
                    if let Err(err) = keys.complete_key(&key, &txn, 200, &body).await {
                        tracing::warn!(txn.id = %txn, error = %err, "could not record the idempotency outcome");
                    }
                });
                Ok(())
            }
            Err(TxnError::Aborted { failure, .. }) if failure.retryable => self.keys.release_key(key, txn).await,
            Err(TxnError::Aborted { .. } | TxnError::InvalidChange { .. }) => {
                keep = Some(KeepAnswer { keys: Arc::clone(&self.keys), key: key.clone(), txn: txn.to_owned() });
                Ok(())
            }
            Err(TxnError::OutcomeUnknown { .. }) => Ok(()),
            Err(TxnError::Store { .. }) => self.keys.release_key(key, txn).await,
        };
        if let Err(err) = stored {
            tracing::warn!(txn.id = %txn, error = %err, "could not record the idempotency outcome");
        }
        Ok(Submitted::Ran(Box::new(result), keep))
    }

    /// An operator's abort of `rec` (docs/design.md §3): a pending
    /// transaction is aborted with reason `operator`, and an aborted one
    /// rolled back in the background; a committed one stays committed.
    pub async fn abort(&self, rec: TxnRecord) -> StoreResult<Aborted> {
        let rec = if rec.status == Status::Pending {
            self.locks.abort_pending(&rec.id, None, record::AbortReason::Operator).await?.unwrap_or(rec)
        } else {
            rec
        };
        if rec.status.is_committed() {
            return Ok(Aborted::Committed(Box::new(rec)));
        }
        if rec.status == Status::Aborted {
            self.commit.roll_back_in_background(rec.clone());
        }
        Ok(Aborted::Record(Box::new(rec)))
    }
}
