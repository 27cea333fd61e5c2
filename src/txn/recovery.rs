//! Recovery (docs/design.md §3), run every `recovery_interval` by every instance:
//! abort and roll back pending records past their lease, roll forward
//! committed ones left unfinished, roll back aborted ones, clear locks whose
//! holder is neither pending nor committed, and purge finished records after
//! retention. Every action is idempotent, so instances may overlap.
//!
//! A record recovery cannot handle (one that does not decode, or a member
//! document another tool broke) is reported and skipped: it never stops the
//! pass for the others. Only a store that fails as such ends a pass early.

use crate::worker::Worker;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::document::StoredDoc;
use crate::store::scans::{DOCS_LOCKED, DOCS_OUTBOX, TXNS_BY_COMMIT, TXNS_BY_LEASE, TXNS_BY_STATUS};
use crate::store::{Bound, Bson, DateTime, Scan, StoreError, StoreResult};

use crate::metrics::Metrics;
use crate::store::DynStore;

use super::TxnConfig;
use super::finish::Finish;
use super::locks::Locks;
use super::record::{AbortReason, Status, TXNS, TxnRecord};

/// How often the worker sweeps outboxes (at most once a pass): an outbox
/// outlives only a crash between a single-document write and its event's
/// move to the log (the next writer of the document moves it anyway), so
/// the sweep need not cost a scan of every collection on every pass.
const OUTBOX_SWEEP_EVERY: Duration = Duration::from_secs(5);

/// How old an outbox's change must be before the sweep moves it: a younger
/// one is on its way to the log through its writer's queue, which appends
/// that instance's events in the order it answered their writes; the sweep
/// appending it meanwhile could log it after a later write's.
const OUTBOX_AGE: Duration = Duration::from_secs(5);

/// Records read per scan; the lock sweep repeats until it has seen every
/// lock, the other categories take one batch per pass.
const BATCH: usize = crate::store::BATCH;

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pass {
    pub expired: usize,
    pub rolled_forward: usize,
    pub rolled_back: usize,
    pub locks_cleared: usize,
    /// Outboxes a crash left behind, moved to the event log.
    pub outboxes: usize,
    /// Records skipped because they could not be handled.
    pub skipped: usize,
}

