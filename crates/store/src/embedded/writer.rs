//! The writer thread: queued writes applied in group commits, their
//! effects journaled before each commit is visible, synced and
//! checkpointed.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redb::{Database, ReadableDatabase};
use tokio::sync::oneshot;

use super::apply::{Applying, Recent, WriteOp, all_hold, apply, schema_change};
use super::index::{Deferred, Entries};
use super::journal::{self, Effects, Journal};
use super::{APPLIED, Catalog, JOURNAL_STATE, MAX_BATCH, MAX_BATCH_BYTES, RECORDS, internal};
use crate::disk::Fence;
use crate::{Durability, StoreError, StoreResult};

/// How many of a queued chain's writes were applied.
type Reply = oneshot::Sender<StoreResult<usize>>;

/// Writes waiting for the writer: one, or a chain applied in order until
/// one is not applied ([`Store::write_in_order`](crate::Store::write_in_order)).
pub(super) struct Queued {
    pub(super) ops: Vec<WriteOp>,
    pub(super) durability: Durability,
    /// Every write checked before any is applied; all applied or none
    /// ([`Store::write_all_or_nothing`](crate::Store::write_all_or_nothing)).
    pub(super) all_or_nothing: bool,
    pub(super) reply: Reply,
}

impl Queued {
    pub(super) fn is_schema(&self) -> bool {
        self.ops.first().is_some_and(WriteOp::is_schema)
    }
}

/// Counters of the writer thread, for benchmarks and metrics.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// redb commits (group commits), synced or not.
    pub commits: AtomicU64,
    /// Syncs (fsyncs) of the journal or, at checkpoints, of redb.
    pub syncs: AtomicU64,
    /// Seals of the journal written on their own once idle (each a synced
    /// write of one sector; see `journal`).
    pub seals: AtomicU64,
    /// Checkpoints: redb made durable, the journal started over.
    pub checkpoints: AtomicU64,
    /// Queued writes applied or refused (a chain counts each of its writes).
    pub writes: AtomicU64,
    /// Time spent committing, in nanoseconds (the writer's busy time).
    pub busy_nanos: AtomicU64,
    /// Of which in commits that synced, and in checkpoints.
    pub synced_nanos: AtomicU64,
    /// Where the busy time went, in nanoseconds: applying batches (redb's
    /// write transaction begun, each write checked and applied, indexes
    /// kept), writing their journal entries, syncing the journal, committing
    /// to redb (unsynced), and checkpoints (redb made durable).
    pub apply_nanos: AtomicU64,
    pub journal_nanos: AtomicU64,
    pub sync_nanos: AtomicU64,
    pub commit_nanos: AtomicU64,
    pub checkpoint_nanos: AtomicU64,
    /// Journal entries written.
    pub entries: AtomicU64,
    /// The longest a commit waited unsynced before a sync covered it, and
    /// the longest one batch took, in nanoseconds: the sync interval is a
    /// deadline when the first stays within the interval plus a batch.
    pub max_unsynced_nanos: AtomicU64,
    pub max_batch_nanos: AtomicU64,
    /// The most journal bytes one batch wrote.
    pub max_batch_bytes: AtomicU64,
    /// Records in the writer's cache of recent records, and the bytes it
    /// counts for them, after the last batch.
    pub recent_records: AtomicU64,
    pub recent_bytes: AtomicU64,
    /// Some commit is not durable yet: set before such a commit becomes
    /// visible, cleared once a sync covers it. A reader that finds it
    /// clear after reading has read only durable data.
    pub unsynced: std::sync::atomic::AtomicBool,
}