impl Pass {
    pub fn is_idle(&self) -> bool {
        *self == Pass::default()
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn before(at: DateTime, d: Duration) -> DateTime {
    DateTime::from_millis(at.timestamp_millis().saturating_sub(ms(d)))
}

/// The recovery service of this instance: a worker that runs a pass
/// every `recovery_interval`.
pub struct Recovery {
    store: DynStore,
    cfg: TxnConfig,
    metrics: Arc<Metrics>,
    locks: Arc<Locks>,
    finish: Arc<Finish>,
}

impl Recovery {
    pub(super) fn new(
        store: DynStore,
        cfg: TxnConfig,
        metrics: Arc<Metrics>,
        locks: Arc<Locks>,
        finish: Arc<Finish>,
    ) -> Arc<Self> {
        Arc::new(Self { store, cfg, metrics, locks, finish })
    }

    fn now(&self) -> DateTime {
        self.cfg.clock.now()
    }

    async fn records(&self, scan: Scan, pass: &mut Pass) -> StoreResult<Vec<TxnRecord>> {
        let recs = self.store.scan(TXNS, scan.limit(BATCH)).await?;
        let mut out = Vec::with_capacity(recs.len());
        for rec in recs {
            let id = crate::store::record_id(&rec).unwrap_or("?").to_owned();
            match TxnRecord::from_record(rec) {
                Ok(r) => out.push(r),
                Err(err) => self.skip(pass, &id, err)?,
            }
        }
        Ok(out)
    }

    /// Report a record this pass cannot handle and go on; a store that is
    /// unavailable ends the pass instead (every other record would fail
    /// the same way).
    fn skip(&self, pass: &mut Pass, id: &str, err: StoreError) -> StoreResult<()> {
        if matches!(err, StoreError::Unavailable(_)) {
            return Err(err);
        }
        pass.skipped += 1;
        self.metrics.recovery_action("skipped");
        tracing::warn!(record.id = %id, error = %err, "recovery skipped a record it cannot handle");
        Ok(())
    }

    /// One recovery pass, the outbox sweep included.
    pub async fn recover_once(&self) -> StoreResult<Pass> {
        self.recover(true).await
    }

    /// One recovery pass; the outbox sweep when `outboxes`.
    async fn recover(&self, outboxes: bool) -> StoreResult<Pass> {
        let mut pass = Pass::default();
        let at = self.now();
        // Pending past lease + skew: abort (a heartbeat that landed first
        // wins the CAS), then roll back.
        let expired = TXNS_BY_LEASE
            .scan(vec![Status::Pending.to_bson()])
            .to(Bound::Excluded(Bson::DateTime(before(at, self.cfg.clock_skew))));
        for rec in self.records(expired, &mut pass).await? {
            let outcome = async {
                let aborted = self.locks.abort_pending(&rec.id, Some(rec.expires_at), AbortReason::Expired).await?;
                if let Some(aborted) = aborted {
                    pass.expired += 1;
                    self.metrics.recovery_action("expired");
                    self.finish(&aborted, &mut pass).await?;
                }
                StoreResult::Ok(())
            }
            .await;
            if let Err(err) = outcome {
                self.skip(&mut pass, &rec.id, err)?;
            }
        }
        // Committed but not finished within a lease; aborted: roll back.
        let unfinished = TXNS_BY_COMMIT
            .scan(vec![Status::Committed.to_bson()])
            .to(Bound::Excluded(Bson::DateTime(before(at, self.cfg.lease))));
        let mut decided = self.records(unfinished, &mut pass).await?;
        decided.extend(self.records(TXNS_BY_STATUS.scan(vec![Status::Aborted.to_bson()]), &mut pass).await?);
        for rec in decided {
            if let Err(err) = self.finish(&rec, &mut pass).await {
                self.skip(&mut pass, &rec.id, err)?;
            }
        }
        pass.locks_cleared = self.sweep_locks(&mut pass).await?;
        if outboxes {
            pass.outboxes = self.sweep_outboxes(&mut pass).await?;
        }
        Ok(pass)
    }

    /// Move to the event log every outbox a single-document write left
    /// behind (it stopped between its compare-and-set and the log), along
    /// each user collection's index of documents with an outbox; one whose
    /// change is younger than [`OUTBOX_AGE`] is left to its writer.
    async fn sweep_outboxes(&self, pass: &mut Pass) -> StoreResult<usize> {
        let young = before(self.now(), OUTBOX_AGE);
        let mut moved = 0;
        for coll in self.store.collections().await? {
            if coll.starts_with('_') {
                continue;
            }
            let mut from = Bound::Included(Bson::String(String::new()));
            loop {
                let scan = DOCS_OUTBOX.scan(Vec::new()).from(from.clone()).limit(BATCH);
                let found = self.store.scan(&coll, scan).await?;
                let full = found.len() == BATCH;
                let before_batch = from.clone();
                for rec in found {
                    let id = crate::store::record_id(&rec).unwrap_or("?").to_owned();
                    // The position comes from the raw record, so that one
                    // that is not a document still moves the sweep past it.
                    let eid =
                        rec.get_document("_meta").and_then(|m| m.get_document("outbox")).and_then(|o| o.get_str("_id"));
                    if let Ok(eid) = eid {
                        from = Bound::Excluded(Bson::String(eid.to_owned()));
                    }
                    let outcome = async {
                        let doc = StoredDoc::from_record(rec)?;
                        let Some(outbox) = &doc.meta.outbox else { return Ok(false) };
                        if outbox.get_datetime("at").is_ok_and(|at| *at > young) {
                            return Ok(false);
                        }
                        crate::events::publish_outbox(self.store.as_ref(), &coll, &doc, self.now()).await?;
                        Ok(true)
                    }
                    .await;
                    match outcome {
                        Ok(false) => {}
                        Ok(true) => {
                            moved += 1;
                            self.metrics.recovery_action("outbox_published");
                        }
                        Err(err) => self.skip(pass, &format!("{coll}/{id}"), err)?,
                    }
                }
                // A full batch none of whose keys could be read would be
                // read again for ever: the rest of this collection waits
                // for the next pass (and is reported, as skipped, there).
                if !full || from == before_batch {
                    break;
                }
            }
        }
        Ok(moved)
    }

    async fn finish(&self, rec: &TxnRecord, pass: &mut Pass) -> StoreResult<()> {
        match rec.status {
            Status::Committed => {
                self.finish.roll_forward(rec).await?;
                pass.rolled_forward += 1;
                self.metrics.recovery_action("rolled_forward");
            }
            Status::Aborted => {
                self.finish.roll_back(rec).await?;
                pass.rolled_back += 1;
                self.metrics.recovery_action("rolled_back");
            }
            _ => {}
        }
        Ok(())
    }

    /// Clear locks whose holder is neither pending nor committed: a lock CAS
    /// that landed after its transaction was given up. The sweep walks each
    /// user collection's index of locked documents, ordered by holder, and
    /// skips past every lock of a holder that is still running; so it costs
    /// one read per holder (plus the stale locks it clears), and reaches
    /// every lock however many live ones sort ahead of it.
    async fn sweep_locks(&self, pass: &mut Pass) -> StoreResult<usize> {
        let mut cleared = 0;
        // Holders found running in this pass.
        let mut running: HashSet<String> = HashSet::new();
        for coll in self.store.collections().await? {
            if coll.starts_with('_') {
                continue;
            }
            // Every string: a lock holder is a transaction id.
            let mut from = Bound::Included(Bson::String(String::new()));
            loop {
                let scan = DOCS_LOCKED.scan(Vec::new()).from(from.clone()).limit(BATCH);
                let locked = self.store.scan(&coll, scan).await?;
                let full = locked.len() == BATCH;
                let mut last: Option<(String, bool)> = None;
                for rec in locked {
                    let id = crate::store::record_id(&rec).unwrap_or("?").to_owned();
                    // Its holder as stored, for a record that is not a
                    // document: the sweep still moves past it.
                    let raw_holder = rec.get_document("_meta").and_then(|m| m.get_str("txn")).map(str::to_owned);
                    match self.sweep_lock(&coll, rec, &mut running).await {
                        Ok((holder, swept)) => {
                            cleared += usize::from(swept == Swept::Cleared);
                            let progress =
                                swept == Swept::Cleared || last.as_ref().is_some_and(|(h, p)| *h == holder && *p);
                            last = Some((holder, progress));
                        }
                        Err(err) => {
                            self.skip(pass, &format!("{coll}/{id}"), err)?;
                            if let Ok(holder) = raw_holder {
                                if last.as_ref().is_none_or(|(h, _)| *h != holder) {
                                    last = Some((holder, false));
                                }
                            }
                        }
                    }
                }
                from = match last {
                    _ if !full => break,
                    None => break,
                    // The rest of a running holder's locks are skipped at
                    // once; a gone holder whose locks this batch cleared is
                    // read again (they left the index), so one holding more
                    // than a batch is cleared in this pass too.
                    Some((holder, true)) if !running.contains(&holder) => Bound::Included(Bson::String(holder)),
                    Some((holder, _)) => Bound::Excluded(Bson::String(holder)),
                };
            }
        }
        Ok(cleared)
    }

    /// Clear one document's lock if its holder is gone; its holder and
    /// what was done.
    async fn sweep_lock(
        &self,
        coll: &str,
        rec: crate::store::Record,
        running: &mut HashSet<String>,
    ) -> StoreResult<(String, Swept)> {
        let doc = StoredDoc::from_record(rec)?;
        let Some(holder) = doc.meta.txn.clone() else { return Ok((String::new(), Swept::Kept)) };
        if running.contains(&holder) {
            return Ok((holder, Swept::Running));
        }
        let swept = match self.locks.record(&holder).await? {
            Some(r) if r.status == Status::Pending || r.status == Status::Committed => {
                running.insert(holder.clone());
                Swept::Running
            }
            Some(r) if r.status == Status::Done => {
                // Cannot normally happen (done means every member was
                // released); applying it is what "done" promises.
                self.finish.roll_forward_member(&r, coll, &doc).await?;
                Swept::Kept
            }
            _ if self.finish.release_stale(&holder, coll, &doc).await? => Swept::Cleared,
            _ => Swept::Kept,
        };
        Ok((holder, swept))
    }
}

#[async_trait::async_trait]
impl Worker for Recovery {
    fn name(&self) -> &'static str {
        "recovery"
    }

    async fn run_once(&self) -> StoreResult<()> {
        self.recover(true).await.map(|_| ())
    }

    /// A pass every `recovery_interval` until `shutdown`; a pass in
    /// progress is finished first.
    async fn run(self: Arc<Self>, shutdown: CancellationToken) {
        let interval = self.cfg.recovery_interval;
        let mut backoff = interval;
        let mut last_outbox_sweep: Option<tokio::time::Instant> = None;
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            let outboxes = last_outbox_sweep.is_none_or(|at| at.elapsed() >= OUTBOX_SWEEP_EVERY.max(interval));
            if outboxes {
                last_outbox_sweep = Some(tokio::time::Instant::now());
            }
            match self.recover(outboxes).await {
                Ok(pass) => {
                    backoff = interval;
                    if !pass.is_idle() {
                        tracing::info!(?pass, "recovery pass");
                    }
                }
                Err(err) => {
                    // The store is failing: back off, but not so far that
                    // recovery lags long once it answers again.
                    backoff = (backoff * 2).min(interval.max(Duration::from_secs(5)));
                    tracing::warn!(error = %err, retry_in_ms = backoff.as_millis() as u64, "recovery pass failed");
                }
            }
        }
    }
}