impl WriterStats {
    /// Nanoseconds from `since` to `now`.
    fn nanos(since: Instant, now: Instant) -> u64 {
        u64::try_from((now - since).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Add the time since `since` to `counter`; returns now.
    fn add(counter: &AtomicU64, since: Instant) -> Instant {
        let now = Instant::now();
        counter.fetch_add(Self::nanos(since, now), Ordering::Relaxed);
        now
    }

    /// Busy time of a batch that started at `started` (and synced).
    fn count(&self, started: Instant, synced: bool) {
        let nanos = Self::nanos(started, Instant::now());
        self.busy_nanos.fetch_add(nanos, Ordering::Relaxed);
        if synced {
            self.synced_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
    }
}

/// The writer thread's state.
pub(super) struct Writer {
    pub(super) db: Arc<Database>,
    pub(super) catalog: Catalog,
    pub(super) stats: Arc<WriterStats>,
    pub(super) interval: Duration,
    /// See `Options::seal_delay`.
    pub(super) seal_delay: Duration,
    /// See `Options::on_answer`.
    pub(super) on_answer: Option<super::OnAnswer>,
    pub(super) checkpoint_bytes: u64,
    pub(super) checkpoint_interval: Option<Duration>,
    /// When the oldest commit not checkpointed yet was made.
    pub(super) uncheckpointed_since: Option<Instant>,
    pub(super) quick_repair: bool,
    /// Raised after the last checkpoint: redb's own close writes nothing.
    pub(super) fence: Fence,
    /// When the oldest journal entry not yet synced was written.
    pub(super) unsynced_since: Option<Instant>,
    /// When the last sync of entries ended (its seal is owed once idle).
    pub(super) synced_at: Option<Instant>,
    pub(super) journal: Journal,
    pub(super) recent: Recent,
    /// The next position of each log collection appended to (see
    /// [`Write::Append`]), learned from its last record on first use.
    pub(super) positions: HashMap<String, u64>,
    /// The journal position last written as `APPLIED` (see
    /// [`Self::note_applied`]).
    pub(super) applied_noted: u64,
}

impl Writer {
    /// Carry out a schema change, a snapshot or the close, each on its
    /// own, durable, after everything before it is; the journal never
    /// spans one. True once the writer has closed.
    pub(super) fn alone(&mut self, item: Queued) -> bool {
        let op = item.ops.into_iter().next().expect("a schema change");
        match op {
            WriteOp::Snapshot(reply) => {
                self.sync_or_stop();
                // A backup reports, and its copy holds, the journal
                // position the snapshot includes.
                let snapshot =
                    self.note_applied(redb::Durability::None).and_then(|()| self.db.begin_read().map_err(internal));
                self.answering();
                let _ = reply.send(snapshot);
                let _ = item.reply.send(Ok(1));
            }
            WriteOp::Close => {
                self.close();
                self.answering();
                let _ = item.reply.send(Ok(1));
                return true;
            }
            // A build step commits without syncing and outside the
            // journal (its entries are derived from records and made
            // durable by the build's last step, a checkpoint): no
            // checkpoint before it, so writes wait for its batch of
            // entries alone.
            op @ WriteOp::BuildIndex { entries: Some(_), .. } => {
                let done = schema_change(&self.db, &self.catalog, op, self.quick_repair);
                self.answering();
                let _ = item.reply.send(done.map(usize::from));
            }
            op => {
                self.checkpoint_or_stop();
                let done = schema_change(&self.db, &self.catalog, op, self.quick_repair);
                self.answering();
                let _ = item.reply.send(done.map(usize::from));
            }
        }
        false
    }

    /// Checkpoint and let go of the file: the store closes durable.
    pub(super) fn close(&mut self) {
        self.checkpoint_or_stop();
        // The file stays as a crash right after this checkpoint would
        // leave it (see `disk::Fence`).
        self.fence.raise();
    }

    /// When the writer next has work of its own: a sync once the interval
    /// since the oldest unsynced commit has passed, a checkpoint once the
    /// journal has grown enough or the oldest commit not checkpointed has
    /// waited its interval, a seal once idle for the seal delay after a
    /// sync. `None`: nothing until the next write.
    pub(super) fn due(&self) -> Option<Instant> {
        let sync = self.unsynced_since.map(|since| since + self.interval);
        let checkpoint = if self.journal.written() >= self.checkpoint_bytes && self.journal.written() > 0 {
            Some(Instant::now())
        } else {
            self.uncheckpointed_since.zip(self.checkpoint_interval).map(|(since, interval)| since + interval)
        };
        let seal = self.synced_at.filter(|_| self.journal.needs_seal()).map(|at| at + self.seal_delay);
        [sync, checkpoint, seal].into_iter().flatten().min()
    }

    /// Do the writer's own work that is due now (see [`Self::due`]); the
    /// seal only when `idle` (nothing queued: a write that comes next
    /// carries the proof in its own sync).
    pub(super) fn tick(&mut self, idle: bool) {
        if self.journal.written() >= self.checkpoint_bytes || self.checkpoint_due() {
            self.checkpoint_or_stop();
        }
        if self.unsynced_since.is_some_and(|since| since.elapsed() >= self.interval) {
            self.sync_or_stop();
        }
        if idle && self.synced_at.is_some_and(|at| at.elapsed() >= self.seal_delay) {
            self.seal_or_stop();
        }
    }

    /// Whether the oldest commit not checkpointed yet has waited its
    /// interval.
    fn checkpoint_due(&self) -> bool {
        self.uncheckpointed_since
            .zip(self.checkpoint_interval)
            .is_some_and(|(since, interval)| since.elapsed() >= interval)
    }

    /// Commit a batch: `first` and whatever else is queued, up to
    /// [`MAX_BATCH`] items or [`MAX_BATCH_BYTES`] of effects, taken by
    /// `more` (which hands out no item that must commit on its own). Its effects go
    /// to the journal (in entries of about [`journal::ENTRY_TARGET`], split
    /// between queued items, so never inside a chain) before the commit is visible, and the journal is
    /// synced first when the batch holds a write that must be durable. A
    /// checkpoint it makes due is left to the caller ([`Self::due`]).
    pub(super) fn commit(&mut self, first: Queued, more: &dyn Fn() -> Option<Queued>) {
        let started = Instant::now();
        let mut batch = vec![first];
        let mut results = Vec::with_capacity(1);
        let mut entries = vec![Effects::default()];
        let mut writes = 0usize;
        let prepared = (|| -> StoreResult<redb::WriteTransaction> {
            let mut txn = self.db.begin_write().map_err(internal)?;
            txn.set_durability(redb::Durability::None).map_err(internal)?;
            {
                let specs = self.catalog.read().expect("index catalog");
                let mut table = txn.open_table(RECORDS).map_err(internal)?;
                let mut index = Entries::open(&txn)?;
                let mut deferred = Deferred::default();
                let mut bytes = 0usize;
                let mut next = 0;
                while next < batch.len() {
                    // Applied by value: a record moves into the table and
                    // `recent` rather than being copied.
                    let all_or_nothing = batch[next].all_or_nothing;
                    let ops = std::mem::take(&mut batch[next].ops);
                    writes += ops.len();
                    let mut applied = 0;
                    let mut result = Ok(());
                    let checked = if all_or_nothing { all_hold(&table, &self.recent, &ops) } else { Ok(true) };
                    let ops = match checked {
                        Ok(true) => ops,
                        Ok(false) => Vec::new(),
                        Err(err) => {
                            result = Err(err);
                            Vec::new()
                        }
                    };
                    for op in ops {
                        let mut state = Applying {
                            recent: &mut self.recent,
                            positions: &mut self.positions,
                            deferred: &mut deferred,
                        };
                        let effects = entries.last_mut().expect("an entry");
                        let before = effects.len();
                        let outcome = apply(&mut table, &mut index, &specs, &mut state, op, effects);
                        bytes += effects.len() - before;
                        match outcome {
                            Ok(true) => applied += 1,
                            // Checked whole, yet not applied whole: the
                            // batch is refused rather than keep a part.
                            Ok(false) | Err(_) if all_or_nothing => {
                                return Err(StoreError::Internal(format!(
                                    "a write of an all-or-nothing chain was not applied after its check: {outcome:?}"
                                )));
                            }
                            Ok(false) => break,
                            Err(err) => {
                                result = Err(err);
                                break;
                            }
                        }
                    }
                    results.push(result.map(|()| applied));
                    // Entries split between queued items only: a chain's
                    // effects are in one entry, which a crash keeps whole
                    // or drops whole (`Capabilities::atomic_chains`).
                    if entries.last().is_some_and(|e| e.len() >= journal::ENTRY_TARGET) {
                        entries.push(Effects::default());
                    }
                    next += 1;
                    if next == batch.len() && batch.len() < MAX_BATCH && bytes < MAX_BATCH_BYTES {
                        if let Some(item) = more() {
                            batch.push(item);
                        }
                    }
                }
                deferred.flush(&mut index)?;
                index.finish()?;
            }
            // The journal position these commits reach is written down
            // by the next checkpoint or snapshot, not here
            // ([`Self::note_applied`]): one table fewer in every batch.
            Ok(txn)
        })();
        let mut phase = WriterStats::add(&self.stats.apply_nanos, started);
        self.stats.writes.fetch_add(writes as u64, Ordering::Relaxed);
        let durable = batch.iter().any(|q| q.durability == Durability::Synced);
        let txn = match prepared {
            Ok(txn) => txn,
            Err(err) => {
                // Nothing was written: the batch is refused as a whole.
                self.recent.clear();
                self.positions.clear();
                tracing::error!(error = %err, "embedded store commit failed; batch not applied");
                self.answering();
                for queued in batch {
                    let _ = queued.reply.send(Err(StoreError::Unavailable(err.to_string())));
                }
                return;
            }
        };
        let txn = if entries.iter().all(Effects::is_empty) {
            // Only refusals and syncs: nothing to commit.
            if let Err(err) = txn.abort() {
                tracing::warn!(error = %err, "aborting an empty embedded write transaction failed");
            }
            None
        } else {
            let mut bytes = 0;
            for effects in entries.iter_mut().filter(|e| !e.is_empty()) {
                bytes += effects.len() as u64;
                if let Err(err) = self.journal.append(effects) {
                    stop(&StoreError::Unavailable(format!("journal write failed: {err}")));
                }
                self.stats.entries.fetch_add(1, Ordering::Relaxed);
            }
            self.stats.max_batch_bytes.fetch_max(bytes, Ordering::Relaxed);
            drop(entries);
            phase = WriterStats::add(&self.stats.journal_nanos, phase);
            if self.unsynced_since.is_none() {
                self.unsynced_since = Some(Instant::now());
                self.stats.unsynced.store(true, Ordering::SeqCst);
            }
            self.uncheckpointed_since.get_or_insert_with(Instant::now);
            Some(txn)
        };
        let synced = durable && self.journal.is_unsynced();
        if durable {
            self.sync_or_stop();
            phase = WriterStats::add(&self.stats.sync_nanos, phase);
        }
        if let Some(txn) = txn {
            if let Err(err) = txn.commit() {
                // The journal holds the batch: opening the store again
                // applies it.
                stop(&StoreError::Unavailable(format!("commit failed: {err}")));
            }
            self.stats.commits.fetch_add(1, Ordering::Relaxed);
            WriterStats::add(&self.stats.commit_nanos, phase);
        }
        self.stats.count(started, synced);
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.stats.max_batch_nanos.fetch_max(took, Ordering::Relaxed);
        self.stats.recent_records.store(self.recent.records.len() as u64, Ordering::Relaxed);
        self.stats.recent_bytes.store(self.recent.bytes as u64, Ordering::Relaxed);
        self.answering();
        for (queued, result) in batch.into_iter().zip(results) {
            let _ = queued.reply.send(result);
        }
    }

    /// The writer is about to answer (see `Options::on_answer`).
    fn answering(&self) {
        if let Some(hook) = &self.on_answer {
            (hook.0)();
        }
    }

    /// Seal what the last sync covered, or stop the process.
    fn seal_or_stop(&mut self) {
        self.synced_at = None;
        if !self.journal.needs_seal() {
            return;
        }
        if let Err(err) = self.journal.seal() {
            stop(&StoreError::Unavailable(format!("journal seal failed: {err}")));
        }
        self.stats.seals.fetch_add(1, Ordering::Relaxed);
    }

    /// Make every journal entry durable, or stop the process.
    fn sync_or_stop(&mut self) {
        if self.unsynced_since.is_none() {
            return;
        }
        if let Err(err) = self.journal.sync() {
            stop(&StoreError::Unavailable(format!("journal sync failed: {err}")));
        }
        if let Some(since) = self.unsynced_since {
            let waited = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.stats.max_unsynced_nanos.fetch_max(waited, Ordering::Relaxed);
        }
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        self.unsynced_since = None;
        self.synced_at = Some(Instant::now());
        self.stats.unsynced.store(false, Ordering::SeqCst);
        if self.seal_delay.is_zero() {
            self.seal_or_stop();
        }
    }

    /// Commit, with `durability`, the number of the last journal entry
    /// redb's state holds (`APPLIED`, what opening the store replays
    /// after). Batches leave it behind: no one reads it between two
    /// checkpoints but a backup's snapshot, and a commit that is not
    /// durable is lost whole with a crash (redb keeps it in memory), so
    /// what opening finds was written by the checkpoint that made the
    /// state durable. With [`redb::Durability::Immediate`], the
    /// checkpoint itself.
    fn note_applied(&mut self, durability: redb::Durability) -> StoreResult<()> {
        let last = self.journal.next_lsn() - 1;
        let immediate = matches!(durability, redb::Durability::Immediate);
        if !immediate && self.applied_noted == last {
            return Ok(());
        }
        let mut txn = self.db.begin_write().map_err(internal)?;
        txn.set_durability(durability).map_err(internal)?;
        if immediate {
            // The allocator state is saved with the commit, so opening
            // after a crash needs no full repair of the file.
            txn.set_quick_repair(self.quick_repair);
        }
        if self.applied_noted != last {
            let mut state = txn.open_table(JOURNAL_STATE).map_err(internal)?;
            state.insert(APPLIED, last).map_err(internal)?;
        }
        txn.commit().map_err(internal)?;
        self.applied_noted = last;
        Ok(())
    }

    /// Make redb durable with every commit so far, and start the journal
    /// over; or stop the process.
    fn checkpoint_or_stop(&mut self) {
        if self.journal.written() == 0 {
            self.uncheckpointed_since = None;
            return;
        }
        let started = Instant::now();
        if let Err(err) = self.note_applied(redb::Durability::Immediate) {
            stop(&err);
        }
        if let Err(err) = self.journal.restart(self.journal.next_lsn()) {
            stop(&StoreError::Unavailable(format!("journal restart failed: {err}")));
        }
        self.unsynced_since = None;
        self.uncheckpointed_since = None;
        self.stats.unsynced.store(false, Ordering::SeqCst);
        self.stats.checkpoints.fetch_add(1, Ordering::Relaxed);
        self.stats.syncs.fetch_add(1, Ordering::Relaxed);
        WriterStats::add(&self.stats.checkpoint_nanos, started);
        self.stats.count(started, true);
    }
}

/// Unsynced commits that cannot be made durable, or a writer that cannot
/// go on: readers may have seen writes that could be lost, so the process
/// stops rather than go on past them (the next start recovers).
pub(super) fn stop(err: &StoreError) -> ! {
    tracing::error!(error = %err, "embedded store cannot go on; stopping");
    eprintln!("txgate: the embedded store cannot go on ({err}); stopping");
    std::process::exit(70)
}