/// What the sweep did with one locked document.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Swept {
    Cleared,
    Kept,
    /// Its holder is running: every lock it holds stays.
    Running,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::clock::Clock;
    use crate::document::{Staged, StagedOp, StoredDoc};
    use crate::metrics::Metrics;
    use crate::store::memory::MemoryStore;
    use crate::store::{DynStore, Store, doc};
    use crate::txn::locks::Settled;
    use crate::txn::record::Member;
    use crate::txn::{Transactions, TxnConfig};

    fn engine(store: DynStore) -> Arc<Transactions> {
        let cfg = TxnConfig {
            lease: Duration::from_millis(500),
            clock_skew: Duration::from_millis(100),
            recovery_interval: Duration::from_millis(200),
            clock: Clock::following_tokio(),
            ..TxnConfig::default()
        };
        crate::transactions(store, cfg, Arc::new(Metrics::default())).0
    }

    /// A pending transaction `txn` whose client is gone, holding document
    /// `c/d` (at version 1, `n: 1`, staging `n: 2`); its lease ends one
    /// lease from now.
    async fn held(engine: &Transactions, store: &dyn Store, txn: &str) -> StoredDoc {
        let now = engine.config().clock.now();
        let expires = DateTime::from_millis(now.timestamp_millis() + ms(engine.config().lease));
        let member = Member { collection: "c".into(), id: "d".into(), op: StagedOp::Update, base_v: Some(1) };
        let rec = TxnRecord { members: vec![member], expires_at: expires, ..TxnRecord::fenced(txn, now) };
        let rec = TxnRecord { status: Status::Pending, finished_at: None, abort_reason: None, ..rec };
        assert!(store.insert(TXNS, rec.to_record()).await.unwrap());
        let mut d = StoredDoc::new_live("d".into(), doc! {"n": 1_i64}, 1, 1, now);
        d.meta.txn = Some(txn.into());
        d.meta.pending = Some(Staged { op: StagedOp::Update, data: Some(doc! {"n": 2_i64}), sv: 1 });
        assert!(store.insert("c", d.to_record()).await.unwrap());
        d
    }

    async fn doc_state(store: &dyn Store) -> (Option<String>, i64, i64) {
        let d = StoredDoc::from_record(store.get("c", "d").await.unwrap().unwrap()).unwrap();
        (d.meta.txn, d.meta.v, d.data.get_i64("n").unwrap())
    }

    #[tokio::test(start_paused = true)]
    async fn the_sweep_leaves_a_young_outbox_to_its_writer() {
        let store: DynStore = Arc::new(MemoryStore::default());
        crate::migrate::run(store.as_ref()).await.unwrap();
        let engine = engine(Arc::clone(&store));
        let now = engine.config().clock.now();
        let mut d = StoredDoc::new_live("d".into(), doc! {"n": 1_i64}, 1, 1, now);
        let event =
            crate::events::model::document_event(crate::events::EventType::Created, "c", &d, None, None, None, now);
        d.meta.outbox = Some(event);
        assert!(store.insert("c", d.to_record()).await.unwrap());
        let outbox =
            || async { StoredDoc::from_record(store.get("c", "d").await.unwrap().unwrap()).unwrap().meta.outbox };
        let logged = || async {
            store.scan(crate::events::EVENTS, crate::store::scans::EVENTS_BY_SEQ.scan(Vec::new())).await.unwrap().len()
        };
        tokio::time::advance(OUTBOX_AGE - Duration::from_millis(1)).await;
        assert_eq!(engine.recovery().recover(true).await.unwrap().outboxes, 0);
        assert!(outbox().await.is_some(), "a young outbox is its writer's");
        assert_eq!(logged().await, 0);
        tokio::time::advance(Duration::from_millis(2)).await;
        assert_eq!(engine.recovery().recover(true).await.unwrap().outboxes, 1);
        assert!(outbox().await.is_none(), "an old one is swept");
        assert_eq!(logged().await, 1);
    }

    /// Records another tool left with a lock but no document's `_meta`,
    /// a full batch of them and more, ahead of a real document whose holder
    /// is gone: the lock sweep goes past them and clears its lock.
    #[tokio::test(start_paused = true)]
    async fn the_lock_sweep_goes_past_a_full_batch_of_locked_records_that_are_not_documents() {
        let store: DynStore = Arc::new(MemoryStore::default());
        crate::migrate::run(store.as_ref()).await.unwrap();
        let engine = engine(Arc::clone(&store));
        for i in 0..BATCH + 3 {
            let rec = doc! {"_id": format!("x{i}"), "_meta": {"txn": format!("0000-{i:05}")}};
            assert!(store.insert("c", rec).await.unwrap());
        }
        let now = engine.config().clock.now();
        let mut d = StoredDoc::new_live("d".into(), doc! {"n": 1_i64}, 1, 1, now);
        d.meta.txn = Some(uuid::Uuid::now_v7().to_string());
        assert!(store.insert("c", d.to_record()).await.unwrap());
        let pass = engine.recovery().recover(false).await.unwrap();
        assert_eq!((pass.locks_cleared, pass.skipped), (1, BATCH + 3), "{pass:?}");
        assert_eq!(doc_state(store.as_ref()).await.0, None, "the real lock is cleared");
    }

    /// Run on a thread of its own, so that a sweep that never ends fails
    /// the test instead of hanging it.
    #[test]
    fn the_sweep_goes_past_a_full_batch_of_outboxes_that_are_not_documents() {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let pass = rt.block_on(async {
                let store: DynStore = Arc::new(MemoryStore::default());
                crate::migrate::run(store.as_ref()).await.unwrap();
                let engine = engine(Arc::clone(&store));
                // Records another tool left with an outbox but no
                // document's `_meta` (no version), ahead of a real one in
                // the sweep's order.
                for i in 0..BATCH + 3 {
                    let rec = doc! {"_id": format!("x{i}"), "_meta": {"outbox": {"_id": format!("0000-{i:05}")}}};
                    assert!(store.insert("c", rec).await.unwrap());
                }
                let now = engine.config().clock.now();
                let then = DateTime::from_millis(now.timestamp_millis() - ms(OUTBOX_AGE) - 1000);
                let mut d = StoredDoc::new_live("d".into(), doc! {"n": 1_i64}, 1, 1, then);
                let event = crate::events::model::document_event(
                    crate::events::EventType::Created,
                    "c",
                    &d,
                    None,
                    None,
                    None,
                    then,
                );
                d.meta.outbox = Some(event);
                assert!(store.insert("c", d.to_record()).await.unwrap());
                engine.recovery().recover(true).await.unwrap()
            });
            let _ = tx.send(pass);
        });
        let pass = rx.recv_timeout(Duration::from_secs(30)).expect("the sweep ends");
        assert_eq!((pass.outboxes, pass.skipped), (1, BATCH + 3), "{pass:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_runs_out_after_lease_plus_skew_and_not_before() {
        let store: DynStore = Arc::new(MemoryStore::default());
        let engine = engine(Arc::clone(&store));
        let txn = uuid::Uuid::now_v7().to_string();
        let d = held(&engine, store.as_ref(), &txn).await;
        tokio::time::advance(engine.config().lease + engine.config().clock_skew).await;
        assert_eq!(engine.locks().settle("c", &d, None).await.unwrap(), Settled::Busy { holder: txn.clone() });
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(engine.locks().settle("c", &d, None).await.unwrap(), Settled::Retry);
        let rec = engine.get(&txn).await.unwrap().unwrap();
        assert_eq!((rec.status, rec.abort_reason.as_deref()), (Status::Aborted, Some("expired")));
        assert_eq!(doc_state(store.as_ref()).await, (None, 1, 1), "the staged change is dropped, never applied");
    }

    #[tokio::test(start_paused = true)]
    async fn recovery_frees_a_dead_transactions_lock_within_the_bound() {
        let store: DynStore = Arc::new(MemoryStore::default());
        let engine = engine(Arc::clone(&store));
        let txn = uuid::Uuid::now_v7().to_string();
        held(&engine, store.as_ref(), &txn).await;
        let cfg = engine.config().clone();
        let bound = cfg.lease + cfg.clock_skew + 2 * cfg.recovery_interval;
        let started = tokio::time::Instant::now();
        let stop = CancellationToken::new();
        let worker = tokio::spawn(Arc::clone(engine.recovery()).run(stop.clone()));
        while doc_state(store.as_ref()).await.0.is_some() {
            assert!(started.elapsed() <= bound, "still locked after {:?}", started.elapsed());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(started.elapsed() > cfg.lease + cfg.clock_skew, "freed before the lease ran out");
        assert_eq!(doc_state(store.as_ref()).await, (None, 1, 1));
        assert_eq!(engine.get(&txn).await.unwrap().unwrap().status, Status::RolledBack);
        stop.cancel();
        worker.await.unwrap();
    }
}
